//! `--format env`: `export BATCHFIT_*=...` lines for `eval` in a job script.

use super::{Exporter, OutputError};
use crate::plan::{Plan, Status};
use std::path::Path;

pub struct Env;

impl Exporter for Env {
    fn render(&self, plan: &Plan, plan_path: Option<&Path>) -> Result<String, OutputError> {
        Ok(env(plan, plan_path))
    }
}

/// `s` quoted for a POSIX shell: unchanged when it has only safe characters, else in single quotes
/// (a `'` inside becomes `'\''`).
pub fn shell_quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./:@%+,=".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `BATCHFIT_STATUS` of a complete plan whose `batchfit verify` failed.
pub const FAILED_VERIFICATION: &str = "failed-verification";

/// `BATCHFIT_STATUS` of a merged plan not yet verified here: its split was never run with its
/// accumulation (`batchfit verify` runs it), so it exports no size to train with.
pub const UNVERIFIED: &str = "unverified";

/// `export BATCHFIT_*=...` lines for `eval`. Without a recommendation only `BATCHFIT_STATUS`.
/// `BATCHFIT_PROVEN_STEPS` is the optimizer steps the recommended micro-batch(es) were confirmed
/// with ([`Plan::proven_steps`]; absent when no trial confirmed them, as in a merged plan before
/// `batchfit verify`).
/// A plan whose `batchfit verify` failed exports only `BATCHFIT_STATUS=failed-verification` and
/// `BATCHFIT_VERIFIED=0`: its sizes did not hold here, so a job script that checks only the status
/// (`= complete`) refuses it, and one that does not finds no size to train with. A merged plan not
/// yet verified exports only `BATCHFIT_STATUS=unverified` and `BATCHFIT_VERIFIED=0`, for the same
/// reason: its split never ran with its accumulation.
/// `BATCHFIT_UNEVEN` is `1` when the micro-batches of a step differ in size (`--allow-uneven`);
/// then `BATCHFIT_MICRO_BATCHES` lists them, space-separated, and `BATCHFIT_MICRO_BATCH` is the
/// largest.
pub fn env(plan: &Plan, plan_path: Option<&Path>) -> String {
    let mut vars: Vec<(&str, String)> = vec![];
    match &plan.recommendation {
        Some(_) if plan.status == Status::Complete && plan.failed_verification() => {
            vars.push(("BATCHFIT_STATUS", FAILED_VERIFICATION.into()));
            vars.push(("BATCHFIT_VERIFIED", "0".into()));
        }
        Some(_) if plan.status == Status::Complete && !plan.is_verified() => {
            vars.push(("BATCHFIT_STATUS", UNVERIFIED.into()));
            vars.push(("BATCHFIT_VERIFIED", "0".into()));
        }
        Some(r) if plan.status == Status::Complete => {
            vars.push(("BATCHFIT_MICRO_BATCH", r.micro_batch.to_string()));
            vars.push(("BATCHFIT_ACCUMULATION", r.accumulation.to_string()));
            vars.push(("BATCHFIT_GLOBAL_BATCH", r.global_batch.to_string()));
            vars.push(("BATCHFIT_WORLD_SIZE", r.world_size.to_string()));
            vars.push((
                "BATCHFIT_MAX_FITTING_BATCH",
                r.max_fitting_batch.to_string(),
            ));
            // what the fit was proven with: a job that runs longer may meet memory it did not
            if let Some(n) = plan.proven_steps() {
                vars.push(("BATCHFIT_PROVEN_STEPS", n.to_string()));
            }
            // micro-batches of unequal size (--allow-uneven): say so, and list them for a loop
            // (`for m in $BATCHFIT_MICRO_BATCHES`)
            let uneven = r.uneven || r.micro_batches.iter().any(|&m| m != r.micro_batch);
            vars.push(("BATCHFIT_UNEVEN", if uneven { "1" } else { "0" }.into()));
            if uneven {
                vars.push((
                    "BATCHFIT_MICRO_BATCHES",
                    r.micro_batches
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(" "),
                ));
            }
            // a command's accumulation nothing showed it ran: the job script can refuse it
            if let Some(proven) = r.accumulation_proven {
                vars.push((
                    "BATCHFIT_ACCUMULATION_PROVEN",
                    if proven { "1" } else { "0" }.into(),
                ));
            }
            if let Some(f) = r.fastest_micro_batch {
                vars.push(("BATCHFIT_FASTEST_MICRO_BATCH", f.to_string()));
            }
            vars.push(("BATCHFIT_STATUS", plan.status.as_str().into()));
            // 0 for a merged plan not yet confirmed here (`batchfit verify`) or one whose
            // verification failed: batchfit-train refuses it; a probe plan is proven where it ran
            vars.push((
                "BATCHFIT_VERIFIED",
                if plan.is_verified() { "1" } else { "0" }.into(),
            ));
            if let Some(p) = plan_path {
                let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
                vars.push(("BATCHFIT_PLAN", p.to_string_lossy().into_owned()));
            }
        }
        _ => vars.push(("BATCHFIT_STATUS", plan.status.as_str().into())),
    }
    vars.iter()
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("4096"), "4096");
        assert_eq!(shell_quote("/tmp/a-b/plan.json"), "/tmp/a-b/plan.json");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's $HOME"), r"'it'\''s $HOME'");
    }
}
