//! Small readers of /proc/PID. Each returns None when the process is gone: processes exit at
//! any moment, and that is never an error of the agent.
use std::{
    fs, io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::PathBuf,
};

/// /proc/PID/leaf.
pub fn proc_path(pid: u32, leaf: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{leaf}"))
}

pub fn exists(pid: u32) -> bool {
    proc_path(pid, "").is_dir()
}

/// The process exists and has not exited: a zombie (exited, not yet reaped by its parent)
/// has a /proc entry but no longer runs.
pub fn is_running(pid: u32) -> bool {
    match status_field(pid, "State") {
        Some(state) => !(state.starts_with('Z') || state.starts_with('X')),
        None => false,
    }
}

/// Tells when each of some processes has exited, from pidfds (Linux 5.3+): a pidfd polls
/// readable once its process has exited, so a check is one `poll` where reading a busy
/// engine's /proc/PID/status costs hundreds of microseconds. A process whose pidfd cannot be
/// opened (gone already, or an older kernel) is asked about in /proc.
pub struct ExitWatch {
    processes: Vec<(u32, Option<OwnedFd>)>,
}

impl ExitWatch {
    pub fn new(pids: &[u32]) -> Self {
        let processes = pids
            .iter()
            .map(|&pid| (pid, pidfd_open(pid).ok()))
            .collect();
        Self { processes }
    }

    pub fn all_exited(&self) -> bool {
        self.processes.iter().all(|(pid, pidfd)| match pidfd {
            Some(pidfd) => has_exited(pidfd),
            None => !is_running(*pid),
        })
    }
}

/// A pidfd of process `pid` (Linux 5.3+).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and flags, and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative return is a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn has_exited(pidfd: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, and no wait.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & libc::POLLIN != 0
}

pub fn comm(pid: u32) -> Option<String> {
    fs::read_to_string(proc_path(pid, "comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Command line arguments (NUL-separated in /proc).
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(proc_path(pid, "cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// A field of /proc/PID/status, e.g. "Tgid" or "PPid".
pub fn status_field(pid: u32, field: &str) -> Option<String> {
    let status = fs::read_to_string(proc_path(pid, "status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(field)?
            .strip_prefix(':')
            .map(|v| v.trim().to_string())
    })
}

/// The process a task id belongs to (equal to `tid` for a process's main thread).
pub fn tgid_of(tid: u32) -> Option<u32> {
    status_field(tid, "Tgid")?.parse().ok()
}

pub fn ppid(pid: u32) -> Option<u32> {
    status_field(pid, "PPid")?.parse().ok()
}

/// The size of the process's address space in pages (/proc/PID/statm's first field: read
/// without walking the mappings).
pub fn address_space_size(pid: u32) -> Option<u64> {
    fs::read_to_string(proc_path(pid, "statm"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// When the process started, in clock ticks after boot (/proc/PID/stat's 22nd field): with
/// the pid, what tells a process from a later one that reuses its number.
pub fn start_time(pid: u32) -> Option<u64> {
    start_time_in_stat(&fs::read_to_string(proc_path(pid, "stat")).ok()?)
}

/// The start time in a /proc/PID/stat line. The command name (field 2) is in parentheses and
/// may hold spaces and parentheses itself: fields are counted after its last ')'.
fn start_time_in_stat(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name; field 22 is the 20th.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// All process ids currently in /proc.
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// A process and all its descendants, parent first.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let pids = all_pids();
    let parents: Vec<(u32, Option<u32>)> = pids.iter().map(|&p| (p, ppid(p))).collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == Some(parent))
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_is_seen_before_the_parent_reaps_it() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        let watch = ExitWatch::new(&[child.id()]);
        assert!(!watch.all_exited());
        child.kill().expect("killing the child");
        // Not reaped: a zombie has exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !watch.all_exited() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(watch.all_exited());
        child.wait().expect("reaping the child");
        assert!(watch.all_exited());
        assert!(ExitWatch::new(&[u32::MAX / 2]).all_exited());
    }

    #[test]
    fn the_start_time_is_found_past_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (python3 (x) y) S 1 4242 4242 0 -1 4194560 20810 0 0 0 93 10 0 0 20 0 \
                    5 0 123456 1000000 2000 18446744073709551615";
        assert_eq!(start_time_in_stat(stat), Some(123_456));
        assert_eq!(start_time_in_stat("4242 (python3) S 1"), None);
        assert_eq!(start_time_in_stat("garbage"), None);
        let own = start_time(std::process::id()).expect("our own start time");
        assert!(own > 0);
    }
}
