//! The operating-system layer: what every other module may use and which uses nothing of batchfit.
//!
//! * [`units`]: byte sizes as users write them (`1.5GiB`) and as batchfit prints them;
//! * [`sysmem`]: `/proc` and cgroup memory facts, `RLIMIT_DATA`, the malloc set-up of trials;
//! * [`interrupt`]: SIGINT/SIGTERM recorded for the search loop and the trial runner;
//! * [`fdpass`]: messages with open file descriptors (a fork server's trial output);
//! * [`files`]: the one writer of result files (atomic, regular files only, modes kept);
//! * [`lock`]: one writer per `--logs` directory and `--out` plan (a lock file held until exit);
//! * [`scratch`]: temporary directories that a killed process's successor removes;
//! * [`reaper`]: batchfit as its trials' subreaper, so that an orphaned daemon is still found;
//! * [`procfs`]: a process's children and `stat` fields;
//! * [`shm`]: the shared memory a trial's killed processes left in `/dev/shm`.

pub mod fdpass;
pub mod files;
pub mod interrupt;
pub mod lock;
pub mod procfs;
pub mod reaper;
pub mod scratch;
pub mod shm;
pub mod sysmem;
pub mod units;

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
