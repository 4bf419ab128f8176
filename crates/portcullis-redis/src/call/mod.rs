//! One call of a check's script, built once: [`Call`] takes the state keys,
//! the time, the cost and the [`PolicySet`]'s arguments, chooses the
//! function that serves it (`FCALL`, a fast function or the general check)
//! or the composed script (`EVALSHA`), runs it ([`Caller::run`], in
//! `caller.rs`: an `OOM` refusal runs once more as the allow-oom twin),
//! sends it once more as `EVALSHA` when Redis refuses Functions (nothing
//! ran), and reads the reply (`reply.rs`, and `int_reply.rs` for the fast
//! functions' integers).
//!
//! Below the store and its paths (local budget, coalescing), above the
//! connection and the scripts: nothing here knows a `RedisStore`.

use std::sync::Arc;

use portcullis_core::{Checked, StoreError, Verdict};
use redis::{Cmd, Value};
use smallvec::SmallVec;

use crate::functions::CallPath;
use crate::scripts::{LuaScript, Serving};

mod caller;
pub(crate) mod int_reply;
pub(crate) mod reply;
mod set;
mod spare;
mod target;

pub(crate) use caller::Caller;
pub(crate) use set::PolicySet;
pub(crate) use target::Target;

/// Which general script a [`Call`] runs.
#[derive(Debug)]
pub(crate) enum Kind {
    /// A check (check.lua; a peek at cost 0), or the fast function that
    /// serves it.
    Check,
    /// A post-charge (charge.lua).
    Charge,
    /// A check with options (options.lua).
    Options(OptionArgs),
}

/// The arguments a check with options adds: the idempotency record's key,
/// window and free replays, and the class reserves.
#[derive(Debug, Default)]
pub(crate) struct OptionArgs {
    pub(crate) record_key: Option<String>,
    pub(crate) window_us: u64,
    pub(crate) free_replays: u32,
    pub(crate) reserves: SmallVec<[u64; 4]>,
}

/// How a call lays out its arguments (fixed by the Lua side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `keys... [letters] now cost [options] policies... [reserves]`: the
    /// general scripts (the letters only for a function).
    General,
    /// `key <policy>:<cost> [now]`: a one-policy fast function.
    One,
    /// `keys... cost policies... [now]`: gcra_multi.lua.
    Multi,
}

/// One call of a check's script, built once (see the module docs).
#[derive(Debug)]
pub(crate) struct Call {
    kind: Kind,
    /// What is sent first, and how its arguments are laid out.
    script: LuaScript,
    layout: Layout,
    /// The keys, the policy set and the policies.
    target: Arc<Target>,
    now: Option<u64>,
    cost: u64,
}

impl Call {
    /// The call of `kind` for `cost` against `target` on `path`, read at
    /// the caller's time now.
    pub(crate) fn new(
        caller: &Caller,
        path: CallPath,
        kind: Kind,
        target: Arc<Target>,
        cost: u64,
    ) -> Result<Self, StoreError> {
        let library = caller.scripts.library();
        let set = target.set();
        // The fast functions serve checks on the Functions path only.
        let fast = if matches!(kind, Kind::Check) && path != CallPath::Evalsha {
            library.fast_function(set.serving())
        } else {
            None
        };
        let (script, layout) = match fast {
            // A fast function's integers are read with the policies.
            Some(function) if target.policies().len() == set.len() => {
                let layout = if set.serving() == Serving::GcraMulti {
                    Layout::Multi
                } else {
                    Layout::One
                };
                (function.clone(), layout)
            }
            _ => {
                let script = match (path, &kind) {
                    (CallPath::Evalsha, _) => evalsha_script(caller, &kind, set)?,
                    (_, Kind::Check) => library.function(cost == 0).clone(),
                    (_, Kind::Charge) => library.charge_function().clone(),
                    (_, Kind::Options(_)) => library.options_function().clone(),
                };
                (script, Layout::General)
            }
        };
        Ok(Self {
            kind,
            script,
            layout,
            target,
            now: caller.now(),
            cost,
        })
    }

    /// The record key of a check with options, if any (a key the call
    /// sends after the state keys).
    fn record(&self) -> Option<&str> {
        match &self.kind {
            Kind::Options(options) => options.record_key.as_deref(),
            _ => None,
        }
    }

    /// The command of `script` laid out as `layout`, and its estimated
    /// size in bytes (for [`spare::give_back`]).
    fn command(&self, script: &LuaScript, layout: Layout) -> Result<(Cmd, usize), StoreError> {
        let options = match &self.kind {
            Kind::Options(options) => Some(options),
            _ => None,
        };
        let record = self.record();
        // Sized once: the command's argument list and bytes never grow.
        let (count, bytes) = command_size(&self.target, record, options);
        let bytes = bytes + script.sha().len();
        let mut cmd = spare::take(count, bytes);
        cmd.arg(match layout {
            Layout::General if !script.is_function() => "EVALSHA",
            Layout::General if matches!(self.kind, Kind::Check) && self.cost == 0 => "FCALL_RO",
            _ => "FCALL",
        });
        cmd.arg(script.sha())
            .arg(self.target.key_count() + usize::from(record.is_some()));
        for key in self.target.keys() {
            cmd.arg(key);
        }
        if let Some(record) = record {
            cmd.arg(record);
        }
        self.push_arguments(&mut cmd, script.is_function(), layout)?;
        Ok((cmd, bytes))
    }

    /// Appends what the call sends after its keys, laid out as `layout`
    /// (a general call's plan letters first when `letters`: a function's).
    fn push_arguments(
        &self,
        cmd: &mut Cmd,
        letters: bool,
        layout: Layout,
    ) -> Result<(), StoreError> {
        let options = match &self.kind {
            Kind::Options(options) => Some(options),
            _ => None,
        };
        let set = self.target.set();
        match layout {
            Layout::General => {
                if letters {
                    cmd.arg(set.letters()?.as_slice());
                }
                push_time(cmd, self.now);
                cmd.arg(self.cost);
                if let Some(options) = options {
                    cmd.arg(options.window_us).arg(options.free_replays);
                }
                for argument in set.arguments() {
                    cmd.arg(argument);
                }
                if let Some(options) = options {
                    for reserve in &options.reserves {
                        cmd.arg(*reserve);
                    }
                }
            }
            Layout::One => {
                cmd.arg(OneArgument {
                    policy: set.argument(0),
                    cost: self.cost,
                });
                if let Some(now) = self.now {
                    cmd.arg(now);
                }
            }
            Layout::Multi => {
                cmd.arg(self.cost);
                for argument in set.arguments() {
                    cmd.arg(argument);
                }
                if let Some(now) = self.now {
                    cmd.arg(now);
                }
            }
        }
        Ok(())
    }

    /// Sends the call: once, and when Redis refused `FCALL` or `FUNCTION
    /// LOAD` (so nothing ran), once more as the general script by
    /// `EVALSHA`, which the store uses from now on.
    pub(crate) async fn send(&self, caller: &Caller) -> Result<Value, StoreError> {
        let first_key = self.target.first_key();
        let (cmd, bytes) = self.command(&self.script, self.layout)?;
        let value = caller.run(&self.script, &cmd, first_key).await;
        spare::give_back(cmd, bytes);
        match value {
            Err(error)
                if self.script.is_function()
                    && caller.scripts.path().refused(&error, first_key) =>
            {
                let script = evalsha_script(caller, &self.kind, self.target.set())?;
                let (cmd, _) = self.command(&script, Layout::General)?;
                // Boxed: rare, and it would double this future's size.
                Box::pin(caller.run(&script, &cmd, first_key)).await
            }
            other => other,
        }
    }

    /// The function this call is sent to (its name, for a batch across
    /// subjects, which takes checks only: no record key).
    pub(crate) fn function(&self) -> &str {
        self.script.sha()
    }

    /// The call's state keys, in order.
    pub(crate) fn keys(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.target.keys()
    }

    /// Appends what this call sends after its keys when sent alone (for a
    /// batch across subjects).
    pub(crate) fn push_alone_arguments(&self, cmd: &mut Cmd) -> Result<(), StoreError> {
        self.push_arguments(cmd, self.script.is_function(), self.layout)
    }

    /// Appends what the check script composed for this call's policy set
    /// takes after its keys (`now cost policies...`), whatever the call
    /// was built to send: a check's arguments in a batch across subjects
    /// on the `EVALSHA` path, whose script decides it as that check script
    /// would (its reply is read as the general check's).
    pub(crate) fn push_script_arguments(&self, cmd: &mut Cmd) -> Result<(), StoreError> {
        self.push_arguments(cmd, false, Layout::General)
    }

    /// The plan of this call's policy set: one letter per policy.
    pub(crate) fn letters(&self) -> Result<SmallVec<[u8; 8]>, StoreError> {
        self.target.set().letters()
    }

    /// The first state key (where the call goes on a Cluster).
    pub(crate) fn first_key(&self) -> &str {
        self.target.first_key()
    }

    /// Whether the call goes as `FCALL` (a batch across subjects of only
    /// these goes as `FCALL` of the library's `mixed`; one with a call of
    /// the `EVALSHA` path, as the script of such batches).
    pub(crate) fn is_function(&self) -> bool {
        self.script.is_function()
    }

    /// Sends a check or a post-charge and reads its verdict.
    pub(crate) async fn verdict(&self, caller: &Caller) -> Result<Verdict, StoreError> {
        let value = self.send(caller).await?;
        self.read(value)
    }

    /// Reads a check's or a post-charge's reply: a fast function's
    /// integers, or the general check's five per policy (which a fast
    /// function also answers for a state only the general check reads).
    pub(crate) fn read(&self, value: Value) -> Result<Verdict, StoreError> {
        let capacities = self.target.set().capacities();
        let policies = self.target.policies();
        match (self.layout, value) {
            (Layout::One, Value::Int(reply)) if !policies.is_empty() => {
                int_reply::verdict(&policies[0], reply, self.cost)
            }
            (Layout::Multi, Value::Array(items))
                if items.len() == policies.len()
                    && items.iter().all(|item| matches!(item, Value::Int(_))) =>
            {
                let leads: Vec<i64> = items
                    .iter()
                    .filter_map(|item| match item {
                        Value::Int(lead) => Some(*lead),
                        _ => None,
                    })
                    .collect();
                int_reply::multi_verdict(policies, &leads, self.cost)
            }
            (_, value) => reply::parse_verdict(value, capacities),
        }
    }

    /// Sends a check with options and reads its answer (a replay or not).
    pub(crate) async fn checked(&self, caller: &Caller) -> Result<Checked, StoreError> {
        let value = self.send(caller).await?;
        reply::parse_checked(value, self.target.set().capacities())
    }
}

/// The composed script (`EVALSHA`) of a call of `kind` for `set`.
fn evalsha_script(caller: &Caller, kind: &Kind, set: &PolicySet) -> Result<LuaScript, StoreError> {
    let algorithms = set.algorithms();
    match kind {
        Kind::Check => caller.scripts.get(algorithms),
        Kind::Charge => caller.scripts.get_charge(algorithms),
        Kind::Options(_) => caller.scripts.get_options(algorithms),
    }
}

/// How many arguments a call's command has at most, and about how many
/// bytes they take (the command's buffers are sized once from it).
fn command_size(
    target: &Target,
    record: Option<&str>,
    options: Option<&OptionArgs>,
) -> (usize, usize) {
    let set = target.set();
    let reserves = options.map_or(0, |options| options.reserves.len());
    // Name, function, key count, keys, record, letters, time, cost, the
    // two option numbers, the policies, the reserves.
    let count = 3 + target.key_count() + 1 + 1 + 1 + 1 + 2 + set.len() + reserves;
    let text: usize = target.key_bytes()
        + record.map_or(0, str::len)
        + set.arguments().map(str::len).sum::<usize>();
    // Every number at most 20 digits.
    (
        count,
        text + 20 * (count - target.key_count() - set.len()) + 16,
    )
}

/// Appends a call's time argument: `now`, or empty for Redis `TIME`.
pub(crate) fn push_time(cmd: &mut Cmd, now: Option<u64>) {
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
}

/// A fast function's argument, `<policy>:<cost>`: the policy's argument
/// (written when the policy was built) and the cost's digits, written
/// straight into the command's buffer. `write!` through `core::fmt` cost
/// about 380 instructions a check here (`cargo bench -p portcullis-redis
/// --bench redis_client`); this, about a tenth of that.
struct OneArgument<'a> {
    policy: &'a str,
    cost: u64,
}

impl redis::ToRedisArgs for OneArgument<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        let mut digits = itoa::Buffer::new();
        let cost = digits.format(self.cost);
        let mut argument = out.writer_for_next_arg();
        // Writing to a command's buffer cannot fail.
        let _ = argument.write_all(self.policy.as_bytes());
        let _ = argument.write_all(b":");
        let _ = argument.write_all(cost.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use portcullis_core::{Algorithm, Policy};

    use super::*;
    use crate::scripts;

    fn args(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .filter_map(|arg| match arg {
                redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_evalsha_fallback_keeps_every_argument_but_the_plan() {
        let policies = [
            Policy::per_second(5).name("a").build().unwrap(),
            Policy::per_minute(9)
                .algorithm(Algorithm::FixedWindow)
                .name("b")
                .build()
                .unwrap(),
        ];
        let set = PolicySet::new(&policies, scripts::Library::serving(&policies, 1));
        let script = scripts::compose(&[Algorithm::Gcra, Algorithm::FixedWindow]).unwrap();
        let function = scripts::ScriptCache::new()
            .library()
            .function(false)
            .clone();
        let call = Call {
            kind: Kind::Check,
            script: function.clone(),
            layout: Layout::General,
            target: Arc::new(Target::new(set, &policies).with_key("k1").with_key("k2")),
            now: None,
            cost: 1,
        };
        let (fcall, _) = call.command(&function, Layout::General).unwrap();
        let expected: Vec<&[u8]> = vec![
            b"FCALL",
            function.sha().as_bytes(),
            b"2",
            b"k1",
            b"k2",
            b"ae",
            b"",
            b"1",
            b"5:1000000:5",
            b"9:60000000:9",
        ];
        assert_eq!(args(&fcall), expected);
        let (evalsha, _) = call.command(&script, Layout::General).unwrap();
        let expected: Vec<&[u8]> = vec![
            b"EVALSHA",
            script.sha().as_bytes(),
            b"2",
            b"k1",
            b"k2",
            b"",
            b"1",
            b"5:1000000:5",
            b"9:60000000:9",
        ];
        assert_eq!(args(&evalsha), expected);
    }
}
