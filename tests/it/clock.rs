//! One clock: every part of the service that reads time takes it from the clock handed
//! to `app::build`. Started on a manual clock far from today, the service dates its rule
//! load, refills its gateway, ages its users and expires its windows by that clock alone.

use std::sync::Arc;

use serde_json::json;
use vigia::clock::ManualClock;
use vigia::config::StoreBackend;

use crate::common::app::spawn_app_on_clock;
use crate::common::redis_server::RedisServer;

/// 2031-03-01T12:00:00Z.
const START_MS: u64 = 1_930_132_800_000;

const RULES: &str = r#"
[scene.s]
on_store_error = "fail_close"
required = ["user", "device", "ip"]
gateway = { rate_per_s = 1, burst = 2 }

[[scene.s.limits]]
name = "user_1h"
dimensions = ["user"]
algorithm = "sliding_window"
window = "1h"
max = 1

[trust]
max_points = 3
new_account = { younger_than = "1d", max_factor = 1.0 }
"#;

fn body(user: &str) -> serde_json::Value {
    json!({"scene": "s", "user_id": user, "device_id": "device-0001", "ip": "192.0.2.1"})
}

#[actix_web::test]
async fn the_service_keeps_time_by_the_clock_it_was_built_on() {
    let clock = ManualClock::new(START_MS);
    let app = spawn_app_on_clock(
        RedisServer::start(),
        &[("s.toml", RULES)],
        |c| c.store.backend = StoreBackend::Embedded,
        Arc::new(clock.clone()),
    )
    .await;

    let rules: serde_json::Value = app.get("/v1/rules").await.json().await.unwrap();
    assert_eq!(rules["loaded_at"], "2031-03-01T12:00:00.000Z");

    // The gateway (1/s, burst 2) refills only as this clock moves.
    assert_eq!(app.check(body("a")).await.1["decision"], "allow");
    assert_eq!(app.check(body("b")).await.1["decision"], "allow");
    let (status, denied) = app.check(body("c")).await;
    assert_eq!(
        (status, denied["reason"].as_str()),
        (429, Some("gateway_rate"))
    );
    clock.advance(1_000);
    assert_eq!(app.check(body("c")).await.1["decision"], "allow");

    // The window expires by it: an hour on, user a claims again.
    clock.advance(1_000);
    assert_eq!(app.check(body("a")).await.1["reason"], "user_1h");
    clock.advance(3_600_000);
    assert_eq!(app.check(body("a")).await.1["decision"], "allow");

    // The ledger's first sighting is on it too.
    let trust: serde_json::Value = app.get("/v1/trust/a").await.json().await.unwrap();
    assert_eq!(trust["first_seen"], "2031-03-01T12:00:00.000Z");
}
