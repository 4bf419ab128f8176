//! Allocations per uncontended check on the client, counted by `dhat`
//! against the real Redis server `cargo xtask test` starts
//! (`PORTCULLIS_REDIS_URL`; without it this binary fails, it never skips).
//!
//! Counted over the whole process while the checks run, so the `redis`
//! crate's own three per command count too: the packed command
//! (`Cmd::get_packed_command`, a new `Vec` that the multiplexed
//! connection's `send_packed_command` hands to its task), the reply's
//! oneshot channel (`Pipeline::send_recv`), and a parser error value
//! (the connection's task decodes its drained read buffer once more after
//! each reply, and combine's `easy::Errors` holds that end of input in a
//! `Vec`). None of them can be avoided through the crate's public API; its
//! fourth, the boxed future of `ConnectionLike::req_packed_command`, is,
//! by calling the connection's inherent `send_packed_command`.
//!
//! The store's own: the boxed check future (`Store::CheckFuture` is a
//! named type, and the future holds async fns' futures, which only a box
//! can name on stable Rust) and the call's target (its state keys, held
//! inline up to 112 bytes, its policy set and policies, shared with the
//! table of calls in flight when coalescing). The command's buffers are
//! reused per thread. A hashed subject adds its encoding (once per
//! check), and two hashed keys no longer fit inline. Two policies are
//! answered by the general function: its reply is an array (one more in
//! the `redis` crate) and the verdict holds a decision per policy (one
//! more of the store's). On the `EVALSHA` path (Redis before 7, which
//! `cargo xtask test` runs with `REDIS_SERVER` set to a 6.2 server) one
//! policy's reply is an array too: the one-integer replies are the
//! library's fast functions, which scripts do not have.
//! A store with a local budget adds, for a subject it sees once (never
//! granted: most subjects of a large population), the slot that records
//! the subject's demand: the key's bytes are looked up from the stack,
//! by `check_now` and again by `check`, as the layer asks.
//! Its own binary (no harness): `dhat` counts the whole process.

use portcullis::redis::{CallPath, LocalBudget, RedisStore};
use portcullis::{Algorithm, Policy, Store};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const CHECKS: u64 = 200;

/// The `redis` crate's allocations per command (see the module docs).
const REDIS_CRATE: f64 = 3.0;

/// Allocations per check (rounded mean over [`CHECKS`], after a warm-up)
/// of `policies` through `store`.
fn allocations_per_check(
    runtime: &tokio::runtime::Runtime,
    store: &RedisStore,
    policies: &[Policy],
) -> f64 {
    let run = |n: u64| {
        for _ in 0..n {
            let verdict = runtime
                .block_on(store.check("user-42", policies, 1))
                .expect("the check is answered");
            assert!(verdict.is_allowed(), "the policies are generous");
        }
    };
    run(10);
    blocks_per_check(|| run(CHECKS))
}

/// The heap blocks `checks` allocates (it makes [`CHECKS`] checks), per
/// check, rounded: the runtime's own bookkeeping allocates now and then
/// (a few blocks over the whole run), a budget's table grows (about one
/// block in five checks for new subjects).
fn blocks_per_check(checks: impl FnOnce()) -> f64 {
    let before = dhat::HeapStats::get().total_blocks;
    checks();
    let after = dhat::HeapStats::get().total_blocks;
    #[allow(clippy::cast_precision_loss)]
    let per_check = (after - before) as f64 / CHECKS as f64;
    per_check.round()
}

/// Allocations per check (rounded mean over [`CHECKS`], after a warm-up)
/// of `policies` through `store`, each check of a subject of its own
/// (made before the count), asked as the layer asks: `check_now`, then
/// `check`.
fn allocations_per_new_subject(
    runtime: &tokio::runtime::Runtime,
    store: &RedisStore,
    policies: &[Policy],
) -> f64 {
    let subjects: Vec<String> = (0..CHECKS + 10).map(|i| format!("once-{i}")).collect();
    let (warm, measured) = subjects.split_at(10);
    let run = |subjects: &[String]| {
        for subject in subjects {
            let verdict = match store.check_now(subject, policies, 1) {
                Some(verdict) => verdict,
                None => runtime.block_on(store.check(subject, policies, 1)),
            }
            .expect("the check is answered");
            assert!(verdict.is_allowed(), "the policy is generous");
        }
    };
    run(warm);
    blocks_per_check(|| run(measured))
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let url = std::env::var("PORTCULLIS_REDIS_URL").expect(
        "PORTCULLIS_REDIS_URL is not set: run this through `cargo xtask test`, \
         which starts a Redis server for it",
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let prefix = format!("alloc{}", std::process::id());
    let gcra = Policy::per_second(1_000_000).name("gcra").build().unwrap();
    let window = Policy::per_second(1_000_000)
        .algorithm(Algorithm::SlidingWindow)
        .name("window")
        .build()
        .unwrap();
    let mut failures = Vec::new();
    for (coalesce, hash) in [(true, false), (false, false), (true, true)] {
        let store = runtime
            .block_on(
                RedisStore::builder()
                    .url(url.as_str())
                    .prefix(prefix.as_str())
                    .coalesce(coalesce)
                    .hash_subjects(hash)
                    .build(),
            )
            .expect("the store connects");
        for policies in [vec![gcra.clone()], vec![gcra.clone(), window.clone()]] {
            let measured = allocations_per_check(&runtime, &store, &policies);
            // The future and the target; a hashed subject's encoding, and
            // its keys past the inline bytes when two; the general reply's
            // decisions (and its array, in the redis crate, which scripts
            // answer for one policy too).
            let general = policies.len() > 1;
            let own = 2.0
                + f64::from(u8::from(hash))
                + f64::from(u8::from(hash && general))
                + f64::from(u8::from(general));
            let array = general || store.call_path() == CallPath::Evalsha;
            let bound = own + REDIS_CRATE + f64::from(u8::from(array));
            println!(
                "coalesce={coalesce} hash_subjects={hash} policies={}: \
                 {measured} allocations per check (bound {bound})",
                policies.len()
            );
            if measured > bound {
                failures.push(format!(
                    "coalesce={coalesce} hash_subjects={hash} policies={}: {measured} > {bound}",
                    policies.len()
                ));
            }
        }
    }
    // A local budget: the exact check's allocations and the new subject's
    // slot (its key's bytes, kept to count its demand).
    let store = runtime
        .block_on(
            RedisStore::builder()
                .url(url.as_str())
                .prefix(prefix.as_str())
                .local_budget(LocalBudget::new())
                .build(),
        )
        .expect("the store connects");
    let measured = allocations_per_new_subject(&runtime, &store, std::slice::from_ref(&gcra));
    let array = store.call_path() == CallPath::Evalsha;
    let bound = 2.0 + REDIS_CRATE + 1.0 + f64::from(u8::from(array));
    println!("local budget, a subject seen once: {measured} allocations per check (bound {bound})");
    if measured > bound {
        failures.push(format!(
            "local budget, a subject seen once: {measured} > {bound}"
        ));
    }
    assert!(
        failures.is_empty(),
        "a check allocates more than its bound: {failures:?}"
    );
}
