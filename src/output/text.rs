//! `--format text`: a human summary of a plan (also what `batchfit probe` prints on stderr).

use super::{Exporter, OutputError};
use crate::plan::{Plan, Status};
use crate::platform::units::format_size;
use std::path::Path;

pub struct Text;

impl Exporter for Text {
    fn render(&self, plan: &Plan, _: Option<&Path>) -> Result<String, OutputError> {
        Ok(summary(plan))
    }
}

/// What "peak" measures on the plan's device, by the name `batchfit-train` uses too.
fn measure(plan: &Plan) -> &'static str {
    use crate::plan::DeviceKind;
    match plan.device.kind {
        DeviceKind::Cpu => "data segment",
        DeviceKind::Cuda => "on the card (NVML)",
        DeviceKind::Sim => "(simulated)",
    }
}

/// A human summary of a plan.
pub fn summary(plan: &Plan) -> String {
    use crate::plan::count;
    let mut s = String::new();
    let n = plan.trials.len();
    let secs: f64 = plan.trials.iter().map(|t| t.seconds).sum();
    match &plan.recommendation {
        Some(r) if plan.status == Status::Complete => {
            s += &r.describe();
            if r.accumulation_proven == Some(false) {
                s += &format!(
                    " (accumulation {} NOT PROVEN: nothing shows the command ran it; see the warning)",
                    r.accumulation
                );
            }
            s += "\n";
            s += &format!(
                "largest fitting micro-batch: {}{}; peak {} {} of the {} limit ({:.0}%); {:.0} samples/s\n",
                r.max_fitting_batch,
                r.first_failing_batch
                    .map(|f| format!(" ({f} ran out of memory)"))
                    .unwrap_or_default(),
                measure(plan),
                format_size(r.peak_bytes),
                format_size(plan.limit_bytes),
                100.0 * r.peak_bytes as f64 / plan.limit_bytes.max(1) as f64,
                r.samples_per_second
            );
        }
        _ => {
            s += &format!(
                "no recommendation: {}\n",
                match plan.status {
                    Status::NothingFits => "nothing fits (status nothing-fits)".to_string(),
                    other => format!("the plan is {other}"),
                }
            )
        }
    }
    if plan.status == Status::Complete {
        if let Some(line) = crate::plan::throughput::summary_line(plan) {
            s += &line;
        }
    }
    s += &format!("stopped: {}\n", plan.stop_detail);
    s += &format!("{}, {secs:.1} s of trials\n", count(n, "trial", "trials"));
    for w in &plan.warnings {
        s += &format!("warning: {w}\n");
    }
    s
}
