//! `portcullis top`: fetches the most-denied tables that apps serve from
//! their `TopDenied` (one URL per instance), checks their schema, and
//! merges them by (subject, policy) with the bounds the space-saving
//! algorithm gives. Every request has the `--timeout`; a body is read up
//! to a fixed size.

use std::collections::HashMap;
use std::time::Duration;

use portcullis::tower::{TOP_DENIED_FORMAT, TOP_DENIED_VERSION};
use serde::Deserialize;

use crate::failure::Failure;
use crate::report::{TopEntry, TopReport, TopSource};

/// The largest body read: a full table of 10 000 entries is under 2 MB.
const MAX_BODY: usize = 8 * 1024 * 1024;

/// A table as `TopDenied::to_json` writes it.
#[derive(Debug, Deserialize)]
pub(crate) struct Table {
    // `format` and `version` are checked before (`parse`).
    capacity: u64,
    denials: u64,
    entries: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    subject: String,
    policy: String,
    count: u64,
    error: u64,
}

/// Fetches every URL, then merges; the first failure stops, naming its URL.
pub(crate) async fn top(
    urls: &[String],
    limit: usize,
    timeout: Duration,
) -> Result<TopReport, Failure> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .map_err(|error| Failure::endpoint("cannot make an HTTP client", &error))?;
    let mut tables = Vec::with_capacity(urls.len());
    for url in urls {
        tables.push((url.clone(), fetch(&client, url, timeout).await?));
    }
    Ok(merge(&tables, limit))
}

async fn fetch(client: &reqwest::Client, url: &str, timeout: Duration) -> Result<Table, Failure> {
    if url.starts_with("https://") {
        return Err(Failure::usage(format!(
            "{url}: this build reads plain http:// endpoints only; serve the admin endpoint on an internal port over HTTP, or reach it through a local proxy"
        )));
    }
    if !url.starts_with("http://") {
        return Err(Failure::usage(format!(
            "{url}: give the endpoint's full URL, as http://10.0.0.5:9000/admin/top-denied"
        )));
    }
    let failed = |doing: &str, error: &reqwest::Error| {
        let what = if error.is_timeout() {
            format!("{url} did not answer within {timeout:?} ({doing}): check the address, or pass a longer --timeout")
        } else if error.is_connect() {
            format!("cannot reach {url}: check the address and that the app serves its admin endpoint there")
        } else {
            format!("{url}: {doing} failed")
        };
        Failure::endpoint(&what, error)
    };
    let mut response = client
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|error| failed("the request", &error))?;
    if !response.status().is_success() {
        return Err(Failure::endpoint_message(format!(
            "{url} answered {}: give the URL of the app's top-denied endpoint (the route that returns TopDenied::to_json)",
            response.status()
        )));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| failed("reading the body", &error))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(Failure::endpoint_message(format!(
                "{url} sent more than {MAX_BODY} bytes: not a top-denied table (TopDenied holds at most 10 000 entries)"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    parse(url, &body)
}

/// A body read as a table of the known schema.
pub(crate) fn parse(url: &str, body: &[u8]) -> Result<Table, Failure> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|error| {
        Failure::endpoint(
            &format!("{url} did not answer JSON: give the URL of the app's top-denied endpoint (the route that returns TopDenied::to_json)"),
            &error,
        )
    })?;
    let format = value.get("format").and_then(serde_json::Value::as_str);
    let version = value.get("version").and_then(serde_json::Value::as_u64);
    if format != Some(TOP_DENIED_FORMAT) {
        return Err(Failure::endpoint_message(format!(
            "{url} answered JSON that is not a top-denied table (its \"format\" is not {TOP_DENIED_FORMAT:?}): give the URL of the route that returns TopDenied::to_json"
        )));
    }
    if version != Some(TOP_DENIED_VERSION) {
        return Err(Failure::endpoint_message(format!(
            "{url} serves a top-denied table of version {}, this portcullis reads version {TOP_DENIED_VERSION}: use the portcullis release of the app's portcullis-tower",
            version.map_or_else(|| "(none)".to_owned(), |v| v.to_string())
        )));
    }
    serde_json::from_value(value).map_err(|error| {
        Failure::endpoint(
            &format!("{url} answered a top-denied table of version {TOP_DENIED_VERSION} that does not parse"),
            &error,
        )
    })
}

/// Sums each (subject, policy) over the tables. A table that is full
/// holds every subject denied more than its smallest count there, so a
/// subject absent from it was denied there at most that often: the
/// merged `at_most` adds it. `at_least` takes each table's `error` off.
pub(crate) fn merge(tables: &[(String, Table)], limit: usize) -> TopReport {
    let mut merged: HashMap<(String, String), TopEntry> = HashMap::new();
    let mut sources = Vec::new();
    let mut unseen_bound = Vec::new();
    for (i, (url, table)) in tables.iter().enumerate() {
        let full = table.capacity > 0 && table.entries.len() as u64 >= table.capacity;
        let smallest = if full {
            table.entries.iter().map(|e| e.count).min().unwrap_or(0)
        } else {
            0
        };
        unseen_bound.push(smallest);
        sources.push(TopSource {
            url: url.clone(),
            denials: table.denials,
            entries: table.entries.len() as u64,
            capacity: table.capacity,
        });
        for entry in &table.entries {
            let merged_entry = merged
                .entry((entry.subject.clone(), entry.policy.clone()))
                .or_insert_with(|| TopEntry {
                    subject: entry.subject.clone(),
                    policy: entry.policy.clone(),
                    count: 0,
                    at_least: 0,
                    at_most: 0,
                    seen_by: Vec::new(),
                });
            merged_entry.count = merged_entry.count.saturating_add(entry.count);
            merged_entry.at_least = merged_entry
                .at_least
                .saturating_add(entry.count.saturating_sub(entry.error));
            merged_entry.seen_by.push(i);
        }
    }
    let mut entries: Vec<TopEntry> = merged
        .into_values()
        .map(|mut entry| {
            let unseen: u64 = unseen_bound
                .iter()
                .enumerate()
                .filter(|(i, _)| !entry.seen_by.contains(i))
                .map(|(_, bound)| *bound)
                .fold(0, u64::saturating_add);
            entry.at_most = entry.count.saturating_add(unseen);
            entry
        })
        .collect();
    entries.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then(b.at_least.cmp(&a.at_least))
            .then_with(|| a.subject.cmp(&b.subject))
            .then_with(|| a.policy.cmp(&b.policy))
    });
    let total = entries.len();
    entries.truncate(limit);
    TopReport {
        sources,
        subjects: total as u64,
        entries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(capacity: u64, entries: &[(&str, &str, u64, u64)]) -> Table {
        Table {
            capacity,
            denials: entries.iter().map(|e| e.2).sum(),
            entries: entries
                .iter()
                .map(|&(subject, policy, count, error)| Entry {
                    subject: subject.to_owned(),
                    policy: policy.to_owned(),
                    count,
                    error,
                })
                .collect(),
        }
    }

    #[test]
    fn merged_counts_carry_the_bounds_of_each_table() {
        let a = table(2, &[("alice", "m", 10, 0), ("bob", "m", 4, 2)]);
        let b = table(5, &[("alice", "m", 3, 0), ("carol", "d", 1, 0)]);
        let report = merge(&[("a".into(), a), ("b".into(), b)], 10);
        let got: Vec<(&str, &str, u64, u64, u64)> = report
            .entries
            .iter()
            .map(|e| {
                (
                    e.subject.as_str(),
                    e.policy.as_str(),
                    e.count,
                    e.at_least,
                    e.at_most,
                )
            })
            .collect();
        // Table a is full (smallest count 4): carol may have had up to 4
        // there. Table b is not: who is absent had none.
        assert_eq!(
            got,
            [
                ("alice", "m", 13, 13, 13),
                ("bob", "m", 4, 2, 4),
                ("carol", "d", 1, 1, 5)
            ]
        );
        assert_eq!(report.subjects, 3);
        let report = merge(&[("a".into(), table(2, &[("x", "m", 1, 0)]))], 0);
        assert!(report.entries.is_empty());
        assert_eq!(report.subjects, 1);
    }

    #[test]
    fn other_bodies_are_refused_with_what_to_do() {
        let refused = |body: &str| {
            parse("http://h/x", body.as_bytes())
                .unwrap_err()
                .to_string()
        };
        assert!(refused("<html>").contains("did not answer JSON"));
        assert!(refused("{\"status\":\"ok\"}").contains("not a top-denied table"));
        let newer = format!("{{\"format\":\"{TOP_DENIED_FORMAT}\",\"version\":99}}");
        assert!(
            refused(&newer).contains("version 99"),
            "{}",
            refused(&newer)
        );
        let broken = format!(
            "{{\"format\":\"{TOP_DENIED_FORMAT}\",\"version\":{TOP_DENIED_VERSION},\"entries\":3}}"
        );
        assert!(refused(&broken).contains("does not parse"));
    }
}
