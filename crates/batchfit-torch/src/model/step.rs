//! The training step, shared by the trial child and `batchfit-train`, so a size the probe proved is a
//! size the trainer runs: same model code, same optimizer, same loss, same data shapes.
//!
//! One optimizer step = zero the gradients, then for each micro-batch: forward, loss, backward, then the
//! optimizer step. Every fallible libtorch call uses tch's `f_` form so an out-of-memory comes back as an
//! error ([`StepError::Failed`], with libtorch's whole message, which the caller hands to the one
//! classifier, [`batchfit::protocol::classify`], with the evidence it has); tch calls that can only panic
//! are caught by the trial child and the trainer.
//!
//! **Loss scaling.** Each micro-batch's loss is the *sum* of per-sample losses divided by the number of
//! samples in the whole optimizer step, so after accumulating `a` micro-batches (equal or not) the gradient
//! equals that of one batch of all those samples (mean reduction). Removing that scaling makes
//! `tests::accumulated_gradients_equal_full_batch` fail.

use super::{gpt::Gpt, mlp::Mlp, resnet, resnet::Resnet, vit::Vit};
use batchfit::plan::model::{
    Architecture, InputSpec, LossSpec, ModelSpec, OptimizerKind, Precision,
};
use tch::{nn, COptimizer, Device, Kind, Reduction, TchError, Tensor};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum StepError {
    /// libtorch or the model code failed: the whole message (out of memory or not is for
    /// [`batchfit::protocol::classify`] to say, with the evidence the caller has).
    #[error("{0}")]
    Failed(String),
    #[error("loss is not finite ({0}): the step diverged or the data is bad")]
    NonFinite(f64),
}

impl From<TchError> for StepError {
    fn from(e: TchError) -> Self {
        StepError::Failed(e.to_string())
    }
}

/// The text of a caught panic (tch's plain calls panic with libtorch's error message).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("panic without a message")
}

/// One micro-batch: the model's inputs and, when the data has them, its targets (class ids, or a
/// tensor of the output's shape for `mse`). Without targets, random ones of the right shape are drawn
/// after the forward pass (synthetic data for TorchScript models, whose output shape is only known then).
pub struct Batch {
    pub inputs: Vec<Tensor>,
    pub target: Option<Tensor>,
}

/// Where micro-batches come from.
pub trait DataSource {
    /// A batch of `n` samples on `device`.
    fn next_batch(&mut self, n: u64, device: Device) -> Result<Batch, TchError>;
}

/// Random inputs of the model's shapes with *learnable* targets (the default for probing and
/// training): features with classes from a fixed random linear teacher (mlp), token sequences that
/// step through the vocabulary by a fixed stride with their next tokens as targets (gpt), images
/// with classes from a fixed random teacher on their 4×4 average-pooled pixels (resnet, vit), and
/// for TorchScript models tensors of each `--input` spec. The teacher is deterministic from the
/// seed (the plan's `runtime.seed`), so the probe's trials and `batchfit-train` draw the same task,
/// and a demo's loss falls instead of fitting noise. The targets cost a few bytes per sample beside
/// the inputs; the memory a step takes is what it was with random targets.
pub struct Synthetic {
    kind: SyntheticKind,
    seed: u64,
    /// The teacher's weights, made on the device of the first batch.
    teacher: Option<Tensor>,
}

enum SyntheticKind {
    Features { input: i64, classes: i64 },
    Tokens { seq_len: i64, vocab: i64 },
    Images { size: i64, classes: i64 },
    Inputs(Vec<InputSpec>),
}

/// splitmix64: a deterministic stream of 64-bit values from a seed.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` standard normal values from `seed` (Box–Muller), independent of libtorch's generator.
fn normals(seed: u64, n: usize) -> Vec<f32> {
    let mut st = seed ^ 0x5EED_7EAC_4E2D_0001;
    let mut v = Vec::with_capacity(n + 1);
    while v.len() < n {
        let u1 = ((splitmix(&mut st) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (splitmix(&mut st) >> 11) as f64 / (1u64 << 53) as f64;
        let r = (-2.0 * u1.ln()).sqrt();
        v.push((r * (2.0 * std::f64::consts::PI * u2).cos()) as f32);
        v.push((r * (2.0 * std::f64::consts::PI * u2).sin()) as f32);
    }
    v.truncate(n);
    v
}

/// Features pooled per image for the image teacher: 3 channels × 4 × 4.
const POOLED: i64 = 3 * 4 * 4;

impl Synthetic {
    /// [`Synthetic::with_seed`] with seed 0.
    pub fn for_spec(spec: &ModelSpec) -> Self {
        Self::with_seed(spec, 0)
    }

    /// The synthetic data of `spec`'s model, its teacher drawn from `seed`.
    pub fn with_seed(spec: &ModelSpec, seed: i64) -> Self {
        let kind = match &spec.architecture {
            Architecture::Mlp { input, classes, .. } => SyntheticKind::Features {
                input: *input as i64,
                classes: *classes as i64,
            },
            Architecture::Gpt { seq_len, vocab, .. } => SyntheticKind::Tokens {
                seq_len: *seq_len as i64,
                vocab: *vocab as i64,
            },
            Architecture::Resnet18 {
                image_size,
                classes,
            }
            | Architecture::Resnet50 {
                image_size,
                classes,
            }
            | Architecture::Vit {
                image_size,
                classes,
                ..
            } => SyntheticKind::Images {
                size: *image_size as i64,
                classes: *classes as i64,
            },
            Architecture::Torchscript { inputs, .. } => SyntheticKind::Inputs(inputs.clone()),
        };
        Synthetic {
            kind,
            seed: seed as u64,
            teacher: None,
        }
    }

    /// The teacher's weights `[rows, classes]` on `device` (made once).
    fn teacher(&mut self, rows: i64, classes: i64, device: Device) -> Result<&Tensor, TchError> {
        if self.teacher.as_ref().is_none_or(|t| t.device() != device) {
            let w = normals(self.seed, (rows * classes) as usize);
            self.teacher = Some(
                Tensor::f_from_slice(&w)?
                    .f_reshape([rows, classes])?
                    .f_to_device(device)?,
            );
        }
        Ok(self.teacher.as_ref().expect("made"))
    }

    /// The token stride of the gpt task: from 1 to vocab − 1, from the seed.
    fn stride(&self, vocab: i64) -> i64 {
        let mut st = self.seed ^ 0x70CE_u64;
        1 + (splitmix(&mut st) % (vocab.max(2) as u64 - 1)) as i64
    }
}

/// The libtorch kind of an input dtype.
pub fn input_kind(d: batchfit::plan::input::InputDtype) -> Kind {
    use batchfit::plan::input::InputDtype as D;
    match d {
        D::F32 => Kind::Float,
        D::F64 => Kind::Double,
        D::F16 => Kind::Half,
        D::Bf16 => Kind::BFloat16,
        D::I64 => Kind::Int64,
        D::I32 => Kind::Int,
        D::U8 => Kind::Uint8,
    }
}

impl DataSource for Synthetic {
    fn next_batch(&mut self, n: u64, device: Device) -> Result<Batch, TchError> {
        let (x, y) = match self.kind {
            SyntheticKind::Features { input, classes } => {
                let x = Tensor::f_randn([n as i64, input], (Kind::Float, device))?;
                let w = self.teacher(input, classes, device)?;
                let y = tch::no_grad(|| x.f_matmul(w)?.f_argmax(1, false))?;
                (x, y)
            }
            SyntheticKind::Tokens { seq_len, vocab } => {
                // x_{i+1} = x_i + stride (mod vocab): each next token follows from the current one
                let start = Tensor::f_randint(vocab, [n as i64, 1], (Kind::Int64, device))?;
                let steps = Tensor::f_arange(seq_len + 1, (Kind::Int64, device))?
                    .f_mul_scalar(self.stride(vocab))?;
                let tokens = start.f_add(&steps)?.f_remainder(vocab)?;
                let x = tokens.f_narrow(1, 0, seq_len)?;
                let y = tokens.f_narrow(1, 1, seq_len)?;
                (x, y)
            }
            SyntheticKind::Images { size, classes } => {
                let (x, _) = resnet::synthetic_batch(n, size, classes, device)?;
                let w = self.teacher(POOLED, classes, device)?;
                let y = tch::no_grad(|| {
                    x.f_adaptive_avg_pool2d([4, 4])?
                        .f_reshape([n as i64, POOLED])?
                        .f_matmul(w)?
                        .f_argmax(1, false)
                })?;
                (x, y)
            }
            SyntheticKind::Inputs(ref specs) => {
                let inputs = specs
                    .iter()
                    .map(|s| {
                        let kind = input_kind(s.dtype);
                        match s.high {
                            Some(h) => Tensor::f_randint(h as i64, s.shape(n), (kind, device)),
                            None => Tensor::f_randn(s.shape(n), (kind, device)),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                return Ok(Batch {
                    inputs,
                    target: None,
                });
            }
        };
        Ok(Batch {
            inputs: vec![x],
            target: Some(y),
        })
    }
}

enum Net {
    Mlp(Mlp),
    Gpt(Gpt),
    Resnet(Resnet),
    Vit(Vit),
    Script {
        module: tch::TrainableCModule,
        loss: LossSpec,
    },
}

/// `amp-fp16`'s dynamic loss scale, kept as `torch.amp.GradScaler` keeps it: it starts at 2^16, is
/// halved after a step whose gradients overflowed and doubled after 2000 clean steps in a row.
/// Unlike GradScaler, an overflowed step is not skipped: its gradients are zeroed and the optimizer
/// steps with learning rate 0, so that a trial's steps always allocate the optimizer's state (a
/// skipped first step would leave it out of a short trial's peak) while the weights stay as they are
/// (weight decay is scaled by the learning rate too). Adam's moments decay once on such a step,
/// which GradScaler's skip would not do.
#[derive(Debug, Clone, Copy)]
struct LossScale {
    scale: f64,
    clean_steps: u32,
}

/// Divides the gradients by `scale` in place, or zeroes them all when any holds an inf or NaN;
/// returns whether they did. One sum per gradient in its own dtype (a sum in another dtype would
/// first copy the gradient; a finite f32 sum that overflows only halves the scale once more), and one
/// sync.
fn unscale_or_zero(grads: &[Tensor], scale: f64) -> Result<bool, TchError> {
    let Some(first) = grads.first() else {
        return Ok(false);
    };
    tch::no_grad(|| {
        let mut total = Tensor::f_zeros([], (Kind::Double, first.device()))?;
        for g in grads {
            total = total.f_add(&g.f_sum(g.kind())?)?;
        }
        let finite = f64::try_from(&total)?.is_finite();
        for g in grads {
            let mut g = g.shallow_clone();
            if finite {
                let _ = g.f_div_scalar_(scale)?;
            } else {
                let _ = g.f_zero_()?;
            }
        }
        Ok(!finite)
    })
}

impl LossScale {
    const INITIAL: f64 = 65536.0;
    const GROWTH_INTERVAL: u32 = 2000;

    fn new() -> Self {
        LossScale {
            scale: Self::INITIAL,
            clean_steps: 0,
        }
    }

    /// After a step: halve on overflow, double after enough clean steps.
    fn update(&mut self, overflowed: bool) {
        if overflowed {
            self.scale /= 2.0;
            self.clean_steps = 0;
        } else {
            self.clean_steps += 1;
            if self.clean_steps >= Self::GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.clean_steps = 0;
            }
        }
    }
}

impl Net {
    /// The summed loss of a micro-batch of `n` samples (an f32 scalar) and its number of loss terms
    /// (samples, tokens or output elements): the loss is the mean over terms.
    fn loss_sum(&self, batch: &Batch, n: u64) -> Result<(Tensor, u64), StepError> {
        let x = batch
            .inputs
            .first()
            .ok_or_else(|| StepError::Failed("a batch without inputs".into()))?;
        let class_loss = |logits: Tensor, y: &Tensor| -> Result<(Tensor, u64), StepError> {
            let v = logits.size().last().copied().unwrap_or(1);
            let logits = logits.f_reshape([-1, v])?;
            let y = y.f_reshape([-1])?;
            let terms = y.numel() as u64;
            let lp = logits.f_log_softmax(-1, Kind::Float)?;
            Ok((
                lp.f_nll_loss(&y, None::<Tensor>, Reduction::Sum, -100)?,
                terms,
            ))
        };
        let target = || {
            batch.target.as_ref().ok_or_else(|| {
                StepError::Failed("the data has no targets (y) for a built-in model".into())
            })
        };
        match self {
            Net::Mlp(m) => class_loss(m.forward(x)?, target()?),
            Net::Resnet(m) => class_loss(m.forward(x)?, target()?),
            Net::Vit(m) => class_loss(m.forward(x)?, target()?),
            Net::Gpt(m) => class_loss(m.forward(x)?, target()?),
            Net::Script { module, loss } => {
                let out = module.forward_ts(&batch.inputs)?;
                let dims = out.size();
                if dims.first().copied() != Some(n as i64) {
                    return Err(StepError::Failed(format!(
                        "the TorchScript model's output has shape {dims:?}, not [{n}, …]: its first \
                         dimension must be the batch"
                    )));
                }
                match *loss {
                    LossSpec::CrossEntropy { classes } => {
                        if dims.len() < 2 || dims[dims.len() - 1] != classes as i64 {
                            return Err(StepError::Failed(format!(
                                "the TorchScript model's output has shape {dims:?}, but --loss \
                                 cross-entropy:{classes} needs logits [B, …, {classes}]"
                            )));
                        }
                        let y = match &batch.target {
                            Some(y) => y.shallow_clone(),
                            None => Tensor::f_randint(
                                classes as i64,
                                &dims[..dims.len() - 1],
                                (Kind::Int64, out.device()),
                            )?,
                        };
                        class_loss(out, &y)
                    }
                    LossSpec::Mse => {
                        let out = out.f_to_kind(Kind::Float)?;
                        let y = match &batch.target {
                            Some(y) => y.f_to_kind(Kind::Float)?,
                            None => out.f_randn_like()?,
                        };
                        let terms = out.numel() as u64;
                        Ok((out.f_sub(&y)?.f_square()?.f_sum(Kind::Float)?, terms))
                    }
                    LossSpec::Mean => {
                        let terms = out.numel() as u64;
                        Ok((out.f_sum(Kind::Float)?, terms))
                    }
                }
            }
        }
    }
}

/// A model with its optimizer, ready to train.
pub struct Learner {
    pub vs: nn::VarStore,
    net: Net,
    opt: COptimizer,
    device: Device,
    precision: Precision,
    /// `amp-fp16` only.
    loss_scale: Option<LossScale>,
    /// The optimizer's learning rate (an overflowed `amp-fp16` step runs it at 0).
    lr: f64,
}

impl Learner {
    /// Builds the model of `spec` on `device` with weights from `seed`. What libtorch cannot run on
    /// the device (autocast off CUDA) is refused here.
    pub fn new(spec: &ModelSpec, device: Device, lr: f64, seed: i64) -> Result<Self, StepError> {
        if spec.precision.is_amp() && !device.is_cuda() {
            return Err(StepError::Failed(format!(
                "--precision {} is autocast mixed precision, which batchfit runs on CUDA only; use \
                 bf16 or fp32 on {device:?}",
                spec.precision.as_str()
            )));
        }
        tch::manual_seed(seed);
        let mut vs = nn::VarStore::new(device);
        let root = vs.root();
        let net = match &spec.architecture {
            Architecture::Mlp {
                input,
                hidden,
                classes,
            } => Net::Mlp(Mlp::new(&root, *input, hidden, *classes)),
            Architecture::Gpt {
                layers,
                d_model,
                heads,
                seq_len,
                vocab,
            } => Net::Gpt(Gpt::new(&root, *layers, *d_model, *heads, *seq_len, *vocab)),
            Architecture::Resnet18 { classes, .. } => {
                Net::Resnet(Resnet::new(&root, false, *classes))
            }
            Architecture::Resnet50 { classes, .. } => {
                Net::Resnet(Resnet::new(&root, true, *classes))
            }
            Architecture::Vit {
                layers,
                d_model,
                heads,
                patch,
                image_size,
                classes,
            } => Net::Vit(Vit::new(
                &root,
                *layers,
                *d_model,
                *heads,
                *patch,
                *image_size,
                *classes,
            )),
            Architecture::Torchscript { file, loss, .. } => {
                let mut module = tch::TrainableCModule::load(file, root)?;
                module.set_train();
                Net::Script {
                    module,
                    loss: *loss,
                }
            }
        };
        if spec.precision == Precision::Bf16 {
            vs.bfloat16();
        }
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
            precision: spec.precision,
            loss_scale: (spec.precision == Precision::AmpFp16).then(LossScale::new),
            lr,
        })
    }

    /// Float inputs follow the weights' dtype (bf16 precision casts f32 data to bf16).
    fn cast_inputs(&self, batch: Batch) -> Result<Batch, TchError> {
        if self.precision != Precision::Bf16 {
            return Ok(batch);
        }
        let inputs = batch
            .inputs
            .into_iter()
            .map(|t| {
                if t.is_floating_point() {
                    t.f_to_kind(Kind::BFloat16)
                } else {
                    Ok(t)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Batch {
            inputs,
            target: batch.target,
        })
    }

    /// Forward and backward over the micro-batches, accumulating gradients (no optimizer step).
    /// Returns the mean loss per term (sample, token or output element) over all micro-batches.
    /// Under `amp-fp16` the gradients are unscaled, and zeroed when they overflowed (see
    /// [`LossScale`]), whose update is left to [`Learner::step`].
    pub fn accumulate(
        &mut self,
        micro_batches: &[u64],
        data: &mut dyn DataSource,
    ) -> Result<f64, StepError> {
        Ok(self.accumulate_scaled(micro_batches, data)?.0)
    }

    /// [`Learner::accumulate`], and whether the scaled gradients overflowed.
    fn accumulate_scaled(
        &mut self,
        micro_batches: &[u64],
        data: &mut dyn DataSource,
    ) -> Result<(f64, bool), StepError> {
        let total_samples: u64 = micro_batches.iter().sum();
        let (mut loss_sum, mut terms_sum) = (0.0, 0u64);
        let scale = self.loss_scale.map_or(1.0, |s| s.scale);
        for &n in micro_batches {
            let batch = self.cast_inputs(data.next_batch(n, self.device)?)?;
            let (loss, terms) = autocast(self.precision, || self.net.loss_sum(&batch, n))?;
            if terms == 0 {
                return Err(StepError::Failed(
                    "the loss has no terms (empty output)".into(),
                ));
            }
            // mean over all terms of the optimizer step, whatever the micro-batch sizes
            let divisor = terms as f64 / n as f64 * total_samples as f64;
            loss.f_mul_scalar(scale / divisor)?.f_backward()?;
            loss_sum += f64::try_from(&loss).map_err(|e| StepError::Failed(e.to_string()))?;
            terms_sum += terms;
        }
        let mean = loss_sum / terms_sum as f64;
        if !mean.is_finite() {
            return Err(StepError::NonFinite(mean));
        }
        let mut overflowed = false;
        if self.loss_scale.is_some() {
            let grads: Vec<Tensor> = self
                .vs
                .trainable_variables()
                .iter()
                .map(|t| t.grad())
                .filter(Tensor::defined)
                .collect();
            overflowed = unscale_or_zero(&grads, scale)?;
        }
        Ok((mean, overflowed))
    }

    /// One optimizer step over `micro_batches` (gradient accumulation when there are several).
    pub fn step(
        &mut self,
        micro_batches: &[u64],
        data: &mut dyn DataSource,
    ) -> Result<f64, StepError> {
        self.opt.zero_grad()?;
        let (loss, overflowed) = self.accumulate_scaled(micro_batches, data)?;
        if overflowed {
            // the optimizer's state is allocated as in any step; the weights do not move
            self.opt.set_learning_rate(0.0)?;
            self.opt.step()?;
            self.opt.set_learning_rate(self.lr)?;
        } else {
            self.opt.step()?;
        }
        if let Some(s) = &mut self.loss_scale {
            s.update(overflowed);
        }
        Ok(loss)
    }

    /// Gradients of all trainable variables, flattened in a stable order (for tests).
    pub fn gradients(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self
            .vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(k, t)| (k, t.grad().detach().copy()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// Runs `f` (the forward pass and loss) under CUDA autocast for the `amp-*` precisions, restoring the
/// previous state afterwards. tch's own `autocast` takes no dtype, so the dtype is set through the
/// allocator shim ([`crate::allocator`]).
fn autocast<T>(
    precision: Precision,
    f: impl FnOnce() -> Result<T, StepError>,
) -> Result<T, StepError> {
    use crate::allocator::{autocast, AutocastDtype};
    let dtype = match precision {
        Precision::AmpBf16 => AutocastDtype::Bf16,
        Precision::AmpFp16 => AutocastDtype::Fp16,
        _ => return f(),
    };
    autocast(Some(dtype), f).map_err(|e| StepError::Failed(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit::plan::model::Precision;

    #[test]
    fn fp16_loss_scale_halves_on_overflow_and_grows_after_clean_steps() {
        let mut s = LossScale::new();
        assert_eq!(s.scale, 65536.0);
        s.update(true);
        s.update(true);
        assert_eq!(s.scale, 16384.0);
        for _ in 0..LossScale::GROWTH_INTERVAL - 1 {
            s.update(false);
        }
        assert_eq!(s.scale, 16384.0, "not yet grown");
        s.update(false);
        assert_eq!(s.scale, 32768.0);
        // an overflow restarts the count of clean steps
        for _ in 0..10 {
            s.update(false);
        }
        s.update(true);
        assert_eq!((s.scale, s.clean_steps), (16384.0, 0));
        // like GradScaler, no floor
        for _ in 0..16 {
            s.update(true);
        }
        assert_eq!(s.scale, 0.25);
    }

    #[test]
    fn overflowed_gradients_are_zeroed_and_clean_ones_unscaled() {
        let g = || {
            vec![
                Tensor::from_slice(&[2.0f32, 4.0]),
                Tensor::from_slice(&[8.0f32]),
            ]
        };
        let clean = g();
        assert!(!unscale_or_zero(&clean, 2.0).unwrap());
        assert_eq!(Vec::<f32>::try_from(&clean[0]).unwrap(), vec![1.0, 2.0]);
        assert_eq!(Vec::<f32>::try_from(&clean[1]).unwrap(), vec![4.0]);
        for bad in [f32::INFINITY, f32::NAN, f32::NEG_INFINITY] {
            let grads = g();
            let _ = grads[1].shallow_clone().fill_(bad as f64);
            assert!(unscale_or_zero(&grads, 2.0).unwrap(), "{bad}");
            for t in &grads {
                assert!(
                    Vec::<f32>::try_from(t).unwrap().iter().all(|v| *v == 0.0),
                    "{bad}"
                );
            }
        }
        assert!(!unscale_or_zero(&[], 2.0).unwrap());
    }

    /// Hands out consecutive slices of a fixed data set.
    struct Fixed {
        x: Tensor,
        y: Tensor,
        pos: i64,
    }
    impl DataSource for Fixed {
        fn next_batch(&mut self, n: u64, _d: Device) -> Result<Batch, TchError> {
            let n = n as i64;
            let out = Batch {
                inputs: vec![self.x.narrow(0, self.pos, n)],
                target: Some(self.y.narrow(0, self.pos, n)),
            };
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
        grads_of(&spec(), x, y, split)
    }

    fn grads_of(spec: &ModelSpec, x: Tensor, y: Tensor, split: &[u64]) -> Vec<(String, Tensor)> {
        let mut l = Learner::new(spec, Device::Cpu, 1e-3, 1).unwrap();
        let mut d = Fixed { x, y, pos: 0 };
        l.opt.zero_grad().unwrap();
        l.accumulate(split, &mut d).unwrap();
        l.gradients()
    }

    fn assert_same_grads(
        full: &[(String, Tensor)],
        acc: &[(String, Tensor)],
        split: &[u64],
        tol: f64,
    ) {
        assert_eq!(full.len(), acc.len());
        for ((n1, g1), (_, g2)) in full.iter().zip(acc.iter()) {
            let diff = f64::try_from((g1 - g2).abs().max()).unwrap();
            let scale = f64::try_from(g1.abs().max()).unwrap();
            assert!(scale > 0.0, "{n1} has a zero gradient");
            assert!(
                diff <= tol * scale.max(1.0),
                "{n1}: split {split:?} differs by {diff} (scale {scale})"
            );
        }
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
            assert_same_grads(&full, &acc, split, 1e-5);
        }
    }

    fn tiny_gpt() -> ModelSpec {
        ModelSpec {
            architecture: Architecture::Gpt {
                layers: 2,
                d_model: 32,
                heads: 4,
                seq_len: 16,
                vocab: 50,
            },
            optimizer: OptimizerKind::Adam,
            precision: Precision::Fp32,
        }
    }

    fn resnet(deep: bool, image_size: u64) -> ModelSpec {
        let classes = batchfit::plan::model::RESNET_CLASSES;
        ModelSpec {
            architecture: if deep {
                Architecture::Resnet50 {
                    image_size,
                    classes,
                }
            } else {
                Architecture::Resnet18 {
                    image_size,
                    classes,
                }
            },
            optimizer: OptimizerKind::Adam,
            precision: Precision::Fp32,
        }
    }

    /// The GPT loss is per token over B×seq next-token targets: accumulation gives the full batch's
    /// gradients (no batch-coupled layers; unlike BatchNorm in the ResNets).
    #[test]
    fn gpt_accumulated_gradients_equal_full_batch() {
        let spec = tiny_gpt();
        let data = || {
            let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
            tch::manual_seed(11);
            let t = Tensor::randint(50, [12, 17], (Kind::Int64, Device::Cpu));
            (t.narrow(1, 0, 16).copy(), t.narrow(1, 1, 16).copy())
        };
        let run = |split: &[u64]| {
            let (x, y) = data();
            let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
            grads_of(&spec, x, y, split)
        };
        let full = run(&[12]);
        for split in [&[6u64, 6][..], &[5, 4, 3], &[1; 12]] {
            assert_same_grads(&full, &run(split), split, 1e-4);
        }
    }

    /// The analytic parameter counts `batchfit models` prints equal the built models' counts.
    #[test]
    fn parameter_counts_match_built_models() {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        let mut specs = vec![
            ModelSpec::default_mlp(),
            tiny_gpt(),
            resnet(false, 64),
            resnet(true, 64),
        ];
        specs.push(ModelSpec {
            architecture: Architecture::Gpt {
                layers: 1,
                d_model: 24,
                heads: 3,
                seq_len: 7,
                vocab: 11,
            },
            ..tiny_gpt()
        });
        specs.push(ModelSpec {
            architecture: Architecture::Vit {
                layers: 2,
                d_model: 48,
                heads: 4,
                patch: 8,
                image_size: 32,
                classes: 10,
            },
            ..tiny_gpt()
        });
        for spec in specs {
            let l = Learner::new(&spec, Device::Cpu, 1e-3, 0).unwrap();
            let built: i64 =
                l.vs.trainable_variables()
                    .iter()
                    .map(|t| t.numel() as i64)
                    .sum();
            assert_eq!(built as u64, spec.parameter_count(), "{spec:?}");
        }
    }

    /// Each zoo architecture trains a few steps on synthetic data with a finite loss.
    #[test]
    fn zoo_models_train_with_finite_loss() {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        // one intra-op thread: on a loaded machine more threads make this test many times slower
        crate::child::configure_threads(1);
        // the smallest image side keeps the ResNets cheap (their last feature map is 2×2)
        let side = batchfit::plan::model::resnet::min_image_size();
        for (spec, batch) in [
            (tiny_gpt(), 4u64),
            (resnet(false, side), 2),
            (resnet(true, side), 2),
        ] {
            let mut l = Learner::new(&spec, Device::Cpu, 1e-3, 2).unwrap();
            let mut d = Synthetic::for_spec(&spec);
            for _ in 0..2 {
                let loss = l.step(&[batch, batch], &mut d).unwrap();
                assert!(
                    loss.is_finite() && loss > 0.0,
                    "{}: loss {loss}",
                    spec.name()
                );
            }
        }
        // a GPT starts near ln(vocab) per token
        let spec = tiny_gpt();
        let mut l = Learner::new(&spec, Device::Cpu, 1e-3, 2).unwrap();
        let loss = l.step(&[8], &mut Synthetic::for_spec(&spec)).unwrap();
        assert!((loss - 50f64.ln()).abs() < 0.5, "initial loss {loss}");
    }

    /// The synthetic task is learnable: 20 steps of the default optimizer lower the loss (random
    /// labels, as before, made it climb: the quickstart's loss went from 3 to 14), and the teacher
    /// is the seed's.
    #[test]
    fn synthetic_data_is_learnable_and_seeded() {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        crate::child::configure_threads(1);
        let mlp = ModelSpec {
            architecture: Architecture::Mlp {
                input: 64,
                hidden: vec![128, 128],
                classes: 10,
            },
            optimizer: OptimizerKind::Adam,
            precision: Precision::Fp32,
        };
        for spec in [mlp.clone(), tiny_gpt()] {
            let mut l = Learner::new(&spec, Device::Cpu, 1e-3, 0).unwrap();
            let mut d = Synthetic::with_seed(&spec, 0);
            let losses: Vec<f64> = (0..20).map(|_| l.step(&[256], &mut d).unwrap()).collect();
            let first = losses[..3].iter().sum::<f64>() / 3.0;
            let last = losses[17..].iter().sum::<f64>() / 3.0;
            assert!(
                last < first * 0.95,
                "{}: loss {first:.3} → {last:.3} ({losses:?})",
                spec.name()
            );
        }
        // the same seed draws the same teacher, another seed another one
        let labels = |seed: i64| {
            tch::manual_seed(1);
            let b = Synthetic::with_seed(&mlp, seed)
                .next_batch(512, Device::Cpu)
                .unwrap();
            b.target.unwrap()
        };
        assert!(labels(3).equal(&labels(3)));
        assert!(!labels(3).equal(&labels(4)));
        // balanced enough to be a task: every class appears
        let y = labels(3);
        assert_eq!(
            y.bincount(None::<Tensor>, 10)
                .gt(0)
                .sum(Kind::Int64)
                .int64_value(&[]),
            10
        );
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

    /// An overflowed loss-scaled step (the amp-fp16 path, driven here on the CPU with a scale that
    /// overflows f32) allocates the optimizer's state but leaves the weights alone, with AdamW's weight
    /// decay too, and halves the scale; a step with a sane scale then trains.
    #[test]
    fn an_overflowed_scaled_step_moves_no_weight() {
        let _g = RNG.lock().unwrap_or_else(|e| e.into_inner());
        let adamw = ModelSpec {
            optimizer: OptimizerKind::Adamw,
            ..spec()
        };
        let mut l = Learner::new(&adamw, Device::Cpu, 1e-2, 3).unwrap();
        tch::manual_seed(5);
        let data = || Fixed {
            x: Tensor::randn([32, 16], (Kind::Float, Device::Cpu)),
            y: Tensor::randint(5, [32], (Kind::Int64, Device::Cpu)),
            pos: 0,
        };
        let weights = |l: &Learner| -> Vec<Tensor> {
            l.vs.trainable_variables()
                .iter()
                .map(|t| t.detach().copy())
                .collect()
        };
        let before = weights(&l);
        l.loss_scale = Some(LossScale {
            scale: 1e38,
            clean_steps: 0,
        });
        l.step(&[32], &mut data()).unwrap();
        assert_eq!(
            l.loss_scale.unwrap().scale,
            5e37,
            "halved after the overflow"
        );
        for (a, b) in before.iter().zip(weights(&l)) {
            assert!(a.equal(&b), "a weight moved on an overflowed step");
        }
        l.loss_scale = Some(LossScale {
            scale: 1.0,
            clean_steps: 0,
        });
        l.step(&[32], &mut data()).unwrap();
        assert_eq!(l.loss_scale.unwrap().clean_steps, 1);
        assert!(
            before.iter().zip(weights(&l)).any(|(a, b)| !a.equal(&b)),
            "a clean step trains"
        );
    }
}
