//! The reliability table: one row per scenario.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// One scenario's line in the report.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// The scenario's short name.
    pub scenario: String,
    /// What was done.
    pub action: String,
    /// Requests (or store calls) tried.
    pub tried: u64,
    /// Failures by kind (store errors, failure-policy answers, breaker skips).
    pub failures: BTreeMap<String, u64>,
    /// Decisions that contradict the ground truth (must be 0).
    pub wrong: u64,
    /// Time from the fault's end (or start, for failover) to the first
    /// correct decision of an affected subject.
    pub recover: Option<Duration>,
    /// Other figures worth printing under the table.
    pub notes: Vec<String>,
}

impl Row {
    /// A row for `scenario`, doing `action`.
    #[must_use]
    pub fn new(scenario: impl Into<String>, action: impl Into<String>) -> Self {
        Self {
            scenario: scenario.into(),
            action: action.into(),
            ..Self::default()
        }
    }

    /// Adds `n` failures of `kind` (zero counts are kept out of the table).
    pub fn fail(&mut self, kind: &str, n: u64) {
        if n > 0 {
            *self.failures.entry(kind.to_owned()).or_default() += n;
        }
    }

    /// Adds a note.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// The failures as `kind n, kind n`, or `none`.
    #[must_use]
    pub fn failures_text(&self) -> String {
        if self.failures.is_empty() {
            return "none".to_owned();
        }
        self.failures
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A duration as milliseconds with one decimal.
#[must_use]
pub fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

/// Renders rows as a Markdown table, with each row's notes listed below.
#[must_use]
pub fn table(rows: &[Row]) -> String {
    let header = [
        "scenario",
        "what was done",
        "tried",
        "failures by kind",
        "wrong",
        "time to recover",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|row| {
            [
                row.scenario.clone(),
                row.action.clone(),
                row.tried.to_string(),
                row.failures_text(),
                row.wrong.to_string(),
                row.recover.map_or_else(|| "-".to_owned(), ms),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        out.push('|');
        for (cell, width) in cells.iter().zip(widths) {
            let pad = width - cell.chars().count();
            let _ = write!(out, " {cell}{} |", " ".repeat(pad));
        }
        out.push('\n');
    };
    line(&mut out, &header.map(str::to_owned));
    out.push('|');
    for width in widths {
        let _ = write!(out, "{}|", "-".repeat(width + 2));
    }
    out.push('\n');
    for row in &cells {
        line(&mut out, row);
    }
    let notes: Vec<_> = rows.iter().filter(|r| !r.notes.is_empty()).collect();
    if !notes.is_empty() {
        out.push('\n');
        for row in notes {
            let _ = writeln!(out, "{}:", row.scenario);
            for note in &row.notes {
                let _ = writeln!(out, "  - {note}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_and_lists_notes() {
        let mut row = Row::new("kill", "SIGKILL under load");
        row.tried = 12;
        row.fail("unavailable", 3);
        row.fail("timeout", 0);
        row.recover = Some(Duration::from_micros(1500));
        row.note("scripts reloaded");
        let text = table(&[row, Row::new("x", "y")]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0].len(), lines[2].len());
        assert!(lines[2].contains("unavailable 3") && !lines[2].contains("timeout"));
        assert!(lines[2].contains("1.5 ms"));
        assert!(lines[3].contains("| none "));
        assert!(text.contains("  - scripts reloaded"));
    }
}
