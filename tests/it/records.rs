//! How long a check is remembered: its request and idempotency records live
//! `[store] record_horizon_ms`, or the scene's longest window when that is shorter — not a
//! day for every check of a day-long limit. Within the horizon a repeat counts once and a
//! refund works; after it the same id is a new request.

use std::sync::Arc;

use redis::Commands;
use serde_json::{json, Value};
use vigia::clock::ManualClock;
use vigia::config::StoreBackend;

use crate::common::app::{spawn_app_configured, spawn_app_on_clock};
use crate::common::redis_server::RedisServer;

const RULES: &str = include_str!("../fixtures/records/rules.toml");

/// 2031-03-01T12:00:00Z.
const START_MS: u64 = 1_930_132_800_000;

fn check(scene: &str, request_id: &str) -> Value {
    json!({"scene": scene, "user_id": "u", "request_id": request_id, "idempotency_key": format!("k-{request_id}")})
}

#[actix_web::test]
async fn on_redis_records_expire_at_the_horizon_or_the_scenes_longest_window() {
    let app = spawn_app_configured(RedisServer::start(), &[("r.toml", RULES)], |c| {
        c.store.record_horizon_ms = 30_000;
    })
    .await;
    assert_eq!(app.check(check("day", "d1")).await.0, 200);
    assert_eq!(app.check(check("short", "s1")).await.0, 200);
    let mut conn = app.redis.conn();
    for (key, most) in [
        ("lt:day:req:d1", 30_000),
        ("lt:day:idem:k-d1", 30_000),
        ("lt:short:req:s1", 10_000),
        ("lt:short:idem:k-s1", 10_000),
    ] {
        let ttl: i64 = conn.pttl(key).expect("PTTL");
        assert!(
            ttl > 0 && ttl <= most,
            "{key} lives {ttl} ms, expected (0, {most}]"
        );
    }
    // The window's own member is kept for the whole day, as the limit needs.
    let ttl: i64 = conn.pttl("lt:day:uid:u").expect("PTTL");
    assert!(ttl > 86_000_000, "the day window's key lives {ttl} ms");
}

#[actix_web::test]
async fn past_the_horizon_the_same_id_is_a_new_request_and_within_it_a_repeat() {
    let clock = ManualClock::new(START_MS);
    let app = spawn_app_on_clock(
        RedisServer::start(),
        &[("r.toml", RULES)],
        |c| {
            c.store.backend = StoreBackend::Embedded;
            c.store.record_horizon_ms = 60_000;
        },
        Arc::new(clock.clone()),
    )
    .await;
    let (status, first) = app.check(check("day", "d1")).await;
    assert_eq!(
        (status, first["limits"][0]["count"].as_u64()),
        (200, Some(1))
    );
    clock.advance(59_000);
    let (_, repeat) = app.check(check("day", "d1")).await;
    assert_eq!(repeat["duplicate_of"], "d1", "{repeat}");
    clock.advance(2_000);
    let (status, again) = app.check(check("day", "d1")).await;
    assert_eq!(status, 200);
    assert_eq!(again["duplicate_of"], Value::Null, "{again}");
    assert_eq!(
        again["limits"][0]["count"], 2,
        "counted again in the day window: {again}"
    );
    // The second counting has a record of its own: a refund within its horizon works.
    let refund = json!({"scene": "day", "request_id": "d1", "user_id": "u"});
    let resp = app.post("/v1/refund", &refund).await;
    let answer: Value = resp.json().await.expect("JSON");
    assert_eq!(answer, json!({"refunded": true}));
}
