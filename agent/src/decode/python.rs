//! Python stack samples: each sample with the names of its stack (announced once per process
//! and stack by the capture stage, `CaptureEvent::PythonStack`).
use std::{collections::HashMap, sync::Arc};

use infertrace_common::{PySampleRecord, py_flags};

use crate::discover::python::CodeName;

/// Stacks kept per agent; past it the table starts over (the capture stage announces a stack
/// again after its own table starts over, so a stack is rarely unknown for long).
const MAX_STACKS: usize = 65_536;

/// One CPU-clock sample of a thread of a Python process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PySample {
    pub tgid: u32,
    pub tid: u32,
    /// The thread's name.
    pub thread: String,
    pub ns: u64,
    /// Innermost frame first; empty for a thread with no Python frames (a native thread, or
    /// one between frames).
    pub stack: Arc<Vec<CodeName>>,
    /// The thread has no Python thread state (libzmq's I/O threads, pools).
    pub native: bool,
    /// The outermost frames are missing (deeper than the sampler walks), or the walk stopped
    /// on unreadable memory.
    pub cut: bool,
    /// The stack's names never arrived (lost with its announcement).
    pub unknown_stack: bool,
}

#[derive(Debug, Default)]
pub struct PythonSamples {
    stacks: HashMap<(u32, u64), Arc<Vec<CodeName>>>,
}

impl PythonSamples {
    pub fn stack(&mut self, tgid: u32, stack_id: u64, frames: &[CodeName]) {
        if self.stacks.len() >= MAX_STACKS {
            self.stacks.clear();
        }
        self.stacks
            .insert((tgid, stack_id), Arc::new(frames.to_vec()));
    }

    pub fn sample(&self, record: &PySampleRecord) -> PySample {
        let (tgid, id) = (record.header.tgid, record.stack_id);
        let known = self.stacks.get(&(tgid, id));
        let end = record.comm.iter().position(|&b| b == 0).unwrap_or(16);
        PySample {
            tgid,
            tid: record.header.tid,
            thread: String::from_utf8_lossy(&record.comm[..end]).into_owned(),
            ns: record.header.ts_ns,
            stack: known.cloned().unwrap_or_default(),
            native: record.flags & py_flags::NO_THREAD_STATE != 0,
            cut: record.flags & (py_flags::TRUNCATED | py_flags::READ_FAILED) != 0,
            unknown_stack: id != 0 && known.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use infertrace_common::{RecordHeader, kind};

    use super::*;

    fn record(stack_id: u64, flags: u32) -> PySampleRecord {
        PySampleRecord {
            header: RecordHeader {
                kind: kind::PY_SAMPLE,
                tgid: 7,
                tid: 8,
                _pad: 0,
                ts_ns: 100,
            },
            stack_id,
            depth: 1,
            flags,
            comm: *b"worker\0\0\0\0\0\0\0\0\0\0",
        }
    }

    #[test]
    fn samples_carry_their_announced_stack() {
        let mut samples = PythonSamples::default();
        let frame = CodeName {
            name: "hot".into(),
            file: "x.py".into(),
            line: 3,
        };
        samples.stack(7, 42, std::slice::from_ref(&frame));
        let s = samples.sample(&record(42, 0));
        assert_eq!((s.tid, s.thread.as_str(), s.ns), (8, "worker", 100));
        assert_eq!(s.stack.as_slice(), [frame]);
        assert!(!s.native && !s.cut && !s.unknown_stack);
        let unknown = samples.sample(&record(43, py_flags::TRUNCATED));
        assert!(unknown.unknown_stack && unknown.cut && unknown.stack.is_empty());
        let native = samples.sample(&record(0, py_flags::NO_THREAD_STATE));
        assert!(native.native && !native.unknown_stack);
    }
}
