//! A Vision Transformer in the ViT-B/16 layout (86,567,656 parameters, as torchvision's `vit_b_16`),
//! built from an `nn::Path` with fallible (`f_`) ops, so an out-of-memory comes back as an error.
//!
//! Patches are embedded by a `patch`×`patch` convolution of stride `patch`; a learned class token is
//! prepended and learned position embeddings added; the transformer blocks are the GPT's (pre-LayerNorm,
//! 4× GELU MLP) with bidirectional attention; the head reads the class token after a final LayerNorm.
//! Attention memory grows with the square of `(image_size / patch)² + 1` tokens.

use super::gpt::{layer_norm, linear, ln, Block};
use tch::{nn, TchError, Tensor};

pub struct Vit {
    patch_embed: nn::Conv2D,
    cls_token: Tensor,
    pos_embed: Tensor,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
    head: nn::Linear,
    d_model: i64,
    heads: i64,
    patch: i64,
}

impl Vit {
    pub fn new(
        p: &nn::Path,
        layers: u64,
        d_model: u64,
        heads: u64,
        patch: u64,
        image_size: u64,
        classes: u64,
    ) -> Self {
        let d = d_model as i64;
        let tokens = (image_size / patch).pow(2) as i64 + 1;
        let conv = nn::ConvConfig {
            stride: patch as i64,
            ..Default::default()
        };
        let small = nn::Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        Vit {
            patch_embed: nn::conv2d(p / "conv_proj", 3, d, patch as i64, conv),
            cls_token: p.var("class_token", &[1, 1, d], nn::Init::Const(0.0)),
            pos_embed: p.var("pos_embedding", &[1, tokens, d], small),
            blocks: (0..layers)
                .map(|i| Block::new(&(p / "layers" / i), d))
                .collect(),
            ln_f: layer_norm(p / "ln", d),
            head: nn::linear(p / "head", d, classes as i64, Default::default()),
            d_model: d,
            heads: heads as i64,
            patch: patch as i64,
        }
    }

    /// Logits `[batch, classes]` for images `[batch, 3, H, W]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let b = x.size()[0];
        let d = self.d_model;
        let e = x.f_conv2d(
            &self.patch_embed.ws,
            self.patch_embed.bs.as_ref(),
            [self.patch, self.patch],
            [0, 0],
            [1, 1],
            1,
        )?;
        // [b, d, h/p, w/p] → [b, tokens-1, d]
        let e = e.f_flatten(2, -1)?.f_transpose(1, 2)?;
        let cls = self.cls_token.f_expand([b, 1, d], false)?;
        let mut h = Tensor::f_cat(&[cls, e], 1)?.f_add(&self.pos_embed)?;
        for blk in &self.blocks {
            h = blk.forward(&h, self.heads, false)?;
        }
        let h = ln(&h, &self.ln_f, d)?;
        let cls = h.f_select(1, 0)?;
        linear(&cls, &self.head)
    }
}
