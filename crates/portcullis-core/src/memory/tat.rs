//! The packed TAT: a GCRA state packed into one word ([`pack`],
//! [`unpack`], [`packed_expiry`]) and the hot path's charge of it
//! ([`tat_charge`], [`tat_admitted`], [`tat_denied`]), exactly as
//! [`algorithms::check`](crate::algorithms::check) computes it. A leaf: it uses nothing else of the
//! memory store. (The general path's `u64` GCRA, which the Redis store
//! uses too, is [`algorithms::check_fast`](crate::algorithms::check_fast).)

use crate::{Decision, Policy};

/// Bits of a packed TAT that hold its fraction (`tat_rem`, in units of
/// `1 / scale` µs); the 52 above hold `tat_us`.
const REM_BITS: u32 = 12;
/// The fraction of a packed TAT.
const REM_MASK: u64 = (1 << REM_BITS) - 1;

/// `(tat_us, tat_rem)` packed into one word when it fits: `tat_us` below
/// 2^52 µs (the year 2112) and `tat_rem` below 2^12.
#[inline(always)]
pub(super) fn pack(tat_us: u64, tat_rem: u64) -> Option<u64> {
    (tat_us >> (64 - REM_BITS) == 0 && tat_rem <= REM_MASK).then_some(tat_us << REM_BITS | tat_rem)
}

/// The `(tat_us, tat_rem)` of a packed TAT.
#[inline(always)]
pub(super) fn unpack(packed: u64) -> (u64, u64) {
    (packed >> REM_BITS, packed & REM_MASK)
}

/// When a packed TAT's state expires: the TAT rounded up to a whole
/// microsecond (as [`algorithms::check`](crate::algorithms::check) reports it).
#[inline(always)]
pub(super) fn packed_expiry(packed: u64) -> u64 {
    (packed >> REM_BITS) + u64::from(packed & REM_MASK != 0)
}

/// What a GCRA charge does to a packed TAT: a word each, so that it
/// travels in registers; the decision's figures are computed from it
/// afterwards ([`tat_admitted`], [`tat_denied`]), after the lock is let go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TatCharge {
    /// Admitted: the new packed TAT.
    Admitted(u64),
    /// Denied (nothing written): the packed TAT the charge read.
    Denied(u64),
}

/// The spans of a charge of `cost` on a packed TAT with a fraction (or of
/// a policy whose interval is not whole), as whole microseconds and a
/// remainder below the scale: `(ahead, ahead_rem)` is `span_old`,
/// `(new_ahead, new_rem)` is `span_new`. `None` for a fraction not below
/// the scale (the reference carries it).
#[inline(always)]
fn fractional_spans(policy: &Policy, packed: u64, now_us: u64, cost: u64) -> Option<[u64; 4]> {
    let g = policy.gcra_consts();
    let (scale, _) = policy.emission_interval();
    let (tat_us, tat_rem) = unpack(packed);
    if tat_rem >= scale {
        return None;
    }
    // A TAT in the past is the same as no state (so an expired entry needs
    // no telling apart): `tat_us + tat_rem / scale >= now` exactly when
    // `tat_us >= now`.
    let (ahead, ahead_rem) = if tat_us >= now_us {
        (tat_us - now_us, tat_rem)
    } else {
        (0, 0)
    };
    // The span after the charge, `span_old + cost · increment`. Every term
    // is below 2^54 (the capacity times the increment is at most 2^52).
    let mut new_rem = ahead_rem + cost * g.interval_rem;
    let mut new_ahead = ahead + cost * g.interval_us;
    if new_rem >= scale {
        if cost == 1 {
            new_rem -= scale;
            new_ahead += 1;
        } else {
            new_ahead += new_rem / scale;
            new_rem %= scale;
        }
    }
    Some([ahead, ahead_rem, new_ahead, new_rem])
}

/// A GCRA charge of `cost > 0` on the packed TAT `packed` (`ALGORITHMS.md`,
/// "MemoryStore's GCRA fast path"): the `u64` GCRA of
/// [`algorithms::check_fast`](crate::algorithms::check_fast) with every span kept as
/// whole microseconds and a remainder in units of `1 / scale` µs, using
/// the policy's precomputed [`GcraConsts`](crate::policy::GcraConsts), so
/// that admitting divides by nothing (unless a cost above 1 carries a
/// fraction). A policy whose interval is whole takes a branch without
/// remainders. `None` where the reference must decide (a fraction not
/// below the scale, a TAT it would clamp, a TAT the packing cannot hold).
///
/// A TAT further ahead than the clamp (`clamp_after_us`, beyond the
/// capacity) is never admitted, so the clamp is looked at only on a
/// denial.
#[inline(always)]
pub(super) fn tat_charge(
    policy: &Policy,
    packed: u64,
    now_us: u64,
    cost: u64,
) -> Option<TatCharge> {
    let g = policy.gcra_consts();
    let ahead = if g.whole && packed & REM_MASK == 0 {
        // Whole µs (`r = 0`): every remainder is 0. Below 2^54:
        // `ahead < 2^52` (it was packed) and `cost · interval_us <= 2^52`.
        let ahead = (packed >> REM_BITS).saturating_sub(now_us);
        let new_ahead = ahead + cost * g.interval_us;
        if new_ahead <= g.full_us {
            return Some(TatCharge::Admitted(pack(
                now_us.checked_add(new_ahead)?,
                0,
            )?));
        }
        ahead
    } else {
        let [ahead, _, new_ahead, new_rem] = fractional_spans(policy, packed, now_us, cost)?;
        if new_ahead < g.full_us || (new_ahead == g.full_us && new_rem <= g.full_rem) {
            return Some(TatCharge::Admitted(pack(
                now_us.checked_add(new_ahead)?,
                new_rem,
            )?));
        }
        ahead
    };
    // Denied, unless further ahead than the policy can leave, beyond the
    // clock tolerance: the reference clamps that and writes the repair.
    (ahead <= g.clamp_after_us).then_some(TatCharge::Denied(packed))
}

/// The decision of a [`tat_charge`] that denied a charge of `cost` on the
/// packed TAT `packed` (which it left as it was): the reference's figures,
/// the wait until the span fits (`span_new − full`, rounded up to a
/// microsecond), the whole costs left below the capacity, and the time
/// until the TAT is reached (rounded up).
#[inline(always)]
pub(super) fn tat_denied(policy: &Policy, packed: u64, now_us: u64, cost: u64) -> Decision {
    let g = policy.gcra_consts();
    if g.whole && packed & REM_MASK == 0 {
        // Every remainder 0: `(full − span_old) / increment` is
        // `(full_us − ahead) / interval_us`, both multiples of the scale.
        let ahead = (packed >> REM_BITS).saturating_sub(now_us);
        let new_ahead = ahead + cost * g.interval_us;
        let remaining = g
            .full_us
            .saturating_sub(ahead)
            .checked_div(g.interval_us)
            .unwrap_or(0);
        let retry_after = new_ahead.saturating_sub(g.full_us);
        return Decision::denied_us(policy.capacity(), remaining, retry_after, ahead);
    }
    let (scale, period) = policy.emission_interval();
    // `tat_charge` computed these spans before denying.
    let [ahead, ahead_rem, new_ahead, new_rem] =
        fractional_spans(policy, packed, now_us, cost).unwrap_or_default();
    let (over_us, over_rem) = if new_rem >= g.full_rem {
        (new_ahead.saturating_sub(g.full_us), new_rem - g.full_rem)
    } else {
        // `new_ahead > full_us` here.
        (
            new_ahead.saturating_sub(g.full_us + 1),
            new_rem + scale - g.full_rem,
        )
    };
    let retry_after = over_us + u64::from(over_rem > 0);
    let remaining = g
        .full
        .saturating_sub(ahead * scale + ahead_rem)
        .checked_div(period)
        .unwrap_or(0);
    let reset_after = ahead + u64::from(ahead_rem > 0);
    Decision::denied_us(policy.capacity(), remaining, retry_after, reset_after)
}

/// The decision of an admitting [`tat_charge`] that moved the TAT to
/// `packed`.
#[inline(always)]
pub(super) fn tat_admitted(policy: &Policy, packed: u64, now_us: u64) -> Decision {
    // One formula for whole and fractional intervals alike (with a whole
    // one, `tat_rem` is 0 and the span a multiple of the scale): a branch
    // would cost as much as the multiplication it saves.
    let (scale, period) = policy.emission_interval();
    let full = policy.gcra_consts().full;
    let (tat_us, tat_rem) = unpack(packed);
    // `tat_charge` checked `span <= full` (at most 2^52) with `tat_us >= now`.
    let ahead = tat_us - now_us;
    let span = ahead * scale + tat_rem;
    // Never divides by zero (a period is at least 1 µs); `checked_div`
    // has no panic to keep, so a caller that inlines this and never reads
    // `remaining` does not divide.
    let remaining = (full - span).checked_div(period).unwrap_or(0);
    Decision::allowed_us(policy.capacity(), remaining, ahead + u64::from(tat_rem > 0))
}
