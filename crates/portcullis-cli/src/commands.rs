//! What each command does: `inspect` and `check --dry-run` read a
//! subject's state (a peek through the store: nothing is charged),
//! `reset` deletes it once confirmed, `limits` validates and compares
//! files. The policies a subject is read under come from the service's
//! limits file (as the layer selects them) or, by name, from the numbers
//! a state was written under.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::time::Duration;

use portcullis::redis::redact_url;
use portcullis::subject::encode_subject;
use portcullis::{Algorithm, ConcurrencyPolicy, LeakyMode, Policy, PolicySource, Store as _};

use crate::args::{
    Check, Command, Inspect, LimitsCommand, PolicyArgs, Reset, StoreArgs, SubjectArgs, SubjectKind,
};
use crate::failure::Failure;
use crate::limits;
use crate::report::{
    DecisionView, HeldLease, LeaseView, OpenReservation, PolicyState, PolicyView, RawView, Report,
    ReservationsView, ResetKey, ResetReport, StateReport, SubjectView,
};
use crate::store::{connect, Connected};
use crate::subject::{layer_key, LayerKey};

/// Runs a command.
pub(crate) async fn run(command: Command) -> Result<Report, Failure> {
    match command {
        Command::Inspect(args) => inspect(&args).await.map(Report::Inspect),
        Command::Check(args) => check(&args).await.map(Report::Check),
        Command::Reset(args) => reset(&args).await.map(Report::Reset),
        Command::Top(args) => crate::top::top(&args.urls, args.limit, args.timeout)
            .await
            .map(Report::Top),
        Command::Limits(LimitsCommand::Validate { files }) => {
            limits::validate(&files).map(Report::Validate)
        }
        Command::Limits(LimitsCommand::Diff { old, new }) => {
            limits::diff(&old, &new).map(Report::Diff)
        }
    }
}

/// A policy of the subject: its name, and its numbers when the limits
/// file gives them.
struct Target {
    name: String,
    current: Option<Policy>,
}

/// The subject's key, where its policies come from, and the policies.
struct Subject {
    key: LayerKey,
    from: String,
    targets: Vec<Target>,
}

fn subject(subject: &SubjectArgs, args: &PolicyArgs) -> Result<Subject, Failure> {
    let key = layer_key(subject)?;
    let mut names: Vec<String> = Vec::new();
    for name in &args.names {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    let Some(path) = &args.limits else {
        if names.is_empty() {
            return Err(Failure::usage(
                "which policies? give the service's limits file (--limits FILE) or policy names (--policy NAME)",
            ));
        }
        let targets = names
            .into_iter()
            .map(|name| {
                valid_name(&name)?;
                Ok(Target {
                    name,
                    current: None,
                })
            })
            .collect::<Result<_, Failure>>()?;
        return Ok(Subject {
            key,
            from: "by name (--policy); read under the numbers each state was written under"
                .to_owned(),
            targets,
        });
    };
    let (set, _) = limits::open(path)?;
    if let Some(tier) = &args.tier
        && set.tier(tier).is_none()
    {
        let tiers: Vec<&str> = set.tiers().map(|(name, _)| name).collect();
        return Err(Failure::usage(format!(
            "{} has no tier {}; its tiers: {}",
            path.display(),
            shown(tier),
            if tiers.is_empty() {
                "none".to_owned()
            } else {
                tiers.join(", ")
            }
        )));
    }
    let selected = set.select(&key.key, args.tier.as_deref());
    let mut targets: Vec<Target> = selected
        .policies()
        .iter()
        .map(|policy| Target {
            name: policy.name().to_owned(),
            current: Some(policy.clone()),
        })
        .collect();
    if !names.is_empty() {
        if let Some(missing) = names
            .iter()
            .find(|n| !targets.iter().any(|t| &t.name == *n))
        {
            let has: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
            return Err(Failure::usage(format!(
                "{} gives this subject no policy {}; it has: {}",
                path.display(),
                shown(missing),
                has.join(", ")
            )));
        }
        targets.retain(|t| names.contains(&t.name));
    }
    let chosen = match selected.source() {
        PolicySource::Default => "the defaults".to_owned(),
        PolicySource::Tier => format!("tier {}", selected.name()),
        PolicySource::Override => format!("its override ({})", selected.name()),
        other => format!("{other} {}", selected.name()),
    };
    let from = format!("{}: {chosen}", path.display());
    Ok(Subject { key, from, targets })
}

/// A name as it may appear in a message: quoted, escaped, and cut short.
fn shown(name: &str) -> String {
    let mut text: String = name.chars().take(64).collect();
    if text.len() < name.len() {
        text.push('…');
    }
    format!("{text:?}")
}

/// Refuses a policy name no policy can have (and so no key holds).
fn valid_name(name: &str) -> Result<(), Failure> {
    Policy::per_second(1)
        .name(name)
        .build()
        .map(drop)
        .map_err(|error| Failure::usage(format!("policy {}: {error}", shown(name))))
}

fn subject_view(subject: &Subject, args: &SubjectArgs, store: &StoreArgs) -> SubjectView {
    SubjectView {
        given: (!subject.key.secret).then(|| subject.key.given.clone()),
        kind: match args.kind {
            SubjectKind::Key => "key",
            SubjectKind::ApiKey => "api-key",
            SubjectKind::Bearer => "bearer",
            SubjectKind::Header => "header",
            SubjectKind::Ip => "ip",
        },
        layer_key: subject.key.key.clone(),
        store_subject: encode_subject(&subject.key.key, store.hash_subjects).into_owned(),
        policies_from: subject.from.clone(),
    }
}

async fn inspect(args: &Inspect) -> Result<StateReport, Failure> {
    let subject = subject(&args.subject, &args.policies)?;
    let view = subject_view(&subject, &args.subject, &args.store);
    for name in &args.leases {
        ConcurrencyPolicy::max_in_flight(1)
            .name(name.as_str())
            .build()
            .map_err(|error| Failure::usage(format!("lease policy {}: {error}", shown(name))))?;
    }
    for name in &args.budgets {
        // A budget's name is checked as a policy's is.
        valid_name(name)
            .map_err(|_| Failure::usage(format!("budget {}: not a budget name", shown(name))))?;
    }
    if args.store.urls.is_empty() && args.policies.limits.is_some() {
        // The limits file alone: which policies, and where they live.
        let policies = subject
            .targets
            .iter()
            .map(|target| PolicyState {
                key: format!(
                    "{}:{{{}}}:{}",
                    args.store.prefix, view.store_subject, target.name
                ),
                policy: target.name.clone(),
                current: target.current.as_ref().map(PolicyView::of),
                written_under: None,
                raw: None,
                decision: None,
                remaining_after: None,
                note: None,
            })
            .collect();
        return Ok(StateReport {
            subject: view,
            store: None,
            policies,
            leases: Vec::new(),
            reservations: Vec::new(),
            would_admit: None,
            retry_after_us: None,
        });
    }
    let mut connected = connect(&args.store).await?;
    let policies = read_states(&mut connected, &subject).await?;
    let mut leases = Vec::new();
    for name in &args.leases {
        let key = connected.store.lease_key_for(&subject.key.key, name);
        let read = connected.live_leases(&key).await?;
        leases.push(LeaseView {
            policy: name.clone(),
            key,
            live: read.live,
            expires_in_ms: read.expires_in_ms,
            held: read
                .held
                .into_iter()
                .map(|(id, expires_in_us)| HeldLease { id, expires_in_us })
                .collect(),
        });
    }
    let mut reservations = Vec::new();
    for name in &args.budgets {
        let key = connected.store.reservation_key_for(&subject.key.key, name);
        let read = connected.open_reservations(&key).await?;
        reservations.push(ReservationsView {
            budget: name.clone(),
            key,
            open: read.open.len() as u64,
            tokens_held: read
                .open
                .iter()
                .fold(0_u64, |sum, (_, tokens, _)| sum.saturating_add(*tokens)),
            found_by: read.found_by,
            reservations: read
                .open
                .into_iter()
                .map(|(id, tokens, expires_in_us)| OpenReservation {
                    id,
                    tokens,
                    expires_in_us,
                })
                .collect(),
        });
    }
    Ok(StateReport {
        subject: view,
        store: Some(connected.shown),
        policies,
        leases,
        reservations,
        would_admit: None,
        retry_after_us: None,
    })
}

/// Each policy's key as Redis holds it, and one peek of all the
/// policies whose numbers are known.
async fn read_states(
    connected: &mut Connected,
    subject: &Subject,
) -> Result<Vec<PolicyState>, Failure> {
    let mut states = Vec::new();
    let mut readable = Vec::new();
    for target in &subject.targets {
        let key = connected.store.key_for(&subject.key.key, &target.name);
        let raw = connected.read_key(&key).await?;
        let algorithm = state_algorithm(&raw);
        let written = raw.value.as_deref().and_then(numbers_written_under);
        let written_policy =
            algorithm
                .zip(written)
                .and_then(|(algorithm, (limit, period_us, capacity))| {
                    Policy::per(limit, Duration::from_micros(period_us))
                        .name(target.name.as_str())
                        .algorithm(algorithm)
                        .burst(capacity)
                        .build()
                        .ok()
                });
        let written_view = written_policy.as_ref().map(PolicyView::of);
        let current_view = target.current.as_ref().map(PolicyView::of);
        let note = match (&target.current, algorithm, &written_view) {
            (Some(current), Some(algorithm), _) if current.algorithm() != algorithm => Some(format!(
                "written by {algorithm}: the current policy ({}) counts it as no state",
                current.algorithm()
            )),
            (Some(_), _, Some(written)) if current_view.as_ref() != Some(written) => Some(
                "written under other numbers: read through the current policy, which carries its permits over"
                    .to_owned(),
            ),
            (None, _, None) if raw.redis_type == "none" => Some(
                "no state: full capacity under any policy (give --limits for its numbers)"
                    .to_owned(),
            ),
            (None, Some(algorithm), None) => Some(format!(
                "written by {algorithm}, which does not store its numbers: give --limits to read it"
            )),
            (None, None, None) => Some(
                "not a state portcullis writes: check --prefix and the policy name".to_owned(),
            ),
            _ => None,
        };
        if let Some(policy) = target.current.clone().or(written_policy) {
            readable.push((states.len(), policy));
        }
        states.push(PolicyState {
            policy: target.name.clone(),
            key,
            current: current_view,
            written_under: written_view,
            raw: Some(raw),
            decision: None,
            remaining_after: None,
            note,
        });
    }
    if !readable.is_empty() {
        let policies: Vec<Policy> = readable.iter().map(|(_, p)| p.clone()).collect();
        let verdict = connected
            .store
            .peek(&subject.key.key, &policies)
            .await
            .map_err(|error| Failure::store("the store refused the peek", &error))?;
        for ((index, _), decision) in readable.iter().zip(verdict.decisions()) {
            if let Some(state) = states.get_mut(*index) {
                state.decision = Some(DecisionView::of(decision));
            }
        }
    }
    Ok(states)
}

/// The algorithm that wrote a state, from its form (the guide's "Key
/// layout"): a sorted set is a sliding log; a string starts with its
/// algorithm's name, or is a GCRA time in hexadecimal.
fn state_algorithm(raw: &RawView) -> Option<Algorithm> {
    if raw.redis_type == "zset" {
        return Some(Algorithm::SlidingLog);
    }
    let value = raw.value.as_deref()?;
    let head = value.split('@').next().unwrap_or(value);
    let named = [
        ("gcra:", Algorithm::Gcra),
        ("token_bucket:", Algorithm::TokenBucket),
        ("leaky_meter:", Algorithm::LeakyBucket(LeakyMode::Meter)),
        ("leaky_queue:", Algorithm::LeakyBucket(LeakyMode::Queue)),
        ("fixed_window:", Algorithm::FixedWindow),
        ("sliding_window:", Algorithm::SlidingWindow),
    ];
    named
        .into_iter()
        .find_map(|(prefix, algorithm)| head.starts_with(prefix).then_some(algorithm))
        .or_else(|| {
            (!head.is_empty() && head.bytes().all(|b| b.is_ascii_hexdigit()))
                .then_some(Algorithm::Gcra)
        })
}

/// The numbers a bucket state ends in: `@<limit>:<period_us>:<capacity>`.
fn numbers_written_under(value: &str) -> Option<(u64, u64, u64)> {
    let (_, tail) = value.rsplit_once('@')?;
    let mut numbers = tail.split(':').map(|n| n.parse::<u64>().ok());
    let (limit, period_us, capacity) = (numbers.next()??, numbers.next()??, numbers.next()??);
    if numbers.next().is_some() {
        return None;
    }
    Some((limit, period_us, capacity))
}

async fn check(args: &Check) -> Result<StateReport, Failure> {
    // `--dry-run` is required by the parser: this never charges.
    let _ = args.dry_run;
    let subject = subject(&args.subject, &args.policies)?;
    let view = subject_view(&subject, &args.subject, &args.store);
    let mut connected = connect(&args.store).await?;
    let mut policies = read_states(&mut connected, &subject).await?;
    if let Some(unread) = policies.iter().find(|p| p.decision.is_none()) {
        return Err(Failure::usage(format!(
            "cannot answer for policy {} without its numbers: give the service's limits file (--limits FILE)",
            unread.policy
        )));
    }
    let admitted = policies
        .iter()
        .all(|p| p.decision.as_ref().is_some_and(|d| d.allowed));
    let mut retry_after_us = None;
    for policy in &mut policies {
        if let Some(decision) = &policy.decision {
            policy.remaining_after = Some(if admitted {
                decision.remaining.saturating_sub(1)
            } else {
                decision.remaining
            });
            retry_after_us = retry_after_us.max(decision.retry_after_us);
        }
    }
    Ok(StateReport {
        subject: view,
        store: Some(connected.shown),
        policies,
        leases: Vec::new(),
        reservations: Vec::new(),
        would_admit: Some(admitted),
        retry_after_us: if admitted { None } else { retry_after_us },
    })
}

async fn reset(args: &Reset) -> Result<ResetReport, Failure> {
    let subject = subject(&args.subject, &args.policies)?;
    let view = subject_view(&subject, &args.subject, &args.store);
    let names: Vec<&str> = subject.targets.iter().map(|t| t.name.as_str()).collect();
    if !args.yes {
        let shown: Vec<String> = args.store.urls.iter().map(|url| redact_url(url)).collect();
        confirm(&view.layer_key, &names, &shown.join(","))?;
    }
    let mut connected = connect(&args.store).await?;
    let mut keys = Vec::new();
    let mut policies = Vec::new();
    for target in &subject.targets {
        let key = connected.store.key_for(&subject.key.key, &target.name);
        let raw = connected.read_key(&key).await?;
        keys.push(ResetKey {
            policy: target.name.clone(),
            key,
            had_state: raw.redis_type != "none",
        });
        // A reset deletes by name; the numbers do not matter.
        policies.push(match &target.current {
            Some(policy) => policy.clone(),
            None => Policy::per_second(1)
                .name(target.name.as_str())
                .build()
                .map_err(|error| {
                    Failure::usage(format!("policy {}: {error}", shown(&target.name)))
                })?,
        });
    }
    connected
        .store
        .reset(&subject.key.key, &policies)
        .await
        .map_err(|error| Failure::store("the reset failed (it may or may not have run)", &error))?;
    Ok(ResetReport {
        subject: view,
        store: connected.shown,
        keys,
    })
}

/// Asks on the terminal; refuses when stdin is not one.
fn confirm(key: &str, names: &[&str], store: &str) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::refused(
            "reset not confirmed: stdin is not a terminal, so pass --yes to reset; nothing was written",
        ));
    }
    let mut stderr = std::io::stderr().lock();
    let _ = write!(
        stderr,
        "Reset {} under {} on {store}? Every instance sees it at full capacity at once. [y/N] ",
        shown(key),
        names.join(", ")
    );
    let _ = stderr.flush();
    let mut answer = String::new();
    // Bounded: a terminal line, at most a few bytes are read as the answer.
    if stdin.lock().read_line(&mut answer).is_err() {
        answer.clear();
    }
    match answer.trim() {
        "y" | "Y" | "yes" | "YES" | "Yes" => Ok(()),
        _ => Err(Failure::refused("reset not confirmed; nothing was written")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(value: &str) -> RawView {
        RawView {
            redis_type: "string".to_owned(),
            value: Some(value.to_owned()),
            members: None,
            expires_in_ms: None,
        }
    }

    #[test]
    fn the_algorithm_and_numbers_a_state_was_written_under() {
        let cases = [
            ("18b4c2f1e3a07@5:60000000:5", Some(Algorithm::Gcra)),
            ("18b4c2f1e3a07", Some(Algorithm::Gcra)),
            (
                "gcra:1700000000000000:3@10:1000000:20",
                Some(Algorithm::Gcra),
            ),
            (
                "token_bucket:5:17@5:1000000:5",
                Some(Algorithm::TokenBucket),
            ),
            (
                "leaky_queue:5:1@5:1000000:5",
                Some(Algorithm::LeakyBucket(LeakyMode::Queue)),
            ),
            ("fixed_window:17:3", Some(Algorithm::FixedWindow)),
            ("sliding_window:17:3:4", Some(Algorithm::SlidingWindow)),
            ("zz@1:2:3", None),
            ("", None),
        ];
        for (value, algorithm) in cases {
            assert_eq!(state_algorithm(&string(value)), algorithm, "{value}");
        }
        let zset = RawView {
            redis_type: "zset".to_owned(),
            value: None,
            members: Some(3),
            expires_in_ms: None,
        };
        assert_eq!(state_algorithm(&zset), Some(Algorithm::SlidingLog));

        assert_eq!(
            numbers_written_under("18b4c2f1e3a07@5:60000000:5"),
            Some((5, 60_000_000, 5))
        );
        assert_eq!(numbers_written_under("18b4c2f1e3a07"), None);
        assert_eq!(numbers_written_under("abc@1:2"), None);
        assert_eq!(numbers_written_under("abc@1:2:3:4"), None);
        assert_eq!(numbers_written_under("abc@1:-2:3"), None);
    }

    #[test]
    fn names_in_messages_are_escaped_and_short() {
        assert_eq!(shown("a\nb"), "\"a\\nb\"");
        assert!(shown(&"x".repeat(10_000)).len() < 80);
    }
}
