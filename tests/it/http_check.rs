//! The check path end to end over HTTP: decisions, statuses, headers, bodies.

use serde_json::json;

use crate::common::{body, limit, scene, spawn_app};

fn user_and_device_rules() -> String {
    scene(&format!(
        "{}{}{}",
        limit(
            "user_10s",
            "\"user\"",
            "sliding_window",
            "10s",
            2,
            "business"
        ),
        limit(
            "device_1d",
            "\"device\"",
            "sliding_window",
            "1d",
            5,
            "security"
        ),
        limit("ip_1m", "\"ip\"", "fixed_window", "1m", 100, "business"),
    ))
}

#[actix_web::test]
async fn allow_then_friendly_deny_with_headers_and_message() {
    let app = spawn_app(&[("s.toml", &user_and_device_rules())]).await;
    for i in 1..=2 {
        let (status, b) = app.check(body("10086")).await;
        assert_eq!(status, 200, "{b}");
        assert_eq!(b["decision"], "allow");
        assert_eq!(b["scene"], "s");
        assert_eq!(b["layer"], json!(null));
        assert_eq!(b["reason"], json!(null));
        assert_eq!(b["degraded"], false);
        assert!(b["rules_version"].as_str().unwrap().len() >= 16);
        let user = &b["limits"][0];
        assert_eq!(user["name"], "user_10s");
        assert_eq!(user["key"], "lt:s:uid:10086");
        assert_eq!(user["count"], i);
        assert_eq!(user["remaining"], 2 - i);
        assert_eq!(user["window_ms"], 10_000);
        assert_eq!(user["exceeded"], false);
    }
    let resp = app.post("/v1/check", &body("10086")).await;
    assert_eq!(resp.status(), 429);
    let h = resp.headers().clone();
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
    assert_eq!(h["ratelimit-policy"], "\"user_10s\";q=2;w=10");
    assert!(h["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"user_10s\";r=0;t="));
    let b: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(b["decision"], "friendly_deny");
    assert_eq!(b["layer"], "business");
    assert_eq!(b["reason"], "user_10s");
    assert_eq!(b["message"], "Agotado, vuelve mañana");
    assert!(b["retry_after_ms"].as_u64().unwrap() > 9_000);
    assert_eq!(b["limits"][0]["exceeded"], true);
    // The deny consumed nothing anywhere.
    let n: u64 = redis::cmd("ZCARD")
        .arg("lt:s:did:device-0001")
        .query(&mut app.redis.conn())
        .unwrap();
    assert_eq!(n, 2);
}

#[actix_web::test]
async fn a_silent_deny_looks_like_an_allow_on_the_wire() {
    let rules = scene(&format!(
        "{}{}",
        limit(
            "user_10s",
            "\"user\"",
            "sliding_window",
            "10s",
            1,
            "business"
        ),
        limit(
            "device_1d",
            "\"device\"",
            "sliding_window",
            "1d",
            1,
            "security"
        ),
    ));
    let app = spawn_app(&[("s.toml", &rules)]).await;
    let allow = app.post("/v1/check", &body("a")).await;
    assert_eq!(allow.status(), 200);
    let allow_headers: Vec<String> = allow.headers().keys().map(|k| k.to_string()).collect();
    // Same device, another user: the security limit trips (and the user limit does not).
    let deny = app.post("/v1/check", &body("b")).await;
    assert_eq!(deny.status(), 200);
    let deny_headers: Vec<String> = deny.headers().keys().map(|k| k.to_string()).collect();
    assert_eq!(allow_headers, deny_headers);
    let b: serde_json::Value = deny.json().await.unwrap();
    assert_eq!(b["decision"], "silent_deny");
    assert_eq!(b["layer"], "security");
    assert_eq!(b["reason"], "device_1d");
    assert_eq!(b["retry_after_ms"], json!(null));
}

#[actix_web::test]
async fn security_outranks_business() {
    let rules = scene(&format!(
        "{}{}",
        limit(
            "user_10s",
            "\"user\"",
            "sliding_window",
            "10s",
            1,
            "business"
        ),
        limit(
            "device_1d",
            "\"device\"",
            "sliding_window",
            "1d",
            1,
            "security"
        ),
    ));
    let app = spawn_app(&[("s.toml", &rules)]).await;
    app.check(body("a")).await;
    // Both limits are over for this one: the answer is the silent one.
    let (status, b) = app.check(body("a")).await;
    assert_eq!(status, 200);
    assert_eq!(b["decision"], "silent_deny");
    assert_eq!(b["reason"], "device_1d");
    assert_eq!(b["limits"][0]["exceeded"], true);
    assert_eq!(b["limits"][1]["exceeded"], true);
}

#[actix_web::test]
async fn an_invalid_device_id_is_a_silent_deny_that_creates_no_key() {
    let app = spawn_app(&[("s.toml", &user_and_device_rules())]).await;
    for device in [
        "short",
        "has space 123",
        "x".repeat(10_000).as_str(),
        "ab:cd:ef:gh",
    ] {
        let mut b = body("u1");
        b["device_id"] = json!(device);
        let (status, b) = app.check(b).await;
        assert_eq!(status, 200);
        assert_eq!(b["decision"], "silent_deny");
        assert_eq!(b["reason"], "invalid_device_id");
        assert_eq!(b["layer"], "security");
    }
    assert!(app.keys("*").is_empty(), "{:?}", app.keys("*"));
    assert_eq!(app.redis.command_calls().get("evalsha"), None);
}

#[actix_web::test]
async fn all_or_nothing_across_dimensions() {
    let rules = scene(&format!(
        "{}{}",
        limit(
            "user_10s",
            "\"user\"",
            "sliding_window",
            "10s",
            10,
            "business"
        ),
        limit(
            "device_1d",
            "\"device\"",
            "sliding_window",
            "1d",
            1,
            "business"
        ),
    ));
    let app = spawn_app(&[("s.toml", &rules)]).await;
    // Ids of their own: every check reaches the store (the over-limit cache answers only
    // checks whose id the service made, and reports just the limit that denies).
    let with_id = |i: usize| {
        let mut b = body("a");
        b["request_id"] = json!(format!("r{i}"));
        b
    };
    assert_eq!(app.check(with_id(0)).await.0, 200);
    for i in 1..4 {
        assert_eq!(app.check(with_id(i)).await.0, 429);
    }
    let (_, b) = app.check(with_id(4)).await;
    // Denied by the device only; the user's window still holds just the first request.
    assert_eq!(b["limits"][0]["count"], 1);
    assert_eq!(b["limits"][0]["exceeded"], false);
    assert_eq!(b["limits"][1]["exceeded"], true);
}

#[actix_web::test]
async fn one_store_round_trip_per_check() {
    let app = spawn_app(&[("s.toml", &user_and_device_rules())]).await;
    // The first check of the rules' shape of limits loads the script made for it, once.
    let mut first = body("u-first");
    first["request_id"] = json!("r-first");
    let loads = |calls: &std::collections::BTreeMap<String, u64>| calls.get("script|load").copied();
    let before = app.redis.command_calls();
    app.check(first).await;
    assert_eq!(
        loads(&app.redis.command_calls()),
        Some(loads(&before).unwrap_or(0) + 1)
    );
    let before = app.redis.command_calls();
    for i in 0..20 {
        // An id of its own: the over-limit cache would answer a repeated device deny
        // without the store (tests/it/over_limit.rs).
        let mut b = body(&format!("u{i}"));
        b["request_id"] = json!(format!("r{i}"));
        app.check(b).await;
    }
    let after = app.redis.command_calls();
    let delta = |c: &str| after.get(c).unwrap_or(&0) - before.get(c).unwrap_or(&0);
    assert_eq!(delta("evalsha"), 20);
    assert_eq!(delta("eval"), 0);
    assert_eq!(delta("script|load"), 0);
    assert_eq!(delta("multi"), 0);
}

#[actix_web::test]
async fn the_same_request_id_counts_once_and_idempotent_retries_are_free() {
    let app = spawn_app(&[("s.toml", &user_and_device_rules())]).await;
    let mut b = body("u");
    b["request_id"] = json!("req-1");
    let (_, first) = app.check(b.clone()).await;
    assert_eq!(first["request_id"], "req-1");
    let (status, again) = app.check(b).await;
    assert_eq!(status, 200);
    assert_eq!(again["decision"], "allow");
    assert_eq!(again["duplicate_of"], "req-1");

    let mut b = body("u");
    b["idempotency_key"] = json!("order-77");
    let (_, first) = app.check(b.clone()).await;
    let first_id = first["request_id"].as_str().unwrap().to_string();
    assert_eq!(first["duplicate_of"], json!(null));
    let (status, retry) = app.check(b).await;
    assert_eq!(status, 200);
    assert_eq!(retry["duplicate_of"], json!(first_id));
    assert_ne!(retry["request_id"], json!(first_id));
    // Two counted requests (req-1 and the first idempotent one), not four.
    let n: u64 = redis::cmd("ZCARD")
        .arg("lt:s:uid:u")
        .query(&mut app.redis.conn())
        .unwrap();
    assert_eq!(n, 2);
}

#[actix_web::test]
async fn generated_request_ids_are_time_ordered_ulids() {
    let app = spawn_app(&[("s.toml", &user_and_device_rules())]).await;
    let (_, a) = app.check(body("u1")).await;
    let (_, b) = app.check(body("u2")).await;
    let (a, b) = (
        a["request_id"].as_str().unwrap(),
        b["request_id"].as_str().unwrap(),
    );
    assert_eq!(a.len(), 26);
    // ULIDs order by their millisecond timestamp (the first 10 characters); two made in
    // the same millisecond are ordered by their random part, i.e. not at all.
    assert!(a[..10] <= b[..10], "{a} then {b}");
    let ms = ulid::Ulid::from_string(a).unwrap().timestamp_ms();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(now - ms < 60_000, "the id's time is now");
}

#[actix_web::test]
async fn a_dry_run_decides_but_records_nothing() {
    let app = spawn_app(&[("s.toml", &user_and_device_rules())]).await;
    let mut b = body("u");
    b["dry_run"] = json!(true);
    for _ in 0..5 {
        let (status, r) = app.check(b.clone()).await;
        assert_eq!(status, 200);
        assert_eq!(r["limits"][0]["count"], 1);
    }
    assert!(app.keys("*").is_empty());
    app.check(body("u")).await;
    app.check(body("u")).await;
    let (status, r) = app.check(b).await;
    assert_eq!(status, 429, "{r}");
    assert_eq!(app.keys("lt:s:uid:*").len(), 1);
}

#[actix_web::test]
async fn a_refund_gives_the_quota_back_once() {
    let app = spawn_app(&[("s.toml", &user_and_device_rules())]).await;
    let mut b = body("u");
    b["request_id"] = json!("r1");
    app.check(b).await;
    app.check(body("u")).await;
    assert_eq!(app.check(body("u")).await.0, 429);
    let refund = json!({"scene": "s", "request_id": "r1", "user_id": "u", "device_id": "device-0001", "ip": "192.0.2.10"});
    let resp = app.post("/v1/refund", &refund).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"refunded": true, "given_back": ["user_10s", "device_1d", "ip_1m"], "held_nothing": []})
    );
    let resp = app.post("/v1/refund", &refund).await;
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"refunded": false, "given_back": [], "held_nothing": ["user_10s", "device_1d", "ip_1m"]})
    );
    let (status, r) = app.check(body("u")).await;
    assert_eq!(status, 200, "{r}");
    // Every dimension got it back: the device and the fixed IP window count 2, not 3.
    assert_eq!(r["limits"][0]["count"], 2);
    assert_eq!(r["limits"][1]["count"], 2);
    assert_eq!(r["limits"][2]["count"], 2);
}

#[actix_web::test]
async fn a_cidr_override_raises_the_ip_limit_for_its_range_only() {
    let rules = scene(&format!(
        "{}\n[[scene.s.overrides]]\ncidr = \"10.8.0.0/16\"\nlimit = \"ip_1m\"\nmax = 5\n",
        limit("ip_1m", "\"ip\"", "fixed_window", "1m", 2, "business"),
    ));
    let app = spawn_app(&[("s.toml", &rules)]).await;
    let at = |user: &str, ip: &str| {
        let mut b = body(user);
        b["ip"] = json!(ip);
        b
    };
    let mut allowed = 0;
    for i in 0..8 {
        if app.check(at(&format!("campus{i}"), "10.8.3.4")).await.0 == 200 {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 5);
    let mut allowed = 0;
    for i in 0..8 {
        if app.check(at(&format!("home{i}"), "192.0.2.99")).await.0 == 200 {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 2);
}

#[actix_web::test]
async fn the_gateway_denies_without_touching_the_store() {
    let rules = scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        100,
        "business",
    ))
    .replace(
        "required = [",
        "gateway = { rate_per_s = 1, burst = 3 }\nrequired = [",
    );
    let app = spawn_app(&[("s.toml", &rules)]).await;
    for i in 0..3 {
        assert_eq!(app.check(body(&format!("u{i}"))).await.0, 200);
    }
    let before = app.redis.command_calls().get("evalsha").copied();
    let resp = app.post("/v1/check", &body("u9")).await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    let b: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(b["layer"], "resource");
    assert_eq!(b["reason"], "gateway_rate");
    assert_eq!(app.redis.command_calls().get("evalsha").copied(), before);
}

#[actix_web::test]
async fn the_store_failing_follows_the_scene_policy() {
    let rules = format!(
        "{}\n{}",
        scene(&limit(
            "user_10s",
            "\"user\"",
            "sliding_window",
            "10s",
            5,
            "business"
        )),
        r#"
[scene.claim_local]
on_store_error = "local"
required = ["user"]
[[scene.claim_local.limits]]
name = "user_1m"
dimensions = ["user"]
algorithm = "sliding_window"
window = "1m"
max = 1

[scene.browse]
on_store_error = "fail_open"
required = ["ip"]
[[scene.browse.limits]]
name = "ip_1m"
dimensions = ["ip"]
algorithm = "fixed_window"
window = "1m"
max = 1000
"#
    );
    let mut app = spawn_app(&[("s.toml", &rules)]).await;
    assert_eq!(app.get("/readyz").await.status(), 200);
    app.redis.kill();
    let (status, b) = app.check(body("u")).await;
    assert_eq!(status, 503, "{b}");
    assert_eq!(b["decision"], "friendly_deny");
    assert_eq!(b["reason"], "store_unavailable");
    assert_eq!(b["degraded"], true);
    let (status, b) = app
        .check(json!({"scene": "browse", "ip": "192.0.2.1"}))
        .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["decision"], "allow");
    assert_eq!(b["degraded"], true);
    // `local`: the node's own embedded store decides, with the same limits.
    let (status, b) = app
        .check(json!({"scene": "claim_local", "user_id": "u"}))
        .await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(
        (b["decision"].as_str(), b["degraded"].as_bool()),
        (Some("allow"), Some(true))
    );
    assert_eq!(b["limits"][0]["count"], 1);
    let (status, b) = app
        .check(json!({"scene": "claim_local", "user_id": "u"}))
        .await;
    assert_eq!(status, 429, "{b}");
    assert_eq!(b["reason"], "user_1m");
    assert_eq!(b["degraded"], true);
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 503);
    let r: serde_json::Value = ready.json().await.unwrap();
    assert!(r["problems"][0].as_str().unwrap().contains("store"), "{r}");
}

#[actix_web::test]
async fn a_refund_without_a_dimension_its_limits_count_on_is_400_naming_it() {
    let app = spawn_app(&[("s.toml", &user_and_device_rules())]).await;
    let mut b = body("u");
    b["request_id"] = json!("r1");
    app.check(b).await;
    app.check(body("u")).await;
    assert_eq!(app.check(body("u")).await.0, 429);
    // The device limit counted r1 too: a refund without the device cannot name its key.
    let refund = json!({"scene": "s", "request_id": "r1", "user_id": "u", "ip": "192.0.2.10"});
    let resp = app.post("/v1/refund", &refund).await;
    assert_eq!(resp.status(), 400);
    let e: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "missing_dimension", "{e}");
    assert_eq!(e["error"]["field"], "device_id", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("device_id"),
        "{e}"
    );
    // Nothing was given back.
    assert_eq!(app.check(body("u")).await.0, 429);
    // An unknown request with every dimension is still a 200 that refunds nothing.
    let unknown = json!({"scene": "s", "request_id": "nope", "user_id": "u", "device_id": "device-0001", "ip": "192.0.2.10"});
    let resp = app.post("/v1/refund", &unknown).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<serde_json::Value>().await.unwrap(),
        json!({"refunded": false, "given_back": [], "held_nothing": ["user_10s", "device_1d", "ip_1m"]})
    );
}

#[actix_web::test]
async fn a_scene_without_score_answers_score_zero_never_minus_zero() {
    let app = spawn_app(&[("s.toml", &user_and_device_rules())]).await;
    for _ in 0..3 {
        let resp = app.post("/v1/check", &body("u")).await;
        let text = resp.text().await.unwrap();
        assert!(text.contains("\"score\":0.0"), "{text}");
        assert!(!text.contains("-0.0"), "{text}");
    }
}
