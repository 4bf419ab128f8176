//! Reloads of a limits file that say what they did (issue 32): a refused
//! reload logs its cause, with the OS error for a file that cannot be read,
//! once per distinct cause rather than at every poll; and a reload keeps
//! the overrides set at run time with `Limits::update`.

mod log_capture;

use portcullis::{LimitsFile, LimitsFileError, Policy, Reload};

fn temp_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("portcullis-{name}-{}.toml", std::process::id()))
}

const GOOD: &str = "default = [\"a\"]\n[policies]\na = { limit = 10, period = \"1m\" }\n";
use log_capture::Captured;

#[test]
fn a_refused_reload_logs_its_cause_once_per_distinct_cause() {
    let captured = Captured::default();
    let _default = tracing::dispatcher::set_default(&captured.dispatch(tracing::Level::INFO));
    let path = temp_file("refused-reload");
    std::fs::write(&path, GOOD).unwrap();
    let file = LimitsFile::open(&path).unwrap();

    // A limit of 0, polled three times: one line, with the cause.
    std::fs::write(&path, GOOD.replace("limit = 10", "limit = 0")).unwrap();
    for _ in 0..3 {
        assert!(file.reload().is_err());
    }
    let errors = captured.lines("ERROR");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let at = format!("{}:3:15: policies.a.limit", path.display());
    assert!(errors[0].contains(&at), "{}", errors[0]);
    assert!(
        errors[0].contains("policy limit is 0"),
        "the cause is in the line: {}",
        errors[0]
    );

    // The file deleted: a new cause, logged once, with the OS error.
    std::fs::remove_file(&path).unwrap();
    for _ in 0..3 {
        let error = file.reload().unwrap_err();
        assert!(matches!(error, LimitsFileError::Read { .. }), "{error}");
    }
    let errors = captured.lines("ERROR");
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors[1].contains("os error 2"),
        "the OS error is in the line: {}",
        errors[1]
    );

    // Good again: said once; a later refusal of the same cause is logged
    // again (it is news after the recovery).
    std::fs::write(&path, GOOD).unwrap();
    assert!(matches!(file.reload(), Ok(Reload::Unchanged { .. })));
    file.reload().unwrap();
    let again: Vec<String> = captured
        .lines("INFO")
        .into_iter()
        .filter(|l| l.contains("valid again"))
        .collect();
    assert_eq!(again.len(), 1, "{again:#?}");
    std::fs::remove_file(&path).unwrap();
    assert!(file.reload().is_err());
    assert_eq!(captured.lines("ERROR").len(), 3);
}

#[test]
fn a_reload_keeps_the_overrides_set_at_run_time() {
    let path = temp_file("runtime-overrides");
    let file_with = |default_limit: u64, tier: &str| {
        format!(
            "default = [\"free\"]\n[policies]\nfree = {{ limit = {default_limit}, period = \"1m\" }}\n\
             pro = {{ limit = 1000, period = \"1m\" }}\n[tiers]\n{tier} = [\"pro\"]\n\
             [overrides]\nglobex = {{ tier = \"{tier}\" }}\ninitech = {{ tier = \"{tier}\" }}\n"
        )
    };
    std::fs::write(&path, file_with(10, "pro")).unwrap();
    let file = LimitsFile::open(&path).unwrap();
    let limits = file.limits();

    // At run time: acme gets a quota, initech's override goes, globex
    // moves to its own policies.
    let own = |name: &str| Policy::per_minute(500).name(name).build().unwrap();
    limits
        .update(|set| {
            set.override_policies("acme", [own("acme")])
                .remove_override("initech")
                .override_policies("globex", [own("globex")])
        })
        .unwrap();

    std::fs::write(&path, file_with(20, "pro")).unwrap();
    assert!(matches!(file.reload(), Ok(Reload::Applied { .. })));
    let set = limits.load();
    assert_eq!(set.defaults()[0].limit(), 20, "the file's change applies");
    assert_eq!(set.select("acme", None).name(), "acme", "added: kept");
    assert_eq!(set.select("globex", None).name(), "globex", "changed: kept");
    assert!(
        set.override_for("initech").is_none(),
        "removed: kept removed"
    );

    // A kept override naming a tier the new file drops: refused, and the
    // limits stay.
    limits
        .update(|set| set.override_tier("hooli", "pro"))
        .unwrap();
    let version = limits.version();
    std::fs::write(&path, file_with(30, "premium")).unwrap();
    let error = file.reload().unwrap_err();
    assert!(
        error.to_string().contains("overrides set at run time"),
        "{error}"
    );
    assert_eq!(limits.version(), version);
    assert_eq!(limits.load().defaults()[0].limit(), 20);
    std::fs::remove_file(&path).unwrap();
}
