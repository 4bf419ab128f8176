//! The runs of a batch across subjects (lua/batch_each.lua): consecutive
//! checks sent to the same function (a plan's letters on the `EVALSHA`
//! path) with the same counts go as one run that names it once. What the
//! two across tests (`redis_coalesce`'s on Functions, `evalsha_across` on
//! `EVALSHA`) share: an order of policy sets that makes runs of one, two
//! and three checks, alternating, and batches whose runs miscount, which
//! the batch answers with an error reply having decided nothing. (A module
//! of `redis_coalesce`, which runs it.)

/// Indices into `policy_sets()` by a check's place in a round: runs of
/// one, two and three checks of a one-policy GCRA set (0), the
/// two-policy set (12) alternating with it, and a run of one of the token
/// bucket (2) between. (The round's first two checks go at once, so its
/// batch begins two places in.)
pub(crate) const RUNS: [usize; 12] = [0, 0, 0, 12, 0, 12, 12, 2, 0, 0, 12, 2];

/// Batches of one function (`name`) whose runs miscount, on fresh keys
/// under `prefix`: each is an error reply that asks to upgrade
/// portcullis-redis (not a Lua error), and none decides a check, not even
/// the well-formed run before a bad one. `head` is the call of the batch
/// (`FCALL <mixed>` or `EVALSHA <sha>`) and `check` one check's arguments.
pub(crate) fn malformed_batches(
    raw: &mut redis::Connection,
    head: impl Fn() -> redis::Cmd,
    name: &str,
    check: &[&str],
    prefix: &str,
) {
    let na = check.len().to_string();
    let na = na.as_str();
    let keys: Vec<String> = (0..3).map(|i| format!("{prefix}:{{bad{i}}}:a")).collect();
    // (what, keys, m, runs: (name, keys, arguments, checks, how many
    // checks' arguments follow), arguments after the runs)
    let one = |n: &'static str, follow: usize| (name, "1", na, n, follow);
    let none: Vec<&str> = Vec::new();
    let cases = vec![
        (
            "a run counts more checks than m",
            2,
            "2",
            vec![one("3", 2)],
            none.clone(),
        ),
        (
            "a run counts more checks than it sends",
            3,
            "3",
            vec![one("3", 2)],
            none.clone(),
        ),
        (
            "a good run, then one that counts too many",
            2,
            "2",
            vec![one("1", 1), one("5", 1)],
            none.clone(),
        ),
        (
            "a run of no checks",
            2,
            "2",
            vec![one("0", 0), one("2", 2)],
            none.clone(),
        ),
        (
            "a run of inf checks",
            1,
            "1",
            vec![one("inf", 1)],
            none.clone(),
        ),
        (
            "a run of nan checks",
            1,
            "1",
            vec![one("nan", 1)],
            none.clone(),
        ),
        (
            "a run of 1.5 checks",
            1,
            "1",
            vec![one("1.5", 1)],
            none.clone(),
        ),
        (
            "a run of -1 checks",
            1,
            "1",
            vec![one("-1", 1)],
            none.clone(),
        ),
        (
            "a check of more keys than sent",
            1,
            "1",
            vec![(name, "2", na, "1", 1)],
            none.clone(),
        ),
        (
            "a check of no arguments",
            1,
            "1",
            vec![(name, "1", "0", "1", 0)],
            none.clone(),
        ),
        (
            "a header cut short",
            2,
            "2",
            vec![one("1", 1)],
            vec![name, "1"],
        ),
        (
            "arguments left over",
            1,
            "1",
            vec![one("1", 1)],
            vec!["extra"],
        ),
        (
            "an unknown name",
            1,
            "1",
            vec![("nothing", "1", na, "1", 1)],
            none.clone(),
        ),
    ];
    for (what, key_count, m, runs, tail) in cases {
        let mut cmd = head();
        cmd.arg(key_count).arg(&keys[..key_count]).arg(m);
        for (name, nk, na, n, follow) in runs {
            cmd.arg(name).arg(nk).arg(na).arg(n);
            for _ in 0..follow {
                cmd.arg(check);
            }
        }
        cmd.arg(tail);
        let reply: redis::RedisResult<redis::Value> = cmd.query(raw);
        let error = match reply {
            Err(error) => error.to_string(),
            Ok(value) => panic!("{what}: the batch answered {value:?}, not an error"),
        };
        assert!(
            error.contains("portcullis: a mixed batch")
                && error.contains("upgrade portcullis-redis"),
            "{what}: the batch failed otherwise than with its error reply: {error}"
        );
        let written: u64 = redis::cmd("EXISTS").arg(&keys).query(raw).expect("EXISTS");
        assert_eq!(written, 0, "{what}: a refused batch decided a check");
    }
}

/// The policy set (an index into `policy_sets()`, of `sets` sets) and the
/// subject of check `i` of round `round`, in a test of `rounds` rounds of
/// each order: the first `rounds` rounds take the sets in turn, on subjects
/// `s<i>`; the others [`RUNS`], on subjects `r<i>` (a subject keeps its
/// policy set).
pub(crate) fn rounds(
    sets: usize,
    rounds: u64,
) -> (impl Fn(u64, usize) -> usize, impl Fn(u64, usize) -> String) {
    assert!(
        RUNS.iter().all(|&set| set < sets),
        "RUNS names a set of policy_sets()"
    );
    (
        move |round, i| {
            if round < rounds {
                i % sets
            } else {
                RUNS[i % RUNS.len()]
            }
        },
        move |round, i| format!("{}{i}", if round < rounds { "s" } else { "r" }),
    )
}
