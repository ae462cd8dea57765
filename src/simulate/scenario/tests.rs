use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;
use regex::Regex;
use serde_json::Value;

use super::*;
use crate::simulate::traffic::{Cost, Entry, Line, OnChallenge, Reader};

const SMALL: &str = r#"
seed = 7
scene = "coupon_claim"
start = "2026-12-24T10:00:00Z"
span = "1h"
activity_id = "xmas-2026"

[honest]
users = 40
claims = 2
paid_share = 0.25
new_share = 0.25
double_click_share = 0.5
networks = 10

[[nat]]
label = "campus"
users = 30
cidr = "10.8.0.0/16"
addresses = 4
new_share = 0.3
paid_share = 0.1
double_click_share = 0.1

[[attacker]]
label = "farm"
accounts = 50
devices = 7
proxies = { cidrs = ["203.0.113.0/24", "198.51.100.0/25"] }
tries = 3
account_age = "2d"
arrive_within = "2m"
interval = "11s"
paid_share = 0.2

[[attacker]]
label = "spoofed"
accounts = 20
devices = "per_account"
proxies = { addresses = ["192.0.2.7", "192.0.2.8"] }
tries = 2
account_age = "1d"
arrive_within = "30s"
interval = "5s"
"#;

fn scenario(text: &str) -> Scenario {
    Scenario::parse("t.toml", text).unwrap_or_else(|e| panic!("{e}"))
}

fn generate(s: &Scenario, seed: u64) -> (Vec<u8>, Summary) {
    let mut out = Vec::new();
    let summary = write(s, seed, &mut out).unwrap();
    (out, summary)
}

/// A check line, flattened for assertions.
#[derive(Debug)]
struct Check {
    at_ms: u64,
    label: String,
    user: String,
    device: String,
    ip: IpAddr,
    created_ms: u64,
    body: Value,
}

/// Reads traffic back with the replayer's reader: it refuses lines out of time order.
fn read(bytes: &[u8]) -> (Vec<Check>, Vec<(u64, Value)>) {
    let mut checks = Vec::new();
    let mut events = Vec::new();
    for line in Reader::new(bytes) {
        match line.unwrap_or_else(|e| panic!("{e}")).1 {
            Line::Check {
                at_ms,
                label,
                check,
                decision,
            } => {
                assert!(decision.is_none());
                let s = |k: &str| {
                    check[k]
                        .as_str()
                        .unwrap_or_else(|| panic!("{k}: {check}"))
                        .to_string()
                };
                let created = chrono::DateTime::parse_from_rfc3339(&s("user_created_at")).unwrap();
                checks.push(Check {
                    at_ms,
                    label: label.unwrap(),
                    user: s("user_id"),
                    device: s("device_id"),
                    ip: s("ip").parse().unwrap(),
                    created_ms: created.timestamp_millis() as u64,
                    body: check,
                });
            }
            Line::Event { at_ms, event } => events.push((at_ms, event)),
        }
    }
    (checks, events)
}

fn start_ms() -> u64 {
    chrono::DateTime::parse_from_rfc3339("2026-12-24T10:00:00Z")
        .unwrap()
        .timestamp_millis() as u64
}

#[test]
fn scenario_same_seed_same_bytes_other_seed_other_bytes() {
    let s = scenario(SMALL);
    let (a, _) = generate(&s, 7);
    let (b, _) = generate(&s, 7);
    assert_eq!(a, b);
    let (c, _) = generate(&s, 8);
    assert_ne!(a, c);
    // Parsing again gives the same scenario, hence the same bytes.
    assert_eq!(generate(&scenario(SMALL), 7).0, a);
}

#[test]
fn scenario_lines_are_in_time_order_with_the_right_counts() {
    let s = scenario(SMALL);
    let (bytes, summary) = generate(&s, s.seed);
    let (checks, events) = read(&bytes);
    let mut by_label: BTreeMap<String, u64> = BTreeMap::new();
    for c in &checks {
        *by_label.entry(c.label.clone()).or_default() += 1;
    }
    // users × claims × (1 + double-click); accounts × tries.
    let want = BTreeMap::from([
        ("honest".to_string(), (40 + 20) * 2),
        ("campus".to_string(), 30 + 3),
        ("farm".to_string(), 50 * 3),
        ("spoofed".to_string(), 20 * 2),
    ]);
    assert_eq!(by_label, want);
    assert_eq!(summary.by_label, want);
    assert_eq!(summary.checks, checks.len() as u64);
    assert_eq!(s.checks(), checks.len() as u64);
    // One payment per paid user: 25% of 40, 10% of 30, 20% of 50.
    assert_eq!(events.len(), 10 + 3 + 10);
    assert_eq!(summary.events, events.len() as u64);
    assert_eq!(summary.lines, summary.checks + summary.events);
    assert_eq!(
        bytes.iter().filter(|&&b| b == b'\n').count() as u64,
        summary.lines
    );

    // Events come first, in one batch an hour before the drop.
    let first = std::str::from_utf8(&bytes).unwrap().lines().next().unwrap();
    assert!(first.contains("\"event\""), "{first}");
    let batch = start_ms() - 3_600_000;
    assert!(events.iter().all(|(at, _)| *at == batch));
    assert!(checks.iter().all(|c| c.at_ms >= start_ms()));

    let mut paid = BTreeSet::new();
    for (_, e) in &events {
        let user = e["user_id"].as_str().unwrap();
        assert_eq!(e["event_id"], format!("pay-{user}"));
        assert_eq!(e["type"], "payment_succeeded");
        assert!(paid.insert(user.to_string()), "two payments for {user}");
        // The ingest endpoint's own parser accepts it.
        crate::trust::event::parse_body(e).unwrap();
    }
    let users: BTreeSet<&str> = checks.iter().map(|c| c.user.as_str()).collect();
    assert!(paid.iter().all(|u| users.contains(u.as_str())));
}

#[test]
fn scenario_check_bodies_have_the_expected_shape() {
    let s = scenario(SMALL);
    let (bytes, _) = generate(&s, 3);
    let (checks, _) = read(&bytes);
    let pattern = Regex::new("^[A-Za-z0-9_-]{8,64}$").unwrap();
    let keys: BTreeSet<&str> = [
        "scene",
        "user_id",
        "device_id",
        "ip",
        "user_created_at",
        "activity_id",
    ]
    .into();
    for c in &checks {
        let mut got: BTreeSet<&str> = c
            .body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        // A real user's claim is an action with an idempotency key; a script's is not.
        let real = c.label == "honest" || c.label == "campus";
        assert_eq!(got.remove("idempotency_key"), real, "{}", c.body);
        assert_eq!(got, keys, "{}", c.body);
        assert_eq!(c.body["scene"], "coupon_claim");
        assert_eq!(c.body["activity_id"], "xmas-2026");
        assert!(pattern.is_match(&c.device), "{}", c.device);
        assert!(c.created_ms < c.at_ms, "{:?}", c);
        let prefix = format!("{}-", c.label);
        let index = c
            .user
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{}", c.user));
        assert!(
            index.len() == 6 && index.bytes().all(|b| b.is_ascii_digit()),
            "{}",
            c.user
        );
    }
    // Each honest or NAT user has one device and one address.
    let mut seen: BTreeMap<&str, (&str, IpAddr)> = BTreeMap::new();
    for c in checks
        .iter()
        .filter(|c| c.label == "honest" || c.label == "campus")
    {
        let first = *seen.entry(&c.user).or_insert((&c.device, c.ip));
        assert_eq!(first, (c.device.as_str(), c.ip), "{}", c.user);
    }
}

#[test]
fn scenario_honest_habits_show_in_the_traffic() {
    let s = scenario(SMALL);
    let (bytes, _) = generate(&s, 11);
    let (checks, _) = read(&bytes);
    let honest: Vec<&Check> = checks.iter().filter(|c| c.label == "honest").collect();
    let mut per_user: BTreeMap<&str, Vec<&Check>> = BTreeMap::new();
    for c in &honest {
        per_user.entry(&c.user).or_default().push(c);
    }
    assert_eq!(per_user.len(), 40);
    let (mut doubles, mut new) = (0, 0);
    let end = start_ms() + 3_600_000;
    for claims in per_user.values() {
        assert!(claims.iter().all(|c| c.at_ms < end + 600));
        let first = claims[0].at_ms;
        let age = first - claims[0].created_ms;
        if age <= 86_400_000 {
            new += 1;
            assert!(age >= 600_000, "{age}");
        } else {
            assert!(start_ms() - claims[0].created_ms >= 60 * 86_400_000);
        }
        if claims.len() == 4 {
            doubles += 1;
            // Each claim and its copy 150 to 600 ms later.
            let mut gaps: Vec<u64> = claims.windows(2).map(|w| w[1].at_ms - w[0].at_ms).collect();
            gaps.sort_unstable();
            assert!(
                gaps[..2].iter().all(|g| (150..=600).contains(g)),
                "{gaps:?}"
            );
            // A copy carries the key of the click it copies: two claims, two keys.
            let keys: BTreeSet<&str> = claims
                .iter()
                .map(|c| c.body["idempotency_key"].as_str().unwrap())
                .collect();
            assert_eq!(keys.len(), 2, "{claims:?}");
        } else {
            assert_eq!(claims.len(), 2);
        }
    }
    assert_eq!((doubles, new), (20, 10));
    // Home addresses come from the 10 networks.
    let networks: BTreeSet<[u8; 3]> = honest
        .iter()
        .map(|c| match c.ip {
            IpAddr::V4(v4) => {
                let o = v4.octets();
                assert!((1..=254).contains(&o[3]));
                [o[0], o[1], o[2]]
            }
            IpAddr::V6(_) => panic!("{}", c.ip),
        })
        .collect();
    assert!(networks.len() <= 10);
}

#[test]
fn scenario_farm_devices_and_per_account_devices() {
    let s = scenario(SMALL);
    let (bytes, _) = generate(&s, 5);
    let (checks, _) = read(&bytes);
    let farm: BTreeSet<&str> = checks
        .iter()
        .filter(|c| c.label == "farm")
        .map(|c| c.device.as_str())
        .collect();
    assert_eq!(farm.len(), 7, "{farm:?}");
    assert!(farm.iter().all(|d| d.starts_with("farm0-")), "{farm:?}");
    let mut spoofed: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for c in checks.iter().filter(|c| c.label == "spoofed") {
        spoofed.entry(&c.user).or_default().insert(&c.device);
    }
    assert_eq!(spoofed.len(), 20);
    assert!(
        spoofed.values().all(|d| d.len() == 1),
        "one fingerprint per account"
    );
    let distinct: BTreeSet<&&str> = spoofed.values().flatten().collect();
    assert_eq!(distinct.len(), 20, "a fresh fingerprint per account");
}

#[test]
fn scenario_attacker_timing_follows_the_cohort() {
    let s = scenario(SMALL);
    let (bytes, _) = generate(&s, 9);
    let (checks, _) = read(&bytes);
    let mut tries: BTreeMap<&str, Vec<&Check>> = BTreeMap::new();
    for c in checks.iter().filter(|c| c.label == "farm") {
        tries.entry(&c.user).or_default().push(c);
    }
    for t in tries.values() {
        assert_eq!(t.len(), 3);
        assert!(t[0].at_ms < start_ms() + 120_000);
        for w in t.windows(2) {
            assert!((11_000..12_000).contains(&(w[1].at_ms - w[0].at_ms)));
        }
        let age = start_ms() - t[0].created_ms;
        assert!((155_520_000..=190_080_000).contains(&age), "{age}");
    }
}

#[test]
fn scenario_proxy_and_nat_addresses_stay_in_their_ranges() {
    let s = scenario(SMALL);
    let (bytes, _) = generate(&s, 13);
    let (checks, _) = read(&bytes);
    let proxies: Vec<IpNet> = ["203.0.113.0/24", "198.51.100.0/25"]
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
    let farm: Vec<IpAddr> = checks
        .iter()
        .filter(|c| c.label == "farm")
        .map(|c| c.ip)
        .collect();
    assert!(
        farm.iter().all(|ip| proxies.iter().any(|n| n.contains(ip))),
        "{farm:?}"
    );
    // 150 tries over 384 addresses: drawn per try, so many distinct, from both networks.
    assert!(farm.iter().collect::<BTreeSet<_>>().len() > 50);
    assert!(proxies.iter().all(|n| farm.iter().any(|ip| n.contains(ip))));
    let listed: BTreeSet<IpAddr> = ["192.0.2.7", "192.0.2.8"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let spoofed: BTreeSet<IpAddr> = checks
        .iter()
        .filter(|c| c.label == "spoofed")
        .map(|c| c.ip)
        .collect();
    assert_eq!(spoofed, listed);
    let campus: IpNet = "10.8.0.0/16".parse().unwrap();
    let nat: BTreeSet<IpAddr> = checks
        .iter()
        .filter(|c| c.label == "campus")
        .map(|c| c.ip)
        .collect();
    assert!(!nat.is_empty() && nat.len() <= 4, "{nat:?}");
    assert!(nat.iter().all(|ip| campus.contains(ip)), "{nat:?}");
}

#[test]
fn scenario_residential_proxies_spread_over_random_networks() {
    let text = r#"
seed = 1
scene = "coupon_claim"
start = "2026-12-24T10:00:00Z"
span = "1h"
[[attacker]]
accounts = 200
devices = 3
proxies = { random_networks = 5 }
tries = 2
account_age = "2d"
arrive_within = "1m"
interval = "11s"
"#;
    let (bytes, summary) = generate(&scenario(text), 1);
    let (checks, events) = read(&bytes);
    assert!(events.is_empty());
    assert_eq!(
        summary.by_label,
        BTreeMap::from([("attacker".to_string(), 400)])
    );
    let networks: BTreeSet<[u8; 3]> = checks
        .iter()
        .map(|c| match c.ip {
            IpAddr::V4(v4) => [v4.octets()[0], v4.octets()[1], v4.octets()[2]],
            IpAddr::V6(_) => panic!("{}", c.ip),
        })
        .collect();
    assert_eq!(networks.len(), 5);
    assert!(checks
        .iter()
        .all(|c| !c.body.as_object().unwrap().contains_key("activity_id")));
}

#[test]
fn scenario_populations_draw_from_their_own_streams() {
    // Adding an attacker leaves the honest and campus traffic exactly as it was, so two
    // scenarios differ only by what they add.
    let quiet = SMALL.split("[[attacker]]").next().unwrap();
    let keep = |bytes: &[u8]| -> Vec<String> {
        let text = std::str::from_utf8(bytes).unwrap();
        let honest =
            |l: &&str| l.contains("\"label\":\"honest\"") || l.contains("\"label\":\"campus\"");
        text.lines().filter(honest).map(str::to_string).collect()
    };
    let (with, _) = generate(&scenario(SMALL), 21);
    let (without, _) = generate(&scenario(quiet), 21);
    assert_eq!(keep(&with), keep(&without));
}

#[test]
fn scenario_repeated_labels_get_distinct_user_ids() {
    let cohort = r#"
[[attacker]]
accounts = 3
devices = 1
proxies = { addresses = ["192.0.2.1"] }
tries = 1
account_age = "2d"
arrive_within = "1m"
interval = "11s"
"#;
    let text = format!(
        "seed = 1\nscene = \"s\"\nstart = \"2026-12-24T10:00:00Z\"\nspan = \"1h\"\n{cohort}{cohort}"
    );
    let s = scenario(&text);
    let (bytes, summary) = generate(&s, 1);
    let (checks, _) = read(&bytes);
    let users: BTreeSet<&str> = checks.iter().map(|c| c.user.as_str()).collect();
    assert_eq!(users.len(), 6, "{users:?}");
    assert!(users.contains("attacker1-000000") && users.contains("attacker2-000002"));
    let devices: BTreeSet<&str> = checks.iter().map(|c| c.device.as_str()).collect();
    assert_eq!(devices, BTreeSet::from(["farm0-00000", "farm1-00000"]));
    assert_eq!(summary.by_label["attacker"], 6);

    // A label that would clash with a derived prefix is refused.
    let clash = format!(
        "{text}{}",
        cohort.replace("accounts", "label = \"attacker1\"\naccounts")
    );
    let e = Scenario::parse("t.toml", &clash).unwrap_err().to_string();
    assert!(
        e.contains("attacker[2].label: user ids attacker1-NNNNNN would clash"),
        "{e}"
    );
}

#[test]
fn scenario_generated_checks_pass_the_service_validation() {
    // Every body is one /v1/check accepts under the shipped rules, device pattern included.
    let rules =
        crate::rules::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("rules")).unwrap();
    let (bytes, _) = generate(&scenario(SMALL), 17);
    let (checks, _) = read(&bytes);
    for c in &checks {
        let req = crate::check::request::parse_check(&rules, &c.body, 0)
            .unwrap_or_else(|e| panic!("{e}: {}", c.body));
        assert!(!req.device_invalid, "{}", c.body);
        assert!(req.user_created_at.is_some());
    }
}

/// Parses `body` after a valid head and returns the error text.
fn refused(body: &str) -> String {
    let text = format!("seed = 1\nscene = \"coupon_claim\"\nstart = \"2026-12-24T10:00:00Z\"\nspan = \"1h\"\n{body}");
    match Scenario::parse("x.toml", &text) {
        Ok(_) => panic!("accepted:\n{body}"),
        Err(e) => e.to_string(),
    }
}

const ATTACKER: &str = "[[attacker]]\naccounts = 10\ndevices = 2\nproxies = { cidrs = [\"203.0.113.0/24\"] }\ntries = 3\naccount_age = \"2d\"\narrive_within = \"2m\"\ninterval = \"11s\"\n";

#[test]
fn scenario_invalid_files_name_the_line_and_field() {
    let nat = |addresses: &str| {
        format!("[[nat]]\nusers = 10\ncidr = \"10.8.0.0/16\"\naddresses = {addresses}\n")
    };
    let cases: Vec<(String, &str)> = vec![
        (nat("70000"), "x.toml:8: nat[0].addresses: 70000 is more than the 65536 addresses of 10.8.0.0/16"),
        (nat("0"), "x.toml:8: nat[0].addresses: 0 is less than 1"),
        (nat("4").replace("10.8.0.0/16", "10.8.0.0/33"), "x.toml:7: nat[0].cidr: \"10.8.0.0/33\" is not a CIDR"),
        (nat("4").replace("10.8.0.0/16", "10.8.1.0/16"), "x.toml:7: nat[0].cidr: 10.8.1.0/16 has host bits set"),
        ("[honest]\nusers = 10\npaid_share = 1.5\n".into(), "x.toml:7: honest.paid_share: 1.5 is not between 0 and 1"),
        ("[honest]\nusers = 10\npaid_share = 0.8\nnew_share = 0.3\n".into(), "x.toml:7: honest.paid_share: 0.8 plus new_share 0.3 is more than 1"),
        ("[honest]\nusers = -1\n".into(), "x.toml:6: honest.users: -1 is less than 1"),
        ("[honest]\nusers = \"many\"\n".into(), "x.toml:6: honest.users: invalid type: string \"many\", expected an integer"),
        ("[honest]\nusers = 10\nlable = \"x\"\n".into(), "x.toml:7: honest.lable: unknown field `lable`"),
        ("[honest]\nusers = 10\nlabel = \"\"\n".into(), "x.toml:7: honest.label: must not be empty"),
        ("[honest]\nclaims = 2\n".into(), "x.toml:5: honest.users: is required"),
        (format!("{ATTACKER}{ATTACKER}").replacen("devices = 2", "devices = 0", 2).replacen("devices = 0", "devices = 2", 1), "x.toml:15: attacker[1].devices: 0 is less than 1"),
        (ATTACKER.replace("devices = 2", "devices = \"many\""), "x.toml:7: attacker[0].devices: \"many\" is neither a number of devices nor \"per_account\""),
        (ATTACKER.replace("\"203.0.113.0/24\"", "\"203.0.113.0/24\", \"nope\""), "x.toml:8: attacker[0].proxies.cidrs[1]: \"nope\" is not a CIDR"),
        (ATTACKER.replace("cidrs = [\"203.0.113.0/24\"]", "addresses = [\"1.2.3.999\"]"), "x.toml:8: attacker[0].proxies.addresses[0]: \"1.2.3.999\" is not an IP address"),
        (ATTACKER.replace("cidrs = [\"203.0.113.0/24\"]", "random_networks = 0"), "x.toml:8: attacker[0].proxies.random_networks: 0 is less than 1"),
        (ATTACKER.replace("cidrs = [\"203.0.113.0/24\"]", "cidrs = [\"203.0.113.0/24\"], random_networks = 3"), "x.toml:8: attacker[0].proxies: give exactly one of cidrs, addresses or random_networks"),
        (ATTACKER.replace("\"11s\"", "\"11 seconds\""), "x.toml:12: attacker[0].interval: \"11 seconds\" is not a duration"),
        (ATTACKER.replace("\"2m\"", "\"0s\""), "x.toml:11: attacker[0].arrive_within: \"0s\" is not a duration"),
        (ATTACKER.replace("tries = 3\n", ""), "x.toml:5: attacker[0].tries: is required"),
        (format!("{ATTACKER}paid_share = 0.5\n").replace("\"2d\"", "\"1h\""), "x.toml:13: attacker[0].paid_share: needs account_age of at least 2h"),
        ("[honest]\nusers = 10\n[honest]\n".into(), "x.toml:7: invalid TOML"),
        ("[honest]\nusers = 10\nchallenge_pass = 1.2\n".into(), "x.toml:7: honest.challenge_pass: 1.2 is not between 0 and 1"),
        ("[honest]\nusers = 10\nrush = { share = 0.6 }\n".into(), "x.toml:7: honest.rush.within: is required"),
        ("[honest]\nusers = 10\nrush = { share = 1.6, within = \"5m\" }\n".into(), "x.toml:7: honest.rush.share: 1.6 is not between 0 and 1"),
        ("[honest]\nusers = 10\nrush = { share = 0.5, within = \"2h\" }\n".into(), "x.toml:7: honest.rush.within: \"2h\" is longer than span"),
        ("[honest]\nusers = 10\nrush = { share = 0.5, within = \"soon\" }\n".into(), "x.toml:7: honest.rush.within: \"soon\" is not a duration"),
        ("[honest]\nusers = 10\nrush = { share = 0.5, within = \"5m\", spread = 2 }\n".into(), "x.toml:7: honest.rush.spread: unknown field `spread`"),
        ("[honest]\nusers = 10\ncost = { account = 1 }\n".into(), "x.toml:7: honest.cost: unknown field `cost`"),
        (format!("{}rush = {{ share = -0.5, within = \"5m\" }}\n", nat("4")), "x.toml:9: nat[0].rush.share: -0.5 is not between 0 and 1"),
        (format!("{}challenge_pass = 2\n", nat("4")), "x.toml:9: nat[0].challenge_pass: 2 is not between 0 and 1"),
        (format!("{ATTACKER}challenge_pass = -0.1\n"), "x.toml:13: attacker[0].challenge_pass: -0.1 is not between 0 and 1"),
        (format!("{ATTACKER}cost = {{ account = -1 }}\n"), "x.toml:13: attacker[0].cost.account: -1 is not a price"),
        (format!("{ATTACKER}cost = {{ device = nan }}\n"), "x.toml:13: attacker[0].cost.device: NaN is not a price"),
        (format!("{ATTACKER}cost = {{}}\n"), "x.toml:13: attacker[0].cost: name at least one price"),
        (format!("{ATTACKER}cost = {{ acount = 1 }}\n"), "x.toml:13: attacker[0].cost.acount: unknown field `acount`"),
        (format!("{ATTACKER}cost = {{ device = \"cheap\" }}\n"), "x.toml:13: attacker[0].cost.device: invalid type: string \"cheap\", expected a number"),
        (format!("{ATTACKER}cost = {{ account = 1 }}\n{ATTACKER}cost = {{ account = 2 }}\n"), "x.toml:22: attacker[1].cost: attacker[0] shares the label \"attacker\" and another cost"),
        (format!("{ATTACKER}cost = {{ account = 1 }}\n{ATTACKER}"), "x.toml:15: attacker[1].cost: attacker[0] shares the label \"attacker\" and another cost"),
    ];
    for (body, want) in cases {
        let got = refused(&body);
        assert!(got.starts_with(want), "\n{body}\n got: {got}\nwant: {want}");
    }
}

#[test]
fn scenario_invalid_heads_name_the_line_and_field() {
    let head = "seed = 1\nscene = \"coupon_claim\"\nstart = \"2026-12-24T10:00:00Z\"\nspan = \"1h\"\n[honest]\nusers = 1\n";
    let cases = [
        (
            head.replace("seed = 1", "seed = -1"),
            "x.toml:1: seed: must not be negative",
        ),
        (
            head.replace("seed = 1\n", ""),
            "x.toml:1: seed: is required",
        ),
        (
            head.replace("\"coupon_claim\"", "\"\""),
            "x.toml:2: scene: must not be empty",
        ),
        (
            head.replace("\"2026-12-24T10:00:00Z\"", "\"Christmas\""),
            "x.toml:3: start: \"Christmas\" is not an RFC 3339 time",
        ),
        (
            head.replace("\"2026-12-24T10:00:00Z\"", "\"1970-01-02T00:00:00Z\""),
            "x.toml:3: start: \"1970-01-02T00:00:00Z\" is too early",
        ),
        (
            head.replace("\"1h\"", "\"1y\""),
            "x.toml:4: span: \"1y\" is not a duration",
        ),
        (
            format!("{head}colour = 1\n"),
            "x.toml:7: honest.colour: unknown field `colour`",
        ),
        (
            head.replace("span", "spam"),
            "x.toml:4: spam: unknown field `spam`",
        ),
    ];
    for (text, want) in cases {
        let got = Scenario::parse("x.toml", &text).unwrap_err().to_string();
        assert!(got.starts_with(want), "\n{text}\n got: {got}\nwant: {want}");
    }
    let empty = "seed = 1\nscene = \"s\"\nstart = \"2026-12-24T10:00:00Z\"\nspan = \"1h\"\n";
    let e = Scenario::parse("x.toml", empty).unwrap_err();
    assert!(matches!(e, ScenarioError::Empty { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "x.toml: no population: add [honest], [[nat]] or [[attacker]]"
    );
    // A bare TOML date-time is as good as a string.
    let bare = head.replace("\"2026-12-24T10:00:00Z\"", "2026-12-24T10:00:00Z");
    assert_eq!(scenario(&bare).start_ms, start_ms());
}

#[test]
fn scenario_load_names_a_missing_file() {
    let e = Scenario::load(Path::new("/nonexistent/x.toml")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/x.toml: cannot read"),
        "{e}"
    );
}

#[test]
fn scenario_shipped_examples_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/scenarios");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert_eq!(s.scene, "coupon_claim");
            // The seed's drops open on Christmas Eve; the hold-outs (never tuned to) on
            // other days.
            if name != "flash_drop_mixed.toml" && name != "coupon_drop_holdout.toml" {
                assert_eq!(s.start_ms, start_ms(), "{name}");
            }
            names.push(name);
        }
    }
    names.sort();
    assert_eq!(
        names,
        [
            "coupon_drop_farm.toml",
            "coupon_drop_holdout.toml",
            "coupon_drop_residential.toml",
            "coupon_drop_rush.toml",
            "coupon_drop_rush_residential.toml",
            "coupon_drop_rush_solver.toml",
            "flash_drop_mixed.toml",
            "quiet_day.toml"
        ]
    );
}

#[test]
fn scenario_shipped_farm_example_has_the_article_numbers() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/scenarios/coupon_drop_farm.toml");
    let s = Scenario::load(&path).unwrap();
    let honest = s.honest.as_ref().unwrap();
    assert_eq!((honest.users, honest.networks), (1500, 750));
    assert_eq!(s.nats.len(), 1);
    assert_eq!((s.nats[0].users, s.nats[0].addresses), (300, 4));
    // The stock the example is replayed with (2000) covers every real user: whoever goes
    // without was turned away by an attacker or by the rules, not by the arithmetic.
    assert!(honest.users + s.nats[0].users <= 2000);
    assert_eq!(s.attackers.len(), 2);
    assert_eq!(s.attackers[0].devices, Devices::Farm(30));
    assert_eq!(s.attackers[1].devices, Devices::PerAccount);
    let one_net = Proxies::Cidrs(vec!["203.0.113.0/24".parse().unwrap()]);
    assert!(s
        .attackers
        .iter()
        .all(|a| a.proxies == one_net && a.accounts == 1500 && a.tries == 3));
    // 1500 + 150 double clicks, 300 + 30, 4500 + 4500.
    assert_eq!(s.checks(), 1650 + 330 + 9000);
}

/// A scenario with every challenge and cost field: a rushing crowd that mostly passes, a
/// NAT that passes half the time, a solver cohort with a cost, a cohort that never passes
/// with a cost, and one without.
const CHALLENGED: &str = r#"
seed = 5
scene = "coupon_claim"
start = "2026-12-24T10:00:00Z"
span = "3h"

[honest]
users = 400
new_share = 0.1
double_click_share = 0.2
rush = { share = 0.5, within = "5m" }

[[nat]]
label = "campus"
users = 200
cidr = "10.8.0.0/16"
addresses = 4
challenge_pass = 0.5

[[attacker]]
label = "attacker/farm"
accounts = 500
devices = 10
proxies = { cidrs = ["203.0.113.0/24"] }
tries = 2
account_age = "2d"
arrive_within = "2m"
interval = "11s"
challenge_pass = 0.2
cost = { account = 0.3, device = 8 }

[[attacker]]
label = "attacker/spoofed"
accounts = 300
devices = "per_account"
proxies = { cidrs = ["203.0.113.0/24"] }
tries = 1
account_age = "2d"
arrive_within = "2m"
interval = "11s"
cost = { proxy_address = 0.05, challenge_solved = 0.003 }

[[attacker]]
label = "attacker/unpriced"
accounts = 10
devices = 1
proxies = { cidrs = ["203.0.113.0/24"] }
tries = 1
account_age = "2d"
arrive_within = "2m"
interval = "11s"
"#;

/// Every line, whatever its kind.
fn entries(bytes: &[u8]) -> Vec<Entry> {
    let mut reader = Reader::new(bytes);
    std::iter::from_fn(|| reader.next_entry())
        .map(|e| e.unwrap_or_else(|e| panic!("{e}")).1)
        .collect()
}

#[test]
fn scenario_cohort_lines_come_first_with_the_costs_given() {
    let s = scenario(CHALLENGED);
    let (bytes, summary) = generate(&s, s.seed);
    let all = entries(&bytes);
    let cohorts: Vec<(String, Cost)> = all
        .iter()
        .map_while(|e| match e {
            Entry::Cohort(c) => Some((c.label.clone(), c.cost)),
            Entry::Happens { .. } => None,
        })
        .collect();
    // A price left out is 0; a cohort without a cost has no line.
    assert_eq!(
        cohorts,
        [
            (
                "attacker/farm".to_string(),
                Cost {
                    account: 0.3,
                    device: 8.0,
                    ..Cost::default()
                }
            ),
            (
                "attacker/spoofed".to_string(),
                Cost {
                    proxy_address: 0.05,
                    challenge_solved: 0.003,
                    ..Cost::default()
                }
            ),
        ]
    );
    let later = all[2..]
        .iter()
        .filter(|e| matches!(e, Entry::Cohort(_)))
        .count();
    assert_eq!(later, 0, "cohort lines come before every other line");
    assert_eq!(summary.cohorts, 2);
    assert_eq!(
        summary.lines,
        summary.cohorts + summary.checks + summary.events
    );
    assert_eq!(
        bytes.iter().filter(|&&b| b == b'\n').count() as u64,
        summary.lines
    );
    // Two cohorts sharing a label and its cost write one line for it.
    let twice = CHALLENGED
        .replace("\"attacker/spoofed\"", "\"attacker/farm\"")
        .replace(
            "cost = { proxy_address = 0.05, challenge_solved = 0.003 }",
            "cost = { account = 0.3, device = 8 }",
        );
    let (_, summary) = generate(&scenario(&twice), 5);
    assert_eq!(summary.cohorts, 1);
}

#[test]
fn scenario_every_check_says_what_its_sender_does_when_challenged() {
    let s = scenario(CHALLENGED);
    let (bytes, _) = generate(&s, s.seed);
    // label -> (lines, passes); copies of a double click apart.
    let mut answers: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut copies = 0;
    let mut keys = BTreeSet::new();
    for e in entries(&bytes) {
        let Entry::Happens {
            line: Line::Check { label, check, .. },
            on_challenge,
        } = e
        else {
            continue;
        };
        let on_challenge = on_challenge.expect("a generated check says what its sender does");
        // The second line with one idempotency key is a double click's copy: the person
        // answers the challenge on their screen once, for the click it copies.
        if let Some(key) = check.get("idempotency_key").and_then(Value::as_str) {
            if !keys.insert(key.to_string()) {
                copies += 1;
                assert_eq!(on_challenge, OnChallenge::GiveUp, "{check}");
                continue;
            }
        }
        let a = answers.entry(label.unwrap()).or_default();
        a.0 += 1;
        if let OnChallenge::Pass { solve_ms } = on_challenge {
            a.1 += 1;
            assert!((4_000..=40_000).contains(&solve_ms), "{solve_ms}");
        }
    }
    assert_eq!(copies, 80, "20% of 400 honest users double-click");
    let share = |label: &str| {
        let (lines, passes) = answers[label];
        passes as f64 / lines as f64
    };
    // Drawn per line: honest users default to 95%, the campus says 50%, the solver 20%,
    // attackers default to never.
    assert!((0.92..=0.98).contains(&share("honest")), "{answers:?}");
    assert!((0.4..=0.6).contains(&share("campus")), "{answers:?}");
    assert!(
        (0.16..=0.24).contains(&share("attacker/farm")),
        "{answers:?}"
    );
    assert_eq!(answers["attacker/spoofed"].1, 0, "{answers:?}");
    assert_eq!(answers["attacker/unpriced"].1, 0, "{answers:?}");
}

#[test]
fn scenario_rushing_users_claim_in_the_opening_minutes() {
    let s = scenario(CHALLENGED);
    assert_eq!(
        s.honest.as_ref().unwrap().habits.rush,
        Some(Rush {
            share: 0.5,
            within_ms: 300_000
        })
    );
    let (bytes, _) = generate(&s, s.seed);
    let (checks, _) = read(&bytes);
    let opening = start_ms() + 300_000;
    let mut first: BTreeMap<&str, u64> = BTreeMap::new();
    for c in checks.iter().filter(|c| c.label == "honest") {
        let t = first.entry(&c.user).or_insert(c.at_ms);
        *t = (*t).min(c.at_ms);
    }
    let early = first.values().filter(|&&t| t < opening).count();
    // The 200 rushers, and the few of the other 200 whose time over three hours falls in
    // its first five minutes (about 6).
    assert!((200..=215).contains(&early), "{early}");
    assert!(first
        .values()
        .all(|&t| t < start_ms() + 3 * 3_600_000 + 600));
    // Without a rush, the campus spreads over the span.
    let campus_early = checks
        .iter()
        .filter(|c| c.label == "campus" && c.at_ms < opening)
        .count();
    assert!(campus_early < 20, "{campus_early}");
}

#[test]
fn scenario_challenge_answers_leave_the_claims_as_they_were() {
    // Answers are drawn from a stream of their own: a file that gives challenge_pass makes
    // the same claims, at the same times, as one that does not.
    let claims = |bytes: &[u8]| -> Vec<String> {
        entries(bytes)
            .into_iter()
            .map(|e| match e {
                Entry::Happens { line, .. } => line.to_json(),
                Entry::Cohort(c) => c.label,
            })
            .collect()
    };
    let plain = generate(&scenario(SMALL), 3).0;
    let with = SMALL
        .replace("networks = 10\n", "networks = 10\nchallenge_pass = 0.3\n")
        .replace(
            "interval = \"5s\"\n",
            "interval = \"5s\"\nchallenge_pass = 0.9\n",
        );
    let answered = generate(&scenario(&with), 3).0;
    assert_ne!(plain, answered);
    assert_eq!(claims(&plain), claims(&answered));
    // And the same seed gives the same bytes, answers included.
    assert_eq!(answered, generate(&scenario(&with), 3).0);
    assert_ne!(answered, generate(&scenario(&with), 4).0);
}
