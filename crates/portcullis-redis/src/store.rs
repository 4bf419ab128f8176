//! `RedisStore`: the `Store` trait on Redis and Redis Cluster.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use portcullis_core::subject::encode_subject;
use portcullis_core::{
    validate_check, Algorithm, Clock, Decision, Policy, Store, StoreError, Verdict,
};
use redis::{Cmd, Value};
use smallvec::SmallVec;

use crate::budget::{self, Budget, Plan};
use crate::builder::RedisStoreBuilder;
use crate::coalesce::{self, Batch, Coalescer, Join, Lead};
use crate::connection::{self, Pool};
use crate::functions::{self, CallPath};
use crate::scripts::{self, LuaScript, ScriptCache};

/// Where a [`RedisStore`] reads the time.
///
/// A client clock must agree with Redis's: keys expire on Redis's clock at
/// the times the client computed, so a clock behind Redis's writes keys
/// that are already expired and the limiter admits everything.
/// [`build`](crate::RedisStoreBuilder::build) compares a client clock with
/// Redis's `TIME` and refuses one further than
/// [`client_clock_tolerance`](crate::RedisStoreBuilder::client_clock_tolerance)
/// (one second by default).
///
/// ```
/// use std::sync::Arc;
/// use portcullis::{Clock, ManualClock, SystemClock};
/// use portcullis::redis::ClockMode;
///
/// let production = ClockMode::Redis; // the default
/// // A test clock starts at the wall clock's time (which NTP keeps close
/// // to Redis's), never at a fixed date: `build()` would refuse it.
/// let tests = ClockMode::Client(Arc::new(ManualClock::new(SystemClock.now_micros())));
/// assert!(matches!(production, ClockMode::Redis));
/// assert!(matches!(tests, ClockMode::Client(_)));
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum ClockMode {
    /// The script reads Redis' `TIME` (the default): every app instance sees
    /// one clock, whatever its own clock says. Scripts that read `TIME` and
    /// then write need effect replication (the default since Redis 5), and
    /// a write is one `SET … PXAT` (Redis 6.2), so the store needs Redis 6.2
    /// or later, as the crate docs say.
    #[default]
    Redis,
    /// The time comes from this clock, read by the client at each call. For
    /// tests (with a [`ManualClock`](portcullis_core::ManualClock)) and for
    /// setups whose clocks are known to agree.
    ///
    /// Keys still expire on Redis' clock, at the client's `expires_at`
    /// (`PXAT`): a client clock that lags Redis' makes keys expire early
    /// (the limiter then forgets and admits more; far behind, it admits
    /// everything), one that runs ahead keeps them longer than needed. So
    /// `build()` refuses a clock further from Redis's `TIME` than
    /// [`client_clock_tolerance`](crate::RedisStoreBuilder::client_clock_tolerance);
    /// a test clock moved far from the wall clock on purpose takes
    /// `client_clock_tolerance(Duration::MAX)`. The check runs once: a
    /// [`ManualClock`](portcullis_core::ManualClock) stands still while
    /// Redis's clock moves on.
    Client(Arc<dyn Clock>),
}

impl fmt::Debug for ClockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Redis => f.write_str("Redis"),
            Self::Client(clock) => f.debug_tuple("Client").field(clock).finish(),
        }
    }
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) prefix: Arc<str>,
    pub(crate) timeout: Duration,
    pub(crate) clock: ClockMode,
    pub(crate) hash_subjects: bool,
    pub(crate) scripts: ScriptCache,
    pub(crate) limiter_script: LuaScript,
    /// Checks waiting for a call in flight for their subject and policies
    /// (coalesce.rs); `None` when coalescing is off.
    pub(crate) coalescer: Option<Coalescer>,
    /// Leases of permits for busy subjects (budget.rs); `None` unless
    /// configured.
    pub(crate) budget: Option<Budget>,
}

/// A rate-limit [`Store`] in Redis or Redis Cluster: every check is one
/// atomic Lua script call, with the same decisions as
/// [`MemoryStore`](portcullis_core::MemoryStore).
///
/// Cheap to clone; clones share the pool. See the [guide](crate::guide) for
/// the key layout, clock modes and failure semantics.
///
/// ```no_run
/// use portcullis::{Policy, Store};
/// use portcullis::redis::RedisStore;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder().url("redis://127.0.0.1:6379").build().await?;
/// let policies = [
///     Policy::per_second(10).name("burst").build()?,
///     Policy::per_day(1_000).name("daily").build()?,
/// ];
/// let verdict = store.check("user:42", &policies, 1).await?;
/// if !verdict.is_allowed() {
///     println!("retry in {:?}", verdict.retry_after());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("pool", &self.inner.pool)
            .field("prefix", &&*self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field("clock", &self.inner.clock)
            .field("hash_subjects", &self.inner.hash_subjects)
            .field("call_path", &self.call_path())
            .finish_non_exhaustive()
    }
}

/// The future of [`RedisStore::check`]: the core's boxed check future.
pub(crate) type CheckFuture = portcullis_core::BoxCheckFuture;

impl RedisStore {
    /// A builder; give it [`url`](RedisStoreBuilder::url),
    /// [`cluster`](RedisStoreBuilder::cluster),
    /// [`sentinel`](RedisStoreBuilder::sentinel),
    /// [`client`](RedisStoreBuilder::client),
    /// [`cluster_client`](RedisStoreBuilder::cluster_client) or
    /// [`pool`](RedisStoreBuilder::pool).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// The Redis key holding `policy`'s state for `subject`:
    /// `<prefix>:{<encoded subject>}:<policy name>`. For inspecting with
    /// `redis-cli`.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// // With lazy_connect, this runs without a server.
    /// let store = portcullis::redis::RedisStore::builder()
    ///     .url("redis://127.0.0.1")
    ///     .lazy_connect(true)
    ///     .build()
    ///     .await?;
    /// assert_eq!(store.key_for("user:42", "api"), "portcullis:{user:42}:api");
    /// assert!(store.key_for("evil}{subject", "api").starts_with("portcullis:{#"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn key_for(&self, subject: &str, policy_name: &str) -> String {
        self.key(&self.subject(subject), policy_name)
    }

    pub(crate) fn subject<'a>(&self, subject: &'a str) -> Cow<'a, str> {
        encode_subject(subject, self.inner.hash_subjects)
    }

    pub(crate) fn key(&self, encoded_subject: &str, policy_name: &str) -> String {
        let prefix = &*self.inner.prefix;
        let mut key =
            String::with_capacity(prefix.len() + encoded_subject.len() + policy_name.len() + 4);
        key.push_str(prefix);
        key.push_str(":{");
        key.push_str(encoded_subject);
        key.push_str("}:");
        key.push_str(policy_name);
        key
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Appends the time argument for a script: empty for Redis `TIME`.
    pub(crate) fn push_now(&self, cmd: &mut Cmd) {
        push_time(cmd, self.inner.now());
    }

    /// Sends `PING` and waits for the answer: checks at startup that the
    /// server (or every Cluster node the ping reaches) is up.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Timeout`] when the
    /// server does not answer within the store's timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let value =
            connection::query(&self.inner.pool, self.inner.timeout, &redis::cmd("PING")).await?;
        match value {
            Value::SimpleString(s) if s == "PONG" => Ok(()),
            Value::BulkString(s) if s == b"PONG" => Ok(()),
            other => Err(StoreError::Protocol {
                detail: format!("PING answered {other:?}"),
            }),
        }
    }

    /// The SHA-1 of the script that checks `policies` (in this order):
    /// what `EVALSHA` calls it, and what `SLOWLOG` and `redis-benchmark`
    /// show.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use portcullis::Policy;
    ///
    /// let store = portcullis::redis::RedisStore::builder()
    ///     .url("redis://127.0.0.1")
    ///     .lazy_connect(true)
    ///     .build()
    ///     .await?;
    /// let sha = store.script_sha(&[Policy::per_second(10).build()?])?;
    /// assert_eq!(sha.len(), 40);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Protocol`] for an algorithm this version has no
    /// script for.
    pub fn script_sha(&self, policies: &[Policy]) -> Result<String, StoreError> {
        Ok(self
            .inner
            .scripts
            .get(policies.iter().map(Policy::algorithm))?
            .sha()
            .to_owned())
    }

    /// How checks are called: [`CallPath::Functions`] (the default), or
    /// [`CallPath::Evalsha`] once a server refused `FCALL` or `FUNCTION`
    /// (Redis before 7, an ACL without them). The store starts on Redis
    /// Functions and falls back at the first refusal, for good. A node too
    /// full to load the library (`maxmemory` with `noeviction`) moves the
    /// store to [`CallPath::Evalsha`] only until the library can be loaded
    /// (on a Cluster, one full node moves the whole store; both paths
    /// decide alike). `build()`
    /// checks the store with a peek, so the path is chosen there; with
    /// [`lazy_connect(true)`](RedisStoreBuilder::lazy_connect) the first
    /// check (or [`ping`](Self::ping)) finds out.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use portcullis::redis::{CallPath, RedisStore};
    ///
    /// // Without a server (lazy): Functions until a server refuses them.
    /// let store = RedisStore::builder()
    ///     .url("redis://127.0.0.1")
    ///     .lazy_connect(true)
    ///     .build()
    ///     .await?;
    /// assert_eq!(store.call_path(), CallPath::Functions);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn call_path(&self) -> CallPath {
        self.inner.scripts.path().get()
    }

    /// The name of the Redis Functions library this version loads,
    /// `portcullis_<hash of its source>` (what `FUNCTION LIST` shows).
    #[must_use]
    pub fn library_name(&self) -> &str {
        self.inner.scripts.library().name()
    }

    fn check_future(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<CheckFuture, StoreError> {
        validate_check(policies, cost)?;
        let path = self.inner.scripts.path().choose();
        if let Some(future) = self.budget_answer(path, subject, policies, cost) {
            return Ok(future);
        }
        // Charges on the Functions path join a call in flight for the same
        // subject and policies (coalesce.rs); peeks and scripts go alone.
        if let (Some(coalescer), CallPath::Functions, true) =
            (&self.inner.coalescer, path, cost > 0)
        {
            let encoded = self.subject(subject);
            let key = self.batch_key(&encoded, policies);
            match coalescer.join(&key, cost) {
                Join::Wait(answer) => {
                    return Ok(Box::pin(coalesce::wait(answer, self.inner.timeout)));
                }
                Join::Lead => {
                    let mut lead = self.lead(key.into(), &encoded, policies, cost);
                    let call = self.call_future(path, subject, policies, cost);
                    return Ok(Box::pin(async move {
                        let verdict = match call {
                            Ok(call) => call.await,
                            Err(error) => Err(error),
                        };
                        if let Err(error) = &verdict {
                            lead.failed(error);
                        }
                        // The checks that waited meanwhile go now (or fail
                        // as this call did, unsent).
                        drop(lead);
                        verdict
                    }));
                }
            }
        }
        self.call_future(path, subject, policies, cost)
    }

    /// The local budget and the state key of a check it takes: one GCRA
    /// policy of the fast path, a charge, on the Functions path.
    fn budget_for(
        &self,
        path: CallPath,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<(&Budget, String)> {
        let budget = self.inner.budget.as_ref()?;
        let [policy] = policies else {
            return None;
        };
        let takes = path == CallPath::Functions
            && cost > 0
            && budget.takes(policy)
            && self
                .inner
                .scripts
                .library()
                .fast_gcra(policies, cost)
                .is_some();
        takes.then(|| (budget, self.key(&self.subject(subject), policy.name())))
    }

    /// The check's answer from the local budget (admitted from a lease, or
    /// a lease call), when the store has one and the check takes it.
    fn budget_answer(
        &self,
        path: CallPath,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<CheckFuture> {
        let (budget, key) = self.budget_for(path, subject, policies, cost)?;
        let policy = &policies[0];
        match budget.plan(&key, policy, cost, budget::now_us(&self.inner.clock)) {
            Plan::Local(verdict) => Some(Box::pin(std::future::ready(Ok(verdict)))),
            Plan::Lease(want) => Some(Box::pin(budget::lease(
                Arc::clone(&self.inner),
                key,
                policy.clone(),
                cost,
                want,
            ))),
            Plan::Exact => None,
        }
    }

    /// What identifies checks that may share a call: the subject's keys
    /// and each policy's name, algorithm and figures.
    fn batch_key(&self, encoded_subject: &str, policies: &[Policy]) -> String {
        use std::fmt::Write as _;
        let mut key = self.key(encoded_subject, "");
        for policy in policies {
            let _ = write!(
                key,
                "\n{}\n{:?}:{}:{}:{}",
                policy.name(),
                policy.algorithm(),
                policy.limit(),
                policy.period_micros(),
                policy.capacity()
            );
        }
        key
    }

    /// The [`Lead`] of a check that makes the call for its subject and
    /// policies.
    fn lead(&self, key: Box<str>, encoded: &str, policies: &[Policy], cost: u64) -> Lead {
        let keys = policies
            .iter()
            .map(|policy| self.key(encoded, policy.name()))
            .collect();
        // The fast batch takes every cost a fast check takes: the policy
        // decides, not this check's cost.
        let fast = self
            .inner
            .scripts
            .library()
            .fast_gcra(policies, cost.clamp(1, policies[0].capacity()))
            .is_some();
        let plan =
            scripts::Library::plan(policies.iter().map(Policy::algorithm)).unwrap_or_default();
        Lead::new(
            Arc::clone(&self.inner),
            key,
            Batch::new(keys, policies, plan, fast),
        )
    }

    /// One check, alone, as one call.
    fn call_future(
        &self,
        path: CallPath,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Result<CheckFuture, StoreError> {
        if path != CallPath::Evalsha {
            if let Some(script) = self.inner.scripts.library().fast_gcra_alone(policies, cost) {
                let script = script.clone();
                return Ok(self.fast_gcra_future(script, subject, &policies[0], cost));
            }
            if let Some(script) = self.inner.scripts.library().fast_other(policies, cost) {
                let script = script.clone();
                return Ok(self.fast_one_future(script, subject, &policies[0], cost));
            }
            if let Some(script) = self.inner.scripts.library().fast_gcra_multi(policies, cost) {
                let script = script.clone();
                return Ok(self.fast_gcra_multi_future(script, subject, policies, cost));
            }
        }
        let (script, plan) = match path {
            CallPath::Evalsha => (
                self.inner
                    .scripts
                    .get(policies.iter().map(Policy::algorithm))?,
                SmallVec::new(),
            ),
            _ => (
                self.inner.scripts.library().function(cost == 0).clone(),
                scripts::Library::plan(policies.iter().map(Policy::algorithm))?,
            ),
        };
        let subject = self.subject(subject);
        let mut cmd = if script.is_function() {
            redis::cmd(if cost == 0 { "FCALL_RO" } else { "FCALL" })
        } else {
            redis::cmd("EVALSHA")
        };
        cmd.arg(script.sha()).arg(policies.len());
        // One buffer for every key: `<prefix>:{<subject>}:` once, then each
        // policy's name in turn. validate_check refused an empty list, so
        // the first key is always set.
        let mut key = self.key(&subject, "");
        let common = key.len();
        let mut first_key = String::new();
        for (i, policy) in policies.iter().enumerate() {
            key.truncate(common);
            key.push_str(policy.name());
            cmd.arg(key.as_str());
            if i == 0 {
                // NOSCRIPT's slot routing needs it; every key of the
                // subject shares its `{subject}` hash tag, so one is enough.
                first_key.push_str(&key);
            }
        }
        if script.is_function() {
            cmd.arg(plan.as_slice());
        }
        self.push_now(&mut cmd);
        cmd.arg(cost);
        // Each policy as one argument, `<limit>:<period_us>:<capacity>`:
        // the library parses a policy once, not on every call.
        let mut buffer = String::with_capacity(64);
        for policy in policies {
            use std::fmt::Write as _;
            buffer.clear();
            let _ = write!(
                buffer,
                "{}:{}:{}",
                policy.limit(),
                policy.period_micros(),
                policy.capacity()
            );
            cmd.arg(buffer.as_str());
        }
        let capacities: SmallVec<[u64; 2]> = policies.iter().map(Policy::capacity).collect();
        let algorithms: SmallVec<[Algorithm; 2]> = if script.is_function() {
            policies.iter().map(Policy::algorithm).collect()
        } else {
            SmallVec::new()
        };
        let inner = Arc::clone(&self.inner);
        Ok(Box::pin(async move {
            let value = match run(&inner, &script, &cmd, &first_key).await {
                // Redis refused FCALL or FUNCTION LOAD, so nothing ran:
                // EVALSHA from now on, this check first.
                Err(error) if script.is_function() && inner.scripts.path().refused(&error) => {
                    let script = inner.scripts.get(algorithms.iter().copied())?;
                    let evalsha = evalsha_from_fcall(&script, &cmd, algorithms.len());
                    run(&inner, &script, &evalsha, &first_key).await?
                }
                other => other?,
            };
            parse_verdict(value, &capacities)
        }))
    }
}

impl Inner {
    /// The time a call passes: `None` for Redis `TIME`, else the client
    /// clock's now, in microseconds.
    pub(crate) fn now(&self) -> Option<u64> {
        match &self.clock {
            ClockMode::Redis => None,
            ClockMode::Client(clock) => Some(clock.now_micros()),
        }
    }
}

/// Appends a call's time argument: `now`, or empty for Redis `TIME`.
pub(crate) fn push_time(cmd: &mut Cmd, now: Option<u64>) {
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
}

/// One check of `policies` (`<limit>:<period_us>:<capacity>` each, their
/// state `keys`) as the general script decides it, by `EVALSHA`: the path
/// of a check whose function Redis refused (nothing ran), or whose state
/// only the general check reads.
pub(crate) async fn evalsha_check(
    inner: &Inner,
    algorithms: impl ExactSizeIterator<Item = Algorithm> + Clone,
    keys: &[&str],
    now: Option<u64>,
    cost: u64,
    policies: &[&str],
) -> Result<Value, StoreError> {
    let script = inner.scripts.get(algorithms)?;
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.sha()).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    push_time(&mut cmd, now);
    cmd.arg(cost);
    for policy in policies {
        cmd.arg(*policy);
    }
    run(
        inner,
        &script,
        &cmd,
        keys.first().copied().unwrap_or_default(),
    )
    .await
}

/// Runs a check; one refused with `OOM` runs once more as its allow-oom
/// twin.
pub(crate) async fn run(
    inner: &Inner,
    script: &LuaScript,
    cmd: &Cmd,
    first_key: &str,
) -> Result<Value, StoreError> {
    match connection::eval(&inner.pool, inner.timeout, script, cmd, first_key).await {
        Ok(value) => {
            if script.is_function() {
                inner.scripts.path().loaded();
            }
            Ok(value)
        }
        // Refused at its first write (a script) or before running (a
        // function), so nothing was charged: once more, allowed to update
        // held subjects only.
        Err(error) if is_oom(&error) => {
            check_out_of_memory(inner, script, cmd, first_key, error).await
        }
        Err(error) => Err(error),
    }
}

/// The `EVALSHA` of `script` with the arguments of an `FCALL` (`FCALL name
/// numkeys keys... plan now cost ...`), without the plan.
#[cold]
pub(crate) fn evalsha_from_fcall(script: &LuaScript, fcall: &Cmd, keys: usize) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.sha());
    for (i, arg) in fcall.args_iter().enumerate().skip(2) {
        if i == 3 + keys {
            continue;
        }
        if let redis::Arg::Simple(bytes) = arg {
            cmd.arg(bytes);
        }
    }
    cmd
}

/// The error of a check of a subject Redis has no memory for.
pub(crate) fn out_of_memory() -> StoreError {
    StoreError::OutOfMemory {
        retry_after: OUT_OF_MEMORY_RETRY,
    }
}

/// How long a subject Redis has no memory for is told to wait: Redis frees
/// memory as keys expire, at a time the client cannot know.
const OUT_OF_MEMORY_RETRY: Duration = Duration::from_secs(1);

/// Whether Redis refused a check for lack of memory (`OOM`, at `maxmemory`
/// with `noeviction`).
pub(crate) fn is_oom(error: &StoreError) -> bool {
    if functions::is_library_not_loaded(error) {
        // The library could not be loaded: its caller runs the call as a
        // script, which Redis loads even when full.
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(redis) = crate::errors::redis_error(error) {
            // Redis before 7 answers a script whose write it refused with
            // `ERR Error running script ...: OOM command not allowed ...`.
            if redis.code() == Some("OOM") || redis.to_string().contains("OOM command not allowed")
            {
                return true;
            }
        }
        source = error.source();
    }
    matches!(error, StoreError::Protocol { detail } if detail.contains("OOM command not allowed"))
}

/// A check Redis refused with `OOM` (nothing was written), run once more as
/// the script's allow-oom twin: a subject Redis holds is checked and charged
/// exactly; one it would have to create is refused with
/// [`StoreError::OutOfMemory`] (denied by the tower layer, like a new
/// subject of a full `MemoryStore`). Redis before 7 cannot run the twin
/// (its `#!lua` line is a syntax error there) and the check fails with that
/// error.
#[cold]
async fn check_out_of_memory(
    inner: &Inner,
    script: &LuaScript,
    cmd: &Cmd,
    first_key: &str,
    refused: StoreError,
) -> Result<Value, StoreError> {
    let Some(twin) = script.allow_oom() else {
        return Err(refused);
    };
    let mut retry = redis::cmd(if twin.is_function() {
        "FCALL"
    } else {
        "EVALSHA"
    });
    retry.arg(twin.sha());
    for arg in cmd.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            retry.arg(bytes);
        }
    }
    tracing::debug!("Redis is out of memory: checking again, for held subjects only");
    match connection::eval(&inner.pool, inner.timeout, twin, &retry, first_key).await {
        Ok(Value::SimpleString(status)) if status == "NOROOM" => Err(StoreError::OutOfMemory {
            retry_after: OUT_OF_MEMORY_RETRY,
        }),
        Ok(value) => Ok(value),
        // Redis before 7 cannot compile the twin (it reads the `#!lua` line
        // as Lua): nothing can be written while it is full, so every subject
        // is refused for lack of memory, never let through undecided.
        Err(error) if twin_refused(&error) => Err(StoreError::OutOfMemory {
            retry_after: OUT_OF_MEMORY_RETRY,
        }),
        Err(error) => Err(error),
    }
}

/// Whether the server refused to compile an allow-oom twin: Redis before 7
/// has no `#!lua` flags line ("Error compiling script ... near '#'").
pub(crate) fn twin_refused(error: &StoreError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if let Some(redis) = crate::errors::redis_error(error) {
            return redis.to_string().contains("Error compiling script");
        }
        source = error.source();
    }
    false
}

impl Store for RedisStore {
    type CheckFuture = CheckFuture;

    fn check(&self, subject: &str, policies: &[Policy], cost: u64) -> Self::CheckFuture {
        match self.check_future(subject, policies, cost) {
            Ok(future) => future,
            Err(error) => Box::pin(std::future::ready(Err(error))),
        }
    }

    /// Answers at once only from a [`LocalBudget`](crate::LocalBudget):
    /// permits of a live lease, or a denial Redis gave that still holds.
    /// Everything else goes to Redis through [`Store::check`].
    fn check_now(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> Option<Result<Verdict, StoreError>> {
        self.inner.budget.as_ref()?;
        let path = self.inner.scripts.path().choose();
        let (budget, key) = self.budget_for(path, subject, policies, cost)?;
        let now = budget::now_us(&self.inner.clock);
        budget.local(&key, &policies[0], cost, now).map(Ok)
    }

    /// One atomic script call for every policy (charge.lua; `FCALL` of the
    /// library's charge function, or `EVALSHA` on that path). See
    /// [`Store::charge`].
    fn charge(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
    ) -> impl Future<Output = Result<Verdict, StoreError>> + Send + 'static {
        let future = self.charge_future(subject, policies, cost);
        async move { future?.await }
    }

    /// One atomic script call: the idempotency record, the class
    /// reserves and every policy (options.lua; `FCALL` of the library's
    /// `ext` function, or `EVALSHA` on that path). See [`Store::check_with`].
    fn check_with(
        &self,
        subject: &str,
        policies: &[Policy],
        cost: u64,
        options: &portcullis_core::CheckOptions,
    ) -> impl Future<Output = Result<portcullis_core::Checked, StoreError>> + Send + 'static {
        let future = self.check_with_future(subject, policies, cost, options);
        async move { future?.await }
    }

    fn reset(
        &self,
        subject: &str,
        policies: &[Policy],
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let subject = self.subject(subject);
        let keys: Vec<String> = policies
            .iter()
            .map(|policy| self.key(&subject, policy.name()))
            .collect();
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&keys);
        let inner = Arc::clone(&self.inner);
        async move {
            if keys.is_empty() {
                return Ok(());
            }
            let deleted = connection::query(&inner.pool, inner.timeout, &cmd).await;
            // This instance's local answers for the subject end with the
            // reset (budget.rs), whatever the reply: a `DEL` whose reply
            // was lost may still have run.
            if let Some(budget) = &inner.budget {
                for key in &keys {
                    budget.forget(key);
                }
            }
            deleted?;
            Ok(())
        }
    }
}

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

pub(crate) fn protocol(detail: String) -> StoreError {
    StoreError::Protocol { detail }
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
    fn the_evalsha_fallback_keeps_every_argument_but_the_plan() {
        let script = scripts::compose(&[Algorithm::Gcra, Algorithm::FixedWindow]).unwrap();
        let mut fcall = redis::cmd("FCALL");
        fcall
            .arg("portcullis_x_check")
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg("ae")
            .arg("")
            .arg(1)
            .arg("5:1000000:5")
            .arg("9:60000000:9");
        let evalsha = evalsha_from_fcall(&script, &fcall, 2);
        let args: Vec<Vec<u8>> = evalsha
            .args_iter()
            .filter_map(|arg| match arg {
                redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
                _ => None,
            })
            .collect();
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
        assert_eq!(args, expected);
    }
}
