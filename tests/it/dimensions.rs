//! `net`, `attr.NAME` and scene-wide budgets over HTTP, on both stores; unknown fields
//! and bad attributes are 400s naming the field.

use serde_json::{json, Value};
use vigia::config::StoreBackend;

use crate::common::app::{spawn_app_configured, TestApp};
use crate::common::redis_server::RedisServer;

const RULES: &str = r#"
[scene.drop]
on_store_error = "fail_close"
required = ["user", "ip", "attr.phone_range"]

[[scene.drop.limits]]
name = "net_1h"
dimensions = ["net"]
algorithm = "sliding_window"
window = "1h"
max = 2

[[scene.drop.limits]]
name = "range_1h"
dimensions = ["attr.phone_range"]
algorithm = "fixed_window"
window = "1h"
max = 3

[[scene.drop.limits]]
name = "scene_1h"
dimensions = []
algorithm = "sliding_window"
window = "1h"
max = 5

[attributes]
phone_range = { pattern = "^[0-9]{3,6}$" }
"#;

async fn app(backend: StoreBackend) -> TestApp {
    spawn_app_configured(RedisServer::start(), &[("drop.toml", RULES)], |c| {
        c.store.backend = backend
    })
    .await
}

fn claim(user: &str, ip: &str, range: &str) -> Value {
    json!({"scene": "drop", "user_id": user, "ip": ip, "attrs": {"phone_range": range}})
}

async fn decision(app: &TestApp, body: Value) -> (String, Option<String>, Value) {
    let (_, b) = app.check(body).await;
    (
        b["decision"].as_str().unwrap_or("?").to_string(),
        b["reason"].as_str().map(str::to_string),
        b,
    )
}

async fn nets_ranges_and_the_scene_budget_count(backend: StoreBackend) {
    let app = app(backend).await;
    let (d, _, first) = decision(&app, claim("u1", "203.0.113.1", "612")).await;
    assert_eq!(d, "allow");
    let keys: Vec<&str> = first["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "lt:drop:net:203.0.113.0%2F24",
            "lt:drop:fw:range_1h:at.phone_range:612",
            "lt:drop:all"
        ]
    );
    assert_eq!(
        decision(&app, claim("u2", "203.0.113.2", "612")).await.0,
        "allow"
    );
    // A third account from the same /24 (another address): the network's limit.
    let (d, r, _) = decision(&app, claim("u3", "203.0.113.3", "612")).await;
    assert_eq!(
        (d.as_str(), r.as_deref()),
        ("friendly_deny", Some("net_1h"))
    );
    // Another network, the same phone range: the range's third.
    assert_eq!(
        decision(&app, claim("u4", "198.51.100.1", "612")).await.0,
        "allow"
    );
    let (d, r, _) = decision(&app, claim("u5", "198.51.100.2", "612")).await;
    assert_eq!(
        (d.as_str(), r.as_deref()),
        ("friendly_deny", Some("range_1h"))
    );
    // Fresh network and range: only the scene's budget of 5 is left to count.
    assert_eq!(
        decision(&app, claim("u6", "192.0.2.1", "700")).await.0,
        "allow"
    );
    assert_eq!(
        decision(&app, claim("u7", "192.0.2.200", "701")).await.0,
        "allow"
    );
    let (d, r, _) = decision(&app, claim("u8", "100.64.0.1", "702")).await;
    assert_eq!(
        (d.as_str(), r.as_deref()),
        ("friendly_deny", Some("scene_1h"))
    );
}

async fn bad_attributes_and_unknown_fields_are_400s(backend: StoreBackend) {
    let app = app(backend).await;
    let cases = [
        (
            json!({"scene": "drop", "user_id": "u", "ip": "192.0.2.1"}),
            "missing_dimension",
            "attrs.phone_range",
        ),
        (
            claim("u", "192.0.2.1", "61a"),
            "invalid_field",
            "attrs.phone_range",
        ),
        (
            json!({"scene": "drop", "user_id": "u", "ip": "192.0.2.1", "attrs": {"phone_range": "612", "card": "x"}}),
            "invalid_field",
            "attrs.card",
        ),
        (
            json!({"scene": "drop", "user_id": "u", "ip": "192.0.2.1", "attrs": "612"}),
            "invalid_field",
            "attrs",
        ),
        (
            json!({"scene": "drop", "user_id": "u", "ip": "192.0.2.1", "attrs": {"phone_range": "612"}, "dryRun": true}),
            "invalid_field",
            "dryRun",
        ),
    ];
    for (body, code, field) in cases {
        let (status, b) = app.check(body.clone()).await;
        assert_eq!(status, 400, "{body}: {b}");
        assert_eq!(b["error"]["code"], code, "{body}: {b}");
        assert_eq!(b["error"]["field"], field, "{body}: {b}");
    }
    // None of them counted: the first valid claim is still the first in every window.
    let (_, _, b) = decision(&app, claim("u", "192.0.2.1", "612")).await;
    assert!(
        b["limits"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["count"] == 1),
        "{b}"
    );
}

#[actix_web::test]
async fn on_redis_nets_ranges_and_the_scene_budget_count() {
    nets_ranges_and_the_scene_budget_count(StoreBackend::Redis).await;
}

#[actix_web::test]
async fn on_embedded_nets_ranges_and_the_scene_budget_count() {
    nets_ranges_and_the_scene_budget_count(StoreBackend::Embedded).await;
}

#[actix_web::test]
async fn on_redis_bad_attributes_and_unknown_fields_are_400s() {
    bad_attributes_and_unknown_fields_are_400s(StoreBackend::Redis).await;
}

#[actix_web::test]
async fn on_embedded_bad_attributes_and_unknown_fields_are_400s() {
    bad_attributes_and_unknown_fields_are_400s(StoreBackend::Embedded).await;
}
