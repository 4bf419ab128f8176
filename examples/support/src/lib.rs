//! What every example shares: logging to stderr and error reports a person
//! can act on.
//!
//! An example's `main` returns the [`ExitCode`] of [`report`]: an error is
//! printed with its `Display` (which says what to do) and then each cause
//! from `source()` once, instead of the `Debug` form a `main` returning
//! `Result` prints.

use std::error::Error;
use std::process::ExitCode;

/// Logs to stderr at `info`, or as `RUST_LOG` says.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        // Logs apart from what the examples print on stdout.
        .with_writer(std::io::stderr)
        .init();
}

/// Success, or the error and its causes on stderr and a failure exit code.
#[must_use]
pub fn report(result: Result<(), Box<dyn Error>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{}", describe(error.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// `error: <display>` and a `caused by: <display>` line per source: the
/// plain `source()` walk anyhow's `{:#}` does, which names each cause once
/// (portcullis's errors keep causes out of their `Display`, and collapse
/// redis-rs's repeated one).
fn describe(error: &(dyn Error + 'static)) -> String {
    let mut text = format!("error: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str("\n  caused by: ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("could not start: check the address")
        }
    }

    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_error_is_reported_with_each_cause_once() {
        let error = Outer(std::io::Error::other("connection refused"));
        assert_eq!(
            describe(&error),
            "error: could not start: check the address\n  caused by: connection refused"
        );
        assert_eq!(report(Ok(())), ExitCode::SUCCESS);
    }
}
