//! batchfit's own model as the workload, from `--model` and its flags: a zoo architecture with its
//! shape flags, or a TorchScript file with its input specs and loss, trained with `--optimizer` in
//! `--precision`.

use super::ConfigError;
use crate::cli::{OptimizerArg, PrecisionArg, ProbeArgs};
use crate::plan::model::{Architecture, InputSpec, LossSpec, ModelSpec, OptimizerKind, Precision};

/// The model batchfit trains: `--model` and its flags.
pub(super) fn model(a: &ProbeArgs) -> Result<ModelSpec, ConfigError> {
    let model = ModelSpec {
        architecture: architecture(a)?,
        optimizer: match a.optimizer {
            OptimizerArg::Sgd => OptimizerKind::Sgd,
            OptimizerArg::Momentum => OptimizerKind::Momentum,
            OptimizerArg::Adam => OptimizerKind::Adam,
            OptimizerArg::Adamw => OptimizerKind::Adamw,
        },
        precision: match a.precision {
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::AmpBf16 => Precision::AmpBf16,
            PrecisionArg::AmpFp16 => Precision::AmpFp16,
        },
    };
    model.validate().map_err(ConfigError)?;
    if model.precision == Precision::Bf16
        && matches!(model.architecture, Architecture::Torchscript { .. })
    {
        return Err(ConfigError(
            "--precision bf16 with a TorchScript model: batchfit can cast its parameters but not its \
             buffers (e.g. BatchNorm statistics); export the model in bf16 (model.to(torch.bfloat16)) with \
             bf16 --input specs and probe it with --precision fp32, or use --precision amp-bf16 on cuda"
                .into(),
        ));
    }
    Ok(model)
}

/// The architecture of `--model` with its knobs: a preset's defaults, overridden by the flags given,
/// or a TorchScript file with its inputs and loss. A knob of another model family is refused (it
/// would silently do nothing).
fn architecture(a: &ProbeArgs) -> Result<Architecture, ConfigError> {
    let Some(preset) = Architecture::preset(&a.model) else {
        return torchscript(a);
    };
    refuse_other_models_flags(a, &preset)?;
    Ok(with_knobs(a, preset))
}

/// A family of model flags: its name, its flags with their values, and whether the preset takes them.
type Family<'a> = (&'static str, &'a [(&'static str, Option<u64>)], bool);

/// The flags of model families `preset` is not of: an error naming the first one given.
fn refuse_other_models_flags(a: &ProbeArgs, preset: &Architecture) -> Result<(), ConfigError> {
    let model = a.model.as_str();
    if !a.inputs.is_empty() || a.loss.is_some() {
        let spec = ModelSpec {
            architecture: preset.clone(),
            optimizer: OptimizerKind::Adam,
            precision: Precision::Fp32,
        };
        return Err(ConfigError(format!(
            "--input and --loss describe a TorchScript model; the built-in --model {model} has its own \
             ({})",
            spec.input_spec()
        )));
    }
    let mlp_flags_given =
        a.mlp_input != 1024 || a.mlp_hidden != [2048, 2048] || a.mlp_classes != 10;
    if !matches!(preset, Architecture::Mlp { .. }) && mlp_flags_given {
        return Err(ConfigError(format!(
            "--mlp-input, --mlp-hidden and --mlp-classes are MLP options; --model {model} does not use them"
        )));
    }
    use Architecture::{Gpt, Resnet18, Resnet50, Vit};
    let families: [Family; 4] = [
        (
            "GPT and ViT",
            &[
                ("--layers", a.layers),
                ("--d-model", a.d_model),
                ("--heads", a.heads),
            ],
            matches!(preset, Gpt { .. } | Vit { .. }),
        ),
        (
            "GPT",
            &[("--seq-len", a.seq_len), ("--vocab", a.vocab)],
            matches!(preset, Gpt { .. }),
        ),
        (
            "ResNet and ViT",
            &[("--image-size", a.image_size)],
            matches!(preset, Resnet18 { .. } | Resnet50 { .. } | Vit { .. }),
        ),
        ("ViT", &[("--patch", a.patch)], matches!(preset, Vit { .. })),
    ];
    for (family, flags, _) in families.iter().filter(|f| !f.2) {
        if let Some((flag, _)) = flags.iter().find(|(_, v)| v.is_some()) {
            return Err(ConfigError(format!(
                "{flag} is a {family} option; --model {model} does not use it"
            )));
        }
    }
    Ok(())
}

/// `preset` with the knobs given on the command line in place of its defaults.
fn with_knobs(a: &ProbeArgs, preset: Architecture) -> Architecture {
    match preset {
        Architecture::Mlp { .. } => Architecture::Mlp {
            input: a.mlp_input,
            hidden: a.mlp_hidden.clone(),
            classes: a.mlp_classes,
        },
        Architecture::Gpt {
            layers,
            d_model,
            heads,
            seq_len,
            vocab,
        } => Architecture::Gpt {
            layers: a.layers.unwrap_or(layers),
            d_model: a.d_model.unwrap_or(d_model),
            heads: a.heads.unwrap_or(heads),
            seq_len: a.seq_len.unwrap_or(seq_len),
            vocab: a.vocab.unwrap_or(vocab),
        },
        Architecture::Resnet18 {
            image_size,
            classes,
        } => Architecture::Resnet18 {
            image_size: a.image_size.unwrap_or(image_size),
            classes,
        },
        Architecture::Resnet50 {
            image_size,
            classes,
        } => Architecture::Resnet50 {
            image_size: a.image_size.unwrap_or(image_size),
            classes,
        },
        Architecture::Vit {
            layers,
            d_model,
            heads,
            patch,
            image_size,
            classes,
        } => Architecture::Vit {
            layers: a.layers.unwrap_or(layers),
            d_model: a.d_model.unwrap_or(d_model),
            heads: a.heads.unwrap_or(heads),
            patch: a.patch.unwrap_or(patch),
            image_size: a.image_size.unwrap_or(image_size),
            classes,
        },
        t @ Architecture::Torchscript { .. } => t,
    }
}

/// `--model PATH`: a TorchScript file, checked now (exists, readable, really TorchScript) so a bad file
/// never costs a trial; its content hash goes into the fingerprint.
fn torchscript(a: &ProbeArgs) -> Result<Architecture, ConfigError> {
    let model = a.model.as_str();
    let path = std::path::Path::new(model);
    let looks_like_file = model.contains('/')
        || [".pt", ".pth", ".ts", ".jit", ".zip"]
            .iter()
            .any(|e| model.ends_with(e))
        || path.exists();
    if !looks_like_file {
        return Err(ConfigError(format!(
            "unknown model {model:?}: use one of {} (see `batchfit models`), or a TorchScript file \
             PATH.pt with --input and --loss",
            crate::plan::model::ZOO.join(", ")
        )));
    }
    let zoo_flags = [
        ("--layers", a.layers),
        ("--d-model", a.d_model),
        ("--heads", a.heads),
        ("--seq-len", a.seq_len),
        ("--vocab", a.vocab),
        ("--image-size", a.image_size),
        ("--patch", a.patch),
    ];
    if let Some((flag, _)) = zoo_flags.iter().find(|(_, v)| v.is_some()) {
        return Err(ConfigError(format!(
            "{flag} is an option of the built-in models; a TorchScript model's shapes come from --input"
        )));
    }
    if a.inputs.is_empty() {
        return Err(ConfigError(format!(
            "--model {model} is a TorchScript file: give its inputs with --input, e.g. --input \
             'f32[B,3,224,224]' (repeat --input for each argument of forward())"
        )));
    }
    let inputs = a
        .inputs
        .iter()
        .map(|s| s.parse::<InputSpec>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError(e.to_string()))?;
    let loss: LossSpec = a
        .loss
        .as_deref()
        .ok_or_else(|| {
            ConfigError(format!(
                "--model {model} is a TorchScript file: say how to form its loss with --loss \
                 cross-entropy:NUM_CLASSES, mse or mean"
            ))
        })?
        .parse()
        .map_err(|e: crate::plan::input::LossSpecError| ConfigError(e.to_string()))?;
    let file = crate::workload::script::inspect(path).map_err(|e| ConfigError(e.to_string()))?;
    Ok(Architecture::Torchscript {
        file: file.path,
        sha256: file.sha256,
        parameters: file.parameters,
        inputs,
        loss,
    })
}
