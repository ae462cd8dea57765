//! examples/client/claim.py, the backend client the README shows, run with `python3`
//! against a real service: what it prints for each answer is what a coupon backend does.
//! python3 is required: without it these tests fail, saying so.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::common::{
    free_port, limit, scene, spawn_app, spawn_app_configured, RedisServer, TestApp,
};

fn one_per_10s() -> String {
    scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        1,
        "business",
    ))
}

/// Runs the client's demo against `url` off the runtime (the service answers on it) and
/// returns its standard output, one entry per line; panics when it does not exit 0.
async fn run_client(url: String, args: &[&str]) -> Vec<String> {
    run_client_with(url, args, None).await
}

/// [`run_client`] with `admin_token` as `VIGIA_ADMIN_TOKEN` (and no token of the caller's).
async fn run_client_with(url: String, args: &[&str], admin_token: Option<&str>) -> Vec<String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/client/claim.py");
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let admin_token = admin_token.map(str::to_string);
    let out = actix_web::rt::task::spawn_blocking(move || {
        let mut cmd = Command::new("python3");
        cmd.arg(&script)
            .arg("--url")
            .arg(&url)
            .args(&args)
            .env_remove("VIGIA_CHECK_TOKEN")
            .env_remove("VIGIA_ADMIN_TOKEN");
        if let Some(token) = admin_token {
            cmd.env("VIGIA_ADMIN_TOKEN", token);
        }
        cmd.output()
    })
    .await
    .expect("the client's thread")
    .unwrap_or_else(|e| {
        panic!("python3 is needed to run examples/client/claim.py and could not be started: {e}")
    });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "claim.py exited {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    stdout.lines().map(str::to_owned).collect()
}

/// "denied: <message>, retry after N" -> N.
fn retry_after(line: &str, message: &str) -> u64 {
    let prefix = format!("denied: {message}, retry after ");
    line.strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{line:?} is not {prefix:?}N"))
        .parse()
        .unwrap_or_else(|e| panic!("{line:?}: retry after: {e}"))
}

#[actix_web::test]
async fn python_client_grants_then_shows_the_message_and_retry_after() {
    let app = spawn_app(&[("s.toml", &one_per_10s())]).await;
    let lines = run_client(
        app.base.clone(),
        &[
            "--scene",
            "s",
            "--user",
            "client-1",
            "--calls",
            "2",
            "--timeout",
            "5",
        ],
    )
    .await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0], "granted");
    let n = retry_after(&lines[1], "Agotado, vuelve mañana");
    assert!((1..=10).contains(&n), "retry after {n}");

    // Each demo call is a new action with its own idempotency key: a third one, still
    // within the 10 s, is denied too, and another user is not.
    let again = run_client(
        app.base.clone(),
        &[
            "--scene",
            "s",
            "--user",
            "client-1",
            "--calls",
            "1",
            "--timeout",
            "5",
        ],
    )
    .await;
    retry_after(&again[0], "Agotado, vuelve mañana");
    let other = run_client(
        app.base.clone(),
        &[
            "--scene",
            "s",
            "--user",
            "client-2",
            "--calls",
            "1",
            "--timeout",
            "5",
        ],
    )
    .await;
    assert_eq!(other, ["granted"]);
}

#[actix_web::test]
async fn python_client_says_try_again_when_the_store_or_vigia_is_down() {
    let mut app: TestApp = spawn_app(&[("s.toml", &one_per_10s())]).await;
    // fail_close with the store gone: 503, nothing granted, "try again" with Retry-After.
    app.redis.kill();
    let lines = run_client(
        app.base.clone(),
        &[
            "--scene",
            "s",
            "--user",
            "client-3",
            "--calls",
            "1",
            "--timeout",
            "5",
        ],
    )
    .await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("try again, retry after "),
        "a 503 must be 'try again' with its Retry-After: {lines:?}"
    );

    // Nobody listening: a coupon backend fails closed ("try again") by default and grants
    // only when told the action is cheap (--fail-open).
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let closed = run_client(
        nowhere.clone(),
        &["--scene", "s", "--calls", "1", "--timeout", "1"],
    )
    .await;
    assert_eq!(closed, ["try again"]);
    let open = run_client(
        nowhere,
        &[
            "--scene",
            "s",
            "--calls",
            "1",
            "--timeout",
            "1",
            "--fail-open",
        ],
    )
    .await;
    assert_eq!(open, ["granted"]);
}

#[actix_web::test]
async fn python_client_passes_a_challenge_reports_it_and_claims_again() {
    // Scene `c` challenges every fresh claim until the user's pass is reported
    // (tests/fixtures/ops/challenge.toml); reporting it takes the admin token.
    let app = spawn_app_configured(
        RedisServer::start(),
        &[
            ("s.toml", &one_per_10s()),
            ("c.toml", include_str!("../fixtures/ops/challenge.toml")),
        ],
        |c| c.auth.admin_token = "admin-t".into(),
    )
    .await;
    let args = [
        "--scene",
        "c",
        "--user",
        "client-9",
        "--device",
        "device-client-9",
        "--calls",
        "2",
        "--timeout",
        "5",
    ];
    let lines = run_client_with(app.base.clone(), &args, Some("admin-t")).await;
    assert_eq!(
        lines,
        [
            "challenged: captcha: Demuestra que eres tú",
            "verified: pass reported, claiming again",
            "granted",
            // The pass holds for the scene's pass_ttl: the next claim is not challenged.
            "granted",
        ]
    );
    // vigia took the pass for that user, scene and device, and decided as printed.
    let trust: Value = app
        .client
        .get(format!("{}/v1/trust/client-9", app.base))
        .bearer_auth("admin-t")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let awards = trust["awards"].as_array().expect("awards");
    assert!(
        awards
            .iter()
            .any(|a| a["type"] == "challenge_passed" && a["scene"] == "c"),
        "{trust}"
    );
    let metrics = app.get("/metrics").await.text().await.unwrap();
    for series in [
        r#"vigia_decisions_total{decision="challenge",layer="security",reason="score",scene="c"} 1"#,
        r#"vigia_decisions_total{decision="allow",layer="none",reason="none",scene="c"} 2"#,
        r#"vigia_challenge_passes_total{scene="c"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} not in:\n{metrics}");
    }

    // Without the admin token vigia refuses the pass: the client says so and stops, rather
    // than granting a claim vigia never allowed.
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/client/claim.py");
    let url = app.base.clone();
    let out = actix_web::rt::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(&script)
            .args(["--url", &url, "--scene", "c", "--user", "client-10"])
            .args([
                "--device",
                "device-client-10",
                "--calls",
                "1",
                "--timeout",
                "5",
            ])
            .env_remove("VIGIA_CHECK_TOKEN")
            .env_remove("VIGIA_ADMIN_TOKEN")
            .output()
    })
    .await
    .expect("the client's thread")
    .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(stdout, "challenged: captcha: Demuestra que eres tú\n");
    assert!(stderr.contains("401"), "{stderr}");
}
