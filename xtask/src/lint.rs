//! The checks `cargo xtask test` runs before the tests: formatting, clippy,
//! each feature of each published crate on its own, rustdoc under each
//! crate's default features (public and private items) and under all of
//! them, the facade's public API, the doc examples in a quick-start project
//! ([`crate::doc_examples`]), packaging of the published crates, and the
//! declared `rust-version`.

use std::process::Command;

use crate::{run_cargo, workspace_root, Error, Result, Stages};

/// The published crates, in dependency order.
const PUBLISHED: [&str; 5] = [
    "portcullis-core",
    "portcullis-redis",
    "portcullis-tower",
    "portcullis",
    "portcullis-envoy",
];

/// Published crates left out of the `cargo package` stage: building
/// `portcullis-envoy`'s packaged copy (Envoy's generated API types) took
/// about 100 s of CI's 15-minute budget, and packaging it apart
/// (`--no-verify`) cannot resolve its path dependencies, which only the
/// packaging of the others provides. It reads no file outside its
/// directory (what that build would catch); the workspace build, clippy,
/// rustdoc and its tests cover it every run.
const UNPACKAGED: [&str; 1] = ["portcullis-envoy"];

/// Published crates whose features are each built by another stage, so
/// that the stage of features alone checks only their build without
/// features: `portcullis-envoy`'s `redis` is its default (clippy and the
/// tests build it) and `tls` only adds the store's TLS (the `--all-features`
/// rustdoc stage builds it). Its three checks added about 60 s to this
/// stage, and the suite ran 14 min 59 s of CI's 15-minute budget.
const BUILT_ELSEWHERE: [&str; 1] = ["portcullis-envoy"];

/// Published crates documented without their default features, after
/// their check without features, and left out of the `--all-features`
/// rustdoc stage: `portcullis-envoy`, whose `redis` feature adds one
/// impl (`DescriptorStore` for `RedisStore`, documented by the trait) and
/// the binary's Redis set-up. Envoy's generated API types
/// (`envoy-types`, 8 MB of source) are then checked once for the
/// feature stage and reused by rustdoc; documented under its defaults, and
/// again under all features, they were checked twice more under features
/// of their own, about 30 s of CI's budget each.
const DOCUMENTED_WITHOUT_FEATURES: [&str; 1] = ["portcullis-envoy"];

/// Each published crate's features, each checked alone (with no default
/// features), after the crate with no features at all. Kept by hand: a
/// feature added to a manifest is added here (`features_are_listed` holds
/// the two equal).
const FEATURES: [(&str, &[&str]); 5] = [
    ("portcullis-core", &["config", "metrics", "testing"]),
    (
        "portcullis-redis",
        &["tls", "tls-webpki-roots", "tls-insecure"],
    ),
    ("portcullis-tower", &["axum", "tonic", "metrics", "testing"]),
    (
        "portcullis",
        &[
            "config",
            "redis",
            "tls",
            "tls-webpki-roots",
            "tls-insecure",
            "tower",
            "axum",
            "tonic",
            "metrics",
            "testing",
        ],
    ),
    ("portcullis-envoy", &["redis", "tls"]),
];

/// How many stages [`run`] adds.
pub(crate) const STAGES: usize = 9;

/// Runs the checks as stages; the first failure stops them.
pub(crate) fn run(stages: &mut Stages) -> Result<()> {
    stages.run("cargo fmt --all -- --check", || {
        run_cargo(
            &["fmt", "--all", "--", "--check"],
            &[],
            "formatting differs: run `cargo fmt --all` and commit the result",
        )
    })?;
    stages.run(
        "cargo clippy --workspace --all-targets -- -D warnings",
        || {
            run_cargo(
                &[
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ],
                &[],
                "clippy found problems (see above): fix them, then rerun `cargo xtask test`",
            )
        },
    )?;
    stages.run(
        "cargo check of each feature of each published crate",
        || {
            for (krate, features) in FEATURES {
                let features = if BUILT_ELSEWHERE.contains(&krate) {
                    &[][..]
                } else {
                    features
                };
                let alone = std::iter::once(None).chain(features.iter().map(Some));
                for feature in alone {
                    let mut args = vec!["check", "--quiet", "-p", krate, "--no-default-features"];
                    if let Some(feature) = feature {
                        args.extend(["--features", feature]);
                    }
                    run_cargo(
                        &args,
                        &[],
                        "a crate does not build with this feature alone: a `#[cfg(feature)]` or a \
                     feature's dependency list is missing something",
                    )?;
                }
            }
            Ok(())
        },
    )?;
    let rustdoc_hint = "rustdoc found problems (a broken intra-doc link, a bad code block): \
                        fix them, then rerun `cargo xtask test`";
    // Each published crate alone, under its default features, as a user
    // of the defaults has it (in the workspace, the examples and tests
    // would turn on features). One crate at a time, after the stage above:
    // each crate's dependencies then resolve as in that stage's check of
    // the crate, so rustdoc finds them checked (about 5 s in a clean-clone
    // run, against 30 s for the crates together, whose features unify into
    // a build of their own).
    let without = DOCUMENTED_WITHOUT_FEATURES.join(", ");
    stages.run(
        &format!(
            "RUSTDOCFLAGS=\"-D warnings\" cargo doc --no-deps -p <crate> [--document-private-items], \
             each published crate under its default features ({without} without features)"
        ),
        || {
            for krate in PUBLISHED {
                let mut args = vec!["doc", "--no-deps", "-p", krate];
                if DOCUMENTED_WITHOUT_FEATURES.contains(&krate) {
                    args.push("--no-default-features");
                }
                run_cargo(
                    &args,
                    &[("RUSTDOCFLAGS", "-D warnings".to_owned())],
                    rustdoc_hint,
                )?;
                // Then with the private items, whose docs a newcomer reads in
                // the source: their links must lead somewhere too (about 1 s
                // a crate; the public run above is still needed, as only it
                // sees a public item's link to a private one).
                args.push("--document-private-items");
                run_cargo(
                    &args,
                    &[("RUSTDOCFLAGS", "-D warnings".to_owned())],
                    rustdoc_hint,
                )?;
            }
            Ok(())
        },
    )?;
    let mut all_features = vec!["doc", "--workspace", "--no-deps", "--all-features"];
    for krate in DOCUMENTED_WITHOUT_FEATURES {
        all_features.extend(["--exclude", krate]);
    }
    stages.run(
        &format!(
            "RUSTDOCFLAGS=\"-D warnings\" cargo {}",
            all_features.join(" ")
        ),
        || {
            run_cargo(
                &all_features,
                &[("RUSTDOCFLAGS", "-D warnings".to_owned())],
                rustdoc_hint,
            )
        },
    )?;
    // The docs just built are the facade's surface: it must match the list
    // under version control (`xtask/src/public_api.rs`).
    stages.run(
        "the facade's public API against api/portcullis.txt",
        crate::public_api::check,
    )?;
    stages.run(
        "the doc examples in a project with only the quick start's dependencies",
        crate::doc_examples::check,
    )?;
    stages.run("cargo package of the published crates", || {
        forget_packaged_copies();
        let mut args = vec!["package", "--allow-dirty"];
        for krate in PUBLISHED.iter().filter(|k| !UNPACKAGED.contains(k)) {
            args.extend(["-p", krate]);
        }
        run_cargo(
            &args,
            &[],
            "a crate does not package or its packaged copy does not build (a file outside the \
             crate, a path dependency without a version): see above",
        )
    })?;
    stages.run("rust-version", rust_version)
}

/// Removes the copies of our own crates that an earlier `cargo package` of
/// this checkout left unpacked in Cargo's registry sources.
///
/// `cargo package` verifies each crate against the others' packaged copies
/// through a local registry in `target/package/tmp-registry`, which Cargo
/// unpacks under `$CARGO_HOME/registry/src/<hash of that path>/` once per
/// version and never again, and builds it once into the target directory
/// (a registry crate of an unchanged version is never rebuilt): with the
/// version unchanged, a later run verifies against the old sources and
/// fails on any item added since. So our crates' unpacked directories in
/// registries other than crates.io are removed, and our crates' compiled
/// artifacts in `target/debug` (the workspace's own are rebuilt from the
/// sources by the next stage, as they would be anyway after a change).
fn forget_packaged_copies() {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || crate::workspace_root().join("target"),
            std::path::PathBuf::from,
        )
        .join("debug");
    for dir in [target.join("deps"), target.join(".fingerprint")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("libportcullis") || name.starts_with("portcullis") {
                let path = entry.path();
                let _ = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
            }
        }
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
    let Some(sources) = home.map(|h| h.join("registry").join("src")) else {
        return;
    };
    let Ok(registries) = std::fs::read_dir(&sources) else {
        return;
    };
    for registry in registries.flatten() {
        if registry
            .file_name()
            .to_string_lossy()
            .starts_with("index.crates.io-")
        {
            continue;
        }
        let Ok(crates) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for unpacked in crates.flatten() {
            let name = unpacked.file_name().to_string_lossy().into_owned();
            // `<crate>-<version>`: the crate name, a dash, a digit.
            let ours = PUBLISHED.iter().any(|krate| {
                name.strip_prefix(krate)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
            });
            if ours && std::fs::remove_dir_all(unpacked.path()).is_ok() {
                println!(
                    "    removed a stale packaged copy: {}",
                    unpacked.path().display()
                );
            }
        }
    }
}

/// Checks that this run builds with the workspace's declared
/// `rust-version`: the active `rustc` is that version, or that toolchain is
/// installed and checks the published crates.
fn rust_version() -> Result<()> {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml"))
        .map_err(|e| Error::new(format!("could not read the workspace Cargo.toml: {e}")))?;
    let declared = manifest
        .lines()
        .find_map(|line| line.trim().strip_prefix("rust-version = "))
        .map(|value| value.trim_matches('"').to_owned())
        .ok_or_else(|| Error::new("the workspace Cargo.toml declares no rust-version"))?;
    let active = Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .unwrap_or_default();
    let active_version = active.split_whitespace().nth(1).unwrap_or("");
    if same_release(active_version, &declared) {
        println!(
            "rust-version {declared}: this run builds with {}",
            active.trim()
        );
        return Ok(());
    }
    let toolchains = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .unwrap_or_default();
    if !toolchains
        .lines()
        .any(|line| line.starts_with(&declared) || line.starts_with(&format!("{declared}.")))
    {
        return Err(Error::new(format!(
            "the workspace declares rust-version {declared}, but this run builds with {} and \
             toolchain {declared} is not installed: install it (`rustup toolchain install \
             {declared}`) or declare the version that is tested",
            active.trim()
        )));
    }
    let toolchain = format!("+{declared}");
    let mut args = vec![toolchain.as_str(), "check", "--all-features"];
    for krate in PUBLISHED {
        args.extend(["-p", krate]);
    }
    run_cargo(
        &args,
        &[],
        "the published crates do not build with the declared rust-version",
    )
}

/// Whether `version` (`1.95.0`) is the release `declared` names (`1.95`
/// or `1.95.0`).
fn same_release(version: &str, declared: &str) -> bool {
    version == declared
        || version
            .strip_prefix(declared)
            .is_some_and(|rest| rest.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_match_by_their_declared_parts() {
        assert!(same_release("1.95.0", "1.95"));
        assert!(same_release("1.95.0", "1.95.0"));
        assert!(!same_release("1.95.0", "1.9"));
        assert!(!same_release("1.96.0", "1.95"));
    }

    #[test]
    fn features_are_listed() {
        for (krate, listed) in FEATURES {
            let dir = if krate == "portcullis" {
                "crates/portcullis".to_owned()
            } else {
                format!("crates/{krate}")
            };
            let manifest =
                std::fs::read_to_string(workspace_root().join(dir).join("Cargo.toml")).unwrap();
            let mut in_features = false;
            let mut declared = Vec::new();
            for line in manifest.lines() {
                if line.starts_with('[') {
                    in_features = line == "[features]";
                    continue;
                }
                if let Some((name, _)) = line.split_once(" = ")
                    && in_features
                    && !name.starts_with('#')
                    && name != "default"
                {
                    declared.push(name.trim().to_owned());
                }
            }
            let mut listed: Vec<String> = listed.iter().map(|f| (*f).to_owned()).collect();
            listed.sort();
            declared.sort();
            assert_eq!(listed, declared, "{krate}");
        }
    }
}
