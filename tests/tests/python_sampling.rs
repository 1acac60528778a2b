//! Python stack sampling on the real kernel and real interpreters: the CPU-clock sampler and its
//! frame walk (ebpf/src/python.rs), interpreter discovery (agent/src/discover/python.rs) and
//! naming from the process's memory, run against tests/fixtures/python/hot_threads.py (two
//! threads spinning in known functions, a sleeping thread, threads starting and exiting all the
//! time) on pyenv's CPython 3.11 (shared libpython), Debian's python3.11 (static, non-PIE,
//! dynamic symbols only), and pyenv's 3.12 and 3.13 when this machine has them (the output says
//! which ran). Then the process is killed while sampled. Run as root.
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
    // pyenv's 3.11 is the `python3` CI runs with; Debian's is the system's.
    let mut interpreters = vec![
        pyenv_python("3.11").expect("pyenv's CPython 3.11 (the machine's python3)"),
        PathBuf::from("/usr/bin/python3.11"),
    ];
    assert!(interpreters[1].exists(), "Debian's python3.11");
    interpreters.extend(["3.12", "3.13"].into_iter().filter_map(pyenv_python));
    println!("interpreters: {interpreters:?}");
    for python in &interpreters {
        check(python);
    }
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
