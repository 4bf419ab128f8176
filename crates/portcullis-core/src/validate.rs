//! The request checks every store applies the same way before it
//! charges ([`validate_check`], [`validate_charge`]), so that a bad request
//! gets the same error from every store.

use crate::{Policy, StoreError};

/// Validates the request part every store must refuse the same way: no
/// policies, duplicate names, a cost above a policy's capacity.
///
/// # Errors
///
/// As [`Store::check`](crate::Store::check) documents for bad requests.
pub fn validate_check(policies: &[Policy], cost: u64) -> Result<(), StoreError> {
    if policies.is_empty() {
        return Err(StoreError::NoPolicies);
    }
    for (i, policy) in policies.iter().enumerate() {
        if cost > policy.capacity() {
            return Err(StoreError::CostTooHigh {
                policy: policy.name().to_owned(),
                cost,
                capacity: policy.capacity(),
            });
        }
        if policies[..i].iter().any(|p| p.name() == policy.name()) {
            return Err(StoreError::DuplicatePolicy {
                name: policy.name().to_owned(),
            });
        }
    }
    Ok(())
}

/// Validates a post-charge ([`Store::charge`](crate::Store::charge)) the way every store must:
/// no policies, duplicate names, and algorithms without post-charging
/// (anything but GCRA and the token bucket) are refused. The cost is not
/// limited.
///
/// ```
/// use portcullis::store::validate_charge;
/// use portcullis::{Algorithm, Policy};
///
/// let gcra = Policy::per_minute(10).build()?;
/// assert!(validate_charge(&[gcra]).is_ok());
/// let window = Policy::per_minute(10).algorithm(Algorithm::FixedWindow).build()?;
/// let err = validate_charge(&[window]).unwrap_err();
/// assert!(err.to_string().contains("fixed_window"), "{err}");
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
///
/// # Errors
///
/// As [`Store::charge`](crate::Store::charge) documents for bad requests.
pub fn validate_charge(policies: &[Policy]) -> Result<(), StoreError> {
    validate_check(policies, 0)?;
    match policies
        .iter()
        .find(|policy| !crate::algorithms::supports_charge(policy.algorithm()))
    {
        Some(policy) => Err(StoreError::Unsupported {
            operation: "charge",
            detail: format!(
                "policy {:?} uses the {} algorithm, which cannot be charged after the fact; give it Algorithm::Gcra (the default) or Algorithm::TokenBucket",
                policy.name(),
                policy.algorithm()
            ),
        }),
        None => Ok(()),
    }
}

/// Validates a check of several subjects in one step (one policy each,
/// `MemoryStore::check_subjects`, `RedisStore::check_subjects`): none
/// given, the same subject with the same policy name twice, a cost above a
/// policy's capacity.
///
/// ```
/// use portcullis::store::validate_subjects;
/// use portcullis::{Policy, StoreError};
///
/// let policy = Policy::per_minute(10).name("per-user").build()?;
/// assert!(validate_subjects(&[("alice", &policy), ("bob", &policy)], 1).is_ok());
/// let twice = validate_subjects(&[("alice", &policy), ("alice", &policy)], 1);
/// assert!(matches!(twice, Err(StoreError::DuplicatePolicy { .. })));
/// # Ok::<(), portcullis::PolicyError>(())
/// ```
///
/// # Errors
///
/// [`StoreError::NoPolicies`], [`StoreError::DuplicatePolicy`] and
/// [`StoreError::CostTooHigh`], as [`validate_check`].
pub fn validate_subjects(checks: &[(&str, &Policy)], cost: u64) -> Result<(), StoreError> {
    if checks.is_empty() {
        return Err(StoreError::NoPolicies);
    }
    for (i, (subject, policy)) in checks.iter().enumerate() {
        validate_check(std::slice::from_ref(*policy), cost)?;
        if checks[..i]
            .iter()
            .any(|(s, p)| s == subject && p.name() == policy.name())
        {
            return Err(StoreError::DuplicatePolicy {
                name: policy.name().to_owned(),
            });
        }
    }
    Ok(())
}
