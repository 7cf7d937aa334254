//! Figures a workload reports, and the tables the comparison prints.

use std::io::Write;
use std::time::Duration;

use hdrhistogram::Histogram;

/// One measured figure.
#[derive(Clone, Debug)]
pub struct Figure {
    pub name: String,
    pub unit: &'static str,
    pub value: f64,
}

/// What one run of a workload measured, in the order it was measured.
#[derive(Default, Debug)]
pub struct Report(pub Vec<Figure>);

impl Report {
    /// Appends a figure; figures print in the order they were added.
    pub fn add(&mut self, name: impl Into<String>, unit: &'static str, value: f64) {
        self.0.push(Figure {
            name: name.into(),
            unit,
            value,
        });
    }

    /// p50, p99 and max of a latency histogram kept in microseconds, in ms.
    pub fn latency(&mut self, name: &str, h: &Histogram<u64>) {
        if h.is_empty() {
            return;
        }
        for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
            self.add(
                format!("{name} {label}"),
                "ms",
                h.value_at_quantile(q) as f64 / 1e3,
            );
        }
        self.add(format!("{name} max"), "ms", h.max() as f64 / 1e3);
    }

    /// Prints one figure a line to stdout.
    pub fn print(&self) {
        for f in &self.0 {
            let _ = writeln!(
                std::io::stdout(),
                "{:<32} {:>14} {}",
                f.name,
                fmt(f.value),
                f.unit
            );
        }
    }

    /// The figure called `name`, if it was added.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.iter().find(|f| f.name == name).map(|f| f.value)
    }
}

/// A latency histogram in microseconds, from 1 µs to 10 minutes.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

/// `d` in whole microseconds, at least 1, as the histograms record it
/// (their lowest bound is 1).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// A number with three significant digits or more, thousands grouped.
pub fn fmt(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v.abs() >= 1000.0 {
        let s = format!("{:.0}", v);
        let (sign, digits) = s.split_at(usize::from(s.starts_with('-')));
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        format!("{sign}{out}")
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
