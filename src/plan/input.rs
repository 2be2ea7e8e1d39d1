//! Input and loss specs of TorchScript models: user input, so every malformed spec gets an error that
//! says what is wrong and what the notation is, before any backend work.
//!
//! An input spec is `DTYPE[DIMS]` with an optional `<HIGH` for integer inputs: `f32[B,3,224,224]`,
//! `i64[B,1024]<50257` (token ids in `[0, 50257)`). Exactly one dimension is `B`, the batch dimension;
//! the others are positive integers. A loss spec is `cross-entropy:NUM_CLASSES`, `mse` or `mean`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Element type of an input tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputDtype {
    F32,
    F64,
    F16,
    Bf16,
    I64,
    I32,
    U8,
}

impl InputDtype {
    pub const ALL: [(&'static str, InputDtype); 7] = [
        ("f32", InputDtype::F32),
        ("f64", InputDtype::F64),
        ("f16", InputDtype::F16),
        ("bf16", InputDtype::Bf16),
        ("i64", InputDtype::I64),
        ("i32", InputDtype::I32),
        ("u8", InputDtype::U8),
    ];

    pub fn as_str(self) -> &'static str {
        InputDtype::ALL
            .iter()
            .find(|(_, d)| *d == self)
            .map(|(n, _)| *n)
            .expect("every dtype is listed")
    }

    pub fn is_integer(self) -> bool {
        matches!(self, InputDtype::I64 | InputDtype::I32 | InputDtype::U8)
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            InputDtype::F64 | InputDtype::I64 => 8,
            InputDtype::F32 | InputDtype::I32 => 4,
            InputDtype::F16 | InputDtype::Bf16 => 2,
            InputDtype::U8 => 1,
        }
    }
}

/// One dimension: the batch (`B`) or a fixed size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    Fixed(u64),
    Batch(BatchMarker),
}

/// Serialises as the string `"B"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchMarker {
    B,
}

/// A model input: dtype, shape with one batch dimension, and for integers the exclusive upper bound of
/// the random values (synthetic data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSpec {
    pub dtype: InputDtype,
    pub dims: Vec<Dim>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high: Option<u64>,
}

/// Largest dimension or `<HIGH` accepted (libtorch sizes are i64; anything near that is a typo).
const MAX_DIM: u64 = 1 << 40;
/// Largest number of elements of one sample (2^40: a terabyte of u8 per sample is surely a typo).
const MAX_SAMPLE_ELEMENTS: u64 = 1 << 40;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad input spec {spec:?}: {reason} (expected DTYPE[DIMS] like f32[B,3,224,224] or i64[B,1024]<50257; dtypes: f32 f64 f16 bf16 i64 i32 u8; B marks the batch dimension, once)")]
pub struct InputSpecError {
    pub spec: String,
    pub reason: String,
}

impl FromStr for InputSpec {
    type Err = InputSpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let fail = |reason: String| InputSpecError {
            spec: spec.to_string(),
            reason,
        };
        let s = spec.trim();
        if s.is_empty() {
            return Err(fail("it is empty".into()));
        }
        let open = s
            .find('[')
            .ok_or_else(|| fail("no '[' before the dimensions".into()))?;
        let dtype = parse_dtype(s[..open].trim()).map_err(fail)?;
        let rest = &s[open + 1..];
        let close = rest
            .find(']')
            .ok_or_else(|| fail("no ']' after the dimensions".into()))?;
        let dims = parse_dims(&rest[..close]).map_err(fail)?;
        let high = parse_high(rest[close + 1..].trim(), dtype).map_err(fail)?;
        Ok(InputSpec { dtype, dims, high })
    }
}

/// The dtype before the `[`, by name, in any case.
fn parse_dtype(name: &str) -> Result<InputDtype, String> {
    InputDtype::ALL
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            if name.is_empty() {
                "the dtype is missing".into()
            } else {
                format!("unknown dtype {name:?}")
            }
        })
}

/// The dimensions between the brackets: positive numbers and one `B`, with one sample at most
/// [`MAX_SAMPLE_ELEMENTS`] elements.
fn parse_dims(body: &str) -> Result<Vec<Dim>, String> {
    if body.trim().is_empty() {
        return Err("no dimensions between the brackets".into());
    }
    let mut dims = vec![];
    let mut elements: u64 = 1;
    for (i, d) in body.split(',').map(str::trim).enumerate() {
        if d.eq_ignore_ascii_case("b") {
            if dims.iter().any(|x| matches!(x, Dim::Batch(_))) {
                return Err("B appears more than once".into());
            }
            dims.push(Dim::Batch(BatchMarker::B));
            continue;
        }
        let n = parse_dim(i + 1, d)?;
        elements = elements
            .checked_mul(n)
            .filter(|e| *e <= MAX_SAMPLE_ELEMENTS)
            .ok_or_else(|| "one sample has too many elements".to_string())?;
        dims.push(Dim::Fixed(n));
    }
    if !dims.iter().any(|x| matches!(x, Dim::Batch(_))) {
        return Err("no B (batch) dimension".into());
    }
    Ok(dims)
}

/// One fixed dimension (`pos`, counted from 1, names it): a number from 1 to [`MAX_DIM`].
fn parse_dim(pos: usize, d: &str) -> Result<u64, String> {
    if d.is_empty() {
        return Err(format!("dimension {pos} is empty"));
    }
    if d.starts_with('-') {
        return Err(format!("dimension {pos} ({d}) is negative"));
    }
    let n: u64 = d
        .parse()
        .map_err(|_| format!("dimension {pos} ({d:?}) is not a number or B"))?;
    if n == 0 {
        return Err(format!("dimension {pos} is 0"));
    }
    if n > MAX_DIM {
        return Err(format!("dimension {pos} ({n}) is too large"));
    }
    Ok(n)
}

/// What follows the `]`: an integer input's exclusive upper bound `<HIGH` (required, and within
/// what its dtype holds); nothing for a float input.
fn parse_high(tail: &str, dtype: InputDtype) -> Result<Option<u64>, String> {
    if tail.is_empty() {
        if dtype.is_integer() {
            return Err(format!(
                "an integer input needs its value range: {}[…]<HIGH (values in [0, HIGH))",
                dtype.as_str()
            ));
        }
        return Ok(None);
    }
    let Some(h) = tail.strip_prefix('<') else {
        return Err(format!("unexpected {tail:?} after ']'"));
    };
    let h = h.trim();
    if !dtype.is_integer() {
        return Err(format!(
            "a value range (<{h}) is only for integer dtypes, not {}",
            dtype.as_str()
        ));
    }
    if h.is_empty() {
        return Err("nothing after '<' (give the exclusive upper bound)".into());
    }
    if h.starts_with('-') {
        return Err(format!("the upper bound {h} is negative"));
    }
    let n: u64 = h
        .parse()
        .map_err(|_| format!("the upper bound {h:?} is not a whole number"))?;
    if n == 0 {
        return Err("the upper bound is 0: no value lies in [0, 0)".into());
    }
    let cap = match dtype {
        InputDtype::U8 => 256,
        InputDtype::I32 => 1 << 31,
        _ => MAX_DIM,
    };
    if n > cap {
        return Err(format!(
            "the upper bound {n} does not fit {}",
            dtype.as_str()
        ));
    }
    Ok(Some(n))
}

impl fmt::Display for InputSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self
            .dims
            .iter()
            .map(|d| match d {
                Dim::Batch(_) => "B".to_string(),
                Dim::Fixed(n) => n.to_string(),
            })
            .collect();
        write!(f, "{}[{}]", self.dtype.as_str(), dims.join(","))?;
        if let Some(h) = self.high {
            write!(f, "<{h}")?;
        }
        Ok(())
    }
}

impl InputSpec {
    /// The shape for a batch of `n` (the `B` dimension replaced).
    pub fn shape(&self, n: u64) -> Vec<i64> {
        self.dims
            .iter()
            .map(|d| match d {
                Dim::Batch(_) => n as i64,
                Dim::Fixed(k) => *k as i64,
            })
            .collect()
    }

    /// Index of the batch dimension.
    pub fn batch_axis(&self) -> usize {
        self.dims
            .iter()
            .position(|d| matches!(d, Dim::Batch(_)))
            .expect("validated: one B")
    }

    /// Elements of one sample (the product of the fixed dimensions).
    pub fn sample_elements(&self) -> u64 {
        self.dims
            .iter()
            .map(|d| match d {
                Dim::Batch(_) => 1,
                Dim::Fixed(k) => *k,
            })
            .product()
    }

    /// Checks a deserialised spec (plans are user input too) the way the parser does.
    pub fn check(&self) -> Result<(), InputSpecError> {
        let back: InputSpec = self.to_string().parse()?;
        if &back != self {
            return Err(InputSpecError {
                spec: self.to_string(),
                reason: "it does not round-trip".into(),
            });
        }
        Ok(())
    }
}

/// How the loss of a TorchScript model's output is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum LossSpec {
    /// Output `[B, …, classes]` as logits; targets are class ids (random for synthetic data). One loss
    /// term per position (every dimension but the batch and the last).
    CrossEntropy { classes: u64 },
    /// Mean squared error against a target of the output's shape.
    Mse,
    /// The mean of the output (a model that computes its own loss per sample).
    Mean,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad --loss {spec:?}: {reason} (expected cross-entropy:NUM_CLASSES, mse or mean)")]
pub struct LossSpecError {
    pub spec: String,
    pub reason: String,
}

impl FromStr for LossSpec {
    type Err = LossSpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let fail = |reason: &str| LossSpecError {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let s = spec.trim();
        match s {
            "mse" => return Ok(LossSpec::Mse),
            "mean" => return Ok(LossSpec::Mean),
            "cross-entropy" | "ce" => {
                return Err(fail("cross-entropy needs the number of classes"))
            }
            _ => {}
        }
        let n = s
            .strip_prefix("cross-entropy:")
            .or_else(|| s.strip_prefix("ce:"))
            .ok_or_else(|| fail("unknown loss"))?;
        let classes: u64 = n
            .trim()
            .parse()
            .map_err(|_| fail("the number of classes is not a whole number"))?;
        if !(2..1 << 31).contains(&classes) {
            return Err(fail("the number of classes must be between 2 and 2^31"));
        }
        Ok(LossSpec::CrossEntropy { classes })
    }
}

impl fmt::Display for LossSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossSpec::CrossEntropy { classes } => write!(f, "cross-entropy:{classes}"),
            LossSpec::Mse => f.write_str("mse"),
            LossSpec::Mean => f.write_str("mean"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> Result<InputSpec, InputSpecError> {
        s.parse()
    }

    #[test]
    fn parses_examples() {
        let x = p("f32[B,3,224,224]").unwrap();
        assert_eq!(x.dtype, InputDtype::F32);
        assert_eq!(x.shape(8), vec![8, 3, 224, 224]);
        assert_eq!(x.sample_elements(), 3 * 224 * 224);
        assert_eq!(x.batch_axis(), 0);
        let t = p("i64[B,1024]<50257").unwrap();
        assert_eq!(t.high, Some(50257));
        assert_eq!(t.to_string(), "i64[B,1024]<50257");
        let s = p(" bf16[ 16 , B ] ").unwrap();
        assert_eq!(s.batch_axis(), 1);
        assert_eq!(s.shape(2), vec![16, 2]);
        assert_eq!(p("u8[B]<256").unwrap().shape(5), vec![5]);
        // JSON form is plain
        let j = serde_json::to_value(&t).unwrap();
        assert_eq!(
            j,
            serde_json::json!({"dtype": "i64", "dims": ["B", 1024], "high": 50257})
        );
        let back: InputSpec = serde_json::from_value(j).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn rejects_every_malformed_spec_with_a_reason() {
        for (spec, reason) in [
            ("", "empty"),
            ("f32", "no '['"),
            ("[B,3]", "dtype is missing"),
            ("float[B,3]", "unknown dtype"),
            ("f32[B,3", "no ']'"),
            ("f32[]", "no dimensions"),
            ("f32[3,4]", "no B"),
            ("f32[B,B]", "more than once"),
            ("f32[B,0]", "is 0"),
            ("f32[B,-3]", "negative"),
            ("f32[B,x]", "not a number"),
            ("f32[B,,3]", "empty"),
            ("f32[B,3]junk", "unexpected"),
            ("f32[B,3]<10", "only for integer"),
            ("i64[B,3]<", "nothing after"),
            ("i64[B,3]", "needs its value range"),
            ("i64[B,3]<0", "is 0"),
            ("i64[B,3]<-5", "negative"),
            ("i64[B,3]<1.5", "not a whole number"),
            ("u8[B,3]<300", "does not fit"),
            ("f32[B,99999999999999]", "too large"),
            ("f32[B,1048576,1048576,2]", "too many elements"),
        ] {
            let e = p(spec).expect_err(spec);
            assert!(
                e.reason.contains(reason),
                "{spec:?}: {e} (wanted {reason:?})"
            );
            assert!(e.to_string().contains("f32[B,3,224,224]"), "{e}");
        }
    }

    #[test]
    fn loss_specs() {
        assert_eq!(
            "cross-entropy:10".parse::<LossSpec>().unwrap(),
            LossSpec::CrossEntropy { classes: 10 }
        );
        assert_eq!("mse".parse::<LossSpec>().unwrap(), LossSpec::Mse);
        assert_eq!("mean".parse::<LossSpec>().unwrap(), LossSpec::Mean);
        for bad in [
            "",
            "cross-entropy",
            "cross-entropy:1",
            "cross-entropy:x",
            "l1",
        ] {
            let e = bad.parse::<LossSpec>().unwrap_err();
            assert!(e.to_string().contains("cross-entropy:NUM_CLASSES"), "{e}");
        }
        assert_eq!(
            LossSpec::CrossEntropy { classes: 7 }.to_string(),
            "cross-entropy:7"
        );
    }

    fn dtype() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec!["f32", "f64", "f16", "bf16", "i64", "i32", "u8"])
    }

    proptest! {
        /// Any string: the parser returns Ok or a reasoned error, never panics; an Ok spec has exactly
        /// one batch dimension, positive fixed dimensions and round-trips through Display.
        #[test]
        fn never_panics_and_ok_specs_are_sound(s in ".{0,40}") {
            if let Ok(spec) = p(&s) {
                prop_assert_eq!(spec.dims.iter().filter(|d| matches!(d, Dim::Batch(_))).count(), 1);
                prop_assert!(spec.dims.iter().all(|d| !matches!(d, Dim::Fixed(0))));
                prop_assert_eq!(p(&spec.to_string()).unwrap(), spec.clone());
                spec.check().unwrap();
            }
        }

        /// Well-formed specs parse to what they say.
        #[test]
        fn well_formed_specs_parse(d in dtype(), before in prop::collection::vec(1u64..1000, 0..3),
                                   after in prop::collection::vec(1u64..1000, 0..2), high in 1u64..200) {
            // at most 4 fixed dimensions below 1000: under the 2^40-element cap
            let mut dims: Vec<String> = before.iter().map(u64::to_string).collect();
            dims.push("B".into());
            dims.extend(after.iter().map(u64::to_string));
            let integer = ["i64", "i32", "u8"].contains(&d);
            let s = format!("{d}[{}]{}", dims.join(","), if integer { format!("<{high}") } else { String::new() });
            let spec = p(&s).unwrap();
            prop_assert_eq!(spec.batch_axis(), before.len());
            prop_assert_eq!(spec.shape(7)[before.len()], 7);
            prop_assert_eq!(spec.high, integer.then_some(high));
            prop_assert_eq!(spec.to_string(), s);
        }

        /// Any string given to --loss: Ok or a reasoned error.
        #[test]
        fn loss_never_panics(s in ".{0,24}") {
            let _ = s.parse::<LossSpec>();
        }
    }
}
