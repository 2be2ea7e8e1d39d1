//! batchfit's torch runner: everything that runs libtorch, on the user's own PyTorch.
//!
//! The `batchfit` command links no libtorch (its engine, `--exec`, NVML, plans and outputs need
//! none); what does is here, in one executable (`batchfit-torch`) that `batchfit` starts for model
//! trials and the `batchfit-train` launcher starts to train, both with the user's torch on the
//! library path (`batchfit::workload::runner`). The plan, the protocol, the classifier and the
//! exit codes are the `batchfit` library's: this crate depends on it, never the other way round.
//!
//! | module | what it holds |
//! |---|---|
//! | [`model`] | the networks (built from `nn::Path`), the training step shared by trials and the trainer, training data |
//! | [`child`] | a model trial: build, run `steps` training steps, measure, classify, print the result line |
//! | [`allocator`] | the caching allocator's figures and autocast with a dtype, through a C++ shim (`shim.cpp`) |
//! | [`train`] | `batchfit-train`: trains with a plan's micro-batch and accumulation |
//! | [`cuda`] | loading libtorch's CUDA half when the user's torch has one |

pub mod allocator;
pub mod child;
pub mod cuda;
pub mod model;
pub mod train;

/// The PyTorch version this runner was built against (its `torch/version.py`).
pub const BUILT_FOR: &str = env!("BATCHFIT_LIBTORCH_VERSION");
