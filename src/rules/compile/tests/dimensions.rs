//! `net`, `attr.NAME`, `[network]` and `[attributes]`.

use super::support::*;
use crate::rules::{compile_files, Dimension};

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

/// An IPv6 address's `ip` is its /64 unless `ipv6_ip_prefix` says otherwise; a rule set
/// that narrows its nets past /64 without naming the `ip` keeps loading, its `ip` as narrow.
#[test]
fn an_ipv6_ip_is_a_64_unless_set() {
    let of = |rules: &crate::rules::RuleSet| {
        let group = rules.network.ip_of("2001:db8:1:2:3:4:5:6".parse().unwrap());
        (rules.network.ipv6_ip_prefix, group.as_str().to_string())
    };
    assert_eq!(of(&ok(BASE)), (64, "2001:db8:1:2::/64".into()));
    let set = format!("{BASE}\n[network]\nipv6_ip_prefix = 56\n");
    assert_eq!(of(&ok(&set)), (56, "2001:db8:1::/56".into()));
    let exact = format!("{BASE}\n[network]\nipv6_ip_prefix = 128\n");
    assert_eq!(of(&ok(&exact)), (128, "2001:db8:1:2:3:4:5:6".into()));
    let narrow_nets = format!("{BASE}\n[network]\nipv6_prefix = 80\n");
    assert_eq!(of(&ok(&narrow_nets)), (80, "2001:db8:1:2:3::/80".into()));
}

/// `ipv6_ip_prefix` is a length 1..=128, and no shorter than `ipv6_prefix`: one client's
/// addresses lie within one network.
#[test]
fn the_ipv6_ip_prefix_is_a_length_within_the_net() {
    for (line, says) in [
        ("ipv6_ip_prefix = 0", "0 is not a prefix length 1..=128"),
        ("ipv6_ip_prefix = 129", "129 is not a prefix length 1..=128"),
        (
            "ipv6_ip_prefix = 40",
            "40 is shorter than network.ipv6_prefix (48)",
        ),
    ] {
        let text = format!("{BASE}\n[network]\n{line}\n");
        assert_error(
            &single(&text),
            &text,
            line,
            "network.ipv6_ip_prefix",
            &[says],
        );
    }
    let text = format!("{BASE}\n[network]\nipv6_prefix = 32\nipv6_ip_prefix = 40\n");
    assert_eq!(ok(&text).network.ipv6_ip_prefix, 40);
}

const V6_OVERRIDE: &str =
    "\n[[scene.s.overrides]]\ncidr = \"2001:db8:8::/96\"\nlimit = \"ip_1m\"\nmax = 600\n";

/// An override narrower than one IPv6 `ip` would give some addresses of a /64 one max and
/// the rest another, in one key: refused at its line, naming the prefix that decides it.
#[test]
fn an_override_may_not_split_an_ipv6_ip() {
    let text = format!("{BASE}{V6_OVERRIDE}");
    assert_error(
        &single(&text),
        &text,
        "cidr = ",
        "scene.s.overrides[0].cidr",
        &[
            "2001:db8:8::/96 is narrower than one IPv6 `ip` (a /64",
            "ipv6_ip_prefix",
        ],
    );
    // With the `ip` at /128 (set in another file), the range holds whole clients.
    let rules = compile_files(&[
        ("rules/a.toml".into(), format!("{BASE}{V6_OVERRIDE}")),
        (
            "rules/b.toml".into(),
            "[network]\nipv6_ip_prefix = 128\n".into(),
        ),
    ])
    .expect("valid");
    let cidr = rules.scene("s").unwrap().overrides[0].cidr;
    assert_eq!(cidr.to_string(), "2001:db8:8::/96");
    // A broken [network] reports itself, not the overrides that depend on it.
    let text = format!("{BASE}{V6_OVERRIDE}\n[network]\nipv6_ip_prefix = 0\n");
    assert_error(
        &single(&text),
        &text,
        "ipv6_ip_prefix = 0",
        "network.ipv6_ip_prefix",
        &[],
    );
}

/// An override written in IPv4-mapped form is the IPv4 range: checks' mapped addresses
/// fold to IPv4, and so does the range they are matched against.
#[test]
fn an_ipv4_mapped_override_is_its_ipv4_range() {
    let text = format!("{BASE}{V6_OVERRIDE}").replace("2001:db8:8::/96", "::ffff:10.8.0.0/112");
    let cidr = ok(&text).scene("s").unwrap().overrides[0].cidr;
    assert_eq!(cidr.to_string(), "10.8.0.0/16");
}
