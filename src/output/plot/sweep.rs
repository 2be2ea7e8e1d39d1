//! The `--sweep` panel, below the plan's own panels: the largest micro-batch proven at each point
//! and the tokens per micro-batch it makes (second axis), against the swept parameter.

use super::{compact, DrawResult, FIT, FONT, LIMIT, RECOMMENDED};
use crate::plan::{Plan, Sweep};
use plotters::chart::DualCoordChartContext;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Height in pixels the panel adds to the image (0 without a sweep).
pub fn extra_height(plan: &Plan) -> u32 {
    if plan.sweep.is_some() {
        460
    } else {
        0
    }
}

const TOKENS: RGBColor = RGBColor(0xFF, 0x7F, 0x0E);

/// The panel's scales: each point with a proven answer as (log₂ of its value, its largest
/// micro-batch, its tokens per micro-batch), the x range of every point, and the two y axes' tops.
struct Scales {
    pts: Vec<(f64, f64, f64)>,
    x_min: f64,
    x_max: f64,
    pad: f64,
    b_max: f64,
    t_max: f64,
}

/// The parameter on a log₂ axis: sweeps usually double it.
fn x(v: u64) -> f64 {
    (v.max(1) as f64).log2()
}

impl Scales {
    fn of(sw: &Sweep) -> Self {
        let pts: Vec<(f64, f64, f64)> = sw
            .points
            .iter()
            .filter_map(|p| {
                Some((
                    x(p.value),
                    p.max_fitting_batch? as f64,
                    p.tokens_per_micro_batch? as f64,
                ))
            })
            .collect();
        let x_min = sw
            .points
            .iter()
            .map(|p| x(p.value))
            .fold(f64::MAX, f64::min);
        let x_max = sw
            .points
            .iter()
            .map(|p| x(p.value))
            .fold(f64::MIN, f64::max);
        Scales {
            pad: ((x_max - x_min) * 0.06).max(0.1),
            b_max: pts.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15,
            t_max: pts.iter().map(|p| p.2).fold(1.0, f64::max) * 1.15,
            pts,
            x_min,
            x_max,
        }
    }
}

/// The panel's chart: largest micro-batch on the left axis, tokens per micro-batch on the right.
type SweepChart<'a, DB> = DualCoordChartContext<
    'a,
    DB,
    Cartesian2d<RangedCoordf64, RangedCoordf64>,
    Cartesian2d<RangedCoordf64, RangedCoordf64>,
>;

pub fn draw<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, sw: &Sweep) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let area = area.margin(0, 10, 16, 16);
    let s = Scales::of(sw);
    let xs = (s.x_min - s.pad)..(s.x_max + s.pad);
    let mut chart = ChartBuilder::on(&area)
        .caption(
            format!(
                "Sweep of {}: the largest micro-batch proven at each point ({} trials in all)",
                sw.parameter,
                sw.points.iter().map(|p| p.trials).sum::<usize>()
            ),
            (FONT, 20),
        )
        .margin(10)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .right_y_label_area_size(90)
        .build_cartesian_2d(xs.clone(), 0f64..s.b_max)?
        .set_secondary_coord(xs, 0f64..s.t_max);
    draw_axes(&mut chart, sw)?;
    // Each point's value on the axis.
    chart.draw_series(sw.points.iter().map(|p| {
        Text::new(
            p.value.to_string(),
            (x(p.value), s.b_max * 0.02),
            (FONT, 15).into_font().color(&LIMIT),
        )
    }))?;
    if s.pts.is_empty() {
        chart.draw_series(std::iter::once(Text::new(
            "no point has a proven answer",
            (s.x_min, s.b_max * 0.5),
            (FONT, 18).into_font().color(&LIMIT),
        )))?;
        return Ok(());
    }
    draw_answers(&mut chart, sw, &s.pts)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleRight)
        .margin(12)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(0x80, 0x80, 0x80))
        .label_font((FONT, 15))
        .draw()?;
    Ok(())
}

/// The mesh and both y axes (the x axis is labelled by each point's value instead).
fn draw_axes<DB: DrawingBackend>(chart: &mut SweepChart<'_, DB>, sw: &Sweep) -> DrawResult
where
    DB::ErrorType: 'static,
{
    chart
        .configure_mesh()
        .x_desc(format!("{} (log scale)", sw.parameter))
        .y_desc("largest micro-batch (samples)")
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(6)
        .axis_desc_style((FONT, 18))
        .label_style((FONT, 15))
        .y_label_formatter(&|y: &f64| compact(*y))
        .max_light_lines(1)
        .light_line_style(RGBColor(0xF0, 0xF0, 0xF0))
        .bold_line_style(RGBColor(0xD0, 0xD0, 0xD0))
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("tokens per micro-batch")
        .axis_desc_style((FONT, 18))
        .label_style((FONT, 15))
        .y_labels(6)
        .y_label_formatter(&|y: &f64| compact(*y))
        .draw()?;
    Ok(())
}

/// The largest micro-batch and the tokens per micro-batch of every point with a proven answer
/// (`pts`, as in [`Scales`]), with the plan's own point marked.
fn draw_answers<DB: DrawingBackend>(
    chart: &mut SweepChart<'_, DB>,
    sw: &Sweep,
    pts: &[(f64, f64, f64)],
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    chart
        .draw_series(LineSeries::new(
            pts.iter().map(|p| (p.0, p.1)),
            FIT.stroke_width(2),
        ))?
        .label("largest micro-batch (proven at each point)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], FIT.stroke_width(2)));
    chart.draw_series(pts.iter().map(|p| Circle::new((p.0, p.1), 5, FIT.filled())))?;
    chart
        .draw_secondary_series(LineSeries::new(
            pts.iter().map(|p| (p.0, p.2)),
            TOKENS.stroke_width(2),
        ))?
        .label("tokens per micro-batch (right axis)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], TOKENS.stroke_width(2)));
    chart.draw_secondary_series(
        pts.iter()
            .map(|p| TriangleMarker::new((p.0, p.2), 6, TOKENS.filled())),
    )?;
    if let Some(at) = plan_point_mark(sw, pts) {
        chart.draw_series(std::iter::once(Circle::new(
            at,
            10,
            RECOMMENDED.stroke_width(3),
        )))?;
    }
    Ok(())
}

/// Where the ring around the plan's own point goes (its x on the log₂ axis, its largest
/// micro-batch), when that point has a proven answer.
fn plan_point_mark(sw: &Sweep, pts: &[(f64, f64, f64)]) -> Option<(f64, f64)> {
    let at = x(sw.plan_point);
    pts.iter().find(|p| p.0 == at).map(|p| (p.0, p.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan's own point is ringed where it is drawn: on the log₂ axis of the swept values, so
    /// the point of `--seq-len 512` is at x = 9 with its largest micro-batch.
    #[test]
    fn the_plans_own_point_is_ringed_on_the_log_axis() {
        let point = |value: u64, max: u64| crate::plan::SweepPoint {
            max_fitting_batch: Some(max),
            tokens_per_micro_batch: Some(max * value),
            ..serde_json::from_value(serde_json::json!({
                "value": value, "status": "complete", "stop_reason": "proven",
                "tokens_per_sample": value, "trials": 3, "seconds": 1.0,
                "model_fingerprint": "f", "trial_records": []
            }))
            .unwrap()
        };
        let sw = Sweep {
            parameter: "seq-len".into(),
            plan_point: 512,
            points: vec![point(256, 40), point(512, 20), point(1024, 9)],
        };
        let pts = Scales::of(&sw).pts;
        assert_eq!(plan_point_mark(&sw, &pts), Some((9.0, 20.0)));
        let other = Sweep {
            plan_point: 2048,
            ..sw.clone()
        };
        assert_eq!(plan_point_mark(&other, &pts), None);
    }
}
