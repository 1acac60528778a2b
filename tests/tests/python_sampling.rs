//! Python stack sampling on the real kernel and real interpreters: the CPU-clock sampler and its
//! frame walk (ebpf/src/python.rs), interpreter discovery (agent/src/discover/python.rs) and
//! naming from the process's memory, run against tests/fixtures/python/hot_threads.py (two
//! threads spinning in known functions, a sleeping thread, threads starting and exiting all the
//! time) on pyenv's CPython 3.11 (shared libpython), Debian's python3.11 (static, non-PIE,
//! dynamic symbols only), and pyenv's 3.10, 3.12 and 3.13 (this machine kind ships them). Then
//! the process is killed while sampled. Run as root.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use infertrace::{
    capture::{kernel::KernelOptions, python_watch::PythonOptions},
    decode::flows::Decoded,
    discover::python,
    telemetry::profile::Profile,
};
use infertrace_tests::{Script, Tracer, fixture};

/// A fast rate, so that a few seconds give hundreds of samples.
const HZ: u64 = 199;
/// The share of a spinning thread's samples that must name its hot function.
const HOT_SHARE: f64 = 0.9;

fn pyenv_python(minor: &str) -> Option<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    let mut versions: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{minor}.")))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|v| v.join("bin/python3"))
        .filter(|p| p.exists())
}

/// Sample the fixture under `python` and check what the samples say.
fn check(python: &Path) {
    let mut command = Command::new(python);
    command.arg(fixture("python/hot_threads.py"));
    let mut program = Script::spawn(command);
    assert_eq!(program.read_line(), "ready");
    let pid = program.pid();
    let options = KernelOptions {
        python: PythonOptions { off: false, hz: HZ },
        ..KernelOptions::default()
    };
    // 3.13 publishes its offsets: they are the ones used, and equal what its headers say.
    let found =
        python::discover(pid, &mut python::BinaryCache::default()).expect("a Python process");
    if found.version >= (3, 13) {
        assert_eq!(found.offsets_from, python::PUBLISHED);
        assert_eq!(
            Some((found.frames, found.code)),
            python::table_layout(found.version),
            "the table agrees with what the interpreter publishes"
        );
    }
    let mut tracer = Tracer::attach_with(&[pid], &options);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        tracer.pump();
        std::thread::sleep(Duration::from_millis(20));
    }
    // The process goes away while it is sampled: no error, and nothing after it.
    let _ = program.child.kill();
    let _ = program.child.wait();
    let (decoded, _) = tracer.finish();
    let mut profile = Profile::default();
    for d in &decoded {
        if let Decoded::PySample(sample) = d {
            assert!(!sample.unknown_stack, "a sample's stack was never named");
            profile.add(sample);
        }
    }
    let report = profile.report(3);
    println!("{}:\n{report}", python.display());
    let main = profile
        .threads
        .get(&(pid, pid))
        .unwrap_or_else(|| panic!("no samples of the main thread:\n{report}"));
    assert!(main.samples > 100, "{report}");
    let share = profile.innermost_share(main, "main_hot");
    assert!(
        share >= HOT_SHARE,
        "main thread in main_hot {share:.2}\n{report}"
    );
    // The busiest other thread is the worker.
    let worker = profile
        .threads
        .iter()
        .filter(|((p, t), _)| *p == pid && *t != pid)
        .map(|(_, thread)| thread)
        .max_by_key(|thread| thread.samples)
        .unwrap_or_else(|| panic!("no samples of the worker thread:\n{report}"));
    let share = profile.innermost_share(worker, "worker_hot");
    assert!(
        share >= HOT_SHARE,
        "worker in worker_hot {share:.2}\n{report}"
    );
    let folded = profile.folded();
    assert!(
        folded.contains("worker_loop (hot_threads.py:25);worker_hot (hot_threads.py:18)"),
        "qualified names, files and first lines:\n{folded}"
    );
}

#[test]
fn hot_functions_are_named_on_every_interpreter_here() {
    // pyenv's 3.11 is the `python3` CI runs with; Debian's is the system's; this machine kind
    // ships pyenv's 3.10, 3.12 and 3.13 too, and each one is required: none is skipped.
    let debian = PathBuf::from("/usr/bin/python3.11");
    assert!(debian.exists(), "Debian's python3.11");
    let mut interpreters: Vec<PathBuf> = ["3.11", "3.10", "3.12", "3.13"]
        .into_iter()
        .map(|version| pyenv_python(version).unwrap_or_else(|| panic!("pyenv's CPython {version}")))
        .collect();
    interpreters.insert(1, debian);
    println!("interpreters: {interpreters:?}");
    for python in &interpreters {
        check(python);
    }
}

/// `infertrace profile`: the hottest stacks of each thread on stdout, folded stacks in the file
/// `--profile-output` names.
#[test]
fn the_profile_command_prints_hot_stacks_and_writes_folded_ones() {
    let mut command = Command::new(pyenv_python("3.11").expect("pyenv's CPython 3.11"));
    command.arg(fixture("python/hot_threads.py"));
    let mut program = Script::spawn(command);
    assert_eq!(program.read_line(), "ready");
    let pid = program.pid().to_string();
    let dir = infertrace_tests::live::temp_dir("python-profile");
    let folded = dir.join("profile.folded");
    let profiled = Command::new(infertrace_tests::infertrace_bin())
        .args([
            "profile",
            "--pid",
            &pid,
            "--duration",
            "3",
            "--profile-output",
        ])
        .arg(&folded)
        .output()
        .expect("infertrace profile");
    let _ = program.child.kill();
    let _ = program.child.wait();
    let report = String::from_utf8_lossy(&profiled.stdout);
    assert!(profiled.status.success(), "{profiled:?}");
    // The worker thread's hottest stack, innermost first, with its share of the samples.
    assert!(
        report.contains("worker_hot (hot_threads.py:18) <- worker_loop (hot_threads.py:25)"),
        "{report}"
    );
    assert!(report.contains("main_hot (hot_threads.py:11)"), "{report}");
    let text = std::fs::read_to_string(&folded).expect("the folded profile");
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("{pid};"))
                && l.contains(";main_hot (hot_threads.py:11) ")),
        "{text}"
    );
}

/// What `infertrace record` keeps of the samples is enough for `replay --profile-output` to
/// write the same profile offline, without the process.
#[test]
fn a_recording_replays_into_the_profile() {
    let mut command = Command::new(pyenv_python("3.11").expect("pyenv's CPython 3.11"));
    command.arg(fixture("python/hot_threads.py"));
    let mut program = Script::spawn(command);
    assert_eq!(program.read_line(), "ready");
    let pid = program.pid().to_string();
    let dir = infertrace_tests::live::temp_dir("python-record");
    let recording = dir.join("run.rec");
    let agent = infertrace_tests::infertrace_bin();
    let recorded = Command::new(agent)
        .args([
            "record",
            "--pid",
            &pid,
            "--duration",
            "3",
            "--output",
            "none",
            "-o",
        ])
        .arg(&recording)
        .output()
        .expect("infertrace record");
    assert!(recorded.status.success(), "{recorded:?}");
    let _ = program.child.kill();
    let _ = program.child.wait();
    let folded = dir.join("run.folded");
    let replayed = Command::new(agent)
        .args(["replay", "--output", "none", "--profile-output"])
        .arg(&folded)
        .arg(&recording)
        .output()
        .expect("infertrace replay");
    assert!(replayed.status.success(), "{replayed:?}");
    let text = std::fs::read_to_string(&folded).expect("the folded profile");
    let main_hot: u64 = text
        .lines()
        .filter(|l| {
            l.starts_with(&format!("{pid};")) && l.contains(";main_hot (hot_threads.py:11) ")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(main_hot > 50, "{text}");
}

/// Garbage frames: the sampler walks a real interpreter with wrong offsets (as a table row for
/// a release that moved its fields would give) and with a wrong runtime address. Its reads
/// then land anywhere: they fail (flagged) or return nonsense, and the walk stays bounded; the
/// records still parse, and naming the nonsense code addresses from the process's memory gives
/// nothing or nonsense, never a fault. The process is untouched (the kernel only reads it).
#[test]
fn garbage_frames_are_sampled_without_errors() {
    use infertrace::capture::{kernel::KernelCapture, records};
    use infertrace_common::{PyProcess, py_flags};

    let mut command = Command::new(pyenv_python("3.11").expect("pyenv's CPython 3.11"));
    command.arg(fixture("python/hot_threads.py"));
    let mut program = Script::spawn(command);
    assert_eq!(program.read_line(), "ready");
    let pid = program.pid();
    let found =
        python::discover(pid, &mut python::BinaryCache::default()).expect("a Python process");
    let mut shifted = found.frames;
    shifted.frame_code += 8;
    shifted.frame_previous += 8;
    let mut kernel = KernelCapture::load(&KernelOptions::default()).expect("load (run as root)");
    kernel.track(pid).expect("track");
    kernel.sample_python(HZ).expect("the sampler");
    let memory = python::Memory::open(pid).expect("the process's memory");
    let with_runtime = |runtime, offsets| PyProcess {
        runtime,
        offsets,
        fsbase_offset: 0,
    };
    // Wrong runtimes first: no thread state is found, so none is cached for the threads yet.
    for (what, process) in [
        (
            "an unmapped runtime",
            with_runtime(0xdead_0000_0000, found.frames),
        ),
        (
            "the runtime's address off by 4 KiB",
            with_runtime(found.runtime + 4096, found.frames),
        ),
        (
            "shifted frame offsets",
            with_runtime(found.runtime, shifted),
        ),
    ] {
        kernel
            .sample_python_process(pid, process)
            .expect("register");
        let until = Instant::now() + Duration::from_secs(1);
        let (mut samples, mut with_stack, mut read_failed, mut named) = (0, 0, 0, 0);
        while Instant::now() < until {
            let mut raw = Vec::new();
            kernel.drain(4096, |bytes| raw.push(bytes.to_vec()));
            for bytes in raw {
                let record = records::parse(&bytes).expect("every record parses");
                let records::Record::PySample(sample) = record else {
                    continue;
                };
                samples += 1;
                read_failed += u32::from(sample.flags & py_flags::READ_FAILED != 0);
                if sample.stack_id == 0 {
                    continue;
                }
                let Some(stack) = kernel.python_stack(sample.stack_id) else {
                    continue;
                };
                with_stack += 1;
                assert!(stack.len as usize <= stack.frames.len(), "{what}: bounded");
                for &code in &stack.frames[..stack.len as usize] {
                    named += u32::from(memory.code_object(code, &found.code).is_some());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        println!(
            "{what}: {samples} samples, {with_stack} with a stack, {read_failed} with a failed \
             read, {named} frames named"
        );
        assert!(samples > 0, "{what}: the sampler kept sampling");
    }
    assert!(
        program.child.try_wait().expect("wait").is_none(),
        "the sampled process still runs"
    );
    let _ = program.child.kill();
    let _ = program.child.wait();
}
