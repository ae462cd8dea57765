//! Bad input: every case of API.md's error table, with the field named, and hostile ids.

use serde_json::{json, Value};

use crate::common::{body, limit, scene, spawn_app, TestApp};

async fn rules_app() -> TestApp {
    let rules = scene(&format!(
        "{}{}",
        limit(
            "user_10s",
            "\"user\"",
            "sliding_window",
            "10s",
            3,
            "business"
        ),
        limit("ip_1m", "\"ip\"", "fixed_window", "1m", 100, "business"),
    ));
    spawn_app(&[("s.toml", &rules)]).await
}

async fn error_of(app: &TestApp, b: Value) -> (u16, String, Value) {
    let resp = app.post("/v1/check", &b).await;
    let status = resp.status().as_u16();
    let e: Value = resp.json().await.unwrap();
    (
        status,
        e["error"]["code"].as_str().unwrap_or("").to_string(),
        e["error"]["field"].clone(),
    )
}

#[actix_web::test]
async fn each_error_names_its_code_and_field() {
    let app = rules_app().await;
    let with = |k: &str, v: Value| {
        let mut b = body("u");
        b[k] = v;
        b
    };
    let without = |k: &str| {
        let mut b = body("u");
        b.as_object_mut().unwrap().remove(k);
        b
    };
    let cases: Vec<(Value, &str, Value)> = vec![
        (json!([1, 2]), "invalid_json", json!(null)),
        (
            with("scene", json!("nope")),
            "unknown_scene",
            json!("scene"),
        ),
        (without("scene"), "invalid_field", json!("scene")),
        (without("user_id"), "missing_dimension", json!("user_id")),
        (
            without("device_id"),
            "missing_dimension",
            json!("device_id"),
        ),
        (without("ip"), "missing_dimension", json!("ip")),
        (with("ip", json!("999.1.1.1")), "invalid_field", json!("ip")),
        (with("ip", json!(42)), "invalid_field", json!("ip")),
        // Exactly the address, as the document's ipv4/ipv6 formats say.
        (
            with("ip", json!(" 192.0.2.10")),
            "invalid_field",
            json!("ip"),
        ),
        (
            with("request_id", json!("has space")),
            "invalid_field",
            json!("request_id"),
        ),
        (
            with("request_id", json!("x".repeat(65))),
            "invalid_field",
            json!("request_id"),
        ),
        (
            with("user_id", json!("")),
            "invalid_field",
            json!("user_id"),
        ),
        (
            with("user_id", json!({"a": 1})),
            "invalid_field",
            json!("user_id"),
        ),
        (
            with("user_id", json!("u".repeat(10_000))),
            "invalid_field",
            json!("user_id"),
        ),
        (
            with("dry_run", json!("yes")),
            "invalid_field",
            json!("dry_run"),
        ),
        (
            with("user_created_at", json!("yesterday")),
            "invalid_field",
            json!("user_created_at"),
        ),
        // RFC 3339's date-time (the document's format) has a T between date and time.
        (
            with("user_created_at", json!("2026-01-02 03:04:05Z")),
            "invalid_field",
            json!("user_created_at"),
        ),
        (
            with("idempotency_key", json!("k".repeat(200))),
            "invalid_field",
            json!("idempotency_key"),
        ),
    ];
    for (b, code, field) in cases {
        let (status, got_code, got_field) = error_of(&app, b.clone()).await;
        assert_eq!(
            (status, got_code.as_str(), &got_field),
            (400, code, &field),
            "for {b}"
        );
    }
    assert!(app.keys("*").is_empty(), "no bad request may create a key");
}

#[actix_web::test]
async fn malformed_json_is_invalid_json() {
    let app = rules_app().await;
    let resp = app
        .client
        .post(format!("{}/v1/check", app.base))
        .header("content-type", "application/json")
        .body("{\"scene\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "invalid_json");
}

#[actix_web::test]
async fn bodies_over_64_kib_get_413_and_wrong_types_415() {
    let app = rules_app().await;
    let mut b = body("u");
    b["padding"] = json!("p".repeat(64 * 1024));
    let resp = app.post("/v1/check", &b).await;
    assert_eq!(resp.status(), 413);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "payload_too_large");

    // Just under the limit is read (an absurd device id is a silent deny, a 200).
    let mut b = body("u");
    b["device_id"] = json!("");
    let base = serde_json::to_string(&b).unwrap().len();
    b["device_id"] = json!("p".repeat(64 * 1024 - base));
    assert_eq!(serde_json::to_string(&b).unwrap().len(), 64 * 1024);
    assert_eq!(app.post("/v1/check", &b).await.status(), 200);

    let resp = app
        .client
        .post(format!("{}/v1/check", app.base))
        .header("content-type", "text/plain")
        .body(serde_json::to_string(&body("u")).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "unsupported_media_type");
}

#[actix_web::test]
async fn hostile_ids_never_forge_or_escape_a_key() {
    let app = rules_app().await;
    let hostile = [
        "10086:aid:x",
        "*",
        "{lt}",
        "a b",
        "line\nbreak",
        "%3A",
        ":",
        "lt:s:uid:victim",
        "\u{0}nul",
        "ü✓",
    ];
    for h in hostile {
        let (status, b) = app.check(body(h)).await;
        assert_eq!(status, 200, "{h:?}: {b}");
        assert_eq!(
            b["limits"][0]["count"], 1,
            "{h:?} shares a key with another id"
        );
    }
    // The victim's own window is untouched by the id that names its key.
    let (_, b) = app.check(body("victim")).await;
    assert_eq!(b["limits"][0]["count"], 1);
    let keys = app.keys("*");
    let user_keys: Vec<&String> = keys.iter().filter(|k| k.starts_with("lt:s:uid:")).collect();
    assert_eq!(user_keys.len(), hostile.len() + 1, "{keys:?}");
    for k in &keys {
        assert!(k.starts_with("lt:s:"), "{k} escaped the prefix");
        let tail = &k["lt:s:".len()..];
        assert!(
            tail.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._@-%:".contains(&b)),
            "{k:?} holds a raw hostile byte"
        );
        assert_eq!(
            tail.split(':').count() % 2,
            0,
            "{k} has an odd segment count"
        );
    }
    assert_eq!(app.get("/healthz").await.status(), 200);
}

#[actix_web::test]
async fn numeric_ids_are_accepted_as_their_decimal_text() {
    let app = rules_app().await;
    let mut b = body("x");
    b["user_id"] = json!(10086);
    let (status, r) = app.check(b).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["limits"][0]["key"], "lt:s:uid:10086");
}

#[actix_web::test]
async fn unknown_routes_answer_a_json_404() {
    let app = rules_app().await;
    let resp = app.get("/v1/nope").await;
    assert_eq!(resp.status(), 404);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "not_found");
}

#[actix_web::test]
async fn a_wrong_method_on_a_route_is_405_naming_the_allowed_one() {
    let app = rules_app().await;
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    for (method, route) in vigia::http::ROUTES {
        // Documented: the 405 and its Allow header.
        let documented = &doc["paths"][route][method]["responses"]["405"];
        assert!(
            documented["headers"]["Allow"].is_object(),
            "{method} {route}"
        );
        let path = route.replace("{user_id}", "u1");
        let url = format!("{}{path}", app.base);
        let allowed = method.to_uppercase();
        for wrong in ["GET", "POST", "PUT", "DELETE"] {
            if wrong == allowed {
                continue;
            }
            let resp = app
                .client
                .request(wrong.parse().unwrap(), &url)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 405, "{wrong} {path}");
            assert_eq!(resp.headers()["allow"], allowed.as_str(), "{wrong} {path}");
            let e: Value = resp.json().await.unwrap();
            assert_eq!(e["error"]["code"], "method_not_allowed", "{wrong} {path}");
        }
    }
    // A path that is no route stays a 404, whatever the method.
    let resp = app.post("/v1/nope", &json!({})).await;
    assert_eq!(resp.status(), 404);
    // And the right method still reaches the route.
    assert_eq!(app.check(body("u")).await.0, 200);
}

/// POSTs a check written as raw JSON text (numbers exactly as a client wrote them).
async fn check_text(app: &TestApp, text: &str) -> (u16, Value) {
    let resp = app
        .client
        .post(format!("{}/v1/check", app.base))
        .header("content-type", "application/json")
        .body(text.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

#[actix_web::test]
async fn an_integral_number_is_the_same_id_however_it_is_written() {
    let app = rules_app().await;
    let with_user = |user: &str| {
        format!(
            r#"{{"scene": "s", "user_id": {user}, "device_id": "device-0001", "ip": "192.0.2.10"}}"#
        )
    };
    // JSON has one number type: 10086.0 and 1.0086e4 are the integer 10086, the same user.
    for (n, user) in [("10086", 1), ("10086.0", 2), ("1.0086e4", 3)] {
        let (status, r) = check_text(&app, &with_user(n)).await;
        assert_eq!(status, 200, "{n}: {r}");
        assert_eq!(r["limits"][0]["key"], "lt:s:uid:10086", "{n}");
        assert_eq!(r["limits"][0]["count"], user, "{n}");
    }
    // Read exactly, however many digits (2^51 - 1 is where an inexact parser slips).
    let (status, r) = check_text(&app, &with_user("2251799813685247.0")).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["limits"][0]["key"], "lt:s:uid:2251799813685247");
    // A fraction, or an integer past i64/u64 (which a float would round into range), is
    // no id.
    for n in ["10086.5", "-9223372036854775809", "18446744073709551616"] {
        let (status, r) = check_text(&app, &with_user(n)).await;
        assert_eq!(
            (status, r["error"]["field"].as_str()),
            (400, Some("user_id")),
            "{n}: {r}"
        );
    }
    let (status, r) = check_text(&app, &with_user("18446744073709551615")).await;
    assert_eq!(status, 200, "{r}");
}

#[actix_web::test]
async fn ids_are_bounded_in_characters_as_the_api_document_says() {
    let app = rules_app().await;
    // 128 two-byte characters: 256 bytes, within the documented maxLength of 128.
    let (status, r) = app.check(body(&"ü".repeat(128))).await;
    assert_eq!(status, 200, "{r}");
    let (status, r) = app.check(body(&"ü".repeat(129))).await;
    assert_eq!(
        (status, r["error"]["field"].as_str()),
        (400, Some("user_id")),
        "{r}"
    );
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    let id = &doc["components"]["schemas"]["Id"]["oneOf"][0];
    assert_eq!(id["maxLength"], 128, "{id}");
}
