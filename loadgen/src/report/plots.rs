//! SVG plots: attainment against offered load, and the TTFT distribution at the highest load.

use super::meta::TtftSample;
use super::RunSummary;
use crate::error::Error;
use plotters::prelude::*;
use std::path::Path;

type PlotResult = Result<(), Box<dyn std::error::Error>>;
/// Reads one value of a run, e.g. its TTFT attainment.
type Metric = fn(&RunSummary) -> f64;

fn wrap(path: &Path, r: PlotResult) -> Result<(), Error> {
    r.map_err(|e| Error::Plot {
        path: path.to_path_buf(),
        problem: e.to_string(),
    })
}

/// Policies in order of first appearance.
fn policies<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for n in names {
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// Tableau's ten categorical colours: distinct, and readable on white.
const COLORS: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

fn color(i: usize) -> RGBAColor {
    let (r, g, b) = COLORS[i % COLORS.len()];
    RGBColor(r, g, b).to_rgba()
}

/// `attainment_vs_rps.svg`: TTFT (left) and TBT (right) attainment against RPS, one line per
/// policy.
pub fn attainment_vs_rps(path: &Path, runs: &[RunSummary]) -> Result<(), Error> {
    wrap(path, draw_attainment(path, runs))
}

fn draw_attainment(path: &Path, runs: &[RunSummary]) -> PlotResult {
    let root = SVGBackend::new(path, (1200, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);
    let names = policies(runs.iter().map(|r| r.policy.as_str()));
    let lo = runs.iter().map(|r| r.rps).fold(f64::INFINITY, f64::min);
    let hi = runs.iter().map(|r| r.rps).fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if runs.is_empty() {
        (0.0, 1.0)
    } else {
        let pad = ((hi - lo) * 0.05).max(0.5);
        ((lo - pad).max(0.0), hi + pad)
    };
    let panels: [(_, &str, Metric); 2] = [
        (left, "TTFT attainment", |r| r.ttft_attainment),
        (right, "TBT attainment", |r| r.tbt_attainment),
    ];
    for (area, title, value) in panels {
        let mut chart = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(lo..hi, 0.0..1.02)?;
        chart
            .configure_mesh()
            .x_desc("offered load (requests/s)")
            .y_desc("attainment")
            .y_label_formatter(&|y| format!("{:.0}%", 100.0 * y))
            .draw()?;
        for (i, name) in names.iter().enumerate() {
            let c = color(i);
            let mut pts: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| r.policy == *name)
                .map(|r| (r.rps, value(r)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// `ttft_cdf.svg`: the TTFT CDF of each policy at the highest RPS of the sweep. Unserved
/// requests sit at `end - arrival`, so a starved tail shows as a late jump.
pub(crate) fn ttft_cdf(
    path: &Path,
    samples: &[TtftSample],
    slo_s: Option<f64>,
) -> Result<(), Error> {
    wrap(path, draw_cdf(path, samples, slo_s))
}

fn draw_cdf(path: &Path, samples: &[TtftSample], slo_s: Option<f64>) -> PlotResult {
    let top = samples
        .iter()
        .map(|s| s.rps)
        .fold(f64::NEG_INFINITY, f64::max);
    let chosen: Vec<&TtftSample> = samples
        .iter()
        .filter(|s| (s.rps - top).abs() <= 1e-9 * top.abs().max(1.0))
        .collect();
    let x_max = chosen
        .iter()
        .filter_map(|s| s.ttft_s.last().copied())
        .chain(slo_s)
        .fold(0.0, f64::max);
    let x_max = if x_max > 0.0 { x_max * 1.05 } else { 1.0 };
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = if chosen.is_empty() {
        "TTFT CDF".to_string()
    } else {
        format!("TTFT CDF at {top:.2} requests/s")
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..x_max, 0.0..1.02)?;
    chart
        .configure_mesh()
        .x_desc("time to first token (s); unserved at end of run")
        .y_desc("fraction of requests")
        .y_label_formatter(&|y| format!("{:.0}%", 100.0 * y))
        .draw()?;
    let names = policies(chosen.iter().map(|s| s.policy.as_str()));
    for s in &chosen {
        let i = names.iter().position(|n| *n == s.policy).unwrap_or(0);
        let c = color(i);
        let n = s.ttft_s.len() as f64;
        let mut pts = vec![(0.0, 0.0)];
        for (k, &t) in s.ttft_s.iter().enumerate() {
            pts.push((t, k as f64 / n));
            pts.push((t, (k + 1) as f64 / n));
        }
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))?
            .label(s.policy.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    if let Some(slo) = slo_s {
        let grey = RGBColor(120, 120, 120);
        chart
            .draw_series(LineSeries::new(
                vec![(slo, 0.0), (slo, 1.02)],
                grey.stroke_width(1),
            ))?
            .label(format!("TTFT SLO {slo} s"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(1))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
