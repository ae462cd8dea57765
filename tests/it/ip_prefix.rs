//! The `ip` dimension of an IPv6 address is its /64, on the real binary and both stores:
//! a client rotating the low 64 bits of its address (privacy addresses) is one client to
//! a per-address limit, to a signal counting addresses, and to a CIDR override; IPv4,
//! spelt plain or mapped, keeps counting per address.

use serde_json::{json, Value};

use crate::common::{free_port, RedisServer};
use crate::durability::{config_with_patient_behaviour, Vigia};

/// The issue's probe: `ip_1h` at 10 (a security limit: past it, silent denies), a signal
/// counting a user's distinct addresses, and a campus override on an IPv6 /48.
const RULES: &str = r#"
[scene.s]
on_store_error = "fail_close"
required = ["user", "ip"]

[[scene.s.limits]]
name = "ip_1h"
dimensions = ["ip"]
algorithm = "sliding_window"
window = "1h"
max = 10
layer = "security"

[[scene.s.overrides]]
cidr = "2001:db8:8::/48"
limit = "ip_1h"
max = 20

[[scene.s.signals]]
name = "ips_per_user"
count = "ips"
per = ["user"]
window = "1h"
max = 50
"#;

fn claim(user: &str, ip: &str) -> Value {
    json!({"scene": "s", "user_id": user, "ip": ip})
}

/// The `n`th address of the /64 `prefix` (four groups): low 64 bits all different, as a
/// privacy-address rotation makes them.
fn rotated(prefix: &str, n: u32) -> String {
    format!(
        "{prefix}:{:x}:{:x}:{:x}:{:x}",
        n + 1,
        0xa000 + n,
        n * 7919 % 0xffff,
        0xffff - n
    )
}

/// The answer's decision, the `ip_1h` key and count, and the signal's value (when the
/// answer reports it).
async fn check(v: &Vigia, user: &str, ip: &str) -> (String, String, u64, Option<u64>) {
    let (status, b) = v.check(&claim(user, ip)).await;
    assert_eq!(status, 200, "{ip}: {b}");
    let limit = &b["limits"][0];
    assert_eq!(limit["name"], "ip_1h", "{b}");
    let ips = b["signals"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "ips_per_user"))
        .and_then(|s| s["value"].as_u64());
    (
        b["decision"].as_str().unwrap_or("?").to_string(),
        limit["key"].as_str().unwrap_or("?").to_string(),
        limit["count"].as_u64().unwrap_or(0),
        ips,
    )
}

async fn a_rotated_64_is_one_ip(v: &Vigia) {
    // Fourteen addresses of one /64 (the issue's probe): ten allowed, then silent denies.
    let mut answers = Vec::new();
    for n in 0..14 {
        answers.push(check(v, "rotator", &rotated("2001:db8:1:2", n)).await);
    }
    let decisions: Vec<&str> = answers.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(decisions[..10], ["allow"; 10], "{answers:?}");
    assert_eq!(decisions[10..], ["silent_deny"; 4], "{answers:?}");
    // One key, counted 1 to 10; one address to the signal.
    for (n, (_, key, count, ips)) in answers.iter().take(10).enumerate() {
        assert_eq!(key, "lt:s:ip:2001%3Adb8%3A1%3A2%3A%3A%2F64", "address {n}");
        assert_eq!((*count, *ips), (n as u64 + 1, Some(1)), "address {n}");
    }
    // The next /64 is another client: its own count, a second address to the signal.
    let (decision, key, count, ips) = check(v, "rotator", "2001:db8:1:3::1").await;
    assert_eq!(decision, "allow");
    assert_eq!(key, "lt:s:ip:2001%3Adb8%3A1%3A3%3A%3A%2F64");
    assert_eq!((count, ips), (1, Some(2)));

    // Inside the override's /48, every address of a /64 gets its max of 20, together.
    for n in 0..20 {
        let (decision, _, count, _) = check(v, "campus", &rotated("2001:db8:8:1", n)).await;
        assert_eq!(
            (decision.as_str(), count),
            ("allow", u64::from(n) + 1),
            "address {n}"
        );
    }
    let (decision, ..) = check(v, "campus", &rotated("2001:db8:8:1", 20)).await;
    assert_eq!(decision, "silent_deny");

    // IPv4 as before: per address, a mapped spelling the same address; ten, then denies.
    for n in 0..10u64 {
        let ip = if n % 2 == 0 {
            "203.0.113.7"
        } else {
            "::ffff:203.0.113.7"
        };
        let (decision, key, count, _) = check(v, "v4", ip).await;
        assert_eq!((decision.as_str(), count), ("allow", n + 1), "{ip}");
        assert_eq!(key, "lt:s:ip:203.0.113.7");
    }
    let (decision, ..) = check(v, "v4", "::ffff:203.0.113.7").await;
    assert_eq!(decision, "silent_deny");
    let (decision, key, count, _) = check(v, "v4", "203.0.113.8").await;
    assert_eq!(
        (decision.as_str(), key.as_str(), count),
        ("allow", "lt:s:ip:203.0.113.8", 1)
    );
}

fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("rules dir");
    std::fs::write(dir.path().join("s.toml"), RULES).expect("write rules");
    dir
}

/// The binary on `RULES` and the shipped config (its behaviour deadline made one a loaded
/// debug build meets: this is about what counts as one address, not about the deadline),
/// with `env` on top.
async fn start(data: &std::path::Path, rules: &std::path::Path, env: &[(&str, &str)]) -> Vigia {
    let config = config_with_patient_behaviour(data);
    let args = ["serve", "--config", config.to_str().expect("a UTF-8 path")];
    Vigia::start_with_args(free_port(), data, Some(rules), env, &args).await
}

#[tokio::test]
async fn on_embedded_a_rotated_64_is_one_ip() {
    let (data, rules) = (tempfile::tempdir().expect("data dir"), rules_dir());
    let v = start(data.path(), rules.path(), &[]).await;
    a_rotated_64_is_one_ip(&v).await;
}

#[tokio::test]
async fn on_redis_a_rotated_64_is_one_ip() {
    let redis = RedisServer::start();
    let (data, rules) = (tempfile::tempdir().expect("data dir"), rules_dir());
    let url = redis.url();
    let env = [("VIGIA_STORE", "redis"), ("VIGIA_REDIS_URL", url.as_str())];
    let v = start(data.path(), rules.path(), &env).await;
    a_rotated_64_is_one_ip(&v).await;
}
