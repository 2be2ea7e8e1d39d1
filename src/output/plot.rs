//! `--plot FILE.svg|FILE.png`: a picture of a plan, for people.
//!
//! The plan's JSON says *what* fits; the picture shows *why* one can believe it: every trial's
//! measured peak against the batch size, the limit the search worked under and the budget before the
//! safety margin, a least-squares line through the fitting trials (memory is close to linear in the
//! batch, so a point far off the line is worth a look: a late allocation, a fragmentation jump), the
//! trials that ran out of memory, and the recommended micro-batch. A second panel shows samples/s of
//! the fitting trials, to see whether the largest size is also worth it.
//!
//! Drawn with `plotters`: SVG through its SVG backend, PNG through its bitmap backend, encoded in
//! memory with `png`. Text in PNGs is rasterised with `ab_glyph` from DejaVu Sans, embedded in the
//! binary (`assets/fonts/`, Bitstream Vera licence), so a PNG renders the same on a machine without
//! fontconfig or any system font; [`glyph_text::GlyphText`] draws that text itself, because plotters
//! 0.3.7's ab_glyph text drops each glyph's side bearing ("1024" came out as "1 024").
//!
//! Like the plan, the image is written atomically (a temporary file in the same directory, then a
//! rename): a failure never leaves half an image. The format and the directory are checked before any
//! trial runs ([`check_target`], from `config::validate`).

use crate::plan::throughput;
use crate::plan::{Plan, Status};
use crate::platform::files::{self, FileError};
use crate::platform::units::format_size;
use crate::protocol::TrialOutcome;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters_backend::text_anchor::{HPos, Pos, VPos};
use std::path::{Path, PathBuf};
use std::sync::Once;
use thiserror::Error;

mod sweep;

/// Image size in pixels (both formats); a `--sweep` adds its panel below ([`sweep::extra_height`]).
pub const WIDTH: u32 = 1200;
pub const HEIGHT: u32 = 1100;

const FONT: &str = "sans-serif";
const FIT: RGBColor = RGBColor(0x1F, 0x77, 0xB4);
const OOM: RGBColor = RGBColor(0xD6, 0x27, 0x28);
const FAILED: RGBColor = RGBColor(0xFF, 0x7F, 0x0E);
const LINE: RGBColor = RGBColor(0x17, 0x9C, 0xD0);
const LIMIT: RGBColor = RGBColor(0x22, 0x22, 0x22);
const BUDGET: RGBColor = RGBColor(0x80, 0x80, 0x80);
const RECOMMENDED: RGBColor = RGBColor(0x2C, 0xA0, 0x2C);
const SPEED: RGBColor = RGBColor(0x94, 0x67, 0xBD);
const FASTEST: RGBColor = RGBColor(0xE3, 0x77, 0xC2);

#[derive(Debug, Error)]
pub enum PlotError {
    /// The file name or its directory cannot be used (a usage error: exit 2).
    #[error("{0}")]
    Target(String),
    #[error("cannot draw the plot {path}: {detail}")]
    Draw { path: PathBuf, detail: String },
    #[error("cannot write the plot: {0}")]
    Write(#[from] FileError),
}

/// The image format, from the file name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotFormat {
    Svg,
    Png,
}

impl PlotFormat {
    pub fn of(path: &Path) -> Result<PlotFormat, PlotError> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("svg") => Ok(PlotFormat::Svg),
            Some("png") => Ok(PlotFormat::Png),
            Some(other) => Err(PlotError::Target(format!(
                "--plot {}: cannot draw a .{other} image; give a file name ending in .svg or .png",
                path.display()
            ))),
            None => Err(PlotError::Target(format!(
                "--plot {}: no image format in the name; give a file name ending in .svg or .png",
                path.display()
            ))),
        }
    }
}

/// Checks, before any trial runs, that `--plot path` names a format we draw and can be written
/// (the one writer's checks, [`files::check_target`]).
pub fn check_target(path: &Path) -> Result<PlotFormat, PlotError> {
    let format = PlotFormat::of(path)?;
    files::check_target(path).map_err(|e| PlotError::Target(format!("--plot: {e}")))?;
    Ok(format)
}

/// The batch-size axis: linear, or logarithmic so that small sizes (a guided search tries 1 and 16
/// before thousands) are not squashed against zero (`--plot-scale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    #[default]
    Linear,
    Log,
}

/// Draws `plan` into `path` (SVG or PNG by the extension), atomically, on a linear batch axis.
pub fn render(plan: &Plan, path: &Path) -> Result<(), PlotError> {
    render_scaled(plan, path, Scale::Linear)
}

/// [`render`] with the batch axis of `scale`.
pub fn render_scaled(plan: &Plan, path: &Path, scale: Scale) -> Result<(), PlotError> {
    let bytes = match PlotFormat::of(path)? {
        PlotFormat::Svg => svg_scaled(plan, scale).map(String::into_bytes),
        PlotFormat::Png => png_scaled(plan, scale),
    }
    .map_err(|detail| PlotError::Draw {
        path: path.to_path_buf(),
        detail,
    })?;
    Ok(files::write_atomic(path, &bytes)?)
}

/// The plot as an SVG document.
pub fn svg(plan: &Plan) -> Result<String, String> {
    svg_scaled(plan, Scale::Linear)
}

/// [`svg`] with the batch axis of `scale`.
pub fn svg_scaled(plan: &Plan, scale: Scale) -> Result<String, String> {
    let view = View::of(plan, scale);
    let mut out = String::new();
    {
        let height = HEIGHT + sweep::extra_height(plan);
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        draw_all(&root, &view, plan).map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// The plot as a PNG file's bytes (RGB, 8 bits per channel).
pub fn png(plan: &Plan) -> Result<Vec<u8>, String> {
    png_scaled(plan, Scale::Linear)
}

/// [`png`] with the batch axis of `scale`.
pub fn png_scaled(plan: &Plan, scale: Scale) -> Result<Vec<u8>, String> {
    let view = View::of(plan, scale);
    let height = HEIGHT + sweep::extra_height(plan);
    let mut rgb = vec![0u8; (WIDTH * height * 3) as usize];
    {
        let root =
            glyph_text::GlyphText::new(BitMapBackend::with_buffer(&mut rgb, (WIDTH, height)))?
                .into_drawing_area();
        draw_all(&root, &view, plan).map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    let mut out = Vec::new();
    let mut enc = ::png::Encoder::new(&mut out, WIDTH, height);
    enc.set_color(::png::ColorType::Rgb);
    enc.set_depth(::png::BitDepth::Eight);
    // mostly flat colour: the best compression and per-row filters make it several times smaller
    enc.set_compression(::png::Compression::Best);
    enc.set_adaptive_filter(::png::AdaptiveFilterType::Adaptive);
    let mut w = enc.write_header().map_err(|e| e.to_string())?;
    w.write_image_data(&rgb).map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

static DEJAVU: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// ab_glyph draws only registered fonts: DejaVu Sans under every family name plotters may ask for
/// (plotters uses it to measure text, for both formats).
fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for family in [FONT, "serif", "monospace"] {
            if plotters::style::register_font(family, FontStyle::Normal, DEJAVU).is_err() {
                // only if the embedded file were not a font; text would then fail to draw, loudly
                crate::note!("batchfit: warning: the embedded plot font cannot be read");
            }
        }
    });
}

/// Memory unit of the y axis, chosen by scale.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Unit {
    bytes: f64,
    name: &'static str,
}

impl Unit {
    fn for_max(max_bytes: f64) -> Unit {
        const KIB: f64 = 1024.0;
        if max_bytes >= KIB * KIB * KIB {
            Unit {
                bytes: KIB * KIB * KIB,
                name: "GiB",
            }
        } else if max_bytes >= KIB * KIB {
            Unit {
                bytes: KIB * KIB,
                name: "MiB",
            }
        } else {
            Unit {
                bytes: KIB,
                name: "KiB",
            }
        }
    }
}

/// Everything drawn, computed from the plan (no drawing code), in plot units.
#[derive(Debug, Clone, PartialEq)]
struct View {
    title: String,
    subtitle: String,
    unit: Unit,
    /// (batch, peak) of trials that fit.
    fits: Vec<(f64, f64)>,
    /// (batch, y) of out-of-memory trials: the measured peak, or the limit when none was measured.
    ooms: Vec<(f64, f64)>,
    /// How many of `ooms` had a measured peak.
    oom_measured: usize,
    /// (batch, peak) of CUDA trials that completed only after allocator retries (a bound, not a fit).
    retries: Vec<(f64, f64)>,
    /// Batches of trials that ended in error or timeout (no measurement).
    failed: Vec<f64>,
    /// The capacity model's line, in plot units: (per sample, intercept).
    fit_line: Option<(f64, f64)>,
    limit: f64,
    /// The limit before the margin: budget − reserve.
    budget: f64,
    budget_label: String,
    limit_label: String,
    /// Recommended micro-batch and its measured peak.
    recommended: Option<(f64, f64)>,
    /// (batch, samples/s) of every fitting trial with a step time.
    speed: Vec<(f64, f64)>,
    /// One value per tested size (see [`throughput::measured`]), sorted by batch: the line.
    speed_line: Vec<(f64, f64)>,
    /// `fastest_micro_batch` and its samples/s, when the plan names one.
    fastest: Option<(f64, f64)>,
    /// Where to say what the proof is ("1845 fits, 1846 out of memory"): at the top of the chart,
    /// above the largest fit (away from the points).
    proof: Option<(f64, f64, String)>,
    /// `--max-batch` when the answer is that cap: where it is, and what it means.
    cap: Option<(f64, String)>,
    /// The batch axis is log10 of the batch size.
    log_x: bool,
    x_min: f64,
    x_max: f64,
    y_max: f64,
}

/// The trials sorted by what they show, in bytes and samples (before units and axis scaling).
#[derive(Default)]
struct Marks {
    fits: Vec<(f64, f64)>,
    /// (batch, measured peak if any) of the trials that bound the search (out of memory, over budget)
    bounds: Vec<(f64, Option<u64>)>,
    failed: Vec<f64>,
    retries: Vec<(f64, f64)>,
    speed: Vec<(f64, f64)>,
}

impl Marks {
    fn of(plan: &Plan) -> Marks {
        let mut m = Marks::default();
        for t in &plan.trials {
            let b = t.batch as f64;
            match &t.outcome {
                TrialOutcome::Fits {
                    peak_bytes,
                    step_seconds,
                    ..
                } => {
                    m.fits.push((b, *peak_bytes as f64));
                    if step_seconds.is_finite() && *step_seconds > 0.0 {
                        m.speed.push((b, b / step_seconds));
                    }
                }
                TrialOutcome::Oom { peak_bytes, .. } => m.bounds.push((b, *peak_bytes)),
                // out of this budget (the tree's figure above the limit): a cross at that figure
                TrialOutcome::OverBudget { peak_bytes, .. } => {
                    m.bounds.push((b, Some(*peak_bytes)))
                }
                TrialOutcome::Retries { peak_bytes, .. } => m.retries.push((b, *peak_bytes as f64)),
                TrialOutcome::Timeout { .. } | TrialOutcome::Error { .. } => m.failed.push(b),
            }
        }
        m
    }
}

/// The `--max-batch` cap when the answer is that cap, and what it means: drawn, so the plot says why
/// the search stopped.
fn max_batch_cap(plan: &Plan) -> Option<(f64, String)> {
    let r = plan.recommendation.as_ref()?;
    (plan.stop_reason == crate::plan::StopReason::MaxBatch
        && r.max_fitting_batch <= plan.search.max_batch)
        .then(|| {
            (
                plan.search.max_batch as f64,
                format!(
                    "--max-batch {}: the largest size allowed (it fits: no size above was tried)",
                    plan.search.max_batch
                ),
            )
        })
}

/// The legend's labels of the limit and of the budget before the margin.
fn limit_labels(plan: &Plan) -> (String, String) {
    let margin_pct = format_pct(plan.margin);
    let limit_label = format!(
        "limit {} = (budget − reserve) × (1 − {margin_pct} margin)",
        format_size(plan.limit_bytes)
    );
    let budget_label = if plan.reserve_bytes > 0 {
        format!(
            "budget − reserve {} (the limit before the {margin_pct} margin)",
            format_size(plan.budget_bytes.saturating_sub(plan.reserve_bytes))
        )
    } else {
        format!(
            "budget {} (the limit before the {margin_pct} margin)",
            format_size(plan.budget_bytes)
        )
    };
    (limit_label, budget_label)
}

/// One samples/s value per tested size (see [`throughput::measured`]); a plan whose trials all ran
/// with other step counts gets one point per size anyway.
fn speed_line(plan: &Plan, speed: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let tested = throughput::measured(&plan.trials, plan.search.steps, plan.search.confirm_steps);
    if !tested.is_empty() {
        return tested
            .iter()
            .map(|m| (m.batch as f64, m.samples_per_second))
            .collect();
    }
    let mut s = speed.to_vec();
    s.sort_by(|a, b| a.0.total_cmp(&b.0));
    s.dedup_by(|a, b| a.0 == b.0);
    s
}

/// What the proof is ("1845 fits, 1846 runs out of memory") and where to say it: above the largest
/// fit's peak (`fits` in plot units), else at the limit.
fn proof_note(
    plan: &Plan,
    fits: &[(f64, f64)],
    capped: bool,
    limit: f64,
) -> Option<(f64, f64, String)> {
    let r = plan.recommendation.as_ref()?;
    let what = match (r.first_failing_batch, capped) {
        (Some(f), _) => format!("{} fits, {f} runs out of memory", r.max_fitting_batch),
        (None, true) => format!("{} fits: the --max-batch cap", r.max_fitting_batch),
        (None, false) => return None,
    };
    let x = r.max_fitting_batch as f64;
    let y = fits
        .iter()
        .filter(|p| p.0 == x)
        .map(|p| p.1)
        .fold(f64::NAN, f64::max);
    Some((x, if y.is_nan() { limit } else { y }, what))
}

/// The chart's title and subtitle: the model, the device, the answer or why there is none.
fn titles(plan: &Plan) -> (String, String) {
    let device = if plan.device.name.starts_with(plan.device.kind.as_str()) {
        plan.device.name.clone()
    } else {
        format!("{} ({})", plan.device.kind, plan.device.name)
    };
    let mut title = format!("batchfit: {} on {device}", plan.model.name());
    match plan.status {
        Status::Complete => {}
        Status::Partial => title += " — PARTIAL plan",
        Status::NothingFits => title += " — nothing fits",
    }
    let subtitle = match (&plan.recommendation, plan.status) {
        (Some(r), Status::Complete) => format!(
            "micro-batch {} × accumulation {} × world size {} = global batch {};  largest fitting {}{};  {}",
            r.micro_batch,
            r.accumulation,
            r.world_size,
            r.global_batch,
            r.max_fitting_batch,
            r.first_failing_batch
                .map(|f| format!(", {f} ran out of memory"))
                .unwrap_or_default(),
            trials(plan.trials.len())
        ),
        _ => format!(
            "no recommendation: stopped: {};  {}",
            plan.stop_detail,
            trials(plan.trials.len())
        ),
    };
    (title, subtitle)
}

impl View {
    fn of(plan: &Plan, scale: Scale) -> View {
        let log_x = scale == Scale::Log;
        // where a batch size sits on the x axis
        let xt = |b: f64| if log_x { b.max(1.0).log10() } else { b };
        let at = |v: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
            v.into_iter().map(|(b, y)| (xt(b), y)).collect()
        };
        let marks = Marks::of(plan);
        let limit = plan.limit_bytes as f64;
        let budget = plan.budget_bytes.saturating_sub(plan.reserve_bytes) as f64;
        let bounds: Vec<(f64, f64)> = marks
            .bounds
            .iter()
            .map(|(b, p)| (*b, p.map_or(limit, |p| p as f64)))
            .collect();
        let cap = max_batch_cap(plan);
        let batches = plan.trials.iter().map(|t| t.batch.max(1));
        let x_max =
            (batches.clone().max().unwrap_or(1) as f64).max(cap.as_ref().map_or(0.0, |c| c.0));
        let x_smallest = batches.min().unwrap_or(1) as f64;
        let top_bytes = marks
            .fits
            .iter()
            .chain(bounds.iter())
            .chain(marks.retries.iter())
            .map(|p| p.1)
            .fold(limit.max(budget), f64::max)
            .max(1.0);
        let unit = Unit::for_max(top_bytes);
        let u = |v: f64| v / unit.bytes;
        let in_units =
            |v: &[(f64, f64)]| -> Vec<(f64, f64)> { v.iter().map(|&(b, p)| (b, u(p))).collect() };
        let fits = in_units(&marks.fits);
        let (limit_label, budget_label) = limit_labels(plan);
        let (title, subtitle) = titles(plan);
        let proof = proof_note(plan, &fits, cap.is_some(), u(limit));
        View {
            title,
            subtitle,
            fit_line: memory_line(plan).map(|(k, a)| (k / unit.bytes, a / unit.bytes)),
            unit,
            fits: at(fits),
            ooms: at(in_units(&bounds)),
            oom_measured: marks.bounds.iter().filter(|(_, p)| p.is_some()).count(),
            retries: at(in_units(&marks.retries)),
            failed: marks.failed.into_iter().map(xt).collect(),
            limit: u(limit),
            budget: u(budget),
            budget_label,
            limit_label,
            recommended: plan
                .recommendation
                .as_ref()
                .map(|r| (xt(r.micro_batch as f64), u(r.peak_bytes as f64))),
            speed_line: at(speed_line(plan, &marks.speed)),
            speed: at(marks.speed),
            fastest: plan.recommendation.as_ref().and_then(|r| {
                Some((
                    xt(r.fastest_micro_batch? as f64),
                    r.fastest_samples_per_second?,
                ))
            }),
            proof: proof.map(|(x, y, t)| (xt(x), y, t)),
            cap: cap.map(|(x, t)| (xt(x), t)),
            log_x,
            x_min: if log_x { xt(x_smallest) - 0.15 } else { 0.0 },
            // room right of the largest size, and never a range so short that ticks fall between sizes
            x_max: if log_x {
                xt(x_max) + 0.1
            } else {
                (x_max * 1.05).max(x_max + 1.0)
            },
            y_max: u(top_bytes) * 1.12,
        }
    }
}

/// The line the plot draws: the plan's capacity model (`per_sample_bytes`, `fixed_bytes`), the same
/// line `predict` and the plan's `capacity_model` section use, refit from the trials for a plan
/// written without one; none where the model refuses to make a line.
fn memory_line(plan: &Plan) -> Option<(f64, f64)> {
    let model = match &plan.capacity_model {
        Some(m) => m.clone(),
        None => crate::plan::CapacityModel::fit(&plan.trials, plan.limit_bytes)?,
    };
    model
        .refusal
        .is_none()
        .then_some((model.per_sample_bytes, model.fixed_bytes))
}

fn trials(n: usize) -> String {
    if n == 1 {
        "1 trial".into()
    } else {
        format!("{n} trials")
    }
}

fn format_pct(f: f64) -> String {
    let p = f * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// A size that may be negative or fractional (a fitted intercept or slope).
fn format_signed_size(v: f64) -> String {
    let s = format_size(v.abs().round() as u64);
    if v < 0.0 {
        format!("−{s}")
    } else {
        s
    }
}

/// Samples/s compactly: 950, 12.5k, 1.25M.
fn compact(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Tick label of the memory axis: as many decimals as the scale needs.
fn memory_tick(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

/// Labelled ticks per axis (plotters' `y_labels`).
const TICKS: usize = 10;

/// The decimals the labelled ticks of an axis over [0, max] need, the same for all of them ("0.5",
/// "1.0", "1.5"; "2", "4", "6"): plotters' own tick choice, asked for the same number of ticks.
fn tick_decimals(max: f64) -> usize {
    let range: plotters::coord::types::RangedCoordf64 = (0.0..max).into();
    range
        .key_points(TICKS)
        .iter()
        .map(|v| {
            (0..=3)
                .find(|&d| {
                    let s = 10f64.powi(d as i32);
                    (v * s - (v * s).round()).abs() < 1e-6 * s
                })
                .unwrap_or(3)
        })
        .max()
        .unwrap_or(0)
}

/// PNG text: see [`glyph_text::GlyphText`].
mod glyph_text {
    use super::DEJAVU;
    use ab_glyph::{Font, FontRef, ScaleFont};
    use plotters::prelude::{BitMapBackend, DrawingBackend};
    use plotters_backend::text_anchor::{HPos, VPos};
    use plotters_backend::{
        BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
    };

    /// The bitmap backend with text drawn by ab_glyph directly: each glyph at its own pixel bounds
    /// (side bearings and kerning kept, sub-pixel pen), the baseline at the font's ascent below the top of
    /// the text box plotters lays out, rotation (the y-axis title) and anchors as plotters does them.
    /// Everything else goes to the bitmap backend unchanged.
    pub(super) struct GlyphText<'a> {
        inner: BitMapBackend<'a>,
        font: FontRef<'static>,
    }

    type BitMapError<'a> = DrawingErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>;

    impl<'a> GlyphText<'a> {
        pub(super) fn new(inner: BitMapBackend<'a>) -> Result<Self, String> {
            let font = FontRef::try_from_slice(DEJAVU)
                .map_err(|e| format!("the embedded plot font cannot be read: {e}"))?;
            Ok(GlyphText { inner, font })
        }

        /// Width (pen advance) and height (ascent) of `text` at `size` pixels.
        fn measure(&self, size: f64, text: &str) -> (f32, f32) {
            let font = self.font.as_scaled(size as f32);
            let mut width = 0.0;
            let mut prev = None;
            for c in text.chars() {
                let id = font.glyph_id(c);
                if let Some(p) = prev {
                    width += font.kern(p, id);
                }
                width += font.h_advance(id);
                prev = Some(id);
            }
            (width, font.ascent())
        }
    }

    impl<'a> DrawingBackend for GlyphText<'a> {
        type ErrorType = <BitMapBackend<'a> as DrawingBackend>::ErrorType;

        fn get_size(&self) -> (u32, u32) {
            self.inner.get_size()
        }
        fn ensure_prepared(&mut self) -> Result<(), BitMapError<'a>> {
            self.inner.ensure_prepared()
        }
        fn present(&mut self) -> Result<(), BitMapError<'a>> {
            self.inner.present()
        }
        fn draw_pixel(
            &mut self,
            point: BackendCoord,
            color: BackendColor,
        ) -> Result<(), BitMapError<'a>> {
            self.inner.draw_pixel(point, color)
        }
        fn draw_line<S: BackendStyle>(
            &mut self,
            from: BackendCoord,
            to: BackendCoord,
            style: &S,
        ) -> Result<(), BitMapError<'a>> {
            self.inner.draw_line(from, to, style)
        }
        fn draw_rect<S: BackendStyle>(
            &mut self,
            upper_left: BackendCoord,
            bottom_right: BackendCoord,
            style: &S,
            fill: bool,
        ) -> Result<(), BitMapError<'a>> {
            self.inner.draw_rect(upper_left, bottom_right, style, fill)
        }
        fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
            &mut self,
            path: I,
            style: &S,
        ) -> Result<(), BitMapError<'a>> {
            self.inner.draw_path(path, style)
        }
        fn draw_circle<S: BackendStyle>(
            &mut self,
            center: BackendCoord,
            radius: u32,
            style: &S,
            fill: bool,
        ) -> Result<(), BitMapError<'a>> {
            self.inner.draw_circle(center, radius, style, fill)
        }
        fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
            &mut self,
            vert: I,
            style: &S,
        ) -> Result<(), BitMapError<'a>> {
            self.inner.fill_polygon(vert, style)
        }
        fn blit_bitmap(
            &mut self,
            pos: BackendCoord,
            size: (u32, u32),
            src: &[u8],
        ) -> Result<(), BitMapError<'a>> {
            self.inner.blit_bitmap(pos, size, src)
        }

        fn estimate_text_size<T: BackendTextStyle>(
            &self,
            text: &str,
            style: &T,
        ) -> Result<(u32, u32), BitMapError<'a>> {
            let (w, h) = self.measure(style.size(), text);
            Ok((w.ceil() as u32, h.ceil() as u32))
        }

        fn draw_text<T: BackendTextStyle>(
            &mut self,
            text: &str,
            style: &T,
            pos: BackendCoord,
        ) -> Result<(), BitMapError<'a>> {
            let color = style.color();
            if color.alpha == 0.0 {
                return Ok(());
            }
            let (width, height) = self.measure(style.size(), text);
            let anchor = style.anchor();
            let dx = match anchor.h_pos {
                HPos::Left => 0.0,
                HPos::Center => -width / 2.0,
                HPos::Right => -width,
            };
            let dy = match anchor.v_pos {
                VPos::Top => 0.0,
                VPos::Center => -height / 2.0,
                VPos::Bottom => -height,
            };
            let trans = style.transform();
            let font = self.font.as_scaled(style.size() as f32);
            let mut pixels = vec![];
            let mut pen = 0.0;
            let mut prev = None;
            for c in text.chars() {
                let id = font.glyph_id(c);
                if let Some(p) = prev {
                    pen += font.kern(p, id);
                }
                let glyph = id.with_scale_and_position(
                    font.scale(),
                    ab_glyph::point(dx + pen, dy + font.ascent()),
                );
                if let Some(outline) = font.outline_glyph(glyph) {
                    let b = outline.px_bounds();
                    outline.draw(|x, y, coverage| {
                        let (tx, ty) =
                            trans.transform(b.min.x as i32 + x as i32, b.min.y as i32 + y as i32);
                        pixels.push(((pos.0 + tx, pos.1 + ty), coverage));
                    });
                }
                pen += font.h_advance(id);
                prev = Some(id);
            }
            for (p, coverage) in pixels {
                if coverage > 0.0 {
                    self.inner.draw_pixel(
                        p,
                        BackendColor {
                            alpha: color.alpha * coverage.min(1.0) as f64,
                            rgb: color.rgb,
                        },
                    )?;
                }
            }
            Ok(())
        }
    }
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// The plan's panels, and below them the sweep's when it has one.
fn draw_all<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, v: &View, plan: &Plan) -> DrawResult
where
    DB::ErrorType: 'static,
{
    match &plan.sweep {
        None => draw(root, v),
        Some(sw) => {
            let (top, bottom) = root.split_vertically(HEIGHT);
            draw(&top, v)?;
            bottom.fill(&WHITE)?;
            sweep::draw(&bottom, sw)
        }
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, v: &View) -> DrawResult
where
    DB::ErrorType: 'static,
{
    register_fonts();
    root.fill(&WHITE)?;
    let area = root.margin(10, 10, 16, 16);
    let size = fitting_size(&area, &v.title, 26)?;
    let area = area.titled(&v.title, (FONT, size).into_font().color(&BLACK))?;
    let size = fitting_size(&area, &v.subtitle, 17)?;
    let area = area.titled(&v.subtitle, (FONT, size).into_font().color(&LIMIT))?;
    let memory_height = (area.dim_in_pixel().1 as f64 * 0.60) as u32;
    let (upper, lower) = area.split_vertically(memory_height);
    draw_memory(&upper, v)?;
    draw_speed(&lower, v)?;
    Ok(())
}

/// The largest font size up to `size` (down to 12) at which `text` fits the width of `area`: a long
/// device name shrinks the title rather than running off the image.
fn fitting_size<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    size: u32,
) -> Result<u32, Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let width = area.dim_in_pixel().0;
    let mut s = size;
    while s > 12
        && area
            .estimate_text_size(text, &TextStyle::from((FONT, s).into_font()))?
            .0
            > width
    {
        s -= 1;
    }
    Ok(s)
}

/// Tick labels of the batch axis: whole sizes only (a tick between two sizes gets none); on a log
/// axis, the sizes 1, 2 and 5 × 10ⁿ.
fn batch_tick(x: &f64) -> String {
    if (x - x.round()).abs() < 1e-6 {
        format!("{x:.0}")
    } else {
        String::new()
    }
}

fn log_batch_tick(x: &f64) -> String {
    let b = 10f64.powf(*x);
    let p = 10f64.powf(b.log10().floor());
    let nice = [1.0, 2.0, 5.0]
        .iter()
        .any(|m| (b - m * p).abs() < 1e-6 * b.max(1.0));
    if nice && b >= 1.0 - 1e-9 {
        format!("{:.0}", b.round())
    } else {
        String::new()
    }
}

impl View {
    fn x_label(&self, x: &f64) -> String {
        if self.log_x {
            log_batch_tick(x)
        } else {
            batch_tick(x)
        }
    }

    fn x_desc(&self) -> &'static str {
        if self.log_x {
            "micro-batch size (samples, log scale)"
        } else {
            "micro-batch size (samples)"
        }
    }

    /// The capacity model's line y = a·b + c (b the batch size), as points inside the chart.
    fn fit_points(&self, a: f64, c: f64) -> Option<Vec<(f64, f64)>> {
        if !self.log_x {
            return clip_line(a, c, self.x_max, self.y_max);
        }
        let n = 200;
        let pts: Vec<(f64, f64)> = (0..=n)
            .map(|i| self.x_min + (self.x_max - self.x_min) * i as f64 / n as f64)
            .map(|x| (x, a * 10f64.powf(x) + c))
            .filter(|(_, y)| (0.0..=self.y_max).contains(y))
            .collect();
        (pts.len() >= 2).then_some(pts)
    }
}

fn legend_box<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .margin(12)
        .background_style(WHITE.mix(0.9))
        .border_style(BUDGET)
        .label_font((FONT, 15))
        .draw()?;
    Ok(())
}

type MemoryChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The budget before the margin (dashed), the limit, and the capacity model's line.
fn draw_levels<DB: DrawingBackend>(chart: &mut MemoryChart<'_, DB>, v: &View) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let (x_min, x_max) = (v.x_min, v.x_max);
    // the budget before the margin, dashed, and the limit
    chart
        .draw_series(DashedLineSeries::new(
            [(x_min, v.budget), (x_max, v.budget)],
            10,
            6,
            BUDGET.stroke_width(2),
        ))?
        .label(&v.budget_label)
        .legend(|(x, y)| {
            DashedPathElement::new([(x, y), (x + 20, y)], 5, 3, BUDGET.stroke_width(2))
        });
    chart
        .draw_series(LineSeries::new(
            [(x_min, v.limit), (x_max, v.limit)],
            LIMIT.stroke_width(2),
        ))?
        .label(&v.limit_label)
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], LIMIT.stroke_width(2)));

    if let Some((a, b)) = v.fit_line {
        if let Some(seg) = v.fit_points(a, b) {
            let unit = v.unit.bytes;
            chart
                .draw_series(LineSeries::new(seg, LINE.stroke_width(2)))?
                .label(format!(
                    "capacity model: {}/sample + {}",
                    format_signed_size(a * unit),
                    format_signed_size(b * unit)
                ))
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], LINE.stroke_width(2)));
        }
    }

    Ok(())
}

/// The recommended micro-batch and the `--max-batch` cap, as vertical lines.
fn draw_answer<DB: DrawingBackend>(chart: &mut MemoryChart<'_, DB>, v: &View) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let y_max = v.y_max;
    if let Some((rb, _)) = v.recommended {
        chart
            .draw_series(DashedLineSeries::new(
                [(rb, 0.0), (rb, y_max)],
                8,
                5,
                RECOMMENDED.stroke_width(2),
            ))?
            .label(format!("recommended micro-batch {rb:.0}"))
            .legend(|(x, y)| {
                DashedPathElement::new([(x, y), (x + 20, y)], 5, 3, RECOMMENDED.stroke_width(2))
            });
    }

    if let Some((cx, text)) = &v.cap {
        chart
            .draw_series(DashedLineSeries::new(
                [(*cx, 0.0), (*cx, y_max)],
                3,
                4,
                LIMIT.stroke_width(2),
            ))?
            .label(text.clone())
            .legend(|(x, y)| {
                DashedPathElement::new([(x, y), (x + 20, y)], 2, 3, LIMIT.stroke_width(2))
            });
    }
    Ok(())
}

/// What the proof is, in words on a white box at the top of the chart.
fn draw_proof<DB: DrawingBackend>(
    chart: &mut MemoryChart<'_, DB>,
    v: &View,
    area: &DrawingArea<DB, Shift>,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let y_max = v.y_max;
    if let Some((x, _, text)) = &v.proof {
        // at the top of the chart above the largest fit, towards the middle: the points lie at or
        // below the budget line, so the band above it is free (the words do not crowd the points)
        let y = &y_max;
        let (h, dx) = if *x > (v.x_min + v.x_max) / 2.0 {
            (HPos::Right, -10)
        } else {
            (HPos::Left, 10)
        };
        let style = (FONT, 15)
            .into_font()
            .color(&LIMIT)
            .pos(Pos::new(h, VPos::Top));
        // on a white box, so a line passing behind it does not cross the words
        let (w, th) = area.estimate_text_size(text, &style)?;
        let (w, th) = (w as i32, th as i32);
        let left = if matches!(h, HPos::Right) { dx - w } else { dx };
        let (top, pad) = (6, 4);
        chart.draw_series(std::iter::once(
            EmptyElement::at((*x, *y))
                + Rectangle::new(
                    [(left - pad, top - pad), (left + w + pad, top + th + pad)],
                    WHITE.mix(0.85).filled(),
                )
                + Text::new(text.clone(), (dx, top), style),
        ))?;
    }
    Ok(())
}

/// Every trial as a marker: out of memory, fits, the recommendation, retries, failures.
fn draw_trials<DB: DrawingBackend>(chart: &mut MemoryChart<'_, DB>, v: &View) -> DrawResult
where
    DB::ErrorType: 'static,
{
    if !v.ooms.is_empty() {
        let where_ = match v.oom_measured {
            0 => "drawn at the limit",
            n if n == v.ooms.len() => "at the measured peak",
            _ => "at the measured peak, or at the limit",
        };
        chart
            .draw_series(
                v.ooms
                    .iter()
                    .map(|&p| Cross::new(p, 7, OOM.stroke_width(3))),
            )?
            .label(format!(
                "out of memory, {where_} ({})",
                trials(v.ooms.len())
            ))
            .legend(|(x, y)| Cross::new((x + 10, y), 6, OOM.stroke_width(3)));
    }
    if !v.fits.is_empty() {
        chart
            .draw_series(v.fits.iter().map(|&p| Circle::new(p, 5, FIT.filled())))?
            .label(format!("fits: measured peak ({})", trials(v.fits.len())))
            .legend(|(x, y)| Circle::new((x + 10, y), 5, FIT.filled()));
    }
    if let Some(r) = v.recommended {
        chart.draw_series(std::iter::once(Circle::new(
            r,
            10,
            RECOMMENDED.stroke_width(3),
        )))?;
    }
    if !v.retries.is_empty() {
        chart
            .draw_series(
                v.retries
                    .iter()
                    .map(|&p| Circle::new(p, 7, OOM.stroke_width(2))),
            )?
            .label(format!(
                "completed only after allocator retries: a bound ({})",
                trials(v.retries.len())
            ))
            .legend(|(x, y)| Circle::new((x + 10, y), 6, OOM.stroke_width(2)));
    }
    if !v.failed.is_empty() {
        chart
            .draw_series(
                v.failed
                    .iter()
                    .map(|&b| TriangleMarker::new((b, 0.0), 8, FAILED.filled())),
            )?
            .label(format!(
                "error or timeout, no measurement ({})",
                trials(v.failed.len())
            ))
            .legend(|(x, y)| TriangleMarker::new((x + 10, y), 7, FAILED.filled()));
    }
    Ok(())
}

fn draw_memory<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, v: &View) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let (x_min, x_max, y_max) = (v.x_min, v.x_max, v.y_max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Peak memory of each trial against the micro-batch size",
            (FONT, 20),
        )
        .margin(10)
        .margin_right(24)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(x_min..x_max, 0f64..y_max)?;
    let decimals = tick_decimals(y_max);
    let y_fmt = |y: &f64| memory_tick(*y, decimals);
    let x_fmt = |x: &f64| v.x_label(x);
    chart
        .configure_mesh()
        .x_desc(v.x_desc())
        .y_desc(format!("peak memory ({})", v.unit.name))
        .y_labels(TICKS)
        .axis_desc_style((FONT, 18))
        .label_style((FONT, 15))
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .max_light_lines(2)
        .light_line_style(RGBColor(0xF0, 0xF0, 0xF0))
        .bold_line_style(RGBColor(0xD0, 0xD0, 0xD0))
        .draw()?;

    draw_levels(&mut chart, v)?;
    draw_answer(&mut chart, v)?;
    draw_proof(&mut chart, v, area)?;
    draw_trials(&mut chart, v)?;
    legend_box(&mut chart)
}

/// The part of y = a·x + b inside [0, x_max] × [0, y_max].
fn clip_line(a: f64, b: f64, x_max: f64, y_max: f64) -> Option<Vec<(f64, f64)>> {
    let (mut x0, mut x1) = (0.0f64, x_max);
    if a.abs() > 0.0 {
        // x where the line crosses y = 0 and y = y_max
        let (xa, xb) = ((0.0 - b) / a, (y_max - b) / a);
        let (lo, hi) = if xa < xb { (xa, xb) } else { (xb, xa) };
        x0 = x0.max(lo);
        x1 = x1.min(hi);
    } else if !(0.0..=y_max).contains(&b) {
        return None;
    }
    (x0 < x1).then(|| vec![(x0, a * x0 + b), (x1, a * x1 + b)])
}

fn draw_speed<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, v: &View) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let (x_min, x_max) = (v.x_min, v.x_max);
    let top = v.speed.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0);
    let y_max = top * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption("Throughput of the trials that fit", (FONT, 20))
        .margin(10)
        .margin_right(24)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(x_min..x_max, 0f64..y_max)?;
    let x_fmt = |x: &f64| v.x_label(x);
    let empty = v.speed.is_empty();
    let y_fmt = |y: &f64| if empty { String::new() } else { compact(*y) };
    chart
        .configure_mesh()
        .x_desc(v.x_desc())
        .y_desc("samples/s")
        .y_labels(TICKS)
        .axis_desc_style((FONT, 18))
        .label_style((FONT, 15))
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .max_light_lines(2)
        .light_line_style(RGBColor(0xF0, 0xF0, 0xF0))
        .bold_line_style(RGBColor(0xD0, 0xD0, 0xD0))
        .draw()?;
    if v.speed.is_empty() {
        chart.draw_series(std::iter::once(Text::new(
            "no trial that fit measured a step time",
            (x_min + (x_max - x_min) * 0.3, y_max * 0.5),
            (FONT, 18).into_font().color(&LIMIT),
        )))?;
        return Ok(());
    }
    if v.speed_line.len() >= 2 {
        chart.draw_series(LineSeries::new(
            v.speed_line.iter().copied(),
            SPEED.mix(0.6).stroke_width(2),
        ))?;
    }
    if let Some((rb, _)) = v.recommended {
        chart
            .draw_series(DashedLineSeries::new(
                [(rb, 0.0), (rb, y_max)],
                8,
                5,
                RECOMMENDED.stroke_width(2),
            ))?
            .label(format!("recommended micro-batch {rb:.0}"))
            .legend(|(x, y)| {
                DashedPathElement::new([(x, y), (x + 20, y)], 5, 3, RECOMMENDED.stroke_width(2))
            });
    }
    if let Some((fb, fs)) = v.fastest {
        chart
            .draw_series(std::iter::once(Circle::new(
                (fb, fs),
                10,
                FASTEST.stroke_width(3),
            )))?
            .label(format!(
                "micro-batch {fb:.0}: about as fast ({} samples/s)",
                compact(fs)
            ))
            .legend(|(x, y)| Circle::new((x + 10, y), 7, FASTEST.stroke_width(3)));
    }
    chart
        .draw_series(v.speed.iter().map(|&p| Circle::new(p, 5, SPEED.filled())))?
        .label(format!(
            "samples/s of a fitting trial ({})",
            trials(v.speed.len())
        ))
        .legend(|(x, y)| Circle::new((x + 10, y), 5, SPEED.filled()));
    legend_box(&mut chart)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::TrialRecord;

    const MIB: u64 = 1 << 20;

    /// A real sim probe's plan (base 100 MiB, 1 MiB per sample, 2 GiB; global batch 4096; exact):
    /// fits at 1, 19 and 1845 (with the confirmation's steps at once) and 1024 (the split, 4 × 1024),
    /// out of memory at 1846 (no peak measured). Three trials are added by hand: a 3-step fit at
    /// 1845, out of memory at 3000 with a measured peak, and an error at 2500.
    fn plan() -> Plan {
        let mut plan = crate::probe::sim_plan(&[
            "--backend",
            "sim",
            "--sim",
            "base=100MiB,per-sample=1MiB,capacity=2GiB",
            "--global-batch",
            "4096",
            "--tolerance",
            "0",
        ]);
        let batches: Vec<(u64, &str)> = plan
            .trials
            .iter()
            .map(|t| (t.batch, t.outcome.kind()))
            .collect();
        assert_eq!(
            batches,
            [
                (1, "fits"),
                (19, "fits"),
                (1845, "fits"),
                (1846, "oom"),
                (1024, "fits")
            ]
        );
        let extra: Vec<TrialRecord> = serde_json::from_value(serde_json::json!([
            {"batch": 1845, "steps": 3, "purpose": "explore", "isolation": "none",
             "outcome": "fits", "peak_bytes": 1945 * MIB, "step_seconds": 0.002845, "seconds": 0.01},
            {"batch": 3000, "steps": 3, "purpose": "explore", "isolation": "none",
             "outcome": "oom", "message": "oom", "peak_bytes": 2100 * MIB, "seconds": 0.01},
            {"batch": 2500, "steps": 3, "purpose": "explore", "isolation": "none",
             "outcome": "error", "message": "crash", "seconds": 0.01},
        ]))
        .unwrap();
        plan.trials.extend(extra);
        plan
    }

    #[test]
    fn tick_labels_share_their_decimals() {
        assert_eq!(tick_decimals(2.24), 1);
        assert_eq!(tick_decimals(17.9), 0);
        assert_eq!(tick_decimals(0.3), 2);
        assert_eq!(memory_tick(0.5, 1), "0.5");
        assert_eq!(compact(650_000.0), "650k");
        assert_eq!(compact(1_250_000.0), "1.25M");
        assert_eq!(compact(12.0), "12");
    }

    /// On a sim probe's own trials (an exact device), the four places that speak of memory
    /// against batch size give one line: the search's proposal (the anchored pair of
    /// [`crate::search::line::fit_line`]), the plan's `capacity_model` section, what
    /// `batchfit predict` computes from the plan (with the section, and refit from the trials
    /// without it), and the segment the plot draws.
    #[test]
    fn the_search_the_capacity_model_predict_and_the_plot_give_one_line() {
        let mut plan = crate::probe::sim_plan(&[
            "--backend",
            "sim",
            "--sim",
            "base=1GiB,per-sample=3MiB,capacity=16GiB",
        ]);
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-6 * x.abs().max(y.abs()).max(1.0);

        let mut points: Vec<(u64, u64)> = (plan.trials.iter())
            .filter(|t| t.accumulation <= 1 && t.outcome.fits())
            .filter_map(|t| Some((t.batch, t.outcome.peak_bytes()?)))
            .collect();
        points.sort();
        points.dedup_by_key(|p| p.0);
        let (search, _) = crate::search::line::fit_line(&points).expect("a slope");
        assert!(close(search.k, 3.0 * MIB as f64) && close(search.a, 1024.0 * MIB as f64));
        let same = |what: &str, per_sample: f64, fixed: f64| {
            assert!(
                close(per_sample, search.k) && close(fixed, search.a),
                "{what}: {per_sample} per sample + {fixed}, the search's {search:?}"
            );
        };

        let model = plan
            .capacity_model
            .clone()
            .expect("the plan's capacity model");
        assert!(model.refusal.is_none(), "{model:?}");
        same("capacity model", model.per_sample_bytes, model.fixed_bytes);

        let predicted = |plan: &Plan| {
            let memory = [("8GiB".to_string(), 8u64 << 30)];
            let r = crate::plan::capacity::report(plan, "plan.json", &memory, None, None).unwrap();
            (
                r.capacity_model.per_sample_bytes,
                r.capacity_model.fixed_bytes,
            )
        };
        let (k, a) = predicted(&plan);
        same("predict", k, a);

        let v = View::of(&plan, Scale::Linear);
        let (k, a) = v.fit_line.expect("a drawn line");
        let segment = v.fit_points(k, a).expect("a segment in the chart");
        for (x, y) in segment {
            assert!(
                close(y * v.unit.bytes, search.at(x)),
                "the plot draws ({x}, {}) off the search's line",
                y * v.unit.bytes
            );
        }

        plan.capacity_model = None;
        let (k, a) = predicted(&plan);
        same("predict, refit from the trials", k, a);
        let (k, a) = View::of(&plan, Scale::Linear)
            .fit_line
            .expect("a drawn line");
        same(
            "the plot, refit from the trials",
            k * v.unit.bytes,
            a * v.unit.bytes,
        );
    }

    #[test]
    fn the_plot_draws_the_line_of_the_capacity_model() {
        // batch 1's peak lies far above the line (a flat part below a knee): the capacity model
        // leaves it out, and so must the drawn line; a least-squares line through every fit would not
        let mut p = plan();
        for t in p.trials.iter_mut().filter(|t| t.batch == 1) {
            if let TrialOutcome::Fits { peak_bytes, .. } = &mut t.outcome {
                *peak_bytes = 400 * MIB;
            }
        }
        let model = crate::plan::CapacityModel::fit(&p.trials, p.limit_bytes).unwrap();
        assert!(model.refusal.is_none(), "{model:?}");
        assert!(
            (model.per_sample_bytes - MIB as f64).abs() < 1e3,
            "{model:?}"
        );
        p.capacity_model = Some(model.clone());
        let v = View::of(&p, Scale::Linear);
        let (k, a) = v.fit_line.unwrap();
        assert_eq!(k * v.unit.bytes, model.per_sample_bytes);
        assert_eq!(a * v.unit.bytes, model.fixed_bytes);
        // a plan without the section gets the same line, refit from its trials
        p.capacity_model = None;
        assert_eq!(View::of(&p, Scale::Linear).fit_line, v.fit_line);
    }

    #[test]
    fn view_places_every_trial() {
        let v = View::of(&plan(), Scale::Linear);
        assert_eq!(v.unit.name, "GiB");
        assert_eq!(v.fits.len(), 5);
        assert_eq!(v.ooms.len(), 2);
        assert_eq!(v.oom_measured, 1);
        // an out-of-memory trial without a peak sits on the limit line
        assert_eq!(v.ooms[0].1, v.limit);
        assert_eq!(v.failed, vec![2500.0]);
        let (a, b) = v.fit_line.unwrap();
        assert!((a * v.unit.bytes - MIB as f64).abs() < 1.0, "{a}");
        assert!((b * v.unit.bytes - 100.0 * MIB as f64).abs() < 1e3, "{b}");
        assert!(v.budget > v.limit);
        assert!(v.budget_label.contains("5% margin"), "{}", v.budget_label);
        assert_eq!(v.speed.len(), 5);
        // one throughput value per tested size
        assert_eq!(v.speed_line.len(), 4);
    }

    #[test]
    fn a_log_axis_spreads_small_sizes_and_the_cap_is_drawn() {
        let v = View::of(&plan(), Scale::Log);
        assert!(v.log_x);
        // 1 and 19 are a decade apart, not squashed at the left edge
        let xs: Vec<f64> = v.fits.iter().map(|p| p.0).collect();
        assert!(
            (xs[0] - 0.0).abs() < 1e-9 && (xs[1] - 19f64.log10()).abs() < 1e-9,
            "{xs:?}"
        );
        assert!(v.x_min < 0.0 && v.x_max > 3000f64.log10());
        assert_eq!(log_batch_tick(&2.0), "100");
        assert_eq!(log_batch_tick(&(500f64).log10()), "500");
        assert_eq!(log_batch_tick(&0.5), "");
        let log_svg = svg_scaled(&plan(), Scale::Log).unwrap();
        assert!(log_svg.contains("micro-batch size (samples, log scale)"));
        assert!(log_svg.contains("1845 fits, 1846 runs out of memory"));
        // the answer is the --max-batch cap: the cap is drawn and named
        let capped = crate::probe::sim_plan(&[
            "--backend",
            "sim",
            "--sim",
            "base=100MiB,per-sample=1MiB,capacity=2GiB",
            "--max-batch",
            "300",
        ]);
        assert_eq!(capped.stop_reason, crate::plan::StopReason::MaxBatch);
        let v = View::of(&capped, Scale::Linear);
        assert_eq!(v.cap.as_ref().unwrap().0, 300.0);
        let capped_svg = svg(&capped).unwrap();
        assert!(
            capped_svg.contains("--max-batch 300: the largest size allowed"),
            "no cap in the SVG"
        );
        assert!(capped_svg.contains("300 fits: the --max-batch cap"));
        // the proof's words sit in the band above the budget line, away from the points
        let v = View::of(&plan(), Scale::Linear);
        assert!(v.proof.is_some());
        assert!(v.fits.iter().all(|p| p.1 <= v.budget) && v.budget < v.y_max);
    }

    #[test]
    fn svg_has_labels_legend_and_one_marker_per_trial() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("plot.svg");
        render(&plan(), &f).unwrap();
        let svg = std::fs::read_to_string(&f).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        for text in [
            "micro-batch size (samples)",
            "peak memory (GiB)",
            "samples/s",
            "capacity model: 1.00 MiB/sample + 100.00 MiB",
            "limit 1.90 GiB",
            "budget 2.00 GiB (the limit before the 5% margin)",
            "recommended micro-batch 1024",
            "1845 fits, 1846 runs out of memory",
            "fits: measured peak (5 trials)",
            "out of memory, at the measured peak, or at the limit (2 trials)",
            "error or timeout, no measurement (1 trial)",
            "batchfit: mlp on sim(base=100.00 MiB, per-sample=1.00 MiB, capacity=2.00 GiB)",
        ] {
            assert!(svg.contains(text), "no {text:?} in the SVG");
        }
        let count = |needle: &str| svg.matches(needle).count();
        // circles: fits and samples/s points (5 each, and one in each legend) and the ring round the
        // recommended size
        assert_eq!(count("<circle"), 2 * (5 + 1) + 1);
        // filled circles of the fits' colour: one per fitting trial, plus the legend's
        assert_eq!(count(r##"fill="#1F77B4""##), 5 + 1, "{svg}");
        // crosses are two lines each: one per out-of-memory trial, plus the legend's
        assert_eq!(count(r##"stroke="#D62728""##), 2 * (2 + 1));
        // throughput: one point per fitting trial with a step time, plus the legend's
        assert_eq!(count(r##"fill="#9467BD""##), 5 + 1);
        // the error trial's triangle, plus the legend's
        assert_eq!(count(r##"fill="#FF7F0E""##), 1 + 1);
        // nothing left beside it
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn png_has_signature_and_size() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("plot.PNG");
        render(&plan(), &f).unwrap();
        let bytes = std::fs::read(&f).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian, at bytes 16..24
        assert_eq!(&bytes[12..16], b"IHDR");
        assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), WIDTH);
        assert_eq!(
            u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
            HEIGHT
        );
        // text was drawn: the decoded image has many distinct dark pixels, not only lines
        let dec = ::png::Decoder::new(std::io::Cursor::new(&bytes));
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size()];
        r.next_frame(&mut buf).unwrap();
        let dark = buf.chunks(3).filter(|p| p.iter().all(|&c| c < 80)).count();
        assert!(dark > 5000, "{dark} dark pixels");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn partial_and_empty_plans_draw() {
        let mut p = plan();
        p.status = Status::Partial;
        p.recommendation = None;
        p.stop_detail = "stopped after 2 trials (--max-trials)".into();
        let svg = svg(&p).unwrap();
        assert!(svg.contains("PARTIAL"));
        assert!(svg.contains("no recommendation"));
        p.trials.clear();
        let svg = super::svg(&p).unwrap();
        assert!(svg.contains("no trial that fit measured a step time"));
        png(&p).unwrap();
    }

    #[test]
    fn targets_are_checked() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            check_target(&d.path().join("a.svg")).unwrap(),
            PlotFormat::Svg
        );
        assert_eq!(
            check_target(&d.path().join("a.Png")).unwrap(),
            PlotFormat::Png
        );
        let e = check_target(&d.path().join("a.txt"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot draw a .txt image"), "{e}");
        let e = check_target(&d.path().join("plot"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ending in .svg or .png"), "{e}");
        let e = check_target(&d.path().join("no/such/a.svg"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
        std::fs::create_dir(d.path().join("x.svg")).unwrap();
        let e = check_target(&d.path().join("x.svg"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a directory"), "{e}");
        // a bad extension is refused by render too, and nothing is written
        assert!(matches!(
            render(&plan(), &d.path().join("b.jpg")),
            Err(PlotError::Target(_))
        ));
        assert!(!d.path().join("b.jpg").exists());
        // a directory gone after the check: a write error (exit 3 in main), not a usage error
        assert!(matches!(
            render(&plan(), &d.path().join("gone/c.svg")),
            Err(PlotError::Write(_))
        ));
    }
}
