//! Reading a script's reply: the general check's five integers per policy
//! ([`parse_verdict`]), a check with options' record ([`parse_checked`]),
//! and the errors a reply of the wrong shape becomes.

use std::time::Duration;

use portcullis_core::{Checked, Decision, StoreError, Verdict};
use redis::Value;

/// Parses the check script's reply: five integers per policy.
pub(crate) fn parse_verdict(value: Value, capacities: &[u64]) -> Result<Verdict, StoreError> {
    let items = match value {
        Value::Array(items) => items,
        other => return Err(protocol(format!("expected an array, got {other:?}"))),
    };
    if items.len() != 5 * capacities.len() {
        return Err(protocol(format!(
            "expected {} integers for {} policies, got {}",
            5 * capacities.len(),
            capacities.len(),
            items.len()
        )));
    }
    items
        .chunks_exact(5)
        .zip(capacities)
        .map(|(chunk, &capacity)| decision(ints(chunk)?, capacity))
        .collect()
}

/// A fresh verdict (an array), or a record's (a bulk string of the first
/// check's integers, comma-separated): a replay.
pub(crate) fn parse_checked(value: Value, capacities: &[u64]) -> Result<Checked, StoreError> {
    let body = match value {
        Value::BulkString(bytes) => bytes,
        Value::SimpleString(text) => text.into_bytes(),
        other => return Ok(Checked::new(parse_verdict(other, capacities)?, false)),
    };
    let text = std::str::from_utf8(&body).map_err(|_| StoreError::Protocol {
        detail: "an idempotency record that is not text".to_owned(),
    })?;
    let items = text
        .split(',')
        .map(|item| {
            item.parse::<i64>()
                .map(Value::Int)
                .map_err(|_| StoreError::Protocol {
                    detail: format!("an idempotency record holds {item:?}, not an integer"),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Checked::new(
        parse_verdict(Value::Array(items), capacities)?,
        true,
    ))
}

/// The `N` integers of a script's reply; `items` must hold exactly `N`.
pub(crate) fn ints<const N: usize>(items: &[Value]) -> Result<[i64; N], StoreError> {
    if items.len() != N {
        return Err(protocol(format!(
            "expected {N} integers, got {}",
            items.len()
        )));
    }
    let mut numbers = [0_i64; N];
    for (number, item) in numbers.iter_mut().zip(items) {
        *number = match item {
            Value::Int(n) => *n,
            other => return Err(protocol(format!("expected an integer, got {other:?}"))),
        };
    }
    Ok(numbers)
}

fn decision(numbers: [i64; 5], capacity: u64) -> Result<Decision, StoreError> {
    let [allowed, remaining, retry_after, reset_after, delay] = numbers;
    let non_negative = |n: i64, what: &str| {
        u64::try_from(n).map_err(|_| protocol(format!("{what} is negative ({n})")))
    };
    let remaining = non_negative(remaining, "remaining")?;
    let reset_after = Duration::from_micros(non_negative(reset_after, "reset_after")?);
    let delay = Duration::from_micros(non_negative(delay, "delay")?);
    match (allowed, retry_after) {
        (1, -1) => Ok(Decision::allowed(capacity, remaining, reset_after).with_delay(delay)),
        (0, retry_after) => {
            let retry_after = Duration::from_micros(non_negative(retry_after, "retry_after")?);
            Ok(Decision::denied(capacity, remaining, retry_after, reset_after).with_delay(delay))
        }
        (allowed, retry_after) => Err(protocol(format!(
            "allowed = {allowed} with retry_after = {retry_after}"
        ))),
    }
}

/// A reply that is not what the script answers.
pub(crate) fn protocol(detail: String) -> StoreError {
    StoreError::Protocol { detail }
}

/// How long a subject Redis has no memory for is told to wait: Redis frees
/// memory as keys expire, at a time the client cannot know.
pub(crate) const OUT_OF_MEMORY_RETRY: Duration = Duration::from_secs(1);

/// The error of a check of a subject Redis has no memory for.
pub(crate) fn out_of_memory() -> StoreError {
    StoreError::OutOfMemory {
        retry_after: OUT_OF_MEMORY_RETRY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_of_the_wrong_shape_are_protocol_errors() {
        let ok = Value::Array(vec![
            Value::Int(1),
            Value::Int(4),
            Value::Int(-1),
            Value::Int(100),
            Value::Int(0),
        ]);
        let verdict = parse_verdict(ok, &[5]).unwrap();
        assert!(verdict.is_allowed());
        assert_eq!(verdict.decisions()[0].remaining(), 4);
        assert_eq!(verdict.decisions()[0].limit(), 5);

        let short = Value::Array(vec![Value::Int(1)]);
        assert!(matches!(
            parse_verdict(short, &[5]),
            Err(StoreError::Protocol { .. })
        ));
        let text = Value::Array(vec![Value::SimpleString("1".into()); 5]);
        assert!(matches!(
            parse_verdict(text, &[5]),
            Err(StoreError::Protocol { .. })
        ));
        let nil = Value::Nil;
        assert!(matches!(
            parse_verdict(nil, &[5]),
            Err(StoreError::Protocol { .. })
        ));
        let negative = Value::Array(vec![
            Value::Int(0),
            Value::Int(-3),
            Value::Int(5),
            Value::Int(1),
            Value::Int(0),
        ]);
        assert!(matches!(
            parse_verdict(negative, &[5]),
            Err(StoreError::Protocol { .. })
        ));
        let allowed_with_retry = Value::Array(vec![
            Value::Int(1),
            Value::Int(3),
            Value::Int(5),
            Value::Int(1),
            Value::Int(0),
        ]);
        assert!(matches!(
            parse_verdict(allowed_with_retry, &[5]),
            Err(StoreError::Protocol { .. })
        ));
    }

    #[test]
    fn a_record_parses_as_a_replay_and_garbage_is_a_protocol_error() {
        let record = Value::BulkString(b"1,4,-1,200000,0".to_vec());
        let checked = parse_checked(record, &[5]).unwrap();
        assert!(checked.is_replay());
        assert_eq!(checked.verdict().decisions()[0].remaining(), 4);
        let bad = parse_checked(Value::BulkString(b"1,x".to_vec()), &[5]).unwrap_err();
        assert!(matches!(bad, StoreError::Protocol { .. }), "{bad}");
        let short = parse_checked(Value::BulkString(b"1,4".to_vec()), &[5]).unwrap_err();
        assert!(matches!(short, StoreError::Protocol { .. }), "{short}");
    }
}
