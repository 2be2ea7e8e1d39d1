//! The ResNets' layout (torchvision's): stages, blocks and their convolutions, walked both by the
//! builder ([`crate::workload::model::resnet`]) and by [`parameter_count`], and the smallest image
//! they take. Arithmetic only, so the plan can count parameters without libtorch.

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
pub fn block_convs(
    bottleneck: bool,
    c_in: u64,
    width: u64,
    stride: u64,
) -> Vec<(u64, u64, u64, u64)> {
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
pub fn blocks(bottleneck: bool) -> Vec<(usize, u64, u64, u64, u64)> {
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
