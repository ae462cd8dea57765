//! `GET /ops` in a real browser: headless Chromium (Debian's `chromium`) opens the page
//! over the DevTools protocol; the page must load without a console error or an uncaught
//! exception, show a scene's numbers move after checks, show a challenge issued and its
//! reported pass with the scene's pass rate, and show a failed reload's file and message. A screenshot is left in the target's tmp folder (`ops-page.png`).

use std::time::Duration;

use serde_json::{json, Value};

use vigia::clock::{Clock, SystemClock};

use crate::common::chromium::Chromium;
use crate::common::{limit, scene, spawn_app_configured, RedisServer};

/// How long the page may take to show what it should before the test fails.
const WITHIN: Duration = Duration::from_secs(30);

/// Runs `step` on the browser off the test's runtime (the service's Redis connection is
/// driven by that runtime: blocking it would stall the service the page is polling).
async fn on<T: Send + 'static>(
    mut browser: Chromium,
    step: impl FnOnce(&mut Chromium) -> T + Send + 'static,
) -> (Chromium, T) {
    tokio::task::spawn_blocking(move || {
        let out = step(&mut browser);
        (browser, out)
    })
    .await
    .expect("browser step")
}

/// A JavaScript expression: the text of `selector` in scene `s`'s card, or null.
fn in_scene(selector: &str) -> String {
    in_card("s", selector)
}

/// A JavaScript expression: the text of `selector` in scene `scene`'s card, or null.
fn in_card(scene: &str, selector: &str) -> String {
    format!(
        r#"(() => {{ const e = document.querySelector('[data-scene="{scene}"] {selector}'); return e ? e.textContent : null; }})()"#
    )
}

/// A JavaScript expression: the text of scene `c`'s challenge figure `field` (issued,
/// passed, rate) in the row of `window` (now, 15m, total).
fn challenge_figure(window: &str, field: &str) -> String {
    in_card(
        "c",
        &format!(r#"[data-challenge] tr[data-window="{window}"] [data-field="{field}"]"#),
    )
}

#[actix_web::test]
async fn the_ops_page_shows_checks_blocks_and_a_failed_reload_live() {
    let rules = scene(&limit(
        "per_ip",
        "\"ip\"",
        "fixed_window",
        "1m",
        2,
        "business",
    ));
    // Loopback and no admin token: the page needs no credentials. Scene `c` challenges
    // every fresh check (tests/fixtures/ops/challenge.toml).
    let app = spawn_app_configured(
        RedisServer::start(),
        &[
            ("s.toml", &rules),
            ("c.toml", include_str!("../fixtures/ops/challenge.toml")),
        ],
        |c| {
            c.ops.sample_every_ms = 100;
        },
    )
    .await;
    let url = format!("{}/ops", app.base);

    let browser = tokio::task::spawn_blocking(Chromium::launch)
        .await
        .expect("chromium starts");
    let (browser, first) = on(browser, move |b| {
        b.navigate(&url);
        b.wait_for(
            &in_scene(r#"[data-field="checks"]"#),
            WITHIN,
            "scene s on the page",
        )
    })
    .await;
    assert_eq!(first, "0", "no check yet");

    // Five users behind one address: two pass, the ip limit blocks three.
    for i in 0..5 {
        app.check(json!({"scene": "s", "user_id": format!("user-{i}"), "device_id": format!("device-{i}-0001"), "ip": "203.0.113.7"}))
            .await;
    }
    let (browser, shown) = on(browser, |b| {
        b.wait_for(
            &format!(
                "{} === '5' && {}",
                in_scene(r#"[data-field="checks"]"#),
                in_scene(r#"tr[data-key="ip"] [data-field="total"]"#)
            ),
            WITHIN,
            "the scene's checks and its ip blocks move",
        );
        [
            b.eval(&in_scene(r#"tr[data-kind="allow"] [data-field="total"]"#)),
            b.eval(&in_scene(
                r#"tr[data-kind="friendly_deny"] [data-field="total"]"#,
            )),
            b.eval(&in_scene(r#"tr[data-key="ip"] [data-field="total"]"#)),
            b.eval(&in_scene(r#"tr[data-key="per_ip"] [data-field="total"]"#)),
        ]
    })
    .await;
    assert_eq!(shown, [json!("2"), json!("3"), json!("3"), json!("3")]);

    // Scene `c` can challenge: its pass rate is shown from the start, with nothing yet.
    let (browser, empty) = on(browser, |b| {
        b.wait_for(
            &challenge_figure("total", "issued"),
            WITHIN,
            "scene c's challenge figures",
        );
        [
            b.eval(&challenge_figure("total", "issued")),
            b.eval(&challenge_figure("total", "passed")),
            b.eval(&challenge_figure("total", "rate")),
        ]
    })
    .await;
    assert_eq!(empty, [json!("0"), json!("0"), json!("—")]);

    // Ann's claim is challenged: one issued, none passed yet.
    let claim = json!({"scene": "c", "user_id": "ann", "device_id": "device-ann-0001", "ip": "198.51.100.4"});
    let (status, body) = app.check(claim.clone()).await;
    assert_eq!(
        (status, &body["decision"]),
        (403, &json!("challenge")),
        "{body}"
    );
    let (browser, issued) = on(browser, |b| {
        b.wait_for(
            &format!("{} === '1'", challenge_figure("total", "issued")),
            WITHIN,
            "the challenge issued",
        );
        [
            b.eval(&challenge_figure("total", "passed")),
            b.eval(&challenge_figure("total", "rate")),
            b.eval(&in_card(
                "c",
                r#"tr[data-kind="challenge"] [data-field="total"]"#,
            )),
            b.eval(&in_card("c", r#"[data-field="deny_share"]"#)),
            b.eval(&in_card("c", r#"[data-field="challenge_share"]"#)),
        ]
    })
    .await;
    assert_eq!(
        issued,
        [
            json!("0"),
            json!("0.0 %"),
            json!("1"),
            json!("0.0 %"),
            json!("100.0 %")
        ],
        "a challenge is its own decision, not a block"
    );

    // The backend reports her pass, and her claim sent again is allowed.
    let reported = app
        .post(
            "/v1/events",
            &json!({"event_id": "pass-ann-1", "type": "challenge_passed", "user_id": "ann",
                    "device_id": "device-ann-0001", "scene": "c",
                    "occurred_at": vigia::clock::rfc3339(SystemClock.now_ms())}),
        )
        .await;
    assert_eq!(reported.status(), 202);
    let (status, body) = app.check(claim).await;
    assert_eq!(
        (status, &body["decision"]),
        (200, &json!("allow")),
        "{body}"
    );
    let (browser, (passed, colours)) = on(browser, |b| {
        // Since start, and over the last 15 minutes once the sampler has taken them.
        b.wait_for(
            &format!(
                "{} === '1' && {} === '1' && {} === '1'",
                challenge_figure("total", "passed"),
                challenge_figure("15m", "issued"),
                challenge_figure("15m", "passed"),
            ),
            WITHIN,
            "the reported pass",
        );
        let passed = [
            b.eval(&challenge_figure("total", "rate")),
            b.eval(&challenge_figure("15m", "rate")),
            b.eval(&in_card("c", r#"[data-field="challenge_share"]"#)),
        ];
        // Each decision has a legend entry of its own colour.
        let colours = b.eval(
            r#"Object.fromEntries([...document.querySelectorAll('[data-scene="c"] [data-legend]')].map((e) => [e.dataset.legend, getComputedStyle(e.querySelector('i')).backgroundColor]))"#,
        );
        (passed, colours)
    })
    .await;
    assert_eq!(
        passed,
        [json!("100.0 %"), json!("100.0 %"), json!("50.0 %")]
    );
    let colours = colours.as_object().expect("legend colours");
    let challenge = colours
        .get("challenge")
        .expect("a legend entry for challenge");
    for (kind, colour) in colours {
        if kind != "challenge" {
            assert_ne!(colour, challenge, "challenge is drawn as {kind} is");
        }
    }

    // A broken rule file: the reload fails, the page names the file and the message.
    std::fs::write(
        app.rules_path().join("broken.toml"),
        include_str!("../fixtures/ops/broken.toml"),
    )
    .unwrap();
    let reload = app
        .client
        .post(format!("{}/v1/admin/reload", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 422);
    let info: Value = app.get("/v1/rules").await.json().await.unwrap();
    let error = info["last_error"].clone();
    assert!(
        error["file"].as_str().unwrap().ends_with("broken.toml"),
        "{info}"
    );
    let (mut browser, (file, message, shown)) = on(browser, |b| {
        b.wait_for(
            r#"document.getElementById('rules-error').classList.contains('shown')"#,
            WITHIN,
            "the reload error box",
        );
        let text = |b: &mut Chromium, f: &str| {
            b.eval(&format!(
                r#"document.querySelector('#rules-error [data-field="{f}"]').textContent"#
            ))
        };
        let shown = b
            .eval(r#"getComputedStyle(document.getElementById('rules-error')).display !== 'none'"#);
        (text(b, "file"), text(b, "message"), shown)
    })
    .await;
    assert_eq!(file, error["file"]);
    assert_eq!(message, error["message"]);
    assert_eq!(shown, true, "the error box is visible");

    let png = browser.screenshot();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ops-page.png");
    std::fs::write(&path, &png).unwrap();
    let written = std::fs::read(&path).unwrap();
    assert!(
        written.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is a PNG",
        path.display()
    );
    assert!(written.len() > 10_000, "a real page, not a blank image");

    let errors = browser.errors();
    assert!(
        errors.is_empty(),
        "the page logged errors or threw: {errors:#?}"
    );
}
