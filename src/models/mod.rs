//! Models a trial trains, described by a plain, serialisable [`ModelSpec`].
//!
//! The spec is what the plan stores as `model.config`: everything `batchfit-train` needs to rebuild the
//! exact model the probe measured. Its [`fingerprint`](ModelSpec::fingerprint) is a SHA-256 over the
//! canonical JSON of the spec, so a plan made for another model is refused. This file knows nothing of tch;
//! building the networks with tch lives in [`mlp`] and [`crate::step`].

pub mod mlp;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Network architecture and its knobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "kebab-case")]
pub enum Architecture {
    /// Fully connected: `input → hidden[0] → … → classes`, ReLU between layers, cross-entropy loss.
    Mlp {
        input: u64,
        hidden: Vec<u64>,
        classes: u64,
    },
}

/// Optimizer; its state is a large share of memory (Adam: two extra copies of the weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum 0.9: one buffer per weight.
    Momentum,
    /// Adam: two buffers per weight.
    #[default]
    Adam,
    /// AdamW: two buffers per weight.
    Adamw,
}

impl OptimizerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum => "momentum",
            OptimizerKind::Adam => "adam",
            OptimizerKind::Adamw => "adamw",
        }
    }
}

/// Numeric precision of weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    #[default]
    Fp32,
}

impl Precision {
    pub fn dtype(self) -> &'static str {
        match self {
            Precision::Fp32 => "f32",
        }
    }
}

/// Everything that determines a trial's memory: the plan's `model.config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub architecture: Architecture,
    pub optimizer: OptimizerKind,
    pub precision: Precision,
}

impl ModelSpec {
    /// The default model: the 1024 → 2048 → 2048 → 10 MLP with Adam the peer comparisons use.
    pub fn default_mlp() -> Self {
        ModelSpec {
            architecture: Architecture::Mlp {
                input: 1024,
                hidden: vec![2048, 2048],
                classes: 10,
            },
            optimizer: OptimizerKind::Adam,
            precision: Precision::Fp32,
        }
    }

    pub fn name(&self) -> &'static str {
        match self.architecture {
            Architecture::Mlp { .. } => "mlp",
        }
    }

    pub fn parameter_count(&self) -> u64 {
        match &self.architecture {
            Architecture::Mlp {
                input,
                hidden,
                classes,
            } => {
                let mut dims = vec![*input];
                dims.extend(hidden.iter().copied());
                dims.push(*classes);
                dims.windows(2).map(|w| w[0] * w[1] + w[1]).sum()
            }
        }
    }

    /// The input spec in the `dtype[B,dims…]` notation, `B` marking the batch dimension.
    pub fn input_spec(&self) -> String {
        match &self.architecture {
            Architecture::Mlp { input, .. } => format!("{}[B,{input}]", self.precision.dtype()),
        }
    }

    /// Validates knobs (user input) before any backend work.
    pub fn validate(&self) -> Result<(), String> {
        match &self.architecture {
            Architecture::Mlp {
                input,
                hidden,
                classes,
            } => {
                if *input == 0 || *classes == 0 || hidden.contains(&0) {
                    return Err(
                        "MLP sizes must be positive (--mlp-input, --mlp-hidden, --mlp-classes)"
                            .into(),
                    );
                }
                if *classes < 2 {
                    return Err("--mlp-classes must be at least 2 for cross-entropy".into());
                }
                let big = (1u64 << 31) - 1;
                if *input > big || *classes > big || hidden.iter().any(|h| *h > big) {
                    return Err("MLP sizes must be below 2^31".into());
                }
            }
        }
        Ok(())
    }

    /// SHA-256 (hex) of the canonical JSON of this spec. Field order is fixed by the struct
    /// definitions, so the same spec always gives the same hash.
    pub fn fingerprint(&self) -> String {
        let json = serde_json::to_string(self).expect("spec serialises");
        let mut h = Sha256::new();
        h.update(b"batchfit-model-v1\0");
        h.update(json.as_bytes());
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_mlp_counts_and_fingerprint() {
        let m = ModelSpec::default_mlp();
        assert_eq!(
            m.parameter_count(),
            1024 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10
        );
        assert_eq!(m.input_spec(), "f32[B,1024]");
        let f = m.fingerprint();
        assert_eq!(f.len(), 64);
        assert_eq!(f, ModelSpec::default_mlp().fingerprint(), "stable");
        let mut other = m.clone();
        other.optimizer = OptimizerKind::Sgd;
        assert_ne!(f, other.fingerprint());
        let mut other = m.clone();
        other.architecture = Architecture::Mlp {
            input: 1024,
            hidden: vec![2048, 2049],
            classes: 10,
        };
        assert_ne!(f, other.fingerprint());
    }

    #[test]
    fn config_round_trips() {
        let m = ModelSpec::default_mlp();
        let j = serde_json::to_value(&m).unwrap();
        assert_eq!(j["architecture"]["name"], "mlp");
        let back: ModelSpec = serde_json::from_value(j).unwrap();
        assert_eq!(back, m);
    }
}
