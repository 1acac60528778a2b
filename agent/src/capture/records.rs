//! Parsing raw ring-buffer records (the `infertrace-common` ABI) into typed values.
//!
//! Pure and total: any byte string gives either a record or an error, never a panic, because
//! recorded files are untrusted input to `infertrace replay`.
use infertrace_common::{
    CudaCallRecord, CudaNameRecord, CudaStepRecord, ElidedWrite, IoRecord, MailboxPollRecord,
    NewFdRecord, PollRecord, ProcRecord, PySampleRecord, RecordHeader, SSE_BATCH_LEN,
    SseBatchRecord, ZmqSendRecord, kind,
};
use thiserror::Error;

/// One kernel record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Fork {
        header: RecordHeader,
        child: u32,
        comm: String,
    },
    Exec {
        header: RecordHeader,
        comm: String,
    },
    /// An untracked process called execve (node mode: is it an engine starting?).
    Spawn {
        header: RecordHeader,
        comm: String,
    },
    Exit {
        header: RecordHeader,
    },
    NewFd {
        header: RecordHeader,
        fd: u32,
        /// The fd's incarnation, to answer with (0 in old recordings).
        generation: u32,
    },
    Close {
        header: RecordHeader,
        fd: u32,
    },
    Io {
        io: IoRecord,
        payload: Vec<u8>,
    },
    /// A main thread's epoll wait; `header.ts_ns` is its return.
    Poll {
        header: RecordHeader,
        enter_ns: u64,
        ret: i64,
        /// When the long loop iteration it ends began ([`PollRecord::iteration_start_ns`]).
        iteration_start_ns: u64,
    },
    /// A thread's CUDA driver calls up to a synchronisation, counted in the kernel.
    CudaStep(Box<CudaStepRecord>),
    /// One CUDA driver call (aggregation off).
    CudaCall(CudaCallRecord),
    /// A CUDA driver lookup that named a handle.
    CudaName(Box<CudaNameRecord>),
    /// A Python thread's stack sample (its stack interned in the kernel's `PY_STACKS`).
    PySample(PySampleRecord),
    /// An application thread handed a message to libzmq.
    ZmqSend(ZmqSendRecord),
    /// A thread polled a captured eventfd (a libzmq mailbox).
    MailboxPoll(MailboxPollRecord),
    /// A thread entered CPython's `pickle.dumps`.
    PickleDumps {
        header: RecordHeader,
    },
    /// The process mapped part of a file executable (a library being loaded).
    LibraryMapped {
        header: RecordHeader,
    },
    /// Writes of fd `fd` that matched its streamed response's template, by time and size.
    SseBatch {
        header: RecordHeader,
        fd: u32,
        writes: Vec<ElidedWrite>,
    },
}

impl Record {
    pub fn header(&self) -> &RecordHeader {
        match self {
            Record::Fork { header, .. }
            | Record::Exec { header, .. }
            | Record::Spawn { header, .. }
            | Record::Exit { header }
            | Record::NewFd { header, .. }
            | Record::Close { header, .. }
            | Record::Poll { header, .. }
            | Record::PickleDumps { header }
            | Record::LibraryMapped { header }
            | Record::SseBatch { header, .. } => header,
            Record::Io { io, .. } => &io.header,
            Record::CudaStep(r) => &r.header,
            Record::CudaCall(r) => &r.header,
            Record::CudaName(r) => &r.header,
            Record::PySample(r) => &r.header,
            Record::ZmqSend(r) => &r.header,
            Record::MailboxPoll(r) => &r.header,
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record of {len} bytes is shorter than its {need}-byte header")]
    Short { len: usize, need: usize },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
    #[error("IO record says {declared} payload bytes but carries {present}")]
    PayloadLength { declared: usize, present: usize },
    #[error(
        "SSE batch record says {declared} writes but carries {present} (at most {SSE_BATCH_LEN})"
    )]
    BatchLength { declared: usize, present: usize },
}

/// Parse one record as the kernel wrote it into the ring buffer.
pub fn parse(bytes: &[u8]) -> Result<Record, RecordError> {
    let header: RecordHeader = read(bytes)?;
    match header.kind {
        kind::FORK => {
            let r: ProcRecord = read(bytes)?;
            Ok(Record::Fork {
                header,
                child: r.child,
                comm: comm(&r.comm),
            })
        }
        kind::EXEC => {
            let r: ProcRecord = read(bytes)?;
            Ok(Record::Exec {
                header,
                comm: comm(&r.comm),
            })
        }
        kind::SPAWN => Ok(Record::Spawn {
            header,
            comm: comm(&read::<ProcRecord>(bytes)?.comm),
        }),
        kind::EXIT => Ok(Record::Exit { header }),
        kind::NEW_FD => {
            let r: NewFdRecord = read(bytes)?;
            Ok(Record::NewFd {
                header,
                fd: r.fd,
                generation: r.generation,
            })
        }
        kind::CLOSE => Ok(Record::Close {
            header,
            fd: read::<NewFdRecord>(bytes)?.fd,
        }),
        kind::IO => {
            let io: IoRecord = read(bytes)?;
            let payload = &bytes[size_of::<IoRecord>()..];
            let declared = io.len as usize;
            // The ring buffer rounds records up to 8 bytes; extra bytes are padding.
            if payload.len() < declared {
                return Err(RecordError::PayloadLength {
                    declared,
                    present: payload.len(),
                });
            }
            Ok(Record::Io {
                io,
                payload: payload[..declared].to_vec(),
            })
        }
        kind::POLL => {
            let r: PollRecord = read_grown(bytes, POLL_RECORD_BEFORE_ITERATIONS)?;
            Ok(Record::Poll {
                header,
                enter_ns: r.enter_ns,
                ret: r.ret,
                iteration_start_ns: r.iteration_start_ns,
            })
        }
        kind::CUDA_STEP => Ok(Record::CudaStep(Box::new(read(bytes)?))),
        kind::CUDA_CALL => Ok(Record::CudaCall(read(bytes)?)),
        kind::CUDA_NAME => Ok(Record::CudaName(Box::new(read(bytes)?))),
        kind::PY_SAMPLE => Ok(Record::PySample(read(bytes)?)),
        kind::ZMQ_SEND => Ok(Record::ZmqSend(read(bytes)?)),
        kind::MAILBOX_POLL => Ok(Record::MailboxPoll(read(bytes)?)),
        kind::PICKLE_DUMPS => Ok(Record::PickleDumps { header }),
        kind::LIBRARY_MAPPED => Ok(Record::LibraryMapped { header }),
        kind::SSE_BATCH => parse_sse_batch(header, bytes),
        other => Err(RecordError::UnknownKind(other)),
    }
}

/// An SSE_BATCH record: its head, then only the `count` entries the kernel filled.
fn parse_sse_batch(header: RecordHeader, bytes: &[u8]) -> Result<Record, RecordError> {
    let head = std::mem::offset_of!(SseBatchRecord, entries);
    if bytes.len() < head {
        return Err(RecordError::Short {
            len: bytes.len(),
            need: head,
        });
    }
    let fd: u32 = read(&bytes[size_of::<RecordHeader>()..])?;
    let declared: u32 = read(&bytes[size_of::<RecordHeader>() + 4..])?;
    let entries = &bytes[head..];
    let present = entries.len() / size_of::<ElidedWrite>();
    let declared = declared as usize;
    if declared > SSE_BATCH_LEN || declared > present {
        return Err(RecordError::BatchLength { declared, present });
    }
    let writes = entries
        .chunks_exact(size_of::<ElidedWrite>())
        .take(declared)
        .map(read)
        .collect::<Result<_, _>>()?;
    Ok(Record::SseBatch { header, fd, writes })
}

/// The size of a POLL record in recordings made before it carried `iteration_start_ns`.
const POLL_RECORD_BEFORE_ITERATIONS: usize = size_of::<PollRecord>() - size_of::<u64>();

/// Copy a `repr(C)` plain-integer struct out of the front of `bytes`.
fn read<T: Copy + Default>(bytes: &[u8]) -> Result<T, RecordError> {
    read_grown(bytes, size_of::<T>())
}

/// [`read`] for a struct that grew at its end: `bytes` needs at least its first `min` bytes,
/// and the fields it lacks (an older recording's record) are zero.
fn read_grown<T: Copy + Default>(bytes: &[u8], min: usize) -> Result<T, RecordError> {
    if bytes.len() < min {
        return Err(RecordError::Short {
            len: bytes.len(),
            need: min,
        });
    }
    let len = bytes.len().min(size_of::<T>());
    let mut value = T::default();
    // SAFETY: T is one of the ABI structs: repr(C), integers and byte arrays only, so every bit
    // pattern is valid; `len` bytes are copied, no more than both sizes; no alignment is
    // assumed.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut value as *mut T).cast::<u8>(), len);
    }
    Ok(value)
}

fn comm(raw: &[u8; 16]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Serialise a record back to the kernel's byte layout: `parse(&encode(r)) == r`. Recordings
/// store records this way, so replay runs the very parser live capture uses.
pub fn encode(record: &Record) -> Vec<u8> {
    fn comm_bytes(comm: &str) -> [u8; 16] {
        let mut raw = [0u8; 16];
        let n = comm.len().min(15);
        raw[..n].copy_from_slice(&comm.as_bytes()[..n]);
        raw
    }
    let proc = |header: &RecordHeader, child: u32, comm: &str| {
        bytes_of(&ProcRecord {
            header: *header,
            child,
            _pad: 0,
            comm: comm_bytes(comm),
        })
    };
    match record {
        Record::Fork {
            header,
            child,
            comm,
        } => proc(header, *child, comm),
        Record::Exec { header, comm } | Record::Spawn { header, comm } => {
            proc(header, header.tgid, comm)
        }
        Record::Exit { header } => proc(header, header.tgid, ""),
        Record::NewFd {
            header,
            fd,
            generation,
        } => bytes_of(&NewFdRecord {
            header: *header,
            fd: *fd,
            generation: *generation,
        }),
        Record::Close { header, fd } => bytes_of(&NewFdRecord {
            header: *header,
            fd: *fd,
            generation: 0,
        }),
        Record::Io { io, payload } => {
            let mut out = bytes_of(io);
            out.extend_from_slice(payload);
            out
        }
        Record::Poll {
            header,
            enter_ns,
            ret,
            iteration_start_ns,
        } => bytes_of(&PollRecord {
            header: *header,
            enter_ns: *enter_ns,
            ret: *ret,
            iteration_start_ns: *iteration_start_ns,
        }),
        Record::CudaStep(r) => bytes_of(r.as_ref()),
        Record::CudaCall(r) => bytes_of(r),
        Record::CudaName(r) => bytes_of(r.as_ref()),
        Record::PySample(r) => bytes_of(r),
        Record::ZmqSend(r) => bytes_of(r),
        Record::MailboxPoll(r) => bytes_of(r),
        Record::PickleDumps { header } | Record::LibraryMapped { header } => bytes_of(header),
        Record::SseBatch { header, fd, writes } => {
            let mut out = bytes_of(header);
            out.extend_from_slice(&fd.to_ne_bytes());
            out.extend_from_slice(&(writes.len() as u32).to_ne_bytes());
            for write in writes {
                out.extend_from_slice(&bytes_of(write));
            }
            out
        }
    }
}

/// The bytes of a `repr(C)` plain-integer ABI struct.
fn bytes_of<T: Copy>(value: &T) -> Vec<u8> {
    // SAFETY: T is one of the ABI structs: repr(C) integers and byte arrays with explicit
    // padding fields, so every byte is initialised.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_common::{direction, io_flags};

    fn io(len: u32) -> IoRecord {
        IoRecord {
            header: RecordHeader {
                kind: kind::IO,
                tgid: 10,
                tid: 11,
                _pad: 0,
                ts_ns: 5,
            },
            reserved: 0,
            seq: 7,
            ret: len as i64,
            fd: 3,
            offset: 0,
            len,
            syscall: 0,
            flags: io_flags::LAST,
            direction: direction::EGRESS,
            _pad: [0; 7],
        }
    }

    #[test]
    fn every_kind_round_trips() {
        let header = RecordHeader {
            kind: kind::FORK,
            tgid: 1,
            tid: 2,
            _pad: 0,
            ts_ns: 3,
        };
        let records = [
            Record::Fork {
                header,
                child: 9,
                comm: "python3".into(),
            },
            Record::Exec {
                header: RecordHeader {
                    kind: kind::EXEC,
                    ..header
                },
                comm: "vllm".into(),
            },
            Record::Spawn {
                header: RecordHeader {
                    kind: kind::SPAWN,
                    ..header
                },
                comm: "python3".into(),
            },
            Record::Exit {
                header: RecordHeader {
                    kind: kind::EXIT,
                    ..header
                },
            },
            Record::NewFd {
                header: RecordHeader {
                    kind: kind::NEW_FD,
                    ..header
                },
                fd: 7,
                generation: 9,
            },
            Record::Close {
                header: RecordHeader {
                    kind: kind::CLOSE,
                    ..header
                },
                fd: 7,
            },
            Record::Io {
                io: io(3),
                payload: b"abc".to_vec(),
            },
            Record::Poll {
                header: RecordHeader {
                    kind: kind::POLL,
                    ..header
                },
                enter_ns: 2,
                ret: -4,
                iteration_start_ns: 1,
            },
            Record::CudaStep(Box::new(CudaStepRecord {
                header: RecordHeader {
                    kind: kind::CUDA_STEP,
                    ..header
                },
                launches: 5,
                sync_result: -1,
                ..CudaStepRecord::default()
            })),
            Record::CudaCall(CudaCallRecord {
                header: RecordHeader {
                    kind: kind::CUDA_CALL,
                    ..header
                },
                handle: 0xabc,
                ..CudaCallRecord::default()
            }),
            Record::CudaName(Box::new(CudaNameRecord {
                header: RecordHeader {
                    kind: kind::CUDA_NAME,
                    ..header
                },
                len: 3,
                ..CudaNameRecord::default()
            })),
            Record::PySample(PySampleRecord {
                header: RecordHeader {
                    kind: kind::PY_SAMPLE,
                    ..header
                },
                stack_id: 1 << 63 | 5,
                depth: 3,
                flags: 2,
                comm: *b"VLLM::EngineCor\0",
            }),
            Record::ZmqSend(ZmqSendRecord {
                header: RecordHeader {
                    kind: kind::ZMQ_SEND,
                    ..header
                },
                socket: 0x5555_0000_1000,
                enter_ns: 7,
                size: 1234,
                _pad: 0,
            }),
            Record::MailboxPoll(MailboxPollRecord {
                header: RecordHeader {
                    kind: kind::MAILBOX_POLL,
                    ..header
                },
                enter_ns: 2,
                ret: 0,
                fd: 68,
                nfds: 2,
                timeout_ms: 1000,
                second_fd: 69,
            }),
            Record::PickleDumps {
                header: RecordHeader {
                    kind: kind::PICKLE_DUMPS,
                    ..header
                },
            },
            Record::LibraryMapped {
                header: RecordHeader {
                    kind: kind::LIBRARY_MAPPED,
                    ..header
                },
            },
            Record::SseBatch {
                header: RecordHeader {
                    kind: kind::SSE_BATCH,
                    ..header
                },
                fd: 12,
                writes: vec![
                    ElidedWrite {
                        seq: 4,
                        ts_ns: 40,
                        len: 171,
                        content: 4,
                    },
                    ElidedWrite {
                        seq: 5,
                        ts_ns: 50,
                        len: 169,
                        content: 0,
                    },
                ],
            },
        ];
        for record in records {
            assert_eq!(parse(&encode(&record)).unwrap(), record);
        }
    }

    #[test]
    fn io_round_trip_ignores_ring_padding() {
        let mut bytes = encode(&Record::Io {
            io: io(3),
            payload: b"abc".to_vec(),
        });
        bytes.extend_from_slice(&[0; 5]);
        match parse(&bytes).unwrap() {
            Record::Io { io: r, payload } => {
                assert_eq!(r, io(3));
                assert_eq!(payload, b"abc");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_poll_record_of_an_older_recording_has_no_long_iteration() {
        let header = RecordHeader {
            kind: kind::POLL,
            tgid: 5,
            tid: 5,
            _pad: 0,
            ts_ns: 9,
        };
        let bytes = encode(&Record::Poll {
            header,
            enter_ns: 4,
            ret: 1,
            iteration_start_ns: 3,
        });
        let older = &bytes[..POLL_RECORD_BEFORE_ITERATIONS];
        assert_eq!(
            parse(older).unwrap(),
            Record::Poll {
                header,
                enter_ns: 4,
                ret: 1,
                iteration_start_ns: 0,
            }
        );
        assert!(matches!(
            parse(&older[..older.len() - 1]),
            Err(RecordError::Short { .. })
        ));
    }

    #[test]
    fn short_and_lying_records_are_errors() {
        assert!(matches!(parse(&[1, 0, 0]), Err(RecordError::Short { .. })));
        let bytes = encode(&Record::Io {
            io: io(10),
            payload: b"abc".to_vec(),
        });
        assert_eq!(
            parse(&bytes),
            Err(RecordError::PayloadLength {
                declared: 10,
                present: 3
            })
        );
        let mut unknown = encode(&Record::Io {
            io: io(0),
            payload: Vec::new(),
        });
        unknown[0] = 99;
        assert_eq!(parse(&unknown), Err(RecordError::UnknownKind(99)));
        let header = RecordHeader {
            kind: kind::SSE_BATCH,
            ..RecordHeader::default()
        };
        let mut batch = encode(&Record::SseBatch {
            header,
            fd: 3,
            writes: vec![ElidedWrite::default(); 2],
        });
        // Says three writes, carries two.
        batch[size_of::<RecordHeader>() + 4] = 3;
        assert_eq!(
            parse(&batch),
            Err(RecordError::BatchLength {
                declared: 3,
                present: 2
            })
        );
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..400 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 7) as u8
                })
                .collect();
            let _ = parse(&bytes);
        }
    }
}
