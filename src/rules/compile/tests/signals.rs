//! `[behaviour]` and `[score]`.

use super::support::*;
use crate::rules::{Count, Dimension, Signal};

const BEHAVIOUR: &str = r#"
[scene.s.behaviour]
accounts_per_device = { window = "1d", max = 3 }
account_switches = { window = "10m", max = 0 }

[scene.s.score]
weights = { accounts_per_device = 0.6, account_switches = 0.5 }
silent_deny_at = 0.7
"#;

const TRUST: &str =
    "\n[trust]\nmax_points = 3\nnew_account = { younger_than = \"7d\", max_factor = 0.5 }\n";

/// BASE with the device required (the shorthands count per device) and `BEHAVIOUR`.
fn with_signals(from: &str, to: &str) -> String {
    assert!(BEHAVIOUR.contains(from), "BEHAVIOUR has no {from:?}");
    let base = base_with(
        "required = [\"user\", \"ip\"]",
        "required = [\"user\", \"ip\", \"device\"]",
    );
    format!("{base}{}", BEHAVIOUR.replacen(from, to, 1))
}

fn breaks_signals(from: &str, to: &str, field: &str, says: &[&str]) {
    let text = with_signals(from, to);
    let err = single(&text);
    assert_error(&err, &text, last_line(to), field, says);
}

#[test]
fn behaviour_and_score_compile() {
    let rules = ok(&with_signals("", ""));
    let scene = rules.scene("s").expect("scene s");
    // The shorthands are compiled into the scene's signals, in their fixed order.
    let shorthand = |name: &str, count, window_ms, max| Signal {
        name: name.into(),
        count,
        per: vec![Dimension::Device],
        filter: None,
        window_ms,
        max,
        min_share: None,
    };
    assert_eq!(
        scene.signals,
        [
            shorthand("accounts_per_device", Count::Users, 86_400_000, 3),
            // account_switches may be 0 (any switch counts).
            shorthand("account_switches", Count::UserSwitches, 600_000, 0),
        ]
    );
    let score = scene.score.as_ref().expect("score");
    assert_eq!(score.weights.get("accounts_per_device"), Some(&0.6));
    assert_eq!(score.silent_deny_at, 0.7);
    assert!(ok(BASE).scene("s").is_some_and(|s| s.score.is_none()));
}

#[test]
fn signal_window_must_be_a_duration() {
    breaks_signals(
        "window = \"1d\"",
        "window = \"1 day\"",
        "scene.s.behaviour.accounts_per_device.window",
        &["\"1 day\" is not a duration > 0"],
    );
}

#[test]
fn signal_max_must_be_at_least_one_except_switches() {
    breaks_signals(
        "max = 3",
        "max = 0",
        "scene.s.behaviour.accounts_per_device.max",
        &["0 is not an integer >= 1"],
    );
    breaks_signals(
        "max = 0",
        "max = -1",
        "scene.s.behaviour.account_switches.max",
        &["-1 is not an integer >= 0"],
    );
}

#[test]
fn unknown_signal_in_behaviour_is_named() {
    let text = with_signals(
        "account_switches = ",
        "ips_per_user = { window = \"1d\", max = 1 }\naccount_switches = ",
    );
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "ips_per_user",
        "scene.s.behaviour.ips_per_user",
        &["unknown field `ips_per_user`"],
    );
}

#[test]
fn weight_must_name_a_signal() {
    breaks_signals(
        "weights = { accounts_per_device = 0.6",
        "weights = { accounts_per_phone = 0.6",
        "scene.s.score.weights.accounts_per_phone",
        &["\"accounts_per_phone\" is not a signal"],
    );
}

#[test]
fn weight_signal_must_be_configured_in_behaviour() {
    breaks_signals(
        "account_switches = 0.5",
        "account_switches = 0.5, devices_per_user = 0.1",
        "scene.s.score.weights.devices_per_user",
        &["\"devices_per_user\" is not configured in scene.s.behaviour"],
    );
}

#[test]
fn new_account_weight_needs_trust_new_account() {
    breaks_signals(
        "account_switches = 0.5",
        "account_switches = 0.5, new_account = 0.2",
        "scene.s.score.weights.new_account",
        &["needs [trust].new_account"],
    );
}

#[test]
fn new_account_weight_accepts_trust_from_another_file() {
    let text = with_signals(
        "account_switches = 0.5",
        "account_switches = 0.5, new_account = 0.2",
    );
    let files = [
        ("rules/common.toml".to_string(), TRUST.to_string()),
        ("rules/s.toml".to_string(), text),
    ];
    let rules = crate::rules::compile_files(&files).expect("valid with [trust].new_account");
    let weights = rules
        .scene("s")
        .and_then(|s| s.score.clone())
        .map(|s| s.weights);
    assert_eq!(
        weights.and_then(|w| w.get("new_account").copied()),
        Some(0.2)
    );
}

#[test]
fn weight_must_be_within_zero_and_one() {
    breaks_signals(
        "account_switches = 0.5",
        "account_switches = 1.5",
        "scene.s.score.weights.account_switches",
        &["1.5 is not in [0, 1]"],
    );
    // Integers are numbers too: 1 is a valid weight.
    assert!(ok(&with_signals(
        "account_switches = 0.5",
        "account_switches = 1"
    ))
    .scene("s")
    .is_some());
}

#[test]
fn silent_deny_at_must_be_in_zero_exclusive_one_inclusive() {
    breaks_signals(
        "silent_deny_at = 0.7",
        "silent_deny_at = 0.0",
        "scene.s.score.silent_deny_at",
        &["0 is not in (0, 1]"],
    );
    breaks_signals(
        "silent_deny_at = 0.7",
        "silent_deny_at = 1.01",
        "scene.s.score.silent_deny_at",
        &["1.01 is not in (0, 1]"],
    );
    assert!(ok(&with_signals(
        "silent_deny_at = 0.7",
        "silent_deny_at = 1.0"
    ))
    .scene("s")
    .is_some());
}
