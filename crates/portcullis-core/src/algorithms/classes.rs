//! The class check every store applies (ALGORITHMS.md, "Priority
//! classes"): a class with a reserve of `r` permits is admitted only while
//! at least `r` permits remain *after* its charge. Every algorithm that
//! supports classes admits a cost `c` exactly when it would admit `c + r`,
//! so the class check is "would `c + r` be admitted? then charge `c`", and
//! a denial's `retry_after` is that of `c + r`: when the class may go
//! again. The classes themselves are a policy's (`policy/classes.rs`).

use super::{State, Step};
use crate::{Decision, Policy};

/// [`check`](crate::algorithms::check) for a class with a reserve of `reserve` permits:
/// admitted when a cost of `cost + reserve` would be, and then charged
/// `cost`; denied with the decision of `cost + reserve`. `remaining` is
/// what the class may still spend (the shared remaining less the
/// reserve). The caller has checked `cost + reserve <= capacity`; a peek
/// (cost 0) ignores the reserve but for `remaining`.
pub(crate) fn check_class(
    policy: &Policy,
    state: Option<&State>,
    now_us: u64,
    cost: u64,
    reserve: u64,
    check: impl Fn(&Policy, Option<&State>, u64, u64) -> Step,
) -> Step {
    if reserve == 0 {
        return check(policy, state, now_us, cost);
    }
    let probe_cost = if cost == 0 { 1 } else { cost };
    let probe = check(policy, state, now_us, probe_cost + reserve);
    let mut step = if cost == 0 || !probe.decision.is_allowed() {
        if cost == 0 {
            let peek = check(policy, state, now_us, 0);
            Step {
                decision: if probe.decision.is_allowed() {
                    peek.decision
                } else {
                    probe.decision
                },
                ..peek
            }
        } else {
            // A probe writes nothing but a repair.
            probe
        }
    } else {
        check(policy, state, now_us, cost)
    };
    step.decision = for_class(step.decision, reserve);
    step
}

/// `decision` as a class with `reserve` permits reserved sees it.
#[must_use]
pub(crate) const fn for_class(decision: Decision, reserve: u64) -> Decision {
    decision.with_remaining(decision.remaining().saturating_sub(reserve))
}
