//! CUDA driver records -> steps and kernel names.
//!
//! The kernel side either counts a thread's driver calls itself and sends one CUDA_STEP record
//! per synchronisation (the default), or sends every call (CUDA_CALL, `--cuda-every-call`). Both
//! become the same [`CudaStep`]: this module counts the calls of the second kind exactly as the
//! kernel would, so that the two modes can be compared and everything after this stage sees one
//! shape. A step is what one thread asked of the driver since its previous synchronisation, and
//! the synchronisation that ended it; every time in it is CPU-side (when the thread called the
//! driver), never when the GPU ran.
use std::collections::HashMap;

use infertrace_common::{
    CUDA_STEP_KERNELS, CudaCallRecord, CudaNameRecord, CudaStepRecord, RecordHeader, cuda_fn,
};

/// One thread's driver calls up to and including the synchronisation that ended them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaStep {
    pub tgid: u32,
    pub tid: u32,
    /// The [`cuda_fn`] that ended the step ([`cuda_fn::THREAD_EXIT`]: the thread exited first).
    pub sync_function: u32,
    /// When the ending synchronisation was called (None when the thread exited).
    pub sync_enter_ns: Option<u64>,
    /// When the step ended (the synchronisation returned, or the thread exited).
    pub end_ns: u64,
    pub sync_result: i32,
    /// First and last kernel or graph launch.
    pub first_launch_ns: Option<u64>,
    pub last_launch_ns: Option<u64>,
    pub launches: u32,
    pub graph_launches: u32,
    pub copies: u32,
    pub copy_bytes: u64,
    pub event_records: u32,
    /// Launches per function handle, in order of first launch (at most [`CUDA_STEP_KERNELS`]).
    pub kernels: Vec<(u64, u32)>,
    /// Launches of kernels beyond the table.
    pub other_launches: u32,
}

impl CudaStep {
    /// How long the thread waited in the ending synchronisation.
    pub fn sync_wait_ns(&self) -> Option<u64> {
        self.sync_enter_ns.map(|e| self.end_ns.saturating_sub(e))
    }

    /// From the first launch to the last (CPU-side enqueueing of the step's GPU work).
    pub fn launch_span_ns(&self) -> Option<u64> {
        Some(self.last_launch_ns?.saturating_sub(self.first_launch_ns?))
    }

    fn from_record(r: &CudaStepRecord) -> Self {
        let nonzero = |ns: u64| (ns != 0).then_some(ns);
        Self {
            tgid: r.header.tgid,
            tid: r.header.tid,
            sync_function: r.sync_function,
            sync_enter_ns: nonzero(r.sync_enter_ns),
            end_ns: r.header.ts_ns,
            sync_result: r.sync_result,
            first_launch_ns: nonzero(r.first_launch_ns),
            last_launch_ns: nonzero(r.last_launch_ns),
            launches: r.launches,
            graph_launches: r.graph_launches,
            copies: r.copies,
            copy_bytes: r.copy_bytes,
            event_records: r.event_records,
            kernels: r
                .kernels
                .iter()
                .take_while(|k| k.launches != 0)
                .map(|k| (k.function, k.launches))
                .collect(),
            other_launches: r.other_launches,
        }
    }

    /// Count one call that does not end a step, as the kernel side does.
    fn count(&mut self, call: &CudaCallRecord) {
        let at = call.header.ts_ns;
        match call.function {
            cuda_fn::LAUNCH_KERNEL | cuda_fn::LAUNCH_KERNEL_EX | cuda_fn::GRAPH_LAUNCH => {
                self.first_launch_ns.get_or_insert(at);
                self.last_launch_ns = Some(at);
                if call.function == cuda_fn::GRAPH_LAUNCH {
                    self.graph_launches += 1;
                } else {
                    self.launches += 1;
                    self.count_kernel(call.handle);
                }
            }
            cuda_fn::MEMCPY_DTOH_ASYNC | cuda_fn::MEMCPY_ASYNC => {
                self.copies += 1;
                self.copy_bytes += call.bytes;
            }
            cuda_fn::EVENT_RECORD => self.event_records += 1,
            _ => {}
        }
    }

    fn count_kernel(&mut self, function: u64) {
        if let Some(slot) = self.kernels.iter_mut().find(|(f, _)| *f == function) {
            slot.1 += 1;
        } else if self.kernels.len() < CUDA_STEP_KERNELS {
            self.kernels.push((function, 1));
        } else {
            self.other_launches += 1;
        }
    }
}

/// A lookup's answer: a handle's name, or a function made from a named kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaName {
    Named {
        tgid: u32,
        handle: u64,
        name: String,
        /// The name was longer than the record carries: this is its start.
        truncated: bool,
    },
    /// cuKernelGetFunction: `function` launches what `kernel` names.
    Alias {
        tgid: u32,
        function: u64,
        kernel: u64,
    },
}

impl CudaName {
    fn from_record(r: &CudaNameRecord) -> Self {
        if r.function == cuda_fn::KERNEL_GET_FUNCTION {
            return Self::Alias {
                tgid: r.header.tgid,
                function: r.handle,
                kernel: r.kernel,
            };
        }
        let len = (r.len as usize).min(r.name.len());
        Self::Named {
            tgid: r.header.tgid,
            handle: r.handle,
            name: String::from_utf8_lossy(&r.name[..len]).into_owned(),
            // The kernel reads at most the buffer less its NUL.
            truncated: len + 1 >= r.name.len(),
        }
    }
}

/// What the CUDA records of one batch became.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaEvent {
    Step(Box<CudaStep>),
    Name(CudaName),
    /// Process `tgid` exited at `ns` (after its last steps): its handles mean nothing now.
    Exited {
        tgid: u32,
        ns: u64,
    },
}

/// Turns CUDA records into steps and names; counts calls that arrive one by one.
#[derive(Debug, Default)]
pub struct CudaDecoder {
    /// Per thread, the step its calls are building (CUDA_CALL records only).
    open: HashMap<u32, CudaStep>,
}

impl CudaEvent {
    /// A step the kernel side counted.
    pub fn from_step(record: &CudaStepRecord) -> Self {
        Self::Step(Box::new(CudaStep::from_record(record)))
    }

    pub fn from_name(record: &CudaNameRecord) -> Self {
        Self::Name(CudaName::from_record(record))
    }
}

impl CudaDecoder {
    /// One call; a synchronisation returns the step it ended.
    pub fn call(&mut self, call: &CudaCallRecord) -> Option<CudaEvent> {
        let RecordHeader { tgid, tid, .. } = call.header;
        let step = self.open.entry(tid).or_insert_with(|| CudaStep {
            tgid,
            tid,
            ..CudaStep::default()
        });
        if !cuda_fn::is_sync(call.function) {
            step.count(call);
            return None;
        }
        let mut step = self.open.remove(&tid).unwrap_or_default();
        step.sync_function = call.function;
        step.sync_enter_ns = Some(call.enter_ns);
        step.end_ns = call.header.ts_ns;
        step.sync_result = call.result;
        Some(CudaEvent::Step(Box::new(step)))
    }

    /// Process `tgid` exited at `ns`: its threads' unfinished steps end there, then the
    /// process's exit.
    pub fn exit(&mut self, tgid: u32, ns: u64) -> Vec<CudaEvent> {
        let tids: Vec<u32> = self
            .open
            .iter()
            .filter(|(_, s)| s.tgid == tgid)
            .map(|(&tid, _)| tid)
            .collect();
        tids.into_iter()
            .filter_map(|tid| self.open.remove(&tid))
            .map(|mut step| {
                step.sync_function = cuda_fn::THREAD_EXIT;
                step.end_ns = ns;
                CudaEvent::Step(Box::new(step))
            })
            .chain([CudaEvent::Exited { tgid, ns }])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use infertrace_common::{KernelLaunches, kind};

    use super::*;

    fn header(kind: u32, tid: u32, ts_ns: u64) -> RecordHeader {
        RecordHeader {
            kind,
            tgid: 7,
            tid,
            _pad: 0,
            ts_ns,
        }
    }

    fn call(function: u32, tid: u32, ts_ns: u64, handle: u64) -> CudaCallRecord {
        CudaCallRecord {
            header: header(kind::CUDA_CALL, tid, ts_ns),
            enter_ns: ts_ns,
            handle,
            bytes: 64,
            function,
            result: 0,
        }
    }

    /// The calls of one step, one by one, give the step the kernel would have counted.
    #[test]
    fn calls_one_by_one_count_as_the_kernel_counts() {
        let mut decoder = CudaDecoder::default();
        let calls = [
            call(cuda_fn::LAUNCH_KERNEL, 8, 100, 0xa),
            call(cuda_fn::LAUNCH_KERNEL_EX, 8, 110, 0xb),
            call(cuda_fn::LAUNCH_KERNEL, 9, 115, 0xa),
            call(cuda_fn::LAUNCH_KERNEL, 8, 120, 0xa),
            call(cuda_fn::GRAPH_LAUNCH, 8, 130, 0x99),
            call(cuda_fn::EVENT_RECORD, 8, 135, 0x5),
            call(cuda_fn::MEMCPY_DTOH_ASYNC, 8, 140, 0x1),
        ];
        for c in &calls {
            assert_eq!(decoder.call(c), None);
        }
        let mut sync = call(cuda_fn::STREAM_SYNCHRONIZE, 8, 400, 0x3);
        sync.enter_ns = 150;
        let Some(CudaEvent::Step(step)) = decoder.call(&sync) else {
            panic!("a synchronisation ends the step");
        };
        let mut kernels = [KernelLaunches::default(); CUDA_STEP_KERNELS];
        kernels[0] = KernelLaunches {
            function: 0xa,
            launches: 2,
            _pad: 0,
        };
        kernels[1] = KernelLaunches {
            function: 0xb,
            launches: 1,
            _pad: 0,
        };
        let from_kernel = CudaStepRecord {
            header: header(kind::CUDA_STEP, 8, 400),
            sync_enter_ns: 150,
            first_launch_ns: 100,
            last_launch_ns: 130,
            copy_bytes: 64,
            launches: 3,
            graph_launches: 1,
            copies: 1,
            event_records: 1,
            sync_function: cuda_fn::STREAM_SYNCHRONIZE,
            sync_result: 0,
            other_launches: 0,
            _pad: 0,
            kernels,
        };
        let CudaEvent::Step(expected) = CudaEvent::from_step(&from_kernel) else {
            unreachable!()
        };
        assert_eq!(step, expected);
        assert_eq!(step.sync_wait_ns(), Some(250));
        assert_eq!(step.launch_span_ns(), Some(30));
        // The other thread's launch is still open, and ends with its process.
        let ended = decoder.exit(7, 500);
        assert_eq!(ended.len(), 2);
        assert_eq!(ended[1], CudaEvent::Exited { tgid: 7, ns: 500 });
        let CudaEvent::Step(rest) = &ended[0] else {
            unreachable!()
        };
        assert_eq!((rest.tid, rest.launches, rest.end_ns), (9, 1, 500));
        assert_eq!(rest.sync_function, cuda_fn::THREAD_EXIT);
        assert_eq!(rest.sync_wait_ns(), None);
    }

    #[test]
    fn kernels_past_the_table_are_counted_together() {
        let mut decoder = CudaDecoder::default();
        for f in 0..(CUDA_STEP_KERNELS as u64 + 3) {
            decoder.call(&call(cuda_fn::LAUNCH_KERNEL, 8, 100 + f, 0x100 + f));
        }
        let Some(CudaEvent::Step(step)) =
            decoder.call(&call(cuda_fn::EVENT_SYNCHRONIZE, 8, 200, 0x1))
        else {
            panic!("a synchronisation ends the step");
        };
        assert_eq!(step.kernels.len(), CUDA_STEP_KERNELS);
        assert_eq!(step.other_launches, 3);
        assert_eq!(step.launches, CUDA_STEP_KERNELS as u32 + 3);
    }

    #[test]
    fn names_and_aliases_come_from_their_lookups() {
        let mut record = CudaNameRecord {
            header: header(kind::CUDA_NAME, 8, 1),
            handle: 0x1001,
            function: cuda_fn::MODULE_GET_FUNCTION,
            len: 6,
            ..CudaNameRecord::default()
        };
        record.name[..6].copy_from_slice(b"gemm_1");
        assert_eq!(
            CudaEvent::from_name(&record),
            CudaEvent::Name(CudaName::Named {
                tgid: 7,
                handle: 0x1001,
                name: "gemm_1".into(),
                truncated: false
            })
        );
        record.len = 127;
        let CudaEvent::Name(CudaName::Named { truncated, .. }) = CudaEvent::from_name(&record)
        else {
            unreachable!()
        };
        assert!(truncated);
        // A lying length is cut to the buffer.
        record.len = u32::MAX;
        assert!(matches!(CudaEvent::from_name(&record), CudaEvent::Name(_)));
        let alias = CudaNameRecord {
            header: header(kind::CUDA_NAME, 8, 1),
            handle: 0x3000,
            kernel: 0x2001,
            function: cuda_fn::KERNEL_GET_FUNCTION,
            ..CudaNameRecord::default()
        };
        assert_eq!(
            CudaEvent::from_name(&alias),
            CudaEvent::Name(CudaName::Alias {
                tgid: 7,
                function: 0x3000,
                kernel: 0x2001
            })
        );
    }
}
