//! Why a command failed, and the exit code each cause has (listed in
//! `--help`). The message says what to do; for an error with a cause
//! (a store error, a bad file), the causes follow it, since an operator
//! reads them here rather than in a log.

use std::error::Error;
use std::fmt;
use std::process::ExitCode;

/// A failed command.
#[derive(Debug)]
pub(crate) struct Failure {
    kind: Kind,
    message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Bad usage or input: exit 2.
    Usage,
    /// An invalid limits file: exit 3.
    Limits,
    /// The store failed: exit 4.
    Store,
    /// A reset not confirmed: exit 5.
    Refused,
    /// `top`: an endpoint unreachable or not a top-denied table: exit 6.
    Endpoint,
}

impl Failure {
    /// Bad input on the command line.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::Usage,
            message: message.into(),
        }
    }

    /// A limits file that does not parse or validate (its Display is
    /// `file:line:column: field: reason`).
    pub(crate) fn limits(error: &(dyn Error + 'static)) -> Self {
        Self {
            kind: Kind::Limits,
            message: with_causes(error),
        }
    }

    /// Several failures of one kind (the first's), one a line.
    pub(crate) fn joined(failures: Vec<Self>) -> Self {
        let kind = failures.first().map_or(Kind::Usage, |f| f.kind);
        let message = failures
            .into_iter()
            .map(|f| f.message)
            .collect::<Vec<_>>()
            .join("\n");
        Self { kind, message }
    }

    /// The store failed; `doing` says what was being done.
    pub(crate) fn store(doing: &str, error: &(dyn Error + 'static)) -> Self {
        Self {
            kind: Kind::Store,
            message: format!("{doing}: {}", with_causes(error)),
        }
    }

    /// A top-denied endpoint failed; `doing` says what to do.
    pub(crate) fn endpoint(doing: &str, error: &(dyn Error + 'static)) -> Self {
        Self {
            kind: Kind::Endpoint,
            message: format!("{doing}: {}", with_causes(error)),
        }
    }

    /// A top-denied endpoint answered what is not its table.
    pub(crate) fn endpoint_message(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::Endpoint,
            message: message.into(),
        }
    }

    /// A reset not confirmed; nothing was written.
    pub(crate) fn refused(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::Refused,
            message: message.into(),
        }
    }

    /// The same message, as bad input (exit 2).
    pub(crate) fn into_usage(self) -> Self {
        Self {
            kind: Kind::Usage,
            ..self
        }
    }

    /// The async runtime could not start.
    pub(crate) fn runtime(error: &std::io::Error) -> Self {
        Self::store("cannot start the async runtime", error)
    }

    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code())
    }

    fn code(&self) -> u8 {
        match self.kind {
            Kind::Usage => 2,
            Kind::Limits => 3,
            Kind::Store => 4,
            Kind::Refused => 5,
            Kind::Endpoint => 6,
        }
    }

    /// `{"error": message, "exit_code": code}`.
    pub(crate) fn to_json(&self) -> String {
        serde_json::json!({ "error": self.message, "exit_code": self.code() }).to_string()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// An error and each of its causes, as one line.
fn with_causes(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Some errors repeat their cause in their own message.
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
