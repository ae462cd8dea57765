//! Structure: TOML syntax, unknown keys, wrong types and missing fields.

use super::support::*;

#[test]
fn base_is_valid() {
    let rules = ok(BASE);
    let scene = rules.scene("s").expect("scene s");
    assert_eq!(scene.limits.len(), 2);
}

#[test]
fn bad_toml_syntax_is_one_error_at_its_line() {
    let text = base_with("max = 100", "max = = 100");
    let err = single(&text);
    assert_eq!(err.file, FILE);
    assert_eq!(err.line, line_of(&text, "max = = 100"));
    assert!(err.message.starts_with("invalid TOML: "), "{err}");
}

#[test]
fn duplicate_key_is_a_syntax_error_at_the_second() {
    let text = base_with("max = 1\n", "max = 1\nmax = 2\n");
    let err = single(&text);
    assert_eq!(err.line, line_of(&text, "max = 2"), "{err}");
    assert!(err.message.starts_with("invalid TOML: "), "{err}");
}

#[test]
fn unknown_key_in_a_limit_is_named_at_its_line() {
    breaks(
        "max = 1\n",
        "max = 1\nwindw = \"10s\"\n",
        "scene.s.limits[0].windw",
        &["unknown field `windw`"],
    );
}

#[test]
fn unknown_key_in_a_scene_is_named() {
    breaks(
        "required = [\"user\", \"ip\"]\n",
        "required = [\"user\", \"ip\"]\nfail_mode = \"open\"\n",
        "scene.s.fail_mode",
        &["unknown field `fail_mode`"],
    );
}

#[test]
fn unknown_key_inside_an_inline_table_is_named() {
    breaks(
        "required = [\"user\", \"ip\"]\n",
        "required = [\"user\", \"ip\"]\ngateway = { rate_per_s = 10, burst = 10, refill = 1 }\n",
        "scene.s.gateway.refill",
        &["unknown field `refill`"],
    );
}

#[test]
fn unknown_top_level_key_is_named() {
    let text = format!("{BASE}\n[limits]\nmax = 3\n");
    let err = single(&text);
    assert_eq!(err.line, line_of(&text, "[limits]"), "{err}");
    assert!(err.message.starts_with("limits: unknown key"), "{err}");
}

#[test]
fn wrong_type_names_the_field() {
    breaks(
        "max = 100",
        "max = \"lots\"",
        "scene.s.limits[1].max",
        &["invalid type"],
    );
}

#[test]
fn missing_limit_field_is_named_at_the_limit() {
    let text = base_with("window = \"1m\"\n", "");
    let err = single(&text);
    assert_eq!(err.file, FILE);
    assert!(
        err.message
            .starts_with("scene.s.limits[1]: missing field `window`"),
        "{err}"
    );
    // The limit's entry begins at its header or its first key; either names the limit.
    let header = line_of(&text, "name = \"ip_1m\"") - 1;
    assert!((header..=header + 1).contains(&err.line), "{err}");
}

#[test]
fn limits_must_be_an_array_of_tables() {
    breaks(
        "required = [\"user\", \"ip\"]\n",
        "required = [\"user\", \"ip\"]\noverrides = 3\n",
        "scene.s.overrides",
        &["expected an array of tables"],
    );
}

#[test]
fn one_broken_part_does_not_hide_another() {
    // An unknown key in limit 0 and a bad window in limit 1: both reported.
    let text = base_with("max = 1\n", "max = 1\ncolour = \"red\"\n").replacen(
        "window = \"1m\"",
        "window = \"0s\"",
        1,
    );
    let errs = errors(&[(FILE, &text)]);
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert_error(
        &errs[0],
        &text,
        "colour",
        "scene.s.limits[0].colour",
        &["unknown field"],
    );
    assert_error(
        &errs[1],
        &text,
        "window = \"0s\"",
        "scene.s.limits[1].window",
        &["\"0s\""],
    );
}
