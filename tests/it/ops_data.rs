//! `GET /v1/admin/ops`, the data of the ops page: totals that move with every check,
//! the sampled history, the rules and the store; and the page's admin auth (bearer, or
//! HTTP Basic with the admin token as the password, so a browser can prompt).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use vigia::clock::{Clock, SystemClock};

use crate::common::{limit, scene, spawn_app_configured, RedisServer, TestApp};

/// Scene `s` with one business limit on the ip: two checks a minute per address.
fn rules() -> String {
    scene(&limit(
        "per_ip",
        "\"ip\"",
        "fixed_window",
        "1m",
        2,
        "business",
    ))
}

/// A check from `user` behind the shared address 203.0.113.7 (a NAT).
fn behind_nat(user: &str) -> Value {
    json!({"scene": "s", "user_id": user, "device_id": format!("device-{user}-0001"), "ip": "203.0.113.7"})
}

/// The app with `sample_every_ms` between background samples.
async fn app(sample_every_ms: u64, admin_token: &str) -> TestApp {
    let token = admin_token.to_string();
    spawn_app_configured(RedisServer::start(), &[("s.toml", &rules())], move |c| {
        c.ops.sample_every_ms = sample_every_ms;
        c.auth.admin_token = token;
    })
    .await
}

async fn ops(app: &TestApp) -> Value {
    let resp = app.get("/v1/admin/ops").await;
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("JSON")
}

/// The sum of one count over every sample of the history.
fn sampled(view: &Value, pick: impl Fn(&Value) -> u64) -> u64 {
    view["history"]["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .map(|s| pick(&s["counts"]["scenes"]["s"]))
        .sum()
}

#[actix_web::test]
async fn totals_show_each_block_by_limit_and_dimension_and_samples_hold_the_deltas() {
    // A minute between background samples: only the samples this test takes exist.
    let app = app(60_000, "").await;
    let before = ops(&app).await;
    let s = &before["totals"]["scenes"]["s"];
    assert_eq!(s["limits"]["per_ip"], 0, "listed before it counts: {s}");
    assert_eq!(s["dimensions"]["ip"], 0, "{s}");
    assert_eq!(before["history"]["samples"], json!([]));
    assert_eq!(before["history"]["every_ms"], 60_000);
    assert_eq!(before["history"]["capacity"], 15, "15 minutes of samples");
    assert_eq!(before["store"]["kind"], "redis");
    assert_eq!(before["store"]["ready"], true);
    assert_eq!(before["store"]["breaker"], "closed");
    let rules: Value = app.get("/v1/rules").await.json().await.unwrap();
    assert_eq!(before["rules"]["version"], rules["version"]);
    assert_eq!(before["rules"]["last_error"], Value::Null);

    // Five users behind one address: two pass, three are blocked by the ip limit.
    for i in 0..5 {
        app.check(behind_nat(&format!("user-{i}"))).await;
    }
    let after = ops(&app).await;
    let s = &after["totals"]["scenes"]["s"];
    assert_eq!(
        s["decisions"],
        json!({"allow": 2, "challenge": 0, "friendly_deny": 3, "silent_deny": 0})
    );
    assert_eq!(s["limits"]["per_ip"], 3, "{s}");
    assert_eq!(s["dimensions"]["ip"], 3, "{s}");
    assert_eq!(s["degraded"], 0, "{s}");
    assert_eq!(s["challenge_passes"], 0, "{s}");

    app.state.ops.sample();
    app.check(behind_nat("user-5")).await;
    app.state.ops.sample();
    let view = ops(&app).await;
    let samples = view["history"]["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2, "{view}");
    let first = &samples[0]["counts"]["scenes"]["s"];
    let second = &samples[1]["counts"]["scenes"]["s"];
    assert_eq!(first["limits"]["per_ip"], 3, "{first}");
    assert_eq!(first["decisions"]["allow"], 2, "{first}");
    assert_eq!(second["limits"]["per_ip"], 1, "{second}");
    assert_eq!(second["dimensions"]["ip"], 1, "{second}");
    assert_eq!(second["decisions"]["allow"], 0, "{second}");
    assert!(samples[1]["at_ms"].as_u64() >= samples[0]["at_ms"].as_u64());
}

/// A `challenge_passed` event for `user`, reported now.
fn pass(event_id: &str, user: &str, device: Option<&str>, scene: Option<&str>) -> Value {
    let mut event = json!({"event_id": event_id, "type": "challenge_passed", "user_id": user,
        "occurred_at": vigia::clock::rfc3339(SystemClock.now_ms())});
    if let Some(device) = device {
        event["device_id"] = json!(device);
    }
    if let Some(scene) = scene {
        event["scene"] = json!(scene);
    }
    event
}

#[actix_web::test]
async fn challenges_issued_and_passes_reported_count_per_scene_for_its_pass_rate() {
    // Scene `c` challenges every fresh check (tests/fixtures/ops/challenge.toml).
    let app = spawn_app_configured(
        RedisServer::start(),
        &[
            ("s.toml", &rules()),
            ("c.toml", include_str!("../fixtures/ops/challenge.toml")),
        ],
        |c| c.ops.sample_every_ms = 60_000,
    )
    .await;
    let before = ops(&app).await;
    assert_eq!(
        before["rules"]["challenges"],
        json!({"c": {"kind": "captcha", "pass_ttl_ms": 1_800_000}}),
        "only the scene with a [challenge] is listed"
    );
    let c = &before["totals"]["scenes"]["c"];
    assert_eq!(c["decisions"]["challenge"], 0, "{c}");
    assert_eq!(c["challenge_passes"], 0, "{c}");

    // Ann's claim is challenged; she passes, and the same claim is allowed.
    let claim = json!({"scene": "c", "user_id": "ann", "device_id": "device-ann-0001", "ip": "198.51.100.4"});
    let (status, body) = app.check(claim.clone()).await;
    assert_eq!(
        (status, &body["decision"]),
        (403, &json!("challenge")),
        "{body}"
    );
    let reported = app
        .post(
            "/v1/events",
            &pass("pass-1", "ann", Some("device-ann-0001"), Some("c")),
        )
        .await;
    assert_eq!(reported.status(), 202);
    let (status, body) = app.check(claim).await;
    assert_eq!(
        (status, &body["decision"]),
        (200, &json!("allow")),
        "{body}"
    );
    // Bob is challenged and never passes; a pass naming no scene is reported for Cy.
    let (status, _) = app
        .check(json!({"scene": "c", "user_id": "bob", "device_id": "device-bob-0001", "ip": "198.51.100.5"}))
        .await;
    assert_eq!(status, 403);
    let unscoped = app
        .post("/v1/events", &pass("pass-2", "cy", None, None))
        .await;
    assert_eq!(unscoped.status(), 202);

    app.state.ops.sample();
    let after = ops(&app).await;
    let totals = &after["totals"];
    let c = &totals["scenes"]["c"];
    assert_eq!(
        c["decisions"],
        json!({"allow": 1, "challenge": 2, "friendly_deny": 0, "silent_deny": 0}),
        "a challenge is counted as one, not as a deny"
    );
    assert_eq!(c["challenge_passes"], 1, "{c}");
    assert_eq!(totals["scenes"]["s"]["challenge_passes"], 0, "{totals}");
    // The pass that named no scene is counted apart: in no scene's rate, and no "all" scene.
    assert_eq!(totals["challenge_passes_unscoped"], 1, "{totals}");
    let scenes: Vec<&String> = totals["scenes"].as_object().unwrap().keys().collect();
    assert_eq!(scenes, ["c", "s"]);
    // And the sample holds the same, for the page's last-15-minutes rate.
    let sample = &after["history"]["samples"][0]["counts"];
    assert_eq!(
        sample["scenes"]["c"]["decisions"]["challenge"], 2,
        "{sample}"
    );
    assert_eq!(sample["scenes"]["c"]["challenge_passes"], 1, "{sample}");
    assert_eq!(sample["challenge_passes_unscoped"], 1, "{sample}");
}

#[actix_web::test]
async fn the_background_sampler_fills_the_history_on_its_own() {
    let app = app(100, "").await;
    for i in 0..4 {
        app.check(behind_nat(&format!("user-{i}"))).await;
    }
    // Each sample holds its interval's deltas: summed, they are the totals.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = ops(&app).await;
        let blocked = sampled(&view, |s| s["limits"]["per_ip"].as_u64().unwrap_or(0));
        let allowed = sampled(&view, |s| s["decisions"]["allow"].as_u64().unwrap_or(0));
        if blocked == 2 && allowed == 2 {
            break;
        }
        assert!(
            blocked <= 2 && allowed <= 2,
            "samples count more than happened: {view}"
        );
        assert!(
            Instant::now() < deadline,
            "no sample holds the checks after 30 s: {view}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix_web::test]
async fn a_failed_reload_shows_its_file_line_and_message() {
    let app = app(60_000, "").await;
    std::fs::write(
        app.rules_path().join("broken.toml"),
        include_str!("../fixtures/ops/broken.toml"),
    )
    .unwrap();
    let r = app
        .client
        .post(format!("{}/v1/admin/reload", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let view = ops(&app).await;
    let e = &view["rules"]["last_error"];
    assert!(e["file"].as_str().unwrap().ends_with("broken.toml"), "{e}");
    assert!(e["line"].as_u64().unwrap() > 0, "{e}");
    assert!(e["message"].as_str().unwrap().contains("leaky"), "{e}");
    assert!(
        view["totals"]["rule_reloads"]["error"].as_u64().unwrap() >= 1,
        "{view}"
    );
}

#[actix_web::test]
async fn the_page_and_its_data_take_the_admin_token_as_bearer_or_basic_password() {
    let app = app(60_000, "s3cret").await;
    for path in ["/ops", "/v1/admin/ops"] {
        let url = format!("{}{path}", app.base);
        let none = app.client.get(&url).send().await.unwrap();
        assert_eq!(none.status(), 401, "{path}");
        assert_eq!(
            none.headers()["www-authenticate"],
            r#"Basic realm="vigia ops""#,
            "{path}: a browser must be asked for credentials"
        );
        let wrong = app
            .client
            .get(&url)
            .basic_auth("ops", Some("s3cre7"))
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401, "{path}");
        let wrong_bearer = app.client.get(&url).bearer_auth("nope").send().await;
        assert_eq!(wrong_bearer.unwrap().status(), 401, "{path}");

        let bearer = app.client.get(&url).bearer_auth("s3cret").send().await;
        assert_eq!(bearer.unwrap().status(), 200, "{path}");
        let basic = app
            .client
            .get(&url)
            .basic_auth("anyone", Some("s3cret"))
            .send()
            .await
            .unwrap();
        assert_eq!(basic.status(), 200, "{path}");
        if path == "/ops" {
            assert!(basic.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html"));
            let csp = basic.headers()["content-security-policy"].to_str().unwrap();
            assert!(csp.contains("default-src 'none'"), "{csp}");
            let html = basic.text().await.unwrap();
            assert!(html.contains("/v1/admin/ops"), "the page polls its data");
            for external in [
                "src=\"http",
                "href=\"http",
                "src=\"//",
                "href=\"//",
                "url(http",
                "@import",
            ] {
                assert!(!html.contains(external), "an external asset: {external}");
            }
        }
    }
}
