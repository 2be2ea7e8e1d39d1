//! Faults a trial child can be told to inject (hidden `--inject-fault`, tests only): they exercise
//! the parent's handling of hangs, crashes, kills, diverged steps and missing results.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::time::Duration;

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Sleep forever (the parent's timeout must kill it).
    Hang,
    /// Abort with SIGABRT.
    Crash,
    /// Die by SIGKILL (not from the kernel's OOM killer: must count as an error, not an oom).
    Kill,
    /// Report a NaN loss.
    Nan,
    /// Exit 0 without printing a result.
    NoResult,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultAt {
    pub fault: Fault,
    /// The fault fires for trials at this batch size or larger.
    pub min_batch: u64,
}

impl FaultAt {
    /// Parses `hang`, `crash@512`, `nan@1`, `no-result@64`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (name, at) = s.split_once('@').unwrap_or((s, "1"));
        let fault = match name {
            "hang" => Fault::Hang,
            "crash" => Fault::Crash,
            "kill" => Fault::Kill,
            "nan" => Fault::Nan,
            "no-result" => Fault::NoResult,
            _ => {
                return Err(format!(
                    "unknown fault {name:?} (hang, crash, kill, nan, no-result)"
                ))
            }
        };
        let min_batch = at.parse().map_err(|_| format!("bad fault batch {at:?}"))?;
        Ok(FaultAt { fault, min_batch })
    }

    /// Fires the fault if `batch` is at or above its size. Returns only for [`Fault::Nan`] (the
    /// trial then reports a diverged step).
    pub fn fire(self, batch: u64) -> Option<Fault> {
        if batch < self.min_batch {
            return None;
        }
        match self.fault {
            Fault::Hang => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
            Fault::Crash => std::process::abort(),
            Fault::Kill => {
                // SAFETY: raising a signal on ourselves.
                unsafe { libc::raise(libc::SIGKILL) };
                unreachable!("SIGKILL cannot be caught")
            }
            Fault::NoResult => {
                let _ = std::io::stdout().flush();
                // SAFETY: exiting without running destructors is the point of this fault.
                unsafe { libc::_exit(0) }
            }
            Fault::Nan => Some(Fault::Nan),
        }
    }
}
