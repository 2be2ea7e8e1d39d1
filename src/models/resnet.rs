//! ResNet-18 and ResNet-50 (torchvision layout and parameter names), built from an `nn::Path`, with
//! fallible (`f_`) ops in the forward pass so an out-of-memory comes back as an error. BatchNorm runs in
//! train mode (batch statistics, running averages updated), as in training.

use tch::{nn, Device, Kind, TchError, Tensor};

/// Blocks per stage and whether the blocks are bottlenecks (expansion 4).
fn stages(bottleneck: bool) -> [u64; 4] {
    if bottleneck {
        [3, 4, 6, 3]
    } else {
        [2, 2, 2, 2]
    }
}

const WIDTHS: [u64; 4] = [64, 128, 256, 512];

/// The convolutions of one block as `(c_in, c_out, kernel, stride)`, in order, with the downsample
/// convolution last when there is one. The single source of the architecture: both the builder and
/// [`parameter_count`] walk it.
fn block_convs(bottleneck: bool, c_in: u64, width: u64, stride: u64) -> Vec<(u64, u64, u64, u64)> {
    let out = if bottleneck { width * 4 } else { width };
    let mut v = if bottleneck {
        vec![
            (c_in, width, 1, 1),
            (width, width, 3, stride),
            (width, out, 1, 1),
        ]
    } else {
        vec![(c_in, width, 3, stride), (width, width, 3, 1)]
    };
    if stride != 1 || c_in != out {
        v.push((c_in, out, 1, stride));
    }
    v
}

/// Every block as `(stage, index, c_in, width, stride)`.
fn blocks(bottleneck: bool) -> Vec<(usize, u64, u64, u64, u64)> {
    let expansion = if bottleneck { 4 } else { 1 };
    let mut c_in = 64;
    let mut v = vec![];
    for (s, (&n, &w)) in stages(bottleneck).iter().zip(WIDTHS.iter()).enumerate() {
        for i in 0..n {
            let stride = if s > 0 && i == 0 { 2 } else { 1 };
            v.push((s, i, c_in, w, stride));
            c_in = w * expansion;
        }
    }
    v
}

/// Trainable parameters: convolutions (no bias), BatchNorm weight and bias, the classifier.
pub fn parameter_count(bottleneck: bool, classes: u64) -> u64 {
    let conv_bn = |ci: u64, co: u64, k: u64| ci * co * k * k + 2 * co;
    let mut n = conv_bn(3, 64, 7);
    for (_, _, c_in, w, stride) in blocks(bottleneck) {
        n += block_convs(bottleneck, c_in, w, stride)
            .iter()
            .map(|&(ci, co, k, _)| conv_bn(ci, co, k))
            .sum::<u64>();
    }
    let features = if bottleneck { 2048 } else { 512 };
    n + features * classes + classes
}

/// Output side of a convolution or pooling.
fn out_size(s: u64, k: u64, stride: u64, pad: u64) -> u64 {
    (s + 2 * pad).saturating_sub(k) / stride + 1
}

/// Side of the last stage's feature map for an input of side `s`.
pub fn final_size(s: u64) -> u64 {
    let mut s = out_size(s, 7, 2, 3); // stem conv
    s = out_size(s, 3, 2, 1); // max pool
    for _ in 0..3 {
        s = out_size(s, 3, 2, 1); // first block of stages 2-4
    }
    s
}

/// The smallest image side whose last feature map is at least 2×2 (BatchNorm in train mode needs more
/// than one value per channel, and batch 1 must be able to run).
pub fn min_image_size() -> u64 {
    (1..)
        .find(|&s| final_size(s) >= 2)
        .expect("some size works")
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(final_size(224), 7);
        assert_eq!(final_size(32), 1);
        assert_eq!(final_size(min_image_size()), 2);
        assert_eq!(final_size(min_image_size() - 1), 1);
        // torchvision's counts
        assert_eq!(parameter_count(false, 1000), 11_689_512);
        assert_eq!(parameter_count(true, 1000), 25_557_032);
    }
}
