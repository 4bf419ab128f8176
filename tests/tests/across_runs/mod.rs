//! The runs of a batch across subjects (lua/batch_each.lua): consecutive
//! checks sent to the same function (a plan's letters on the `EVALSHA`
//! path) with the same counts go as one run that names it once. What the
//! two across tests (`redis_coalesce`'s on Functions, `evalsha_across` on
//! `EVALSHA`) share: an order of policy sets that makes runs of one, two
//! and three checks, alternating; the batches the client sent, read from
//! `MONITOR`, whose runs must add up and be as long as they can; and
//! batches whose runs miscount, which the batch answers with an error
//! reply having decided nothing. (A module of `redis_coalesce`, which runs
//! it.)

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

/// A run as sent: (name, keys, arguments, checks) of each check.
pub(crate) type Run = (String, usize, usize, usize);

/// The runs of each batch across subjects that `MONITOR` (`monitor`)
/// showed for a call of `command` (`EVALSHA`, say) with more than two
/// keys (a check alone has one per policy), up to `ECHO <marker>`, each
/// batch read as lua/batch_each.lua lays it out: its counts must add up
/// exactly (the keys, the checks, the arguments).
pub(crate) fn batches_sent(
    monitor: &mut impl std::io::BufRead,
    command: &str,
    marker: &str,
) -> Vec<Vec<Run>> {
    let mut batches = Vec::new();
    loop {
        let mut line = String::new();
        let read = monitor.read_line(&mut line).expect("a MONITOR line");
        assert!(read > 0, "MONITOR ended before {marker}");
        let Some((_, quoted)) = line.trim_end().split_once("] ") else {
            continue;
        };
        let args = unquote(quoted);
        if args.len() == 2 && args[0].eq_ignore_ascii_case("echo") && args[1] == marker {
            return batches;
        }
        if !args[0].eq_ignore_ascii_case(command) {
            continue;
        }
        let number = |i: usize| -> usize {
            args.get(i)
                .and_then(|text| text.parse().ok())
                .unwrap_or_else(|| panic!("argument {i} of {args:?} is not a count"))
        };
        let keys = number(2);
        if keys <= 2 {
            continue;
        }
        let m = number(3 + keys);
        let (mut a, mut checks, mut run_keys, mut runs) = (4 + keys, 0_usize, 0_usize, Vec::new());
        while checks < m {
            let (nk, na, n) = (number(a + 1), number(a + 2), number(a + 3));
            runs.push((args[a].clone(), nk, na, n));
            checks = checks.saturating_add(n);
            run_keys = run_keys.saturating_add(n.saturating_mul(nk));
            a = a.saturating_add(n.saturating_mul(na)).saturating_add(4);
        }
        assert_eq!(
            (checks, run_keys, a),
            (m, keys, args.len()),
            "a batch's runs do not add up: {args:?}"
        );
        batches.push(runs);
    }
}

/// The arguments of a `MONITOR` line: `"a" "b\x00"...`, unescaped.
fn unquote(quoted: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        arg.push(char::from(u8::from_str_radix(&hex, 16).unwrap_or(b'?')));
                    }
                    Some('n') => arg.push('\n'),
                    Some('r') => arg.push('\r'),
                    Some('t') => arg.push('\t'),
                    Some(other) => arg.push(other),
                    None => break,
                },
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    args
}

/// Reads the batches across subjects sent as `command` (`FCALL` or
/// `EVALSHA`) that `monitor` showed until now (it sends an `ECHO` on
/// `raw` to mark the end): each sent as runs that add up, never two in a
/// row of the same name and counts, and some run of three checks or more
/// (the three checks of one set in a row of [`RUNS`]).
pub(crate) fn assert_sent_as_runs(
    monitor: &mut impl std::io::BufRead,
    raw: &mut redis::Connection,
    command: &str,
) {
    let marker = "end of the rounds";
    let () = redis::cmd("ECHO").arg(marker).query(raw).expect("ECHO");
    let batches = batches_sent(monitor, command, marker);
    assert!(
        !batches.is_empty(),
        "MONITOR showed no batch across subjects"
    );
    for runs in &batches {
        for pair in runs.windows(2) {
            assert!(
                (&pair[0].0, pair[0].1, pair[0].2) != (&pair[1].0, pair[1].1, pair[1].2),
                "two runs in a row of one name and counts: {runs:?}"
            );
        }
    }
    let longest = batches.iter().flatten().map(|run| run.3).max();
    assert!(
        longest >= Some(3),
        "no batch sent three checks of one set in a row as one run: {batches:?}"
    );
}
