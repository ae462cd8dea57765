//! `[[scene.X.signals]]` (count × per × where × window), the `[behaviour]` shorthands as
//! signals, `where` on limits, and `[trust].new_device`.

use super::support::*;
use crate::rules::{Count, Dimension, Filter, Signal};

const TRUST: &str = "
[trust]
max_points = 3
new_account = { younger_than = \"7d\", max_factor = 0.5 }
new_device = { younger_than = \"1d\" }
";

const SIGNAL: &str = "
[[scene.s.signals]]
name = \"new_accounts_per_net\"
count = \"users\"
per = [\"net\"]
where = \"new_account\"
window = \"1h\"
max = 5
min_share = 0.5
";

/// BASE (user and ip required) with the signal and `[trust]`, `from` -> `to` in the signal.
fn with_signal(from: &str, to: &str) -> String {
    assert!(SIGNAL.contains(from), "SIGNAL has no {from:?}");
    format!("{BASE}{}{TRUST}", SIGNAL.replacen(from, to, 1))
}

fn breaks_signal(from: &str, to: &str, field: &str, says: &[&str]) {
    let text = with_signal(from, to);
    let err = single(&text);
    assert_error(&err, &text, last_line(to), field, says);
}

#[test]
fn a_signal_entry_compiles_to_its_grammar() {
    let rules = ok(&with_signal("", ""));
    assert_eq!(
        rules.scene("s").unwrap().signals,
        [Signal {
            name: "new_accounts_per_net".into(),
            count: Count::Users,
            per: vec![Dimension::Net],
            filter: Some(Filter::NewAccount),
            window_ms: 3_600_000,
            max: 5,
            min_share: Some(0.5),
        }]
    );
    assert_eq!(
        rules.trust.unwrap().new_device.unwrap().younger_than_ms,
        86_400_000
    );
}

#[test]
fn the_behaviour_shorthands_are_signals_of_the_same_grammar() {
    let text = base_with("required = [\"user\", \"ip\"]", "required = [\"user\", \"ip\", \"device\"]")
        + "\n[scene.s.behaviour]\naccounts_per_ip = { window = \"1h\", max = 50 }\naccounts_per_device = { window = \"1d\", max = 3 }\naccount_switches = { window = \"10m\", max = 2 }\ndevices_per_user = { window = \"1d\", max = 5 }\n"
        + SIGNAL.replace("where = \"new_account\"\n", "").replace("min_share = 0.5\n", "").as_str();
    let signals = ok(&text).scene("s").unwrap().signals.clone();
    let shapes: Vec<(&str, Count, Vec<Dimension>)> = signals
        .iter()
        .map(|s| (s.name.as_str(), s.count, s.per.clone()))
        .collect();
    assert_eq!(
        shapes,
        [
            ("accounts_per_device", Count::Users, vec![Dimension::Device]),
            (
                "account_switches",
                Count::UserSwitches,
                vec![Dimension::Device]
            ),
            ("devices_per_user", Count::Devices, vec![Dimension::User]),
            ("accounts_per_ip", Count::Users, vec![Dimension::Ip]),
            ("new_accounts_per_net", Count::Users, vec![Dimension::Net]),
        ]
    );
    assert!(signals
        .iter()
        .all(|s| s.filter.is_none() && s.min_share.is_none()));
    assert_eq!(signals[1].max, 2);
}

#[test]
fn a_scene_wide_signal_counts_over_no_dimension() {
    let text = with_signal("per = [\"net\"]", "per = []");
    assert_eq!(ok(&text).scene("s").unwrap().signals[0].per, []);
}

#[test]
fn count_per_and_where_must_be_known() {
    breaks_signal(
        "count = \"users\"",
        "count = \"people\"",
        "scene.s.signals[0].count",
        &["\"people\" is not one of users, devices, ips, nets, user_switches, requests"],
    );
    breaks_signal(
        "per = [\"net\"]",
        "per = [\"phone\"]",
        "scene.s.signals[0].per[0]",
        &["\"phone\" is not a dimension"],
    );
    breaks_signal(
        "where = \"new_account\"",
        "where = \"suspicious\"",
        "scene.s.signals[0].where",
        &["is not one of new_account, new_device, untrusted"],
    );
}

#[test]
fn what_a_signal_counts_and_counts_per_must_come_with_the_check() {
    breaks_signal(
        "per = [\"net\"]",
        "per = [\"device\"]",
        "scene.s.signals[0].per[0]",
        &["\"device\" is not in scene.s.required"],
    );
    breaks_signal(
        "count = \"users\"",
        "count = \"devices\"",
        "scene.s.signals[0].count",
        &["counting devices needs \"device\" in scene.s.required"],
    );
    let text = with_signal("per = [\"net\"]", "per = [\"user\"]");
    assert_error(
        &single(&text),
        &text,
        "count = \"users\"",
        "scene.s.signals[0].count",
        &["counting users per user is always 1"],
    );
}

#[test]
fn filters_need_what_they_read_in_the_trust_section() {
    let text = format!("{BASE}{SIGNAL}");
    assert_error(
        &single(&text),
        &text,
        "where = \"new_account\"",
        "scene.s.signals[0].where",
        &["\"new_account\" needs [trust].new_account"],
    );
    let text = format!(
        "{BASE}{}\n[trust]\nmax_points = 1\n",
        SIGNAL.replace("\"new_account\"", "\"new_device\"")
    );
    assert_error(
        &single(&text),
        &text,
        "where = \"new_device\"",
        "scene.s.signals[0].where",
        &["\"new_device\" needs [trust].new_device"],
    );
    let text = format!(
        "{BASE}{}",
        SIGNAL.replace("\"new_account\"", "\"untrusted\"")
    );
    assert_error(
        &single(&text),
        &text,
        "where = \"untrusted\"",
        "scene.s.signals[0].where",
        &["\"untrusted\" needs [trust]"],
    );
}

#[test]
fn min_share_is_a_share_of_a_filtered_count() {
    breaks_signal(
        "min_share = 0.5",
        "min_share = 1.5",
        "scene.s.signals[0].min_share",
        &["1.5 is not in (0, 1]"],
    );
    let text = with_signal("where = \"new_account\"\n", "");
    assert_error(
        &single(&text),
        &text,
        "min_share = 0.5",
        "scene.s.signals[0].min_share",
        &["needs where"],
    );
    let text = with_signal("count = \"users\"", "count = \"user_switches\"");
    assert_error(
        &single(&text),
        &text,
        "min_share = 0.5",
        "scene.s.signals[0].min_share",
        &["does not apply to user_switches"],
    );
}

#[test]
fn signal_names_are_unique_and_new_account_is_taken() {
    let text = format!("{BASE}{SIGNAL}{SIGNAL}{TRUST}");
    let errs = errors(&[(FILE, &text)]);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0]
            .message
            .contains("is already the name of scene.s.signals[0]"),
        "{}",
        errs[0]
    );
    breaks_signal(
        "name = \"new_accounts_per_net\"",
        "name = \"new_account\"",
        "scene.s.signals[0].name",
        &["is the score's new-account signal"],
    );
}

#[test]
fn a_score_may_weigh_a_signal_entry_and_names_what_exists() {
    let text = with_signal("", "")
        + "\n[scene.s.score]\nweights = { new_accounts_per_net = 0.7 }\nsilent_deny_at = 0.7\n";
    assert_eq!(
        ok(&text)
            .scene("s")
            .unwrap()
            .score
            .as_ref()
            .unwrap()
            .weights["new_accounts_per_net"],
        0.7
    );
    let text = with_signal("", "")
        + "\n[scene.s.score]\nweights = { new_account_per_net = 0.7 }\nsilent_deny_at = 0.7\n";
    let err = single(&text);
    assert!(
        err.message
            .contains("\"new_account_per_net\" is not a signal of scene.s (new_accounts_per_net"),
        "{err}"
    );
}

#[test]
fn a_limit_may_count_only_matching_requests() {
    let text = base_with("max = 1\n", "max = 1\nwhere = \"new_device\"\n") + TRUST;
    assert_eq!(
        ok(&text).scene("s").unwrap().limits[0].filter,
        Some(Filter::NewDevice)
    );
    let text = base_with("max = 1\n", "max = 1\nwhere = \"new_device\"\n");
    assert_error(
        &single(&text),
        &text,
        "where = \"new_device\"",
        "scene.s.limits[0].where",
        &["needs [trust].new_device"],
    );
}
