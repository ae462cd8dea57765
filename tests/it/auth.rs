//! Tokens over HTTP: a forged refund is the abuser's first move.

use serde_json::json;

use crate::common::{body, limit, scene, spawn_app, spawn_app_configured, RedisServer, TestApp};

fn rules() -> String {
    scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        1,
        "business",
    ))
}

async fn with_tokens(admin: &str, check: &str) -> TestApp {
    let (admin, check) = (admin.to_string(), check.to_string());
    spawn_app_configured(RedisServer::start(), &[("s.toml", &rules())], move |c| {
        c.auth.admin_token = admin;
        c.auth.check_token = check;
    })
    .await
}

async fn status_with(app: &TestApp, path: &str, token: Option<&str>, b: serde_json::Value) -> u16 {
    let mut req = app.client.post(format!("{}{path}", app.base)).json(&b);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap().status().as_u16()
}

#[actix_web::test]
async fn a_check_token_when_set_is_required() {
    let app = with_tokens("", "check-secret").await;
    assert_eq!(status_with(&app, "/v1/check", None, body("u")).await, 401);
    assert_eq!(
        status_with(&app, "/v1/check", Some("check-secre"), body("u")).await,
        401
    );
    assert!(app.keys("*").is_empty(), "an unauthorised check counted");
    assert_eq!(
        status_with(&app, "/v1/check", Some("check-secret"), body("u")).await,
        200
    );
    let resp = app.post("/v1/check", &body("u")).await;
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    let e: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "unauthorized");
}

#[actix_web::test]
async fn a_forged_refund_gives_nothing_back() {
    let app = with_tokens("admin-secret", "").await;
    let mut b = body("u");
    b["request_id"] = json!("r1");
    assert_eq!(app.check(b).await.0, 200);
    assert_eq!(app.check(body("u")).await.0, 429);
    // A refund names the check's dimension values, as the check did.
    let mut refund = body("u");
    refund["request_id"] = json!("r1");
    // Even from loopback: once a token is set, only the token counts.
    assert_eq!(
        status_with(&app, "/v1/refund", None, refund.clone()).await,
        401
    );
    assert_eq!(
        status_with(&app, "/v1/refund", Some("check-secret"), refund.clone()).await,
        401
    );
    assert_eq!(
        app.check(body("u")).await.0,
        429,
        "the quota came back without a token"
    );
    assert_eq!(
        status_with(&app, "/v1/refund", Some("admin-secret"), refund).await,
        200
    );
    assert_eq!(app.check(body("u")).await.0, 200);
}

#[actix_web::test]
async fn without_tokens_checks_are_open_and_refunds_take_loopback() {
    let app = spawn_app(&[("s.toml", &rules())]).await;
    assert_eq!(status_with(&app, "/v1/check", None, body("u")).await, 200);
    let mut refund = body("u");
    refund["request_id"] = json!("nope");
    assert_eq!(status_with(&app, "/v1/refund", None, refund).await, 200);
}
