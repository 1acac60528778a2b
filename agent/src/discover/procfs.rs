//! Small readers of /proc/PID. Each returns None when the process is gone: processes exit at
//! any moment, and that is never an error of the agent.
use std::{fs, path::PathBuf};

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
