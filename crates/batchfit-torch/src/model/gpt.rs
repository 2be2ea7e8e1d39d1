//! A decoder-only transformer in the GPT-2 layout, built from an `nn::Path` (GPT-2 parameter names) with
//! fallible (`f_`) ops in the forward pass, so an out-of-memory comes back as an error.
//!
//! Token + position embeddings, `layers` pre-LayerNorm blocks (causal multi-head self-attention via
//! `scaled_dot_product_attention(is_causal)`, then a 4× MLP with tanh-GELU), a final LayerNorm and an LM
//! head tied to the token embedding, as GPT-2 (so `gpt2-small` has its 124,439,808 parameters).

use tch::{nn, Device, Kind, TchError, Tensor};

/// A pre-LayerNorm transformer block (GPT-2 names), shared with the ViT.
pub(crate) struct Block {
    ln_1: nn::LayerNorm,
    c_attn: nn::Linear,
    attn_proj: nn::Linear,
    ln_2: nn::LayerNorm,
    c_fc: nn::Linear,
    mlp_proj: nn::Linear,
}

pub struct Gpt {
    wte: nn::Embedding,
    wpe: nn::Embedding,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
    d_model: i64,
    heads: i64,
}

impl Block {
    pub(crate) fn new(b: &nn::Path, d: i64) -> Self {
        Block {
            ln_1: layer_norm(b / "ln_1", d),
            c_attn: nn::linear(b / "attn" / "c_attn", d, 3 * d, Default::default()),
            attn_proj: nn::linear(b / "attn" / "c_proj", d, d, Default::default()),
            ln_2: layer_norm(b / "ln_2", d),
            c_fc: nn::linear(b / "mlp" / "c_fc", d, 4 * d, Default::default()),
            mlp_proj: nn::linear(b / "mlp" / "c_proj", 4 * d, d, Default::default()),
        }
    }

    /// `h` of shape `[batch, tokens, d]`; attention over all tokens, or causal.
    pub(crate) fn forward(&self, h: &Tensor, heads: i64, causal: bool) -> Result<Tensor, TchError> {
        let (b, t, d) = h.size3()?;
        let hd = d / heads;
        let a = ln(h, &self.ln_1, d)?;
        let qkv = linear(&a, &self.c_attn)?;
        let parts = qkv.f_split(d, -1)?;
        let split_heads = |t_: &Tensor| -> Result<Tensor, TchError> {
            t_.f_reshape([b, t, heads, hd])?.f_transpose(1, 2)
        };
        let (q, k, v) = (
            split_heads(&parts[0])?,
            split_heads(&parts[1])?,
            split_heads(&parts[2])?,
        );
        let y = Tensor::f_scaled_dot_product_attention(
            &q,
            &k,
            &v,
            None::<Tensor>,
            0.0,
            causal,
            None,
            false,
        )?;
        let y = y.f_transpose(1, 2)?.f_reshape([b, t, d])?;
        let h = h.f_add(&linear(&y, &self.attn_proj)?)?;
        let m = ln(&h, &self.ln_2, d)?;
        let m = linear(&m, &self.c_fc)?.f_gelu("tanh")?;
        h.f_add(&linear(&m, &self.mlp_proj)?)
    }
}

pub(crate) fn layer_norm(p: nn::Path, d: i64) -> nn::LayerNorm {
    nn::layer_norm(p, vec![d], Default::default())
}

pub(crate) fn ln(x: &Tensor, l: &nn::LayerNorm, d: i64) -> Result<Tensor, TchError> {
    x.f_layer_norm([d], l.ws.as_ref(), l.bs.as_ref(), 1e-5, true)
}

pub(crate) fn linear(x: &Tensor, l: &nn::Linear) -> Result<Tensor, TchError> {
    x.f_linear(&l.ws, l.bs.as_ref())
}

impl Gpt {
    pub fn new(
        p: &nn::Path,
        layers: u64,
        d_model: u64,
        heads: u64,
        seq_len: u64,
        vocab: u64,
    ) -> Self {
        let d = d_model as i64;
        let emb = nn::EmbeddingConfig {
            ws_init: nn::Init::Randn {
                mean: 0.0,
                stdev: 0.02,
            },
            ..Default::default()
        };
        let wte = nn::embedding(p / "wte", vocab as i64, d, emb);
        let wpe = nn::embedding(p / "wpe", seq_len as i64, d, emb);
        let blocks = (0..layers).map(|i| Block::new(&(p / "h" / i), d)).collect();
        Gpt {
            wte,
            wpe,
            blocks,
            ln_f: layer_norm(p / "ln_f", d),
            d_model: d,
            heads: heads as i64,
        }
    }

    /// Logits of shape `[batch, seq, vocab]` for tokens `x` of shape `[batch, seq]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let (_, t) = x.size2()?;
        let pos = Tensor::f_arange(t, (Kind::Int64, x.device()))?;
        let tok = Tensor::f_embedding(&self.wte.ws, x, -1, false, false)?;
        let pe = Tensor::f_embedding(&self.wpe.ws, &pos, -1, false, false)?;
        let mut h = tok.f_add(&pe)?;
        for blk in &self.blocks {
            h = blk.forward(&h, self.heads, true)?;
        }
        let h = ln(&h, &self.ln_f, self.d_model)?;
        h.f_linear(&self.wte.ws, None::<Tensor>)
    }
}

/// Random tokens `[n, seq + 1]`, split into inputs (the first `seq`) and next-token targets (the last
/// `seq`).
pub fn synthetic_batch(
    n: u64,
    seq_len: i64,
    vocab: i64,
    device: Device,
) -> Result<(Tensor, Tensor), TchError> {
    let tokens = Tensor::f_randint(vocab, [n as i64, seq_len + 1], (Kind::Int64, device))?;
    let x = tokens.f_narrow(1, 0, seq_len)?;
    let y = tokens.f_narrow(1, 1, seq_len)?;
    Ok((x, y))
}
