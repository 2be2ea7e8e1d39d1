//! `--format deepspeed`: the DeepSpeed config keys batchfit determines, to merge into a
//! `ds_config.json` (DeepSpeed checks `train_batch_size` = micro × accumulation × world size).

use super::{Exporter, OutputError};
use crate::plan::{Plan, Status};
use serde::Serialize;
use std::path::Path;

pub struct DeepSpeed;

impl Exporter for DeepSpeed {
    fn render(&self, plan: &Plan, _: Option<&Path>) -> Result<String, OutputError> {
        deepspeed(plan)
    }
}

/// The DeepSpeed config keys batchfit determines, in DeepSpeed's order.
#[derive(Debug, Serialize)]
struct DeepSpeedFragment {
    train_micro_batch_size_per_gpu: u64,
    gradient_accumulation_steps: u64,
    train_batch_size: u64,
}

/// A DeepSpeed config fragment (pretty JSON). A plan without a recommendation, a merged one not
/// verified, or one whose `batchfit verify` failed, is an error: a job script merging the output into its config must not go on with
/// nothing or with sizes nobody proved on its machine.
pub fn deepspeed(plan: &Plan) -> Result<String, OutputError> {
    let r = match &plan.recommendation {
        Some(r) if plan.status == Status::Complete => r,
        _ => return Err(OutputError::NoRecommendation(plan.status)),
    };
    if plan.failed_verification() {
        return Err(OutputError::FailedVerification(
            plan.verification_failure
                .clone()
                .unwrap_or_else(|| "the plan says verified: false".into()),
        ));
    }
    if !plan.is_verified() {
        return Err(OutputError::Unverified);
    }
    if r.uneven || r.micro_batches.iter().any(|&m| m != r.micro_batch) {
        return Err(OutputError::Uneven(r.micro_batches.clone()));
    }
    let f = DeepSpeedFragment {
        train_micro_batch_size_per_gpu: r.micro_batch,
        gradient_accumulation_steps: r.accumulation,
        train_batch_size: r.global_batch,
    };
    Ok(format!(
        "{}\n",
        serde_json::to_string_pretty(&f).expect("fragment serialises")
    ))
}
