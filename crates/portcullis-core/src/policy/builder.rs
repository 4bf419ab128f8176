//! [`PolicyBuilder`]: every setter of a policy (its name, algorithm,
//! burst, priority classes) and [`PolicyBuilder::build`], which validates
//! them.

use super::bounds::SLIDING_LOG_MAX_LIMIT;
use super::classes::Classes;
use super::magnitudes::{largest_accepted, Magnitudes, MAX_MAGNITUDE};
use super::name::{default_name, validate_name};
use super::{Algorithm, GcraConsts, Policy, PolicyError};
use std::time::Duration;

/// Builder for a [`Policy`]; finish with [`PolicyBuilder::build`].
#[derive(Debug, Clone)]
#[must_use = "a PolicyBuilder does nothing until .build() is called"]
pub struct PolicyBuilder {
    pub(super) name: Option<String>,
    pub(super) algorithm: Algorithm,
    pub(super) limit: u64,
    pub(super) period: Duration,
    pub(super) burst: Option<u64>,
    /// Priority classes as given: name and reserve in percent (`classes.rs`).
    pub(crate) classes: Vec<(String, u8)>,
    /// The class of a request that names none, or one the policy does not
    /// define (`classes.rs`); `None`: the most reserved class.
    pub(crate) default_class: Option<String>,
}

impl PolicyBuilder {
    /// Names the policy: 1 to 64 ASCII letters, digits, `_`, `-` or `.`.
    /// Without a name the policy is called after its algorithm, limit and
    /// period, for example `gcra-10-per-1s`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Chooses the algorithm (default [`Algorithm::Gcra`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Sets the burst (bucket capacity) of a bucket algorithm: how many
    /// permits may be taken at once after an idle spell. Defaults to the
    /// limit. Window algorithms have no burst and refuse one.
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

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

    /// Validates the policy.
    ///
    /// # Errors
    ///
    /// A [`PolicyError`] naming the field when the limit, period or burst is
    /// zero, when a window algorithm is given a burst, when a sliding log's
    /// limit is above [`SLIDING_LOG_MAX_LIMIT`], when the period is not a
    /// whole number of microseconds, when a value is too large for the
    /// algorithm to compute exactly (ALGORITHMS.md, "Magnitudes": the
    /// error names the policy and the largest value accepted), or when the
    /// name is empty, too long or uses other characters than ASCII letters,
    /// digits, `_`, `-` and `.`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use portcullis::Policy;
    ///
    /// // Quotas as they are sold: a million a day, 10^9 per 30 days.
    /// let daily = Policy::per_day(1_000_000).name("daily").build()?;
    /// let monthly = Policy::per(1_000_000_000, Duration::from_secs(30 * 86_400)).build()?;
    /// assert_eq!((daily.limit(), monthly.capacity()), (1_000_000, 1_000_000_000));
    ///
    /// // Out of range: the error names the policy and what would fit.
    /// let err = Policy::per_second(1 << 40).name("burst").build().unwrap_err();
    /// assert!(err.to_string().starts_with("policy \"burst\": limit"));
    /// assert!(err.to_string().contains("the largest limit accepted is"));
    /// # Ok::<(), portcullis::PolicyError>(())
    /// ```
    pub fn build(self) -> Result<Policy, PolicyError> {
        let Self {
            name,
            algorithm,
            limit,
            period,
            burst,
            classes,
            default_class,
        } = self;
        if limit == 0 {
            return Err(PolicyError::ZeroLimit);
        }
        if period.is_zero() {
            return Err(PolicyError::ZeroPeriod);
        }
        if !period.subsec_nanos().is_multiple_of(1_000) {
            return Err(PolicyError::SubMicrosecondPeriod { period });
        }
        if let Some(burst) = burst {
            if !algorithm.has_burst() {
                return Err(PolicyError::BurstNotSupported { algorithm });
            }
            if burst == 0 {
                return Err(PolicyError::ZeroBurst);
            }
        }
        // Named first, so that a size error can say which policy it is.
        let period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        let name = match name {
            Some(name) => {
                validate_name(&name)?;
                name
            }
            None => default_name(algorithm, limit, period_us),
        };
        let too_large = |field: &'static str, value: u64, max: u64| PolicyError::TooLarge {
            policy: name.clone(),
            algorithm,
            field,
            value,
            max,
        };
        if period_us >= MAX_MAGNITUDE {
            return Err(too_large("period", period_us, MAX_MAGNITUDE - 1));
        }
        if algorithm == Algorithm::SlidingLog && limit > SLIDING_LOG_MAX_LIMIT {
            return Err(PolicyError::SlidingLogLimit {
                policy: name,
                limit,
            });
        }
        let magnitudes = Magnitudes::of(algorithm, limit, period_us, burst).map_err(|field| {
            // The largest value of the field that is accepted, all else
            // equal (found by bisection: acceptance shrinks as the field
            // grows).
            let accepts = |value: u64| match field {
                "burst" => Magnitudes::of(algorithm, limit, period_us, Some(value)).is_ok(),
                _ => Magnitudes::of(algorithm, value, period_us, burst).is_ok(),
            };
            let value = if field == "burst" {
                burst.unwrap_or(limit)
            } else {
                limit
            };
            too_large(field, value, largest_accepted(accepts, value))
        })?;
        let Magnitudes {
            scale,
            increment,
            weight_unit_us,
        } = magnitudes;
        let classes = Classes::build(
            &name,
            algorithm,
            burst.unwrap_or(limit),
            classes,
            default_class,
        )?;
        Ok(Policy {
            classes,
            name: name.into(),
            algorithm,
            limit,
            period_us,
            burst,
            capacity: burst.unwrap_or(limit),
            scale,
            increment,
            weight_unit_us,
            // `scale` is at least 1 here.
            gcra: GcraConsts::of(algorithm, scale, increment, burst.unwrap_or(limit)),
            shape_argument: format!("{limit}:{period_us}:{}", burst.unwrap_or(limit)).into(),
        })
    }
}
