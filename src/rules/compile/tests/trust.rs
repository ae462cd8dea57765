//! `[trust]` and `[validation]`.

use super::support::*;
use crate::rules::{NewAccount, TrustAward};

const TRUST: &str = r#"[trust]
payment_succeeded = { points = 1, ttl = "30d" }
identity_verified = { points = 2, ttl = "180d" }
max_points = 3
bonus_per_point = 1
score_discount_per_point = 0.1
new_account = { younger_than = "7d", max_factor = 0.5 }
"#;

fn with_trust(from: &str, to: &str) -> String {
    assert!(TRUST.contains(from), "TRUST has no {from:?}");
    format!("{BASE}\n{}", TRUST.replacen(from, to, 1))
}

fn breaks_trust(from: &str, to: &str, field: &str, says: &[&str]) {
    let text = with_trust(from, to);
    let err = single(&text);
    assert_error(&err, &text, last_line(to), field, says);
}

#[test]
fn trust_compiles() {
    let rules = ok(&with_trust("", ""));
    let trust = rules.trust.expect("trust");
    assert_eq!(
        trust.payment_succeeded,
        Some(TrustAward {
            points: 1,
            ttl_ms: 30 * 86_400_000
        })
    );
    assert_eq!(trust.identity_verified.map(|a| a.points), Some(2));
    assert_eq!((trust.max_points, trust.bonus_per_point), (3, 1));
    assert_eq!(trust.score_discount_per_point, 0.1);
    assert_eq!(
        trust.new_account,
        Some(NewAccount {
            younger_than_ms: 7 * 86_400_000,
            max_factor: 0.5
        })
    );
    assert!(ok(BASE).trust.is_none());
}

#[test]
fn trust_defaults() {
    let trust = ok(&format!("{BASE}\n[trust]\nmax_points = 0\n"))
        .trust
        .expect("trust");
    assert_eq!((trust.max_points, trust.bonus_per_point), (0, 0));
    assert_eq!(trust.score_discount_per_point, 0.0);
    assert!(trust.payment_succeeded.is_none() && trust.new_account.is_none());
}

#[test]
fn max_points_is_required() {
    let text = with_trust("max_points = 3\n", "");
    let err = single(&text);
    assert_error(&err, &text, "[trust]", "trust.max_points", &["missing"]);
}

#[test]
fn award_points_must_not_be_negative() {
    breaks_trust(
        "points = 1,",
        "points = -1,",
        "trust.payment_succeeded.points",
        &["-1 is not an integer >= 0"],
    );
}

#[test]
fn award_ttl_must_be_a_duration() {
    breaks_trust(
        "ttl = \"180d\"",
        "ttl = \"6 months\"",
        "trust.identity_verified.ttl",
        &["\"6 months\" is not a duration > 0"],
    );
}

#[test]
fn bonus_per_point_must_not_be_negative() {
    breaks_trust(
        "bonus_per_point = 1",
        "bonus_per_point = -2",
        "trust.bonus_per_point",
        &["-2 is not an integer >= 0"],
    );
}

#[test]
fn score_discount_must_be_a_fraction() {
    breaks_trust(
        "score_discount_per_point = 0.1",
        "score_discount_per_point = 1.5",
        "trust.score_discount_per_point",
        &["1.5 is not in [0, 1]"],
    );
}

#[test]
fn new_account_must_be_valid() {
    breaks_trust(
        "younger_than = \"7d\"",
        "younger_than = \"0d\"",
        "trust.new_account.younger_than",
        &["\"0d\" is not a duration > 0"],
    );
    breaks_trust(
        "max_factor = 0.5",
        "max_factor = 0",
        "trust.new_account.max_factor",
        &["0 is not in (0, 1]"],
    );
}

#[test]
fn trust_at_most_once_names_the_second() {
    let files = [
        ("rules/a.toml", TRUST),
        ("rules/b.toml", "\n[trust]\nmax_points = 1\n"),
    ];
    let errs = errors(&files);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!((errs[0].file.as_str(), errs[0].line), ("rules/b.toml", 2));
    assert!(errs[0].message.starts_with("trust: "), "{}", errs[0]);
    assert!(
        errs[0]
            .message
            .contains("already defined at rules/a.toml:1"),
        "{}",
        errs[0]
    );
}

const VALIDATION: &str = "[validation]\ndevice_id = { pattern = \"^[A-Za-z0-9_-]{8,64}$\" }\n";

#[test]
fn validation_compiles() {
    let rules = ok(&format!("{BASE}\n{VALIDATION}"));
    let re = rules.validation.device_id.expect("device_id pattern");
    assert!(re.is_match("abcd-1234_x"));
    assert!(!re.is_match("short"));
    assert!(!re.is_match("has:colon1"));
    assert!(ok(BASE).validation.device_id.is_none());
}

#[test]
fn bad_device_id_pattern_reports_the_regex_error() {
    let text = format!("{BASE}\n[validation]\ndevice_id = {{ pattern = \"^[A-Z\" }}\n");
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "device_id",
        "validation.device_id.pattern",
        &["is not a valid regex", "unclosed character class"],
    );
    assert!(!err.message.contains('\n'), "one line: {err}");
}

#[test]
fn validation_at_most_once_names_the_second() {
    let files = [("rules/a.toml", VALIDATION), ("rules/b.toml", VALIDATION)];
    let errs = errors(&files);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!((errs[0].file.as_str(), errs[0].line), ("rules/b.toml", 1));
    assert!(
        errs[0]
            .message
            .contains("already defined at rules/a.toml:1"),
        "{}",
        errs[0]
    );
}
