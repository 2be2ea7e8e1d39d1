//! The tch model workload's code: the networks (built from `nn::Path` as tch-rs does), TorchScript
//! files, the training step shared by the trial child and `batchfit-train`, and training data.
//!
//! The model's *description* (`ModelSpec`, the zoo's presets, input and loss specs) is plan data and
//! lives in [`crate::plan::model`]; everything here runs libtorch.

pub mod data;
pub mod gpt;
pub mod mlp;
pub mod resnet;
pub mod script;
pub mod step;
pub mod vit;
