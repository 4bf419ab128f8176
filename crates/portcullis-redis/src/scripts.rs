//! The Lua sources, the scripts composed from them (EVALSHA) and the
//! Redis Functions library holding them all (FCALL).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use redis::Cmd;

use portcullis_core::{Algorithm, LeakyMode, Policy, StoreError};
use smallvec::SmallVec;

use crate::functions::PathState;

const PRELUDE: &str = include_str!("lua/prelude.lua");
const GCRA: &str = include_str!("lua/gcra.lua");
const LEAKY_QUEUE: &str = include_str!("lua/leaky_queue.lua");
const TOKEN_BUCKET: &str = include_str!("lua/token_bucket.lua");
const LEAKY_METER: &str = include_str!("lua/leaky_meter.lua");
const FIXED_WINDOW: &str = include_str!("lua/fixed_window.lua");
const SLIDING_WINDOW: &str = include_str!("lua/sliding_window.lua");
const SLIDING_LOG: &str = include_str!("lua/sliding_log.lua");
const CHECK: &str = include_str!("lua/check.lua");
const LIMITER: &str = include_str!("lua/limiter.lua");
const LIBRARY: &str = include_str!("lua/library.lua");
const CHARGE: &str = include_str!("lua/charge.lua");
const CHARGE_LIBRARY: &str = include_str!("lua/charge_library.lua");
const LEASE: &str = include_str!("lua/lease.lua");
const BATCH: &str = include_str!("lua/batch.lua");
const GCRA_MULTI: &str = include_str!("lua/gcra_multi.lua");
const BUCKET_FAST: &str = include_str!("lua/bucket_fast.lua");
const FIXED_WINDOW_FAST: &str = include_str!("lua/fixed_window_fast.lua");
const SLIDING_WINDOW_FAST: &str = include_str!("lua/sliding_window_fast.lua");
const LEAKY_QUEUE_FAST: &str = include_str!("lua/leaky_queue_fast.lua");
const SLIDING_LOG_FAST: &str = include_str!("lua/sliding_log_fast.lua");
const OPTIONS: &str = include_str!("lua/options.lua");
const OPTIONS_LIBRARY: &str = include_str!("lua/options_library.lua");

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

/// The letter naming an algorithm in a Functions call's plan (`CODES` in
/// library.lua).
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

/// The last line of a check with options (options.lua) and of its twin.
const RUN_EXT: &str = "return check_ext(PLAN, KEYS, ARGV, 0, false)\n";
const RUN_EXT_NO_NEW_KEYS: &str = "return check_ext(PLAN, KEYS, ARGV, 0, true)\n";

/// Composes the script of a check with options (options.lua).
pub(crate) fn compose_ext(plan: &[Algorithm]) -> Result<LuaScript, StoreError> {
    compose_with(plan, OPTIONS, RUN_EXT, RUN_EXT_NO_NEW_KEYS)
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

/// The portcullis Redis Functions library: every algorithm and the check,
/// loaded once per node (`FUNCTION LOAD REPLACE`) and named after a hash
/// of its source (`portcullis_<12 hex digits>`), so versions never clash.
#[derive(Debug, Clone)]
pub(crate) struct Library {
    name: Arc<str>,
    /// A check (`FCALL`); its allow-oom twin is the OOM function.
    check: LuaScript,
    /// A peek (`FCALL_RO`, declared `no-writes`).
    peek: LuaScript,
    /// The one-policy GCRA check of a whole-microsecond policy
    /// ([`Library::fast_gcra`]); its allow-oom twin is `gcra_oom`.
    gcra: LuaScript,
    /// A post-charge (charge.lua, `FCALL`).
    charge: LuaScript,
    /// Acquire, renew and release of leases (lease.lua).
    lease: LuaScript,
    /// Coalesced checks (batch.lua): the general form, and the one-policy
    /// GCRA form of the fast function; each with its allow-oom twin.
    batch: LuaScript,
    gcra_batch: LuaScript,
    /// Leases of permits for a local budget (batch.lua, budget.rs).
    gcra_take: LuaScript,
    /// A check of several GCRA policies of the fast path (gcra_multi.lua).
    gcra_multi: LuaScript,
    /// A one-policy token bucket check (bucket_fast.lua).
    token_bucket: LuaScript,
    /// A one-policy leaky bucket meter check (bucket_fast.lua).
    leaky_meter: LuaScript,
    /// A one-policy fixed window check (fixed_window_fast.lua).
    fixed_window: LuaScript,
    /// A one-policy sliding window counter check (sliding_window_fast.lua).
    sliding_window: LuaScript,
    /// A one-policy leaky bucket queue check (leaky_queue_fast.lua).
    leaky_queue: LuaScript,
    /// A one-policy sliding log check (sliding_log_fast.lua).
    sliding_log: LuaScript,
    /// A check with options (options.lua, `FCALL`); twin `ext_oom`.
    ext: LuaScript,
}

impl Library {
    fn new() -> Self {
        let mut body = String::with_capacity(32 * 1024);
        body.push_str(PRELUDE);
        for (_, text) in SOURCES {
            body.push_str(text);
        }
        body.push_str(CHECK);
        body.push_str(OPTIONS);
        body.push_str(CHARGE);
        body.push_str(LEASE);
        body.push_str(LIBRARY);
        body.push_str(CHARGE_LIBRARY);
        body.push_str(BATCH);
        body.push_str(GCRA_MULTI);
        body.push_str(BUCKET_FAST);
        body.push_str(FIXED_WINDOW_FAST);
        body.push_str(SLIDING_WINDOW_FAST);
        body.push_str(LEAKY_QUEUE_FAST);
        body.push_str(SLIDING_LOG_FAST);
        body.push_str(OPTIONS_LIBRARY);
        let hash = redis::Script::new(&body).get_hash().to_owned();
        let name = format!("portcullis_{}", &hash[..12]);
        let source: Arc<str> = format!(
            "#!lua name={name}\nlocal FN_CHECK, FN_PEEK, FN_OOM, FN_GCRA, FN_GCRA_OOM, FN_LEASE, FN_LEASE_OOM, FN_CHARGE, FN_CHARGE_OOM, FN_BATCH, FN_BATCH_OOM, FN_GCRA_BATCH, FN_GCRA_BATCH_OOM, FN_GCRA_TAKE, FN_GCRA_TAKE_OOM, FN_GCRA_MULTI, FN_GCRA_MULTI_OOM, FN_TB_FAST, FN_TB_FAST_OOM, FN_METER_FAST, FN_METER_FAST_OOM, FN_FW_FAST, FN_FW_FAST_OOM, FN_SW_FAST, FN_SW_FAST_OOM, FN_QUEUE_FAST, FN_QUEUE_FAST_OOM, FN_LOG_FAST, FN_LOG_FAST_OOM, FN_EXT, FN_EXT_OOM = '{name}_check', '{name}_peek', '{name}_oom', '{name}_gcra', '{name}_gcra_oom', '{name}_lease', '{name}_lease_oom', '{name}_charge', '{name}_charge_oom', '{name}_batch', '{name}_batch_oom', '{name}_gcra_batch', '{name}_gcra_batch_oom', '{name}_gcra_take', '{name}_gcra_take_oom', '{name}_gcra_multi', '{name}_gcra_multi_oom', '{name}_token_bucket', '{name}_token_bucket_oom', '{name}_leaky_meter', '{name}_leaky_meter_oom', '{name}_fixed_window', '{name}_fixed_window_oom', '{name}_sliding_window', '{name}_sliding_window_oom', '{name}_leaky_queue', '{name}_leaky_queue_oom', '{name}_sliding_log', '{name}_sliding_log_oom', '{name}_ext', '{name}_ext_oom'\n{body}"
        )
        .into();
        let function = |suffix: &str| LuaScript {
            source: Arc::clone(&source),
            sha: format!("{name}_{suffix}").into(),
            function: true,
            allow_oom: None,
        };
        let mut check = function("check");
        check.allow_oom = Some(Arc::new(function("oom")));
        let mut gcra = function("gcra");
        gcra.allow_oom = Some(Arc::new(function("gcra_oom")));
        let mut lease = function("lease");
        lease.allow_oom = Some(Arc::new(function("lease_oom")));
        let mut charge = function("charge");
        charge.allow_oom = Some(Arc::new(function("charge_oom")));
        let mut ext = function("ext");
        ext.allow_oom = Some(Arc::new(function("ext_oom")));
        let mut batch = function("batch");
        batch.allow_oom = Some(Arc::new(function("batch_oom")));
        let mut gcra_batch = function("gcra_batch");
        gcra_batch.allow_oom = Some(Arc::new(function("gcra_batch_oom")));
        let mut fixed_window = function("fixed_window");
        fixed_window.allow_oom = Some(Arc::new(function("fixed_window_oom")));
        let mut sliding_window = function("sliding_window");
        sliding_window.allow_oom = Some(Arc::new(function("sliding_window_oom")));
        let mut leaky_queue = function("leaky_queue");
        leaky_queue.allow_oom = Some(Arc::new(function("leaky_queue_oom")));
        let mut sliding_log = function("sliding_log");
        sliding_log.allow_oom = Some(Arc::new(function("sliding_log_oom")));
        let mut leaky_meter = function("leaky_meter");
        leaky_meter.allow_oom = Some(Arc::new(function("leaky_meter_oom")));
        let mut token_bucket = function("token_bucket");
        token_bucket.allow_oom = Some(Arc::new(function("token_bucket_oom")));
        let mut gcra_multi = function("gcra_multi");
        gcra_multi.allow_oom = Some(Arc::new(function("gcra_multi_oom")));
        let mut gcra_take = function("gcra_take");
        gcra_take.allow_oom = Some(Arc::new(function("gcra_take_oom")));
        Self {
            ext,
            batch,
            gcra_batch,
            gcra_take,
            gcra_multi,
            token_bucket,
            leaky_meter,
            fixed_window,
            sliding_window,
            leaky_queue,
            sliding_log,
            check,
            peek: function("peek"),
            gcra,
            charge,
            lease,
            name: name.into(),
        }
    }

    /// The library's name, `portcullis_<hash>`.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The function for a check (`peek`: cost 0, `FCALL_RO`).
    pub(crate) fn function(&self, peek: bool) -> &LuaScript {
        if peek {
            &self.peek
        } else {
            &self.check
        }
    }

    /// The post-charge function.
    pub(crate) fn charge_function(&self) -> &LuaScript {
        &self.charge
    }

    /// The coalesced check functions (batch.lua): the general one and the
    /// one-policy GCRA one.
    pub(crate) fn batch_functions(&self) -> (&LuaScript, &LuaScript) {
        (&self.batch, &self.gcra_batch)
    }

    /// The function that leases permits for a local budget.
    pub(crate) fn take_function(&self) -> &LuaScript {
        &self.gcra_take
    }

    /// The check-with-options function (`FCALL`).
    pub(crate) fn ext_function(&self) -> &LuaScript {
        &self.ext
    }

    /// The lease function (`FCALL`).
    pub(crate) fn lease(&self) -> &LuaScript {
        &self.lease
    }

    /// The fast GCRA function and its argument
    /// (`<limit>:<period_us>:<capacity>:<cost>`) when a check can take it:
    /// one GCRA policy whose emission interval is a whole number of
    /// microseconds and whose `capacity × interval` is exact in Lua, with a
    /// cost of at least 1 (ALGORITHMS.md, "The Redis fast path").
    pub(crate) fn fast_gcra(&self, policies: &[Policy], cost: u64) -> Option<&LuaScript> {
        let [policy] = policies else {
            return None;
        };
        fast_gcra_policy(policy, cost).then_some(&self.gcra)
    }

    /// The fast GCRA function for a check of one policy taken alone (not
    /// coalesced, not leased): every policy [`Library::fast_gcra`] takes,
    /// and also an exact GCRA policy whose emission interval is not a
    /// whole number of microseconds (`per_second(3)`), for which the
    /// function answers the lead in units of `1 / limit` µs (library.lua,
    /// `gcra_fraction`). Coalesced batches and the local budget read whole
    /// microseconds, so they ask [`Library::fast_gcra`].
    pub(crate) fn fast_gcra_alone(&self, policies: &[Policy], cost: u64) -> Option<&LuaScript> {
        let [policy] = policies else {
            return None;
        };
        let fraction = policy.algorithm() == Algorithm::Gcra
            && cost >= 1
            && cost <= policy.capacity()
            && policy.limit() >= 1
            && policy.period_micros() % policy.limit() != 0
            && exact_in_lua(policy);
        (fraction || fast_gcra_policy(policy, cost)).then_some(&self.gcra)
    }

    /// The fast function of a one-policy check other than GCRA, when it
    /// can take it (a cost of at least 1): the token bucket and the leaky
    /// bucket meter (bucket_fast.lua), the fixed window whose `limit ×
    /// period` is at most 2^52 (fixed_window_fast.lua), the sliding window
    /// whose `(limit + 1)² × period` is at most 2^52
    /// (sliding_window_fast.lua), the leaky bucket queue of the GCRA fast
    /// path's policies (leaky_queue_fast.lua), and the sliding log
    /// (sliding_log_fast.lua: one integer when it admits, the general
    /// check's five when it denies).
    pub(crate) fn fast_other(&self, policies: &[Policy], cost: u64) -> Option<&LuaScript> {
        let [policy] = policies else {
            return None;
        };
        if cost < 1 || cost > policy.capacity() {
            return None;
        }
        match policy.algorithm() {
            Algorithm::TokenBucket => Some(&self.token_bucket),
            Algorithm::LeakyBucket(LeakyMode::Meter) => Some(&self.leaky_meter),
            Algorithm::LeakyBucket(LeakyMode::Queue) => {
                whole_interval(policy).then_some(&self.leaky_queue)
            }
            Algorithm::FixedWindow => policy
                .limit()
                .checked_mul(policy.period_micros())
                .filter(|product| *product <= portcullis_core::MAX_MAGNITUDE)
                .map(|_| &self.fixed_window),
            Algorithm::SlidingLog => (cost <= policy.limit()).then_some(&self.sliding_log),
            Algorithm::SlidingWindow => {
                let slots = policy.limit().checked_add(1);
                let product = slots
                    .and_then(|slots| slots.checked_mul(slots))
                    .and_then(|square| square.checked_mul(policy.period_micros()));
                (cost <= policy.limit()
                    && product.is_some_and(|product| product <= portcullis_core::MAX_MAGNITUDE))
                .then_some(&self.sliding_window)
            }
            _ => None,
        }
    }

    /// The function for a check of two or more GCRA policies that each
    /// take the fast path (gcra_multi.lua), when this check is one.
    pub(crate) fn fast_gcra_multi(&self, policies: &[Policy], cost: u64) -> Option<&LuaScript> {
        let fits =
            policies.len() >= 2 && policies.iter().all(|policy| fast_gcra_policy(policy, cost));
        fits.then_some(&self.gcra_multi)
    }

    /// The plan argument: one letter per policy.
    pub(crate) fn plan(
        plan: impl Iterator<Item = Algorithm>,
    ) -> Result<SmallVec<[u8; 8]>, StoreError> {
        plan.map(|algorithm| code(algorithm).map(|c| c as u8))
            .collect()
    }
}

type Plan = SmallVec<[Algorithm; 4]>;

/// Whether a check of `cost` against `policy` takes the GCRA fast path: a
/// GCRA policy whose emission interval is a whole number of microseconds
/// and whose `capacity × interval` is exact in Lua, and a cost of at least 1
/// (ALGORITHMS.md, "The Redis fast path").
fn fast_gcra_policy(policy: &Policy, cost: u64) -> bool {
    policy.algorithm() == Algorithm::Gcra
        && cost >= 1
        && cost <= policy.capacity()
        && whole_interval(policy)
}

/// Whether a bucket policy's emission interval is a whole number of
/// microseconds and its `capacity × interval` exact in Lua: the policies of
/// the GCRA and leaky bucket queue fast paths, whose time is then always
/// whole microseconds.
fn whole_interval(policy: &Policy) -> bool {
    let (limit, period) = (policy.limit(), policy.period_micros());
    limit >= 1
        && period % limit == 0
        // Spans in whole microseconds: the burst × interval must be exact
        // in Lua, not burst × period (a daily quota of 100 000, whose
        // burst × period passes 2^52, is a whole 864 ms interval). Such a
        // policy is not `is_exact`, but its core state has no fraction
        // either: every increment is a whole interval at its scale.
        && policy
            .capacity()
            .checked_mul(period / limit)
            .is_some_and(|product| product <= portcullis_core::MAX_MAGNITUDE)
}

/// Whether `policy` is exact and its `capacity × period` is exact in Lua:
/// its GCRA state is then `us + rem / limit` on both sides.
fn exact_in_lua(policy: &Policy) -> bool {
    policy.is_exact()
        && policy
            .capacity()
            .checked_mul(policy.period_micros())
            .is_some_and(|product| product <= portcullis_core::MAX_MAGNITUDE)
}

/// Composed scripts by algorithm combination. Single-policy scripts are
/// composed up front; combinations on first use.
#[derive(Debug)]
pub(crate) struct ScriptCache {
    single: HashMap<Algorithm, LuaScript>,
    combined: RwLock<HashMap<Plan, LuaScript>>,
    /// Post-charge scripts by algorithm combination, composed on first use.
    charges: RwLock<HashMap<Plan, LuaScript>>,
    /// Scripts of checks with options, composed on first use.
    exts: RwLock<HashMap<Plan, LuaScript>>,
    library: Library,
    path: PathState,
}

impl ScriptCache {
    pub(crate) fn new() -> Self {
        let single = Algorithm::ALL
            .into_iter()
            .filter_map(|algorithm| Some((algorithm, compose(&[algorithm]).ok()?)))
            .collect();
        Self {
            single,
            combined: RwLock::new(HashMap::new()),
            charges: RwLock::new(HashMap::new()),
            exts: RwLock::new(HashMap::new()),
            library: Library::new(),
            path: PathState::default(),
        }
    }

    /// How checks are called now.
    pub(crate) fn path(&self) -> &PathState {
        &self.path
    }

    /// The Redis Functions library.
    pub(crate) fn library(&self) -> &Library {
        &self.library
    }

    /// The script for these algorithms, in this order.
    pub(crate) fn get(
        &self,
        plan: impl ExactSizeIterator<Item = Algorithm> + Clone,
    ) -> Result<LuaScript, StoreError> {
        if plan.len() == 1 {
            if let Some(script) = plan.clone().next().and_then(|a| self.single.get(&a)) {
                return Ok(script.clone());
            }
        }
        let plan: Plan = plan.collect();
        {
            let combined = self.combined.read().unwrap_or_else(|e| e.into_inner());
            if let Some(script) = combined.get(&plan) {
                return Ok(script.clone());
            }
        }
        let script = compose(&plan)?;
        let mut combined = self.combined.write().unwrap_or_else(|e| e.into_inner());
        Ok(combined.entry(plan).or_insert(script).clone())
    }
}

impl ScriptCache {
    /// The script of a check with options for these algorithms, in order.
    pub(crate) fn get_ext(
        &self,
        plan: impl Iterator<Item = Algorithm>,
    ) -> Result<LuaScript, StoreError> {
        let plan: Plan = plan.collect();
        {
            let exts = self.exts.read().unwrap_or_else(|e| e.into_inner());
            if let Some(script) = exts.get(&plan) {
                return Ok(script.clone());
            }
        }
        let script = compose_ext(&plan)?;
        let mut exts = self.exts.write().unwrap_or_else(|e| e.into_inner());
        Ok(exts.entry(plan).or_insert(script).clone())
    }

    /// The post-charge script for these algorithms, in this order.
    pub(crate) fn get_charge(
        &self,
        plan: impl Iterator<Item = Algorithm>,
    ) -> Result<LuaScript, StoreError> {
        let plan: Plan = plan.collect();
        {
            let charges = self.charges.read().unwrap_or_else(|e| e.into_inner());
            if let Some(script) = charges.get(&plan) {
                return Ok(script.clone());
            }
        }
        let script = compose_charge(&plan)?;
        let mut charges = self.charges.write().unwrap_or_else(|e| e.into_inner());
        Ok(charges.entry(plan).or_insert(script).clone())
    }
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
        let letters = Library::plan(Algorithm::ALL.into_iter()).unwrap();
        assert_eq!(letters.len(), Algorithm::ALL.len());
        for letter in &letters {
            assert!(LIBRARY.contains(&format!("{} = ALG.", *letter as char)));
        }
        let load = check.load_cmd();
        let args: Vec<_> = load.args_iter().collect();
        assert_eq!(args.len(), 4);
    }
}
