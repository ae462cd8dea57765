//! The over-limit cache end to end, on both stores: a key the store found full is denied
//! on the node without the store, and whatever gives quota back (a refund, a trust award,
//! a reload) lifts it at once — the tests hold keys for a minute, so only an invalidation
//! can explain an allow. A check carrying its own request id always reaches the store.

use serde_json::{json, Value};
use vigia::config::{Config, StoreBackend};

use crate::common::{body, spawn_app_configured, RedisServer, TestApp};

const RULES: &str = include_str!("../fixtures/over_limit/rules.toml");

#[derive(Debug, Clone, Copy)]
enum Backend {
    Redis,
    Embedded,
}

const BOTH: [Backend; 2] = [Backend::Redis, Backend::Embedded];

async fn app_with(backend: Backend, rules: &str, configure: impl FnOnce(&mut Config)) -> TestApp {
    spawn_app_configured(RedisServer::start(), &[("s.toml", rules)], move |c| {
        if let Backend::Embedded = backend {
            c.store.backend = StoreBackend::Embedded;
        }
        // Long enough that an allow within the test can only come from an invalidation.
        c.over_limit.hold_ms = 60_000;
        configure(c);
    })
    .await
}

async fn app(backend: Backend) -> TestApp {
    app_with(backend, RULES, |_| {}).await
}

fn with_id(user: &str, request_id: &str) -> Value {
    let mut b = body(user);
    b["request_id"] = json!(request_id);
    b
}

/// Checks of the scene answered from the cache so far.
async fn cache_answers(app: &TestApp) -> u64 {
    let text = app.get("/metrics").await.text().await.expect("metrics");
    text.lines()
        .find_map(|l| l.strip_prefix("vigia_over_limit_cache_answers_total{scene=\"s\"} "))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// Fills `user`'s limit of 2 with r1 and r2, then has the store deny a third check (no id
/// of its own) — which the cache learns.
async fn fill(app: &TestApp, user: &str, b: Backend) {
    assert_eq!(app.check(with_id(user, "r1")).await.0, 200, "{b:?}");
    assert_eq!(app.check(with_id(user, "r2")).await.0, 200, "{b:?}");
    let (status, deny) = app.check(body(user)).await;
    assert_eq!(status, 429, "{b:?}: {deny}");
    assert_eq!(
        cache_answers(app).await,
        0,
        "{b:?}: the store answered this one"
    );
}

#[actix_web::test]
async fn a_full_key_is_denied_from_the_cache_until_a_refund_gives_quota_back() {
    for b in BOTH {
        let app = app(b).await;
        fill(&app, "u", b).await;
        let (status, deny) = app.check(body("u")).await;
        assert_eq!(status, 429, "{b:?}: {deny}");
        assert_eq!(cache_answers(&app).await, 1, "{b:?}");
        assert_eq!(deny["reason"], "user_1m", "{b:?}: {deny}");
        assert_eq!(deny["message"], "Agotado, vuelve mañana", "{b:?}");
        let limits = deny["limits"].as_array().expect("limits");
        assert_eq!(limits.len(), 1, "{b:?}: only the limit that denies: {deny}");
        assert_eq!(limits[0]["count"], 2, "{b:?}: {deny}");
        let retry = deny["retry_after_ms"].as_u64().expect("retry");
        assert!(retry > 0 && retry <= 60_000, "{b:?}: {deny}");
        // Another user on the same device and IP is not held by this one's key.
        assert_eq!(app.check(body("v")).await.0, 200, "{b:?}");

        let refund = json!({"scene": "s", "request_id": "r1", "user_id": "u", "device_id": "device-0001", "ip": "192.0.2.10"});
        let resp = app.post("/v1/refund", &refund).await;
        assert_eq!(resp.status().as_u16(), 200, "{b:?}");
        let (status, allow) = app.check(body("u")).await;
        assert_eq!(status, 200, "{b:?}: the refund freed one: {allow}");
        assert_eq!(allow["limits"][0]["count"], 2, "{b:?}: {allow}");
        assert_eq!(cache_answers(&app).await, 1, "{b:?}");
    }
}

#[actix_web::test]
async fn a_retry_with_its_own_request_id_reaches_the_store_while_the_key_is_held() {
    for b in BOTH {
        let app = app(b).await;
        fill(&app, "u", b).await;
        let (status, again) = app.check(with_id("u", "r1")).await;
        assert_eq!(status, 200, "{b:?}: r1 was allowed: {again}");
        assert_eq!(again["duplicate_of"], "r1", "{b:?}: {again}");
        // A new id is asked of the store too (and denied by it).
        assert_eq!(app.check(with_id("u", "r3")).await.0, 429, "{b:?}");
        let mut keyed = body("u");
        keyed["idempotency_key"] = json!("k1");
        assert_eq!(app.check(keyed).await.0, 429, "{b:?}");
        assert_eq!(cache_answers(&app).await, 0, "{b:?}");
    }
}

#[actix_web::test]
async fn a_trust_award_lifts_a_held_key_at_once() {
    for b in BOTH {
        let app = app(b).await;
        fill(&app, "u", b).await;
        assert_eq!(app.check(body("u")).await.0, 429, "{b:?}");
        let pay = json!({"event_id": "p1", "type": "payment_succeeded", "user_id": "u",
            "occurred_at": chrono::Utc::now().to_rfc3339()});
        let resp = app.post("/v1/events", &pay).await;
        assert_eq!(resp.status().as_u16(), 202, "{b:?}");
        let (status, allow) = app.check(body("u")).await;
        assert_eq!(status, 200, "{b:?}: one point raised the max to 3: {allow}");
        assert_eq!(allow["limits"][0]["max"], 3, "{b:?}: {allow}");
    }
}

#[actix_web::test]
async fn a_reload_that_raises_the_trust_bonus_lifts_a_held_key_at_once() {
    // The limit's own max stays 2: only forgetting the held key on reload can let the
    // bigger bonus through.
    for b in BOTH {
        let app = app(b).await;
        let pay = json!({"event_id": "p1", "type": "payment_succeeded", "user_id": "u",
            "occurred_at": chrono::Utc::now().to_rfc3339()});
        assert_eq!(app.post("/v1/events", &pay).await.status().as_u16(), 202);
        for n in 1..=3 {
            assert_eq!(
                app.check(body("u")).await.0,
                200,
                "{b:?}: check {n} of 2 + 1 point"
            );
        }
        assert_eq!(app.check(body("u")).await.0, 429, "{b:?}");
        assert_eq!(app.check(body("u")).await.0, 429, "{b:?}");
        assert_eq!(cache_answers(&app).await, 1, "{b:?}");
        let rules = RULES.replace("bonus_per_point = 1\n", "bonus_per_point = 3\n");
        std::fs::write(app.rules_path().join("s.toml"), rules).expect("rewrite rules");
        let resp = app
            .client
            .post(format!("{}/v1/admin/reload", app.base))
            .send()
            .await
            .expect("reload");
        assert_eq!(resp.status().as_u16(), 200, "{b:?}");
        let (status, allow) = app.check(body("u")).await;
        assert_eq!(status, 200, "{b:?}: 2 + 1 point x 3: {allow}");
        assert_eq!(allow["limits"][0]["max"], 5, "{b:?}: {allow}");
    }
}

#[actix_web::test]
async fn a_held_user_on_a_new_device_is_seen_by_the_store() {
    for b in BOTH {
        let app = app(b).await;
        fill(&app, "u", b).await;
        let mut other = body("u");
        other["device_id"] = json!("device-0002");
        assert_eq!(app.check(other).await.0, 429, "{b:?}");
        assert_eq!(
            cache_answers(&app).await,
            0,
            "{b:?}: users_per_device on device-0002 must see u"
        );
    }
}

#[actix_web::test]
async fn max_keys_0_turns_the_cache_off() {
    for b in BOTH {
        let app = app_with(b, RULES, |c| c.over_limit.max_keys = 0).await;
        fill(&app, "u", b).await;
        for _ in 0..3 {
            assert_eq!(app.check(body("u")).await.0, 429, "{b:?}");
        }
        assert_eq!(cache_answers(&app).await, 0, "{b:?}");
    }
}
