//! Against the real Redis that `cargo xtask test` starts
//! (`PORTCULLIS_REDIS_URL`): state written through the store and the
//! tower layer, read back, dry-run checked and reset by the binary. Each
//! test keys under a prefix of its own.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use http::{Request, Response};
use portcullis::redis::RedisStore;
use portcullis::tower::{ApiKey, RateLimitLayer};
use portcullis::{
    ConcurrencyPolicy, LeaseId, LeaseStore as _, Policy, ReservationId, ReservationStore as _,
    SettleOutcome, Store as _, TokenBudget,
};
use tower::{Layer as _, ServiceExt as _};

use crate::{
    code, file, json, path_str, portcullis, portcullis_with_env, prefix, redis_url, stderr, stdout,
};

async fn store(prefix: &str) -> RedisStore {
    RedisStore::builder()
        .url(redis_url())
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        // Generous: TLS handshakes of parallel tests on a loaded machine.
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("the store should build on the test server")
}

/// `args` followed by `--redis <url> --prefix <prefix>`.
fn on(prefix: &str, args: &[&str]) -> std::process::Output {
    let url = redis_url();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--redis", &url, "--prefix", prefix]);
    portcullis(&all)
}

/// `"daily";r=2;t=69120` → (2, 69120).
fn ratelimit_fields(value: &str) -> (u64, u64) {
    let field = |name: &str| {
        value
            .split(';')
            .find_map(|part| part.trim().strip_prefix(name))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {value}"))
    };
    (field("r="), field("t="))
}

#[tokio::test]
async fn inspect_after_requests_through_the_layer_shows_its_headers() {
    let prefix = prefix("layer");
    let store = store(&prefix).await;
    let daily = Policy::per_day(5).name("daily").build().unwrap();
    let layer = RateLimitLayer::builder(store.clone())
        .key(ApiKey::new())
        .policy(daily.clone())
        .build()
        .unwrap();
    let service = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let started = Instant::now();
    let mut header = String::new();
    for _ in 0..3 {
        let request = Request::get("/")
            .header("x-api-key", "sk-live-7f3a")
            .body(())
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        assert!(response.status().is_success());
        header = response.headers()["ratelimit"].to_str().unwrap().to_owned();
    }
    let (r, t) = ratelimit_fields(&header);
    assert_eq!(r, 2, "{header}");

    let limits = file(
        &format!("{prefix}.toml"),
        "default = [\"daily\"]\n[policies]\ndaily = { limit = 5, period = \"1d\" }\n",
    );
    for source in [
        &["--policy", "daily"][..],
        &["--limits", path_str(&limits)][..],
    ] {
        let mut args = vec!["--json", "inspect", "sk-live-7f3a", "--as", "api-key"];
        args.extend(source);
        let out = on(&prefix, &args);
        let elapsed = started.elapsed();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(!stdout(&out).contains("sk-live-7f3a"), "the key is printed");
        let report = json(&out);
        let policy = &report["policies"][0];
        assert_eq!(
            policy["key"],
            store.key_for(&portcullis::subject::hash_subject(b"sk-live-7f3a"), "daily")
        );
        let decision = &policy["decision"];
        assert_eq!(decision["remaining"], r);
        assert_eq!(decision["allowed"], true);
        // The reset counts down from the header's `t` by at most the time
        // this test has taken since its first request.
        let reset = decision["reset_secs"].as_u64().unwrap();
        let slack = elapsed.as_secs() + 1;
        assert!(
            reset <= t && reset + slack >= t,
            "reset {reset}, header t={t}, {elapsed:?}"
        );
        let written = &policy["written_under"];
        assert_eq!(written["algorithm"], "gcra");
        assert_eq!(written["limit"], 5);
        assert_eq!(written["period_us"], 86_400_000_000_u64);
        assert_eq!(policy["raw"]["redis_type"], "string");
        assert!(policy["raw"]["expires_in_ms"].as_u64().unwrap() > 0);
    }

    // Nothing above charged: the layer's next request sees r=1.
    let request = Request::get("/")
        .header("x-api-key", "sk-live-7f3a")
        .body(())
        .unwrap();
    let response = service.clone().oneshot(request).await.unwrap();
    let (r, _) = ratelimit_fields(response.headers()["ratelimit"].to_str().unwrap());
    assert_eq!(r, 1);

    // The text report says the same to a person.
    let out = on(
        &prefix,
        &[
            "inspect",
            "sk-live-7f3a",
            "--as",
            "api-key",
            "--policy",
            "daily",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains("remaining      1 of 5"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("written under  gcra 5 per 1d"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test]
async fn check_dry_run_answers_as_a_check_and_charges_nothing() {
    let prefix = prefix("dry");
    let store = store(&prefix).await;
    let policies = [
        // An emission interval of half an hour: no permit comes back while
        // the test runs, however loaded the machine.
        Policy::per_hour(2).name("hourly").build().unwrap(),
        Policy::per_day(100).name("day").build().unwrap(),
    ];
    assert!(store.check("bob", &policies, 1).await.unwrap().is_allowed());

    let args = [
        "--json",
        "check",
        "--dry-run",
        "bob",
        "--policy",
        "hourly",
        "--policy",
        "day",
    ];
    let out = on(&prefix, &args);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["would_admit"], true);
    assert_eq!(report["policies"][0]["decision"]["remaining"], 1);
    assert_eq!(report["policies"][0]["remaining_after"], 0);
    assert_eq!(report["policies"][1]["remaining_after"], 98);
    let peek = store.peek("bob", &policies).await.unwrap();
    assert_eq!(peek.decisions()[0].remaining(), 1, "the dry run charged");

    assert!(store.check("bob", &policies, 1).await.unwrap().is_allowed());
    for _ in 0..2 {
        let out = on(&prefix, &args);
        assert_eq!(code(&out), 1, "denied exits 1: {}", stderr(&out));
        let report = json(&out);
        assert_eq!(report["would_admit"], false);
        assert!(report["retry_after_us"].as_u64().unwrap() > 0);
        assert_eq!(report["policies"][1]["decision"]["remaining"], 98);
    }
    let out = on(&prefix, &args[1..]);
    assert!(
        stdout(&out).contains("would be DENIED, retry after"),
        "{}",
        stdout(&out)
    );
    // As the store itself answers: denied, and the day policy uncharged.
    let verdict = store.check("bob", &policies, 1).await.unwrap();
    assert!(!verdict.is_allowed());
    assert_eq!(verdict.decisions()[1].remaining(), 98);
}

#[tokio::test]
async fn reset_frees_the_subject_on_two_store_instances() {
    let prefix = prefix("reset");
    let (a, b) = (store(&prefix).await, store(&prefix).await);
    let policies = [Policy::per_hour(2).name("hourly").build().unwrap()];
    for _ in 0..2 {
        assert!(a
            .check("203.0.113.9", &policies, 1)
            .await
            .unwrap()
            .is_allowed());
    }
    assert!(!a
        .check("203.0.113.9", &policies, 1)
        .await
        .unwrap()
        .is_allowed());
    assert!(!b
        .check("203.0.113.9", &policies, 1)
        .await
        .unwrap()
        .is_allowed());

    let url = redis_url();
    // The URL from the environment, as the service itself may read it.
    let out = portcullis_with_env(
        &[
            "--json",
            "reset",
            "--yes",
            "::ffff:203.0.113.9",
            "--as",
            "ip",
            "--policy",
            "hourly",
            "--prefix",
            &prefix,
        ],
        &url,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["keys"][0]["had_state"], true);
    assert_eq!(report["keys"][0]["key"], a.key_for("203.0.113.9", "hourly"));

    // Both instances see the full allowance again, and share it.
    for (store, remaining) in [(&a, 1), (&b, 0)] {
        let verdict = store.check("203.0.113.9", &policies, 1).await.unwrap();
        assert!(verdict.is_allowed());
        assert_eq!(verdict.decisions()[0].remaining(), remaining);
    }
}

#[tokio::test]
async fn reset_without_yes_off_a_terminal_refuses_and_writes_nothing() {
    let prefix = prefix("refuse");
    let store = store(&prefix).await;
    let policies = [Policy::per_hour(1).name("hourly").build().unwrap()];
    assert!(store
        .check("carol", &policies, 1)
        .await
        .unwrap()
        .is_allowed());

    let out = on(&prefix, &["reset", "carol", "--policy", "hourly"]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing was written"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
    assert!(
        !store.peek("carol", &policies).await.unwrap().is_allowed(),
        "the state was reset"
    );
}

#[tokio::test]
async fn held_leases_are_counted() {
    let prefix = prefix("lease");
    let store = store(&prefix).await;
    let exports = ConcurrencyPolicy::max_in_flight(3)
        .name("exports")
        .lease_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    for _ in 0..2 {
        assert!(store
            .acquire("tenant-7", &exports, LeaseId::generate())
            .await
            .unwrap()
            .is_granted());
    }
    let out = on(
        &prefix,
        &[
            "--json", "inspect", "tenant-7", "--policy", "api", "--lease", "exports",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["leases"][0]["live"], 2);
    assert_eq!(
        report["leases"][0]["key"],
        store.lease_key_for("tenant-7", "exports")
    );
    assert_eq!(report["policies"][0]["raw"]["redis_type"], "none");
}

/// Two leases and an open reservation of each budget kind (with an open
/// set, and without one: found by SCAN) are shown with their expiries and
/// tokens; once released and settled, none are.
#[tokio::test]
async fn held_leases_and_open_reservations_are_listed_until_released() {
    let prefix = prefix("rsv");
    let store = store(&prefix).await;
    let exports = ConcurrencyPolicy::max_in_flight(3)
        .name("exports")
        .lease_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut leases = Vec::new();
    for _ in 0..2 {
        let id = LeaseId::generate();
        assert!(store
            .acquire("tenant-9", &exports, id)
            .await
            .unwrap()
            .is_granted());
        leases.push(id);
    }
    let tokens = Policy::per_minute(10_000).name("tpm").build().unwrap();
    let streams = TokenBudget::tokens(tokens.clone())
        .name("streams")
        .max_in_flight(4)
        .reservation_ttl(Duration::from_secs(120))
        .build()
        .unwrap();
    let plain = TokenBudget::tokens(tokens)
        .name("plain")
        .reservation_ttl(Duration::from_secs(120))
        .build()
        .unwrap();
    let (held, loose) = (ReservationId::generate(), ReservationId::generate());
    assert!(store
        .reserve("tenant-9", &streams, 700, held)
        .await
        .unwrap()
        .is_admitted());
    assert!(store
        .reserve("tenant-9", &plain, 300, loose)
        .await
        .unwrap()
        .is_admitted());
    // A settled reservation of the same budget is no longer open.
    let settled = ReservationId::generate();
    store
        .reserve("tenant-9", &plain, 50, settled)
        .await
        .unwrap();
    store.settle("tenant-9", &plain, settled, 10).await.unwrap();

    let args = [
        "--json", "inspect", "tenant-9", "--policy", "api", "--lease", "exports", "--budget",
        "streams", "--budget", "plain",
    ];
    let out = on(&prefix, &args);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json(&out);
    let lease = &report["leases"][0];
    assert_eq!(lease["live"], 2);
    let held_ids: Vec<&str> = lease["held"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    for id in &leases {
        assert!(held_ids.contains(&id.to_string().as_str()), "{lease}");
    }
    for l in lease["held"].as_array().unwrap() {
        let left = l["expires_in_us"].as_u64().unwrap();
        assert!(left > 0 && left <= 60_000_000, "{l}");
    }
    let streams_view = &report["reservations"][0];
    assert_eq!(streams_view["budget"], "streams");
    assert_eq!(
        streams_view["key"],
        store.reservation_key_for("tenant-9", "streams")
    );
    assert_eq!(streams_view["found_by"], "open set");
    assert_eq!(streams_view["open"], 1);
    assert_eq!(streams_view["tokens_held"], 700);
    assert_eq!(streams_view["reservations"][0]["id"], held.to_string());
    assert_eq!(streams_view["reservations"][0]["tokens"], 700);
    let left = streams_view["reservations"][0]["expires_in_us"]
        .as_u64()
        .unwrap();
    assert!(left > 0 && left <= 120_000_000, "{streams_view}");
    let plain_view = &report["reservations"][1];
    assert_eq!(plain_view["found_by"], "scan");
    assert_eq!(plain_view["open"], 1, "{plain_view}");
    assert_eq!(plain_view["tokens_held"], 300);
    assert_eq!(plain_view["reservations"][0]["id"], loose.to_string());

    // The text report says the same.
    let text = stdout(&on(&prefix, &args[1..]));
    assert!(text.contains("held           2"), "{text}");
    assert!(
        text.contains("open           1, holding 700 tokens (found by open set)"),
        "{text}"
    );
    assert!(
        text.contains("open           1, holding 300 tokens (found by scan)"),
        "{text}"
    );

    for id in leases {
        assert!(store.release("tenant-9", &exports, id).await.unwrap());
    }
    for (budget, id) in [(&streams, held), (&plain, loose)] {
        let settlement = store.settle("tenant-9", budget, id, 100).await.unwrap();
        assert_eq!(settlement.outcome(), SettleOutcome::Settled);
    }
    let report = json(&on(&prefix, &args));
    assert_eq!(report["leases"][0]["live"], 0);
    assert_eq!(report["leases"][0]["held"], serde_json::json!([]));
    for budget in 0..2 {
        let view = &report["reservations"][budget];
        assert_eq!(view["open"], 0, "{view}");
        assert_eq!(view["tokens_held"], 0, "{view}");
    }
}

/// `reset` on a terminal asks, and only `y` resets. The terminal is
/// util-linux's `script` (a pseudo-terminal), which Debian always has.
#[tokio::test]
async fn reset_on_a_terminal_asks_and_only_yes_resets() {
    let prefix = prefix("tty");
    let store = store(&prefix).await;
    let policies = [Policy::per_hour(1).name("hourly").build().unwrap()];
    assert!(store
        .check("erin", &policies, 1)
        .await
        .unwrap()
        .is_allowed());
    let line = format!(
        "{} reset erin --policy hourly --redis {} --prefix {prefix}",
        env!("CARGO_BIN_EXE_portcullis"),
        redis_url()
    );
    let on_terminal = |answer: &str| {
        let mut child = std::process::Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("util-linux's `script` should run: it gives the binary a terminal");
        let mut stdin = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut stdin, answer.as_bytes()).unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    };
    for refusal in ["n\n", "\n", "yes please\n"] {
        let out = on_terminal(refusal);
        assert_eq!(code(&out), 5, "{refusal:?}: {}", stdout(&out));
        assert!(stdout(&out).contains("[y/N]"), "{}", stdout(&out));
        assert!(
            !store.peek("erin", &policies).await.unwrap().is_allowed(),
            "reset on {refusal:?}"
        );
    }
    let out = on_terminal("y\n");
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(store.peek("erin", &policies).await.unwrap().is_allowed());
}

#[tokio::test]
async fn window_states_are_read_through_the_limits_file() {
    let prefix = prefix("windows");
    let store = store(&prefix).await;
    // Windows of 1000 days, aligned to multiples of 1000 days since the
    // epoch: no window ends while the test runs (the next ends in 2027).
    let window = Policy::per(10, Duration::from_secs(1000 * 86_400))
        .name("window")
        .algorithm(portcullis::Algorithm::FixedWindow)
        .build()
        .unwrap();
    let log = Policy::per_hour(5)
        .name("log")
        .algorithm(portcullis::Algorithm::SlidingLog)
        .build()
        .unwrap();
    let policies = [window, log];
    for _ in 0..3 {
        assert!(store
            .check("gina", &policies, 1)
            .await
            .unwrap()
            .is_allowed());
    }
    let limits = file(
        &format!("{prefix}.toml"),
        "default = [\"window\", \"log\"]\n[policies]\n\
         window = { limit = 10, period = \"1000d\", algorithm = \"fixed_window\" }\n\
         log = { limit = 5, period = \"1h\", algorithm = \"sliding_log\" }\n",
    );
    let out = on(
        &prefix,
        &["--json", "inspect", "gina", "--limits", path_str(&limits)],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json(&out);
    let (window, log) = (&report["policies"][0], &report["policies"][1]);
    assert_eq!(window["decision"]["remaining"], 7);
    assert_eq!(window["raw"]["redis_type"], "string");
    assert_eq!(log["decision"]["remaining"], 2);
    assert_eq!(log["raw"]["redis_type"], "zset");
    assert_eq!(log["raw"]["members"], 3);
    assert_eq!(window["written_under"], serde_json::Value::Null);

    // Without the file, their numbers are unknown: said, not guessed.
    let out = on(
        &prefix,
        &["--json", "inspect", "gina", "--policy", "window"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let policy = &json(&out)["policies"][0];
    assert_eq!(policy["decision"], serde_json::Value::Null);
    assert!(
        policy["note"].as_str().unwrap().contains("--limits"),
        "{policy}"
    );
    let out = on(&prefix, &["check", "--dry-run", "gina", "--policy", "log"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--limits FILE"), "{}", stderr(&out));

    // The file now says GCRA under the same name: the old state counts as
    // none, and the report says why.
    let changed = file(
        &format!("{prefix}-gcra.toml"),
        "default = [\"window\"]\n[policies]\nwindow = { limit = 10, period = \"1000d\" }\n",
    );
    let out = on(
        &prefix,
        &["--json", "inspect", "gina", "--limits", path_str(&changed)],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let policy = &json(&out)["policies"][0];
    assert_eq!(policy["decision"]["remaining"], 10);
    assert!(
        policy["note"]
            .as_str()
            .unwrap()
            .contains("written by fixed_window"),
        "{policy}"
    );
}
