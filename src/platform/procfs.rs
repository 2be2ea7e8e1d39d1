//! The two `/proc` readings both the trials' process trees and the subreaper need: a process's
//! children (over all its threads) and its `stat` fields.

/// The children of process `pid`, over all its threads (`/proc/PID/task/TID/children`; an orphan
/// handed to a subreaper goes to one of its threads).
pub fn children(pid: u32) -> Vec<u32> {
    let mut v = vec![];
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return v;
    };
    for t in tasks.flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
            v.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    v
}

/// The fields of `/proc/PID/stat` from field 3 (the state) on: the command name before them may
/// hold spaces and parentheses, so they start after its last `)`. `None` when the process is gone.
pub fn stat(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat[stat.rfind(')')? + 2..].to_string())
}

/// A process's start time (field 22 of its `stat`, clock ticks since boot).
pub fn start_time(pid: u32) -> Option<u64> {
    started_at(&stat(pid)?)
}

/// The start time in `stat`'s fields from field 3 on ([`stat`]).
pub fn started_at(fields: &str) -> Option<u64> {
    fields.split_whitespace().nth(19)?.parse().ok()
}
