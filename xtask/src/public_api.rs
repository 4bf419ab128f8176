//! The facade's public API as a list kept under version control
//! (`api/portcullis.txt`), so that a change of the surface users see shows
//! in review:
//!
//! - `cargo xtask public-api` prints the list of the current code (after
//!   `cargo doc --workspace --no-deps --all-features`, as the test's
//!   rustdoc stage runs it), with its counts;
//! - `cargo xtask public-api --bless` writes it to `api/portcullis.txt`;
//! - `cargo xtask test` compares the two after its rustdoc stage and fails
//!   on any difference, naming the lines added and removed.
//!
//! The list is read from what rustdoc wrote for `portcullis` (the facade,
//! which re-exports the family): every item of its "all items" page, and
//! for each type and trait its inherent methods, associated constants and
//! types, public fields and variants (trait implementations are left out:
//! they are the traits' surface, not ours, and so are the methods a type
//! reaches through `Deref`). One line an item, `<kind>
//! <path>`, sorted. rustdoc's JSON output needs a nightly compiler; its
//! HTML is stable enough to read for ids, and a change in its form makes
//! the list differ, which fails loudly rather than passing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::{run_cargo, workspace_root, Error, Result};

/// The list's file, from the workspace root.
pub(crate) const LIST: &str = "api/portcullis.txt";

/// Where rustdoc writes the facade's pages.
fn doc_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
        .join("doc")
        .join("portcullis")
}

/// `cargo xtask public-api [--bless]`.
pub(crate) fn command(args: &[String]) -> Result<()> {
    let bless = match args {
        [] => false,
        [flag] if flag == "--bless" => true,
        _ => {
            return Err(Error::new(
                "usage: cargo xtask public-api [--bless] (print the facade's public items; \
                 --bless writes them to api/portcullis.txt)",
            ))
        }
    };
    // The command of `cargo xtask test`'s rustdoc stage, so that both read
    // the same pages (features unify across the workspace).
    run_cargo(
        &["doc", "--workspace", "--no-deps", "--all-features"],
        &[],
        "rustdoc failed (see above)",
    )?;
    let items = current(&doc_dir())?;
    if bless {
        let path = workspace_root().join(LIST);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::new(format!("could not create {}: {e}", parent.display())))?;
        }
        std::fs::write(&path, render(&items))
            .map_err(|e| Error::new(format!("could not write {}: {e}", path.display())))?;
        println!("wrote {} ({})", LIST, counts(&items));
    } else {
        print!("{}", render(&items));
        println!("{}", counts(&items));
    }
    Ok(())
}

/// The stage of `cargo xtask test`: the list of the docs just built
/// against the file.
pub(crate) fn check() -> Result<()> {
    let items = current(&doc_dir())?;
    let path = workspace_root().join(LIST);
    let kept = std::fs::read_to_string(&path).map_err(|e| {
        Error::new(format!(
            "could not read {} ({e}): run `cargo xtask public-api --bless` and commit the file",
            path.display()
        ))
    })?;
    let kept: BTreeSet<String> = kept
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    println!("public API of the facade: {}", counts(&items));
    if kept == items {
        return Ok(());
    }
    let added: Vec<&String> = items.difference(&kept).collect();
    let removed: Vec<&String> = kept.difference(&items).collect();
    for line in &added {
        println!("+ {line}");
    }
    for line in &removed {
        println!("- {line}");
    }
    Err(Error::new(format!(
        "the facade's public API differs from {LIST} ({} added, {} removed, listed above): \
         if the change is meant, run `cargo xtask public-api --bless` and commit {LIST} \
         with it",
        added.len(),
        removed.len()
    )))
}

/// The file's text: a header, then one item a line.
fn render(items: &BTreeSet<String>) -> String {
    let mut text = String::from(
        "# The public API of the `portcullis` facade (all features), one item a line.\n\
         # Written by `cargo xtask public-api --bless`; checked by `cargo xtask test`.\n",
    );
    for item in items {
        text.push_str(item);
        text.push('\n');
    }
    text
}

/// Where the facade re-exports other crates' items (the types a user of
/// `RedisStoreBuilder::{client, cluster_client, pool}` passes), which the
/// list holds too (a change of their version changes the facade's
/// surface) but the counts give apart.
const REEXPORTED_CRATES: [&str; 1] = ["portcullis::redis::upstream::"];

/// "N types, N functions and methods, N constants, N other" of our own
/// items, then the count of the re-exported crates' items.
fn counts(items: &BTreeSet<String>) -> String {
    let (reexported, own): (Vec<&String>, Vec<&String>) = items.iter().partition(|line| {
        REEXPORTED_CRATES
            .iter()
            .any(|prefix| line.contains(&format!(" {prefix}")))
    });
    let kind = |line: &&String| line.split(' ').next().unwrap_or("").to_owned();
    let count = |kinds: &[&str]| {
        own.iter()
            .filter(|line| kinds.contains(&kind(line).as_str()))
            .count()
    };
    let types = count(&["struct", "enum", "union", "trait", "type"]);
    let functions = count(&["fn", "method"]);
    let constants = count(&["constant", "const"]);
    format!(
        "{types} types, {functions} functions and methods, {constants} constants, {} fields, \
         variants and others of our own; {} items of redis, bb8 and bb8_redis re-exported in \
         portcullis::redis::upstream",
        own.len() - types - functions - constants,
        reexported.len()
    )
}

/// The items of the facade's docs in `dir` (`target/doc/portcullis`).
fn current(dir: &Path) -> Result<BTreeSet<String>> {
    let all = read(&dir.join("all.html"))?;
    let mut items = BTreeSet::new();
    for (href, path) in links(&all) {
        let Some((kind, _)) = href
            .rsplit('/')
            .next()
            .and_then(|file| file.split_once('.'))
        else {
            continue;
        };
        let path = format!("portcullis::{path}");
        items.insert(format!("{kind} {path}"));
        if matches!(kind, "struct" | "enum" | "union" | "trait") {
            let page = read(&dir.join(href))?;
            for (member_kind, name) in members(kind, &page) {
                items.insert(format!("{member_kind} {path}::{name}"));
            }
        }
    }
    if items.is_empty() {
        return Err(Error::new(format!(
            "no items found in {}: has rustdoc's page format changed? (xtask/src/public_api.rs reads it)",
            dir.join("all.html").display()
        )));
    }
    Ok(items)
}

/// Reads a doc page.
fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        Error::new(format!(
            "could not read {} ({e}): the facade's docs are built by `cargo doc --workspace --no-deps --all-features`",
            path.display()
        ))
    })
}

/// The `(href, text)` of each item link of the "all items" page.
fn links(page: &str) -> Vec<(&str, &str)> {
    let mut links = Vec::new();
    let mut rest = page;
    while let Some(start) = rest.find("<li><a href=\"") {
        rest = &rest[start + "<li><a href=\"".len()..];
        let Some(end) = rest.find('"') else { break };
        let href = &rest[..end];
        let Some(text_start) = rest.find('>') else {
            break;
        };
        let Some(text_end) = rest[text_start..].find("</a>") else {
            break;
        };
        let text = &rest[text_start + 1..text_start + text_end];
        if href.ends_with(".html") && !href.starts_with("http") {
            links.push((href, text));
        }
        rest = &rest[text_start + text_end..];
    }
    links
}

/// The members of a type's or trait's page, as `(kind, name)`: for a
/// type, what its inherent implementations, fields and variants define;
/// for a trait, its methods, associated types and constants.
fn members(kind: &str, page: &str) -> Vec<(&'static str, String)> {
    let region = if kind == "trait" {
        let end = [
            "id=\"dyn-compatibility\"",
            "id=\"implementors\"",
            "id=\"foreign-impls\"",
        ]
        .iter()
        .filter_map(|marker| page.find(marker))
        .min()
        .unwrap_or(page.len());
        &page[..end]
    } else {
        let inherent = match page.find("id=\"implementations-list\"") {
            Some(start) => {
                let rest = &page[start..];
                // "Methods from Deref<Target = str>" are the target's
                // surface, as trait implementations are the traits'.
                let end = [
                    "id=\"deref-methods",
                    "id=\"trait-implementations-list\"",
                    "id=\"synthetic-implementations-list\"",
                    "id=\"blanket-implementations-list\"",
                ]
                .iter()
                .filter_map(|marker| rest.find(marker))
                .min()
                .unwrap_or(rest.len());
                &rest[..end]
            }
            None => "",
        };
        // Fields and variants come before the implementations.
        let head_end = page.find("id=\"implementations\"").unwrap_or(page.len());
        return ids(&page[..head_end], &["structfield", "variant"])
            .into_iter()
            .chain(ids(
                inherent,
                &["method", "associatedconstant", "associatedtype"],
            ))
            .collect();
    };
    ids(
        region,
        &["tymethod", "method", "associatedconstant", "associatedtype"],
    )
    .into_iter()
    .collect()
}

/// `(kind, name)` for each `id="<kind>.<name>"` of the given kinds in
/// `text`, without rustdoc's `-N` suffix for a repeated id.
fn ids(text: &str, kinds: &[&str]) -> BTreeSet<(&'static str, String)> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("id=\"") {
        rest = &rest[start + 4..];
        let Some(end) = rest.find('"') else { break };
        let id = &rest[..end];
        rest = &rest[end..];
        let Some((kind, name)) = id.split_once('.') else {
            continue;
        };
        if !kinds.contains(&kind) {
            continue;
        }
        let name = match name.rsplit_once('-') {
            Some((base, n)) if n.bytes().all(|b| b.is_ascii_digit()) => base,
            _ => name,
        };
        let kind = match kind {
            "tymethod" | "method" => "method",
            "associatedconstant" => "const",
            "associatedtype" => "assoc-type",
            "structfield" => "field",
            _ => "variant",
        };
        found.insert((kind, name.to_owned()));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_members_are_read_from_rustdoc_pages() {
        let all = r#"<ul class="all-items"><li><a href="struct.Policy.html">Policy</a></li><li><a href="tower/fn.x.html">tower::x</a></li></ul>"#;
        assert_eq!(
            links(all),
            [
                ("struct.Policy.html", "Policy"),
                ("tower/fn.x.html", "tower::x")
            ]
        );
        let page = r#"<span id="structfield.limit"></span><h2 id="implementations">x</h2>
            <div id="implementations-list"><section id="method.limit"></section>
            <section id="method.limit-1"></section><section id="associatedconstant.MAX"></section></div>
            <div id="trait-implementations-list"><section id="method.clone"></section></div>"#;
        let found = members("struct", page);
        assert_eq!(
            found,
            [
                ("field", "limit".to_owned()),
                ("const", "MAX".to_owned()),
                ("method", "limit".to_owned()),
            ],
            "inherent members once each; trait implementations left out"
        );
        let trait_page = r#"<section id="tymethod.check"></section><section id="method.peek"></section>
            <h2 id="implementors"></h2><section id="method.other"></section>"#;
        assert_eq!(
            members("trait", trait_page),
            [
                ("method", "check".to_owned()),
                ("method", "peek".to_owned())
            ]
        );
    }
}
