//! A traced process reading a regular file: the kernel sees that the new fd is a file and
//! copies none of its reads while userspace classifies it (a model or module load reads
//! gigabytes of files, none of which a decoder reads), while a new pipe's or socket's first
//! bytes are still copied before classification (the first request on a fresh connection
//! arrives in its first read).
use infertrace::capture::{CaptureEvent, Record};
use infertrace_common::direction;
use infertrace_tests::{Script, Tracer};

/// Ingress payload bytes the kernel copied for fd `fd` of `pid`.
fn copied_reads(events: &[CaptureEvent], pid: u32, fd: u32) -> u64 {
    events
        .iter()
        .filter_map(|e| match e {
            CaptureEvent::Kernel(Record::Io { io, payload })
                if io.header.tgid == pid && io.fd == fd && io.direction == direction::INGRESS =>
            {
                Some(payload.len() as u64)
            }
            _ => None,
        })
        .sum()
}

#[test]
fn a_new_files_reads_are_not_copied_and_a_new_pipes_are() {
    let dir = std::env::temp_dir().join(format!("capture-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("weights.bin");
    std::fs::write(&file, vec![7u8; 1 << 20]).expect("a 1 MiB file");
    let code = "import os, sys\n\
        sys.stdin.readline()\n\
        f = os.open(sys.argv[1], os.O_RDONLY)\n\
        n = 0\n\
        while True:\n\
        \x20   b = os.read(f, 65536)\n\
        \x20   if not b: break\n\
        \x20   n += len(b)\n\
        r, w = os.pipe()\n\
        os.write(w, b'x' * 1000)\n\
        m = len(os.read(r, 4096))\n\
        print(f'file {f} {n} pipe {r} {m}', flush=True)\n\
        sys.stdin.readline()\n";
    let mut script = Script::start(&["-c", code, file.to_str().unwrap()]);
    let mut tracer = Tracer::attach(&[script.pid()]);
    // Everything happens before the first drain: both fds are still pending in the kernel.
    script.send_line("go");
    let line = script.read_line();
    let fields: Vec<&str> = line.split(' ').collect();
    let number = |i: usize| -> u32 { fields[i].parse().unwrap_or_else(|_| panic!("{line}")) };
    let (file_fd, file_bytes, pipe_fd, pipe_bytes) = (number(1), number(2), number(4), number(5));
    assert_eq!((file_bytes, pipe_bytes), (1 << 20, 1000), "{line}");
    tracer.pump();
    let pid = script.pid();
    let (file_copied, pipe_copied) = (
        copied_reads(&tracer.events, pid, file_fd),
        copied_reads(&tracer.events, pid, pipe_fd),
    );
    let what = tracer.describe();
    assert_eq!(file_copied, 0, "the file's reads were copied:\n{what}");
    assert_eq!(
        pipe_copied, 1000,
        "the pipe's first read was not copied:\n{what}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
