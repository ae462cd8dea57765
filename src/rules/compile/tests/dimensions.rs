//! `net`, `attr.NAME`, `[network]` and `[attributes]`.

use super::support::*;
use crate::rules::Dimension;

const ATTRS: &str = "\n[attributes]\nphone_range = { pattern = \"^[0-9]{3,8}$\" }\n";

#[test]
fn net_and_declared_attributes_are_dimensions() {
    let text = base_with(
        "required = [\"user\", \"ip\"]",
        "required = [\"user\", \"ip\", \"attr.phone_range\"]",
    )
    .replacen(
        "dimensions = [\"ip\"]",
        "dimensions = [\"net\", \"attr.phone_range\"]",
        1,
    ) + ATTRS
        + "\n[network]\nipv4_prefix = 16\nipv6_prefix = 32\n";
    let rules = ok(&text);
    let dims = rules.scene("s").unwrap().limits[1].dimensions.clone();
    assert_eq!(
        dims,
        [Dimension::Net, Dimension::Attr("phone_range".into())]
    );
    assert_eq!(
        (rules.network.ipv4_prefix, rules.network.ipv6_prefix),
        (16, 32)
    );
    assert_eq!(
        rules.network.of("203.0.113.9".parse().unwrap()),
        "203.0.0.0/16"
    );
    assert_eq!(
        rules.network.of("2001:db8:7::1".parse().unwrap()),
        "2001:db8::/32"
    );
    assert!(rules.attributes["phone_range"].pattern.is_match("612345"));
}

#[test]
fn the_default_network_is_a_24_and_a_48() {
    let rules = ok(BASE);
    assert_eq!(
        rules.network.of("203.0.113.9".parse().unwrap()),
        "203.0.113.0/24"
    );
    assert_eq!(
        rules.network.of("2001:db8:1:2::5".parse().unwrap()),
        "2001:db8:1::/48"
    );
}

#[test]
fn an_undeclared_attribute_is_an_error_at_its_use() {
    breaks(
        "dimensions = [\"ip\"]",
        "dimensions = [\"attr.phone\"]",
        "scene.s.limits[1].dimensions[0]",
        &["attribute \"phone\" is not declared in [attributes]"],
    );
}

#[test]
fn net_comes_from_ip() {
    breaks(
        "required = [\"user\", \"ip\"]",
        "required = [\"user\", \"ip\", \"net\"]",
        "scene.s.required[2]",
        &["\"net\" comes from the check's ip: require \"ip\" instead"],
    );
    // A limit per net needs the ip required.
    let text = BASE
        .replacen("required = [\"user\", \"ip\"]", "required = [\"user\"]", 1)
        .replacen("dimensions = [\"ip\"]", "dimensions = [\"net\"]", 1);
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "dimensions = [\"net\"]",
        "scene.s.limits[1].dimensions[0]",
        &[
            "\"net\" is not in scene.s.required",
            "add \"ip\" to required",
        ],
    );
}

#[test]
fn an_attribute_limit_needs_the_attribute_required() {
    let text = base_with(
        "dimensions = [\"ip\"]",
        "dimensions = [\"attr.phone_range\"]",
    ) + ATTRS;
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "dimensions = [\"attr.phone_range\"]",
        "scene.s.limits[1].dimensions[0]",
        &["add \"attr.phone_range\" to required"],
    );
}

#[test]
fn network_prefixes_stay_within_their_family() {
    let text = format!("{BASE}\n[network]\nipv4_prefix = 33\n");
    assert_error(
        &single(&text),
        &text,
        "ipv4_prefix = 33",
        "network.ipv4_prefix",
        &["33 is not a prefix length 0..=32"],
    );
    let text = format!("{BASE}\n[network]\nipv6_prefix = 129\n");
    assert_error(
        &single(&text),
        &text,
        "ipv6_prefix = 129",
        "network.ipv6_prefix",
        &["0..=128"],
    );
    let text = format!("{BASE}\n[network]\nipv4_mask = 8\n");
    assert_error(
        &single(&text),
        &text,
        "ipv4_mask",
        "network.ipv4_mask",
        &["unknown field"],
    );
}

#[test]
fn attributes_need_a_key_name_and_a_valid_pattern() {
    let text = format!("{BASE}\n[attributes]\nphone_range = {{ pattern = \"^[0-9\" }}\n");
    assert_error(
        &single(&text),
        &text,
        "pattern = \"^[0-9\"",
        "attributes.phone_range.pattern",
        &["is not a valid regex"],
    );
    let text = format!("{BASE}\n[attributes]\n\"phone-range\" = {{ pattern = \"x\" }}\n");
    assert_error(
        &single(&text),
        &text,
        "\"phone-range\"",
        "attributes.phone-range",
        &["attribute name \"phone-range\" must be 1 to 64 of A-Z a-z 0-9 _"],
    );
}

#[test]
fn network_and_attributes_are_set_wide_sections() {
    let errs = errors(&[
        ("rules/a.toml", &format!("{BASE}{ATTRS}")),
        (
            "rules/b.toml",
            "[attributes]\nother = { pattern = \"x\" }\n",
        ),
    ]);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0]
            .message
            .contains("[attributes] is already defined at rules/a.toml"),
        "{}",
        errs[0]
    );
}

#[test]
fn an_override_may_target_a_limit_per_net() {
    let text = base_with("dimensions = [\"ip\"]", "dimensions = [\"net\"]")
        + "\n[[scene.s.overrides]]\ncidr = \"10.8.0.0/16\"\nlimit = \"ip_1m\"\nmax = 600\n";
    assert_eq!(ok(&text).scene("s").unwrap().overrides.len(), 1);
}
