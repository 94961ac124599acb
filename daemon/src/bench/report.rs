//! The table `dltsub bench all` prints: one row per measurement, grouped by section, and
//! the same rows as tab-separated values for the plot script (`--tsv FILE`).

use std::fmt::Write as _;

/// One measurement.
#[derive(Debug, Clone)]
pub struct Row {
    /// `drain`, `ingest`, `latency`, `failover`, `claims`, `memory`, `peers`.
    pub section: &'static str,
    /// What was measured, e.g. `postgres, 2 instances`.
    pub case: String,
    /// The headline figure, formatted, e.g. `12,345 batches/s`, or `unavailable: …`.
    pub result: String,
    /// Supporting figures.
    pub detail: String,
    /// The headline figure as a number, for the TSV (`NaN` when there is none).
    pub value: f64,
}

#[derive(Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    pub fn add(
        &mut self,
        section: &'static str,
        case: String,
        result: String,
        detail: String,
        value: f64,
    ) {
        let row = Row {
            section,
            case,
            result,
            detail,
            value,
        };
        // Rows are also shown as they come, so a long run shows progress.
        eprintln!(
            "  [{}] {}: {} ({})",
            row.section, row.case, row.result, row.detail
        );
        self.rows.push(row);
    }

    pub fn unavailable(&mut self, section: &'static str, case: String, reason: String) {
        self.add(
            section,
            case,
            format!("unavailable: {reason}"),
            String::new(),
            f64::NAN,
        );
    }

    pub fn render(&self) -> String {
        let width = |f: fn(&Row) -> &str, title: &str| {
            self.rows
                .iter()
                .map(|row| f(row).chars().count())
                .chain([title.len()])
                .max()
                .unwrap_or(0)
        };
        let w_section = width(|r| r.section, "section");
        let w_case = width(|r| &r.case, "case");
        let w_result = width(|r| &r.result, "result");
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<w_section$}  {:<w_case$}  {:<w_result$}  detail",
            "section", "case", "result"
        );
        let _ = writeln!(
            out,
            "{}  {}  {}  {}",
            "-".repeat(w_section),
            "-".repeat(w_case),
            "-".repeat(w_result),
            "-".repeat(6)
        );
        for row in &self.rows {
            let _ = writeln!(
                out,
                "{:<w_section$}  {:<w_case$}  {:<w_result$}  {}",
                row.section, row.case, row.result, row.detail
            );
        }
        out
    }

    pub fn tsv(&self) -> String {
        let mut out = String::from("section\tcase\tvalue\tresult\tdetail\n");
        for row in &self.rows {
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}",
                row.section, row.case, row.value, row.result, row.detail
            );
        }
        out
    }
}

/// `12345.6` → `12,346`.
pub fn thousands(value: f64) -> String {
    let rounded = value.round() as i64;
    let digits = rounded.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if rounded < 0 { format!("-{out}") } else { out }
}

pub fn millis(seconds: f64) -> String {
    if seconds >= 10.0 {
        format!("{seconds:.1} s")
    } else if seconds >= 1.0 {
        format!("{seconds:.2} s")
    } else {
        format!("{:.1} ms", seconds * 1e3)
    }
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A ratio with three significant digits: `0.0123`, `0.456`, `1.23`.
pub fn ratio(value: f64) -> String {
    if value >= 1.0 {
        format!("{value:.2}")
    } else if value >= 0.1 {
        format!("{value:.3}")
    } else {
        format!("{value:.4}")
    }
}
