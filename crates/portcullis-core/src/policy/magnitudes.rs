//! A policy's derived magnitudes (ALGORITHMS.md, "Magnitudes"): the
//! bound every integer an algorithm keeps stays under ([`MAX_MAGNITUDE`]),
//! a bucket's emission interval (exact, or rounded up past the bound) and
//! a sliding window's weight unit, and the largest value a too-large field
//! could have had.

use super::Algorithm;

/// Largest magnitude any integer an algorithm keeps may reach: the limit, the
/// burst, the period in microseconds, and every product the arithmetic forms
/// (for example `burst × period` for a bucket).
///
/// Every algorithm works in integers. The Redis scripts run in Lua, whose
/// numbers are IEEE doubles and exact only up to 2^53; keeping every product
/// at most 2^52 leaves room for a sum of two, so the in-memory and Redis
/// stores compute bit-identical results. Larger quotas are still accepted:
/// a bucket rounds its emission interval up, and a sliding window weighs
/// in a coarser time unit, as `ALGORITHMS.md` ("Magnitudes") describes.
pub const MAX_MAGNITUDE: u64 = 1 << 52;

/// The smallest emission-interval numerator a bucket policy whose
/// `burst × period` passes [`MAX_MAGNITUDE`] may round to: its rate is then
/// lowered by less than one part in `MIN_ROUNDED_INCREMENT` (0.0016 %),
/// never raised.
const MIN_ROUNDED_INCREMENT: u64 = 1 << 16;

/// The derived magnitudes of a policy (ALGORITHMS.md, "Magnitudes").
pub(super) struct Magnitudes {
    pub(super) scale: u64,
    pub(super) increment: u64,
    pub(super) weight_unit_us: u64,
}

impl Magnitudes {
    /// The magnitudes, or the field that is too large. `period_us` is at
    /// least 1 and below [`MAX_MAGNITUDE`]; `limit` and `burst` at least 1.
    pub(super) fn of(
        algorithm: Algorithm,
        limit: u64,
        period_us: u64,
        burst: Option<u64>,
    ) -> Result<Self, &'static str> {
        if limit > MAX_MAGNITUDE {
            return Err("limit");
        }
        let exact = Self {
            scale: limit,
            increment: period_us,
            weight_unit_us: 1,
        };
        match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingLog => Ok(exact),
            Algorithm::SlidingWindow => {
                let weight_unit_us = sliding_weight_unit(limit, period_us).ok_or("limit")?;
                Ok(Self {
                    weight_unit_us,
                    ..exact
                })
            }
            _ => {
                let capacity = burst.unwrap_or(limit);
                if capacity > MAX_MAGNITUDE {
                    return Err("burst");
                }
                let (scale, increment) = bucket_scale(limit, period_us, capacity)
                    .ok_or(if burst.is_some() { "burst" } else { "limit" })?;
                Ok(Self {
                    scale,
                    increment,
                    weight_unit_us: 1,
                })
            }
        }
    }
}

/// `(scale, increment)` of a bucket policy (ALGORITHMS.md, "Magnitudes"):
/// `(limit, period)` when `capacity × period ≤ 2^52`; else `scale = 2^k` for
/// the largest `k` with `limit × 2^k ≤ 2^53` and `capacity × increment ≤
/// 2^52`, where `increment = ceil(period × 2^k / limit)`, provided the
/// increment is at least [`MIN_ROUNDED_INCREMENT`]. The Lua prelude computes
/// the same.
fn bucket_scale(limit: u64, period_us: u64, capacity: u64) -> Option<(u64, u64)> {
    let max = u128::from(MAX_MAGNITUDE);
    let (limit_w, period_w, capacity_w) = (
        u128::from(limit),
        u128::from(period_us),
        u128::from(capacity),
    );
    if capacity_w * period_w <= max {
        return Some((limit, period_us));
    }
    let mut best = None;
    for k in 0..=53 {
        let scale = 1_u128 << k;
        if limit_w * scale > 2 * max {
            break;
        }
        let increment = (period_w * scale).div_ceil(limit_w);
        if capacity_w * increment > max {
            break;
        }
        best = Some((scale, increment));
    }
    let (scale, increment) = best?;
    if increment < u128::from(MIN_ROUNDED_INCREMENT) {
        return None;
    }
    // Both are at most 2^53 here.
    Some((u64::try_from(scale).ok()?, u64::try_from(increment).ok()?))
}

/// The sliding window's weight unit: 1 when `limit × period ≤ 2^52`, else
/// the smallest power of ten that divides the period with `limit × (period
/// / unit) ≤ 2^52`, if any.
fn sliding_weight_unit(limit: u64, period_us: u64) -> Option<u64> {
    let mut unit = 1_u64;
    loop {
        if !period_us.is_multiple_of(unit) {
            return None;
        }
        if u128::from(limit) * u128::from(period_us / unit) <= u128::from(MAX_MAGNITUDE) {
            return Some(unit);
        }
        unit = unit.checked_mul(10)?;
    }
}

/// The largest `value` at most `refused` for which `accepts` holds (1 when
/// none does; acceptance is assumed to shrink as the value grows).
pub(super) fn largest_accepted(accepts: impl Fn(u64) -> bool, refused: u64) -> u64 {
    let (mut good, mut bad) = (0_u64, refused);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if accepts(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}
