//! `MemoryStore` against governor 0.10's keyed limiter, in figures that
//! hold still on a busy machine: instructions per check (callgrind),
//! resident bytes per key, and wall-clock only as interleaved ratios.
//!
//! Run with `cargo xtask bench core` (or `cargo bench -p portcullis-core
//! --bench memory_cost`); it needs `valgrind` on the `PATH`.
//!
//! - **Instructions per check.** The bench re-runs itself under
//!   `valgrind --tool=callgrind` once per (case, implementation)
//!   (`PORTCULLIS_BENCH_CHILD=insn:<case>:<impl>`). Every key is checked once
//!   first (in numeric order), then only the function running the measured
//!   checks (in a shuffled order) is counted (`--toggle-collect`). A
//!   `baseline` implementation runs the same loop without a limiter; its
//!   count is subtracted from every other, so the figures are the limiter's
//!   own. Governor is measured as `RateLimiter::keyed` builds it (DashMap
//!   with std's SipHash) and with the foldhash hasher portcullis uses.
//! - **Resident bytes per key.** One fresh process per (implementation,
//!   size) reads its resident set (`/proc/self/statm`) before and after
//!   inserting `user:<n>` for every `n` below the size; keys are formatted
//!   into one reused buffer, so only what the limiter keeps is counted.
//!   Portcullis's store is unbounded here, as governor's is.
//! - **Wall clock.** Portcullis and governor take turns in short rounds in
//!   one process; each round gives a ratio, and the min/median/max of
//!   those ratios are printed (absolute times on a shared 2-core machine
//!   move by 2–3× between runs; ratios within one round much less). Two
//!   threads on 10k keys are compared with one thread the same way.
//!
//! Every case uses a GCRA quota; the admitting cases have a burst so large
//! that no run is denied and every state stays live between visits.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::Command;
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};
use portcullis_core::{MemoryStore, Policy, Store};

const CHILD: &str = "PORTCULLIS_BENCH_CHILD";
/// The whole-interval quota: one per 10 min with this burst (portcullis:
/// burst × period within 2^52 µs; governor: within 2^64 ns). Long enough
/// that no state filled before the counted section expires during it, even
/// when filling a million keys under valgrind on a loaded machine takes
/// minutes (an expired state would be swept and inserted again, which is
/// not what the case measures); the burst outlasts every run's checks.
const WHOLE_PERIOD: Duration = Duration::from_secs(600);
const WHOLE_BURST: u32 = 4_000_000;
/// The fractional quota: three per 10 s, burst 4·10^8 (each key's state
/// moves 3.33 s ahead per check, so it stays live between two visits).
const FRACTIONAL_BURST: u32 = 400_000_000;

type FoldGovernor = RateLimiter<
    String,
    governor::state::keyed::DashMapStateStore<String, foldhash::fast::RandomState>,
    governor::clock::DefaultClock,
>;
type SipGovernor = governor::DefaultKeyedRateLimiter<String>;

/// The quota of a case.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Quota_ {
    /// One per 10 min (a whole number of microseconds), never denied.
    Whole,
    /// Three per 10 s (3.33… s between permits), never denied.
    Fractional,
    /// One per hour, burst one: all but the first check denied.
    Denied,
}

struct Case {
    name: &'static str,
    keys: usize,
    quota: Quota_,
    /// Checks counted under callgrind.
    checks: usize,
}

const CASES: [Case; 5] = [
    Case {
        name: "1 key",
        keys: 1,
        quota: Quota_::Whole,
        checks: 20_000,
    },
    Case {
        name: "10k keys",
        keys: 10_000,
        quota: Quota_::Whole,
        checks: 50_000,
    },
    Case {
        name: "1M keys",
        keys: 1_000_000,
        quota: Quota_::Whole,
        checks: 200_000,
    },
    Case {
        name: "3 per 10 s, 10k keys",
        keys: 10_000,
        quota: Quota_::Fractional,
        checks: 50_000,
    },
    Case {
        name: "hot key, denied",
        keys: 1,
        quota: Quota_::Denied,
        checks: 20_000,
    },
];

const IMPLS: [&str; 3] = ["portcullis", "governor-sip", "governor-fold"];
/// Instructions are also counted for `MemoryStore::check_denial`, the
/// check that answers the verdict only when it denies.
const INSN_IMPLS: [&str; 4] = [
    "portcullis",
    "governor-sip",
    "governor-fold",
    "portcullis-denial",
];

/// One cost-1 check, allowed or not.
#[allow(clippy::ptr_arg)]
trait Limiter: Sync {
    fn allow(&self, key: &String) -> bool;
}

struct Portcullis {
    store: MemoryStore,
    policies: [Policy; 1],
}

impl Limiter for Portcullis {
    #[inline]
    fn allow(&self, key: &String) -> bool {
        match self.store.check(key, &self.policies, 1).into_inner() {
            Ok(verdict) => verdict.is_allowed(),
            Err(err) => panic!("check failed: {err}"),
        }
    }
}

/// The same store through `MemoryStore::check_denial`.
struct PortcullisDenial(Portcullis);

impl Limiter for PortcullisDenial {
    #[inline]
    fn allow(&self, key: &String) -> bool {
        match self.0.store.check_denial(key, &self.0.policies, 1) {
            Ok(denied) => denied.is_none(),
            Err(err) => panic!("check failed: {err}"),
        }
    }
}

impl Limiter for SipGovernor {
    #[inline]
    fn allow(&self, key: &String) -> bool {
        self.check_key(key).is_ok()
    }
}

impl Limiter for FoldGovernor {
    #[inline]
    fn allow(&self, key: &String) -> bool {
        self.check_key(key).is_ok()
    }
}

/// The loop without a limiter.
struct Baseline;

impl Limiter for Baseline {
    #[inline]
    fn allow(&self, key: &String) -> bool {
        !key.is_empty()
    }
}

fn portcullis_policy(quota: Quota_) -> Policy {
    let builder = match quota {
        Quota_::Whole => Policy::per(1, WHOLE_PERIOD).burst(WHOLE_BURST.into()),
        Quota_::Fractional => {
            Policy::per(3, Duration::from_secs(10)).burst(FRACTIONAL_BURST.into())
        }
        Quota_::Denied => Policy::per_hour(1),
    };
    builder.name("bench").build().expect("a valid policy")
}

fn governor_quota(quota: Quota_) -> Quota {
    match quota {
        Quota_::Whole => Quota::with_period(WHOLE_PERIOD)
            .expect("non-zero")
            .allow_burst(NonZeroU32::new(WHOLE_BURST).expect("non-zero")),
        Quota_::Fractional => Quota::with_period(Duration::from_nanos(3_333_333_333))
            .expect("non-zero")
            .allow_burst(NonZeroU32::new(FRACTIONAL_BURST).expect("non-zero")),
        Quota_::Denied => Quota::per_hour(NonZeroU32::new(1).expect("non-zero")),
    }
}

fn limiter(name: &str, quota: Quota_) -> Box<dyn Limiter> {
    match name {
        "portcullis" => Box::new(Portcullis {
            store: MemoryStore::builder().unbounded().build(),
            policies: [portcullis_policy(quota)],
        }),
        "portcullis-denial" => Box::new(PortcullisDenial(Portcullis {
            store: MemoryStore::builder().unbounded().build(),
            policies: [portcullis_policy(quota)],
        })),
        "governor-sip" => Box::new(SipGovernor::keyed(governor_quota(quota))),
        "governor-fold" => Box::new(FoldGovernor::new(
            governor_quota(quota),
            governor::state::keyed::DashMapStateStore::with_hasher(
                foldhash::fast::RandomState::default(),
            ),
            governor::clock::DefaultClock::default(),
        )),
        _ => Box::new(Baseline),
    }
}

/// `user:<n>` for every `n` below `size`, in numeric order.
fn first_seen(size: usize) -> Vec<String> {
    (0..size).map(|i| format!("user:{i}")).collect()
}

/// The same keys, shuffled (a fixed seed).
fn shuffled(size: usize) -> Vec<String> {
    let mut keys = first_seen(size);
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..keys.len()).rev() {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = usize::try_from((seed >> 33) % (i as u64 + 1)).expect("fits");
        keys.swap(i, j);
    }
    keys
}

/// `checks` checks walking `keys` round and round from `start`; the
/// number admitted.
#[inline(never)]
fn run(limiter: &dyn Limiter, keys: &[String], start: usize, checks: usize) -> usize {
    let mut index = start % keys.len();
    let mut admitted = 0;
    for _ in 0..checks {
        admitted += usize::from(black_box(limiter.allow(black_box(&keys[index]))));
        index += 1;
        if index == keys.len() {
            index = 0;
        }
    }
    admitted
}

/// The counted section (`--toggle-collect` names it).
#[inline(never)]
fn portcullis_callgrind_measured(limiter: &dyn Limiter, keys: &[String], checks: usize) -> usize {
    run(limiter, keys, 0, checks)
}

/// The child processes; `true` when this process was one.
fn child() -> bool {
    let Ok(spec) = std::env::var(CHILD) else {
        return false;
    };
    let parts: Vec<&str> = spec.split(':').collect();
    match parts.as_slice() {
        ["insn", case, name] => {
            let case = &CASES[case.parse::<usize>().expect("a case index")];
            let limiter = limiter(name, case.quota);
            let admitted = run(&*limiter, &first_seen(case.keys), 0, case.keys.max(100));
            black_box(admitted);
            let keys = shuffled(case.keys);
            let admitted = portcullis_callgrind_measured(&*limiter, &keys, case.checks);
            let expected = if case.quota == Quota_::Denied && *name != "baseline" {
                0
            } else {
                case.checks
            };
            assert_eq!(admitted, expected, "{name}: {}", case.name);
        }
        ["rss", name, size] => {
            let size: usize = size.parse().expect("a size");
            let limiter = limiter(name, Quota_::Whole);
            let mut key = String::with_capacity(32);
            let before = resident_bytes();
            for i in 0..size {
                use std::fmt::Write;
                key.clear();
                write!(key, "user:{i}").expect("formatted");
                assert!(limiter.allow(&key));
            }
            let after = resident_bytes();
            println!("{}", (after.saturating_sub(before)) as f64 / size as f64);
            black_box(limiter);
        }
        _ => panic!("unknown child {spec}"),
    }
    true
}

/// This process's resident set, in bytes.
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm (Linux)");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// Instructions of one counted child run, or why not.
fn instructions(case: usize, name: &str) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::env::temp_dir().join(format!(
        "portcullis-memory-cost-{}-{case}-{name}.out",
        std::process::id()
    ));
    let output = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--collect-atstart=no")
        .arg("--toggle-collect=*portcullis_callgrind_measured*")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .env(CHILD, format!("insn:{case}:{name}"))
        .output()
        .map_err(|e| format!("cannot run valgrind (apt-get install valgrind): {e}"))?;
    let _ = std::fs::remove_file(&out);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("valgrind failed: {stderr}"));
    }
    stderr
        .lines()
        .find_map(|line| line.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("no 'Collected' line in valgrind's output: {stderr}"))
}

fn rss_per_key(name: &str, size: usize) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let output = Command::new(exe)
        .env(CHILD, format!("rss:{name}:{size}"))
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("{e}"))
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".to_owned()
    }
}

fn report_instructions() -> Result<(), String> {
    println!("instructions per check (callgrind; the loop's own cost, `baseline`, subtracted):");
    println!(
        "  {:<22} {:>9} {:>13} {:>14} {:>9} {:>9} {:>18} {:>9}",
        "case",
        "portcullis",
        "governor-sip",
        "governor-fold",
        "vs sip",
        "vs fold",
        "check_denial",
        "vs fold"
    );
    for (index, case) in CASES.iter().enumerate() {
        let base = instructions(index, "baseline")? as f64 / case.checks as f64;
        let mut figures = Vec::new();
        for name in INSN_IMPLS {
            figures.push(instructions(index, name)? as f64 / case.checks as f64 - base);
        }
        println!(
            "  {:<22} {:>9.0} {:>13.0} {:>14.0} {:>9} {:>9} {:>18.0} {:>9}",
            case.name,
            figures[0],
            figures[1],
            figures[2],
            ratio(figures[0], figures[1]),
            ratio(figures[0], figures[2]),
            figures[3],
            ratio(figures[3], figures[2])
        );
    }
    Ok(())
}

fn report_bytes() -> Result<(), String> {
    println!("\nresident bytes per key (RSS growth over inserting every key, one process each):");
    println!(
        "  {:<22} {:>9} {:>13} {:>14} {:>9} {:>9}",
        "keys", "portcullis", "governor-sip", "governor-fold", "vs sip", "vs fold"
    );
    for size in [1_000_000, 10_000_000] {
        let figures = IMPLS
            .iter()
            .map(|name| rss_per_key(name, size))
            .collect::<Result<Vec<_>, _>>()?;
        println!(
            "  {:<22} {:>9.1} {:>13.1} {:>14.1} {:>9} {:>9}",
            size,
            figures[0],
            figures[1],
            figures[2],
            ratio(figures[0], figures[1]),
            ratio(figures[0], figures[2])
        );
    }
    Ok(())
}

fn spread(mut ratios: Vec<f64>) -> String {
    ratios.sort_by(f64::total_cmp);
    format!(
        "{:.2} / {:.2} / {:.2}",
        ratios[0],
        ratios[ratios.len() / 2],
        ratios[ratios.len() - 1]
    )
}

fn timed(limiter: &dyn Limiter, keys: &[String], threads: usize, checks: usize) -> Duration {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            scope.spawn(move || {
                black_box(run(
                    limiter,
                    keys,
                    thread * keys.len() / threads,
                    checks / threads,
                ))
            });
        }
    });
    start.elapsed()
}

fn report_wall() {
    const ROUNDS: usize = 15;
    println!("\nwall clock, portcullis / governor per round, min / median / max of {ROUNDS} interleaved rounds:");
    println!(
        "  {:<22} {:>22} {:>22}",
        "case", "vs governor-sip", "vs governor-fold"
    );
    for case in &CASES {
        let limiters: Vec<_> = IMPLS.iter().map(|n| limiter(n, case.quota)).collect();
        let first = first_seen(case.keys);
        for limiter in &limiters {
            run(&**limiter, &first, 0, case.keys);
        }
        let keys = shuffled(case.keys);
        let checks = 200_000;
        let (mut sip, mut fold) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let t: Vec<f64> = limiters
                .iter()
                .map(|l| timed(&**l, &keys, 1, checks).as_secs_f64())
                .collect();
            sip.push(t[0] / t[1]);
            fold.push(t[0] / t[2]);
        }
        println!(
            "  {:<22} {:>22} {:>22}",
            case.name,
            spread(sip),
            spread(fold)
        );
    }
    println!("\ntwo threads on 10k keys, wall time of N checks over 2 threads / over 1 (≤ 1: not slower in aggregate):");
    let keys = shuffled(10_000);
    for name in IMPLS {
        let limiter = limiter(name, Quota_::Whole);
        run(&*limiter, &first_seen(10_000), 0, 10_000);
        let ratios = (0..ROUNDS)
            .map(|_| {
                let one = timed(&*limiter, &keys, 1, 400_000).as_secs_f64();
                let two = timed(&*limiter, &keys, 2, 400_000).as_secs_f64();
                two / one
            })
            .collect();
        println!("  {name:<22} {:>22}", spread(ratios));
    }
}

fn main() {
    if child() {
        return;
    }
    // `cargo bench` passes `--bench`; a filter or `--list` means nothing here.
    let started = Instant::now();
    if let Err(e) = report_instructions().and_then(|()| report_bytes()) {
        eprintln!("memory_cost: {e}");
        std::process::exit(1);
    }
    report_wall();
    println!("\n(done in {:.0} s)", started.elapsed().as_secs_f64());
}
