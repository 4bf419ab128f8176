//! The portcullis Redis Functions library: one Lua library holding every
//! function a store calls (`FCALL`), loaded once per node, and which of
//! its functions serves a check ([`Library::serving`]).

use std::sync::Arc;

use portcullis_core::{Algorithm, LeakyMode, Policy, StoreError};
use smallvec::SmallVec;

use super::{
    code, LuaScript, BATCH, BATCH_EACH, BATCH_FAST, BATCH_SCRIPT, BUCKET_FAST, CHARGE,
    CHARGE_LIBRARY, CHECK, FIXED_WINDOW_FAST, GCRA_MULTI, GRANT, LEAKY_QUEUE_FAST, LEASE, LIBRARY,
    MIXED, OPTIONS, OPTIONS_LIBRARY, PLAN, PRELUDE, RESERVE, RESERVE_LIBRARY, SLIDING_LOG_FAST,
    SLIDING_WINDOW_FAST, SOURCES,
};

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
    /// The one-policy fast GCRA check
    /// ([`Serving::WholeGcra`], [`Serving::FractionGcra`]); its allow-oom twin is `gcra_oom`.
    gcra: LuaScript,
    /// A post-charge (charge.lua, `FCALL`).
    charge: LuaScript,
    /// Acquire, renew and release of leases (lease.lua).
    lease: LuaScript,
    /// Coalesced checks (batch.lua): the general form, and the one-policy
    /// GCRA form of the fast function; each with its allow-oom twin.
    batch: LuaScript,
    gcra_batch: LuaScript,
    /// Coalesced checks of one policy of the other fast functions
    /// (batch_fast.lua), by [`Fast`]'s order: token bucket, leaky meter,
    /// leaky queue, fixed window, sliding window, sliding log.
    fast_batches: [LuaScript; 6],
    /// Grants of permits to a local budget (grant.lua, budget/).
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
    /// Checks of different subjects in one call (mixed.lua); twin `mixed_oom`.
    mixed: LuaScript,
    /// A check with options (options.lua, `FCALL`); twin `ext_oom` (the Lua names keep "ext").
    options: LuaScript,
    /// Token reservations: reserve, settle, renew (reserve.lua); twin
    /// `reserve_oom`.
    reserve: LuaScript,
}

impl Library {
    pub(super) fn new() -> Self {
        let mut body = String::with_capacity(32 * 1024);
        body.push_str(PRELUDE);
        for (_, text) in SOURCES {
            body.push_str(text);
        }
        body.push_str(CHECK);
        body.push_str(OPTIONS);
        body.push_str(CHARGE);
        body.push_str(LEASE);
        body.push_str(PLAN);
        body.push_str(BATCH_EACH);
        body.push_str(GRANT);
        body.push_str(LIBRARY);
        body.push_str(CHARGE_LIBRARY);
        body.push_str(BATCH_SCRIPT);
        body.push_str(BATCH);
        body.push_str(GCRA_MULTI);
        body.push_str(BUCKET_FAST);
        body.push_str(FIXED_WINDOW_FAST);
        body.push_str(SLIDING_WINDOW_FAST);
        body.push_str(LEAKY_QUEUE_FAST);
        body.push_str(SLIDING_LOG_FAST);
        body.push_str(BATCH_FAST);
        body.push_str(OPTIONS_LIBRARY);
        body.push_str(MIXED);
        body.push_str(RESERVE);
        body.push_str(RESERVE_LIBRARY);
        let hash = redis::Script::new(&body).get_hash().to_owned();
        let name = format!("portcullis_{}", &hash[..12]);
        let source: Arc<str> = format!(
            "#!lua name={name}\nlocal FN_CHECK, FN_PEEK, FN_OOM, FN_GCRA, FN_GCRA_OOM, FN_LEASE, FN_LEASE_OOM, FN_CHARGE, FN_CHARGE_OOM, FN_BATCH, FN_BATCH_OOM, FN_GCRA_BATCH, FN_GCRA_BATCH_OOM, FN_GCRA_TAKE, FN_GCRA_TAKE_OOM, FN_GCRA_MULTI, FN_GCRA_MULTI_OOM, FN_TB_FAST, FN_TB_FAST_OOM, FN_METER_FAST, FN_METER_FAST_OOM, FN_FW_FAST, FN_FW_FAST_OOM, FN_SW_FAST, FN_SW_FAST_OOM, FN_QUEUE_FAST, FN_QUEUE_FAST_OOM, FN_LOG_FAST, FN_LOG_FAST_OOM, FN_TB_BATCH, FN_TB_BATCH_OOM, FN_METER_BATCH, FN_METER_BATCH_OOM, FN_QUEUE_BATCH, FN_QUEUE_BATCH_OOM, FN_FW_BATCH, FN_FW_BATCH_OOM, FN_SW_BATCH, FN_SW_BATCH_OOM, FN_LOG_BATCH, FN_LOG_BATCH_OOM, FN_EXT, FN_EXT_OOM, FN_MIXED, FN_MIXED_OOM, FN_RESERVE, FN_RESERVE_OOM = '{name}_check', '{name}_peek', '{name}_oom', '{name}_gcra', '{name}_gcra_oom', '{name}_lease', '{name}_lease_oom', '{name}_charge', '{name}_charge_oom', '{name}_batch', '{name}_batch_oom', '{name}_gcra_batch', '{name}_gcra_batch_oom', '{name}_gcra_take', '{name}_gcra_take_oom', '{name}_gcra_multi', '{name}_gcra_multi_oom', '{name}_token_bucket', '{name}_token_bucket_oom', '{name}_leaky_meter', '{name}_leaky_meter_oom', '{name}_fixed_window', '{name}_fixed_window_oom', '{name}_sliding_window', '{name}_sliding_window_oom', '{name}_leaky_queue', '{name}_leaky_queue_oom', '{name}_sliding_log', '{name}_sliding_log_oom', '{name}_token_bucket_batch', '{name}_token_bucket_batch_oom', '{name}_leaky_meter_batch', '{name}_leaky_meter_batch_oom', '{name}_leaky_queue_batch', '{name}_leaky_queue_batch_oom', '{name}_fixed_window_batch', '{name}_fixed_window_batch_oom', '{name}_sliding_window_batch', '{name}_sliding_window_batch_oom', '{name}_sliding_log_batch', '{name}_sliding_log_batch_oom', '{name}_ext', '{name}_ext_oom', '{name}_mixed', '{name}_mixed_oom', '{name}_reserve', '{name}_reserve_oom'\n{body}"
        )
        .into();
        let function =
            |suffix: &str| LuaScript::function(&source, format!("{name}_{suffix}"), None);
        let with_twin = |suffix: &str| {
            LuaScript::function(
                &source,
                format!("{name}_{suffix}"),
                Some(function(&format!("{suffix}_oom"))),
            )
        };
        let check = LuaScript::function(&source, format!("{name}_check"), Some(function("oom")));
        let gcra = with_twin("gcra");
        let lease = with_twin("lease");
        let charge = with_twin("charge");
        let options = with_twin("ext");
        let batch = with_twin("batch");
        let gcra_batch = with_twin("gcra_batch");
        let fast_batches = [
            "token_bucket",
            "leaky_meter",
            "leaky_queue",
            "fixed_window",
            "sliding_window",
            "sliding_log",
        ]
        .map(|algorithm| with_twin(&format!("{algorithm}_batch")));
        let fixed_window = with_twin("fixed_window");
        let sliding_window = with_twin("sliding_window");
        let leaky_queue = with_twin("leaky_queue");
        let sliding_log = with_twin("sliding_log");
        let leaky_meter = with_twin("leaky_meter");
        let token_bucket = with_twin("token_bucket");
        let gcra_multi = with_twin("gcra_multi");
        let gcra_take = with_twin("gcra_take");
        let mixed = with_twin("mixed");
        let reserve = with_twin("reserve");
        Self {
            reserve,
            options,
            mixed,
            batch,
            gcra_batch,
            fast_batches,
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

    /// The general coalesced check function (batch.lua): every algorithm
    /// and several policies.
    pub(crate) fn batch_function(&self) -> &LuaScript {
        &self.batch
    }

    /// The coalesced check function of one policy served by a fast
    /// function (`gcra_batch` in batch.lua, the others in batch_fast.lua),
    /// or `None` (the general batch): the checks of a batch take it when
    /// each of their costs is served as `serving`.
    pub(crate) fn fast_batch_function(&self, serving: Serving) -> Option<&LuaScript> {
        match serving {
            Serving::WholeGcra => Some(&self.gcra_batch),
            Serving::Fast(fast) => Some(&self.fast_batches[fast as usize]),
            Serving::FractionGcra | Serving::GcraMulti | Serving::General => None,
        }
    }

    /// The function that runs checks of different subjects in one call
    /// (`mixed`).
    pub(crate) fn mixed_function(&self) -> &LuaScript {
        &self.mixed
    }

    /// The function that grants permits to a local budget (`gcra_take`).
    pub(crate) fn grant_function(&self) -> &LuaScript {
        &self.gcra_take
    }

    /// The check-with-options function (`FCALL`).
    pub(crate) fn options_function(&self) -> &LuaScript {
        &self.options
    }

    /// The lease function (`FCALL`).
    pub(crate) fn lease(&self) -> &LuaScript {
        &self.lease
    }

    /// The token reservations' function (`FCALL`).
    pub(crate) fn reserve(&self) -> &LuaScript {
        &self.reserve
    }

    /// Which function serves a check of `cost` against `policies`, decided
    /// once per check (ALGORITHMS.md, "The Redis fast path"); every path
    /// of the check (the local budget, coalescing, the call) reads it.
    pub(crate) fn serving(policies: &[Policy], cost: u64) -> Serving {
        match policies {
            [policy] => {
                if fast_gcra_policy(policy, cost) {
                    Serving::WholeGcra
                } else if fraction_gcra(policy, cost) {
                    Serving::FractionGcra
                } else if let Some(other) = fast_other(policy, cost) {
                    Serving::Fast(other)
                } else {
                    Serving::General
                }
            }
            _ if policies.len() >= 2
                && policies.iter().all(|policy| fast_gcra_policy(policy, cost)) =>
            {
                Serving::GcraMulti
            }
            _ => Serving::General,
        }
    }

    /// The function of a check served by a fast function (`None`: the
    /// general check).
    pub(crate) fn fast_function(&self, serving: Serving) -> Option<&LuaScript> {
        Some(match serving {
            Serving::WholeGcra | Serving::FractionGcra => &self.gcra,
            Serving::GcraMulti => &self.gcra_multi,
            Serving::Fast(Fast::TokenBucket) => &self.token_bucket,
            Serving::Fast(Fast::LeakyMeter) => &self.leaky_meter,
            Serving::Fast(Fast::LeakyQueue) => &self.leaky_queue,
            Serving::Fast(Fast::FixedWindow) => &self.fixed_window,
            Serving::Fast(Fast::SlidingWindow) => &self.sliding_window,
            Serving::Fast(Fast::SlidingLog) => &self.sliding_log,
            Serving::General => return None,
        })
    }

    /// The plan argument of a Functions call (or of a check in a batch
    /// across subjects on `EVALSHA`): one letter per policy (`CODES` in
    /// plan.lua).
    pub(crate) fn letters(
        algorithms: impl Iterator<Item = Algorithm>,
    ) -> Result<SmallVec<[u8; 8]>, StoreError> {
        algorithms
            .map(|algorithm| code(algorithm).map(|c| c as u8))
            .collect()
    }
}

/// Which function serves a check: [`Library::serving`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Serving {
    /// One GCRA policy whose emission interval is a whole number of
    /// microseconds and whose `capacity × interval` is exact in Lua, a cost
    /// of at least 1: the fast GCRA function, and the only check a local
    /// budget or the fast coalesced batch takes (they read whole µs).
    WholeGcra,
    /// One exact GCRA policy whose interval is not a whole number of µs
    /// (`per_second(3)`): the fast GCRA function, which answers the lead in
    /// units of `1 / limit` µs (library.lua, `gcra_fraction`); taken only
    /// by a check alone.
    FractionGcra,
    /// One policy of another algorithm, its fast function.
    Fast(Fast),
    /// Two or more GCRA policies that each are [`Serving::WholeGcra`]
    /// (gcra_multi.lua).
    GcraMulti,
    /// The general check (five integers per policy), and every peek.
    General,
}

/// The one-policy fast functions of the algorithms other than GCRA (in
/// the order of `Library::fast_batches`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Fast {
    TokenBucket = 0,
    LeakyMeter,
    LeakyQueue,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
}

/// An exact GCRA policy whose emission interval is not a whole number of
/// microseconds, and a cost the fast function takes.
fn fraction_gcra(policy: &Policy, cost: u64) -> bool {
    policy.algorithm() == Algorithm::Gcra
        && cost >= 1
        && cost <= policy.capacity()
        && policy.limit() >= 1
        && !policy.period_micros().is_multiple_of(policy.limit())
        && exact_in_lua(policy)
}

/// The fast function of a one-policy check other than GCRA, when it can
/// take it (a cost of at least 1): the token bucket and the leaky bucket
/// meter (bucket_fast.lua), the fixed window whose `limit × period` is at
/// most 2^52 (fixed_window_fast.lua), the sliding window whose
/// `(limit + 1)² × period` is at most 2^52 (sliding_window_fast.lua), the
/// leaky bucket queue of the GCRA fast path's policies
/// (leaky_queue_fast.lua), and the sliding log (sliding_log_fast.lua: one
/// integer when it admits, the general check's five when it denies).
fn fast_other(policy: &Policy, cost: u64) -> Option<Fast> {
    if cost < 1 || cost > policy.capacity() {
        return None;
    }
    match policy.algorithm() {
        Algorithm::TokenBucket => Some(Fast::TokenBucket),
        Algorithm::LeakyBucket(LeakyMode::Meter) => Some(Fast::LeakyMeter),
        Algorithm::LeakyBucket(LeakyMode::Queue) => {
            whole_interval(policy).then_some(Fast::LeakyQueue)
        }
        Algorithm::FixedWindow => policy
            .limit()
            .checked_mul(policy.period_micros())
            .filter(|product| *product <= portcullis_core::MAX_MAGNITUDE)
            .map(|_| Fast::FixedWindow),
        Algorithm::SlidingLog => (cost <= policy.limit()).then_some(Fast::SlidingLog),
        Algorithm::SlidingWindow => {
            let slots = policy.limit().checked_add(1);
            let product = slots
                .and_then(|slots| slots.checked_mul(slots))
                .and_then(|square| square.checked_mul(policy.period_micros()));
            (cost <= policy.limit()
                && product.is_some_and(|product| product <= portcullis_core::MAX_MAGNITUDE))
            .then_some(Fast::SlidingWindow)
        }
        _ => None,
    }
}

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
