//! What a scenario hands back: a summary table for the terminal, the same
//! figures as JSON (`--json`), whether the invariants held, and the time
//! series drawn as an SVG chart (`--svg`).

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;
use serde_json::Value;

use crate::stats::Sample;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub target: String,
    /// `false` when an invariant check failed (the process then exits 1).
    pub invariants_held: bool,
    /// The summary table, in order.
    pub rows: Vec<(String, String)>,
    /// Every figure, for `--json`.
    pub figures: Value,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<Sample>,
}

impl Report {
    pub fn new(scenario: &str, target: &str) -> Self {
        Self {
            scenario: scenario.to_owned(),
            target: target.to_owned(),
            invariants_held: true,
            rows: Vec::new(),
            figures: Value::Object(Default::default()),
            series: Vec::new(),
        }
    }

    pub fn row(&mut self, name: &str, value: impl Into<String>) {
        self.rows.push((name.to_owned(), value.into()));
    }

    /// A figure recorded as a number, or 0.
    pub fn figure_f64(&self, name: &str) -> f64 {
        self.figures
            .get(name)
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    }

    pub fn figure(&mut self, name: &str, value: impl Serialize) {
        if let Value::Object(map) = &mut self.figures {
            map.insert(
                name.to_owned(),
                serde_json::to_value(value).unwrap_or(Value::Null),
            );
        }
    }

    pub fn table(&self) -> String {
        let width = self.rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = format!("== {} against {} ==\n", self.scenario, self.target);
        for (k, v) in &self.rows {
            out.push_str(&format!("{k:<width$}  {v}\n"));
        }
        out.push_str(&format!(
            "{:<width$}  {}\n",
            "invariants",
            if self.invariants_held {
                "held"
            } else {
                "VIOLATED"
            }
        ));
        out
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_vec_pretty(self)?)?;
        Ok(())
    }

    /// Three stacked charts over time: queue length, admitted visitors,
    /// admissions per second.
    pub fn write_svg(&self, path: &Path) -> anyhow::Result<()> {
        let root = SVGBackend::new(path, (900, 720)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let panels = root.split_evenly((3, 1));
        let end = self.series.last().map_or(1.0, |s| s.t_s.max(0.1));
        let lines: [Line; 3] = [
            ("queue length", |s| s.queue as f64, BLUE),
            ("admitted visitors", |s| s.admitted as f64, GREEN),
            ("admissions per second", |s| s.admissions_per_s, RED),
        ];
        for (panel, (name, value, color)) in panels.iter().zip(lines) {
            let top = self
                .series
                .iter()
                .map(value)
                .fold(1.0f64, f64::max)
                .mul_add(1.1, 0.0);
            let mut chart = ChartBuilder::on(panel)
                .caption(format!("{} — {name}", self.scenario), ("sans-serif", 16))
                .margin(8)
                .x_label_area_size(28)
                .y_label_area_size(48)
                .build_cartesian_2d(0f64..end, 0f64..top)
                .map_err(plot_err)?;
            chart
                .configure_mesh()
                .x_desc("seconds")
                .draw()
                .map_err(plot_err)?;
            chart
                .draw_series(LineSeries::new(
                    self.series.iter().map(|s| (s.t_s, value(s))),
                    &color,
                ))
                .map_err(plot_err)?;
        }
        root.present().map_err(plot_err)?;
        Ok(())
    }
}

/// A chart panel: its name, what it plots, its colour.
type Line = (&'static str, fn(&Sample) -> f64, RGBColor);

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e:?}")
}

/// `x` as a ratio to the baseline, for the table.
pub fn ratio(x: f64, baseline: f64) -> f64 {
    if baseline > 0.0 {
        x / baseline
    } else {
        f64::NAN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_json_and_svg_are_written() {
        let mut r = Report::new("surge", "http://127.0.0.1:1");
        r.row("joins/s", "123.0");
        r.figure("joins_per_second", 123.0);
        r.series = crate::stats::series(
            &[
                crate::stats::Seen::Joined(0.0),
                crate::stats::Seen::Admitted(0.5),
            ],
            0.25,
            1.0,
        );
        let t = r.table();
        assert!(
            t.contains("joins/s") && t.contains("invariants  held"),
            "{t}"
        );
        let dir = tempfile::tempdir().unwrap();
        r.write_json(&dir.path().join("r.json")).unwrap();
        let back: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
        assert_eq!(back["figures"]["joins_per_second"], 123.0);
        r.write_svg(&dir.path().join("r.svg")).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("r.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("admissions per second"));
        assert!((ratio(50.0, 100.0) - 0.5).abs() < 1e-9);
        assert!(ratio(1.0, 0.0).is_nan());
    }
}
