//! `/openapi.json` as a client generator reads it: who needs which token, what each status
//! carries, and request bodies narrowed to the rule set in force. (That every route is
//! documented and answers its 405 is in `ops` and `http_errors`; the full conformance run
//! against a live service is `scripts/api-conformance.sh`.)

use serde_json::{json, Value};

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
    let rules = scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        1,
        "business",
    ));
    spawn_app_configured(
        RedisServer::start(),
        &[("s.toml", &rules), ("phone.toml", ATTRS)],
        |c| {
            c.auth.check_token = "check-t".into();
            c.auth.admin_token = "admin-t".into();
        },
    )
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
            "benefit_rolled_back"
        ])
    );
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
