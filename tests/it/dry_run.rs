//! A dry run says it is one, and meets the gateway a real check would meet without taking
//! its token.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;
use vigia::clock::ManualClock;

use crate::common::app::spawn_app_on_clock;
use crate::common::{body, limit, scene, spawn_app, RedisServer};

fn rules() -> String {
    scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        5,
        "business",
    ))
}

/// An allow of a dry run and an allow of a real check once looked the same: a backend
/// that forgot it asked a dry run would hand out the coupon.
#[actix_web::test]
async fn a_dry_runs_answer_says_dry_run_and_a_real_checks_does_not() {
    let app = spawn_app(&[("s.toml", &rules())]).await;
    let mut dry = body("u");
    dry["dry_run"] = json!(true);
    let (status, b) = app.check(dry).await;
    assert_eq!((status, &b["decision"]), (200, &json!("allow")), "{b}");
    assert_eq!(b["dry_run"], json!(true), "{b}");

    let mut real = body("u");
    real["dry_run"] = json!(false);
    for real in [real, body("u")] {
        let (status, b) = app.check(real).await;
        assert_eq!((status, &b["decision"]), (200, &json!("allow")), "{b}");
        assert!(b.get("dry_run").is_none(), "only a dry run says so: {b}");
    }
}

/// The gateway (burst 2, refilled only as the manual clock moves): dry runs take no
/// token, so two real checks still pass after five of them; once the real checks emptied
/// the bucket, a dry run is answered `gateway_rate` as a real one is, without a store call.
#[actix_web::test]
async fn a_dry_run_meets_the_gateway_without_spending_it() {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as u64;
    let rules = rules().replace(
        "required = [",
        "gateway = { rate_per_s = 1, burst = 2 }\nrequired = [",
    );
    let app = spawn_app_on_clock(
        RedisServer::start(),
        &[("s.toml", &rules)],
        |_| {},
        Arc::new(ManualClock::new(now)),
    )
    .await;
    let dry = |user: &str| {
        let mut b = body(user);
        b["dry_run"] = json!(true);
        b
    };
    for i in 0..5 {
        let (status, b) = app.check(dry(&format!("d{i}"))).await;
        assert_eq!((status, &b["decision"]), (200, &json!("allow")), "{b}");
    }
    for i in 0..2 {
        let (status, b) = app.check(body(&format!("r{i}"))).await;
        assert_eq!(status, 200, "the dry runs took no token: {b}");
    }
    let before = app.redis.command_calls().get("evalsha").copied();
    let (status, b) = app.check(dry("d9")).await;
    assert_eq!(status, 429, "{b}");
    assert_eq!(
        (&b["reason"], &b["layer"], &b["dry_run"]),
        (&json!("gateway_rate"), &json!("resource"), &json!(true)),
        "{b}"
    );
    assert_eq!(
        app.redis.command_calls().get("evalsha").copied(),
        before,
        "a gateway deny costs the store nothing"
    );
    assert_eq!(app.check(body("r9")).await.0, 429);
}
