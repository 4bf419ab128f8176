//! `portcullis top` end to end: two app instances share a Redis store,
//! each layer counts its denials in its own `TopDenied` and serves it on
//! an admin route (axum, in the test); the binary fetches both and merges
//! them. And the endpoints that are not such a table.

use std::convert::Infallible;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use portcullis::redis::RedisStore;
use portcullis::tower::{Header, RateLimitLayer, TopDenied};
use portcullis::Policy;
use tower::{Layer as _, ServiceExt as _};

use crate::{code, json, portcullis, prefix, redis_url, stderr, stdout};

/// Serves `router` on a free port; its base URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{address}")
}

/// The binary, off the runtime's threads (the servers run on them).
async fn run(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        portcullis(&args)
    })
    .await
    .unwrap()
}

/// One app instance: a layer over the shared store with its own table;
/// sends `requests` of each subject, returns how many were denied each.
async fn instance(store: &RedisStore, top: &TopDenied, requests: &[(&str, usize)]) -> Vec<usize> {
    let layer = RateLimitLayer::builder(store.clone())
        .policy(Policy::per_hour(2).name("hourly").build().unwrap())
        .key(Header::new(http::HeaderName::from_static("x-user")))
        .top_denied(top.clone())
        .build()
        .unwrap();
    let service = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let mut denied = Vec::new();
    for (user, n) in requests {
        let mut count = 0;
        for _ in 0..*n {
            let request = Request::get("/").header("x-user", *user).body(()).unwrap();
            let response = service.clone().oneshot(request).await.unwrap();
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                count += 1;
            }
        }
        denied.push(count);
    }
    denied
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_merges_the_instances_tables() {
    let prefix = prefix("top");
    let store = RedisStore::builder()
        .url(redis_url())
        .prefix(prefix.as_str())
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let (a, b) = (TopDenied::new(100), TopDenied::new(100));
    // Repeated denials of one subject on one instance are answered by its
    // deny cache: they count as every other denial does.
    let denied_a = instance(&store, &a, &[("alice", 6), ("bob", 2)]).await;
    let denied_b = instance(&store, &b, &[("alice", 2), ("carol", 5)]).await;
    assert_eq!(denied_a, [4, 0]);
    assert_eq!(denied_b, [2, 3]);

    let route = |top: TopDenied| {
        Router::new().route(
            "/admin/top-denied",
            get(move || {
                let top = top.clone();
                async move { ([("content-type", "application/json")], top.to_json()) }
            }),
        )
    };
    let url_a = format!("{}/admin/top-denied", serve(route(a)).await);
    let url_b = format!("{}/admin/top-denied", serve(route(b)).await);

    let out = run(vec![
        "--json".into(),
        "top".into(),
        url_a.clone(),
        url_b.clone(),
    ])
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["command"], "top");
    assert_eq!(report["sources"][0]["denials"], 4);
    assert_eq!(report["sources"][1]["denials"], 5);
    assert_eq!(report["subjects"], 2);
    let entries = report["entries"].as_array().unwrap();
    let row = |e: &serde_json::Value| {
        (
            e["subject"].as_str().unwrap().to_owned(),
            e["policy"].as_str().unwrap().to_owned(),
            e["count"].as_u64().unwrap(),
            e["at_least"].as_u64().unwrap(),
            e["at_most"].as_u64().unwrap(),
        )
    };
    assert_eq!(
        entries.iter().map(row).collect::<Vec<_>>(),
        [
            ("alice".to_owned(), "hourly".to_owned(), 6, 6, 6),
            ("carol".to_owned(), "hourly".to_owned(), 3, 3, 3),
        ]
    );

    // The table, and --limit (URLs also separated by a comma).
    let out = run(vec![
        "top".into(),
        format!("{url_a},{url_b}"),
        "--limit".into(),
        "1".into(),
    ])
    .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("DENIED  BOUNDS  POLICY  SUBJECT"), "{text}");
    assert!(text.contains("     6  exact   hourly  alice"), "{text}");
    assert!(!text.contains("carol"), "{text}");
    assert!(text.contains("1 more (--limit N)"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_that_are_not_tables_are_exit_6_with_what_to_do() {
    let base = serve(
        Router::new()
            .route("/html", get(|| async { "<html>hello</html>" }))
            .route(
                "/other",
                get(|| async { r#"{"format":"portcullis.top_denied","version":2,"entries":[]}"# }),
            ),
    )
    .await;
    let cases = [
        (format!("{base}/html"), "did not answer JSON"),
        (format!("{base}/other"), "version 2"),
        (format!("{base}/missing"), "404"),
        (
            "http://127.0.0.1:1/admin/top-denied".to_owned(),
            "cannot reach",
        ),
    ];
    for (url, says) in cases {
        let out = run(vec![
            "top".into(),
            url.clone(),
            "--timeout".into(),
            "2s".into(),
        ])
        .await;
        assert_eq!(code(&out), 6, "{url}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{url}: {}", stderr(&out));
        let out = run(vec!["--json".into(), "top".into(), url.clone()]).await;
        let error: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
        assert_eq!(error["exit_code"], 6, "{url}");
    }
    let out = run(vec!["top".into(), "https://example.invalid/top".into()]).await;
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("plain http://"), "{}", stderr(&out));
}
