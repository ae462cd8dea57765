//! A scene's own keys: name, on_store_error, deny_message, required, gateway.

use super::support::*;
use crate::rules::{Dimension, Gateway, StoreErrorPolicy};

#[test]
fn scene_name_must_fit_a_store_key() {
    let text = BASE.replace("scene.s", "scene.\"s:1\"");
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "[scene.\"s:1\"]",
        "scene.\"s:1\"",
        &["scene name", "A-Z a-z 0-9 _"],
    );
}

#[test]
fn scene_name_longer_than_64_is_refused() {
    let long = "a".repeat(65);
    let text = BASE.replace("scene.s", &format!("scene.{long}"));
    let err = single(&text);
    assert_eq!(err.line, 1, "{err}");
    assert!(err.message.contains("1 to 64"), "{err}");
}

#[test]
fn on_store_error_is_required() {
    let text = base_with("on_store_error = \"fail_close\"\n", "");
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "[scene.s]",
        "scene.s.on_store_error",
        &["missing", "fail_open | fail_close | local"],
    );
}

#[test]
fn on_store_error_must_be_a_known_policy() {
    breaks(
        "on_store_error = \"fail_close\"",
        "on_store_error = \"fail_closed\"",
        "scene.s.on_store_error",
        &["\"fail_closed\"", "fail_open, fail_close, local"],
    );
}

#[test]
fn policies_and_message_compile() {
    for (name, policy) in [
        ("fail_open", StoreErrorPolicy::FailOpen),
        ("fail_close", StoreErrorPolicy::FailClose),
        ("local", StoreErrorPolicy::Local),
    ] {
        let text = base_with(
            "on_store_error = \"fail_close\"",
            &format!("on_store_error = \"{name}\"\ndeny_message = \"¡no!\""),
        );
        let scene = ok(&text).scene("s").cloned().expect("scene s");
        assert_eq!(scene.on_store_error, policy);
        assert_eq!(scene.deny_message.as_deref(), Some("¡no!"));
    }
    assert_eq!(
        ok(BASE).scene("s").map(|s| s.deny_message.clone()),
        Some(None)
    );
}

#[test]
fn required_must_name_dimensions() {
    breaks(
        "required = [\"user\", \"ip\"]",
        "required = [\"user\", \"ip\", \"phone\"]",
        "scene.s.required[2]",
        &["\"phone\" is not a dimension"],
    );
}

#[test]
fn required_must_not_repeat() {
    breaks(
        "required = [\"user\", \"ip\"]",
        "required = [\"user\", \"ip\", \"user\"]",
        "scene.s.required[2]",
        &["\"user\" is listed twice"],
    );
}

#[test]
fn required_may_be_empty_without_limits() {
    let rules = ok("[scene.open]\non_store_error = \"fail_open\"\nrequired = []\n");
    let scene = rules.scene("open").expect("scene open");
    assert!(scene.required.is_empty());
    assert!(scene.limits.is_empty());
    assert_eq!(
        ok(BASE).scene("s").map(|s| s.required.clone()),
        Some(vec![Dimension::User, Dimension::Ip])
    );
}

#[test]
fn gateway_rate_must_be_positive() {
    breaks(
        "required = [\"user\", \"ip\"]\n",
        "required = [\"user\", \"ip\"]\ngateway = { rate_per_s = 0, burst = 10 }\n",
        "scene.s.gateway.rate_per_s",
        &["0 is not an integer >= 1"],
    );
}

#[test]
fn gateway_burst_must_be_at_least_one() {
    breaks(
        "required = [\"user\", \"ip\"]\n",
        "required = [\"user\", \"ip\"]\ngateway = { rate_per_s = 5, burst = -1 }\n",
        "scene.s.gateway.burst",
        &["-1 is not an integer >= 1"],
    );
}

#[test]
fn gateway_compiles() {
    let text = base_with(
        "required = [\"user\", \"ip\"]\n",
        "required = [\"user\", \"ip\"]\ngateway = { rate_per_s = 5, burst = 7 }\n",
    );
    let gateway = ok(&text).scene("s").and_then(|s| s.gateway);
    assert_eq!(
        gateway,
        Some(Gateway {
            rate_per_s: 5,
            burst: 7
        })
    );
    assert_eq!(ok(BASE).scene("s").and_then(|s| s.gateway), None);
}
