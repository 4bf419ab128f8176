//! Priority classes of a policy: names with reserved headroom over the
//! policy's one shared state ([`PolicyBuilder::class`](crate::PolicyBuilder::class), [`Policy::class_reserve`]),
//! and their validation. The class check every store applies is
//! `crate::algorithms::classes` (ALGORITHMS.md, "Priority classes").
//!
//! A class with a reserve of `r` permits is admitted only while at least
//! `r` permits remain *after* its charge. Every algorithm that supports
//! classes admits a cost `c` exactly when it would admit `c + r`, so the
//! class check is "would `c + r` be admitted? then charge `c`", and a
//! denial's `retry_after` is that of `c + r`: when the class may go again.

use std::sync::Arc;

use super::name::validate_name;
use super::{Algorithm, LeakyMode, Policy, PolicyError};

/// One class: its name, its reserve as given, and in permits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Class {
    name: Arc<str>,
    reserve: u64,
}

/// A policy's classes and which of them a request gets when it names
/// none, or one the policy does not define.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(super) struct ClassTable {
    classes: Box<[Class]>,
    /// Index of the default class in `classes`.
    default: usize,
}

/// A policy's classes (none for most policies: no allocation).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(super) struct Classes(Option<Arc<ClassTable>>);

impl Classes {
    /// Validates the classes given to a builder, and its default class.
    pub(super) fn build(
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
const fn supports_classes(algorithm: Algorithm) -> bool {
    !matches!(algorithm, Algorithm::LeakyBucket(LeakyMode::Queue))
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
    /// defined ([`PolicyBuilder::default_class`](crate::PolicyBuilder::default_class)); 0 for a policy without
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
