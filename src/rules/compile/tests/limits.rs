//! `[[limits]]` and `[[overrides]]`.

use super::support::*;
use crate::rules::{Algorithm, Dimension, Layer, Limit};

#[test]
fn limits_compile_with_defaults() {
    let rules = ok(BASE);
    let scene = rules.scene("s").expect("scene s");
    assert_eq!(
        scene.limits[0],
        Limit {
            name: "user_10s".into(),
            dimensions: vec![Dimension::User],
            algorithm: Algorithm::SlidingWindow,
            window_ms: 10_000,
            max: 1,
            layer: Layer::Business,
            trust_bonus: false,
            filter: None,
        }
    );
    assert_eq!(scene.limits[1].algorithm, Algorithm::FixedWindow);
    assert_eq!(scene.limits[1].window_ms, 60_000);
}

#[test]
fn limit_name_must_fit_a_store_key() {
    breaks(
        "name = \"ip_1m\"",
        "name = \"ip 1m\"",
        "scene.s.limits[1].name",
        &["limit name", "A-Z a-z 0-9 _"],
    );
}

#[test]
fn limit_names_are_unique_in_a_scene() {
    let text = base_with("name = \"ip_1m\"", "name = \"user_10s\"");
    let err = single(&text);
    // The second use is the error: the line of limit 1's name, not limit 0's.
    assert_eq!(
        err.line,
        line_of(&text, "dimensions = [\"ip\"]") - 1,
        "{err}"
    );
    assert_error(
        &err,
        &text,
        "name = \"user_10s\"\ndimensions = [\"ip\"]",
        "scene.s.limits[1].name",
        &["\"user_10s\" is already the name of scene.s.limits[0]"],
    );
}

#[test]
fn no_dimensions_is_one_budget_for_the_scene() {
    let text = base_with("dimensions = [\"ip\"]", "dimensions = []");
    let dims = ok(&text).scene("s").map(|s| s.limits[1].dimensions.clone());
    assert_eq!(dims, Some(vec![]));
}

#[test]
fn dimensions_must_be_known() {
    breaks(
        "dimensions = [\"ip\"]",
        "dimensions = [\"ip\", \"phone\"]",
        "scene.s.limits[1].dimensions[1]",
        &["\"phone\" is not a dimension"],
    );
}

#[test]
fn dimensions_must_not_repeat() {
    breaks(
        "dimensions = [\"ip\"]",
        "dimensions = [\"ip\", \"ip\"]",
        "scene.s.limits[1].dimensions[1]",
        &["\"ip\" is listed twice"],
    );
}

#[test]
fn dimensions_must_be_required_by_the_scene() {
    breaks(
        "dimensions = [\"ip\"]",
        "dimensions = [\"ip\", \"device\"]",
        "scene.s.limits[1].dimensions[1]",
        &[
            "\"device\" is not in scene.s.required",
            "add \"device\" to required",
        ],
    );
}

#[test]
fn combined_dimensions_keep_their_order() {
    let text = base_with("dimensions = [\"ip\"]", "dimensions = [\"ip\", \"user\"]");
    let dims = ok(&text).scene("s").map(|s| s.limits[1].dimensions.clone());
    assert_eq!(dims, Some(vec![Dimension::Ip, Dimension::User]));
}

#[test]
fn algorithm_must_be_known() {
    breaks(
        "algorithm = \"fixed_window\"",
        "algorithm = \"leaky_bucket\"",
        "scene.s.limits[1].algorithm",
        &[
            "\"leaky_bucket\"",
            "sliding_window, fixed_window, token_bucket",
        ],
    );
    let text = base_with(
        "algorithm = \"fixed_window\"",
        "algorithm = \"token_bucket\"",
    );
    let algorithm = ok(&text).scene("s").map(|s| s.limits[1].algorithm);
    assert_eq!(algorithm, Some(Algorithm::TokenBucket));
}

#[test]
fn window_must_be_a_positive_duration() {
    for bad in ["0s", "10", "1w", "-5s", "1.5s", ""] {
        breaks(
            "window = \"1m\"",
            &format!("window = \"{bad}\""),
            "scene.s.limits[1].window",
            &[&format!(
                "{bad:?} is not a duration > 0 (use ms, s, m, h, d)"
            )],
        );
    }
}

#[test]
fn max_must_be_at_least_one() {
    breaks(
        "max = 100",
        "max = 0",
        "scene.s.limits[1].max",
        &["0 is not an integer >= 1"],
    );
}

#[test]
fn layer_must_be_business_or_security() {
    breaks(
        "max = 100\n",
        "max = 100\nlayer = \"resource\"\n",
        "scene.s.limits[1].layer",
        &["\"resource\" is not one of business, security"],
    );
    let text = base_with(
        "max = 100\n",
        "max = 100\nlayer = \"security\"\ntrust_bonus = true\n",
    );
    let limit = ok(&text)
        .scene("s")
        .map(|s| s.limits[1].clone())
        .expect("scene s");
    assert_eq!(limit.layer, Layer::Security);
    assert!(limit.trust_bonus);
}

const OVERRIDE: &str =
    "\n[[scene.s.overrides]]\ncidr = \"10.8.0.0/16\"\nlimit = \"ip_1m\"\nmax = 600\n";

fn with_override(from: &str, to: &str) -> String {
    assert!(OVERRIDE.contains(from), "OVERRIDE has no {from:?}");
    format!("{BASE}{}", OVERRIDE.replacen(from, to, 1))
}

fn breaks_override(from: &str, to: &str, field: &str, says: &[&str]) {
    let text = with_override(from, to);
    let err = single(&text);
    assert_error(&err, &text, last_line(to), field, says);
}

#[test]
fn overrides_compile() {
    let rules = ok(&with_override("10.8.0.0/16", "10.8.3.4/16"));
    let o = rules
        .scene("s")
        .map(|s| s.overrides.clone())
        .expect("scene s");
    assert_eq!(o.len(), 1);
    assert_eq!(
        o[0].cidr.to_string(),
        "10.8.0.0/16",
        "host bits are dropped"
    );
    assert_eq!((o[0].limit.as_str(), o[0].max), ("ip_1m", 600));
    assert!(ok(&with_override("10.8.0.0/16", "2001:db8::/32"))
        .scene("s")
        .is_some());
}

#[test]
fn override_cidr_must_parse() {
    breaks_override(
        "cidr = \"10.8.0.0/16\"",
        "cidr = \"10.8.0.0/33\"",
        "scene.s.overrides[0].cidr",
        &["\"10.8.0.0/33\" is not a CIDR range"],
    );
}

#[test]
fn override_limit_must_exist() {
    breaks_override(
        "limit = \"ip_1m\"",
        "limit = \"ip_1h\"",
        "scene.s.overrides[0].limit",
        &["no limit named \"ip_1h\" in scene.s"],
    );
}

#[test]
fn override_limit_must_count_by_ip() {
    breaks_override(
        "limit = \"ip_1m\"",
        "limit = \"user_10s\"",
        "scene.s.overrides[0].limit",
        &["\"user_10s\" does not count by ip"],
    );
}

#[test]
fn override_max_must_be_at_least_one() {
    breaks_override(
        "max = 600",
        "max = 0",
        "scene.s.overrides[0].max",
        &["0 is not an integer >= 1"],
    );
}
