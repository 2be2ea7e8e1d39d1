//! ResNet-18 and ResNet-50 (torchvision layout and parameter names), built from an `nn::Path`, with
//! fallible (`f_`) ops in the forward pass so an out-of-memory comes back as an error. BatchNorm runs in
//! train mode (batch statistics, running averages updated), as in training.

use tch::{nn, Device, Kind, TchError, Tensor};

use batchfit::plan::model::resnet::{block_convs, blocks};

struct ConvBn {
    w: Tensor,
    bn: nn::BatchNorm,
    stride: i64,
    pad: i64,
}

impl ConvBn {
    fn new(conv: nn::Path, bn: nn::Path, (ci, co, k, stride): (u64, u64, u64, u64)) -> Self {
        let cfg = nn::ConvConfig {
            stride: stride as i64,
            padding: (k / 2) as i64,
            bias: false,
            ..Default::default()
        };
        let c = nn::conv2d(conv, ci as i64, co as i64, k as i64, cfg);
        ConvBn {
            w: c.ws,
            bn: nn::batch_norm2d(bn, co as i64, Default::default()),
            stride: stride as i64,
            pad: (k / 2) as i64,
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let y = x.f_conv2d(
            &self.w,
            None::<Tensor>,
            [self.stride, self.stride],
            [self.pad, self.pad],
            [1, 1],
            1,
        )?;
        y.f_batch_norm(
            self.bn.ws.as_ref(),
            self.bn.bs.as_ref(),
            Some(&self.bn.running_mean),
            Some(&self.bn.running_var),
            true,
            0.1,
            1e-5,
            true,
        )
    }
}

struct Block {
    convs: Vec<ConvBn>,
    downsample: Option<ConvBn>,
}

pub struct Resnet {
    stem: ConvBn,
    blocks: Vec<Block>,
    fc: nn::Linear,
}

impl Resnet {
    pub fn new(p: &nn::Path, bottleneck: bool, classes: u64) -> Self {
        let stem = ConvBn::new(p / "conv1", p / "bn1", (3, 64, 7, 2));
        let blocks = blocks(bottleneck)
            .into_iter()
            .map(|(s, i, c_in, w, stride)| {
                let b = p / format!("layer{}", s + 1) / i;
                let mut specs = block_convs(bottleneck, c_in, w, stride);
                let n_main = if bottleneck { 3 } else { 2 };
                let downsample = (specs.len() > n_main).then(|| {
                    let d = &b / "downsample";
                    ConvBn::new(&d / "0", &d / "1", specs.pop().expect("downsample conv"))
                });
                let convs = specs
                    .into_iter()
                    .enumerate()
                    .map(|(j, spec)| {
                        ConvBn::new(
                            &b / format!("conv{}", j + 1),
                            &b / format!("bn{}", j + 1),
                            spec,
                        )
                    })
                    .collect();
                Block { convs, downsample }
            })
            .collect();
        let features = if bottleneck { 2048 } else { 512 };
        let fc = nn::linear(p / "fc", features, classes as i64, Default::default());
        Resnet { stem, blocks, fc }
    }

    /// Logits `[batch, classes]` for images `[batch, 3, H, W]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let mut h =
            self.stem
                .forward(x)?
                .f_relu()?
                .f_max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)?;
        for b in &self.blocks {
            let mut y = h.shallow_clone();
            let n = b.convs.len();
            for (j, c) in b.convs.iter().enumerate() {
                y = c.forward(&y)?;
                if j + 1 < n {
                    y = y.f_relu()?;
                }
            }
            let skip = match &b.downsample {
                Some(d) => d.forward(&h)?,
                None => h,
            };
            h = y.f_add(&skip)?.f_relu()?;
        }
        let h = h.f_adaptive_avg_pool2d([1, 1])?.f_flatten(1, -1)?;
        h.f_linear(&self.fc.ws, self.fc.bs.as_ref())
    }
}

/// Random images `[n, 3, size, size]` and class labels.
pub fn synthetic_batch(
    n: u64,
    size: i64,
    classes: i64,
    device: Device,
) -> Result<(Tensor, Tensor), TchError> {
    let x = Tensor::f_randn([n as i64, 3, size, size], (Kind::Float, device))?;
    let y = Tensor::f_randint(classes, [n as i64], (Kind::Int64, device))?;
    Ok((x, y))
}
