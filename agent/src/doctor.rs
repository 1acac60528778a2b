//! `infertrace doctor`: what works on this host, in plain words, and what to do when not.
//!
//! Each check is one function that never panics; `render` prints one line per check and says
//! whether `infertrace attach` can work (it can unless a check failed).
use std::{io, path::Path};

use serde::Serialize;

use crate::discover::{
    btf::KERNEL_BTF,
    system::{self, TRACEFS},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// Works, but a later feature will be missing, or worth knowing.
    Warn,
    /// `infertrace attach` cannot work until this is fixed.
    Fail,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
    }
}

/// All checks, in order. tracefs comes before tracepoints because it may mount tracefs.
pub fn run() -> Vec<Check> {
    vec![
        privileges(),
        kernel(),
        tracefs(),
        tracepoints(),
        uprobes(),
        gpus(),
        kprobes(),
        ring_buffer(),
        perf_event(),
        memlock(),
    ]
}

pub fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let tag = match c.status {
            Status::Ok => "[ ok ]",
            Status::Warn => "[warn]",
            Status::Fail => "[FAIL]",
        };
        out.push_str(&format!("{tag} {}: {}\n", c.name, c.detail));
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| c.name)
        .collect();
    let warned = checks.iter().filter(|c| c.status == Status::Warn).count();
    if !failed.is_empty() {
        out.push_str(&format!(
            "`infertrace attach` cannot work here: fix the failed checks ({}).\n",
            failed.join(", ")
        ));
    } else if warned > 0 {
        out.push_str(&format!(
            "`infertrace attach` can work here ({warned} warning{}: see above).\n",
            if warned == 1 { "" } else { "s" }
        ));
    } else {
        out.push_str("`infertrace attach` can work here.\n");
    }
    out
}

fn privileges() -> Check {
    let caps = match system::effective_capabilities() {
        Ok(caps) => caps,
        Err(e) => return check("privileges", Status::Fail, format!("cannot tell: {e:#}")),
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let who = if uid == 0 {
        "root".to_string()
    } else {
        format!("uid {uid}")
    };
    let held = format!("{who} ({})", caps.describe());
    if !caps.can_trace() {
        check(
            "privileges",
            Status::Fail,
            format!("{held}: needs root or CAP_BPF+CAP_PERFMON; run with sudo"),
        )
    } else if !caps.can_inspect_processes() {
        check(
            "privileges",
            Status::Warn,
            format!(
                "{held}: can trace, but cannot read other users' /proc/PID/fd and maps; \
                 add CAP_SYS_PTRACE or run as root"
            ),
        )
    } else {
        check("privileges", Status::Ok, held)
    }
}

fn kernel() -> Check {
    let release = system::kernel_release();
    if Path::new(KERNEL_BTF).exists() {
        check(
            "kernel",
            Status::Ok,
            format!("{release}, BTF at {KERNEL_BTF}"),
        )
    } else {
        check(
            "kernel",
            Status::Fail,
            format!(
                "{release}, no {KERNEL_BTF}: the capture reads each syscall's arguments \
                 through the kernel's BTF; it needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
            ),
        )
    }
}

/// Whether tracefs is mounted; an error when this user may not look (it is root-only).
fn tracefs_events() -> io::Result<bool> {
    Path::new(TRACEFS).join("events").try_exists()
}

fn tracefs() -> Check {
    match tracefs_events() {
        Ok(true) => return check("tracefs", Status::Ok, format!("mounted at {TRACEFS}")),
        Ok(false) => {}
        Err(e) => {
            let detail = format!("cannot read {TRACEFS} ({e}); run as root");
            return check("tracefs", Status::Fail, detail);
        }
    }
    match system::ensure_tracefs() {
        Ok(()) => check(
            "tracefs",
            Status::Ok,
            format!("was not mounted; mounted it at {TRACEFS}"),
        ),
        Err(e) => check("tracefs", Status::Fail, format!("{e:#}")),
    }
}

/// The tracepoints the kernel side attaches to.
fn required_tracepoints() -> Vec<String> {
    crate::capture::kernel::TRACEPOINTS
        .iter()
        .map(|(category, name)| format!("{category}/{name}"))
        .collect()
}

fn tracepoints() -> Check {
    if !matches!(tracefs_events(), Ok(true)) {
        return check(
            "tracepoints",
            Status::Fail,
            "cannot look: tracefs is not usable (above)",
        );
    }
    let wanted = required_tracepoints();
    let mut missing = Vec::new();
    for name in &wanted {
        match Path::new(TRACEFS)
            .join("events")
            .join(name)
            .join("id")
            .try_exists()
        {
            Ok(true) => {}
            Ok(false) => missing.push(name.as_str()),
            Err(e) => {
                return check(
                    "tracepoints",
                    Status::Fail,
                    format!("cannot read {TRACEFS}/events ({e}); run as root"),
                );
            }
        }
    }
    if missing.is_empty() {
        return check(
            "tracepoints",
            Status::Ok,
            format!(
                "all {} present (process fork/exec/exit, socket syscalls, epoll waits)",
                wanted.len()
            ),
        );
    }
    let hint = if missing.iter().any(|m| m.starts_with("syscalls/")) {
        "syscall tracepoints need a kernel built with CONFIG_FTRACE_SYSCALLS=y"
    } else {
        "the kernel lacks scheduler tracepoints"
    };
    check(
        "tracepoints",
        Status::Fail,
        format!("missing {}; {hint}", missing.join(", ")),
    )
}

/// The type number of a perf event source (PMU), if the kernel has it.
fn pmu_type(name: &str) -> Option<u32> {
    let path = format!("/sys/bus/event_source/devices/{name}/type");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn uprobes() -> Check {
    match pmu_type("uprobe") {
        Some(t) => check(
            "uprobes",
            Status::Ok,
            format!("perf uprobe events available (type {t})"),
        ),
        None => check(
            "uprobes",
            Status::Warn,
            "no uprobe perf events (kernel built without CONFIG_UPROBE_EVENTS): socket capture \
             works, CUDA and library probes will not",
        ),
    }
}

fn gpus() -> Check {
    match crate::discover::gpu::describe() {
        Ok(line) => check("GPUs", Status::Ok, line),
        Err(why) => check(
            "GPUs",
            Status::Warn,
            format!(
                "{why}: no GPU metadata; CUDA launch probes still work where libcuda is loaded"
            ),
        ),
    }
}

fn kprobes() -> Check {
    match pmu_type("kprobe") {
        Some(_) => check(
            "kprobes/fentry",
            Status::Ok,
            "kprobes available; infertrace does not need them",
        ),
        None => check(
            "kprobes/fentry",
            Status::Warn,
            "no kprobes (CONFIG_KPROBES off); infertrace does not need kprobes or fentry, \
             this is for information only",
        ),
    }
}

/// The first fields of `union bpf_attr` for BPF_MAP_CREATE, the rest zeroed.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    rest: [u32; 16],
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_TYPE_RINGBUF: u32 = 27;

fn ring_buffer() -> Check {
    let attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_RINGBUF,
        key_size: 0,
        value_size: 0,
        max_entries: 4096,
        rest: [0; 16],
    };
    // SAFETY: attr is a valid, fully initialised bpf_attr prefix of the size we pass; the
    // kernel treats the missing tail as zero.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            &attr as *const MapCreateAttr,
            size_of::<MapCreateAttr>() as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: fd is a descriptor we own.
        unsafe { libc::close(fd as libc::c_int) };
        return check(
            "bpf ring buffer",
            Status::Ok,
            "bpf() works and ring buffers can be created",
        );
    }
    let err = io::Error::last_os_error();
    let why = match err.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "not permitted: needs root or CAP_BPF (a container also needs them granted)".into()
        }
        Some(libc::ENOSYS) => "the kernel has no bpf() syscall (CONFIG_BPF_SYSCALL off)".into(),
        Some(libc::EINVAL) => "ring buffers are not supported: needs Linux 5.8 or newer".into(),
        _ => format!("creating a ring buffer failed: {err}"),
    };
    check("bpf ring buffer", Status::Fail, why)
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// `struct perf_event_attr` (PERF_ATTR_SIZE_VER8 = 136 bytes covers every field up to
/// sig_data; we pass 128 and zero the rest).
#[repr(C)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    rest: [u64; 13],
}

fn perf_event() -> Check {
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| format!("perf_event_paranoid={}", s.trim()))
        .unwrap_or_else(|_| "perf_event_paranoid unreadable".into());
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        sample_period: 10_000_000,
        rest: [0; 13],
    };
    // SAFETY: attr is a valid perf_event_attr of the size it declares; pid 0 (this process),
    // cpu -1 (any), no group.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            0 as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: fd is a descriptor we own.
        unsafe { libc::close(fd as libc::c_int) };
        return check(
            "perf_event",
            Status::Ok,
            format!("{paranoid}; a cpu-clock event opens"),
        );
    }
    let err = io::Error::last_os_error();
    let why = match err.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "not permitted: needs root or CAP_PERFMON (or a lower perf_event_paranoid)".to_string()
        }
        Some(libc::ENOSYS) => "the kernel has no perf_event_open (CONFIG_PERF_EVENTS off)".into(),
        _ => format!("opening a cpu-clock event failed: {err}"),
    };
    check(
        "perf_event",
        Status::Fail,
        format!("{paranoid}; {why}; tracepoints and uprobes attach through perf events"),
    )
}

fn memlock() -> Check {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: limit is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return check(
            "memlock",
            Status::Ok,
            "RLIMIT_MEMLOCK unreadable (not needed on Linux >= 5.11)",
        );
    }
    let shown = if limit.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        format!("{} KiB", limit.rlim_cur / 1024)
    };
    if kernel_at_least(&system::kernel_release(), 5, 11) {
        check(
            "memlock",
            Status::Ok,
            format!(
                "RLIMIT_MEMLOCK {shown}; not used (Linux >= 5.11 charges BPF memory to cgroups)"
            ),
        )
    } else {
        check(
            "memlock",
            Status::Warn,
            format!(
                "RLIMIT_MEMLOCK {shown}; kernels before 5.11 charge BPF maps to it: if loading fails, run `ulimit -l unlimited` first"
            ),
        )
    }
}

/// "6.18.0-foo" >= major.minor.
fn kernel_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_one_line_per_check_and_a_verdict() {
        let checks = [
            check("privileges", Status::Ok, "root (CAP_SYS_ADMIN)"),
            check("kprobes/fentry", Status::Warn, "no kprobes"),
        ];
        assert_eq!(
            render(&checks),
            "[ ok ] privileges: root (CAP_SYS_ADMIN)\n[warn] kprobes/fentry: no kprobes\n\
             `infertrace attach` can work here (1 warning: see above).\n"
        );
        let failing = [
            check("tracefs", Status::Fail, "cannot mount"),
            check("a", Status::Ok, "b"),
        ];
        let text = render(&failing);
        assert!(
            text.starts_with("[FAIL] tracefs: cannot mount\n[ ok ] a: b\n"),
            "{text}"
        );
        assert!(
            text.ends_with("cannot work here: fix the failed checks (tracefs).\n"),
            "{text}"
        );
        assert_eq!(render(&[]), "`infertrace attach` can work here.\n");
    }

    #[test]
    fn kernel_versions() {
        assert!(kernel_at_least("6.18.0-rc1", 5, 11));
        assert!(kernel_at_least("5.11.0", 5, 11));
        assert!(!kernel_at_least("5.10.200-generic", 5, 11));
        assert!(!kernel_at_least("", 5, 11));
        let tracepoints = required_tracepoints();
        assert!(tracepoints.contains(&"sched/sched_process_fork".to_string()));
        assert!(tracepoints.contains(&"syscalls/sys_exit_sendmsg".to_string()));
    }

    #[test]
    fn all_checks_run() {
        let checks = run();
        let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "privileges",
                "kernel",
                "tracefs",
                "tracepoints",
                "uprobes",
                "GPUs",
                "kprobes/fentry",
                "bpf ring buffer",
                "perf_event",
                "memlock"
            ]
        );
        assert!(checks.iter().all(|c| !c.detail.is_empty()));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let status = |name| checks.iter().find(|c| c.name == name).unwrap().status;
            assert_eq!(status("privileges"), Status::Ok, "{}", render(&checks));
            assert_eq!(status("bpf ring buffer"), Status::Ok, "{}", render(&checks));
        }
    }
}
