//! What the commands print: one report per command, as text for people
//! (`to_text`) or one JSON object for scripts (`to_json`, serde_json;
//! times in whole microseconds, `*_us`), and the exit code it implies.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use portcullis::{Decision, Policy};
use serde::Serialize;

mod top;
pub(crate) use top::{TopEntry, TopReport, TopSource};

/// A command's result.
#[derive(Debug, Serialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub(crate) enum Report {
    Inspect(StateReport),
    Check(StateReport),
    Reset(ResetReport),
    Validate(ValidateReport),
    Diff(DiffReport),
    Top(TopReport),
}

/// The subject as given and as keyed.
#[derive(Debug, Serialize)]
pub(crate) struct SubjectView {
    /// The subject as given; `None` for a secret (API key, token).
    pub(crate) given: Option<String>,
    /// `--as`.
    pub(crate) kind: &'static str,
    /// The layer's key, which the store is given.
    pub(crate) layer_key: String,
    /// The subject between the braces of the store's keys.
    pub(crate) store_subject: String,
    /// Where the policies came from.
    pub(crate) policies_from: String,
}

/// A policy's numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PolicyView {
    pub(crate) algorithm: String,
    /// Permits per period.
    pub(crate) limit: u64,
    pub(crate) period_us: u64,
    /// The most admitted at once (the burst for bucket algorithms).
    pub(crate) capacity: u64,
}

impl PolicyView {
    pub(crate) fn of(policy: &Policy) -> Self {
        Self {
            algorithm: policy.algorithm().as_str().to_owned(),
            limit: policy.limit(),
            period_us: policy.period_micros(),
            capacity: policy.capacity(),
        }
    }

    pub(crate) fn text(&self) -> String {
        let mut text = format!(
            "{} {} per {}",
            self.algorithm,
            self.limit,
            human(Duration::from_micros(self.period_us))
        );
        if self.capacity != self.limit {
            let _ = write!(text, ", capacity {}", self.capacity);
        }
        text
    }
}

/// The raw key, as Redis holds it.
#[derive(Debug, Serialize)]
pub(crate) struct RawView {
    /// `none` (no state: full capacity), `string`, `zset`, ...
    pub(crate) redis_type: String,
    /// A string state's value.
    pub(crate) value: Option<String>,
    /// A sorted set's members (a sliding log's permits).
    pub(crate) members: Option<u64>,
    /// Milliseconds until Redis forgets the key.
    pub(crate) expires_in_ms: Option<u64>,
}

/// What a check or a peek says about one policy.
#[derive(Debug, Serialize)]
pub(crate) struct DecisionView {
    /// Whether a request of cost 1 is admitted now.
    pub(crate) allowed: bool,
    /// Permits of cost 1 available now.
    pub(crate) remaining: u64,
    /// The capacity `remaining` counts down from.
    pub(crate) capacity: u64,
    /// Until the subject is back to full capacity.
    pub(crate) reset_after_us: u64,
    /// The `t` of the layer's `RateLimit` header: seconds, rounded up,
    /// until a denied request may retry, else until back to full.
    pub(crate) reset_secs: u64,
    /// When denied: until a request of cost 1 is admitted.
    pub(crate) retry_after_us: Option<u64>,
    /// For a leaky bucket queue: the delay an admitted request waits.
    pub(crate) delay_us: u64,
}

impl DecisionView {
    pub(crate) fn of(decision: &Decision) -> Self {
        let retry = decision.retry_after();
        Self {
            allowed: decision.is_allowed(),
            remaining: decision.remaining(),
            capacity: decision.limit(),
            reset_after_us: micros(decision.reset_after()),
            reset_secs: ceil_secs(retry.unwrap_or(decision.reset_after())),
            retry_after_us: retry.map(micros),
            delay_us: micros(decision.delay()),
        }
    }
}

/// One policy of the subject.
#[derive(Debug, Serialize)]
pub(crate) struct PolicyState {
    pub(crate) policy: String,
    pub(crate) key: String,
    /// The policy as the limits file gives it.
    pub(crate) current: Option<PolicyView>,
    /// The numbers the stored state was written under (bucket
    /// algorithms store them with the state).
    pub(crate) written_under: Option<PolicyView>,
    /// The key as Redis holds it; `None` without a store.
    pub(crate) raw: Option<RawView>,
    /// The state read through the current policy (else the one it was
    /// written under).
    pub(crate) decision: Option<DecisionView>,
    /// With `check --dry-run`: `remaining` after a check of cost 1.
    pub(crate) remaining_after: Option<u64>,
    /// Anything the operator should know about this policy's reading.
    pub(crate) note: Option<String>,
}

/// Held leases of a concurrency policy.
#[derive(Debug, Serialize)]
pub(crate) struct LeaseView {
    pub(crate) policy: String,
    pub(crate) key: String,
    /// Leases live now.
    pub(crate) live: u64,
    /// Milliseconds until the last lease expires, unless renewed.
    pub(crate) expires_in_ms: Option<u64>,
    /// The live leases, soonest to expire first (at most 1 000 listed).
    pub(crate) held: Vec<HeldLease>,
}

/// One live lease.
#[derive(Debug, Serialize)]
pub(crate) struct HeldLease {
    /// Its id, 32 hex digits.
    pub(crate) id: String,
    /// Until it expires, unless its holder renews it.
    pub(crate) expires_in_us: u64,
}

/// Open reservations of a token budget.
#[derive(Debug, Serialize)]
pub(crate) struct ReservationsView {
    pub(crate) budget: String,
    /// The budget's open set; each record is this key, `:` and its id.
    pub(crate) key: String,
    /// Reservations open now (reserved, neither settled nor expired).
    pub(crate) open: u64,
    /// The tokens they hold: the sum of their estimates.
    pub(crate) tokens_held: u64,
    /// How they were found: `open set` (a budget with max_in_flight),
    /// `scan` (the budget's records, by SCAN on the subject's node) or
    /// `scan not permitted` (none listed: the ACL user lacks +scan).
    pub(crate) found_by: &'static str,
    /// The open reservations, soonest to expire first.
    pub(crate) reservations: Vec<OpenReservation>,
}

/// One open reservation.
#[derive(Debug, Serialize)]
pub(crate) struct OpenReservation {
    /// Its id, 32 hex digits.
    pub(crate) id: String,
    /// The tokens it holds (its estimate), until settled or expired.
    pub(crate) tokens: u64,
    /// Until it expires unsettled (its estimate then stays charged).
    pub(crate) expires_in_us: u64,
}

/// `inspect` and `check --dry-run`.
#[derive(Debug, Serialize)]
pub(crate) struct StateReport {
    pub(crate) subject: SubjectView,
    /// The store, its URL's password hidden; `None` without one.
    pub(crate) store: Option<String>,
    pub(crate) policies: Vec<PolicyState>,
    pub(crate) leases: Vec<LeaseView>,
    /// Open token reservations (`inspect --budget`).
    pub(crate) reservations: Vec<ReservationsView>,
    /// With `check --dry-run`: whether a check of cost 1 would be admitted.
    pub(crate) would_admit: Option<bool>,
    /// With `check --dry-run`, when denied: until it would be admitted.
    pub(crate) retry_after_us: Option<u64>,
}

/// `reset`.
#[derive(Debug, Serialize)]
pub(crate) struct ResetReport {
    pub(crate) subject: SubjectView,
    pub(crate) store: String,
    /// The keys deleted, and whether each held state.
    pub(crate) keys: Vec<ResetKey>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ResetKey {
    pub(crate) policy: String,
    pub(crate) key: String,
    pub(crate) had_state: bool,
}

/// `limits validate`.
#[derive(Debug, Serialize)]
pub(crate) struct ValidateReport {
    pub(crate) files: Vec<ValidFile>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ValidFile {
    pub(crate) file: String,
    /// The file's hash as `LimitsFile::hash` gives it.
    pub(crate) hash: String,
    pub(crate) policies: usize,
    pub(crate) tiers: usize,
    pub(crate) overrides: usize,
}

/// `limits diff`.
#[derive(Debug, Serialize)]
pub(crate) struct DiffReport {
    pub(crate) old: String,
    pub(crate) new: String,
    pub(crate) changes: Vec<Change>,
}

/// One difference between two limits files.
#[derive(Debug, Serialize)]
pub(crate) struct Change {
    /// `policy`, `defaults`, `tier` or `override`.
    pub(crate) item: &'static str,
    /// The policy's, tier's or override's subject's name.
    pub(crate) name: String,
    /// `added`, `removed` or `changed`.
    pub(crate) change: &'static str,
    pub(crate) old: Option<String>,
    pub(crate) new: Option<String>,
}

impl Report {
    pub(crate) fn exit_code(&self) -> ExitCode {
        let no = match self {
            Self::Check(report) => report.would_admit == Some(false),
            Self::Diff(report) => !report.changes.is_empty(),
            _ => false,
        };
        ExitCode::from(u8::from(no))
    }

    pub(crate) fn to_json(&self) -> String {
        // Serializing these plain structs cannot fail.
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }

    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        match self {
            Self::Inspect(report) | Self::Check(report) => state_text(report, &mut out),
            Self::Reset(report) => {
                subject_text(&report.subject, Some(&report.store), &mut out);
                for key in &report.keys {
                    let held = if key.had_state {
                        "deleted"
                    } else {
                        "had no state"
                    };
                    let _ = writeln!(out, "reset {}: {} {held}", key.policy, key.key);
                }
            }
            Self::Top(report) => top::text(report, &mut out),
            Self::Validate(report) => {
                for file in &report.files {
                    let _ = writeln!(
                        out,
                        "{}: valid: {} policies, {} tiers, {} overrides (hash {})",
                        file.file, file.policies, file.tiers, file.overrides, file.hash
                    );
                }
            }
            Self::Diff(report) => {
                if report.changes.is_empty() {
                    let _ = writeln!(
                        out,
                        "{} and {} give the same limits",
                        report.old, report.new
                    );
                }
                for change in &report.changes {
                    let sign = match change.change {
                        "added" => '+',
                        "removed" => '-',
                        _ => '~',
                    };
                    let _ = write!(
                        out,
                        "{sign} {} {}: {}",
                        change.item, change.name, change.change
                    );
                    match (&change.old, &change.new) {
                        (Some(old), Some(new)) => {
                            let _ = write!(out, ": {old} -> {new}");
                        }
                        (Some(one), None) | (None, Some(one)) => {
                            let _ = write!(out, ": {one}");
                        }
                        (None, None) => {}
                    }
                    out.push('\n');
                }
            }
        }
        out
    }
}

fn subject_text(subject: &SubjectView, store: Option<&str>, out: &mut String) {
    let given = subject.given.as_deref().unwrap_or("(secret, not shown)");
    let _ = writeln!(out, "subject    {given} (as {})", subject.kind);
    let _ = writeln!(out, "layer key  {}", subject.layer_key);
    if subject.store_subject != subject.layer_key {
        let _ = writeln!(out, "stored as  {}", subject.store_subject);
    }
    let _ = writeln!(
        out,
        "store      {}",
        store.unwrap_or("(none given: state not read)")
    );
    let _ = writeln!(out, "policies   {}", subject.policies_from);
}

fn state_text(report: &StateReport, out: &mut String) {
    subject_text(&report.subject, report.store.as_deref(), out);
    if let Some(admit) = report.would_admit {
        let verdict = if admit {
            "a check now would be ADMITTED (nothing was charged)".to_owned()
        } else {
            format!(
                "a check now would be DENIED, retry after {} (nothing was charged)",
                report
                    .retry_after_us
                    .map_or_else(|| "?".to_owned(), |us| human(Duration::from_micros(us)))
            )
        };
        let _ = writeln!(out, "verdict    {verdict}");
    }
    for policy in &report.policies {
        let _ = writeln!(out, "\npolicy {}  ({})", policy.policy, policy.key);
        if let Some(current) = &policy.current {
            let _ = writeln!(out, "  policy         {}", current.text());
        }
        if let Some(raw) = &policy.raw {
            let mut state = match raw.redis_type.as_str() {
                "none" => "none (full capacity)".to_owned(),
                "zset" => format!("{} entries", raw.members.unwrap_or(0)),
                _ => raw.value.clone().unwrap_or_default(),
            };
            if let Some(ms) = raw.expires_in_ms {
                let _ = write!(state, ", forgotten in {}", human(Duration::from_millis(ms)));
            }
            let _ = writeln!(out, "  state          {state}");
        }
        if let Some(written) = &policy.written_under {
            let _ = writeln!(out, "  written under  {}", written.text());
        }
        if let Some(decision) = &policy.decision {
            let _ = writeln!(
                out,
                "  remaining      {} of {}",
                decision.remaining, decision.capacity
            );
            if let Some(after) = policy.remaining_after {
                let _ = writeln!(out, "  after a check  {after}");
            }
            match decision.retry_after_us {
                Some(us) => {
                    let _ = writeln!(
                        out,
                        "  retry after    {} (denied now)",
                        human(Duration::from_micros(us))
                    );
                }
                None => {
                    let _ = writeln!(out, "  retry after    - (admits now)");
                }
            }
            let _ = writeln!(
                out,
                "  reset          {}s (RateLimit t); full in {}",
                decision.reset_secs,
                human(Duration::from_micros(decision.reset_after_us))
            );
            if decision.delay_us > 0 {
                let _ = writeln!(
                    out,
                    "  queue delay    {}",
                    human(Duration::from_micros(decision.delay_us))
                );
            }
        }
        if let Some(note) = &policy.note {
            let _ = writeln!(out, "  note           {note}");
        }
    }
    for lease in &report.leases {
        let _ = write!(
            out,
            "\nleases {}  ({})\n  held           {}",
            lease.policy, lease.key, lease.live
        );
        if let Some(ms) = lease.expires_in_ms {
            let _ = write!(
                out,
                ", the last expiring in {}",
                human(Duration::from_millis(ms))
            );
        }
        out.push('\n');
        for held in lease.held.iter().take(TEXT_LISTED) {
            let _ = writeln!(
                out,
                "  lease {}  expires in {}",
                held.id,
                human(Duration::from_micros(held.expires_in_us))
            );
        }
        more_text(lease.held.len(), out);
    }
    for budget in &report.reservations {
        let _ = writeln!(
            out,
            "\nreservations {}  ({})\n  open           {}, holding {} tokens (found by {})",
            budget.budget, budget.key, budget.open, budget.tokens_held, budget.found_by
        );
        for open in budget.reservations.iter().take(TEXT_LISTED) {
            let _ = writeln!(
                out,
                "  reservation {}  {} tokens, expires in {}",
                open.id,
                open.tokens,
                human(Duration::from_micros(open.expires_in_us))
            );
        }
        more_text(budget.reservations.len(), out);
    }
}

/// Leases or reservations listed one by one in the text report (`--json`
/// lists them all).
const TEXT_LISTED: usize = 10;

fn more_text(listed: usize, out: &mut String) {
    if listed > TEXT_LISTED {
        let _ = writeln!(
            out,
            "  ... and {} more (--json lists them)",
            listed - TEXT_LISTED
        );
    }
}

/// Whole microseconds, saturating.
pub(crate) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Whole seconds, rounded up (as the layer's headers round them).
fn ceil_secs(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_add(u64::from(duration.subsec_nanos() > 0))
}

/// A duration as a person reads it: `250ms`, `12.5s`, `3m 20s`, `2d 4h`.
pub(crate) fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    let secs = duration.as_secs();
    if ms < 1_000 {
        let us = duration.as_micros();
        return if us.is_multiple_of(1_000) {
            format!("{ms}ms")
        } else {
            format!("{us}us")
        };
    }
    if secs < 60 {
        let tenths = duration.subsec_millis() / 100;
        return if tenths == 0 {
            format!("{secs}s")
        } else {
            format!("{secs}.{tenths}s")
        };
    }
    let (days, hours, minutes, seconds) =
        (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    let parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")];
    let mut text = String::new();
    for (value, unit) in parts.into_iter().skip_while(|(v, _)| *v == 0) {
        if value > 0 {
            if !text.is_empty() {
                text.push(' ');
            }
            let _ = write!(text, "{value}{unit}");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_for_people() {
        assert_eq!(human(Duration::from_micros(1_500)), "1500us");
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_millis(12_500)), "12.5s");
        assert_eq!(human(Duration::from_secs(200)), "3m 20s");
        assert_eq!(human(Duration::from_secs(86_400 * 2 + 3_600 * 4)), "2d 4h");
        assert_eq!(ceil_secs(Duration::from_millis(1_001)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
    }
}
