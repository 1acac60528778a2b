//! Facts about this host that decide whether tracing can work: privileges and tracefs.
use std::{fs, path::Path};

use anyhow::{Context as _, bail};

/// Where the kernel's tracing filesystem lives; aya attaches tracepoints through it.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// Capability bits (linux/capability.h).
const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_RESOURCE: u32 = 24;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The capabilities the agent uses beyond loading its programs, and what each is for
/// (deploy/README.md's table; docs/capabilities.md says what breaks without each).
const USED: [(u32, &str, &str); 3] = [
    (
        CAP_SYS_PTRACE,
        "CAP_SYS_PTRACE",
        "reading other users' processes' /proc entries (maps, fds, environment, root): \
         servers of other users are not recognised, their sockets not classified, their \
         libraries not probed",
    ),
    (
        CAP_DAC_READ_SEARCH,
        "CAP_DAC_READ_SEARCH",
        "reading other users' files (libraries to probe, /proc/PID/fd of processes of other \
         users)",
    ),
    (
        CAP_SYS_RESOURCE,
        "CAP_SYS_RESOURCE",
        "raising RLIMIT_MEMLOCK, which kernels before 5.11 charge eBPF maps to",
    ),
];

/// The effective capability set of this process.
#[derive(Clone, Copy, Debug)]
pub struct Capabilities(u64);

impl Capabilities {
    pub fn has(&self, cap: u32) -> bool {
        self.0 & (1u64 << cap) != 0
    }

    /// Enough to load tracing programs and attach tracepoints and uprobes.
    pub fn can_trace(&self) -> bool {
        self.has(CAP_SYS_ADMIN) || (self.has(CAP_BPF) && self.has(CAP_PERFMON))
    }

    /// Enough to read other users' /proc/PID/{fd,maps,environ}.
    pub fn can_inspect_processes(&self) -> bool {
        self.has(CAP_SYS_PTRACE) || self.has(CAP_DAC_OVERRIDE)
    }

    /// What the agent cannot do for lack of a capability it uses (none for root or a full
    /// set): one line per capability missing.
    pub fn missing(&self) -> Vec<String> {
        if self.has(CAP_SYS_ADMIN) && self.has(CAP_DAC_OVERRIDE) {
            return Vec::new();
        }
        // Kernels from 5.11 on charge eBPF memory to the cgroup, not to RLIMIT_MEMLOCK.
        let memlock_charged = kernel_version(&kernel_release()).is_some_and(|v| v < (5, 11));
        USED.iter()
            .filter(|(cap, _, _)| *cap != CAP_SYS_RESOURCE || memlock_charged)
            .filter(|(cap, _, _)| !self.has(*cap))
            .map(|(_, name, why)| format!("{name} is missing; it is needed for {why}"))
            .collect()
    }

    pub fn describe(&self) -> String {
        let names = [
            (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
            (CAP_BPF, "CAP_BPF"),
            (CAP_PERFMON, "CAP_PERFMON"),
            (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
            (CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"),
        ];
        let held: Vec<&str> = names
            .iter()
            .filter(|(c, _)| self.has(*c))
            .map(|(_, n)| *n)
            .collect();
        if held.is_empty() {
            "none of the relevant capabilities".into()
        } else {
            held.join(", ")
        }
    }
}

/// (major, minor) of a kernel release such as `6.18.44-fc-v1098`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Read CapEff from /proc/self/status.
pub fn effective_capabilities() -> anyhow::Result<Capabilities> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    parse_cap_eff(&status).context("no CapEff line in /proc/self/status")
}

fn parse_cap_eff(status: &str) -> Option<Capabilities> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok().map(Capabilities)
}

/// Mount tracefs when it is missing (minimal VMs and some containers do not mount it).
pub fn ensure_tracefs() -> anyhow::Result<()> {
    if tracefs_mounted() {
        return Ok(());
    }
    let target = std::ffi::CString::new(TRACEFS)?;
    let fstype = std::ffi::CString::new("tracefs")?;
    let source = std::ffi::CString::new("nodev")?;
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "tracefs is not mounted at {TRACEFS} and mounting it failed ({}); mount it with \
             `mount -t tracefs nodev {TRACEFS}`",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub fn tracefs_mounted() -> bool {
    Path::new(TRACEFS).join("events").is_dir()
}

/// `uname -r`.
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_unprivileged_cap_sets() {
        let root = parse_cap_eff("Name:\tx\nCapEff:\t000001ffffffffff\n").unwrap();
        assert!(root.can_trace() && root.can_inspect_processes());
        let none = parse_cap_eff("CapEff:\t0000000000000000\n").unwrap();
        assert!(!none.can_trace());
        assert_eq!(none.describe(), "none of the relevant capabilities");
        let bpf_only =
            parse_cap_eff(&format!("CapEff:\t{:016x}\n", (1u64 << 39) | (1u64 << 38))).unwrap();
        assert!(bpf_only.can_trace() && !bpf_only.can_inspect_processes());
        assert!(parse_cap_eff("nothing").is_none());
        assert!(root.missing().is_empty());
        assert_eq!(kernel_version("6.18.44-fc-v1098"), Some((6, 18)));
        assert_eq!(kernel_version("5.4.0"), Some((5, 4)));
        assert_eq!(kernel_version("garbage"), None);
        let missing = bpf_only.missing();
        assert!((2..=3).contains(&missing.len()), "{missing:?}");
        assert!(missing[0].starts_with("CAP_SYS_PTRACE is missing; it is needed for reading"));
    }
}
