//! Operations endpoints, the OpenAPI document, and the command line.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use crate::common::{body, limit, scene, spawn_app, RedisServer};

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

#[actix_web::test]
async fn health_rules_and_metrics() {
    let app = spawn_app(&[("s.toml", &rules())]).await;
    assert_eq!(app.get("/healthz").await.status(), 200);
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200);
    let r: Value = app.get("/v1/rules").await.json().await.unwrap();
    assert_eq!(r["scenes"], serde_json::json!(["s"]));
    assert_eq!(r["last_error"], Value::Null);
    assert_eq!(r["version"].as_str().unwrap().len(), 64);

    app.check(body("u")).await;
    app.check(body("u")).await;
    let text = app.get("/metrics").await.text().await.unwrap();
    assert!(
        text.contains(
            r#"vigia_decisions_total{decision="allow",layer="none",reason="none",scene="s"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"vigia_decisions_total{decision="friendly_deny",layer="business",reason="user_10s",scene="s"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"vigia_blocks_total{dimension="user",limit="user_10s",scene="s"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"vigia_check_duration_seconds_count{scene="s"} 2"#),
        "{text}"
    );
}

#[actix_web::test]
async fn openapi_documents_exactly_the_routes() {
    let app = spawn_app(&[("s.toml", &rules())]).await;
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let routes: BTreeSet<(String, String)> = vigia::http::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, routes);
    // And each documented route is served (not the 404 fallback).
    for (method, path) in &routes {
        let url = format!("{}{path}", app.base);
        let resp = match method.as_str() {
            "get" => app.client.get(url).send().await.unwrap(),
            _ => app
                .client
                .post(url)
                .json(&serde_json::json!({}))
                .send()
                .await
                .unwrap(),
        };
        assert_ne!(resp.status(), 404, "{method} {path}");
    }
}

fn vigia() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vigia"))
}

#[test]
fn rules_check_accepts_the_shipped_rules() {
    let out = vigia()
        .args([
            "rules",
            "check",
            concat!(env!("CARGO_MANIFEST_DIR"), "/rules"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn rules_check_prints_file_line_message_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.toml"),
        "[scene.a]\non_store_error = \"fail_close\"\n\n[[scene.a.limits]]\nname = \"x\"\ndimensions = [\"user\"]\nalgorithm = \"leaky\"\nwindow = \"1s\"\nmax = 1\n",
    )
    .unwrap();
    let out = vigia()
        .args(["rules", "check"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let file = dir.path().join("a.toml").display().to_string();
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with(&format!("{file}:7: "))),
        "{stdout}"
    );
}

#[test]
fn a_bad_config_at_start_up_is_one_clear_message_and_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\n[store]\nbackend = \"redis\"\ntimeout_ms = \"fast\"\n",
    )
    .unwrap();
    let out = vigia().arg("--config").arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:4:", config.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_rules_at_start_up_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(
        rules.join("x.toml"),
        "[scene.x]\non_store_error = \"sometimes\"\n",
    )
    .unwrap();
    let config = dir.path().join("config.toml");
    let redis = RedisServer::start();
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nrules_dir = \"{}\"\n[store]\nbackend = \"redis\"\nredis_url = \"{}\"\n",
            rules.display(),
            redis.url()
        ),
    )
    .unwrap();
    let out = vigia().arg("--config").arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("x.toml:2:"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn keys_sweep_from_the_command_line() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    for i in 0..1200 {
        let _: () = redis::cmd("SET")
            .arg(format!("lt:s:uid:{i}"))
            .arg(1)
            .query(&mut conn)
            .unwrap();
    }
    let _: () = redis::cmd("SET")
        .arg("keep:me")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    let out = vigia()
        .args([
            "keys",
            "sweep",
            "--redis",
            &redis.url(),
            "--prefix",
            "lt",
            "--dry-run",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("would remove 1200"), "{stdout}");
    let n: u64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert_eq!(n, 1201);
    let out = vigia()
        .args(["keys", "sweep", "--redis", &redis.url(), "--prefix", "lt"])
        .args(["--batch", "100"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Not a terminal: no line per batch (12 of them here), one summary line at the end.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    // SCAN may return a key twice while Redis shrinks its table: `scanned` is not asserted.
    assert!(
        stdout.starts_with("done: keys under lt: scanned "),
        "{stdout}"
    );
    assert!(stdout.contains(", removed 1200 in "), "{stdout}");
    assert_eq!(stderr, "", "per-batch lines without a terminal");
    let n: u64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
    assert_eq!(n, 1);
    assert_eq!(redis.command_calls().get("keys"), None);
}

/// `vigia` with no `VIGIA_*` variable from the caller's environment.
fn vigia_clean_env() -> Command {
    let mut cmd = vigia();
    for (var, ..) in vigia::config::ENV {
        cmd.env_remove(var);
    }
    cmd
}

#[test]
fn a_bad_environment_variable_stops_the_start_naming_it() {
    let out = vigia_clean_env()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("VIGIA_STORE", "foo")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("VIGIA_STORE"), "{stderr}");
    assert!(stderr.contains("\"foo\""), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn relative_paths_in_a_config_file_are_taken_from_its_folder() {
    // The config and its rules in conf/; vigia started from the folder above it.
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(conf.join("rules")).unwrap();
    std::fs::write(
        conf.join("rules").join("x.toml"),
        "[scene.x]\non_store_error = \"sometimes\"\n",
    )
    .unwrap();
    std::fs::write(
        conf.join("config.toml"),
        "listen = \"127.0.0.1:0\"\nrules_dir = \"rules\"\ndata_dir = \"data\"\n",
    )
    .unwrap();
    let out = vigia_clean_env()
        .current_dir(dir.path())
        .args(["serve", "--config", "conf/config.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The rules read were conf/rules, not ./rules (which does not exist).
    assert!(stderr.contains("x.toml:2:"), "{stderr}");
    assert!(
        !dir.path().join("data").exists(),
        "data_dir taken from the cwd"
    );
}

/// Every answer is counted by route and status, the ones that never reach a decision too.
#[actix_web::test]
async fn every_http_answer_is_counted_by_route_and_status() {
    let app = spawn_app(&[("s.toml", &rules())]).await;
    app.check(body("u")).await;
    let bad = app
        .post("/v1/check", &serde_json::json!({"scene": "s"}))
        .await;
    assert_eq!(bad.status(), 400);
    assert_eq!(app.get("/v1/check").await.status(), 405);
    assert_eq!(app.get("/nowhere").await.status(), 404);
    assert_eq!(app.get("/v1/trust/u").await.status(), 200);
    let text = app.get("/metrics").await.text().await.unwrap();
    for series in [
        r#"vigia_http_responses_total{route="/v1/check",status="200"} 1"#,
        r#"vigia_http_responses_total{route="/v1/check",status="400"} 1"#,
        r#"vigia_http_responses_total{route="/v1/check",status="405"} 1"#,
        r#"vigia_http_responses_total{route="unmatched",status="404"} 1"#,
        r#"vigia_http_responses_total{route="/v1/trust/{user_id}",status="200"} 1"#,
    ] {
        assert!(text.contains(series), "{series} not in:\n{text}");
    }
}

/// The start-up log says what this process serves from: its address, the store and where
/// it is, and the rules version.
#[test]
fn the_start_up_log_names_the_store_and_the_rules_version() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let data = tempfile::tempdir().expect("data dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigia"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("VIGIA_LISTEN", "127.0.0.1:0")
        .env("VIGIA_DATA_DIR", data.path())
        .env_remove("VIGIA_STORE")
        .env_remove("VIGIA_REDIS_URL")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn vigia");
    let stdout = child.stdout.take().expect("stdout");
    // Ends when the line is found, or when the process exits (its stdout closes).
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("vigia listening"));
    let _ = child.kill();
    let _ = child.wait();
    let line = line.expect("a 'vigia listening' line on stdout");
    let log: Value = serde_json::from_str(&line).expect("a JSON log line");
    let fields = &log["fields"];
    assert_eq!(fields["store"], "embedded", "{line}");
    assert_eq!(
        fields["store_at"],
        data.path().display().to_string(),
        "{line}"
    );
    assert_eq!(
        fields["rules_version"].as_str().map(str::len),
        Some(64),
        "{line}"
    );
    assert!(
        fields["addr"]
            .as_str()
            .is_some_and(|a| a.starts_with("127.0.0.1:")),
        "{line}"
    );
}
