//! `top`'s report: the merged (subject, policy) pairs of the apps'
//! most-denied tables, and their text table (values from an endpoint
//! escaped for the terminal).

use std::fmt::Write as _;

use serde::Serialize;

/// `top`: the most denied (subject, policy) pairs over the endpoints.
#[derive(Debug, Serialize)]
pub(crate) struct TopReport {
    pub(crate) sources: Vec<TopSource>,
    /// Distinct (subject, policy) pairs over all tables.
    pub(crate) subjects: u64,
    /// The most denied first, at most `--limit`.
    pub(crate) entries: Vec<TopEntry>,
}

/// One endpoint's table.
#[derive(Debug, Serialize)]
pub(crate) struct TopSource {
    pub(crate) url: String,
    /// Denials it counted since its last reset.
    pub(crate) denials: u64,
    pub(crate) entries: u64,
    pub(crate) capacity: u64,
}

/// One (subject, policy), merged.
#[derive(Debug, Serialize)]
pub(crate) struct TopEntry {
    /// As the store keys it (plain, or `#` and a SHA-256).
    pub(crate) subject: String,
    pub(crate) policy: String,
    /// The tables' counts summed.
    pub(crate) count: u64,
    /// The true count is at least this (each table's error taken off)...
    pub(crate) at_least: u64,
    /// ...and at most this (a full table's smallest count added for each
    /// table it is absent from).
    pub(crate) at_most: u64,
    /// Which sources held it (indexes into `sources`).
    #[serde(skip)]
    pub(crate) seen_by: Vec<usize>,
}

pub(super) fn text(report: &TopReport, out: &mut String) {
    for source in &report.sources {
        let _ = writeln!(
            out,
            "source  {}  {} denials, {} of {} entries",
            shown_field(&source.url),
            source.denials,
            source.entries,
            source.capacity
        );
    }
    if report.entries.is_empty() {
        let _ = writeln!(out, "\nno denials counted");
        return;
    }
    let rows: Vec<[String; 4]> = report
        .entries
        .iter()
        .map(|e| {
            let bounds = if e.at_least == e.count && e.at_most == e.count {
                "exact".to_owned()
            } else {
                format!("{}..{}", e.at_least, e.at_most)
            };
            [
                e.count.to_string(),
                bounds,
                shown_field(&e.policy),
                shown_field(&e.subject),
            ]
        })
        .collect();
    let header = ["DENIED", "BOUNDS", "POLICY", "SUBJECT"];
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([header[i].len()])
            .max()
            .unwrap_or(0)
    };
    let (w0, w1, w2) = (width(0), width(1), width(2));
    out.push('\n');
    let _ = writeln!(
        out,
        "{:>w0$}  {:<w1$}  {:<w2$}  {}",
        header[0], header[1], header[2], header[3]
    );
    for [count, bounds, policy, subject] in &rows {
        let _ = writeln!(out, "{count:>w0$}  {bounds:<w1$}  {policy:<w2$}  {subject}");
    }
    if report.subjects > report.entries.len() as u64 {
        let _ = writeln!(
            out,
            "... {} more (--limit N)",
            report.subjects - report.entries.len() as u64
        );
    }
}

/// A value from an endpoint, safe on a terminal: printable characters
/// as they are, anything else escaped; at most 100 characters.
fn shown_field(text: &str) -> String {
    let mut shown: String = text
        .chars()
        .take(100)
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    if text.chars().count() > 100 {
        shown.push('…');
    }
    shown
}
