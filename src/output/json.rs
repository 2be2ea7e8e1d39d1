//! `--format json`: the plan itself, as written to `--out`.

use super::{Exporter, OutputError};
use crate::plan::Plan;
use std::path::Path;

pub struct Json;

impl Exporter for Json {
    fn render(&self, plan: &Plan, _: Option<&Path>) -> Result<String, OutputError> {
        Ok(format!("{}\n", plan.to_json()))
    }
}
