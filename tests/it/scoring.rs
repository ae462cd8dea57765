//! Behaviour signals, trust and the score, end to end over HTTP, on both stores: the
//! attacks of the seed article (device farms, account switching) end in silent denies,
//! honest crowds behind one NAT do not, and trust and account age move quotas.

use serde_json::{json, Value};
use vigia::config::StoreBackend;

use crate::common::{spawn_app_configured, RedisServer, TestApp};

/// The API.md example's `[behaviour]`, `[score]` and `[trust]`, on one scene `c` over
/// user, device and ip, with a per-user daily limit that trust raises. `extra_trust` may
/// add `new_account = {..}`, which then also weighs 0.1 in the score.
fn rules(user_max: u64, extra_trust: &str) -> String {
    let new_account_weight = if extra_trust.contains("new_account") {
        ", new_account = 0.1"
    } else {
        ""
    };
    format!(
        r#"
[scene.c]
on_store_error = "fail_close"
deny_message = "Agotado"
required = ["user", "device", "ip"]

[[scene.c.limits]]
name = "user_1d"
dimensions = ["user"]
algorithm = "sliding_window"
window = "1d"
max = {user_max}
layer = "business"
trust_bonus = true

[scene.c.behaviour]
accounts_per_device = {{ window = "1d", max = 3 }}
account_switches    = {{ window = "10m", max = 2 }}
devices_per_user    = {{ window = "1d", max = 5 }}
accounts_per_ip     = {{ window = "1h", max = 50 }}

[scene.c.score]
weights = {{ accounts_per_device = 0.7, account_switches = 0.7, devices_per_user = 0.3, accounts_per_ip = 0.2{new_account_weight} }}
silent_deny_at = 0.7

[trust]
payment_succeeded = {{ points = 1, ttl = "30d" }}
identity_verified = {{ points = 2, ttl = "180d" }}
max_points = 3
bonus_per_point = 1
score_discount_per_point = 0.1
{extra_trust}
"#
    )
}

async fn app(backend: StoreBackend, rules: &str) -> TestApp {
    spawn_app_configured(RedisServer::start(), &[("c.toml", rules)], |c| {
        c.store.backend = backend;
    })
    .await
}

fn check(user: &str, device: &str, ip: &str) -> Value {
    json!({"scene": "c", "user_id": user, "device_id": device, "ip": ip})
}

fn signal<'a>(b: &'a Value, name: &str) -> &'a Value {
    b["signals"]
        .as_array()
        .and_then(|s| s.iter().find(|x| x["name"] == name))
        .unwrap_or_else(|| panic!("signal {name} in {b}"))
}

async fn pay(app: &TestApp, event_id: &str, user: &str) {
    let resp = app
        .post(
            "/v1/events",
            &json!({"event_id": event_id, "type": "payment_succeeded", "user_id": user,
                    "occurred_at": chrono::Utc::now().to_rfc3339()}),
        )
        .await;
    assert_eq!(resp.status(), 202, "{:?}", resp.text().await);
}

macro_rules! on_both_stores {
    ($( async fn $name:ident($backend:ident) $body:block )*) => {
        mod on_redis {
            use super::*;
            $( #[actix_web::test] async fn $name() { let $backend = StoreBackend::Redis; $body } )*
        }
        mod on_embedded {
            use super::*;
            $( #[actix_web::test] async fn $name() { let $backend = StoreBackend::Embedded; $body } )*
        }
    };
}

on_both_stores! {
    async fn a_device_farm_ends_in_silent_denies_by_score(backend) {
        let app = app(backend, &rules(5, "")).await;
        for i in 1..=3 {
            let (status, b) = app.check(check(&format!("farm-{i}"), "device-farm-01", "192.0.2.1")).await;
            assert_eq!((status, b["decision"].as_str()), (200, Some("allow")), "{b}");
            assert_eq!(signal(&b, "accounts_per_device")["value"], i);
        }
        for i in 4..=8 {
            let (status, b) = app.check(check(&format!("farm-{i}"), "device-farm-01", "192.0.2.1")).await;
            // Looks like success on the wire; the body says why for the backend.
            assert_eq!(status, 200, "{b}");
            assert_eq!(b["decision"], "silent_deny", "{b}");
            assert_eq!((b["layer"].as_str(), b["reason"].as_str()), (Some("security"), Some("score")));
            let apd = signal(&b, "accounts_per_device");
            // Values are exact up to max + 1 and saturate there: enough for the verdict,
            // and a farm's device keeps 4 users in memory, not thousands.
            assert_eq!((apd["value"].as_u64(), apd["max"].as_u64()), (Some(4), Some(3)), "{b}");
            assert_eq!(apd["contribution"], 0.7);
            assert!(b["score"].as_f64().unwrap() >= 0.7, "{b}");
            // A denied request counts nowhere.
            assert!(b["limits"].as_array().unwrap().is_empty(), "{b}");
        }
        // An honest user on their own device is untouched by the farm next door.
        let (status, b) = app.check(check("honest", "device-home-01", "192.0.2.1")).await;
        assert_eq!((status, b["decision"].as_str()), (200, Some("allow")), "{b}");
        assert_eq!(b["score"], 0.0);
        let metrics = app.get("/metrics").await.text().await.unwrap();
        assert!(
            metrics.contains(r#"vigia_decisions_total{decision="silent_deny",layer="security",reason="score",scene="c"} 5"#),
            "{metrics}"
        );
        // The five farm checks past the max, and nothing fired for the honest user.
        assert!(
            metrics.contains(r#"vigia_signals_fired_total{scene="c",signal="accounts_per_device"} 5"#),
            "{metrics}"
        );
    }

    async fn rapid_account_switching_on_one_device_is_silently_denied(backend) {
        let app = app(backend, &rules(50, "")).await;
        let mut decisions = Vec::new();
        for user in ["ana", "beto", "ana", "beto"] {
            let (_, b) = app.check(check(user, "device-switch-1", "192.0.2.2")).await;
            decisions.push((b["decision"].as_str().unwrap().to_string(), signal(&b, "account_switches")["value"].as_u64().unwrap()));
        }
        assert_eq!(
            decisions,
            [("allow".into(), 0), ("allow".into(), 1), ("allow".into(), 2), ("silent_deny".into(), 3)],
        );
    }

    async fn honest_users_behind_one_nat_are_not_denied_by_the_ip_alone(backend) {
        let app = app(backend, &rules(5, "")).await;
        for i in 0..60 {
            let (status, b) = app.check(check(&format!("student-{i}"), &format!("laptop-{i:04}"), "10.8.0.1")).await;
            assert_eq!((status, b["decision"].as_str()), (200, Some("allow")), "{b}");
            if i >= 50 {
                let api = signal(&b, "accounts_per_ip");
                assert_eq!(api["value"], 51, "saturates at max + 1: {b}");
                assert_eq!(api["contribution"], 0.2);
                assert_eq!(b["score"], 0.2);
            }
        }
    }

    async fn trust_raises_a_trust_bonus_quota_once_per_event_up_to_the_cap(backend) {
        let app = app(backend, &rules(1, "")).await;
        let (_, b) = app.check(check("payer", "device-pay-01", "192.0.2.3")).await;
        assert_eq!((b["decision"].as_str(), b["limits"][0]["max"].as_u64()), (Some("allow"), Some(1)));
        assert_eq!(b["trust"]["points"], 0);
        let (status, _) = app.check(check("payer", "device-pay-01", "192.0.2.3")).await;
        assert_eq!(status, 429, "max 1 without trust");

        pay(&app, "pay-1", "payer").await;
        pay(&app, "pay-1", "payer").await; // a duplicate: counted once
        let (status, b) = app.check(check("payer", "device-pay-01", "192.0.2.3")).await;
        assert_eq!((status, b["trust"]["points"].as_u64()), (200, Some(1)), "{b}");
        assert_eq!(b["limits"][0]["max"], 2);
        let (status, _) = app.check(check("payer", "device-pay-01", "192.0.2.3")).await;
        assert_eq!(status, 429, "one point raised the max by one, not two");

        for i in 2..=6 {
            pay(&app, &format!("pay-{i}"), "payer").await;
        }
        let (_, b) = app.check(check("payer", "device-pay-01", "192.0.2.3")).await;
        assert_eq!(b["trust"]["points"], 3, "max_points caps six payments: {b}");
        assert_eq!(b["limits"][0]["max"], 4);
        // Someone else's payments raise nothing for this user.
        let (_, b) = app.check(check("other", "device-pay-02", "192.0.2.3")).await;
        assert_eq!((b["trust"]["points"].as_u64(), b["limits"][0]["max"].as_u64()), (Some(0), Some(1)));
    }

    async fn trust_discounts_the_score(backend) {
        // Four accounts on one device score 0.7 (switching weighs nothing here); a verified
        // identity (2 points) takes 0.2 off.
        let rules = rules(5, "").replace("account_switches = 0.7", "account_switches = 0.0");
        let app = app(backend, &rules).await;
        for i in 1..=3 {
            app.check(check(&format!("fam-{i}"), "device-family", "192.0.2.4")).await;
        }
        let resp = app
            .post("/v1/events", &json!({"event_id": "kyc-1", "type": "identity_verified",
                  "user_id": "fam-4", "occurred_at": chrono::Utc::now().to_rfc3339()}))
            .await;
        assert_eq!(resp.status(), 202);
        let (_, b) = app.check(check("fam-4", "device-family", "192.0.2.4")).await;
        assert_eq!(b["decision"], "allow", "{b}");
        assert_eq!(b["score"], 0.5);
        assert_eq!(b["trust"]["points"], 2);
        let (_, b) = app.check(check("fam-5", "device-family", "192.0.2.4")).await;
        assert_eq!(b["decision"], "silent_deny", "{b}");
    }

    async fn new_accounts_get_a_smaller_quota_never_below_one(backend) {
        let app = app(backend, &rules(4, r#"new_account = { younger_than = "7d", max_factor = 0.5 }"#)).await;
        let month_ago = (chrono::Utc::now() - chrono::Duration::days(30)).to_rfc3339();
        let day_ago = (chrono::Utc::now() - chrono::Duration::days(1)).to_rfc3339();
        let mut body = check("veteran", "device-vet-001", "192.0.2.5");
        body["user_created_at"] = json!(month_ago);
        let (_, b) = app.check(body).await;
        assert_eq!(b["limits"][0]["max"], 4, "{b}");
        assert_eq!((signal(&b, "new_account")["value"].as_u64(), signal(&b, "new_account")["contribution"].as_f64()), (Some(0), Some(0.0)));

        let mut body = check("fresh", "device-new-001", "192.0.2.5");
        body["user_created_at"] = json!(day_ago);
        let (_, b) = app.check(body).await;
        assert_eq!(b["limits"][0]["max"], 2, "4 * 0.5: {b}");
        assert_eq!(signal(&b, "new_account")["value"], 1);
        assert_eq!(b["score"], 0.1);

        // Without user_created_at, the first time vigia saw the user stands in.
        let (_, b) = app.check(check("unknown", "device-unk-001", "192.0.2.5")).await;
        assert_eq!(b["limits"][0]["max"], 2, "first seen just now: {b}");
        let (_, b) = app.check(check("unknown", "device-unk-001", "192.0.2.5")).await;
        assert_eq!(b["limits"][0]["max"], 2, "still young: {b}");
        let (status, _) = app.check(check("unknown", "device-unk-001", "192.0.2.5")).await;
        assert_eq!(status, 429, "a new account's third claim exceeds 2");
    }

    async fn max_factor_never_takes_a_quota_below_one(backend) {
        let app = app(backend, &rules(1, r#"new_account = { younger_than = "7d", max_factor = 0.1 }"#)).await;
        let (status, b) = app.check(check("newbie", "device-nb-0001", "192.0.2.6")).await;
        assert_eq!((status, b["limits"][0]["max"].as_u64()), (200, Some(1)), "{b}");
        let (status, _) = app.check(check("newbie", "device-nb-0001", "192.0.2.6")).await;
        assert_eq!(status, 429);
    }

    async fn a_dry_run_scores_without_recording_behaviour(backend) {
        let app = app(backend, &rules(5, "")).await;
        for i in 1..=3 {
            app.check(check(&format!("dr-{i}"), "device-dry-01", "192.0.2.7")).await;
        }
        let mut probe = check("dr-4", "device-dry-01", "192.0.2.7");
        probe["dry_run"] = json!(true);
        for _ in 0..2 {
            let (_, b) = app.check(probe.clone()).await;
            assert_eq!(b["decision"], "silent_deny", "{b}");
            assert_eq!(signal(&b, "accounts_per_device")["value"], 4);
        }
        let mut other = check("dr-5", "device-dry-01", "192.0.2.7");
        other["dry_run"] = json!(true);
        let (_, b) = app.check(other).await;
        assert_eq!(signal(&b, "accounts_per_device")["value"], 4, "dr-4 was never recorded: {b}");
    }
}
