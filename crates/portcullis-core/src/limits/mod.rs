//! Limits as data: the default policies, named tiers and per-subject
//! overrides in one value ([`LimitSet`]), held by a live handle
//! ([`Limits`]) that swaps them atomically at run time.
//!
//! By concern, top-down: `handle.rs` ([`Limits`]) above `set.rs`
//! ([`LimitSet`], its builder and its selection) above `select.rs` (what a
//! selection returns) and `error.rs` ([`LimitsError`]).

mod error;
mod handle;
mod select;
mod set;

pub use self::error::LimitsError;
pub use self::handle::{Limits, LimitsSubscription};
pub use self::select::{PolicySource, Selected, DEFAULT_TIER};
pub use self::set::{LimitSet, LimitSetBuilder, Override};

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;
    use crate::Policy;

    fn policy(name: &str, limit: u64) -> Policy {
        Policy::per_minute(limit).name(name).build().unwrap()
    }

    #[test]
    fn select_prefers_the_override_then_the_tier() {
        let set = LimitSet::builder()
            .policy(policy("free", 10))
            .tier("pro", [policy("pro", 100)])
            .tier("team", [policy("team", 1000)])
            .override_tier("acme", "team")
            .override_policies("globex", [policy("globex", 7)])
            .build()
            .unwrap();
        let acme = set.select("acme", Some("pro"));
        assert_eq!(
            (acme.name(), acme.source()),
            ("team", PolicySource::Override)
        );
        let globex = set.select("globex", None);
        assert_eq!(globex.name(), "globex");
        assert_eq!(globex.policies()[0].limit(), 7);
        assert_eq!(set.select("bob", Some("pro")).name(), "pro");
        assert_eq!(set.select("bob", Some("gold")).name(), DEFAULT_TIER);
    }

    #[test]
    fn invalid_sets_name_what_to_fix() {
        let err = LimitSet::builder().build().unwrap_err();
        assert_eq!(
            err.to_string(),
            "the default policies has no policy: give it at least one"
        );
        let err = LimitSet::builder()
            .policy(policy("a", 1))
            .tier("pro", [policy("x", 1), policy("x", 2)])
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("tier \"pro\""), "{err}");
        assert!(err.to_string().contains("\"x\""), "{err}");
        assert!(err.source().is_some());
        let err = LimitSet::builder()
            .policy(policy("a", 1))
            .override_tier("acme", "gold")
            .build()
            .unwrap_err();
        assert!(matches!(err, LimitsError::UnknownTier { .. }), "{err}");
        let err = LimitSet::builder()
            .policy(policy("a", 1))
            .tier("default", [policy("b", 1)])
            .build()
            .unwrap_err();
        assert!(matches!(err, LimitsError::InvalidTierName { .. }), "{err}");
    }

    #[test]
    fn an_invalid_update_keeps_the_set_in_force() {
        let limits = Limits::new(LimitSet::of([policy("a", 1)]).unwrap());
        let clone = limits.clone();
        assert!(limits.update(|b| b.override_tier("acme", "nope")).is_err());
        assert_eq!(clone.version(), 1);
        assert_eq!(limits.update(|b| b.defaults([policy("a", 5)])).unwrap(), 2);
        assert_eq!(clone.version(), 2);
        assert_eq!(clone.load().defaults()[0].limit(), 5);
        assert_eq!(clone.load().version(), 2);
    }

    #[test]
    fn a_builder_round_trips() {
        let set = LimitSet::builder()
            .policy(policy("free", 10))
            .tier("pro", [policy("pro", 100)])
            .override_tier("acme", "pro")
            .override_policies("globex", [policy("globex", 7)])
            .build()
            .unwrap();
        assert_eq!(set.to_builder().build().unwrap(), set);
        let fewer = set.to_builder().remove_override("acme").build().unwrap();
        assert!(fewer.override_for("acme").is_none());
        assert!(fewer.override_for("globex").is_some());
    }
}
