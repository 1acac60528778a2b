//! The GPU launch timeline of traced processes: each thread's CUDA steps with their kernels
//! named, from the driver lookups seen since attach.
//!
//! Engine-neutral: a step is what one thread asked of the driver between two host-side
//! synchronisations (decode/cuda.rs). Kernel handles get their names from the lookups
//! (`cuModuleGetFunction`, `cuLibraryGetKernel` + `cuKernelGetFunction`, `cuFuncGetName`); a
//! kernel loaded before attach stays unnamed (its handle is shown) until something looks it
//! up again.
use std::collections::HashMap;

use crate::decode::cuda::{CudaEvent, CudaName, CudaStep};

/// Most kernel names kept (per agent); beyond it new names are dropped and counted.
const MAX_NAMES: usize = 65_536;

/// Launches of one kernel in a step.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KernelLaunches {
    /// The kernel's name, when a lookup named its handle.
    pub name: Option<String>,
    pub handle: u64,
    pub launches: u32,
}

impl KernelLaunches {
    /// The name, or the handle in hex when no lookup named it.
    pub fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{:#x}", self.handle))
    }
}

/// One step, its kernels named and ordered by launches (most first, then first launched).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuStep {
    pub step: CudaStep,
    pub kernels: Vec<KernelLaunches>,
}

/// What the timeline could not do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuStats {
    pub steps: u64,
    /// Names not kept because the table was full.
    pub names_dropped: u64,
}

#[derive(Debug, Default)]
pub struct GpuTimeline {
    /// (process, handle) -> name.
    names: HashMap<(u32, u64), String>,
    /// (process, function handle) -> the kernel handle it was made from.
    aliases: HashMap<(u32, u64), u64>,
    pub stats: GpuStats,
}

impl GpuTimeline {
    /// Take one CUDA event; a step comes back named.
    pub fn feed(&mut self, event: &CudaEvent) -> Option<GpuStep> {
        match event {
            CudaEvent::Name(name) => {
                self.learn(name);
                None
            }
            CudaEvent::Step(step) => {
                self.stats.steps += 1;
                Some(self.named(step))
            }
            CudaEvent::Exited { tgid, .. } => {
                self.forget(*tgid);
                None
            }
        }
    }

    /// A process exited: its handles mean nothing any more.
    fn forget(&mut self, tgid: u32) {
        self.names.retain(|(pid, _), _| *pid != tgid);
        self.aliases.retain(|(pid, _), _| *pid != tgid);
    }

    fn learn(&mut self, name: &CudaName) {
        if self.names.len() + self.aliases.len() >= MAX_NAMES {
            self.stats.names_dropped += 1;
            return;
        }
        match name {
            CudaName::Named {
                tgid,
                handle,
                name,
                truncated,
            } => {
                let name = if *truncated {
                    format!("{name}…")
                } else {
                    name.clone()
                };
                self.names.insert((*tgid, *handle), name);
            }
            CudaName::Alias {
                tgid,
                function,
                kernel,
            } => {
                self.aliases.insert((*tgid, *function), *kernel);
            }
        }
    }

    fn name_of(&self, tgid: u32, handle: u64) -> Option<String> {
        self.names
            .get(&(tgid, handle))
            .or_else(|| {
                let kernel = self.aliases.get(&(tgid, handle))?;
                self.names.get(&(tgid, *kernel))
            })
            .cloned()
    }

    fn named(&self, step: &CudaStep) -> GpuStep {
        let mut kernels: Vec<KernelLaunches> = step
            .kernels
            .iter()
            .map(|&(handle, launches)| KernelLaunches {
                name: self.name_of(step.tgid, handle),
                handle,
                launches,
            })
            .collect();
        // Stable: equal counts keep their order of first launch.
        kernels.sort_by_key(|k| std::cmp::Reverse(k.launches));
        GpuStep {
            step: step.clone(),
            kernels,
        }
    }
}

#[cfg(test)]
mod tests {
    use infertrace_common::cuda_fn;

    use super::*;

    fn named(tgid: u32, handle: u64, name: &str) -> CudaEvent {
        CudaEvent::Name(CudaName::Named {
            tgid,
            handle,
            name: name.into(),
            truncated: false,
        })
    }

    fn step(tgid: u32, kernels: Vec<(u64, u32)>) -> CudaEvent {
        CudaEvent::Step(Box::new(CudaStep {
            tgid,
            tid: tgid,
            sync_function: cuda_fn::STREAM_SYNCHRONIZE,
            launches: kernels.iter().map(|k| k.1).sum(),
            kernels,
            ..CudaStep::default()
        }))
    }

    #[test]
    fn kernels_are_named_through_lookups_and_aliases_and_ranked() {
        let mut timeline = GpuTimeline::default();
        assert_eq!(timeline.feed(&named(1, 0x10, "gemm")), None);
        timeline.feed(&named(1, 0x20, "lib_kernel"));
        timeline.feed(&CudaEvent::Name(CudaName::Alias {
            tgid: 1,
            function: 0x30,
            kernel: 0x20,
        }));
        // Another process's handle with the same value is another kernel.
        timeline.feed(&named(2, 0x40, "other_process"));
        let out = timeline
            .feed(&step(1, vec![(0x10, 2), (0x30, 5), (0x40, 2)]))
            .expect("a step");
        let labels: Vec<(String, u32)> = out
            .kernels
            .iter()
            .map(|k| (k.label(), k.launches))
            .collect();
        assert_eq!(
            labels,
            [
                ("lib_kernel".to_string(), 5),
                ("gemm".to_string(), 2),
                ("0x40".to_string(), 2)
            ]
        );
        assert_eq!(timeline.feed(&CudaEvent::Exited { tgid: 1, ns: 9 }), None);
        let out = timeline.feed(&step(1, vec![(0x10, 1)])).expect("a step");
        assert_eq!(out.kernels[0].name, None);
        assert_eq!(timeline.stats.steps, 2);
    }
}
