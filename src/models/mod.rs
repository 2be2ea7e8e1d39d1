//! Models a trial trains, described by a plain, serialisable [`ModelSpec`].
//!
//! The spec is what the plan stores as `model.config`: everything `batchfit-train` needs to rebuild the
//! exact model the probe measured. Its [`fingerprint`](ModelSpec::fingerprint) is a SHA-256 over the
//! canonical JSON of the spec, so a plan made for another model is refused. This file knows nothing of tch;
//! building the networks with tch lives in [`mlp`] and [`crate::step`].

pub mod gpt;
pub mod mlp;
pub mod resnet;

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
    /// Decoder-only transformer (GPT-2 layout): token + position embeddings, `layers` pre-LayerNorm
    /// blocks of causal multi-head self-attention and a GELU MLP (×4), final LayerNorm, an LM head tied
    /// to the token embedding; cross-entropy over the next token at every position.
    Gpt {
        layers: u64,
        d_model: u64,
        heads: u64,
        seq_len: u64,
        vocab: u64,
    },
    /// ResNet-18 (basic blocks 2-2-2-2), BatchNorm in train mode, on `image_size`² RGB images.
    Resnet18 { image_size: u64, classes: u64 },
    /// ResNet-50 (bottleneck blocks 3-4-6-3, stride on the 3×3 conv as torchvision), BatchNorm in train
    /// mode, on `image_size`² RGB images.
    Resnet50 { image_size: u64, classes: u64 },
}

/// Every model name `--model` accepts, in `batchfit models` order.
pub const ZOO: &[&str] = &[
    "mlp",
    "gpt",
    "gpt2-small",
    "gpt2-medium",
    "resnet18",
    "resnet50",
];

/// Default input side of the ResNets (ImageNet).
pub const DEFAULT_IMAGE_SIZE: u64 = 224;
/// Classes of the ResNets' classifier (ImageNet).
pub const RESNET_CLASSES: u64 = 1000;

impl Architecture {
    /// The architecture a zoo name stands for, with its default knobs (`None` for an unknown name).
    pub fn preset(name: &str) -> Option<Architecture> {
        let gpt = |layers, d_model, heads, seq_len, vocab| Architecture::Gpt {
            layers,
            d_model,
            heads,
            seq_len,
            vocab,
        };
        Some(match name {
            "mlp" => ModelSpec::default_mlp().architecture,
            // A small GPT that probes in seconds on a CPU; every knob can be changed by flags.
            "gpt" => gpt(4, 256, 4, 256, 50257),
            "gpt2-small" => gpt(12, 768, 12, 1024, 50257),
            "gpt2-medium" => gpt(24, 1024, 16, 1024, 50257),
            "resnet18" => Architecture::Resnet18 {
                image_size: DEFAULT_IMAGE_SIZE,
                classes: RESNET_CLASSES,
            },
            "resnet50" => Architecture::Resnet50 {
                image_size: DEFAULT_IMAGE_SIZE,
                classes: RESNET_CLASSES,
            },
            _ => return None,
        })
    }
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

    /// The model's name: `mlp`, `resnet18`, `resnet50`, `gpt2-small` / `gpt2-medium` when the GPT has
    /// exactly those presets' knobs, else `gpt`.
    pub fn name(&self) -> &'static str {
        match self.architecture {
            Architecture::Mlp { .. } => "mlp",
            Architecture::Gpt { .. } => ["gpt2-small", "gpt2-medium"]
                .into_iter()
                .find(|n| Architecture::preset(n).as_ref() == Some(&self.architecture))
                .unwrap_or("gpt"),
            Architecture::Resnet18 { .. } => "resnet18",
            Architecture::Resnet50 { .. } => "resnet50",
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
            Architecture::Gpt {
                layers,
                d_model: d,
                seq_len,
                vocab,
                ..
            } => {
                // wte + wpe (the LM head is tied to wte) + blocks + final LayerNorm. A block: two
                // LayerNorms (4d), qkv (3d² + 3d), attention projection (d² + d), MLP (8d² + 5d).
                vocab * d + seq_len * d + layers * (12 * d * d + 13 * d) + 2 * d
            }
            Architecture::Resnet18 { classes, .. } => resnet::parameter_count(false, *classes),
            Architecture::Resnet50 { classes, .. } => resnet::parameter_count(true, *classes),
        }
    }

    /// The input spec in the `dtype[B,dims…]` notation, `B` marking the batch dimension.
    pub fn input_spec(&self) -> String {
        match &self.architecture {
            Architecture::Mlp { input, .. } => format!("{}[B,{input}]", self.precision.dtype()),
            Architecture::Gpt { seq_len, .. } => format!("i64[B,{seq_len}]"),
            Architecture::Resnet18 { image_size, .. }
            | Architecture::Resnet50 { image_size, .. } => {
                format!("{}[B,3,{image_size},{image_size}]", self.precision.dtype())
            }
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
            Architecture::Gpt {
                layers,
                d_model,
                heads,
                seq_len,
                vocab,
            } => {
                let all = [*layers, *d_model, *heads, *seq_len, *vocab];
                if all.contains(&0) {
                    return Err(
                        "GPT sizes must be positive (--layers, --d-model, --heads, --seq-len, --vocab)"
                            .into(),
                    );
                }
                if all.iter().any(|v| *v >= 1 << 31) {
                    return Err("GPT sizes must be below 2^31".into());
                }
                if d_model % heads != 0 {
                    return Err(format!(
                        "--d-model {d_model} must be a multiple of --heads {heads}"
                    ));
                }
                if *vocab < 2 {
                    return Err("--vocab must be at least 2 for cross-entropy".into());
                }
            }
            Architecture::Resnet18 {
                image_size,
                classes,
            }
            | Architecture::Resnet50 {
                image_size,
                classes,
            } => {
                if *classes < 2 || *classes >= 1 << 31 {
                    return Err("ResNet classes must be between 2 and 2^31".into());
                }
                if *image_size >= 1 << 20 {
                    return Err(format!("--image-size {image_size} is too large"));
                }
                let min = resnet::min_image_size();
                if *image_size < min {
                    return Err(format!(
                        "--image-size {image_size} is too small: ResNet's last stage would be 1×1, and \
                         BatchNorm in train mode needs more than one value per channel at batch 1 \
                         (use at least {min})"
                    ));
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

    #[test]
    fn zoo_presets() {
        for name in ZOO {
            let spec = ModelSpec {
                architecture: Architecture::preset(name).unwrap(),
                ..ModelSpec::default_mlp()
            };
            assert_eq!(spec.name(), *name);
            spec.validate().unwrap();
            let j = serde_json::to_value(&spec).unwrap();
            let back: ModelSpec = serde_json::from_value(j).unwrap();
            assert_eq!(back, spec);
        }
        assert!(Architecture::preset("vgg").is_none());
        assert_eq!(
            ModelSpec::default_mlp().architecture,
            Architecture::preset("mlp").unwrap()
        );
        let j = serde_json::to_value(Architecture::preset("gpt2-small").unwrap()).unwrap();
        assert_eq!(j["name"], "gpt");
        assert_eq!(j["d_model"], 768);
        let j = serde_json::to_value(Architecture::preset("resnet50").unwrap()).unwrap();
        assert_eq!(j["name"], "resnet50");
        assert_eq!(j["image_size"], 224);
    }

    #[test]
    fn zoo_validation() {
        let gpt = |heads, vocab| ModelSpec {
            architecture: Architecture::Gpt {
                layers: 1,
                d_model: 64,
                heads,
                seq_len: 8,
                vocab,
            },
            ..ModelSpec::default_mlp()
        };
        assert!(gpt(4, 10).validate().is_ok());
        assert!(gpt(3, 10).validate().unwrap_err().contains("multiple"));
        assert!(gpt(0, 10).validate().is_err());
        assert!(gpt(4, 1).validate().is_err());
        let rn = |image_size| ModelSpec {
            architecture: Architecture::Resnet18 {
                image_size,
                classes: RESNET_CLASSES,
            },
            ..ModelSpec::default_mlp()
        };
        assert!(rn(64).validate().is_ok());
        assert!(rn(32).validate().unwrap_err().contains("too small"));
    }
}
