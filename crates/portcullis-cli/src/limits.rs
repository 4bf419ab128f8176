//! Limits files: reading one as the service does (`LimitsFile::open`:
//! the same parser, the same file:line:column errors), `limits validate`
//! and `limits diff`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use portcullis::{LimitSet, LimitsFile, Override, Policy};

use crate::failure::Failure;
use crate::report::{Change, DiffReport, PolicyView, ValidFile, ValidateReport};

/// The largest limits file read: far more than any real one, so a wrong
/// path (a log, a disk image) is refused rather than read into memory.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// A limits file read and validated as the service reads it.
pub(crate) fn open(path: &Path) -> Result<(Arc<LimitSet>, String), Failure> {
    if let Ok(metadata) = std::fs::metadata(path)
        && metadata.len() > MAX_FILE_BYTES
    {
        return Err(Failure::usage(format!(
            "{} is {} bytes, not a limits file (at most {MAX_FILE_BYTES} bytes are read)",
            path.display(),
            metadata.len()
        )));
    }
    let file = LimitsFile::open(path).map_err(|error| Failure::limits(&error))?;
    Ok((file.limits().load(), file.hash()))
}

/// `limits validate`: every file is read; any invalid one fails the
/// command with all their errors, one a line.
pub(crate) fn validate(files: &[std::path::PathBuf]) -> Result<ValidateReport, Failure> {
    let mut valid = Vec::new();
    let mut errors = Vec::new();
    for path in files {
        match open(path) {
            Ok((set, hash)) => valid.push(ValidFile {
                file: path.display().to_string(),
                hash,
                policies: policies_of(&set).len(),
                tiers: set.tiers().len(),
                overrides: set.overrides().len(),
            }),
            Err(failure) => errors.push(failure),
        }
    }
    match errors.len() {
        0 => Ok(ValidateReport { files: valid }),
        1 => Err(errors.remove(0)),
        _ => Err(Failure::joined(errors)),
    }
}

/// Every policy a set names, by name (a file defines each once).
fn policies_of(set: &LimitSet) -> BTreeMap<String, Policy> {
    let mut policies = BTreeMap::new();
    let mut add = |list: &[Policy]| {
        for policy in list {
            policies.insert(policy.name().to_owned(), policy.clone());
        }
    };
    add(set.defaults());
    for (_, tier) in set.tiers() {
        add(tier);
    }
    for (_, value) in set.overrides() {
        if let Override::Policies(list) = value {
            add(list);
        }
    }
    policies
}

/// `limits diff OLD NEW`.
pub(crate) fn diff(old_path: &Path, new_path: &Path) -> Result<DiffReport, Failure> {
    let (old, _) = open(old_path)?;
    let (new, _) = open(new_path)?;
    let mut changes = Vec::new();

    let (old_policies, new_policies) = (policies_of(&old), policies_of(&new));
    compare(
        "policy",
        &old_policies,
        &new_policies,
        describe,
        &mut changes,
    );

    let names = |list: &[Policy]| list.iter().map(Policy::name).collect::<Vec<_>>().join(", ");
    if names(old.defaults()) != names(new.defaults()) {
        changes.push(Change {
            item: "defaults",
            name: "default".to_owned(),
            change: "changed",
            old: Some(names(old.defaults())),
            new: Some(names(new.defaults())),
        });
    }
    let tiers = |set: &LimitSet| {
        set.tiers()
            .map(|(name, list)| (name.to_owned(), names(list)))
            .collect::<BTreeMap<_, _>>()
    };
    compare(
        "tier",
        &tiers(&old),
        &tiers(&new),
        Clone::clone,
        &mut changes,
    );
    let overrides = |set: &LimitSet| {
        set.overrides()
            .map(|(subject, value)| {
                let text = match value {
                    Override::Tier(tier) => format!("tier {tier}"),
                    Override::Policies(list) => format!("policies {}", names(list)),
                    // `Override` may grow; say what it is rather than fail.
                    other => format!("{other:?}"),
                };
                (subject.to_owned(), text)
            })
            .collect::<BTreeMap<_, _>>()
    };
    compare(
        "override",
        &overrides(&old),
        &overrides(&new),
        Clone::clone,
        &mut changes,
    );
    Ok(DiffReport {
        old: old_path.display().to_string(),
        new: new_path.display().to_string(),
        changes,
    })
}

/// Adds, removals and changes between two maps by name.
fn compare<T: PartialEq>(
    item: &'static str,
    old: &BTreeMap<String, T>,
    new: &BTreeMap<String, T>,
    text: impl Fn(&T) -> String,
    changes: &mut Vec<Change>,
) {
    let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for name in names {
        let (change, before, after) = match (old.get(name), new.get(name)) {
            (Some(a), Some(b)) if a == b => continue,
            (Some(a), Some(b)) => ("changed", Some(text(a)), Some(text(b))),
            (Some(a), None) => ("removed", Some(text(a)), None),
            (None, Some(b)) => ("added", None, Some(text(b))),
            (None, None) => continue,
        };
        changes.push(Change {
            item,
            name: name.clone(),
            change,
            old: before,
            new: after,
        });
    }
}

/// A policy's numbers, and its priority classes when it has any.
fn describe(policy: &Policy) -> String {
    let mut text = PolicyView::of(policy).text();
    if policy.has_classes() {
        text.push_str(", with priority classes");
    }
    text
}
