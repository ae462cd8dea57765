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

/// On Redis a record is a field of its user's records hash for one generation (as long as
/// the record TTL): the hash expires at the end of the next generation plus the margin, so
/// a record lives at least the TTL and less than twice it.
#[actix_web::test]
async fn on_redis_records_live_at_least_the_horizon_or_the_scenes_longest_window() {
    let app = spawn_app_configured(RedisServer::start(), &[("r.toml", RULES)], |c| {
        c.store.record_horizon_ms = 30_000;
    })
    .await;
    assert_eq!(app.check(check("day", "d1")).await.0, 200);
    assert_eq!(app.check(check("short", "s1")).await.0, 200);
    let mut conn = app.redis.conn();
    for (scene, id, ttl) in [("day", "d1", 30_000u64), ("short", "s1", 10_000)] {
        let hashes: Vec<String> = conn.keys(format!("lt:{scene}:rq:uid:u:*")).expect("KEYS");
        let [hash] = &hashes[..] else {
            panic!("one records hash for {scene}, found {hashes:?}")
        };
        let generation: u64 = hash.rsplit(':').next().unwrap().parse().expect("a number");
        let record: String = conn.hget(hash, id).expect("the record");
        // "<ms since the generation's start>", then the fixed window the short scene names.
        let digits = record
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap_or("");
        let since_start: u64 = digits.parse().expect("ms first");
        let written = generation * ttl + since_start;
        let expires: i64 = redis::cmd("PEXPIRETIME")
            .arg(hash)
            .query(&mut conn)
            .expect("PEXPIRETIME");
        let expires = u64::try_from(expires).expect("an expiry");
        // The end of the next generation plus the margin; PEXPIRE counts from Redis's clock
        // as it runs the command, which may have moved a millisecond past the script's
        // TIME (the range allows a second for the script itself).
        let end = (generation + 2) * ttl + 1000;
        assert!(
            (end..end + 1000).contains(&expires),
            "{hash} expires at {expires}, expected {end}"
        );
        assert!(
            expires - written > ttl && expires - written <= 2 * ttl + 2000,
            "{hash}: the record lives {} ms, expected more than {ttl} and about {} at most",
            expires - written,
            2 * ttl + 1000
        );
        // The idempotency record sits beside it, and lives as long.
        let counted: String = conn.hget(hash, format!("i:k-{id}")).expect("idempotency");
        assert_eq!(counted, id);
    }
    // The window's own member is kept for the whole day, as the limit needs.
    let ttl: i64 = conn.pttl("lt:day:uid:u").expect("PTTL");
    assert!(ttl > 86_000_000, "the day window's key lives {ttl} ms");
}

/// Within the horizon a repeat counts once; past it the same id is a new request, with a
/// record of its own that a refund finds. The check comes 59 s into a minute: on Redis its
/// record is in that minute's hash (a generation, the horizon long), the repeat 59 s later
/// finds it in the previous generation's, and 61 s after the check the generation it sits
/// in is no longer looked at (the embedded store: the record has expired).
async fn past_the_horizon_the_same_id_is_a_new_request(backend: StoreBackend) {
    let clock = ManualClock::new(START_MS + 59_000);
    let app = spawn_app_on_clock(
        RedisServer::start(),
        &[("r.toml", RULES)],
        |c| {
            c.store.backend = backend;
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
    // A retry with the idempotency key alone is found the same way.
    let retry = json!({"scene": "day", "user_id": "u", "request_id": "d1-retry", "idempotency_key": "k-d1"});
    let (_, retried) = app.check(retry).await;
    assert_eq!(retried["duplicate_of"], "d1", "{retried}");
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
    assert_eq!(
        answer,
        json!({"refunded": true, "given_back": ["user_1d"], "held_nothing": []})
    );
}

#[actix_web::test]
async fn embedded_past_the_horizon_the_same_id_is_a_new_request_and_within_it_a_repeat() {
    past_the_horizon_the_same_id_is_a_new_request(StoreBackend::Embedded).await;
}

#[actix_web::test]
async fn on_redis_past_the_horizon_the_same_id_is_a_new_request_and_within_it_a_repeat() {
    past_the_horizon_the_same_id_is_a_new_request(StoreBackend::Redis).await;
}

/// A request id (or an idempotency key) repeats for the entity it was counted under (the
/// user here) only: another user's check naming it is counted as a request of its own, not
/// answered as a repeat (which would allow it without counting anything).
async fn a_request_id_repeats_only_for_its_own_user(backend: StoreBackend) {
    let app = spawn_app_configured(RedisServer::start(), &[("r.toml", RULES)], |c| {
        c.store.backend = backend;
    })
    .await;
    let by = |user: &str| json!({"scene": "day", "user_id": user, "request_id": "shared-id"});
    let (_, first) = app.check(by("ann")).await;
    assert_eq!(first["limits"][0]["count"], 1, "{first}");
    let (_, other) = app.check(by("bob")).await;
    assert_eq!(other["duplicate_of"], Value::Null, "{other}");
    assert_eq!(other["limits"][0]["count"], 1, "counted for bob: {other}");
    let (_, again) = app.check(by("ann")).await;
    assert_eq!(again["duplicate_of"], "shared-id", "{again}");

    // So does an idempotency key.
    let retry = |user: &str, id: &str| json!({"scene": "day", "user_id": user, "request_id": id, "idempotency_key": "k"});
    let (_, first) = app.check(retry("ann", "a1")).await;
    assert_eq!(first["duplicate_of"], Value::Null, "{first}");
    let (_, other) = app.check(retry("bob", "b1")).await;
    assert_eq!(other["duplicate_of"], Value::Null, "{other}");
    assert_eq!(other["limits"][0]["count"], 2, "counted for bob: {other}");
    let (_, again) = app.check(retry("ann", "a2")).await;
    assert_eq!(again["duplicate_of"], "a1", "{again}");
}

#[actix_web::test]
async fn embedded_a_request_id_repeats_only_for_its_own_user() {
    a_request_id_repeats_only_for_its_own_user(StoreBackend::Embedded).await;
}

#[actix_web::test]
async fn on_redis_a_request_id_repeats_only_for_its_own_user() {
    a_request_id_repeats_only_for_its_own_user(StoreBackend::Redis).await;
}
