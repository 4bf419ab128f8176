//! The Lua sources and the scripts composed from them for the `EVALSHA`
//! path ([`LuaScript`], `compose*`); the Redis Functions library holding
//! them all for `FCALL` is in `library.rs`, the cache of composed scripts
//! in `cache.rs`. Nothing here sends a command.

use std::sync::Arc;

use redis::Cmd;

use portcullis_core::{Algorithm, LeakyMode, StoreError};
use smallvec::SmallVec;

mod cache;
mod library;

pub(crate) use cache::ScriptCache;
pub(crate) use library::{Library, Serving};

/// The algorithms of a policy set, in order: what a composed script is
/// composed for.
type Algorithms = SmallVec<[Algorithm; 4]>;

const PRELUDE: &str = include_str!("../lua/prelude.lua");
const GCRA: &str = include_str!("../lua/gcra.lua");
const LEAKY_QUEUE: &str = include_str!("../lua/leaky_queue.lua");
const TOKEN_BUCKET: &str = include_str!("../lua/token_bucket.lua");
const LEAKY_METER: &str = include_str!("../lua/leaky_meter.lua");
const FIXED_WINDOW: &str = include_str!("../lua/fixed_window.lua");
const SLIDING_WINDOW: &str = include_str!("../lua/sliding_window.lua");
const SLIDING_LOG: &str = include_str!("../lua/sliding_log.lua");
const CHECK: &str = include_str!("../lua/check.lua");
const LIMITER: &str = include_str!("../lua/limiter.lua");
const LIBRARY: &str = include_str!("../lua/library.lua");
const CHARGE: &str = include_str!("../lua/charge.lua");
const CHARGE_LIBRARY: &str = include_str!("../lua/charge_library.lua");
const LEASE: &str = include_str!("../lua/lease.lua");
const RESERVE: &str = include_str!("../lua/reserve.lua");
const RESERVE_LIBRARY: &str = include_str!("../lua/reserve_library.lua");
const BATCH: &str = include_str!("../lua/batch.lua");
const BATCH_FAST: &str = include_str!("../lua/batch_fast.lua");
const BATCH_SCRIPT: &str = include_str!("../lua/batch_script.lua");
const GCRA_MULTI: &str = include_str!("../lua/gcra_multi.lua");
const GRANT: &str = include_str!("../lua/grant.lua");
const BUCKET_FAST: &str = include_str!("../lua/bucket_fast.lua");
const FIXED_WINDOW_FAST: &str = include_str!("../lua/fixed_window_fast.lua");
const SLIDING_WINDOW_FAST: &str = include_str!("../lua/sliding_window_fast.lua");
const LEAKY_QUEUE_FAST: &str = include_str!("../lua/leaky_queue_fast.lua");
const SLIDING_LOG_FAST: &str = include_str!("../lua/sliding_log_fast.lua");
const MIXED: &str = include_str!("../lua/mixed.lua");
const MIXED_SCRIPT: &str = include_str!("../lua/mixed_script.lua");
const PLAN: &str = include_str!("../lua/plan.lua");
const BATCH_EACH: &str = include_str!("../lua/batch_each.lua");
const OPTIONS: &str = include_str!("../lua/options.lua");
const OPTIONS_LIBRARY: &str = include_str!("../lua/options_library.lua");

/// Appends the arguments of `args` to `cmd` (a call built apart from its
/// command name: [`LuaScript::call_cmd`]).
pub(crate) fn append_args<'a>(cmd: &mut Cmd, args: impl Iterator<Item = redis::Arg<&'a [u8]>>) {
    for arg in args {
        if let redis::Arg::Simple(bytes) = arg {
            cmd.arg(bytes);
        }
    }
}

/// The algorithm sources in the order they are concatenated (the queue
/// uses the GCRA arithmetic, so GCRA comes first).
const SOURCES: [(Part, &str); 7] = [
    (Part::Gcra, GCRA),
    (Part::LeakyQueue, LEAKY_QUEUE),
    (Part::TokenBucket, TOKEN_BUCKET),
    (Part::LeakyMeter, LEAKY_METER),
    (Part::FixedWindow, FIXED_WINDOW),
    (Part::SlidingWindow, SLIDING_WINDOW),
    (Part::SlidingLog, SLIDING_LOG),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Gcra,
    LeakyQueue,
    TokenBucket,
    LeakyMeter,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
}

/// The letter naming an algorithm in a plan (`CODES` in plan.lua): a
/// Functions call's, or a check's in a batch across subjects.
fn code(algorithm: Algorithm) -> Result<char, StoreError> {
    Ok(match algorithm {
        Algorithm::Gcra => 'a',
        Algorithm::LeakyBucket(LeakyMode::Queue) => 'b',
        Algorithm::TokenBucket => 'c',
        Algorithm::LeakyBucket(LeakyMode::Meter) => 'd',
        Algorithm::FixedWindow => 'e',
        Algorithm::SlidingWindow => 'f',
        Algorithm::SlidingLog => 'g',
        other => return Err(unknown(other)),
    })
}

fn unknown(algorithm: Algorithm) -> StoreError {
    StoreError::Protocol {
        detail: format!(
            "algorithm {algorithm} has no Redis script in this version of portcullis-redis; upgrade portcullis-redis to match portcullis-core"
        ),
    }
}

/// The Lua function name and the source parts an algorithm needs.
fn parts(algorithm: Algorithm) -> Result<(&'static str, &'static [Part]), StoreError> {
    Ok(match algorithm {
        Algorithm::Gcra => ("gcra", &[Part::Gcra]),
        Algorithm::LeakyBucket(LeakyMode::Queue) => {
            ("leaky_queue", &[Part::Gcra, Part::LeakyQueue])
        }
        Algorithm::LeakyBucket(LeakyMode::Meter) => ("leaky_meter", &[Part::LeakyMeter]),
        Algorithm::TokenBucket => ("token_bucket", &[Part::TokenBucket]),
        Algorithm::FixedWindow => ("fixed_window", &[Part::FixedWindow]),
        Algorithm::SlidingWindow => ("sliding_window", &[Part::SlidingWindow]),
        Algorithm::SlidingLog => ("sliding_log", &[Part::SlidingLog]),
        other => return Err(unknown(other)),
    })
}

/// Something the server runs by name: a script (EVALSHA, named by its
/// SHA-1) or a function of the portcullis library (FCALL), with the source
/// that defines it, and for a check its allow-oom twin.
#[derive(Debug, Clone)]
pub(crate) struct LuaScript {
    source: Arc<str>,
    sha: Arc<str>,
    function: bool,
    allow_oom: Option<Arc<LuaScript>>,
}

impl LuaScript {
    /// The function `sha` (its name) of the library whose source is
    /// `source`, with its allow-oom twin if it has one.
    fn function(source: &Arc<str>, name: String, allow_oom: Option<LuaScript>) -> Self {
        Self {
            source: Arc::clone(source),
            sha: name.into(),
            function: true,
            allow_oom: allow_oom.map(Arc::new),
        }
    }
}

/// The first line of the allow-oom twin of a check script: Redis 7 runs it
/// (and its writes) even at `maxmemory` with `noeviction`.
const ALLOW_OOM_SHEBANG: &str = "#!lua flags=allow-oom\n";
/// The last line of a check script and of its allow-oom twin.
const RUN_CHECK: &str = "return check(PLAN, KEYS, ARGV, 0, false)\n";
const RUN_CHECK_NO_NEW_KEYS: &str = "return check(PLAN, KEYS, ARGV, 0, true)\n";

impl LuaScript {
    fn new(source: String) -> Self {
        let sha = redis::Script::new(&source).get_hash().into();
        Self {
            source: source.into(),
            sha,
            function: false,
            allow_oom: None,
        }
    }

    /// Whether this is a function (FCALL) rather than a script (EVALSHA).
    pub(crate) fn is_function(&self) -> bool {
        self.function
    }

    /// The command that makes the server know this script or function:
    /// `SCRIPT LOAD`, or `FUNCTION LOAD REPLACE` of the whole library.
    pub(crate) fn load_cmd(&self) -> Cmd {
        let mut cmd = if self.function {
            let mut cmd = redis::cmd("FUNCTION");
            cmd.arg("LOAD").arg("REPLACE");
            cmd
        } else {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD");
            cmd
        };
        cmd.arg(&*self.source);
        cmd
    }

    /// The check script's twin for a Redis that refused it for lack of
    /// memory (`OOM`): declared `allow-oom`, it updates keys that exist and,
    /// instead of creating one, answers the status `NOROOM` having written
    /// nothing. `None` for scripts other than checks.
    pub(crate) fn allow_oom(&self) -> Option<&LuaScript> {
        self.allow_oom.as_deref()
    }

    #[cfg(test)]
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// The start of a call of this script: `FCALL <function>` or
    /// `EVALSHA <sha>`, to which the caller adds the keys and arguments
    /// ([`append_args`]).
    pub(crate) fn call_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd(if self.function { "FCALL" } else { "EVALSHA" });
        cmd.arg(&*self.sha);
        cmd
    }

    /// What the call names it by: the SHA-1 of a script, the name of a
    /// function.
    pub(crate) fn sha(&self) -> &str {
        &self.sha
    }
}

/// Composes the check script for a list of algorithms (one per policy, in
/// order).
pub(crate) fn compose(plan: &[Algorithm]) -> Result<LuaScript, StoreError> {
    compose_with(plan, "", RUN_CHECK, RUN_CHECK_NO_NEW_KEYS)
}

/// The last line of a batch of checks (batch_script.lua) and of its twin.
const RUN_BATCH: &str = "return batch_script(PLAN, KEYS, ARGV, false)\n";
const RUN_BATCH_NO_NEW_KEYS: &str = "return batch_script(PLAN, KEYS, ARGV, true)\n";

/// Composes the script of coalesced checks of one subject on the
/// `EVALSHA` path (batch_script.lua): the check script's parts, deciding
/// the batch's checks in turn.
pub(crate) fn compose_batch(plan: &[Algorithm]) -> Result<LuaScript, StoreError> {
    compose_with(plan, BATCH_SCRIPT, RUN_BATCH, RUN_BATCH_NO_NEW_KEYS)
}

/// The last line of a batch across subjects (mixed_script.lua) and of its
/// twin.
const RUN_MIXED: &str = "return mixed_script(KEYS, ARGV, false)\n";
const RUN_MIXED_NO_NEW_KEYS: &str = "return mixed_script(KEYS, ARGV, true)\n";

/// Composes the script of a batch across subjects on the `EVALSHA` path
/// (mixed_script.lua): every algorithm, check.lua and the plan decoding
/// (plan.lua), deciding each check as its own check script would; one per
/// store, whatever the policy sets, with its allow-oom twin.
pub(crate) fn compose_mixed() -> LuaScript {
    let mut source = String::with_capacity(48 * 1024);
    source.push_str(PRELUDE);
    for (_, text) in SOURCES {
        source.push_str(text);
    }
    source.push_str(CHECK);
    source.push_str(PLAN);
    source.push_str(BATCH_EACH);
    source.push_str(MIXED_SCRIPT);
    let twin = format!("{ALLOW_OOM_SHEBANG}{source}{RUN_MIXED_NO_NEW_KEYS}");
    source.push_str(RUN_MIXED);
    let mut script = LuaScript::new(source);
    script.allow_oom = Some(Arc::new(LuaScript::new(twin)));
    script
}

/// The last line of a check with options (options.lua) and of its twin.
const RUN_OPTIONS: &str = "return check_ext(PLAN, KEYS, ARGV, 0, false)\n";
const RUN_OPTIONS_NO_NEW_KEYS: &str = "return check_ext(PLAN, KEYS, ARGV, 0, true)\n";

/// Composes the script of a check with options (options.lua).
pub(crate) fn compose_options(plan: &[Algorithm]) -> Result<LuaScript, StoreError> {
    compose_with(plan, OPTIONS, RUN_OPTIONS, RUN_OPTIONS_NO_NEW_KEYS)
}

/// The check script with `tail` after check.lua and `run` / `run_oom` as
/// the last lines of the script and its allow-oom twin.
fn compose_with(
    plan: &[Algorithm],
    tail: &str,
    run: &str,
    run_oom: &str,
) -> Result<LuaScript, StoreError> {
    let mut needed: SmallVec<[Part; 8]> = SmallVec::new();
    let mut names: SmallVec<[&str; 4]> = SmallVec::new();
    for algorithm in plan {
        let (name, algorithm_parts) = parts(*algorithm)?;
        names.push(name);
        for part in algorithm_parts {
            if !needed.contains(part) {
                needed.push(*part);
            }
        }
    }
    let mut source = String::with_capacity(8 * 1024);
    source.push_str(PRELUDE);
    for (part, text) in SOURCES {
        if needed.contains(&part) {
            source.push_str(text);
        }
    }
    source.push_str("local PLAN = {");
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            source.push_str(", ");
        }
        source.push_str("ALG.");
        source.push_str(name);
    }
    source.push_str("}\n");
    source.push_str(CHECK);
    source.push_str(tail);
    let twin = format!("{ALLOW_OOM_SHEBANG}{source}{run_oom}");
    source.push_str(run);
    let mut script = LuaScript::new(source);
    script.allow_oom = Some(Arc::new(LuaScript::new(twin)));
    Ok(script)
}

/// The last line of a post-charge script.
const RUN_CHARGE: &str = "return charge(PLAN, KEYS, ARGV, 0)\n";
/// The last line of its allow-oom twin.
const RUN_CHARGE_NO_NEW_KEYS: &str = "return charge(PLAN, KEYS, ARGV, 0, true)\n";

/// Composes the post-charge script (charge.lua) for a list of algorithms,
/// each GCRA or the token bucket.
pub(crate) fn compose_charge(plan: &[Algorithm]) -> Result<LuaScript, StoreError> {
    let mut source = String::with_capacity(12 * 1024);
    source.push_str(PRELUDE);
    // charge.lua answers with the algorithms' peeks: both are included.
    for (part, text) in SOURCES {
        if matches!(part, Part::Gcra | Part::TokenBucket) {
            source.push_str(text);
        }
    }
    source.push_str(CHARGE);
    source.push_str("local PLAN = {");
    for (i, algorithm) in plan.iter().enumerate() {
        if i > 0 {
            source.push_str(", ");
        }
        source.push_str(match algorithm {
            Algorithm::Gcra => "CHG.gcra",
            Algorithm::TokenBucket => "CHG.token_bucket",
            other => {
                return Err(StoreError::Unsupported {
                    operation: "charge",
                    detail: format!("the {other} algorithm cannot be charged after the fact; use Algorithm::Gcra or Algorithm::TokenBucket"),
                })
            }
        });
    }
    source.push_str("}\n");
    let twin = format!("{ALLOW_OOM_SHEBANG}{source}{RUN_CHARGE_NO_NEW_KEYS}");
    source.push_str(RUN_CHARGE);
    let mut script = LuaScript::new(source);
    script.allow_oom = Some(Arc::new(LuaScript::new(twin)));
    Ok(script)
}

/// The last line of the grant script (grant.lua) and of its twin: the
/// policy argument parsed per call (a script keeps nothing between calls).
const RUN_GRANT: &str = "return gcra_take(KEYS, ARGV, false, gcra_policy)\n";
const RUN_GRANT_NO_NEW_KEYS: &str = "return gcra_take(KEYS, ARGV, true, gcra_policy)\n";

/// The grant of a rate share to a local budget on the `EVALSHA` path
/// (grant.lua after the prelude; the library's `gcra_take` runs the same
/// code): one script for every policy, with its allow-oom twin.
pub(crate) fn compose_grant() -> LuaScript {
    let mut source = String::with_capacity(16 * 1024);
    source.push_str(PRELUDE);
    source.push_str(GRANT);
    let twin = format!("{ALLOW_OOM_SHEBANG}{source}{RUN_GRANT_NO_NEW_KEYS}");
    source.push_str(RUN_GRANT);
    let mut script = LuaScript::new(source);
    script.allow_oom = Some(Arc::new(LuaScript::new(twin)));
    script
}

/// The rate limiter's script (GCRA with its configuration in a hash).
pub(crate) fn limiter() -> LuaScript {
    let mut source = String::with_capacity(8 * 1024);
    source.push_str(PRELUDE);
    source.push_str(GCRA);
    source.push_str(LIMITER);
    LuaScript::new(source)
}

/// The lease script of concurrency policies (EVALSHA path).
/// Its allow-oom twin (run after `OOM`) refuses to create a key.
pub(crate) fn lease() -> LuaScript {
    let mut source = String::with_capacity(8 * 1024);
    source.push_str(PRELUDE);
    source.push_str(LEASE);
    let twin = format!("{ALLOW_OOM_SHEBANG}{source}return lease(KEYS, ARGV, true)\n");
    source.push_str("return lease(KEYS, ARGV, false)\n");
    let mut script = LuaScript::new(source);
    script.allow_oom = Some(Arc::new(LuaScript::new(twin)));
    script
}

/// The token reservations' script (reserve.lua, the `EVALSHA` path; the
/// library holds it as a function): every algorithm (request policies may
/// use any), check.lua and charge.lua beneath it. Its allow-oom twin (run
/// after `OOM`) settles and renews, and answers `NOROOM` to a reserve.
pub(crate) fn reserve() -> LuaScript {
    let mut source = String::with_capacity(48 * 1024);
    source.push_str(PRELUDE);
    for (_, text) in SOURCES {
        source.push_str(text);
    }
    source.push_str(CHECK);
    source.push_str(CHARGE);
    source.push_str(RESERVE);
    let twin = format!("{ALLOW_OOM_SHEBANG}{source}return reservation(KEYS, ARGV, true)\n");
    source.push_str("return reservation(KEYS, ARGV, false)\n");
    let mut script = LuaScript::new(source);
    script.allow_oom = Some(Arc::new(LuaScript::new(twin)));
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_includes_each_source_once_and_the_plan_in_order() {
        let script = compose(&[
            Algorithm::LeakyBucket(LeakyMode::Queue),
            Algorithm::Gcra,
            Algorithm::FixedWindow,
        ])
        .unwrap();
        assert_eq!(script.source().matches("ALG.gcra = function").count(), 1);
        assert!(script
            .source()
            .contains("local PLAN = {ALG.leaky_queue, ALG.gcra, ALG.fixed_window}"));
        assert!(script.source().ends_with(RUN_CHECK));
        assert!(!script.is_function());
        assert!(!script.source().contains("ALG.sliding_log ="));
        assert_eq!(script.sha().len(), 40);
    }

    #[test]
    fn the_allow_oom_twin_declares_the_flag_and_refuses_new_keys() {
        let script = compose(&[Algorithm::Gcra, Algorithm::SlidingLog]).unwrap();
        assert_eq!(script.source().matches(RUN_CHECK).count(), 1);
        let twin = script.allow_oom().expect("a check script has a twin");
        assert!(twin.source().starts_with(ALLOW_OOM_SHEBANG));
        assert!(twin.source().ends_with(RUN_CHECK_NO_NEW_KEYS));
        assert!(!twin.source().contains(RUN_CHECK));
        assert_ne!(twin.sha(), script.sha());
        assert!(twin.allow_oom().is_none());
        assert!(limiter().allow_oom().is_none());
    }

    #[test]
    fn different_orders_are_different_scripts() {
        let a = compose(&[Algorithm::Gcra, Algorithm::FixedWindow]).unwrap();
        let b = compose(&[Algorithm::FixedWindow, Algorithm::Gcra]).unwrap();
        assert_ne!(a.sha(), b.sha());
        let cache = ScriptCache::new();
        let again = cache
            .get([Algorithm::Gcra, Algorithm::FixedWindow].into_iter())
            .unwrap();
        assert_eq!(again.sha(), a.sha());
    }

    #[test]
    fn the_library_names_its_version_and_every_algorithm_has_a_letter() {
        let library = Library::new();
        assert!(library.name().starts_with("portcullis_"));
        assert_eq!(library.name().len(), "portcullis_".len() + 12);
        let check = library.function(false);
        assert!(check.is_function());
        assert_eq!(check.sha(), format!("{}_check", library.name()));
        assert_eq!(
            library.function(true).sha(),
            format!("{}_peek", library.name())
        );
        let oom = check.allow_oom().expect("the check has an OOM twin");
        assert_eq!(oom.sha(), format!("{}_oom", library.name()));
        assert!(check
            .source()
            .starts_with(&format!("#!lua name={}\n", library.name())));
        let letters = Library::letters(Algorithm::ALL.into_iter()).unwrap();
        assert_eq!(letters.len(), Algorithm::ALL.len());
        for letter in &letters {
            assert!(PLAN.contains(&format!("{} = ALG.", *letter as char)));
        }
        let load = check.load_cmd();
        let args: Vec<_> = load.args_iter().collect();
        assert_eq!(args.len(), 4);
    }

    #[test]
    fn the_script_of_batches_across_subjects_holds_every_algorithm_and_the_plans() {
        let script = compose_mixed();
        for (_, text) in SOURCES {
            assert_eq!(script.source().matches(text).count(), 1);
        }
        assert_eq!(script.source().matches(PLAN).count(), 1);
        assert!(script.source().ends_with(RUN_MIXED));
        assert!(!script.is_function());
        let twin = script.allow_oom().expect("the batch script has a twin");
        assert!(twin.source().starts_with(ALLOW_OOM_SHEBANG));
        assert!(twin.source().ends_with(RUN_MIXED_NO_NEW_KEYS));
        assert_ne!(twin.sha(), script.sha());
        let cache = ScriptCache::new();
        assert_eq!(cache.get_mixed().sha(), script.sha());
    }

    #[test]
    fn the_grant_script_runs_the_library_s_grant_code_with_its_twin() {
        let script = compose_grant();
        assert!(script.source().contains(GRANT));
        assert!(Library::new().grant_function().source().contains(GRANT));
        assert!(script.source().ends_with(RUN_GRANT));
        assert!(!script.is_function());
        let twin = script.allow_oom().expect("the grant script has a twin");
        assert!(twin.source().starts_with(ALLOW_OOM_SHEBANG));
        assert!(twin.source().ends_with(RUN_GRANT_NO_NEW_KEYS));
        assert_ne!(twin.sha(), script.sha());
        assert_eq!(ScriptCache::new().get_grant().sha(), script.sha());
    }

    #[test]
    fn only_gcra_and_the_token_bucket_have_a_charge_script() {
        let script = compose_charge(&[Algorithm::Gcra, Algorithm::TokenBucket]).unwrap();
        assert_eq!(script.sha().len(), 40);
        let err = compose_charge(&[Algorithm::FixedWindow]).unwrap_err();
        assert!(matches!(err, StoreError::Unsupported { .. }), "{err}");
    }
}
