//! The recording file: `infertrace record` writes it, `infertrace replay` reads it.
//!
//! Layout: the line `INFERTRACE-RECORDING 1`, one JSON line [`Header`], then frames
//! `[tag u8][len u32 LE][body]`: tag 1 = a kernel record in the ring buffer's byte layout,
//! tag 2 = a JSON [`MetaEvent`], in the order the events happened. Kernel records in their
//! own layout keep replay on the very parser live capture uses.
use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{CaptureEvent, KernelCounters, ProcessInfo, records};
use crate::{
    discover::{engine::Target, kubernetes::PodIdentity, python::CodeName, sockets::FdKind},
    engines::Engine,
};

const MAGIC: &str = "INFERTRACE-RECORDING 1";
const TAG_KERNEL: u8 = 1;
const TAG_META: u8 = 2;
/// Larger frames are rejected on read: no kernel record comes near it.
const MAX_FRAME: u32 = 64 * 1024 * 1024;

/// Where and when a recording was made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub host: String,
    pub kernel: String,
    pub agent_version: String,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC in ns when recording started, to turn the kernel's
    /// monotonic timestamps into wall-clock time.
    pub realtime_minus_monotonic_ns: i128,
    pub pids: Vec<u32>,
    pub processes: Vec<ProcessInfo>,
    /// Each traced server as discovery found it (absent in recordings made before several
    /// could be traced: see [`Header::targets`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<Target>,
    /// Older recordings (one engine): its installed version, served model name and kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Engine>,
}

impl Header {
    /// The traced servers. An older recording kept one engine for all its pids (none: vLLM,
    /// unless SGLang's process titles, `sglang::scheduler`, say otherwise).
    pub fn targets(&self) -> Vec<Target> {
        if !self.targets.is_empty() {
            return self.targets.clone();
        }
        let engine = self.engine.or_else(|| {
            self.processes
                .iter()
                .any(|p| p.comm.starts_with("sglang::"))
                .then_some(Engine::Sglang)
        });
        self.pids
            .iter()
            .map(|&pid| Target {
                pid,
                engine,
                version: self.engine_version.clone(),
                served_model: self.served_model.clone(),
                ..Target::default()
            })
            .collect()
    }
}

/// Non-kernel events, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum MetaEvent {
    Process(ProcessInfo),
    Target(Box<Target>),
    Pod {
        pid: u32,
        pod: Box<PodIdentity>,
    },
    Fd {
        tgid: u32,
        fd: u32,
        kind: FdKind,
    },
    Counters(KernelCounters),
    Tick,
    PythonStack {
        tgid: u32,
        stack_id: u64,
        frames: Vec<CodeName>,
    },
    /// The offset as i64 (serde's tagged enums cannot hold an i128; an i64 of ns reaches 2262).
    Clock {
        monotonic_ns: u64,
        realtime_minus_monotonic_ns: i64,
    },
}

#[derive(Debug, Error)]
pub enum RecordingError {
    #[error("not an infertrace recording (first line is not `{MAGIC}`)")]
    BadMagic,
    #[error("recording header: {0}")]
    Header(serde_json::Error),
    #[error("frame {index}: {reason}")]
    Frame { index: u64, reason: String },
    #[error(transparent)]
    Io(#[from] io::Error),
}

pub struct Writer<W: Write> {
    out: W,
}

impl<W: Write> Writer<W> {
    pub fn new(mut out: W, header: &Header) -> io::Result<Self> {
        writeln!(out, "{MAGIC}")?;
        serde_json::to_writer(&mut out, header)?;
        writeln!(out)?;
        Ok(Self { out })
    }

    /// Store one event, in stream order.
    pub fn write(&mut self, event: &CaptureEvent) -> io::Result<()> {
        let meta = match event {
            CaptureEvent::Kernel(record) => {
                return self.frame(TAG_KERNEL, &records::encode(record));
            }
            CaptureEvent::Process(p) => MetaEvent::Process(p.clone()),
            CaptureEvent::Target(t) => MetaEvent::Target(t.clone()),
            CaptureEvent::Pod { pid, pod } => MetaEvent::Pod {
                pid: *pid,
                pod: pod.clone(),
            },
            CaptureEvent::Fd { tgid, fd, kind } => MetaEvent::Fd {
                tgid: *tgid,
                fd: *fd,
                kind: kind.clone(),
            },
            CaptureEvent::Counters(c) => MetaEvent::Counters(*c),
            CaptureEvent::Tick => MetaEvent::Tick,
            CaptureEvent::PythonStack {
                tgid,
                stack_id,
                frames,
            } => MetaEvent::PythonStack {
                tgid: *tgid,
                stack_id: *stack_id,
                frames: frames.clone(),
            },
            CaptureEvent::Clock {
                monotonic_ns,
                realtime_minus_monotonic_ns,
            } => MetaEvent::Clock {
                monotonic_ns: *monotonic_ns,
                realtime_minus_monotonic_ns: (*realtime_minus_monotonic_ns)
                    .clamp(i64::MIN.into(), i64::MAX.into())
                    as i64,
            },
        };
        self.frame(TAG_META, &serde_json::to_vec(&meta)?)
    }

    fn frame(&mut self, tag: u8, body: &[u8]) -> io::Result<()> {
        self.out.write_all(&[tag])?;
        self.out.write_all(&(body.len() as u32).to_le_bytes())?;
        self.out.write_all(body)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

pub struct Reader<R: BufRead> {
    input: R,
    index: u64,
    /// Frames that could not be decoded (reported, then skipped).
    pub bad_frames: u64,
}

impl<R: BufRead> Reader<R> {
    pub fn open(mut input: R) -> Result<(Self, Header), RecordingError> {
        let mut line = String::new();
        input.read_line(&mut line)?;
        if line.trim_end() != MAGIC {
            return Err(RecordingError::BadMagic);
        }
        line.clear();
        input.read_line(&mut line)?;
        let header = serde_json::from_str(&line).map_err(RecordingError::Header)?;
        Ok((
            Self {
                input,
                index: 0,
                bad_frames: 0,
            },
            header,
        ))
    }

    /// The next event; Ok(None) at the end. A frame whose body does not decode is counted in
    /// `bad_frames` and skipped; a truncated file ends the stream with an error.
    pub fn next_event(&mut self) -> Result<Option<CaptureEvent>, RecordingError> {
        loop {
            let mut head = [0u8; 5];
            // End of file is clean only between frames.
            if self.input.fill_buf()?.is_empty() {
                return Ok(None);
            }
            self.index += 1;
            self.input
                .read_exact(&mut head)
                .map_err(|e| self.frame_error(format!("truncated header: {e}")))?;
            let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
            if len > MAX_FRAME {
                return Err(self.frame_error(format!("length {len} exceeds {MAX_FRAME}")));
            }
            let mut body = vec![0u8; len as usize];
            self.input
                .read_exact(&mut body)
                .map_err(|e| self.frame_error(format!("truncated body: {e}")))?;
            match decode_frame(head[0], &body) {
                Ok(event) => return Ok(Some(event)),
                Err(reason) => {
                    tracing::warn!("recording frame {}: {reason}; skipped", self.index);
                    self.bad_frames += 1;
                }
            }
        }
    }

    fn frame_error(&self, reason: String) -> RecordingError {
        RecordingError::Frame {
            index: self.index,
            reason,
        }
    }
}

fn decode_frame(tag: u8, body: &[u8]) -> Result<CaptureEvent, String> {
    match tag {
        TAG_KERNEL => records::parse(body)
            .map(CaptureEvent::Kernel)
            .map_err(|e| e.to_string()),
        TAG_META => {
            let meta: MetaEvent = serde_json::from_slice(body).map_err(|e| e.to_string())?;
            Ok(match meta {
                MetaEvent::Process(p) => CaptureEvent::Process(p),
                MetaEvent::Target(t) => CaptureEvent::Target(t),
                MetaEvent::Pod { pid, pod } => CaptureEvent::Pod { pid, pod },
                MetaEvent::Fd { tgid, fd, kind } => CaptureEvent::Fd { tgid, fd, kind },
                MetaEvent::Counters(c) => CaptureEvent::Counters(c),
                MetaEvent::Tick => CaptureEvent::Tick,
                MetaEvent::PythonStack {
                    tgid,
                    stack_id,
                    frames,
                } => CaptureEvent::PythonStack {
                    tgid,
                    stack_id,
                    frames,
                },
                MetaEvent::Clock {
                    monotonic_ns,
                    realtime_minus_monotonic_ns,
                } => CaptureEvent::Clock {
                    monotonic_ns,
                    realtime_minus_monotonic_ns: realtime_minus_monotonic_ns.into(),
                },
            })
        }
        other => Err(format!("unknown frame tag {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::Record;
    use infertrace_common::{IoRecord, RecordHeader, io_flags, kind};

    fn header() -> Header {
        Header {
            host: "h".into(),
            kernel: "6.18".into(),
            agent_version: "0.1.0".into(),
            realtime_minus_monotonic_ns: 42,
            pids: vec![1],
            processes: vec![],
            targets: vec![Target {
                pid: 1,
                engine: Some(Engine::Vllm),
                version: Some("0.32.0".into()),
                served_model: None,
                ..Target::default()
            }],
            engine_version: None,
            served_model: None,
            engine: None,
        }
    }

    #[test]
    fn an_older_recording_kept_one_engine_for_its_pids() {
        let old = Header {
            pids: vec![1, 2],
            targets: Vec::new(),
            engine_version: Some("0.5.23".into()),
            processes: vec![ProcessInfo {
                pid: 3,
                ppid: Some(1),
                comm: "sglang::schedul".into(),
                cmdline: Vec::new(),
            }],
            ..header()
        };
        let targets = old.targets();
        assert_eq!(targets.len(), 2);
        assert_eq!(targets[1].pid, 2);
        assert_eq!(targets[1].engine, Some(Engine::Sglang));
        assert_eq!(targets[1].version.as_deref(), Some("0.5.23"));
        assert_eq!(header().targets(), header().targets);
    }

    #[test]
    fn round_trip() {
        let io = IoRecord {
            header: RecordHeader {
                kind: kind::IO,
                tgid: 1,
                tid: 1,
                _pad: 0,
                ts_ns: 9,
            },
            len: 2,
            ret: 2,
            flags: io_flags::LAST,
            ..IoRecord::default()
        };
        let kernel = CaptureEvent::Kernel(Record::Io {
            io,
            payload: b"hi".to_vec(),
        });
        let fd = CaptureEvent::Fd {
            tgid: 1,
            fd: 3,
            kind: FdKind::Unix { path: None },
        };
        // A wall clock far ahead of the monotonic one, or behind it: the offset keeps its sign.
        let clock = CaptureEvent::Clock {
            monotonic_ns: 7,
            realtime_minus_monotonic_ns: -1_796_297_145_939_750_912,
        };
        let mut buf = Vec::new();
        let mut w = Writer::new(&mut buf, &header()).unwrap();
        w.write(&kernel).unwrap();
        w.write(&fd).unwrap();
        w.write(&clock).unwrap();
        w.write(&CaptureEvent::Tick).unwrap();
        w.flush().unwrap();
        let (mut r, h) = Reader::open(&buf[..]).unwrap();
        assert_eq!(h, header());
        assert_eq!(r.next_event().unwrap(), Some(kernel));
        assert_eq!(r.next_event().unwrap(), Some(fd));
        assert_eq!(r.next_event().unwrap(), Some(clock));
        assert_eq!(r.next_event().unwrap(), Some(CaptureEvent::Tick));
        assert_eq!(r.next_event().unwrap(), None);
    }

    #[test]
    fn bad_input_is_reported_not_panicked() {
        assert!(matches!(
            Reader::open(&b"hello\n"[..]),
            Err(RecordingError::BadMagic)
        ));
        let mut buf = Vec::new();
        let mut w = Writer::new(&mut buf, &header()).unwrap();
        w.frame(9, b"x").unwrap();
        w.frame(TAG_META, b"{not json").unwrap();
        w.frame(TAG_META, br#"{"event":"tick"}"#).unwrap();
        w.flush().unwrap();
        buf.extend_from_slice(&[TAG_KERNEL, 100, 0, 0, 0, 1, 2]);
        let (mut r, _) = Reader::open(&buf[..]).unwrap();
        assert_eq!(r.next_event().unwrap(), Some(CaptureEvent::Tick));
        assert_eq!(r.bad_frames, 2);
        assert!(matches!(r.next_event(), Err(RecordingError::Frame { .. })));
    }
}
