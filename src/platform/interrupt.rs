//! SIGINT / SIGTERM / SIGHUP handling (SIGHUP, a closed terminal or ssh session, as SIGTERM).
//!
//! Handlers are installed explicitly, so they work even when the process started with the signals
//! ignored (as background jobs of shell scripts do). The handler only records the signal; the search
//! loop and the trial runner poll [`pending`], kill the running trial's process group, write the partial
//! plan and exit with 128 + signal.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

static SIGNAL: std::sync::OnceLock<Arc<AtomicUsize>> = std::sync::OnceLock::new();

/// Installs the handlers (idempotent).
pub fn install() -> std::io::Result<()> {
    if SIGNAL.get().is_some() {
        return Ok(());
    }
    let flag = Arc::new(AtomicUsize::new(0));
    // SIGHUP's default action would end batchfit at once, leaving the trial's processes, its cgroup
    // and its report directory behind
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register_usize(sig, Arc::clone(&flag), sig as usize)?;
    }
    let _ = SIGNAL.set(flag);
    Ok(())
}

/// The signal that arrived, if any.
pub fn pending() -> Option<i32> {
    SIGNAL
        .get()
        .map(|f| f.load(Ordering::SeqCst))
        .filter(|&s| s != 0)
        .map(|s| s as i32)
}
