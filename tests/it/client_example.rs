//! examples/client/claim.py, the backend client the README shows, run with `python3`
//! against a real service: what it prints for each answer is what a coupon backend does.
//! python3 is required: without it these tests fail, saying so.

use std::path::PathBuf;
use std::process::Command;

use crate::common::{free_port, limit, scene, spawn_app, TestApp};

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
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/client/claim.py");
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = actix_web::rt::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(&script)
            .arg("--url")
            .arg(&url)
            .args(&args)
            .env_remove("VIGIA_CHECK_TOKEN")
            .output()
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
