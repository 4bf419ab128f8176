//! The Lua sources and the scripts composed from them.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use smallvec::SmallVec;
use tollgate_core::{Algorithm, LeakyMode, StoreError};

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
        other => {
            return Err(StoreError::Protocol {
                detail: format!(
                    "algorithm {other} has no Redis script in this version of tollgate-redis; upgrade tollgate-redis to match tollgate-core"
                ),
            })
        }
    })
}

/// A script: its source and SHA-1 (what EVALSHA names it by), and for a
/// check script its allow-oom twin.
#[derive(Debug, Clone)]
pub(crate) struct LuaScript {
    source: Arc<str>,
    sha: Arc<str>,
    allow_oom: Option<Arc<LuaScript>>,
}

/// The first line of the allow-oom twin of a check script: Redis 7 runs it
/// (and its writes) even at `maxmemory` with `noeviction`.
const ALLOW_OOM_SHEBANG: &str = "#!lua flags=allow-oom\n";
/// The line of `check.lua` that the allow-oom twin turns on.
const NO_NEW_KEYS_OFF: &str = "local NO_NEW_KEYS = false\n";
const NO_NEW_KEYS_ON: &str = "local NO_NEW_KEYS = true\n";

impl LuaScript {
    fn new(source: String) -> Self {
        let sha = redis::Script::new(&source).get_hash().into();
        Self {
            source: source.into(),
            sha,
            allow_oom: None,
        }
    }

    /// The check script's twin for a Redis that refused it for lack of
    /// memory (`OOM`): declared `allow-oom`, it updates keys that exist and,
    /// instead of creating one, answers the status `NOROOM` having written
    /// nothing. `None` for scripts other than checks.
    pub(crate) fn allow_oom(&self) -> Option<&LuaScript> {
        self.allow_oom.as_deref()
    }

    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    pub(crate) fn sha(&self) -> &str {
        &self.sha
    }
}

/// Composes the check script for a list of algorithms (one per policy, in
/// order).
pub(crate) fn compose(plan: &[Algorithm]) -> Result<LuaScript, StoreError> {
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
    let twin = format!(
        "{ALLOW_OOM_SHEBANG}{}",
        source.replacen(NO_NEW_KEYS_OFF, NO_NEW_KEYS_ON, 1)
    );
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

type Plan = SmallVec<[Algorithm; 4]>;

/// Composed scripts by algorithm combination. Single-policy scripts are
/// composed up front; combinations on first use.
#[derive(Debug)]
pub(crate) struct ScriptCache {
    single: HashMap<Algorithm, LuaScript>,
    combined: RwLock<HashMap<Plan, LuaScript>>,
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
        }
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
        assert!(!script.source().contains("ALG.sliding_log ="));
        assert_eq!(script.sha().len(), 40);
    }

    #[test]
    fn the_allow_oom_twin_declares_the_flag_and_refuses_new_keys() {
        let script = compose(&[Algorithm::Gcra, Algorithm::SlidingLog]).unwrap();
        assert_eq!(script.source().matches(NO_NEW_KEYS_OFF).count(), 1);
        let twin = script.allow_oom().expect("a check script has a twin");
        assert!(twin.source().starts_with(ALLOW_OOM_SHEBANG));
        assert!(twin.source().contains(NO_NEW_KEYS_ON));
        assert!(!twin.source().contains(NO_NEW_KEYS_OFF));
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
}
