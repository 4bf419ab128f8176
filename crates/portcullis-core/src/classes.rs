//! Priority classes of a policy: names with reserved headroom over the
//! policy's one shared state ([`PolicyBuilder::class`], [`Policy::class_reserve`]),
//! and the class check every store applies (ALGORITHMS.md, "Priority
//! classes").
//!
//! A class with a reserve of `r` permits is admitted only while at least
//! `r` permits remain *after* its charge. Every algorithm that supports
//! classes admits a cost `c` exactly when it would admit `c + r`, so the
//! class check is "would `c + r` be admitted? then charge `c`", and a
//! denial's `retry_after` is that of `c + r`: when the class may go again.

use std::sync::Arc;

use crate::algorithms::{State, Step};
use crate::policy::validate_name;
use crate::{Algorithm, Decision, LeakyMode, Policy, PolicyBuilder, PolicyError};

/// One class: its name, its reserve as given, and in permits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Class {
    name: Arc<str>,
    reserve: u64,
}

/// A policy's classes and which of them a request gets when it names
/// none, or one the policy does not define.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct ClassTable {
    classes: Box<[Class]>,
    /// Index of the default class in `classes`.
    default: usize,
}

/// A policy's classes (none for most policies: no allocation).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct Classes(Option<Arc<ClassTable>>);

impl Classes {
    /// Validates the classes given to a builder, and its default class.
    pub(crate) fn build(
        policy: &str,
        algorithm: Algorithm,
        capacity: u64,
        given: Vec<(String, u8)>,
        default_class: Option<String>,
    ) -> Result<Self, PolicyError> {
        let refuse = |class: &str, reason: String| PolicyError::InvalidClass {
            policy: policy.to_owned(),
            class: class.chars().take(80).collect(),
            reason,
        };
        if given.is_empty() {
            return match default_class {
                Some(class) => Err(refuse(
                    &class,
                    "the policy defines no classes: define the default class with PolicyBuilder::class, or leave default_class out".to_owned(),
                )),
                None => Ok(Self(None)),
            };
        }
        if !supports_classes(algorithm) {
            return Err(refuse(
                &given[0].0,
                format!("the {algorithm} algorithm has no priority classes (a queue admits every request and delays it, so there is no headroom to reserve); use Algorithm::Gcra, Algorithm::TokenBucket or LeakyMode::Meter"),
            ));
        }
        let mut classes: Vec<Class> = Vec::with_capacity(given.len());
        for (name, percent) in given {
            if validate_name(&name).is_err() {
                return Err(refuse(
                    &name,
                    "use 1 to 64 ASCII letters, digits, '_', '-' or '.' for a class name"
                        .to_owned(),
                ));
            }
            if classes.iter().any(|class| *class.name == *name) {
                return Err(refuse(
                    &name,
                    "the class is defined twice: give each class one reserve".to_owned(),
                ));
            }
            if percent >= 100 {
                return Err(refuse(&name, format!("a reserve of {percent} % leaves the class nothing: give a reserve below 100 %")));
            }
            // ceil(capacity × percent / 100), exact in u128.
            let reserve = u64::try_from((u128::from(capacity) * u128::from(percent)).div_ceil(100))
                .unwrap_or(u64::MAX);
            if reserve >= capacity {
                return Err(refuse(&name, format!("a reserve of {percent} % of a capacity of {capacity} is {reserve} permits, which leaves the class none: lower the reserve or raise the limit or burst")));
            }
            classes.push(Class {
                name: name.into(),
                reserve,
            });
        }
        let default = match default_class {
            Some(name) => classes
                .iter()
                .position(|class| *class.name == *name)
                .ok_or_else(|| {
                    refuse(
                        &name,
                        "the default class is not one the policy defines: define it with PolicyBuilder::class first".to_owned(),
                    )
                })?,
            // The most reserved class (the first of equals): a request
            // that claims nothing gets the least.
            None => classes
                .iter()
                .enumerate()
                .rev()
                .max_by_key(|(_, class)| class.reserve)
                .map_or(0, |(index, _)| index),
        };
        Ok(Self(Some(Arc::new(ClassTable {
            classes: classes.into(),
            default,
        }))))
    }
}

/// Whether `algorithm` supports priority classes: every algorithm but the
/// leaky bucket as a queue (which admits and delays, holding no headroom).
#[must_use]
pub(crate) const fn supports_classes(algorithm: Algorithm) -> bool {
    !matches!(algorithm, Algorithm::LeakyBucket(LeakyMode::Queue))
}

impl PolicyBuilder {
    /// Defines a **priority class**: requests of class `name` share the
    /// policy's one state with every other request of the subject, but are
    /// admitted only while at least `reserve_percent` % of the capacity
    /// (rounded up to whole permits) remains *after* their charge. A class
    /// with a reserve of 0 may spend the whole allowance.
    ///
    /// A request is checked as a class through
    /// [`CheckOptions::class`](crate::CheckOptions::class) (the tower
    /// layer's `priority` selector). A request that names no class, or a
    /// class the policy does not define, is checked as the policy's
    /// **default class**: the most reserved one, unless
    /// [`default_class`](Self::default_class) names another. So a class is
    /// a privilege the application grants (from authentication, the
    /// route, the customer's plan), never one a client can claim by
    /// sending nothing or something unknown. A denial's `retry_after` says
    /// when that class may go again. Every algorithm but the leaky bucket
    /// as a queue has classes ([`PolicyError::InvalidClass`] otherwise).
    ///
    /// Reserves are part of [`Store::check_with`](crate::Store::check_with);
    /// a plain [`Store::check`](crate::Store::check), [`peek`](crate::Store::peek)
    /// or [`charge`](crate::Store::charge) is the application's own
    /// unclassed use of the allowance and applies none. The tower layer
    /// checks every request of a policy with classes through `check_with`
    /// (with the request's class, or none: the default).
    ///
    /// ```
    /// use portcullis::{CheckOptions, MemoryStore, Policy, Store};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let policy = Policy::per_minute(10)
    ///     .name("api")
    ///     .class("critical", 0)
    ///     .class("interactive", 20)
    ///     .class("batch", 50)
    ///     .build()?;
    /// assert_eq!(policy.class_reserve("batch"), Some(5));
    /// let store = MemoryStore::new();
    /// let policies = [policy];
    /// let batch = CheckOptions::new().class("batch");
    /// let mut admitted = 0;
    /// while store.check_with("acme", &policies, 1, &batch).await?.verdict().is_allowed() {
    ///     admitted += 1;
    /// }
    /// assert_eq!(admitted, 5); // batch stops while half remains
    /// let critical = CheckOptions::new().class("critical");
    /// assert!(store.check_with("acme", &policies, 1, &critical).await?.verdict().is_allowed());
    /// // No class, or one the policy does not define: the default, the
    /// // most reserved class ("batch" here), which is now refused.
    /// let unknown = CheckOptions::new().class("urgent");
    /// assert!(!store.check_with("acme", &policies, 1, &unknown).await?.verdict().is_allowed());
    /// assert!(!store.check_with("acme", &policies, 1, &CheckOptions::new()).await?.verdict().is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn class(mut self, name: impl Into<String>, reserve_percent: u8) -> Self {
        self.classes.push((name.into(), reserve_percent));
        self
    }

    /// Names the class a request gets when it names none, or one the
    /// policy does not define. Without this, the default is the most
    /// reserved class (the first of equals): the safe choice, since the
    /// class is then never better than what a client could claim. Name a
    /// less reserved default only when every request that can reach the
    /// policy is trusted with it. A name the policy does not define with
    /// [`class`](Self::class) fails at [`build`](Self::build) with
    /// [`PolicyError::InvalidClass`].
    ///
    /// ```
    /// use portcullis::Policy;
    ///
    /// let policy = Policy::per_second(10)
    ///     .class("interactive", 20)
    ///     .class("batch", 50)
    ///     .default_class("interactive")
    ///     .build()?;
    /// assert_eq!(policy.reserve_of(None), 2);
    /// assert_eq!(policy.reserve_of(Some("nonsense")), 2);
    /// assert_eq!(Policy::per_second(10).class("batch", 50).build()?.reserve_of(None), 5);
    /// assert!(Policy::per_second(10).class("batch", 50).default_class("gold").build().is_err());
    /// # Ok::<(), portcullis::PolicyError>(())
    /// ```
    pub fn default_class(mut self, name: impl Into<String>) -> Self {
        self.default_class = Some(name.into());
        self
    }
}

impl Policy {
    /// The reserve of class `class` in permits (what must remain after a
    /// charge of that class), or `None` when the policy does not define it.
    ///
    /// ```
    /// use portcullis::Policy;
    ///
    /// let policy = Policy::per_second(7).class("batch", 50).build()?;
    /// assert_eq!(policy.class_reserve("batch"), Some(4)); // 3.5 rounded up
    /// assert_eq!(policy.class_reserve("critical"), None);
    /// # Ok::<(), portcullis::PolicyError>(())
    /// ```
    #[must_use]
    pub fn class_reserve(&self, class: &str) -> Option<u64> {
        self.classes
            .0
            .as_ref()?
            .classes
            .iter()
            .find(|c| &*c.name == class)
            .map(|c| c.reserve)
    }

    /// The reserve in permits a request of `class` is checked with: that
    /// class's, or the default class's when `class` is `None` or not
    /// defined ([`PolicyBuilder::default_class`]); 0 for a policy without
    /// classes.
    ///
    /// ```
    /// use portcullis::Policy;
    ///
    /// let policy = Policy::per_second(10).class("critical", 0).class("batch", 50).build()?;
    /// assert_eq!(policy.reserve_of(Some("critical")), 0);
    /// assert_eq!(policy.reserve_of(None), 5, "the most reserved class");
    /// assert_eq!(policy.reserve_of(Some("x-priority: urgent")), 5);
    /// assert_eq!(Policy::per_second(10).build()?.reserve_of(Some("critical")), 0);
    /// # Ok::<(), portcullis::PolicyError>(())
    /// ```
    #[must_use]
    pub fn reserve_of(&self, class: Option<&str>) -> u64 {
        let Some(table) = self.classes.0.as_ref() else {
            return 0;
        };
        class
            .and_then(|class| table.classes.iter().find(|c| &*c.name == class))
            .or_else(|| table.classes.get(table.default))
            .map_or(0, |c| c.reserve)
    }

    /// The name of the class a request that names none (or an undefined
    /// one) is checked as, when the policy has classes.
    ///
    /// ```
    /// use portcullis::Policy;
    ///
    /// let policy = Policy::per_second(10).class("critical", 0).class("batch", 50).build()?;
    /// assert_eq!(policy.default_class(), Some("batch"));
    /// # Ok::<(), portcullis::PolicyError>(())
    /// ```
    #[must_use]
    pub fn default_class(&self) -> Option<&str> {
        let table = self.classes.0.as_ref()?;
        table.classes.get(table.default).map(|c| &*c.name)
    }

    /// Whether the policy defines priority classes.
    ///
    /// ```
    /// use portcullis::Policy;
    ///
    /// assert!(!Policy::per_second(5).build()?.has_classes());
    /// assert!(Policy::per_second(5).class("batch", 50).build()?.has_classes());
    /// # Ok::<(), portcullis::PolicyError>(())
    /// ```
    #[must_use]
    pub fn has_classes(&self) -> bool {
        self.classes.0.is_some()
    }
}

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
