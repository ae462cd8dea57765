//! `/openapi.json` as a client generator reads it: who needs which token, what each status
//! carries, and request bodies narrowed to the rule set in force. (That every route is
//! documented and answers its 405 is in `ops` and `http_errors`; the full conformance run
//! against a live service is `scripts/api-conformance.sh`.)

use serde_json::{json, Value};
use vigia::clock::{Clock, SystemClock};

use crate::common::{body, limit, scene, spawn_app_configured, RedisServer, TestApp};

const ATTRS: &str = r#"
[attributes]
phone_range = { pattern = "^[0-9]{3,8}$" }

[scene.by_phone]
on_store_error = "fail_open"
required = ["ip", "attr.phone_range"]

[[scene.by_phone.limits]]
name = "phone_1m"
dimensions = ["attr.phone_range"]
algorithm = "fixed_window"
window = "1m"
max = 5
layer = "business"
"#;

async fn app() -> TestApp {
    app_with(("phone.toml", ATTRS)).await
}

/// Both tokens set, over scene `s` (one user limit) and the rule file `other`.
async fn app_with(other: (&str, &str)) -> TestApp {
    let rules = scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        1,
        "business",
    ));
    spawn_app_configured(RedisServer::start(), &[("s.toml", &rules), other], |c| {
        c.auth.check_token = "check-t".into();
        c.auth.admin_token = "admin-t".into();
    })
    .await
}

async fn document(app: &TestApp) -> Value {
    app.get("/openapi.json").await.json().await.unwrap()
}

/// The component a `$ref` names.
fn resolve<'d>(doc: &'d Value, schema: &'d Value) -> &'d Value {
    match schema["$ref"].as_str() {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{r} resolves")),
        None => schema,
    }
}

#[actix_web::test]
async fn each_operation_names_the_token_it_needs_and_the_service_enforces_it() {
    let app = app().await;
    let doc = document(&app).await;
    for scheme in ["check_token", "admin_token"] {
        let s = &doc["components"]["securitySchemes"][scheme];
        assert_eq!(
            (s["type"].as_str(), s["scheme"].as_str()),
            (Some("http"), Some("bearer")),
            "{scheme}"
        );
    }
    let basic = &doc["components"]["securitySchemes"]["admin_basic"];
    assert_eq!(
        (basic["type"].as_str(), basic["scheme"].as_str()),
        (Some("http"), Some("basic"))
    );
    let needs = |method: &str, path: &str| -> Option<String> {
        doc["paths"][path][method]["security"][0]
            .as_object()
            .and_then(|s| s.keys().next().cloned())
    };
    for (method, path) in vigia::http::ROUTES {
        let expected = match *path {
            "/v1/check" => Some("check_token"),
            "/v1/refund"
            | "/v1/events"
            | "/v1/trust/{user_id}"
            | "/v1/admin/reload"
            | "/ops"
            | "/v1/admin/ops" => Some("admin_token"),
            _ => None,
        };
        assert_eq!(needs(method, path).as_deref(), expected, "{method} {path}");
        // What a browser opens also takes the admin token as a Basic password, and its
        // 401 asks the browser for it.
        let browser = matches!(*path, "/ops" | "/v1/admin/ops");
        let alternative = doc["paths"][path][method]["security"][1]
            .as_object()
            .and_then(|s| s.keys().next().cloned());
        assert_eq!(
            alternative.as_deref(),
            browser.then_some("admin_basic"),
            "{method} {path}"
        );
        if expected.is_none() {
            continue;
        }
        // Documented 401, with the challenge the service sends.
        let documented = &doc["paths"][path][method]["responses"]["401"];
        assert_eq!(
            documented["headers"]["WWW-Authenticate"]["required"], true,
            "{path}"
        );
        let url = format!("{}{}", app.base, path.replace("{user_id}", "u1"));
        let wrong = if expected == Some("check_token") {
            "admin-t"
        } else {
            "check-t"
        };
        let req = match *method {
            "get" => app.client.get(&url),
            _ => app.client.post(&url).json(&body("u1")),
        };
        let resp = req.bearer_auth(wrong).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{method} {path} with the other token");
        let challenge = if browser {
            "Basic realm=\"vigia ops\""
        } else {
            "Bearer"
        };
        assert_eq!(resp.headers()["www-authenticate"], challenge, "{path}");
    }
}

#[actix_web::test]
async fn a_documented_429_carries_every_header_the_document_promises() {
    let app = app().await;
    let doc = document(&app).await;
    let documented = &doc["paths"]["/v1/check"]["post"]["responses"]["429"]["headers"];
    let promised: Vec<&String> = documented.as_object().unwrap().keys().collect();
    assert_eq!(promised, ["RateLimit", "RateLimit-Policy", "Retry-After"]);
    let check = || {
        app.client
            .post(format!("{}/v1/check", app.base))
            .bearer_auth("check-t")
            .json(&body("u1"))
            .send()
    };
    assert_eq!(check().await.unwrap().status(), 200);
    let denied = check().await.unwrap();
    assert_eq!(denied.status(), 429);
    for header in promised {
        assert_eq!(documented[header]["required"], true, "{header}");
        assert!(
            denied.headers().contains_key(header.as_str()),
            "{header} missing"
        );
    }
    let retry: u64 = denied.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    // 503s (fail_close, store errors) promise Retry-After too.
    let unavailable = &doc["paths"]["/v1/check"]["post"]["responses"]["503"]["headers"];
    assert_eq!(unavailable["Retry-After"]["required"], true);
}

#[actix_web::test]
async fn every_json_body_documents_400_413_and_415() {
    let app = app().await;
    let doc = document(&app).await;
    for path in ["/v1/check", "/v1/refund", "/v1/events"] {
        let op = &doc["paths"][path]["post"];
        assert!(
            op["requestBody"]["content"]["application/json"].is_object(),
            "{path}"
        );
        for status in ["400", "413", "415"] {
            let r = &op["responses"][status];
            assert!(
                r["description"].as_str().is_some_and(|d| !d.is_empty()),
                "{path} {status}"
            );
            let schema = resolve(&doc, &r["content"]["application/json"]["schema"]);
            assert!(schema["properties"]["error"].is_object(), "{path} {status}");
        }
        let token = if path == "/v1/check" {
            "check-t"
        } else {
            "admin-t"
        };
        let resp = app
            .client
            .post(format!("{}{path}", app.base))
            .bearer_auth(token)
            .header("content-type", "text/plain")
            .body(body("u1").to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 415, "{path}");
    }
    // The codes a client may meet are an enum, and include what the service just sent.
    let codes = &doc["components"]["schemas"]["ErrorCode"]["enum"];
    assert!(
        codes
            .as_array()
            .unwrap()
            .contains(&json!("unsupported_media_type")),
        "{codes}"
    );
}

#[actix_web::test]
async fn the_check_body_names_the_scenes_and_dimensions_of_the_rules_in_force() {
    let app = app().await;
    let doc = document(&app).await;
    let body_schema =
        &doc["paths"]["/v1/check"]["post"]["requestBody"]["content"]["application/json"]["schema"];
    let variants = resolve(&doc, body_schema)["oneOf"].as_array().unwrap();
    let by_scene = |name: &str| {
        variants
            .iter()
            .find(|v| v["properties"]["scene"]["enum"] == json!([name]))
            .unwrap_or_else(|| panic!("a variant for {name}"))
    };
    assert_eq!(variants.len(), 2);
    let s = by_scene("s");
    let required: Vec<&str> = s["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(required, ["device_id", "ip", "scene", "user_id"]);
    // A misspelt field is refused, so the document says no field beyond those named.
    assert_eq!(s["additionalProperties"], false);
    let phone = by_scene("by_phone");
    let attrs = &phone["properties"]["attrs"];
    assert_eq!(attrs["required"], json!(["phone_range"]));
    assert_eq!(attrs["additionalProperties"], false);
    assert_eq!(
        attrs["properties"]["phone_range"]["pattern"],
        "^[0-9]{3,8}$"
    );

    // And the service agrees: the documented shape passes, a missing attribute is refused.
    let check = |b: Value| {
        app.client
            .post(format!("{}/v1/check", app.base))
            .bearer_auth("check-t")
            .json(&b)
            .send()
    };
    let ok = json!({"scene": "by_phone", "ip": "192.0.2.1", "attrs": {"phone_range": "600123"}});
    assert_eq!(check(ok).await.unwrap().status(), 200);
    let missing = json!({"scene": "by_phone", "ip": "192.0.2.1"});
    assert_eq!(check(missing).await.unwrap().status(), 400);
}

#[actix_web::test]
async fn the_events_body_is_one_event_or_a_batch() {
    let app = app().await;
    let doc = document(&app).await;
    let schema =
        &doc["paths"]["/v1/events"]["post"]["requestBody"]["content"]["application/json"]["schema"];
    let forms: Vec<&str> = resolve(&doc, schema)["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["$ref"].as_str())
        .collect();
    assert_eq!(
        forms,
        [
            "#/components/schemas/EventBody",
            "#/components/schemas/EventBatch"
        ]
    );
    let batch = &doc["components"]["schemas"]["EventBatch"]["properties"]["events"];
    assert_eq!(
        (batch["minItems"].as_u64(), batch["maxItems"].as_u64()),
        (Some(1), Some(1000))
    );
    let types = &doc["components"]["schemas"]["EventType"]["enum"];
    assert_eq!(
        *types,
        json!([
            "payment_succeeded",
            "identity_verified",
            "challenge_passed",
            "benefit_rolled_back"
        ])
    );
}

#[actix_web::test]
async fn a_refund_body_requires_every_dimension_its_scene_requires() {
    // Scene `c` requires user, device and ip and has no limit: a refund is still refused
    // without one of them (the request's record is found through them).
    let app = challenge_app().await;
    let doc = document(&app).await;
    let schema =
        &doc["paths"]["/v1/refund"]["post"]["requestBody"]["content"]["application/json"]["schema"];
    let variants = resolve(&doc, schema)["oneOf"].as_array().unwrap();
    let c = variants
        .iter()
        .find(|v| v["properties"]["scene"]["enum"] == json!(["c"]))
        .expect("a variant for c");
    assert_eq!(
        required(c),
        ["device_id", "ip", "request_id", "scene", "user_id"]
    );
    let resp = app
        .client
        .post(format!("{}/v1/refund", app.base))
        .bearer_auth("admin-t")
        .json(&json!({"scene": "c", "request_id": "r1", "user_id": "ann", "ip": "192.0.2.1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["field"], "device_id", "{e}");
}

/// `app()`'s tokens over scene `s` and scene `c`, whose every fresh check is challenged
/// (tests/fixtures/ops/challenge.toml).
async fn challenge_app() -> TestApp {
    app_with(("c.toml", include_str!("../fixtures/ops/challenge.toml"))).await
}

/// The names in a schema's `required`, sorted.
fn required(schema: &Value) -> Vec<&str> {
    let mut names: Vec<&str> = schema["required"]
        .as_array()
        .unwrap_or_else(|| panic!("no required in {schema}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    names.sort_unstable();
    names
}

#[actix_web::test]
async fn a_challenge_is_a_documented_403_with_the_body_the_service_sends() {
    let app = challenge_app().await;
    let doc = document(&app).await;
    let forbidden = &doc["paths"]["/v1/check"]["post"]["responses"]["403"];
    let description = forbidden["description"].as_str().unwrap_or_default();
    assert!(
        description.contains("challenge_passed") && description.contains("idempotency_key"),
        "the 403 tells the backend what to do: {description}"
    );
    let body_schema = resolve(&doc, &forbidden["content"]["application/json"]["schema"]);
    let verdicts = &resolve(&doc, &body_schema["properties"]["decision"])["enum"];
    assert!(
        verdicts.as_array().unwrap().contains(&json!("challenge")),
        "{verdicts}"
    );
    assert!(required(body_schema).contains(&"challenge"));
    // `challenge` is what to ask, or null for every other decision.
    let alternatives = body_schema["properties"]["challenge"]["oneOf"]
        .as_array()
        .expect("challenge: one of two");
    assert!(
        alternatives.contains(&json!({"type": "null"})),
        "{alternatives:?}"
    );
    let ask = alternatives
        .iter()
        .map(|a| resolve(&doc, a))
        .find(|a| a["type"] == "object")
        .expect("an object alternative");
    assert_eq!(required(ask), ["kind", "message"]);

    // What the service answers a challenged check is that documented body.
    let resp = app
        .client
        .post(format!("{}/v1/check", app.base))
        .bearer_auth("check-t")
        .json(&json!({"scene": "c", "user_id": "ann", "device_id": "device-ann-0001", "ip": "192.0.2.1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let answer: Value = resp.json().await.unwrap();
    for field in required(body_schema) {
        assert!(answer.get(field).is_some(), "{field} missing: {answer}");
    }
    assert_eq!(answer["decision"], "challenge");
    assert_eq!(answer["layer"], "security");
    assert_eq!(answer["reason"], "score");
    assert_eq!(answer["message"], "Demuestra que eres tú");
    assert_eq!(
        answer["challenge"],
        json!({"kind": "captcha", "message": "Demuestra que eres tú"})
    );
}

#[actix_web::test]
async fn the_challenge_passed_event_is_documented_narrowed_to_the_rules_and_taken() {
    let app = challenge_app().await;
    let doc = document(&app).await;
    let forms: Vec<&str> = doc["components"]["schemas"]["EventBody"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["$ref"].as_str())
        .collect();
    assert!(
        forms.contains(&"#/components/schemas/PassEvent"),
        "{forms:?}"
    );
    let pass = &doc["components"]["schemas"]["PassEvent"];
    let props = &pass["properties"];
    assert_eq!(props["type"]["enum"], json!(["challenge_passed"]));
    assert_eq!(
        required(pass),
        ["event_id", "occurred_at", "type", "user_id"]
    );
    // Only a scene that can challenge may be named (or none: every such scene).
    assert_eq!(
        props["scene"]["oneOf"],
        json!([{"type": "null"}, {"type": "string", "enum": ["c"]}])
    );
    // The device id must match the rules' pattern (the service refuses a pass otherwise).
    let device = props["device_id"]["oneOf"].as_array().unwrap();
    assert!(
        device
            .iter()
            .any(|d| d["pattern"] == "^[A-Za-z0-9_-]{8,64}$"),
        "{device:?}"
    );
    assert!(
        props["events"]["not"].is_object(),
        "a single event has no `events`"
    );

    let event = |scene: &str| {
        json!({"event_id": format!("pass-{scene}"), "type": "challenge_passed", "user_id": "ann",
               "device_id": "device-ann-0001", "scene": scene,
               "occurred_at": vigia::clock::rfc3339(SystemClock.now_ms())})
    };
    let report = |event: Value| {
        app.client
            .post(format!("{}/v1/events", app.base))
            .bearer_auth("admin-t")
            .json(&event)
            .send()
    };
    // The documented shape is taken, and lifts the challenge.
    assert_eq!(report(event("c")).await.unwrap().status(), 202);
    let resp = app
        .client
        .post(format!("{}/v1/check", app.base))
        .bearer_auth("check-t")
        .json(&json!({"scene": "c", "user_id": "ann", "device_id": "device-ann-0001", "ip": "192.0.2.1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // A scene the document leaves out (it never challenges) is refused, naming the field.
    let refused = report(event("s")).await.unwrap();
    assert_eq!(refused.status(), 400);
    let e: Value = refused.json().await.unwrap();
    assert_eq!(e["error"]["field"], "scene", "{e}");
}

#[actix_web::test]
async fn the_trust_path_takes_ids_of_1_to_128_characters() {
    let app = app().await;
    let doc = document(&app).await;
    let param = &doc["paths"]["/v1/trust/{user_id}"]["get"]["parameters"][0]["schema"];
    assert_eq!(
        (param["minLength"].as_u64(), param["maxLength"].as_u64()),
        (Some(1), Some(128))
    );
    let trust = |user: String| {
        app.client
            .get(format!("{}/v1/trust/{user}", app.base))
            .bearer_auth("admin-t")
            .send()
    };
    // 128 two-byte characters, percent-encoded on the wire.
    let resp = trust("%C3%BC".repeat(128)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let t: Value = resp.json().await.unwrap();
    assert_eq!(t["user_id"], "ü".repeat(128));
    let resp = trust("%C3%BC".repeat(129)).await.unwrap();
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["field"], "user_id");
}
