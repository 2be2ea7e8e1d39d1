//! The training step, shared by the trial child and `batchfit-train`, so a size the probe proved is a
//! size the trainer runs: same model code, same optimizer, same loss, same data shapes.
//!
//! One optimizer step = zero the gradients, then for each micro-batch: forward, loss, backward, then the
//! optimizer step. Every fallible libtorch call uses tch's `f_` form so an out-of-memory comes back as an
//! error ([`StepError::Oom`]); tch calls that can only panic are caught by the trial child.
//!
//! **Loss scaling.** Each micro-batch's loss is the *sum* of per-sample losses divided by the number of
//! samples in the whole optimizer step, so after accumulating `a` micro-batches (equal or not) the gradient
//! equals that of one batch of all those samples (mean reduction). Removing that scaling makes
//! `tests::accumulated_gradients_equal_full_batch` fail.

use crate::models::{mlp::Mlp, Architecture, ModelSpec, OptimizerKind};
use crate::oom;
use tch::{nn, COptimizer, Device, Kind, Reduction, TchError, Tensor};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum StepError {
    #[error("out of memory: {0}")]
    Oom(String),
    #[error("loss is not finite ({0}): the step diverged or the data is bad")]
    NonFinite(f64),
    #[error("{0}")]
    Other(String),
}

impl From<TchError> for StepError {
    fn from(e: TchError) -> Self {
        classify(&e.to_string())
    }
}

/// Turns a libtorch error text into an OOM or another error.
pub fn classify(msg: &str) -> StepError {
    if oom::is_oom(msg) {
        StepError::Oom(oom::first_line(msg))
    } else {
        StepError::Other(oom::first_line(msg))
    }
}

/// Where micro-batches come from.
pub trait DataSource {
    /// A batch of `n` samples: inputs and integer class targets, on `device`.
    fn next_batch(&mut self, n: u64, device: Device) -> Result<(Tensor, Tensor), TchError>;
}

/// Random inputs and labels of the model's shapes (the default for probing and training).
pub struct Synthetic {
    input: i64,
    classes: i64,
}

impl Synthetic {
    pub fn for_spec(spec: &ModelSpec) -> Self {
        match &spec.architecture {
            Architecture::Mlp { input, classes, .. } => Synthetic {
                input: *input as i64,
                classes: *classes as i64,
            },
        }
    }
}

impl DataSource for Synthetic {
    fn next_batch(&mut self, n: u64, device: Device) -> Result<(Tensor, Tensor), TchError> {
        let x = Tensor::f_randn([n as i64, self.input], (Kind::Float, device))?;
        let y = Tensor::f_randint(self.classes, [n as i64], (Kind::Int64, device))?;
        Ok((x, y))
    }
}

enum Net {
    Mlp(Mlp),
}

impl Net {
    fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        match self {
            Net::Mlp(m) => m.forward(x),
        }
    }
}

/// A model with its optimizer, ready to train.
pub struct Learner {
    pub vs: nn::VarStore,
    net: Net,
    opt: COptimizer,
    device: Device,
}

impl Learner {
    /// Builds the model of `spec` on `device` with weights from `seed`.
    pub fn new(spec: &ModelSpec, device: Device, lr: f64, seed: i64) -> Result<Self, StepError> {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let net = match &spec.architecture {
            Architecture::Mlp {
                input,
                hidden,
                classes,
            } => Net::Mlp(Mlp::new(&root, *input, hidden, *classes)),
        };
        let mut opt = match spec.optimizer {
            OptimizerKind::Sgd => COptimizer::sgd(lr, 0.0, 0.0, 0.0, false)?,
            OptimizerKind::Momentum => COptimizer::sgd(lr, 0.9, 0.0, 0.0, false)?,
            OptimizerKind::Adam => COptimizer::adam(lr, 0.9, 0.999, 0.0, 1e-8, false)?,
            OptimizerKind::Adamw => COptimizer::adamw(lr, 0.9, 0.999, 0.01, 1e-8, false)?,
        };
        for t in vs.trainable_variables() {
            opt.add_parameters(&t, 0)?;
        }
        Ok(Learner {
            vs,
            net,
            opt,
            device,
        })
    }

    /// Forward and backward over the micro-batches, accumulating gradients (no optimizer step).
    /// Returns the mean loss per sample over all micro-batches.
    pub fn accumulate(
        &mut self,
        micro_batches: &[u64],
        data: &mut dyn DataSource,
    ) -> Result<f64, StepError> {
        let total: u64 = micro_batches.iter().sum();
        let mut loss_sum = 0.0;
        for &n in micro_batches {
            let (x, y) = data.next_batch(n, self.device)?;
            let logits = self.net.forward(&x)?;
            let lp = logits.f_log_softmax(-1, Kind::Float)?;
            let loss = lp.f_nll_loss(&y, None::<Tensor>, Reduction::Sum, -100)?;
            let scaled = loss.f_div_scalar(total as f64)?;
            scaled.f_backward()?;
            loss_sum += f64::try_from(&loss).map_err(|e| StepError::Other(e.to_string()))?;
        }
        let mean = loss_sum / total as f64;
        if !mean.is_finite() {
            return Err(StepError::NonFinite(mean));
        }
        Ok(mean)
    }

    /// One optimizer step over `micro_batches` (gradient accumulation when there are several).
    pub fn step(
        &mut self,
        micro_batches: &[u64],
        data: &mut dyn DataSource,
    ) -> Result<f64, StepError> {
        self.opt.zero_grad()?;
        let loss = self.accumulate(micro_batches, data)?;
        self.opt.step()?;
        Ok(loss)
    }

    /// Gradients of all trainable variables, flattened in a stable order (for tests).
    pub fn gradients(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .map(|(k, t)| (k, t.grad().detach().copy()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::Precision;

    /// Hands out consecutive slices of a fixed data set.
    struct Fixed {
        x: Tensor,
        y: Tensor,
        pos: i64,
    }
    impl DataSource for Fixed {
        fn next_batch(&mut self, n: u64, _d: Device) -> Result<(Tensor, Tensor), TchError> {
            let n = n as i64;
            let out = (self.x.narrow(0, self.pos, n), self.y.narrow(0, self.pos, n));
            self.pos += n;
            Ok(out)
        }
    }

    fn spec() -> ModelSpec {
        ModelSpec {
            architecture: Architecture::Mlp {
                input: 16,
                hidden: vec![32, 32],
                classes: 5,
            },
            optimizer: OptimizerKind::Adam,
            precision: Precision::Fp32,
        }
    }

    /// libtorch's RNG is global and tests run in parallel threads: serialise the tests that seed it.
    static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn grads_for(split: &[u64]) -> Vec<(String, Tensor)> {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(7);
        let x = Tensor::randn([24, 16], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(5, [24], (Kind::Int64, Device::Cpu));
        let mut l = Learner::new(&spec(), Device::Cpu, 1e-3, 1).unwrap();
        let mut d = Fixed { x, y, pos: 0 };
        l.opt.zero_grad().unwrap();
        l.accumulate(split, &mut d).unwrap();
        l.gradients()
    }

    #[test]
    fn accumulated_gradients_equal_full_batch() {
        let full = grads_for(&[24]);
        for split in [
            &[12u64, 12][..],
            &[6, 6, 6, 6],
            &[8, 8, 8],
            &[9, 8, 7],
            &[1; 24],
        ] {
            let acc = grads_for(split);
            assert_eq!(full.len(), acc.len());
            for ((n1, g1), (_, g2)) in full.iter().zip(acc.iter()) {
                let diff = f64::try_from((g1 - g2).abs().max()).unwrap();
                let scale = f64::try_from(g1.abs().max()).unwrap();
                assert!(scale > 0.0, "{n1} has a zero gradient");
                assert!(
                    diff <= 1e-5 * scale.max(1.0),
                    "{n1}: split {split:?} differs by {diff} (scale {scale})"
                );
            }
        }
    }

    #[test]
    fn step_trains() {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        let mut l = Learner::new(&spec(), Device::Cpu, 1e-2, 3).unwrap();
        tch::manual_seed(5);
        let x = Tensor::randn([64, 16], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(5, [64], (Kind::Int64, Device::Cpu));
        let first = {
            let mut d = Fixed {
                x: x.shallow_clone(),
                y: y.shallow_clone(),
                pos: 0,
            };
            l.step(&[32, 32], &mut d).unwrap()
        };
        let mut last = first;
        for _ in 0..30 {
            let mut d = Fixed {
                x: x.shallow_clone(),
                y: y.shallow_clone(),
                pos: 0,
            };
            last = l.step(&[32, 32], &mut d).unwrap();
        }
        assert!(last < first * 0.8, "loss {first} → {last}");
    }
}
