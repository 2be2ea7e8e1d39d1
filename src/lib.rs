//! batchfit: the largest micro-batch that really fits, proven by real training steps, and the gradient
//! accumulation that reaches a global batch.
//!
//! Layout (data flows top to bottom):
//! * [`cli`] → [`config`]: arguments parsed, then validated into a [`config::ProbeConfig`] in one place;
//! * [`probe`]: orchestration: backend, limit, search, accumulation split, plan writing;
//! * [`search`]: strategies and the proof invariant — knows only the [`backend::Backend`] trait;
//! * [`backend`]: `sim` (a formula), `cpu` (child processes under `RLIMIT_DATA`), `cuda`;
//! * [`trial`] / [`step`] / [`models`]: the only code that runs tch: a trial child and the shared
//!   training step that `batchfit-train` reuses;
//! * [`plan`]: the versioned JSON contract with the trainer and job scripts; [`accumulate`]: the split;
//! * [`output`]: the plan as json/text/env/deepspeed, completions and the man page; [`throughput`]:
//!   samples/s advice; [`progress`]: progress on stderr; [`plot`]: `--plot` (SVG/PNG of a plan).

pub mod accumulate;
pub mod backend;
pub mod cache;
pub mod cli;
pub mod config;
pub mod data;
pub mod gpu;
pub mod interrupt;
pub mod jobs;
pub mod models;
pub mod multi_gpu;
pub mod oom;
pub mod output;
pub mod plan;
pub mod plot;
pub mod probe;
pub mod progress;
pub mod search;
pub mod step;
pub mod sysmem;
pub mod throughput;
pub mod trial;
pub mod units;
