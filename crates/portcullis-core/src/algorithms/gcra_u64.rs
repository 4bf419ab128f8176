//! GCRA in `u64` arithmetic, deciding exactly as [`check`](super::check)
//! where it fits and handing back to it elsewhere: the memory store's
//! general path and the Redis store's fast replies use it
//! ([`check_fast`](super::check_fast)); the memory = reference property
//! tests hold it to the reference.

use super::{check, GcraState, State, Step};
use crate::{Algorithm, Decision, Policy};

/// [`check`], with GCRA (the default algorithm) on a fast path.
#[inline(always)]
pub(crate) fn check_policy(policy: &Policy, state: Option<&State>, now_us: u64, cost: u64) -> Step {
    if policy.algorithm() == Algorithm::Gcra {
        let tat = match state {
            Some(State::Gcra(tat)) => Some(*tat),
            _ => None,
        };
        if let Some(fast) = gcra_fast(policy, tat, now_us, cost) {
            return Step {
                decision: fast.decision,
                new_state: fast.tat.map(State::Gcra),
                expires_at_us: fast.expires_at_us,
            };
        }
    }
    check(policy, state, now_us, cost)
}

/// What [`gcra_fast`] decided: a [`Step`] with the state unwrapped.
#[derive(Clone, Copy)]
struct GcraFast {
    decision: Decision,
    /// The new TAT when admitted with a cost.
    tat: Option<GcraState>,
    expires_at_us: u64,
}

/// GCRA exactly as [`check`] computes it (`ALGORITHMS.md`,
/// "GCRA"), in `u64` rather than `u128` and computing the figures only a
/// denial reports only on denial: two divisions for an admitted request
/// instead of six 128-bit ones.
///
/// Spans are kept relative to `now` (`span = (time − now)·L`), which policy
/// validation bounds by `2^53` for every state this policy writes. Anything
/// else (a cost above the capacity, a state left by a policy with another
/// limit or period, a time past `u64::MAX`) returns `None`, and the caller
/// uses the reference implementation.
#[inline(always)]
fn gcra_fast(policy: &Policy, tat: Option<GcraState>, now_us: u64, cost: u64) -> Option<GcraFast> {
    let capacity = policy.capacity();
    // `(scale, increment)` is `(limit, period)` for an exact policy.
    let (limit, period) = policy.emission_interval();
    if cost > capacity {
        return None;
    }
    let full = capacity.checked_mul(period)?;
    let span_old = match tat {
        // A fraction of a whole microsecond or more: carried by the
        // reference only.
        Some(GcraState { tat_rem, .. }) if tat_rem >= limit => return None,
        // `tat_us + tat_rem / L >= now` exactly when `tat_us >= now`.
        Some(GcraState { tat_us, tat_rem }) if tat_us >= now_us => {
            (tat_us - now_us).checked_mul(limit)?.checked_add(tat_rem)?
        }
        _ => 0,
    };
    if span_old > full
        && (span_old / limit).saturating_sub(full.div_ceil(limit))
            > full.div_ceil(limit).max(1_000_000)
    {
        // Further ahead than the policy can leave, beyond the clock
        // tolerance: the reference clamps it and writes the repair.
        return None;
    }
    let span_new = span_old.checked_add(cost.max(1).checked_mul(period)?)?;
    if span_new > full {
        let retry_after = (span_new - full).div_ceil(limit);
        let remaining = full.saturating_sub(span_old) / period;
        let reset_after = span_old.div_ceil(limit);
        return Some(GcraFast {
            decision: Decision::denied_us(capacity, remaining, retry_after, reset_after),
            tat: None,
            expires_at_us: now_us.saturating_add(reset_after),
        });
    }
    if cost == 0 {
        let remaining = (full - span_old) / period;
        let reset_after = span_old.div_ceil(limit);
        return Some(GcraFast {
            decision: Decision::allowed_us(capacity, remaining, reset_after),
            tat: None,
            expires_at_us: now_us.saturating_add(reset_after),
        });
    }
    // The new TAT is `now + span_new / L`.
    let (whole, rem) = (span_new / limit, span_new % limit);
    let tat_us = now_us.checked_add(whole)?;
    let remaining = (full - span_new) / period;
    let reset_after = whole + u64::from(rem > 0);
    Some(GcraFast {
        decision: Decision::allowed_us(capacity, remaining, reset_after),
        tat: Some(GcraState {
            tat_us,
            tat_rem: rem,
        }),
        expires_at_us: now_us.saturating_add(reset_after),
    })
}
