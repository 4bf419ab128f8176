//! The doc examples a facade user reads, compiled in the project the
//! README's quick start sets up:
//!
//! ```text
//! cargo add portcullis --features axum && cargo add axum && cargo add tokio --features full
//! ```
//!
//! `cargo xtask doc-examples` (and a stage of `cargo xtask test`'s checks)
//! writes one crate, `<target dir>/doc-examples/`, whose dependencies are
//! exactly those three (`portcullis` by path, with the features the docs
//! themselves name: `axum`, `redis`, `tonic`, `config`, `metrics`, `tls`;
//! `axum` and `tokio` as `cargo add` gives them), puts every Rust code block
//! of the family's doc comments (`crates/*/src/**.rs`) and of the two
//! READMEs into a module of its own, and runs one `cargo check` of it in
//! the workspace's target directory (so the dependencies are compiled
//! once and reused).
//!
//! An example that needs more says so on its first line, as a reader
//! would see it: `// Also add: cargo add http` (several crates and `&&`
//! are allowed; `--features …` is read and ignored). Those crates are
//! dependencies of the generated crate under another name
//! (`doc_dep_http`), made visible as `http` only inside the modules of the
//! examples that ask for them, so an example that uses `http` without
//! saying so fails.
//!
//! Blocks are read as rustdoc reads them: a fence without a language or
//! with `rust`/`no_run`/`should_panic`/`editionNNNN` is Rust; `ignore`,
//! `compile_fail` and other languages are skipped; `# ` lines are compiled
//! but hidden. Each block becomes the body of a function (rustdoc's
//! wrapping, with `Result` when it ends in `(())`), so items, `use`s and a
//! `#[tokio::main] async fn main` all compile as they do in a doctest.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{workspace_root, Error, Result};

/// Where the Rust sources with doc comments live, from the workspace root.
const SOURCES: [&str; 4] = [
    "crates/portcullis/src",
    "crates/portcullis-core/src",
    "crates/portcullis-tower/src",
    "crates/portcullis-redis/src",
];

/// Markdown files a facade user reads whose Rust blocks count too.
const MARKDOWN: [&str; 2] = ["README.md", "crates/portcullis/README.md"];

/// The facade's features the docs are written for (feature-gated docs
/// say which one they need; none of them adds a crate to the project).
const FEATURES: [&str; 7] = [
    "axum", "redis", "tonic", "config", "metrics", "tls", "testing",
];

/// The marker of an example's first line that names more crates.
const ALSO_ADD: &str = "// Also add:";

/// One Rust code block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Example {
    /// `path:line` of the block's first line (the fence's next line).
    pub(crate) origin: String,
    /// The code as rustdoc compiles it (hidden lines included, unmarked).
    pub(crate) code: String,
    /// The crates its first line asks for (`// Also add: cargo add http`).
    pub(crate) extra: Vec<String>,
}

/// `cargo xtask doc-examples`, and the stage of `cargo xtask test`.
pub(crate) fn check() -> Result<()> {
    let root = workspace_root();
    let mut examples = Vec::new();
    for dir in SOURCES {
        for file in rust_files(&root.join(dir))? {
            let text = read(&file)?;
            let shown = relative(&root, &file);
            examples.extend(blocks(&shown, &doc_lines(&text)));
        }
    }
    for file in MARKDOWN {
        let text = read(&root.join(file))?;
        let lines: Vec<(usize, String)> = text
            .lines()
            .enumerate()
            .map(|(i, line)| (i + 1, line.to_owned()))
            .collect();
        examples.extend(blocks(file, &lines));
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let dir = target.join("doc-examples");
    write_crate(&root, &dir, &examples)?;
    let asking: usize = examples.iter().filter(|e| !e.extra.is_empty()).count();
    println!(
        "{} doc examples ({} of them add crates) in {}",
        examples.len(),
        asking,
        dir.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .args([
            "check",
            "--quiet",
            "--message-format",
            "short",
            "--manifest-path",
        ])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&dir)
        .output()
        .map_err(|e| Error::new(format!("could not run cargo: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut failing = BTreeMap::<usize, Vec<String>>::new();
    let mut other = Vec::new();
    for line in stderr.lines() {
        match line
            .strip_prefix("src/ex")
            .and_then(|rest| rest.split_once(".rs:"))
            .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest)))
        {
            Some((n, rest)) if line.contains("error") => {
                failing.entry(n).or_default().push(rest.to_owned());
            }
            Some(_) => {}
            None if line.contains("error") => other.push(line.to_owned()),
            None => {}
        }
    }
    for (n, errors) in &failing {
        let example = &examples[*n];
        println!("doc example at {} does not compile:", example.origin);
        for error in errors {
            println!("    {error}");
        }
    }
    for line in &other {
        println!("{line}");
    }
    Err(Error::new(format!(
        "{} of {} doc examples do not compile in a project with only the quick start's \
         dependencies (listed above; the generated crate is {}): use `axum::http` or the \
         facade's re-exports, or say on the example's first line what else to add \
         (`{ALSO_ADD} cargo add http`)",
        failing.len(),
        examples.len(),
        dir.display()
    )))
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| Error::new(format!("could not read {}: {e}", dir.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::new(format!("could not read {}: {e}", path.display())))
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The doc comment lines (`///`, `//!`) of a source file, without their
/// markers, with their line numbers; a line that is not a doc comment
/// becomes an empty line, so a block never runs across two comments.
fn doc_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let trimmed = line.trim_start();
            let doc = trimmed
                .strip_prefix("///")
                .filter(|rest| !rest.starts_with('/'))
                .or_else(|| trimmed.strip_prefix("//!"));
            let text = match doc {
                Some(rest) => rest.strip_prefix(' ').unwrap_or(rest).to_owned(),
                // Outside a doc comment: ends any open block.
                None => "\u{0}".to_owned(),
            };
            (i + 1, text)
        })
        .collect()
}

/// Whether a fence's info string (after the backticks) is a Rust block
/// rustdoc compiles.
fn compiled_rust(info: &str) -> bool {
    let mut rust = true;
    for token in info
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|token| !token.is_empty())
    {
        match token {
            "rust" | "no_run" | "should_panic" | "test_harness" | "standalone_crate" => {}
            "ignore" | "compile_fail" => return false,
            token if token.starts_with("edition") || token.starts_with("ignore-") => {
                if token.starts_with("ignore-") {
                    return false;
                }
            }
            _ => rust = false,
        }
    }
    rust
}

/// The Rust blocks of `lines` (doc text or Markdown).
fn blocks(origin: &str, lines: &[(usize, String)]) -> Vec<Example> {
    let mut examples = Vec::new();
    let mut open: Option<(usize, bool, Vec<String>)> = None;
    for (number, line) in lines {
        let trimmed = line.trim_start();
        if line == "\u{0}" {
            open = None;
            continue;
        }
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((number + 1, compiled_rust(info), Vec::new()));
                }
            }
            Some((start, rust, code)) => {
                if trimmed.starts_with("```") {
                    if *rust {
                        examples.push(example(&format!("{origin}:{start}"), code));
                    }
                    open = None;
                } else {
                    code.push(line.clone());
                }
            }
        }
    }
    examples
}

/// A block's lines as rustdoc compiles them, and what its first line asks
/// for.
fn example(origin: &str, lines: &[String]) -> Example {
    let code: Vec<String> = lines
        .iter()
        .map(|line| {
            let trimmed = line.trim_start();
            if trimmed == "#" {
                String::new()
            } else if let Some(rest) = trimmed.strip_prefix("# ") {
                rest.to_owned()
            } else if let Some(rest) = trimmed.strip_prefix("##") {
                format!("#{rest}")
            } else {
                line.clone()
            }
        })
        .collect();
    let extra = lines
        .first()
        .and_then(|first| first.trim().strip_prefix(ALSO_ADD))
        .map(added_crates)
        .unwrap_or_default();
    Example {
        origin: origin.to_owned(),
        code: code.join("\n"),
        extra,
    }
}

/// The crates of `cargo add a b --features x && cargo add c`.
fn added_crates(text: &str) -> Vec<String> {
    let mut crates = Vec::new();
    for command in text.split("&&") {
        let mut words = command.split_whitespace().peekable();
        while let Some(word) = words.next() {
            match word {
                "cargo" | "add" => {}
                "--features" | "-F" => {
                    words.next();
                }
                word if word.starts_with('-') => {}
                word => crates.push(word.trim_end_matches(',').to_owned()),
            }
        }
    }
    crates
}

/// A crate's requirement in the generated manifest: the workspace's
/// version of it, with its default features (what `cargo add` gives).
fn requirement(workspace_manifest: &str, name: &str) -> String {
    let version = workspace_manifest.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        if key.trim() != name {
            return None;
        }
        let value = value.trim();
        if let Some(quoted) = value.strip_prefix('"') {
            return Some(quoted.split('"').next()?.to_owned());
        }
        let at = value.find("version")?;
        let rest = &value[at..];
        let start = rest.find('"')? + 1;
        let end = rest[start..].find('"')? + start;
        Some(rest[start..end].to_owned())
    });
    format!("\"{}\"", version.as_deref().unwrap_or("*"))
}

/// Writes the generated crate.
fn write_crate(root: &Path, dir: &Path, examples: &[Example]) -> Result<()> {
    let src = dir.join("src");
    // Stale example files of an earlier run would stay as modules.
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src)
        .map_err(|e| Error::new(format!("could not create {}: {e}", src.display())))?;
    let workspace = read(&root.join("Cargo.toml"))?;
    let extra: BTreeSet<&str> = examples
        .iter()
        .flat_map(|example| example.extra.iter().map(String::as_str))
        .collect();
    let mut manifest = format!(
        "# Written by `cargo xtask doc-examples`: the README's quick-start project, with\n\
         # every doc example of the portcullis family as a module. Do not edit.\n\
         [package]\nname = \"portcullis-doc-examples\"\nversion = \"0.0.0\"\n\
         edition = \"2024\"\npublish = false\n\n\
         # Not a member of the portcullis workspace.\n[workspace]\n\n\
         [features]\ndefault = [{defaults}]\n",
        defaults = FEATURES
            .iter()
            .map(|f| format!("\"{f}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for feature in FEATURES {
        let _ = writeln!(manifest, "{feature} = [\"portcullis/{feature}\"]");
    }
    let _ = write!(
        manifest,
        "\n[dependencies]\nportcullis = {{ path = \"{}\", features = [\"axum\"] }}\n\
         axum = {}\ntokio = {{ version = {}, features = [\"full\"] }}\n\
         # Only for the examples whose first line asks for them.\n",
        root.join("crates/portcullis").display(),
        requirement(&workspace, "axum"),
        requirement(&workspace, "tokio"),
    );
    for name in &extra {
        let _ = writeln!(
            manifest,
            "{} = {{ package = \"{name}\", version = {} }}",
            dep_name(name),
            requirement(&workspace, name)
        );
    }
    write(&dir.join("Cargo.toml"), &manifest)?;
    // The workspace's lock file: the same versions as the workspace builds
    // (and no registry lookup for them).
    let lock = dir.join("Cargo.lock");
    if !lock.exists() {
        let _ = std::fs::copy(root.join("Cargo.lock"), &lock);
    }
    let mut lib = String::from(
        "//! Written by `cargo xtask doc-examples`; see xtask/src/doc_examples.rs.\n\
         #![allow(warnings)]\n",
    );
    for (n, example) in examples.iter().enumerate() {
        let _ = writeln!(lib, "#[path = \"ex{n}.rs\"]\nmod ex{n};");
        let mut module = format!("// {}\n", example.origin);
        for name in &example.extra {
            let _ = writeln!(
                module,
                "#[allow(unused_imports)]\nuse ::{} as {};",
                dep_name(name),
                name.replace('-', "_")
            );
        }
        if example.code.trim_end().ends_with("(())") {
            module.push_str("fn _inner() -> Result<(), impl core::fmt::Debug> {\n");
        } else {
            module.push_str("fn _inner() {\n");
        }
        module.push_str(&example.code);
        module.push_str("\n}\n");
        write(&src.join(format!("ex{n}.rs")), &module)?;
    }
    write(&src.join("lib.rs"), &lib)
}

/// The generated crate's name for an extra dependency.
fn dep_name(name: &str) -> String {
    format!("doc_dep_{}", name.replace('-', "_"))
}

fn write(path: &Path, text: &str) -> Result<()> {
    // Unchanged files keep their times, so an unchanged run checks nothing.
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(path, text)
        .map_err(|e| Error::new(format!("could not write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<(usize, String)> {
        text.lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.to_owned()))
            .collect()
    }

    #[test]
    fn blocks_are_read_as_rustdoc_reads_them() {
        let doc = doc_lines(
            "/// Text.\n///\n/// ```\n/// // Also add: cargo add http && cargo add bytes --features serde\n\
             /// # use x::y;\n/// let a = 1;\n/// ```\n///\n/// ```text\n/// not rust\n/// ```\n\
             /// ```ignore\n/// skipped\n/// ```\nfn f() {}\n//! ```no_run\n//! ## not hidden\n//! ```\n",
        );
        let found = blocks("a.rs", &doc);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].origin, "a.rs:4");
        assert_eq!(found[0].extra, ["http", "bytes"]);
        assert!(found[0].code.contains("\nuse x::y;\nlet a = 1;"));
        assert_eq!(found[1].code, "# not hidden");
        let markdown = blocks(
            "R.md",
            &lines("```sh\ncargo add x\n```\n```rust\nfn main() {}\n```\n"),
        );
        assert_eq!(markdown.len(), 1);
        assert_eq!(markdown[0].origin, "R.md:5");
    }

    #[test]
    fn an_unclosed_block_ends_with_its_comment() {
        let doc = doc_lines("/// ```\n/// let a = 1;\nfn f() {}\n/// ```\n/// more\n/// ```\n");
        let found = blocks("a.rs", &doc);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].code, "more");
    }

    #[test]
    fn requirements_come_from_the_workspace() {
        let manifest = "http = \"1\"\naxum = { version = \"0.8\", default-features = false }\n";
        assert_eq!(requirement(manifest, "http"), "\"1\"");
        assert_eq!(requirement(manifest, "axum"), "\"0.8\"");
        assert_eq!(requirement(manifest, "nope"), "\"*\"");
    }
}
