//! `batchfit predict`'s arguments, validated before the plan's capacity model is asked: the memory
//! sizes, the reserve and the margin as numbers.

use super::ConfigError;
use crate::cli::PredictArgs;
use crate::platform::units::parse_size;

/// What `batchfit predict` asks of a plan's capacity model.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictConfig {
    /// Each `--memory` size as given and in bytes.
    pub memory: Vec<(String, u64)>,
    /// `--reserve` in bytes (else the plan's).
    pub reserve: Option<u64>,
    /// `--margin` (else the plan's).
    pub margin: Option<f64>,
}

/// `batchfit predict`'s sizes and fractions, each refused with what to give instead.
pub fn validate_predict(a: &PredictArgs) -> Result<PredictConfig, ConfigError> {
    if let Some(m) = a
        .margin
        .filter(|m| !m.is_finite() || !(0.0..=0.9).contains(m))
    {
        return Err(ConfigError(format!(
            "--margin {m} is outside [0, 0.9]; it is a fraction, e.g. 0.05 for 5%"
        )));
    }
    let reserve = match &a.reserve {
        Some(r) => Some(parse_size(r).map_err(|e| ConfigError(format!("--reserve {r:?}: {e}")))?),
        None => None,
    };
    let mut memory = vec![];
    for m in &a.memory {
        let b = parse_size(m).map_err(|e| ConfigError(format!("--memory {m:?}: {e}")))?;
        if b == 0 {
            return Err(ConfigError(format!(
                "--memory {m:?}: must be greater than 0"
            )));
        }
        memory.push((m.clone(), b));
    }
    Ok(PredictConfig {
        memory,
        reserve,
        margin: a.margin,
    })
}
