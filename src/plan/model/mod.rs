//! The model a tch trial trains, described by a plain, serialisable [`ModelSpec`].
//!
//! The spec is what the plan stores as `model.config`: everything `batchfit-train` needs to rebuild the
//! exact model the probe measured. Its [`fingerprint`](ModelSpec::fingerprint) is a SHA-256 over the
//! canonical JSON of the spec, so a plan made for another model is refused. This file knows nothing of tch;
//! building the networks with tch lives in [`crate::workload::model`].

pub mod resnet;

pub use super::input::{InputSpec, LossSpec};

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
    /// Vision Transformer (ViT-B/16 layout): `patch`² patches of `image_size`² RGB images embedded by a
    /// strided convolution, a class token and learned position embeddings, `layers` pre-LayerNorm
    /// blocks (bidirectional attention, GELU MLP ×4), a final LayerNorm and a linear head on the class
    /// token; cross-entropy over `classes`.
    Vit {
        layers: u64,
        d_model: u64,
        heads: u64,
        patch: u64,
        image_size: u64,
        classes: u64,
    },
    /// A TorchScript module exported from PyTorch (`scripts/export_torchscript.py`), trained through
    /// libtorch's trainable module. `file` is where it was found (not part of the fingerprint, so a
    /// moved file still matches); `sha256` is its content, which is.
    Torchscript {
        file: String,
        sha256: String,
        /// Trainable parameters (counted when the file was loaded at validation).
        parameters: u64,
        inputs: Vec<InputSpec>,
        loss: LossSpec,
    },
}

/// Every model name `--model` accepts, in `batchfit models` order.
pub const ZOO: &[&str] = &[
    "mlp",
    "gpt",
    "gpt2-small",
    "gpt2-medium",
    "resnet18",
    "resnet50",
    "vit-b16",
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
            "vit-b16" => Architecture::Vit {
                layers: 12,
                d_model: 768,
                heads: 12,
                patch: 16,
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
    /// Weights, activations and optimizer state in f32.
    #[default]
    Fp32,
    /// Weights, activations, gradients and optimizer state in bf16 (the loss in f32).
    Bf16,
    /// Autocast to bf16 with f32 master weights (CUDA only).
    AmpBf16,
    /// Autocast to f16 with f32 master weights and a dynamic loss scale (CUDA only).
    AmpFp16,
}

impl Precision {
    pub const ALL: [Precision; 4] = [
        Precision::Fp32,
        Precision::Bf16,
        Precision::AmpBf16,
        Precision::AmpFp16,
    ];

    /// The dtype of the weights and of float inputs.
    pub fn dtype(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            _ => "f32",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::AmpBf16 => "amp-bf16",
            Precision::AmpFp16 => "amp-fp16",
        }
    }

    /// Autocast (mixed precision): libtorch implements it for CUDA here.
    pub fn is_amp(self) -> bool {
        matches!(self, Precision::AmpBf16 | Precision::AmpFp16)
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
    /// exactly those presets' knobs, else `gpt`; `vit-b16` likewise, else `vit`; a TorchScript model's
    /// file name.
    pub fn name(&self) -> String {
        let preset_or = |presets: &[&str], family: &str| -> String {
            presets
                .iter()
                .find(|n| Architecture::preset(n).as_ref() == Some(&self.architecture))
                .unwrap_or(&family)
                .to_string()
        };
        match &self.architecture {
            Architecture::Mlp { .. } => "mlp".into(),
            Architecture::Gpt { .. } => preset_or(&["gpt2-small", "gpt2-medium"], "gpt"),
            Architecture::Resnet18 { .. } => "resnet18".into(),
            Architecture::Resnet50 { .. } => "resnet50".into(),
            Architecture::Vit { .. } => preset_or(&["vit-b16"], "vit"),
            Architecture::Torchscript { file, .. } => std::path::Path::new(file)
                .file_name()
                .map_or_else(|| file.clone(), |f| f.to_string_lossy().into_owned()),
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
            Architecture::Vit {
                layers,
                d_model: d,
                patch,
                image_size,
                classes,
                ..
            } => {
                let tokens = (image_size / patch).pow(2) + 1;
                // patch conv (3·p²·d + d), class token, position embeddings, blocks (as GPT's),
                // final LayerNorm, head
                3 * patch * patch * d
                    + d
                    + d
                    + tokens * d
                    + layers * (12 * d * d + 13 * d)
                    + 2 * d
                    + d * classes
                    + classes
            }
            Architecture::Torchscript { parameters, .. } => *parameters,
        }
    }

    /// The input spec in the `dtype[B,dims…]` notation, `B` marking the batch dimension (several
    /// inputs separated by spaces).
    pub fn input_spec(&self) -> String {
        match &self.architecture {
            Architecture::Mlp { input, .. } => format!("{}[B,{input}]", self.precision.dtype()),
            Architecture::Gpt { seq_len, vocab, .. } => format!("i64[B,{seq_len}]<{vocab}"),
            Architecture::Resnet18 { image_size, .. }
            | Architecture::Resnet50 { image_size, .. }
            | Architecture::Vit { image_size, .. } => {
                format!("{}[B,3,{image_size},{image_size}]", self.precision.dtype())
            }
            Architecture::Torchscript { inputs, .. } => inputs
                .iter()
                .map(InputSpec::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// Validates knobs (user input) before any backend work.
    pub fn validate(&self) -> Result<(), String> {
        match &self.architecture {
            Architecture::Mlp {
                input,
                hidden,
                classes,
            } => validate_mlp(*input, hidden, *classes),
            Architecture::Gpt {
                layers,
                d_model,
                heads,
                seq_len,
                vocab,
            } => validate_gpt([*layers, *d_model, *heads, *seq_len, *vocab]),
            Architecture::Resnet18 {
                image_size,
                classes,
            }
            | Architecture::Resnet50 {
                image_size,
                classes,
            } => validate_resnet(*image_size, *classes),
            Architecture::Vit {
                layers,
                d_model,
                heads,
                patch,
                image_size,
                classes,
            } => validate_vit([*layers, *d_model, *heads, *patch, *image_size, *classes]),
            Architecture::Torchscript { inputs, sha256, .. } => {
                validate_torchscript(inputs, sha256)
            }
        }
    }

    /// SHA-256 (hex) of the canonical JSON of this spec. Field order is fixed by the struct
    /// definitions, so the same spec always gives the same hash.
    ///
    /// A TorchScript model's `file` (where it lies) is left out: its content hash is in.
    pub fn fingerprint(&self) -> String {
        let mut spec = self.clone();
        if let Architecture::Torchscript { file, .. } = &mut spec.architecture {
            file.clear();
        }
        let json = serde_json::to_string(&spec).expect("spec serialises");
        let mut h = Sha256::new();
        h.update(b"batchfit-model-v1\0");
        h.update(json.as_bytes());
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn validate_mlp(input: u64, hidden: &[u64], classes: u64) -> Result<(), String> {
    if input == 0 || classes == 0 || hidden.contains(&0) {
        return Err("MLP sizes must be positive (--mlp-input, --mlp-hidden, --mlp-classes)".into());
    }
    if classes < 2 {
        return Err("--mlp-classes must be at least 2 for cross-entropy".into());
    }
    let big = (1u64 << 31) - 1;
    if input > big || classes > big || hidden.iter().any(|h| *h > big) {
        return Err("MLP sizes must be below 2^31".into());
    }
    Ok(())
}

/// `sizes`: layers, d_model, heads, seq_len, vocab.
fn validate_gpt(sizes: [u64; 5]) -> Result<(), String> {
    let [_, d_model, heads, _, vocab] = sizes;
    if sizes.contains(&0) {
        return Err(
            "GPT sizes must be positive (--layers, --d-model, --heads, --seq-len, --vocab)".into(),
        );
    }
    if sizes.iter().any(|v| *v >= 1 << 31) {
        return Err("GPT sizes must be below 2^31".into());
    }
    if d_model % heads != 0 {
        return Err(format!(
            "--d-model {d_model} must be a multiple of --heads {heads}"
        ));
    }
    if vocab < 2 {
        return Err("--vocab must be at least 2 for cross-entropy".into());
    }
    Ok(())
}

fn validate_resnet(image_size: u64, classes: u64) -> Result<(), String> {
    if !(2..1 << 31).contains(&classes) {
        return Err("ResNet classes must be between 2 and 2^31".into());
    }
    if image_size >= 1 << 20 {
        return Err(format!("--image-size {image_size} is too large"));
    }
    let min = resnet::min_image_size();
    if image_size < min {
        return Err(format!(
            "--image-size {image_size} is too small: ResNet's last stage would be 1×1, and \
             BatchNorm in train mode needs more than one value per channel at batch 1 \
             (use at least {min})"
        ));
    }
    Ok(())
}

/// `sizes`: layers, d_model, heads, patch, image_size, classes.
fn validate_vit(sizes: [u64; 6]) -> Result<(), String> {
    let [_, d_model, heads, patch, image_size, classes] = sizes;
    if sizes.contains(&0) {
        return Err(
            "ViT sizes must be positive (--layers, --d-model, --heads, --patch, \
                        --image-size)"
                .into(),
        );
    }
    if sizes.iter().any(|v| *v >= 1 << 31) || image_size >= 1 << 20 {
        return Err("ViT sizes must be below 2^31 (--image-size below 2^20)".into());
    }
    if d_model % heads != 0 {
        return Err(format!(
            "--d-model {d_model} must be a multiple of --heads {heads}"
        ));
    }
    if image_size % patch != 0 {
        return Err(format!(
            "--image-size {image_size} must be a multiple of --patch {patch}"
        ));
    }
    if classes < 2 {
        return Err("ViT classes must be at least 2".into());
    }
    Ok(())
}

fn validate_torchscript(inputs: &[InputSpec], sha256: &str) -> Result<(), String> {
    if inputs.is_empty() {
        return Err("a TorchScript model needs at least one --input spec, e.g. \
                    --input 'f32[B,3,224,224]'"
            .into());
    }
    for i in inputs {
        i.check().map_err(|e| e.to_string())?;
    }
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("TorchScript sha256 {sha256:?} is not a SHA-256"));
    }
    Ok(())
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
