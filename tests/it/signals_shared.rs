//! Signals where the windows are, end to end over HTTP: several vigia nodes on one Redis
//! see one farm as one; a check with trust and signals is one EVALSHA; a signal that
//! cannot be had is the scene's `on_store_error` and a metric, never an allow without it,
//! under load as when the store stalls.

use chrono::{Duration as Age, Utc};
use serde_json::{json, Value};
use vigia::config::StoreBackend;

use crate::common::load::run_checks;
use crate::common::{spawn_app_configured, RedisServer, TestApp};

fn rules() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/signals/farm.toml"
    );
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A node of its own on a fresh Redis (`backend`), or on `shared`'s Redis.
async fn node(backend: StoreBackend, shared: Option<&TestApp>) -> TestApp {
    let url = shared.map(|s| s.redis.url());
    spawn_app_configured(RedisServer::start(), &[("c.toml", &rules())], |c| {
        c.store.backend = backend;
        if let Some(url) = url {
            // This node's own redis-server stays idle: every call goes to the shared one.
            c.store.redis_url = url;
        }
    })
    .await
}

/// A claim of `user` (created `age_days` ago) from `device` at `ip`.
fn claim(user: &str, age_days: i64, device: &str, ip: &str) -> Value {
    json!({"scene": "c", "user_id": user, "device_id": device, "ip": ip,
           "user_created_at": (Utc::now() - Age::days(age_days)).to_rfc3339()})
}

fn signal_value(body: &Value, name: &str) -> Option<u64> {
    body["signals"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)?["value"]
        .as_u64()
}

/// What a farm's accounts are answered, one after another, spread over `nodes` in turn:
/// (decision, accounts_per_device value) for 6 established accounts on one phone, then
/// (decision, new_accounts_per_net value) for 8 new accounts on 8 phones of one /24.
async fn farm_run(nodes: &[TestApp]) -> Vec<(String, Option<u64>)> {
    let mut seen = Vec::new();
    for i in 0..6 {
        let node = &nodes[i % nodes.len()];
        let (status, b) = node
            .check(claim(
                &format!("old{i}"),
                400,
                "farmphone01",
                "198.51.100.9",
            ))
            .await;
        assert_eq!(status, 200, "{b}");
        seen.push((
            b["decision"].as_str().unwrap().to_string(),
            signal_value(&b, "accounts_per_device"),
        ));
    }
    for i in 0..8 {
        let node = &nodes[i % nodes.len()];
        let (status, b) = node
            .check(claim(
                &format!("new{i}"),
                2,
                &format!("fresh-phone-{i:04}"),
                &format!("203.0.113.{}", 10 + i),
            ))
            .await;
        assert_eq!(status, 200, "{b}");
        seen.push((
            b["decision"].as_str().unwrap().to_string(),
            signal_value(&b, "new_accounts_per_net"),
        ));
    }
    seen
}

#[actix_web::test]
async fn three_nodes_on_one_redis_see_one_farm_as_one_node_does() {
    let one = node(StoreBackend::Redis, None).await;
    let alone = farm_run(std::slice::from_ref(&one)).await;

    let first = node(StoreBackend::Redis, None).await;
    let second = node(StoreBackend::Redis, Some(&first)).await;
    let third = node(StoreBackend::Redis, Some(&first)).await;
    let three = farm_run(&[first, second, third]).await;

    // The fourth account on the phone and the sixth new account on the network are
    // denied, whichever node they reach: no node needs three times the accounts. Values
    // are exact up to max + 1 (and never more than the truth past it).
    let expected: Vec<(&str, u64)> = (0..6)
        .map(|i| (if i < 3 { "allow" } else { "silent_deny" }, i + 1))
        .chain((0..8).map(|i| (if i < 5 { "allow" } else { "silent_deny" }, i + 1)))
        .collect();
    for (run, name) in [(&alone, "one node"), (&three, "three nodes on one Redis")] {
        for (i, ((decision, value), (want, truth))) in run.iter().zip(&expected).enumerate() {
            assert_eq!(decision, want, "{name}: check {i}: {run:?}");
            let value = value.unwrap_or_else(|| panic!("{name}: check {i} without its signal"));
            let max = if i < 6 { 3 } else { 5 };
            assert!(
                value == *truth || (*truth > max + 1 && (max + 1..=*truth).contains(&value)),
                "{name}: check {i}: {value} for {truth}: {run:?}"
            );
        }
    }
    assert_eq!(alone, three, "one node and three answer alike");
}

#[actix_web::test]
async fn a_check_with_trust_and_signals_is_one_evalsha() {
    let app = node(StoreBackend::Redis, None).await;
    let resp = app
        .post(
            "/v1/events",
            &json!({"event_id": "pay-1", "type": "payment_succeeded", "user_id": "payer",
                    "occurred_at": Utc::now().to_rfc3339()}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    // Let the event reach Redis (applied on ingest when Redis is up) and the script load.
    let (_, warm) = app
        .check(claim("warm", 400, "warmphone01", "192.0.2.1"))
        .await;
    assert_eq!(warm["decision"], "allow", "{warm}");
    let monitor = app.redis.monitor();

    let n = 25;
    for i in 0..n {
        let user = if i == 0 {
            "payer".to_string()
        } else {
            format!("u{i}")
        };
        let (status, b) = app
            .check(claim(&user, 2, &format!("phone-{i:04}"), "192.0.2.77"))
            .await;
        assert_eq!(status, 200, "{b}");
        // Trust was read and signals counted in that one call.
        assert!(signal_value(&b, "new_accounts_per_net").is_some(), "{b}");
        if i == 0 {
            assert_eq!(b["trust"]["points"], 1, "{b}");
        }
    }
    let sent = monitor.client_commands();
    assert_eq!(
        sent,
        vec!["evalsha".to_string(); n],
        "what the node sent Redis"
    );
}

/// The counter `name{labels}` of the service's `/metrics`, 0 when absent.
async fn metric(app: &TestApp, series: &str) -> u64 {
    let text = app.get("/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Whether a 200 `allow` or `silent_deny` carries every signal that applies to it: the
/// device's, the account's age, and for a new account the network's.
fn has_its_signals(body: &Value) -> bool {
    signal_value(body, "accounts_per_device").is_some()
        && match signal_value(body, "new_account") {
            Some(1) => signal_value(body, "new_accounts_per_net").is_some(),
            Some(_) => true,
            None => false,
        }
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
    async fn under_load_no_check_goes_without_its_signals(backend) {
        let app = spawn_app_configured(RedisServer::start(), &[("c.toml", &rules())], |c| {
            c.store.backend = backend;
            // The tightest deadline and mailbox the config allows, on two cores saturated
            // by 64 callers: some asks may miss, and each that does must be a failure.
            c.behaviour.deadline_ms = 1;
            c.behaviour.mailbox = 1;
            c.behaviour.shards = 1;
        })
        .await;
        let n = 3000;
        let samples = run_checks(&app, n, 64, |i| {
            claim(
                &format!("load{i}"),
                if i % 2 == 0 { 2 } else { 400 },
                &format!("phone-{:04}", i % 200),
                &format!("198.51.{}.{}", i % 50, i % 250),
            )
        })
        .await;
        let mut degraded = 0;
        for s in &samples {
            match (s.status, s.body["decision"].as_str()) {
                (200, Some("allow" | "silent_deny")) => {
                    assert_eq!(s.body["degraded"], false, "{}", s.describe());
                    assert!(
                        has_its_signals(&s.body),
                        "an answer without its signals: {}",
                        s.describe()
                    );
                }
                (503, Some("friendly_deny")) => {
                    // fail_close: the store (or an actor) could not answer.
                    assert_eq!(s.body["degraded"], true, "{}", s.describe());
                    assert_eq!(s.body["reason"], "store_unavailable", "{}", s.describe());
                    degraded += 1;
                }
                _ => panic!("unexpected answer: {}", s.describe()),
            }
        }
        // Every failure was counted as the scene's policy deciding.
        let counted = metric(
            &app,
            r#"vigia_degraded_decisions_total{policy="fail_close",scene="c"}"#,
        )
        .await;
        assert_eq!(counted, degraded, "degraded answers vs the metric");
    }
}

#[actix_web::test]
async fn a_stalled_redis_is_the_scene_policy_and_a_metric_then_signals_again() {
    let mut app = node(StoreBackend::Redis, None).await;
    let (_, b) = app.check(claim("a", 400, "phone-0001", "192.0.2.5")).await;
    assert_eq!(b["decision"], "allow", "{b}");
    app.redis.pause();
    let (status, b) = app.check(claim("b", 400, "phone-0002", "192.0.2.5")).await;
    assert_eq!(status, 503, "{b}");
    assert_eq!(b["degraded"], true, "{b}");
    assert_eq!(b["reason"], "store_unavailable", "{b}");
    assert_eq!(
        metric(
            &app,
            r#"vigia_degraded_decisions_total{policy="fail_close",scene="c"}"#
        )
        .await,
        1
    );
    app.redis.resume();
    let (status, b) = app.check(claim("c", 400, "phone-0001", "192.0.2.5")).await;
    assert_eq!(status, 200, "{b}");
    // "b" was never recorded: the phone has seen a and c.
    assert_eq!(signal_value(&b, "accounts_per_device"), Some(2), "{b}");
}

/// The embedded store's behaviour actors stalled: a check that needs its signals is the
/// scene's policy, counted as a store error, an unanswered shard and a degraded decision;
/// once the shards are back, checks carry their signals again.
#[actix_web::test]
async fn a_stalled_actor_is_the_scene_policy_and_a_metric_then_signals_again() {
    let app = spawn_app_configured(RedisServer::start(), &[("c.toml", &rules())], |c| {
        c.store.backend = StoreBackend::Embedded;
        // Far shorter than the stall below, long enough for a loaded debug build.
        c.behaviour.deadline_ms = 200;
    })
    .await;
    let (_, b) = app.check(claim("a", 400, "phone-0001", "192.0.2.5")).await;
    assert_eq!(b["decision"], "allow", "{b}");
    app.behaviours.stall(std::time::Duration::from_secs(2));
    let (status, b) = app.check(claim("b", 400, "phone-0001", "192.0.2.5")).await;
    assert_eq!(status, 503, "{b}");
    assert_eq!(b["degraded"], true, "{b}");
    assert_eq!(b["reason"], "store_unavailable", "{b}");
    for series in [
        r#"vigia_degraded_decisions_total{policy="fail_close",scene="c"}"#,
        r#"vigia_behaviour_unanswered_total{dimension="signal",reason="timeout"}"#,
        r#"vigia_store_errors_total{kind="unavailable",store="embedded"}"#,
    ] {
        assert_eq!(metric(&app, series).await, 1, "{series}");
    }
    // A control message queues behind the stall: once it is answered, the shards are back.
    app.behaviours.signal_entities().await;
    let (status, b) = app.check(claim("c", 400, "phone-0001", "192.0.2.5")).await;
    assert_eq!(status, 200, "{b}");
    // "b" was never recorded: the phone has seen a and c.
    assert_eq!(signal_value(&b, "accounts_per_device"), Some(2), "{b}");
}
