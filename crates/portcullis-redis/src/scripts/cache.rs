//! [`ScriptCache`]: the scripts composed for the `EVALSHA` path, by
//! algorithm combination, beside the library and the store's call path.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use portcullis_core::{Algorithm, StoreError};

use super::{
    compose, compose_batch, compose_charge, compose_grant, compose_mixed, compose_options,
    Algorithms, Library, LuaScript,
};
use crate::functions::PathState;

/// Composed scripts by algorithm combination. Single-policy scripts are
/// composed up front; combinations on first use.
#[derive(Debug)]
pub(crate) struct ScriptCache {
    single: HashMap<Algorithm, LuaScript>,
    combined: RwLock<HashMap<Algorithms, LuaScript>>,
    /// Post-charge scripts by algorithm combination, composed on first use.
    charges: RwLock<HashMap<Algorithms, LuaScript>>,
    /// Scripts of checks with options, composed on first use.
    options: RwLock<HashMap<Algorithms, LuaScript>>,
    /// Scripts of coalesced checks, composed on first use.
    batches: RwLock<HashMap<Algorithms, LuaScript>>,
    /// The script of batches across subjects (one for every policy set),
    /// composed on first use.
    mixed: OnceLock<LuaScript>,
    /// The grant script of a local budget (one for every policy),
    /// composed on first use.
    grant: OnceLock<LuaScript>,
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
            options: RwLock::new(HashMap::new()),
            batches: RwLock::new(HashMap::new()),
            mixed: OnceLock::new(),
            grant: OnceLock::new(),
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
        if plan.len() == 1
            && let Some(script) = plan.clone().next().and_then(|a| self.single.get(&a))
        {
            return Ok(script.clone());
        }
        let plan: Algorithms = plan.collect();
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
    pub(crate) fn get_options(
        &self,
        plan: impl Iterator<Item = Algorithm>,
    ) -> Result<LuaScript, StoreError> {
        composed(&self.options, plan, compose_options)
    }

    /// The script of coalesced checks for these algorithms, in order.
    pub(crate) fn get_batch(
        &self,
        plan: impl Iterator<Item = Algorithm>,
    ) -> Result<LuaScript, StoreError> {
        composed(&self.batches, plan, compose_batch)
    }

    /// The script of checks of different subjects in one call on the
    /// `EVALSHA` path (mixed_script.lua).
    pub(crate) fn get_mixed(&self) -> &LuaScript {
        self.mixed.get_or_init(compose_mixed)
    }

    /// The grant script of a local budget on the `EVALSHA` path
    /// (grant.lua).
    pub(crate) fn get_grant(&self) -> &LuaScript {
        self.grant.get_or_init(compose_grant)
    }

    /// The post-charge script for these algorithms, in this order.
    pub(crate) fn get_charge(
        &self,
        plan: impl Iterator<Item = Algorithm>,
    ) -> Result<LuaScript, StoreError> {
        composed(&self.charges, plan, compose_charge)
    }
}

/// The script `compose` makes for `plan`, from `scripts` (composed and
/// kept there on first use).
fn composed(
    scripts: &RwLock<HashMap<Algorithms, LuaScript>>,
    plan: impl Iterator<Item = Algorithm>,
    compose: fn(&[Algorithm]) -> Result<LuaScript, StoreError>,
) -> Result<LuaScript, StoreError> {
    let plan: Algorithms = plan.collect();
    {
        let known = scripts.read().unwrap_or_else(|e| e.into_inner());
        if let Some(script) = known.get(&plan) {
            return Ok(script.clone());
        }
    }
    let script = compose(&plan)?;
    let mut known = scripts.write().unwrap_or_else(|e| e.into_inner());
    Ok(known.entry(plan).or_insert(script).clone())
}
