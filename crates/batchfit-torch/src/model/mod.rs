//! The tch model workload's code: the networks (built from `nn::Path` as tch-rs does), the training
//! step shared by the trial child and `batchfit-train` (TorchScript files too), and training data.
//!
//! The model's *description* (`ModelSpec`, the zoo's presets, input and loss specs) is plan data and
//! lives in [`batchfit::plan::model`]; everything here runs libtorch.

pub mod data;
pub mod gpt;
pub mod mlp;
pub mod resnet;
pub mod step;
pub mod vit;
