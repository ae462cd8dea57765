//! The shipped `rules/` folder, folder loading, and durations.

use std::fs;
use std::path::{Path, PathBuf};

use crate::rules::{load_dir, parse_duration_ms, Algorithm, Dimension, Layer, StoreErrorPolicy};

fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rules")
}

/// The load-test rules, kept with the benchmarks (not a scene to deploy).
fn bench_rules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/rules")
}

/// A temporary folder holding `files`.
fn folder(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in files {
        fs::write(dir.path().join(name), text).expect("write rule file");
    }
    dir
}

#[test]
fn shipped_rules_load() {
    let rules = load_dir(&shipped()).unwrap_or_else(|e| panic!("shipped rules invalid:\n{e}"));
    let names: Vec<&str> = rules.scenes.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "browse",
            "coupon_claim",
            "flash_sale",
            "lottery",
            "referral"
        ]
    );
    for (name, scene) in &rules.scenes {
        let policy = scene.on_store_error;
        let open = name == "browse";
        let want = if open {
            StoreErrorPolicy::FailOpen
        } else {
            StoreErrorPolicy::FailClose
        };
        assert_eq!(policy, want, "{name}: money-moving scenes fail closed");
    }
    let lottery = rules.scene("lottery").expect("lottery");
    assert!(lottery
        .limits
        .iter()
        .any(|l| l.algorithm == Algorithm::TokenBucket));
    let trust = rules.trust.as_ref().expect("[trust] in common.toml");
    assert_eq!(trust.max_points, 3);
    assert!(trust.new_account.is_some());
    let device = rules
        .validation
        .device_id
        .as_ref()
        .expect("device_id pattern");
    assert_eq!(device.as_str(), "^[A-Za-z0-9_-]{8,64}$");
}

#[test]
fn shipped_coupon_claim_follows_the_seed() {
    let rules = load_dir(&shipped()).unwrap_or_else(|e| panic!("{e}"));
    let c = rules.scene("coupon_claim").expect("coupon_claim");
    assert_eq!(c.on_store_error, StoreErrorPolicy::FailClose);
    assert_eq!(c.deny_message.as_deref(), Some("Agotado, vuelve mañana"));
    assert_eq!(
        c.required,
        [Dimension::User, Dimension::Device, Dimension::Ip]
    );
    assert_eq!(
        c.gateway.map(|g| (g.rate_per_s, g.burst)),
        Some((2000, 4000))
    );
    let limits: Vec<_> = c
        .limits
        .iter()
        .map(|l| {
            (
                l.name.as_str(),
                l.algorithm,
                l.window_ms,
                l.max,
                l.layer,
                l.trust_bonus,
            )
        })
        .collect();
    assert_eq!(
        limits,
        [
            (
                "user_10s",
                Algorithm::SlidingWindow,
                10_000,
                1,
                Layer::Business,
                false
            ),
            (
                "user_1d",
                Algorithm::SlidingWindow,
                86_400_000,
                3,
                Layer::Business,
                true
            ),
            (
                "device_1d",
                Algorithm::SlidingWindow,
                86_400_000,
                10,
                Layer::Security,
                false
            ),
            (
                "ip_1m",
                Algorithm::FixedWindow,
                60_000,
                100,
                Layer::Business,
                false
            ),
        ]
    );
    assert_eq!(c.overrides.len(), 1);
    assert_eq!(c.overrides[0].cidr.to_string(), "10.8.0.0/16");
    assert_eq!(
        (c.overrides[0].limit.as_str(), c.overrides[0].max),
        ("ip_1m", 600)
    );
    let signals: Vec<&str> = c.signals.iter().map(|s| s.name.as_str()).collect();
    assert!(signals.contains(&"accounts_per_device") && signals.contains(&"accounts_per_ip"));
    assert_eq!(c.score.as_ref().map(|s| s.silent_deny_at), Some(0.7));
}

#[test]
fn shipped_bench_matches_the_peer() {
    let rules = load_dir(&bench_rules()).unwrap_or_else(|e| panic!("{e}"));
    let b = rules.scene("bench").expect("bench");
    assert_eq!(b.on_store_error, StoreErrorPolicy::FailOpen);
    assert!(b.gateway.is_none());
    assert_eq!(
        b.required,
        [
            Dimension::User,
            Dimension::Device,
            Dimension::Ip,
            Dimension::Activity
        ]
    );
    let limits: Vec<_> = b
        .limits
        .iter()
        .map(|l| {
            (
                l.name.as_str(),
                l.dimensions.clone(),
                l.algorithm,
                l.window_ms,
                l.max,
            )
        })
        .collect();
    assert_eq!(
        limits,
        [
            (
                "user_10s",
                vec![Dimension::User],
                Algorithm::SlidingWindow,
                10_000,
                3
            ),
            (
                "device_1d",
                vec![Dimension::Device],
                Algorithm::SlidingWindow,
                86_400_000,
                10
            ),
            (
                "ip_60s",
                vec![Dimension::Ip],
                Algorithm::FixedWindow,
                60_000,
                100
            ),
            (
                "activity_60s",
                vec![Dimension::Activity],
                Algorithm::FixedWindow,
                60_000,
                100_000_000
            ),
        ]
    );
    let shipped = load_dir(&shipped()).unwrap_or_else(|e| panic!("{e}"));
    let browse = shipped.scene("browse").expect("browse");
    assert_eq!(browse.on_store_error, StoreErrorPolicy::FailOpen);
    assert_eq!(browse.required, [Dimension::Ip]);
}

#[test]
fn loading_twice_gives_the_same_version_and_a_copy_too() {
    let one = load_dir(&shipped()).unwrap_or_else(|e| panic!("{e}"));
    let two = load_dir(&shipped()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(one.version, two.version);

    let copy = tempfile::tempdir().expect("tempdir");
    for entry in fs::read_dir(shipped()).expect("rules folder") {
        let path = entry.expect("entry").path();
        if let Some(name) = path.file_name() {
            fs::copy(&path, copy.path().join(name)).expect("copy");
        }
    }
    let copied = load_dir(copy.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(copied.version, one.version);

    let browse = copy.path().join("browse.toml");
    let text = fs::read_to_string(&browse).expect("browse.toml");
    fs::write(&browse, text.replacen("max = 600", "max = 601", 1)).expect("edit");
    let edited = load_dir(copy.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(edited.version, one.version);
}

const SCENE: &str = "[scene.s]\non_store_error = \"fail_open\"\n";

#[test]
fn only_visible_toml_files_count() {
    let dir = folder(&[("a.toml", SCENE)]);
    let before = load_dir(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    fs::write(dir.path().join(".a.toml.swp"), "garbage [").expect("write");
    fs::write(dir.path().join(".hidden.toml"), "garbage [").expect("write");
    fs::write(dir.path().join("README.md"), "garbage [").expect("write");
    fs::write(dir.path().join("a.toml.bak"), "garbage [").expect("write");
    fs::create_dir(dir.path().join("old.toml")).expect("mkdir");
    fs::create_dir(dir.path().join("sub")).expect("mkdir");
    fs::write(dir.path().join("sub").join("b.toml"), "garbage [").expect("write");
    let after = load_dir(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(before.version, after.version);
    assert_eq!(after.scenes.len(), 1);
}

#[test]
fn errors_name_the_file_as_joined_to_the_folder() {
    let dir = folder(&[
        ("a.toml", SCENE),
        ("b.toml", "[scene.t]\non_store_error = 1\n"),
    ]);
    let errs = load_dir(dir.path()).expect_err("b.toml is invalid").0;
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(
        errs[0].file,
        dir.path().join("b.toml").display().to_string()
    );
    assert_eq!(errs[0].line, 2);
    assert!(
        errs[0].message.starts_with("scene.t.on_store_error: "),
        "{}",
        errs[0]
    );
}

#[test]
fn an_empty_folder_is_an_error() {
    let dir = folder(&[("notes.txt", "x")]);
    let errs = load_dir(dir.path()).expect_err("no rule files").0;
    let shown = dir.path().display().to_string();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].file.as_str(), errs[0].line), (shown.as_str(), 0));
    assert_eq!(
        errs[0].message,
        format!("no rule files (*.toml) in {shown}")
    );
}

#[test]
fn rule_files_without_a_scene_are_an_error() {
    let dir = folder(&[("s.toml", ""), ("t.toml", "\n# emptied\n")]);
    let errs = load_dir(dir.path()).expect_err("no scene").0;
    let shown = dir.path().display().to_string();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].file.as_str(), errs[0].line), (shown.as_str(), 0));
    assert_eq!(
        errs[0].message,
        format!("no scene in the rule files in {shown}")
    );
}

#[test]
fn a_missing_folder_is_an_error() {
    let dir = folder(&[]);
    let gone = dir.path().join("nope");
    let errs = load_dir(&gone).expect_err("no folder").0;
    assert_eq!(
        (errs[0].file.clone(), errs[0].line),
        (gone.display().to_string(), 0)
    );
    assert!(
        errs[0].message.contains("cannot read the rules folder"),
        "{}",
        errs[0]
    );
}

#[test]
fn durations() {
    let cases = [
        ("500ms", Some(500)),
        ("10s", Some(10_000)),
        ("1m", Some(60_000)),
        ("5m", Some(300_000)),
        ("1h", Some(3_600_000)),
        ("7d", Some(604_800_000)),
        (" 10s ", Some(10_000)),
        ("0s", None),
        ("0ms", None),
        ("10", None),
        ("s", None),
        ("", None),
        ("1.5s", None),
        ("-1s", None),
        ("10 s", None),
        ("1w", None),
        ("10S", None),
        ("99999999999999999999d", None),
        ("999999999999999999d", None),
    ];
    for (text, want) in cases {
        assert_eq!(parse_duration_ms(text), want, "{text:?}");
    }
}
