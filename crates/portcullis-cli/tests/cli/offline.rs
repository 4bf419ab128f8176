//! What needs no server: limits files (validate, diff, and as the source
//! of a subject's policies), input refused before any connection, and
//! the tool's README's copy of `--help`.

use crate::{code, file, json, path_str, portcullis, portcullis_with_stdin, stderr, stdout};

const VALID: &str = r#"default = ["api-minute", "api-day"]

[policies]
api-minute = { limit = 5, period = "1m" }
api-day = { limit = 100, period = "1d", algorithm = "fixed_window" }
pro-minute = { limit = 50, period = "1m", burst = 10 }

[tiers]
pro = ["pro-minute"]

[overrides]
"customer:globex" = { tier = "pro" }
"#;

#[test]
fn invalid_limits_files_are_refused_with_file_line_and_column() {
    let bad = file(
        "bad-period.toml",
        "default = [\"api\"]\n[policies]\napi = { limit = 5, period = \"1 minute\" }\n",
    );
    let out = portcullis(&["limits", "validate", path_str(&bad)]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let expected = format!("{}:3:", bad.display());
    assert!(stderr(&out).contains(&expected), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("policies.api.period"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());

    // A name that refers to nothing, on its own line.
    let dangling = file(
        "dangling.toml",
        "default = [\"api\"]\n[policies]\napi = { limit = 5, period = \"1m\" }\n[tiers]\npro = [\"missing\"]\n",
    );
    let out = portcullis(&["--json", "limits", "validate", path_str(&dangling)]);
    assert_eq!(code(&out), 3);
    let error: serde_json::Value = serde_json::from_slice(&out.stderr).expect("JSON error");
    assert_eq!(error["exit_code"], 3);
    let message = error["error"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("{}:5:", dangling.display())),
        "{message}"
    );

    // Every file is read, each error reported; the valid one passes.
    let valid = file("valid.toml", VALID);
    let out = portcullis(&[
        "limits",
        "validate",
        path_str(&valid),
        path_str(&bad),
        path_str(&dangling),
    ]);
    assert_eq!(code(&out), 3);
    assert_eq!(stderr(&out).lines().count(), 2, "{}", stderr(&out));
    let out = portcullis(&["--json", "limits", "validate", path_str(&valid)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["files"][0]["policies"], 3);
    assert_eq!(report["files"][0]["tiers"], 1);
    assert_eq!(report["files"][0]["overrides"], 1);

    // Missing files and the same file given to inspect.
    let out = portcullis(&["limits", "validate", "/nonexistent/limits.toml"]);
    assert_eq!(code(&out), 3);
    assert!(
        stderr(&out).contains("/nonexistent/limits.toml"),
        "{}",
        stderr(&out)
    );
    let out = portcullis(&["inspect", "alice", "--limits", path_str(&bad)]);
    assert_eq!(code(&out), 3);
    assert!(stderr(&out).contains(&expected), "{}", stderr(&out));
}

#[test]
fn limits_diff_lists_what_changed_and_exits_1() {
    let old = file("old.toml", VALID);
    let new = file(
        "new.toml",
        &VALID
            .replace("limit = 5, period = \"1m\"", "limit = 10, period = \"1m\"")
            .replace(
                "pro = [\"pro-minute\"]",
                "pro = [\"pro-minute\"]\nteam = [\"pro-minute\"]",
            )
            .replace(
                "\"customer:globex\" = { tier = \"pro\" }",
                "\"customer:acme\" = { tier = \"team\" }",
            ),
    );
    let out = portcullis(&["limits", "diff", path_str(&old), path_str(&old)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("the same limits"));

    let out = portcullis(&["--json", "limits", "diff", path_str(&old), path_str(&new)]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let changes = json(&out)["changes"].as_array().unwrap().clone();
    let find = |item: &str, name: &str| {
        changes
            .iter()
            .find(|c| c["item"] == item && c["name"] == name)
            .unwrap_or_else(|| panic!("no {item} {name} in {changes:?}"))
            .clone()
    };
    let minute = find("policy", "api-minute");
    assert_eq!(minute["change"], "changed");
    assert_eq!(minute["old"], "gcra 5 per 1m");
    assert_eq!(minute["new"], "gcra 10 per 1m");
    assert_eq!(find("tier", "team")["change"], "added");
    assert_eq!(find("override", "customer:globex")["change"], "removed");
    assert_eq!(find("override", "customer:acme")["new"], "tier team");
    assert_eq!(changes.len(), 4, "{changes:?}");

    let out = portcullis(&["limits", "diff", path_str(&old), path_str(&new)]);
    assert_eq!(code(&out), 1);
    assert!(
        stdout(&out).contains("~ policy api-minute: changed: gcra 5 per 1m -> gcra 10 per 1m"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_limits_file_alone_shows_the_policies_the_layer_would_select() {
    let limits = file("select.toml", VALID);
    let out = portcullis(&[
        "--json",
        "inspect",
        "customer:globex",
        "--limits",
        path_str(&limits),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let report = json(&out);
    assert_eq!(report["store"], serde_json::Value::Null);
    assert_eq!(report["policies"][0]["policy"], "pro-minute");
    assert_eq!(
        report["policies"][0]["key"],
        "portcullis:{customer:globex}:pro-minute"
    );
    assert_eq!(report["policies"][0]["current"]["capacity"], 10);

    let out = portcullis(&[
        "--json",
        "inspect",
        "someone",
        "--limits",
        path_str(&limits),
        "--tier",
        "pro",
    ]);
    assert_eq!(json(&out)["policies"][0]["policy"], "pro-minute");
    let out = portcullis(&[
        "inspect",
        "someone",
        "--limits",
        path_str(&limits),
        "--tier",
        "gold",
    ]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("no tier \"gold\"; its tiers: pro"),
        "{}",
        stderr(&out)
    );
    let out = portcullis(&[
        "inspect",
        "someone",
        "--limits",
        path_str(&limits),
        "--policy",
        "nope",
    ]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("api-minute, api-day"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn hostile_subjects_and_policy_names_are_refused_with_a_reason() {
    let huge = "x".repeat(70 * 1024);
    let cases: [(&[&str], &str); 7] = [
        (&["inspect", &huge, "--policy", "api"], "at most 65536"),
        (&["inspect", "", "--policy", "api"], "empty"),
        (
            &["inspect", "k\u{1}1", "--as", "api-key", "--policy", "api"],
            "control characters",
        ),
        (
            &["inspect", "   ", "--as", "bearer", "--policy", "api"],
            "keys no request",
        ),
        (
            &["inspect", "300.1.2.3", "--as", "ip", "--policy", "api"],
            "IPv4 or IPv6",
        ),
        (&["inspect", "alice", "--policy", "a}b"], "policy \"a}b\""),
        (&["check", "alice", "--policy", "api"], "--dry-run"),
    ];
    for (args, expected) in cases {
        let out = portcullis(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // With --json, a refused command line is a JSON error too.
    let out = portcullis(&["--json", "check", "alice", "--policy", "api"]);
    assert_eq!(code(&out), 2);
    let error: serde_json::Value = serde_json::from_slice(&out.stderr).expect("a JSON error");
    assert_eq!(error["exit_code"], 2);
    assert!(
        error["error"].as_str().unwrap().contains("--dry-run"),
        "{error}"
    );
    // A huge policy name: refused, and the message stays short.
    let long_name = "p".repeat(100_000);
    let out = portcullis(&["inspect", "alice", "--policy", &long_name]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).len() < 1_000, "{} bytes", stderr(&out).len());
    // Without a store nothing is read; without policies nothing is known.
    let out = portcullis(&["inspect", "alice", "--policy", "api"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("--redis URL"), "{}", stderr(&out));
    for (url, prefix) in [
        ("http://127.0.0.1:1", "p"),
        ("redis://127.0.0.1:1", "bad{prefix"),
    ] {
        let out = portcullis(&[
            "inspect", "alice", "--policy", "api", "--redis", url, "--prefix", prefix,
        ]);
        assert_eq!(code(&out), 2, "{url} {prefix}: {}", stderr(&out));
    }
    let out = portcullis(&["inspect", "alice", "--redis", "redis://127.0.0.1:1"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("--limits FILE"), "{}", stderr(&out));
}

#[test]
fn a_secret_subject_never_appears_in_the_output() {
    let limits = file("secret.toml", VALID);
    for json_flag in [true, false] {
        let mut args = vec![
            "inspect",
            "sk-live-hunter2",
            "--as",
            "api-key",
            "--limits",
            path_str(&limits),
        ];
        if json_flag {
            args.insert(0, "--json");
        }
        let out = portcullis(&args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(!stdout(&out).contains("hunter2"), "{}", stdout(&out));
        assert!(stdout(&out).contains(&portcullis::subject::hash_subject(b"sk-live-hunter2")));
    }
    // `-` reads it from stdin, out of the shell's history and `ps`.
    let args = [
        "--json",
        "inspect",
        "-",
        "--as",
        "api-key",
        "--limits",
        path_str(&limits),
    ];
    let out = portcullis_with_stdin(&args, "sk-live-hunter2\r\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stdout(&out).contains("hunter2"), "{}", stdout(&out));
    let hashed = portcullis::subject::hash_subject(b"sk-live-hunter2");
    assert_eq!(json(&out)["subject"]["layer_key"], hashed.as_str());
    let out = portcullis_with_stdin(
        &["--json", "inspect", "-", "--limits", path_str(&limits)],
        "customer:globex\n",
    );
    assert_eq!(json(&out)["subject"]["given"], "customer:globex");
    assert_eq!(json(&out)["policies"][0]["policy"], "pro-minute");
    // Nothing on stdin is an empty subject; too much is refused unread.
    let out = portcullis_with_stdin(&["inspect", "-", "--limits", path_str(&limits)], "");
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("empty"), "{}", stderr(&out));
    let huge = "k".repeat(200 * 1024);
    let out = portcullis_with_stdin(&["inspect", "-", "--limits", path_str(&limits)], &huge);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("at most 65536"), "{}", stderr(&out));
}

/// The tool's README ("Reference") shows `portcullis --help` and
/// `portcullis inspect -h` as the binary prints them.
#[test]
fn the_readme_shows_the_help_the_binary_prints() {
    let readme_path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(readme_path).expect("the tool's README");
    let section = readme
        .split("\n## Reference\n")
        .nth(1)
        .expect("the tool's README has a section \"Reference\"");
    let section = section.split("\n## ").next().unwrap_or(section);
    for args in [&["--help"][..], &["inspect", "-h"][..]] {
        let out = portcullis(args);
        assert_eq!(code(&out), 0);
        let shown = format!("$ portcullis {}\n{}```", args.join(" "), stdout(&out));
        assert!(
            section.contains(&shown),
            "crates/portcullis-cli/README.md's \"Reference\" should hold, in a text block:\n{shown}"
        );
    }
}
