//! The node and its surroundings: a second vigia on the same `data_dir` is told another
//! holds it, `/readyz` fails once `data_dir` is gone, and a node open to the network
//! without a check token says so at start. The first and last run the real binary.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use vigia::config::StoreBackend;

use crate::common::{body, free_port, limit, scene, spawn_app_configured, RedisServer};
use crate::durability::Vigia;

/// `vigia` from the repository root with the shipped config, on `listen` and `data`, its
/// log (stdout) and errors (stderr) piped.
fn spawn_vigia(listen: &str, data: &std::path::Path, env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_vigia"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("VIGIA_LISTEN", listen)
        .env("VIGIA_DATA_DIR", data)
        .env_remove("VIGIA_STORE")
        .env_remove("VIGIA_REDIS_URL")
        .env_remove("VIGIA_CHECK_TOKEN")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vigia")
}

/// Every line of `child`'s stdout, as it comes.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The lines up to and including the first that contains `until` (start-up is bounded:
/// 20 s).
fn read_until(lines: &mpsc::Receiver<String>, until: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(until);
                seen.push(line);
                if done {
                    return seen;
                }
            }
            Err(_) => panic!("no line with {until:?} within 20 s; saw {seen:#?}"),
        }
    }
}

/// sled's own words were "could not acquire lock" and an errno, naming a file inside the
/// folder; the operator must learn that another process holds `data_dir`.
#[tokio::test]
async fn a_second_vigia_on_the_same_data_dir_is_told_another_holds_it() {
    let data = tempfile::tempdir().expect("data dir");
    let _first = Vigia::start(free_port(), data.path(), None).await;
    let second = spawn_vigia(&format!("127.0.0.1:{}", free_port()), data.path(), &[]);
    let out = tokio::task::spawn_blocking(move || second.wait_with_output())
        .await
        .expect("join")
        .expect("the second vigia exits");
    assert!(!out.status.success(), "the second vigia must not serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is locked by another process")
            && stderr.contains("another vigia running on the same data_dir"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&data.path().display().to_string()),
        "names the folder: {stderr}"
    );
}

/// Listening on every address with an empty check token (the container image's
/// defaults) leaves `/v1/check` open to anyone who reaches the port: said at start, and
/// not said once a token is set.
#[tokio::test]
async fn a_node_open_to_the_network_without_a_check_token_warns_at_start() {
    let warning = "auth.check_token (VIGIA_CHECK_TOKEN) is empty";
    let data = tempfile::tempdir().expect("data dir");
    let mut open = spawn_vigia(&format!("0.0.0.0:{}", free_port()), data.path(), &[]);
    let lines = lines_of(&mut open);
    let seen = read_until(&lines, "vigia listening");
    let seen = if seen.iter().any(|l| l.contains(warning)) {
        seen
    } else {
        // The warning follows the listening line.
        read_until(&lines, warning)
    };
    let line = seen
        .iter()
        .find(|l| l.contains(warning))
        .expect("a warning");
    assert!(line.contains("WARN"), "{line}");
    open.kill().expect("kill");
    open.wait().expect("wait");

    let data = tempfile::tempdir().expect("data dir");
    let mut guarded = spawn_vigia(
        &format!("0.0.0.0:{}", free_port()),
        data.path(),
        &[("VIGIA_CHECK_TOKEN", "chk-token")],
    );
    let lines = lines_of(&mut guarded);
    read_until(&lines, "vigia listening");
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(guarded.id().to_string())
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    guarded.wait().expect("wait");
    let rest: Vec<String> = lines.iter().collect();
    assert!(
        !rest.iter().any(|l| l.contains(warning)),
        "no warning with a token: {rest:#?}"
    );
}

/// A deleted `data_dir` once left the node ready while its journals wrote into files
/// without a name, lost at the next restart.
#[actix_web::test]
async fn readyz_is_503_naming_the_folder_once_data_dir_is_gone() {
    let rules = scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        5,
        "business",
    ));
    let app = spawn_app_configured(RedisServer::start(), &[("s.toml", &rules)], |c| {
        c.store.backend = StoreBackend::Embedded;
    })
    .await;
    assert_eq!(app.check(body("u")).await.0, 200);
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200);

    std::fs::remove_dir_all(app.data_dir.path()).expect("remove data_dir");
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 503);
    let r: Value = ready.json().await.expect("JSON answer");
    assert_eq!(r["ready"], false, "{r}");
    let data = app.data_dir.path().display().to_string();
    let problems = r["problems"].as_array().expect("problems");
    assert!(
        problems
            .iter()
            .filter_map(Value::as_str)
            .any(|p| p.contains("data folder") && p.contains(&data)),
        "{r}"
    );
}
