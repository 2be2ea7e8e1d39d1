//! The MLP, built from an `nn::Path` the tch way, with fallible (`f_`) ops so an out-of-memory during
//! the forward pass comes back as an error instead of a panic.

use tch::{nn, TchError, Tensor};

pub struct Mlp {
    layers: Vec<nn::Linear>,
}

impl Mlp {
    pub fn new(p: &nn::Path, input: u64, hidden: &[u64], classes: u64) -> Self {
        let mut dims = vec![input as i64];
        dims.extend(hidden.iter().map(|&h| h as i64));
        dims.push(classes as i64);
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, w)| nn::linear(p / format!("fc{i}"), w[0], w[1], Default::default()))
            .collect();
        Mlp { layers }
    }

    /// Logits of shape `[batch, classes]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let mut h = x.shallow_clone();
        let n = self.layers.len();
        for (i, l) in self.layers.iter().enumerate() {
            h = h.f_linear(&l.ws, l.bs.as_ref())?;
            if i + 1 < n {
                h = h.f_relu()?;
            }
        }
        Ok(h)
    }
}
