//! API.md: "A store that is down at start-up is not a config error: the service starts,
//! `/readyz` says 503 naming the store, and each scene's `on_store_error` answers until
//! the store is back."

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{free_port, spawn_app_configured, RedisServer, TestApp};

const RULES: &str = r#"
[scene.open]
on_store_error = "fail_open"
required = ["user"]

[[scene.open.limits]]
name = "user_1m"
dimensions = ["user"]
algorithm = "sliding_window"
window = "1m"
max = 1

[scene.closed]
on_store_error = "fail_close"
required = ["user"]

[[scene.closed.limits]]
name = "user_1m"
dimensions = ["user"]
algorithm = "sliding_window"
window = "1m"
max = 1
"#;

async fn readyz(app: &TestApp) -> (u16, Value) {
    let r = app.get("/readyz").await;
    (r.status().as_u16(), r.json().await.unwrap())
}

fn check(scene: &str, user: &str) -> Value {
    json!({"scene": scene, "user_id": user})
}

#[actix_web::test]
async fn a_redis_down_at_start_up_is_served_by_policy_until_it_comes_up() {
    // The app's own Redis is a bystander: vigia is pointed at a port nothing listens on.
    let bystander = RedisServer::start();
    let port = free_port();
    let app = spawn_app_configured(bystander, &[("r.toml", RULES)], |c| {
        c.store.redis_url = format!("redis://127.0.0.1:{port}");
        c.store.breaker_open_ms = 200;
    })
    .await;

    let (status, body) = readyz(&app).await;
    assert_eq!(status, 503, "{body}");
    let problems = body["problems"].to_string();
    assert!(problems.contains("store (redis)"), "{body}");
    assert_eq!(body["store"], "redis");

    let (status, b) = app.check(check("open", "u1")).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["decision"], "allow", "{b}");
    assert_eq!(b["degraded"], true, "{b}");
    let (status, b) = app.check(check("closed", "u1")).await;
    assert_eq!(status, 503, "{b}");
    assert_eq!(b["decision"], "friendly_deny", "{b}");
    assert_eq!(b["reason"], "store_unavailable", "{b}");

    // Redis comes up on that port: the service reconnects by itself.
    let _redis = RedisServer::start_on(port);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if readyz(&app).await.0 == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready 20 s after Redis came up: {}",
            readyz(&app).await.1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for scene in ["open", "closed"] {
        let (status, b) = app.check(check(scene, "u2")).await;
        assert_eq!(status, 200, "{b}");
        assert_eq!(b["degraded"], false, "{b}");
        assert_eq!(b["limits"][0]["count"], 1, "{b}");
        // Counted in Redis: the limit denies the second.
        let (status, b) = app.check(check(scene, "u2")).await;
        assert_eq!(status, 429, "{b}");
    }
}

#[actix_web::test]
async fn a_refused_connection_is_reported_as_refused_not_as_a_timeout() {
    let bystander = RedisServer::start();
    let port = free_port();
    let app = spawn_app_configured(bystander, &[("r.toml", RULES)], |c| {
        c.store.redis_url = format!("redis://127.0.0.1:{port}");
        // Never open: every readyz asks (and reports what the connection said).
        c.store.breaker_failures = 1000;
    })
    .await;
    let (status, body) = readyz(&app).await;
    assert_eq!(status, 503, "{body}");
    let problems = body["problems"].to_string().to_lowercase();
    assert!(problems.contains("refused"), "{body}");
    assert!(!problems.contains("timed out"), "{body}");
}
