//! A trial's process tree, followed from `/proc` while it runs: a user's command may start workers
//! (torchrun's ranks, DataLoader workers, a shell's children), and their memory is the trial's memory.
//!
//! Descendants are found through `/proc/PID/task/TID/children` from every process already known, so a
//! grandchild that left the trial's session (`setsid`) is still found while its parent lives, and is
//! remembered (with its start time, so a reused PID is never killed) after its parent exits. Each
//! sample reads every known process's `VmData` and `VmRSS`: the largest data segment (what a
//! per-process `RLIMIT_DATA` acts on) and the summed resident memory (what the machine gives up).

use std::collections::BTreeMap;

/// One process of the tree: its PID and its start time (clock ticks since boot, field 22 of
/// `/proc/PID/stat`), which tells it from a later process with the same PID.
type Known = BTreeMap<u32, u64>;

/// The tree under a root process.
#[derive(Debug)]
pub struct Tree {
    known: Known,
    /// Peaks over all samples.
    pub data_peak: u64,
    pub rss_peak: u64,
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the command name may hold spaces and parentheses: fields start after the last ')'
    let rest = &stat[stat.rfind(')')? + 2..];
    // field 3 (state) is rest's first; starttime is field 22
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with('Z')))
        .unwrap_or(true)
}

fn children(pid: u32) -> Vec<u32> {
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

fn status_kb(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

impl Tree {
    pub fn new(root: u32) -> Tree {
        let mut known = Known::new();
        if let Some(t) = start_time(root) {
            known.insert(root, t);
        }
        Tree {
            known,
            data_peak: 0,
            rss_peak: 0,
        }
    }

    /// The processes of the tree still alive (as the same processes).
    fn alive(&self) -> Vec<u32> {
        self.known
            .iter()
            .filter(|(&pid, &t)| start_time(pid) == Some(t))
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// Finds new descendants and samples every live process's memory.
    pub fn sample(&mut self) {
        let mut frontier = self.alive();
        while let Some(pid) = frontier.pop() {
            for c in children(pid) {
                if let std::collections::btree_map::Entry::Vacant(e) = self.known.entry(c) {
                    if let Some(t) = start_time(c) {
                        e.insert(t);
                        frontier.push(c);
                    }
                }
            }
        }
        let mut rss = 0;
        for pid in self.alive() {
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                self.data_peak = self.data_peak.max(status_kb(&s, "VmData:"));
                rss += status_kb(&s, "VmRSS:");
            }
        }
        self.rss_peak = self.rss_peak.max(rss);
    }

    /// Processes seen so far.
    pub fn seen(&self) -> u32 {
        self.known.len() as u32
    }

    /// The PIDs of the tree's live processes that are not zombies.
    pub fn live_pids(&self) -> Vec<u32> {
        self.alive()
            .into_iter()
            .filter(|&p| !is_zombie(p))
            .collect()
    }

    /// SIGKILL to every live process of the tree (the same processes, never a reused PID).
    pub fn kill_all(&self) {
        for pid in self.alive() {
            // SAFETY: sending a signal to a process we started (checked by its start time).
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_a_tree_and_kills_it() {
        // sh → sleep (a child), and a grandchild in its own session
        let mut c = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & setsid sleep 31 & wait"])
            .spawn()
            .unwrap();
        let mut tree = Tree::new(c.id());
        let t0 = std::time::Instant::now();
        while tree.seen() < 3 && t0.elapsed().as_secs() < 5 {
            tree.sample();
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(tree.seen() >= 3, "saw {}", tree.seen());
        assert!(tree.rss_peak > 0 && tree.data_peak > 0);
        let pids = tree.live_pids();
        tree.kill_all();
        let _ = c.wait();
        std::thread::sleep(std::time::Duration::from_millis(100));
        for p in pids {
            assert!(
                is_zombie(p) || start_time(p).is_none(),
                "process {p} of the tree survived"
            );
        }
    }
}
