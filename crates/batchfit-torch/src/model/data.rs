//! Real training data for `batchfit-train --data FILE` (`.safetensors` or `.npz`): named tensors `x`
//! (or `x0`, `x1`, … for a TorchScript model with several inputs) and `y` (targets; optional for
//! TorchScript models, where random targets are drawn as in probing). The sample dimension is the
//! first; batches are consecutive rows, wrapping around at the end.
//!
//! Shapes are checked against the model before training starts, so a mismatched file fails with a
//! message instead of a libtorch error in the middle of a step. Gradient accumulation over such data
//! gives the full batch's gradients for models without batch-coupled layers; BatchNorm (the ResNets)
//! sees each micro-batch's statistics, so its results differ slightly (see docs/models.md).

use super::step::{Batch, DataSource};
use batchfit::plan::input::{Dim, InputSpec};
use batchfit::plan::model::{Architecture, LossSpec, ModelSpec};
use std::path::Path;
use tch::{Device, Kind, TchError, Tensor};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum DataError {
    #[error("cannot read data file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("data file {path}: {reason}")]
    Shape { path: String, reason: String },
}

/// A data set held in memory.
pub struct FileData {
    inputs: Vec<Tensor>,
    target: Option<Tensor>,
    rows: i64,
    pos: i64,
}

fn read(path: &Path) -> Result<Vec<(String, Tensor)>, String> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let p = path.to_path_buf();
    // tch's readers can panic on a malformed archive: treat that as a read error.
    let r = std::panic::catch_unwind(move || match ext.as_str() {
        "safetensors" => Tensor::read_safetensors(&p).map_err(|e| e.to_string()),
        "npz" => Tensor::read_npz(&p).map_err(|e| e.to_string()),
        other => Err(format!(
            "unknown extension {other:?}: use .safetensors or .npz with tensors named x and y"
        )),
    });
    match r {
        Ok(v) => v,
        Err(payload) => Err(super::step::panic_message(payload.as_ref()).to_string()),
    }
}

impl FileData {
    /// Loads `path` and checks it against the model of `spec`.
    pub fn load(path: &Path, spec: &ModelSpec) -> Result<Self, DataError> {
        let shown = path.display().to_string();
        let shape_err = |reason: String| DataError::Shape {
            path: shown.clone(),
            reason,
        };
        check_regular_file(path, &shown)?;
        let named = read(path).map_err(|reason| DataError::Read {
            path: shown.clone(),
            reason: batchfit::protocol::classify::first_line(&reason),
        })?;
        let mut named = Named(named);
        let expected = Expected::of(spec).map_err(shape_err)?;
        let (inputs, rows) = take_inputs(&mut named, &expected).map_err(shape_err)?;
        let target = take_target(&mut named, expected.target, rows).map_err(shape_err)?;
        Ok(FileData {
            inputs,
            target,
            rows,
            pos: 0,
        })
    }

    /// Samples in the file.
    pub fn rows(&self) -> u64 {
        self.rows as u64
    }

    /// Bytes the loaded tensors hold (the whole file is in memory while training).
    pub fn bytes(&self) -> u64 {
        self.inputs
            .iter()
            .chain(self.target.as_ref())
            .map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
            .sum()
    }
}

enum TargetKind {
    /// Class ids of shape `[N, dims…]` in `[0, classes)`.
    Classes(Vec<i64>, u64),
    /// Optional class ids of any shape.
    AnyClasses(u64),
    /// Optional float targets.
    AnyFloat,
    None,
}

/// Refuses a path that is not a regular file: tch's readers open what the path names, and a FIFO
/// hung them, /dev/zero was read forever.
fn check_regular_file(path: &Path, shown: &str) -> Result<(), DataError> {
    let read_err = |reason: String| DataError::Read {
        path: shown.to_string(),
        reason,
    };
    if !path.exists() {
        return Err(read_err("no such file".into()));
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) => {
            let what = if m.is_dir() {
                "a directory"
            } else {
                batchfit::platform::files::kind_of(&m.file_type())
            };
            Err(read_err(format!("it is {what}, not a regular file")))
        }
        Err(e) => Err(read_err(e.to_string())),
    }
}

/// The tensors of a file, taken out by name.
struct Named(Vec<(String, Tensor)>);

impl Named {
    fn take(&mut self, name: &str) -> Option<Tensor> {
        let i = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.swap_remove(i).1)
    }
}

/// What the model takes: the per-sample shape of each input, whether each is integer ids, and
/// its targets.
struct Expected {
    input_shapes: Vec<Vec<i64>>,
    int_inputs: Vec<bool>,
    target: TargetKind,
}

impl Expected {
    fn of(spec: &ModelSpec) -> Result<Expected, String> {
        let (input_shapes, int_inputs, target) = match &spec.architecture {
            Architecture::Mlp { input, classes, .. } => (
                vec![vec![*input as i64]],
                vec![false],
                TargetKind::Classes(vec![], *classes),
            ),
            Architecture::Gpt { seq_len, vocab, .. } => (
                vec![vec![*seq_len as i64]],
                vec![true],
                TargetKind::Classes(vec![*seq_len as i64], *vocab),
            ),
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
            } => {
                let s = *image_size as i64;
                (
                    vec![vec![3, s, s]],
                    vec![false],
                    TargetKind::Classes(vec![], *classes),
                )
            }
            Architecture::Torchscript { inputs, loss, .. } => return Self::of_script(inputs, loss),
        };
        Ok(Expected {
            input_shapes,
            int_inputs,
            target,
        })
    }

    /// A TorchScript model's inputs as its plan declares them (each with its batch dimension
    /// first), and targets as its loss takes them.
    fn of_script(inputs: &[InputSpec], loss: &LossSpec) -> Result<Expected, String> {
        let mut input_shapes = vec![];
        for (i, spec) in inputs.iter().enumerate() {
            if !matches!(spec.dims.first(), Some(Dim::Batch(_))) {
                return Err(format!(
                    "input {i} ({spec}) has its batch dimension B not first; data files \
                         hold samples along the first dimension"
                ));
            }
            input_shapes.push(spec.shape(1)[1..].to_vec());
        }
        let target = match loss {
            LossSpec::CrossEntropy { classes } => TargetKind::AnyClasses(*classes),
            LossSpec::Mse => TargetKind::AnyFloat,
            LossSpec::Mean => TargetKind::None,
        };
        Ok(Expected {
            input_shapes,
            int_inputs: inputs.iter().map(|s| s.dtype.is_integer()).collect(),
            target,
        })
    }
}

/// The model's inputs from the file (`x`, or `x0`, `x1`, … for several), checked against their
/// expected shapes and kinds, and the number of rows they all have.
fn take_inputs(named: &mut Named, expected: &Expected) -> Result<(Vec<Tensor>, i64), String> {
    let several = expected.input_shapes.len() > 1;
    let mut inputs = vec![];
    for (i, want) in expected.input_shapes.iter().enumerate() {
        let name = if several {
            format!("x{i}")
        } else {
            "x".to_string()
        };
        let t = named
            .take(&name)
            .or_else(|| (!several).then(|| named.take("x0")).flatten())
            .ok_or_else(|| format!("no tensor named {name:?} (the model's input)"))?;
        let got = t.size();
        if got.len() != want.len() + 1 || got[1..] != want[..] {
            return Err(format!(
                "{name} has shape {got:?}; the model needs [N, {}]",
                want.iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let int = expected.int_inputs[i];
        if int && t.is_floating_point() {
            return Err(format!("{name} holds floats; the model takes integer ids"));
        }
        inputs.push(t.to_kind(if int { Kind::Int64 } else { Kind::Float }));
    }
    let rows = inputs[0].size()[0];
    if rows == 0 {
        return Err("x has no rows".into());
    }
    if let Some((i, t)) = inputs.iter().enumerate().find(|(_, t)| t.size()[0] != rows) {
        return Err(format!("x{i} has {} rows but x0 has {rows}", t.size()[0]));
    }
    Ok((inputs, rows))
}

/// The targets from the file (`y`), checked against what the model takes and the inputs' `rows`;
/// none where the model takes none, or may do without and the file has none.
fn take_target(named: &mut Named, kind: TargetKind, rows: i64) -> Result<Option<Tensor>, String> {
    let target = match (kind, named.take("y")) {
        (TargetKind::None, _) => None,
        (TargetKind::AnyFloat, None) | (TargetKind::AnyClasses(_), None) => None,
        (TargetKind::Classes(..), None) => return Err("no tensor named \"y\" (the targets)".into()),
        (TargetKind::AnyFloat, Some(y)) => Some(y.to_kind(Kind::Float)),
        (TargetKind::Classes(dims, classes), Some(y)) => {
            let got = y.size();
            if got.len() != dims.len() + 1 || got[1..] != dims[..] {
                return Err(format!(
                    "y has shape {got:?}; the model needs [N{}]",
                    dims.iter().map(|d| format!(", {d}")).collect::<String>()
                ));
            }
            Some(check_classes(y, classes)?)
        }
        (TargetKind::AnyClasses(classes), Some(y)) => Some(check_classes(y, classes)?),
    };
    if let Some(y) = &target {
        if y.size().first().copied() != Some(rows) {
            return Err(format!(
                "y has {} rows but x has {rows}",
                y.size().first().copied().unwrap_or(0)
            ));
        }
    }
    Ok(target)
}

fn check_classes(y: Tensor, classes: u64) -> Result<Tensor, String> {
    if y.is_floating_point() {
        return Err("y holds floats; class targets must be integers".into());
    }
    let y = y.to_kind(Kind::Int64);
    if y.numel() > 0 {
        let (lo, hi) = (i64::try_from(y.min()), i64::try_from(y.max()));
        if let (Ok(lo), Ok(hi)) = (lo, hi) {
            if lo < 0 || hi >= classes as i64 {
                return Err(format!(
                    "y holds classes {lo}..={hi}, outside [0, {classes}) of the model"
                ));
            }
        }
    }
    Ok(y)
}

impl DataSource for FileData {
    fn next_batch(&mut self, n: u64, device: Device) -> Result<Batch, TchError> {
        let idx =
            Tensor::f_arange_start(self.pos, self.pos + n as i64, (Kind::Int64, Device::Cpu))?
                .f_remainder(self.rows)?;
        self.pos = (self.pos + n as i64) % self.rows;
        let pick = |t: &Tensor| t.f_index_select(0, &idx)?.f_to_device(device);
        Ok(Batch {
            inputs: self.inputs.iter().map(pick).collect::<Result<_, _>>()?,
            target: self.target.as_ref().map(pick).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfit::plan::model::OptimizerKind;

    fn mlp(input: u64, classes: u64) -> ModelSpec {
        ModelSpec {
            architecture: Architecture::Mlp {
                input,
                hidden: vec![8],
                classes,
            },
            optimizer: OptimizerKind::Sgd,
            precision: Default::default(),
        }
    }

    /// `batchfit-train --data` of a FIFO hung in tch's reader, of a link to /dev/zero read
    /// forever; a directory said `Invalid argument`. Each is refused at once, naming what it is.
    #[test]
    fn data_that_is_not_a_regular_file_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("d.npz");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let zero = dir.path().join("z.safetensors");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let sub = dir.path().join("s.npz");
        std::fs::create_dir(&sub).unwrap();
        // the directory first: without the check it fails at once (the others hang or eat memory)
        for (p, what) in [
            (&sub, "a directory"),
            (&fifo, "a FIFO"),
            (&zero, "a character device"),
        ] {
            let e = FileData::load(p, &mlp(4, 3)).err().unwrap().to_string();
            assert!(
                e.contains(&format!("it is {what}, not a regular file")),
                "{e}"
            );
        }
    }

    #[test]
    fn loads_checks_and_wraps() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("d.safetensors");
        let x = Tensor::arange(10 * 4, (Kind::Float, Device::Cpu)).reshape([10, 4]);
        let y = Tensor::arange(10, (Kind::Int64, Device::Cpu)).remainder(3);
        Tensor::write_safetensors(&[("x", &x), ("y", &y)], &f).unwrap();
        let mut d = FileData::load(&f, &mlp(4, 3)).unwrap();
        assert_eq!(d.rows(), 10);
        let b = d.next_batch(4, Device::Cpu).unwrap();
        assert_eq!(b.inputs[0].size(), vec![4, 4]);
        let b = d.next_batch(8, Device::Cpu).unwrap(); // rows 4..10, then 0, 1
        let first: Vec<f64> = Vec::try_from(b.inputs[0].select(1, 0)).unwrap();
        assert_eq!(first, vec![16.0, 20.0, 24.0, 28.0, 32.0, 36.0, 0.0, 4.0]);
        // wrong shapes and classes are named
        let e = FileData::load(&f, &mlp(5, 3)).err().unwrap().to_string();
        assert!(e.contains("[N, 5]"), "{e}");
        let e = FileData::load(&f, &mlp(4, 2)).err().unwrap().to_string();
        assert!(e.contains("outside [0, 2)"), "{e}");
        // npz works too; a missing y is named
        let g = dir.path().join("d.npz");
        Tensor::write_npz(&[("x", &x)], &g).unwrap();
        let e = FileData::load(&g, &mlp(4, 3)).err().unwrap().to_string();
        assert!(e.contains("\"y\""), "{e}");
        // garbage and unknown extensions
        let h = dir.path().join("bad.npz");
        std::fs::write(&h, b"not a zip").unwrap();
        assert!(matches!(
            FileData::load(&h, &mlp(4, 3)),
            Err(DataError::Read { .. })
        ));
        let e = FileData::load(&dir.path().join("d.csv"), &mlp(4, 3));
        assert!(e.is_err());
        std::fs::write(dir.path().join("d.csv"), b"1,2").unwrap();
        let e = FileData::load(&dir.path().join("d.csv"), &mlp(4, 3))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(".safetensors or .npz"), "{e}");
    }
}
