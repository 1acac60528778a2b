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
