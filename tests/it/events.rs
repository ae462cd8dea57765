//! Trust events end to end: `POST /v1/events` journals durably and applies, duplicates count
//! once, a bad event refuses its batch, `GET /v1/trust` shows capped points, rollbacks refund,
//! and nothing is lost to a store outage or a `kill -9`. HTTP tests run on both backends
//! (Redis and embedded); expiry runs on both ledgers with a manual clock, no sleeping.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, TimeZone, Utc};
use redis::Commands;
use serde_json::{json, Value};
use vigia::clock::{Clock, ManualClock, SystemClock};
use vigia::config::{Config, StoreBackend};
use vigia::keys::KeyPrefix;
use vigia::metrics::Metrics;
use vigia::refund::Refunds;
use vigia::rules::RuleSet;
use vigia::store::embedded::EmbeddedStore;
use vigia::store::redis::RedisStore;
use vigia::store::WindowStore;
use vigia::trust::{journal, Events, RedisLedger, SledLedger, TrustLedger};

use crate::common::{body, free_port, limit, scene, spawn_app_configured, RedisServer, TestApp};
use crate::durability::Vigia;

const DAY: u64 = 86_400_000;

const TRUST: &str = r#"
[trust]
payment_succeeded = { points = 1, ttl = "30d" }
identity_verified = { points = 2, ttl = "180d" }
max_points = 3
bonus_per_point = 1
"#;

fn scene_rules() -> String {
    scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        1,
        "business",
    ))
}

fn rule_set() -> RuleSet {
    vigia::rules::compile_files(&[
        ("s.toml".into(), scene_rules()),
        ("trust.toml".into(), TRUST.into()),
    ])
    .expect("test rules compile")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Redis,
    Embedded,
}

async fn app_with(backend: Backend, configure: impl FnOnce(&mut Config)) -> TestApp {
    spawn_app_configured(
        RedisServer::start(),
        &[("s.toml", &scene_rules()), ("trust.toml", TRUST)],
        move |c| {
            if backend == Backend::Embedded {
                c.store.backend = StoreBackend::Embedded;
            }
            configure(c);
        },
    )
    .await
}

async fn app(backend: Backend) -> TestApp {
    app_with(backend, |_| {}).await
}

fn rfc3339(ms: u64) -> String {
    Utc.timestamp_millis_opt(ms as i64)
        .unwrap()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn now_ms() -> u64 {
    SystemClock.now_ms()
}

fn event(id: &str, kind: &str, user: &str, occurred_at_ms: u64) -> Value {
    json!({"event_id": id, "type": kind, "user_id": user, "occurred_at": rfc3339(occurred_at_ms)})
}

fn pay(id: &str, user: &str) -> Value {
    event(id, "payment_succeeded", user, now_ms())
}

fn verified(id: &str, user: &str) -> Value {
    event(id, "identity_verified", user, now_ms())
}

/// A rollback of the check `body(user)` made with `request_id`.
fn rollback(id: &str, request_id: &str, user: &str) -> Value {
    let mut e = body(user);
    e["event_id"] = json!(id);
    e["type"] = json!("benefit_rolled_back");
    e["request_id"] = json!(request_id);
    e["occurred_at"] = json!(rfc3339(now_ms()));
    e
}

async fn post_events(app: &TestApp, b: &Value) -> (u16, Value) {
    let resp = app.post("/v1/events", b).await;
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON answer"))
}

async fn trust(app: &TestApp, user: &str) -> (u16, Value) {
    let resp = app.get(&format!("/v1/trust/{user}")).await;
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON answer"))
}

async fn raw_points(app: &TestApp, user: &str) -> u64 {
    let (status, t) = trust(app, user).await;
    assert_eq!(status, 200, "{t}");
    t["raw_points"].as_u64().unwrap()
}

async fn metrics(app: &TestApp) -> String {
    app.get("/metrics").await.text().await.unwrap()
}

fn check_with(user: &str, request_id: &str) -> Value {
    let mut b = body(user);
    b["request_id"] = json!(request_id);
    b
}

// ---------------------------------------------------------------------------------------
// Over HTTP, on both backends
// ---------------------------------------------------------------------------------------

async fn a_single_event_and_a_batch_award_points(backend: Backend) {
    let app = app(backend).await;
    let (status, b) = post_events(&app, &pay("p1", "u1")).await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 1, "duplicates": 0}))
    );
    let (status, t) = trust(&app, "u1").await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["user_id"], "u1");
    assert_eq!(t["points"], 1);
    assert_eq!(t["raw_points"], 1);
    assert_eq!(t["max_points"], 3);
    assert_eq!(t["pending_events"], 0);
    assert_eq!(t["first_seen"], Value::Null);
    assert_eq!(t["awards"][0]["event_id"], "p1");
    assert_eq!(t["awards"][0]["type"], "payment_succeeded");
    assert_eq!(t["awards"][0]["points"], 1);

    // A batch; integer user ids are the same user as their text.
    let mut numeric = verified("v1", "x");
    numeric["user_id"] = json!(10086);
    let batch = json!({"events": [pay("p2", "u2"), numeric, pay("p3", "u2")]});
    let (status, b) = post_events(&app, &batch).await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 3, "duplicates": 0}))
    );
    assert_eq!(raw_points(&app, "u2").await, 2);
    assert_eq!(raw_points(&app, "10086").await, 2);
    assert_eq!(raw_points(&app, "nobody").await, 0);
    let text = metrics(&app).await;
    assert!(
        text.contains(r#"vigia_events_total{result="accepted",type="payment_succeeded"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"vigia_events_total{result="applied",type="identity_verified"} 1"#),
        "{text}"
    );
    if backend == Backend::Redis {
        // Expiry follows the award: the key lives ~30 days, never without a TTL.
        let ttl: i64 = redis::cmd("PTTL")
            .arg("lt:trust-points:uid:u2")
            .query(&mut app.redis.conn())
            .unwrap();
        assert!(
            ttl > (30 * DAY - 60_000) as i64 && ttl <= (30 * DAY) as i64,
            "{ttl}"
        );
        assert_eq!(
            app.keys("lt:trust-points:*"),
            [
                "lt:trust-points:uid:10086",
                "lt:trust-points:uid:u1",
                "lt:trust-points:uid:u2"
            ]
        );
    }
}

async fn duplicate_event_ids_count_once(backend: Backend) {
    let app = app(backend).await;
    let (status, b) = post_events(&app, &pay("p1", "u")).await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 1, "duplicates": 0}))
    );
    // Again alone, then inside a batch that also repeats a new id of its own.
    let (status, b) = post_events(&app, &pay("p1", "u")).await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 0, "duplicates": 1}))
    );
    let batch = json!({"events": [pay("p1", "u"), pay("p2", "u"), pay("p2", "u")]});
    let (status, b) = post_events(&app, &batch).await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 1, "duplicates": 2}))
    );
    let (_, t) = trust(&app, "u").await;
    assert_eq!(t["raw_points"], 2, "{t}");
    assert_eq!(t["awards"].as_array().unwrap().len(), 2, "{t}");
    let text = metrics(&app).await;
    assert!(
        text.contains(r#"vigia_events_total{result="duplicate",type="payment_succeeded"} 3"#),
        "{text}"
    );
}

async fn one_invalid_event_refuses_the_whole_batch(backend: Backend) {
    let app = app(backend).await;
    let mut bad = pay("p2", "u");
    bad["user_id"] = Value::Null;
    let batch = json!({"events": [pay("p1", "u"), verified("v1", "u"), bad]});
    let (status, b) = post_events(&app, &batch).await;
    assert_eq!(status, 400, "{b}");
    assert_eq!(b["error"]["code"], "invalid_field");
    assert_eq!(b["error"]["field"], "events[2].user_id");
    assert_eq!(
        raw_points(&app, "u").await,
        0,
        "a refused batch gave points"
    );

    // Other fields, named by path; a rollback's own fields too.
    let mut late = pay("p3", "u");
    late["occurred_at"] = json!("last tuesday");
    let (status, b) = post_events(&app, &json!({"events": [late]})).await;
    assert_eq!(
        (status, b["error"]["field"].as_str()),
        (400, Some("events[0].occurred_at"))
    );
    let mut r = rollback("r1", "req1", "u");
    r["scene"] = json!("nope");
    let (status, b) = post_events(&app, &json!({"events": [pay("p4", "u"), r]})).await;
    assert_eq!(status, 400, "{b}");
    assert_eq!(b["error"]["code"], "unknown_scene");
    assert_eq!(b["error"]["field"], "events[1].scene");
    let (status, b) = post_events(&app, &json!({"type": "payment_succeeded"})).await;
    assert_eq!(
        (status, b["error"]["field"].as_str()),
        (400, Some("event_id"))
    );

    // Nothing of those was journaled: the valid events are new, not duplicates.
    let (status, b) = post_events(
        &app,
        &json!({"events": [pay("p1", "u"), verified("v1", "u")]}),
    )
    .await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 2, "duplicates": 0}))
    );
    assert_eq!(raw_points(&app, "u").await, 3);
    let text = metrics(&app).await;
    assert!(
        text.contains(r#"vigia_events_total{result="invalid",type="payment_succeeded"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"vigia_events_total{result="invalid",type="benefit_rolled_back"} 1"#),
        "{text}"
    );
}

async fn points_are_capped_by_max_points(backend: Backend) {
    let app = app(backend).await;
    let batch = json!({"events": [verified("v1", "u"), verified("v2", "u"), pay("p1", "u")]});
    assert_eq!(post_events(&app, &batch).await.0, 202);
    let (_, t) = trust(&app, "u").await;
    assert_eq!(t["raw_points"], 5, "{t}");
    assert_eq!(t["points"], 3, "{t}");
    assert_eq!(t["max_points"], 3, "{t}");
}

async fn awards_expire_from_when_the_event_occurred(backend: Backend) {
    let app = app(backend).await;
    let now = now_ms();
    // Occurred 29 days ago: a 30-day award has a day left, counted from occurred_at.
    let occurred = now - 29 * DAY;
    assert_eq!(
        post_events(&app, &event("old", "payment_succeeded", "u", occurred))
            .await
            .0,
        202
    );
    let (_, t) = trust(&app, "u").await;
    assert_eq!(t["raw_points"], 1, "{t}");
    assert_eq!(t["awards"][0]["expires_at"], rfc3339(occurred + 30 * DAY));
    // Occurred 31 days ago: accepted (and journaled), but worth nothing.
    let (status, b) = post_events(
        &app,
        &event("older", "payment_succeeded", "v", now - 31 * DAY),
    )
    .await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 1, "duplicates": 0}))
    );
    assert_eq!(raw_points(&app, "v").await, 0);
    // A sender's clock in the future does not stretch an award.
    let future = now_ms() + 5 * DAY;
    assert_eq!(
        post_events(&app, &event("future", "payment_succeeded", "w", future))
            .await
            .0,
        202
    );
    let (_, t) = trust(&app, "w").await;
    let expires =
        chrono::DateTime::parse_from_rfc3339(t["awards"][0]["expires_at"].as_str().unwrap())
            .unwrap()
            .timestamp_millis() as u64;
    assert!(expires <= now_ms() + 30 * DAY, "{t}");
}

async fn a_rollback_refunds_the_request(backend: Backend) {
    let app = app(backend).await;
    assert_eq!(app.check(check_with("u", "req1")).await.0, 200);
    let (status, b) = app.check(check_with("u", "req2")).await;
    assert_eq!(status, 429, "{b}");
    let (status, b) = post_events(&app, &rollback("rb1", "req1", "u")).await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 1, "duplicates": 0}))
    );
    // The quota of req1 is back: one more check fits, and only one.
    let (status, b) = app.check(check_with("u", "req3")).await;
    assert_eq!(status, 200, "{b}");
    // Rolled back twice (another event id): nothing more comes back.
    assert_eq!(
        post_events(&app, &rollback("rb2", "req1", "u")).await.0,
        202
    );
    assert_eq!(app.check(check_with("u", "req4")).await.0, 429);
    let text = metrics(&app).await;
    assert!(
        text.contains(r#"vigia_events_total{result="applied",type="benefit_rolled_back"} 2"#),
        "{text}"
    );
}

async fn forged_trust_needs_the_admin_token(backend: Backend) {
    let app = app_with(backend, |c| c.auth.admin_token = "admin-secret".into()).await;
    let send = |token: Option<&'static str>| {
        let mut req = app
            .client
            .post(format!("{}/v1/events", app.base))
            .json(&pay("p1", "u"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    // Even from loopback: once a token is set, only the token counts.
    assert_eq!(send(None).await, 401);
    assert_eq!(send(Some("admin-secre")).await, 401);
    assert_eq!(trust(&app, "u").await.0, 401, "trust is admin-only too");
    let read = || async {
        let t: Value = app
            .client
            .get(format!("{}/v1/trust/u", app.base))
            .bearer_auth("admin-secret")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        t["raw_points"].as_u64().unwrap()
    };
    assert_eq!(read().await, 0, "a forged event gave points");
    assert_eq!(send(Some("admin-secret")).await, 202);
    assert_eq!(read().await, 1);
}

/// Defines each test twice: `on_redis::NAME` and `on_embedded::NAME`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod on_redis {
            $( #[actix_web::test] async fn $name() { super::$name(super::Backend::Redis).await } )*
        }
        mod on_embedded {
            $( #[actix_web::test] async fn $name() { super::$name(super::Backend::Embedded).await } )*
        }
    };
}

on_both_backends!(
    a_single_event_and_a_batch_award_points,
    duplicate_event_ids_count_once,
    one_invalid_event_refuses_the_whole_batch,
    points_are_capped_by_max_points,
    awards_expire_from_when_the_event_occurred,
    a_rollback_refunds_the_request,
    forged_trust_needs_the_admin_token,
);

#[actix_web::test]
async fn a_batch_that_also_looks_like_an_event_is_refused_whole() {
    let app = app(Backend::Embedded).await;
    // Read as the batch alone, the payment of u2 would be dropped without a word.
    let mut both = pay("e2", "u2");
    both["events"] = json!([pay("e1", "u1")]);
    let (status, b) = post_events(&app, &both).await;
    assert_eq!(status, 400, "{b}");
    assert_eq!(b["error"]["code"], "invalid_field");
    let field = b["error"]["field"].as_str().unwrap_or("");
    assert!(
        ["event_id", "type", "user_id", "occurred_at"].contains(&field),
        "{b}"
    );
    assert_eq!(raw_points(&app, "u1").await, 0);
    assert_eq!(raw_points(&app, "u2").await, 0);
}

#[actix_web::test]
async fn an_event_user_id_may_be_an_integral_number_in_any_notation() {
    let app = app(Backend::Embedded).await;
    let mut e = pay("e1", "x");
    e["user_id"] = json!(10086.0);
    let (status, b) = post_events(&app, &e).await;
    assert_eq!(status, 202, "{b}");
    assert_eq!(raw_points(&app, "10086").await, 1);
    e["event_id"] = json!("e2");
    e["user_id"] = json!(10086.5);
    let (status, b) = post_events(&app, &e).await;
    assert_eq!(
        (status, b["error"]["field"].as_str()),
        (400, Some("user_id")),
        "{b}"
    );
}

#[actix_web::test]
async fn occurred_at_is_an_rfc_3339_date_time_with_a_t() {
    let app = app(Backend::Embedded).await;
    let mut e = pay("e1", "u1");
    e["occurred_at"] = json!(rfc3339(now_ms()).replace('T', " "));
    let (status, b) = post_events(&app, &e).await;
    assert_eq!(
        (status, b["error"]["field"].as_str()),
        (400, Some("occurred_at")),
        "{b}"
    );
    e["occurred_at"] = json!(rfc3339(now_ms()));
    let (status, b) = post_events(&app, &e).await;
    assert_eq!(status, 202, "{b}");
}

#[actix_web::test]
async fn more_than_1000_events_are_refused() {
    let app = app(Backend::Redis).await;
    let many = |n: usize| -> Value {
        json!({"events": (0..n).map(|i| pay(&format!("e{i}"), &format!("u{i}"))).collect::<Vec<_>>()})
    };
    let (status, b) = post_events(&app, &many(1001)).await;
    assert_eq!(status, 400, "{b}");
    assert_eq!(b["error"]["code"], "invalid_field");
    assert_eq!(b["error"]["field"], "events");
    assert_eq!(raw_points(&app, "u0").await, 0);
    let (status, b) = post_events(&app, &json!({"events": []})).await;
    assert_eq!(
        (status, b["error"]["field"].as_str()),
        (400, Some("events"))
    );
    // Exactly 1000 is one batch.
    let (status, b) = post_events(&app, &many(1000)).await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 1000, "duplicates": 0}))
    );
    assert_eq!(raw_points(&app, "u999").await, 1);
}

#[actix_web::test]
async fn events_taken_while_redis_is_down_are_applied_once_it_is_back() {
    let mut app = app(Backend::Redis).await;
    app.redis.kill();
    let (status, b) = post_events(&app, &pay("p1", "u")).await;
    assert_eq!(
        (status, &b),
        (202, &json!({"accepted": 1, "duplicates": 0}))
    );
    assert_eq!(app.state.events.pending(), 1);
    let (status, t) = trust(&app, "u").await;
    assert_eq!(
        (status, &t["error"]["code"]),
        (503, &json!("store_unavailable"))
    );
    let text = metrics(&app).await;
    assert!(
        text.contains(r#"vigia_events_total{result="deferred",type="payment_succeeded"} 1"#),
        "{text}"
    );

    // Back, empty, on the same port: the replayer applies the backlog.
    app.redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, t) = trust(&app, "u").await;
        if status == 200 && t["raw_points"] == 1 {
            assert_eq!(t["pending_events"], 0, "{t}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the event was not applied within 10 s of Redis returning: {status} {t}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Further replays and a re-sent event change nothing.
    assert_eq!(app.state.events.replay().await.unwrap(), 0);
    assert_eq!(app.state.events.replay().await.unwrap(), 0);
    assert_eq!(
        post_events(&app, &pay("p1", "u")).await.1,
        json!({"accepted": 0, "duplicates": 1})
    );
    let (_, t) = trust(&app, "u").await;
    assert_eq!(t["raw_points"], 1, "{t}");
    assert_eq!(t["awards"].as_array().unwrap().len(), 1, "{t}");
}

// ---------------------------------------------------------------------------------------
// The real binary, killed right after a 202
// ---------------------------------------------------------------------------------------

async fn post_to(v: &Vigia, path: &str, b: &Value) -> u16 {
    reqwest::Client::new()
        .post(format!("{}{path}", v.base))
        .json(b)
        .send()
        .await
        .expect("request reaches vigia")
        .status()
        .as_u16()
}

async fn points_of(v: &Vigia, user: &str) -> Value {
    reqwest::get(format!("{}/v1/trust/{user}", v.base))
        .await
        .expect("request reaches vigia")
        .json()
        .await
        .expect("JSON answer")
}

#[tokio::test]
async fn a_202_survives_kill_9_on_the_embedded_store() {
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    // The shipped config and rules: payment_succeeded is worth 1 point.
    let v = Vigia::start(port, data.path(), None).await;
    assert_eq!(post_to(&v, "/v1/events", &pay("p1", "10086")).await, 202);
    v.sigkill();
    let v = Vigia::start(port, data.path(), None).await;
    let t = points_of(&v, "10086").await;
    assert_eq!(t["raw_points"], 1, "{t}");
    assert_eq!(t["pending_events"], 0, "{t}");
}

#[tokio::test]
async fn a_202_taken_while_redis_is_down_survives_kill_9_and_is_applied_on_restart() {
    let mut redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = redis.url();
    let env = [("VIGIA_STORE", "redis"), ("VIGIA_REDIS_URL", url.as_str())];
    let v = Vigia::start_with_env(port, data.path(), None, &env).await;
    redis.kill();
    // Journaled, not applied: only the journal holds it when the process dies.
    assert_eq!(post_to(&v, "/v1/events", &pay("p1", "10086")).await, 202);
    v.sigkill();
    redis.restart();
    let v = Vigia::start_with_env(port, data.path(), None, &env).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let t = points_of(&v, "10086").await;
        if t["raw_points"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "not replayed after restart: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg("lt:trust-points:uid:10086")
        .arg(0)
        .arg(-1)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(members, ["1:payment_succeeded:p1"]);
}

// ---------------------------------------------------------------------------------------
// Expiry on both ledgers, with a manual clock
// ---------------------------------------------------------------------------------------

/// Ingests a 30-day payment at the clock's now, then walks the clock across its expiry.
async fn expiry_case(events: &Events, clock: &ManualClock) {
    let rules = rule_set();
    let t0 = clock.now_ms();
    let report = events
        .ingest(&rules, &event("p1", "payment_succeeded", "u", t0))
        .await
        .unwrap();
    assert_eq!((report.accepted, report.duplicates), (1, 0));
    assert_eq!(events.trust(&rules, "u").await.unwrap().raw_points, 1);
    assert_eq!(events.ledger().read("u", false).await.unwrap().points, 1);
    clock.set(t0 + 30 * DAY - 1);
    assert_eq!(events.trust(&rules, "u").await.unwrap().points, 1);
    clock.set(t0 + 30 * DAY);
    let view = events.trust(&rules, "u").await.unwrap();
    assert_eq!((view.raw_points, view.awards.len()), (0, 0));
    assert_eq!(events.ledger().read("u", false).await.unwrap().points, 0);
    // Re-sent after expiry: a duplicate, and worth nothing either way.
    let report = events
        .ingest(&rules, &event("p1", "payment_succeeded", "u", t0))
        .await
        .unwrap();
    assert_eq!((report.accepted, report.duplicates), (0, 1));
    assert_eq!(events.trust(&rules, "u").await.unwrap().raw_points, 0);
}

#[tokio::test]
async fn awards_expire_on_the_sled_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let windows =
        EmbeddedStore::open(&dir.path().join("windows"), Arc::new(clock.clone())).unwrap();
    let events_dir = dir.path().join("events");
    let db = journal::open_db(&events_dir).unwrap();
    let sled = Arc::new(SledLedger::open(&db, Arc::new(clock.clone())).unwrap());
    let refunds = Arc::new(Refunds::new(
        windows,
        Metrics::new(),
        &KeyPrefix::plain("lt"),
    ));
    let ledger: Arc<dyn TrustLedger> = sled;
    let events = Events::open_in(
        db,
        &events_dir,
        ledger,
        refunds,
        Metrics::new(),
        Arc::new(clock.clone()),
    )
    .unwrap();
    expiry_case(&events, &clock).await;
}

#[tokio::test]
async fn awards_expire_on_the_redis_ledger_and_so_does_the_key() {
    let redis = RedisServer::start();
    // Near the real time: key expiries run on Redis's own clock.
    let clock = ManualClock::new(now_ms());
    let store = RedisStore::connect(&redis.url(), 2000)
        .await
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let ledger = RedisLedger::new(store.link(), &KeyPrefix::plain("lt"))
        .await
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let store: Arc<dyn WindowStore> = Arc::new(store);
    let refunds = Arc::new(Refunds::new(store, Metrics::new(), &KeyPrefix::plain("lt")));
    let dir = tempfile::tempdir().unwrap();
    let events = Events::open(
        dir.path(),
        Arc::new(ledger),
        refunds,
        Metrics::new(),
        Arc::new(clock.clone()),
    )
    .unwrap();
    expiry_case(&events, &clock).await;
    // Every member trimmed: the key went with them.
    let exists: i64 = redis::cmd("EXISTS")
        .arg("lt:trust-points:uid:u")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(exists, 0);
}

#[tokio::test]
async fn the_redis_ledger_marks_first_sightings_with_a_bounded_retention() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(now_ms());
    let store = RedisStore::connect(&redis.url(), 2000).await.unwrap();
    let ledger = RedisLedger::new(store.link(), &KeyPrefix::plain("lt"))
        .await
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let t0 = clock.now_ms();
    assert_eq!(ledger.read("u:1", false).await.unwrap().first_seen_ms, None);
    assert!(
        !redis
            .conn()
            .exists::<_, bool>("lt:user-seen:uid:u%3A1")
            .unwrap(),
        "a plain read marked the user seen"
    );
    assert_eq!(
        ledger.read("u:1", true).await.unwrap().first_seen_ms,
        Some(t0)
    );
    clock.advance(DAY);
    assert_eq!(
        ledger.read("u:1", true).await.unwrap().first_seen_ms,
        Some(t0)
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg("lt:user-seen:uid:u%3A1")
        .query(&mut redis.conn())
        .unwrap();
    let retention = vigia::keys::SEEN_RETENTION_MS as i64;
    assert!(ttl > retention - 60_000 && ttl <= retention, "{ttl}");
}
