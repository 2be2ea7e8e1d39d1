//! batchfit: the largest micro-batch that really fits, proven by real training steps, and the gradient
//! accumulation that reaches a global batch.
//!
//! The modules, bottom to top; each imports only modules listed before it (`tests/layout.rs`
//! holds the graph acyclic, and the engine free of tch, clap and NVML). `docs/architecture.md` has
//! the data flow.
//!
//! | layer | modules |
//! |---|---|
//! | platform | [`platform`] (sizes, `/proc`, rlimits, signals, the one file writer), [`exit`] (exit codes) |
//! | protocol | [`protocol`]: trial request and outcome, the workload interface, the OOM classifier |
//! | GPU | [`gpu`]: NVML, GPU selection |
//! | where memory is measured | [`device`]: the `Backend` trait; `sim`, `cpu`, `cuda`; the trial-process runner, process trees, memory cgroups |
//! | engine | [`search`] (the proof), [`accumulate`] (the split), [`plan`] (the contract: schema, model spec, merge, advice) |
//! | what a trial runs | [`workload`]: batchfit's own model (through the torch runner), the user's command (`--exec`) |
//! | outputs | [`output`]: one exporter per `--format`, progress, plot |
//! | command line | [`cli`] (clap definitions, completions, man pages), [`config`] (arguments → validated config) |
//! | orchestration | [`probe`] (set-up, single/multi-GPU runs, split, cache, verify), [`doctor`] |
//!
//! The binaries (`src/bin/batchfit`, `src/bin/batchfit-train`) sit on top of all of them. This
//! package links no libtorch: everything that does (the model zoo, the model trials, the trainer) is
//! the torch runner, package `crates/batchfit-torch`, which depends on this library
//! ([`workload::runner`] finds it and the user's torch at run time).

// (one `mod` per group, so that rustfmt keeps the layer order)
// platform
pub mod platform;
// exit codes
pub mod exit;
// protocol
pub mod protocol;
// GPU
pub mod gpu;
// where memory is measured
pub mod device;
// engine
pub mod search;
// engine: the split
pub mod accumulate;
// engine: the contract
pub mod plan;
// what a trial runs
pub mod workload;
// outputs
pub mod output;
// command line
pub mod cli;
// validated configuration
pub mod config;
// orchestration
pub mod probe;
// orchestration: doctor
pub mod doctor;
