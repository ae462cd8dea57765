//! Bodies that say two things, or something the API does not know, are refused whole: a key
//! named twice in one object is a 400 `invalid_json` naming it on every body (serde_json
//! would keep the last, so `"dry_run": true, …, "dry_run": false` was counted), and a field
//! an event's type does not carry is a 400 naming it, as an unknown field of a check is.

use serde_json::{json, Value};

use crate::common::{body, limit, scene, spawn_app, TestApp};

const TRUST: &str = r#"
[trust]
payment_succeeded = { points = 1, ttl = "30d" }
max_points = 3
bonus_per_point = 1
"#;

async fn app() -> TestApp {
    let rules = scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        5,
        "business",
    ));
    spawn_app(&[("s.toml", &rules), ("trust.toml", TRUST)]).await
}

/// POSTs `text` as JSON, as a client would send it: (status, answer).
async fn post_text(app: &TestApp, path: &str, text: &str) -> (u16, Value) {
    let resp = app
        .client
        .post(format!("{}{path}", app.base))
        .header("content-type", "application/json")
        .body(text.to_string())
        .send()
        .await
        .expect("request reaches vigia");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON answer"))
}

fn assert_names_twice(status: u16, answer: &Value, key: &str) {
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_json", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&format!("{key:?} appears twice")),
        "{answer}"
    );
}

#[actix_web::test]
async fn a_check_naming_a_key_twice_is_refused_and_counts_nothing() {
    let app = app().await;
    let text = r#"{"scene":"s","dry_run":true,"user_id":"u","device_id":"device-0001","ip":"192.0.2.10","dry_run":false}"#;
    let (status, answer) = post_text(&app, "/v1/check", text).await;
    assert_names_twice(status, &answer, "dry_run");
    assert!(
        app.keys("lt:*").is_empty(),
        "nothing counted: {:?}",
        app.keys("*")
    );
    let text =
        r#"{"scene":"s","user_id":"u","user_id":"v","device_id":"device-0001","ip":"192.0.2.10"}"#;
    let (status, answer) = post_text(&app, "/v1/check", text).await;
    assert_names_twice(status, &answer, "user_id");
    // The same body once each is a check.
    assert_eq!(app.check(body("u")).await.0, 200);
}

#[actix_web::test]
async fn a_refund_or_an_event_naming_a_key_twice_is_refused() {
    let app = app().await;
    let text = r#"{"scene":"s","request_id":"r1","user_id":"u","device_id":"device-0001","ip":"192.0.2.10","ip":"192.0.2.11"}"#;
    let (status, answer) = post_text(&app, "/v1/refund", text).await;
    assert_names_twice(status, &answer, "ip");

    let text = r#"{"events":[{"event_id":"e1","type":"payment_succeeded","user_id":"u","user_id":"v","occurred_at":"2026-01-02T03:04:05Z"}]}"#;
    let (status, answer) = post_text(&app, "/v1/events", text).await;
    assert_names_twice(status, &answer, "user_id");
    let trust: Value = app.get("/v1/trust/u").await.json().await.expect("trust");
    assert_eq!(trust["points"], 0, "nothing taken: {trust}");
}

#[actix_web::test]
async fn an_event_with_a_field_its_type_does_not_carry_is_refused_naming_it() {
    let app = app().await;
    let pay = |id: &str| {
        json!({"event_id": id, "type": "payment_succeeded", "user_id": "u",
               "occurred_at": "2026-01-02T03:04:05Z"})
    };
    let mut extra = pay("e2");
    extra["amount"] = json!(12);
    let resp = app
        .post("/v1/events", &json!({"events": [pay("e1"), extra]}))
        .await;
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.expect("JSON answer");
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        (&answer["error"]["code"], &answer["error"]["field"]),
        (&json!("invalid_field"), &json!("events[1].amount")),
        "{answer}"
    );
    // A misspelt device on a pass would have lifted the challenge on every device.
    let pass = json!({"event_id": "p1", "type": "challenge_passed", "user_id": "u",
                      "devce_id": "device-0001", "occurred_at": "2026-01-02T03:04:05Z"});
    let resp = app.post("/v1/events", &pass).await;
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.expect("JSON answer");
    assert_eq!(
        (status, &answer["error"]["field"]),
        (400, &json!("devce_id")),
        "{answer}"
    );
    let trust: Value = app.get("/v1/trust/u").await.json().await.expect("trust");
    assert_eq!(trust["points"], 0, "the batch was refused whole: {trust}");
    // The events alone are taken.
    let resp = app
        .post("/v1/events", &json!({"events": [pay("e1")]}))
        .await;
    assert_eq!(resp.status(), 202);
}
