//! Python stack samples -> where each thread spends its time: the hottest stacks per thread
//! (`infertrace profile`) and folded stacks, the input of flame graph tools
//! (`--profile-output FILE`, with `attach`, `profile` and `replay`).
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    sync::Arc,
};

use crate::engines::common::well_known::{Phase, SampleKind, name_role, stack_role};
use crate::{decode::python::PySample, discover::python::CodeName};

/// Distinct stacks kept per thread; samples of further stacks are counted under one line.
const MAX_STACKS_PER_THREAD: usize = 4096;
/// Threads kept; samples of further threads are counted, not kept.
const MAX_THREADS: usize = 4096;
/// Distinct stacks whose label and kind are remembered; past it the memo starts again.
const MAX_MEMO: usize = 16384;

/// What one thread's samples showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadProfile {
    pub name: String,
    /// What the thread is, when the well-known names tell (engines/common/well_known.rs).
    pub role: Option<&'static str>,
    pub samples: u64,
    /// Samples with no Python frames (a native thread, or between frames).
    pub without_python: u64,
    /// Samples whose stack was cut (too deep, or unreadable part way).
    pub cut: u64,
    /// Folded stack (outermost frame first, `;`-separated) -> samples. Hashed with foldhash:
    /// a folded stack is kilobytes long, and std's SipHash of it was a good part of a
    /// sample's cost.
    pub stacks: HashMap<Arc<str>, u64, foldhash::fast::RandomState>,
    /// Samples per engine phase (engines/common/well_known.rs); the rest are `other` or `native`.
    pub phases: BTreeMap<Phase, u64>,
}

impl ThreadProfile {
    /// The thread's name, and its role when known: `VLLM::EngineCor [vLLM EngineCore busy loop]`.
    pub fn label(&self) -> String {
        match self.role {
            Some(role) => format!("{} [{role}]", self.name),
            None => self.name.clone(),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// By (process, thread).
    pub threads: BTreeMap<(u32, u32), ThreadProfile>,
    /// Samples of threads past [`MAX_THREADS`].
    pub dropped: u64,
    /// The folded label, kind and role of each stack the decoder interned, by its address: a
    /// stack is sampled many times, and labelling it is most of a sample's cost. The entry
    /// holds the stack, so that its address is not reused while it is a key.
    memo: HashMap<usize, Labelled>,
}

/// An interned stack (held), its folded label, its kind and the thread role it shows.
type Labelled = (
    Arc<Vec<CodeName>>,
    Arc<str>,
    SampleKind,
    Option<&'static str>,
);

/// `qualname (file:line)`, with `;` (the folded format's separator) replaced.
fn frame_label(frame: &CodeName) -> String {
    let file = frame.file.rsplit('/').next().unwrap_or(&frame.file);
    format!("{} ({file}:{})", frame.name, frame.line).replace(';', ":")
}

/// Label of the stack's samples when they had no frames.
const NO_PYTHON: &str = "[no Python frames]";
/// Label of the samples whose stack's names were lost.
const UNKNOWN_STACK: &str = "[stack names lost]";
/// Label of the samples of stacks past [`MAX_STACKS_PER_THREAD`].
const OTHER_STACKS: &str = "[other stacks]";

impl Profile {
    /// Count a sample; returns what it was doing (for the caller's metrics and iterations).
    pub fn add(&mut self, sample: &PySample) -> SampleKind {
        let (folded, kind, role) = self.labelled(sample);
        let key = (sample.tgid, sample.tid);
        if !self.threads.contains_key(&key) && self.threads.len() >= MAX_THREADS {
            self.dropped += 1;
            return kind;
        }
        let thread = self.threads.entry(key).or_default();
        if thread.name != sample.thread {
            thread.name.clone_from(&sample.thread);
        }
        if thread.role.is_none() {
            thread.role = role.or_else(|| name_role(&sample.thread));
        }
        thread.samples += 1;
        thread.cut += u64::from(sample.cut);
        if let SampleKind::Phase(phase) = kind {
            *thread.phases.entry(phase).or_default() += 1;
        }
        if !sample.unknown_stack && sample.stack.is_empty() {
            thread.without_python += 1;
        }
        let full = thread.stacks.len() >= MAX_STACKS_PER_THREAD;
        let slot = if full && !thread.stacks.contains_key(&folded) {
            Arc::from(OTHER_STACKS)
        } else {
            folded
        };
        *thread.stacks.entry(slot).or_default() += 1;
        kind
    }

    /// The sample's folded stack, kind and the role it shows, computed once per interned
    /// stack.
    fn labelled(&mut self, sample: &PySample) -> (Arc<str>, SampleKind, Option<&'static str>) {
        if sample.unknown_stack {
            return (Arc::from(UNKNOWN_STACK), SampleKind::Unknown, None);
        }
        if sample.stack.is_empty() {
            return (Arc::from(NO_PYTHON), SampleKind::Native, None);
        }
        let address = Arc::as_ptr(&sample.stack) as usize;
        if let Some((_, folded, kind, role)) = self.memo.get(&address) {
            return (folded.clone(), *kind, *role);
        }
        let labels: Vec<String> = sample.stack.iter().rev().map(frame_label).collect();
        let folded: Arc<str> = Arc::from(labels.join(";"));
        let kind = SampleKind::of_sample(sample);
        let role = stack_role(&sample.stack);
        if self.memo.len() >= MAX_MEMO {
            self.memo.clear();
        }
        self.memo
            .insert(address, (sample.stack.clone(), folded.clone(), kind, role));
        (folded, kind, role)
    }

    /// Folded stacks, one line per (thread, stack):
    /// `pid;thread [role] (tid);outer;...;inner count` (no `[role]` when it is not known).
    pub fn folded(&self) -> String {
        let mut out = String::new();
        for ((pid, tid), thread) in &self.threads {
            let mut stacks: Vec<(&Arc<str>, &u64)> = thread.stacks.iter().collect();
            stacks.sort();
            let label = thread.label().replace(';', ":");
            for (stack, count) in stacks {
                let _ = writeln!(out, "{pid};{label} ({tid});{stack} {count}");
            }
        }
        out
    }

    /// The `top` hottest stacks of each thread with their share of its samples, innermost
    /// frame first.
    pub fn report(&self, top: usize) -> String {
        let mut out = String::new();
        for ((pid, tid), thread) in &self.threads {
            let _ = writeln!(
                out,
                "pid {pid} thread {tid} ({}): {} samples, {} without Python frames{}",
                thread.label(),
                thread.samples,
                thread.without_python,
                if thread.cut > 0 {
                    format!(", {} cut short", thread.cut)
                } else {
                    String::new()
                }
            );
            if !thread.phases.is_empty() {
                let shares: Vec<String> = thread
                    .phases
                    .iter()
                    .map(|(phase, n)| {
                        format!(
                            "{} {:.1}%",
                            phase.name(),
                            *n as f64 * 100.0 / thread.samples.max(1) as f64
                        )
                    })
                    .collect();
                let _ = writeln!(out, "  phases: {}", shares.join(", "));
            }
            let mut stacks: Vec<(&Arc<str>, &u64)> = thread.stacks.iter().collect();
            stacks.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            for (stack, count) in stacks.into_iter().take(top) {
                let share = *count as f64 * 100.0 / thread.samples.max(1) as f64;
                let frames: Vec<&str> = stack.rsplit(';').collect();
                let _ = writeln!(out, "  {share:5.1}%  {}", frames.join(" <- "));
            }
        }
        if self.dropped > 0 {
            let _ = writeln!(
                out,
                "({} samples of further threads not kept)",
                self.dropped
            );
        }
        out
    }

    /// Samples of a thread whose innermost frame is the function `name` (qualified name).
    pub fn innermost_share(&self, thread: &ThreadProfile, name: &str) -> f64 {
        let hits: u64 = thread
            .stacks
            .iter()
            .filter(|(stack, _)| {
                stack
                    .rsplit(';')
                    .next()
                    .is_some_and(|inner| inner.starts_with(&format!("{name} (")))
            })
            .map(|(_, count)| count)
            .sum();
        hits as f64 / thread.samples.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn sample(tid: u32, frames: &[&str]) -> PySample {
        PySample {
            tgid: 1,
            tid,
            thread: format!("t{tid}"),
            ns: 0,
            stack: Arc::new(
                frames
                    .iter()
                    .map(|n| CodeName {
                        name: (*n).into(),
                        file: "/app/m.py".into(),
                        line: 7,
                    })
                    .collect(),
            ),
            native: frames.is_empty(),
            cut: false,
            unknown_stack: false,
        }
    }

    #[test]
    fn threads_get_their_hottest_stacks_and_folded_lines() {
        let mut p = Profile::default();
        for _ in 0..3 {
            p.add(&sample(2, &["hot", "main"]));
        }
        p.add(&sample(2, &["cold", "main"]));
        p.add(&sample(3, &[]));
        p.add(&sample(
            4,
            &["LlamaModel.forward", "GPUModelRunner.execute_model"],
        ));
        assert_eq!(
            p.threads[&(1, 4)].phases.get(&Phase::ModelExecution),
            Some(&1)
        );
        assert!(p.report(1).contains("  phases: model execution 100.0%"));
        let folded = p.folded();
        assert!(
            folded.contains("1;t2 (2);main (m.py:7);hot (m.py:7) 3\n"),
            "{folded}"
        );
        assert!(
            folded.contains("1;t3 (3);[no Python frames] 1\n"),
            "{folded}"
        );
        let report = p.report(1);
        assert!(
            report.contains(" 75.0%  hot (m.py:7) <- main (m.py:7)"),
            "{report}"
        );
        assert!(!report.contains("cold"), "{report}");
        let t2 = &p.threads[&(1, 2)];
        assert_eq!(p.innermost_share(t2, "hot"), 0.75);
        assert_eq!(p.threads[&(1, 3)].without_python, 1);
    }

    #[test]
    fn a_sample_whose_stack_names_were_lost_is_unknown_not_native() {
        let mut p = Profile::default();
        let mut lost = sample(5, &[]);
        lost.unknown_stack = true;
        assert_eq!(p.add(&lost), SampleKind::Unknown);
        assert_eq!(p.threads[&(1, 5)].without_python, 0);
        let folded = p.folded();
        assert!(
            folded.contains("1;t5 (5);[stack names lost] 1\n"),
            "{folded}"
        );
    }
}
