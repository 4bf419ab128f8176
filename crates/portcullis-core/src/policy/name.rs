//! Policy names: which are valid ([`validate_name`], shared with
//! concurrency policies, classes and limit sets) and the name a policy
//! without one gets ([`default_name`]).

use super::bounds::MAX_POLICY_NAME_LEN;
use super::{Algorithm, PolicyError};

/// Whether `name` is a valid policy name: 1 to [`MAX_POLICY_NAME_LEN`]
/// ASCII letters, digits, `_`, `-` or `.`.
pub(crate) fn validate_name(name: &str) -> Result<(), PolicyError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_POLICY_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(PolicyError::InvalidName {
            name: name.chars().take(80).collect(),
        })
    }
}

pub(super) fn default_name(algorithm: Algorithm, limit: u64, period_us: u64) -> String {
    let period = if period_us.is_multiple_of(86_400_000_000) {
        format!("{}d", period_us / 86_400_000_000)
    } else if period_us.is_multiple_of(3_600_000_000) {
        format!("{}h", period_us / 3_600_000_000)
    } else if period_us.is_multiple_of(60_000_000) {
        format!("{}m", period_us / 60_000_000)
    } else if period_us.is_multiple_of(1_000_000) {
        format!("{}s", period_us / 1_000_000)
    } else if period_us.is_multiple_of(1_000) {
        format!("{}ms", period_us / 1_000)
    } else {
        format!("{period_us}us")
    };
    format!(
        "{}-{limit}-per-{period}",
        algorithm.as_str().replace('_', "-")
    )
}
