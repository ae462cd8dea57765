//! `spawn_app`: the real service on a free port, over its own redis-server and its own
//! rule files in a temporary folder.

use std::path::PathBuf;
use std::sync::Arc;

use reqwest::{Client, Response};
use serde_json::Value;
use vigia::clock::{Clock, SystemClock};
use vigia::config::{Config, StoreBackend};

use super::redis_server::RedisServer;

/// A running vigia with everything it owns.
pub struct TestApp {
    pub base: String,
    pub redis: RedisServer,
    pub client: Client,
    pub rules_dir: tempfile::TempDir,
    pub data_dir: tempfile::TempDir,
    pub handle: actix_web::dev::ServerHandle,
    /// The service's own state, for what HTTP does not show (the events backlog).
    pub state: actix_web::web::Data<vigia::http::AppState>,
    /// The behaviour actors (to stall them).
    pub behaviours: vigia::behaviour::Behaviours,
}

impl TestApp {
    /// POSTs JSON to `path`.
    pub async fn post(&self, path: &str, body: &Value) -> Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("request reaches vigia")
    }

    /// POSTs a check and returns (status, body).
    pub async fn check(&self, body: Value) -> (u16, Value) {
        let resp = self.post("/v1/check", &body).await;
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("JSON answer"))
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("request reaches vigia")
    }

    /// Keys in this test's Redis matching a glob.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut self.redis.conn())
            .expect("KEYS");
        keys.sort();
        keys
    }

    pub fn rules_path(&self) -> PathBuf {
        self.rules_dir.path().to_path_buf()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // Stop accepting; the runtime of the test ends the workers.
        drop(self.handle.stop(false));
    }
}

/// Starts vigia over a fresh Redis with these rule files (name, contents).
pub async fn spawn_app(rule_files: &[(&str, &str)]) -> TestApp {
    let redis = RedisServer::start();
    spawn_app_with(redis, rule_files).await
}

/// Starts vigia over a given Redis.
pub async fn spawn_app_with(redis: RedisServer, rule_files: &[(&str, &str)]) -> TestApp {
    spawn_app_configured(redis, rule_files, |_| {}).await
}

/// Starts vigia over a given Redis, with a last say on the config.
pub async fn spawn_app_configured(
    redis: RedisServer,
    rule_files: &[(&str, &str)],
    configure: impl FnOnce(&mut Config),
) -> TestApp {
    spawn_app_on_clock(redis, rule_files, configure, Arc::new(SystemClock)).await
}

/// [`spawn_app_configured`] with every part of the service on `clock`.
pub async fn spawn_app_on_clock(
    redis: RedisServer,
    rule_files: &[(&str, &str)],
    configure: impl FnOnce(&mut Config),
    clock: Arc<dyn Clock>,
) -> TestApp {
    let rules_dir = tempfile::tempdir().expect("rules dir");
    for (name, text) in rule_files {
        std::fs::write(rules_dir.path().join(name), text).expect("write rule file");
    }
    let data_dir = tempfile::tempdir().expect("data dir");
    let mut config = Config {
        listen: "127.0.0.1:0".into(),
        rules_dir: rules_dir.path().to_path_buf(),
        data_dir: data_dir.path().to_path_buf(),
        ..Config::default()
    };
    config.store.backend = StoreBackend::Redis;
    config.store.redis_url = redis.url();
    config.store.timeout_ms = 200;
    // Signals must arrive for the scoring tests to mean anything: a debug build on two
    // shared cores can miss a few-ms deadline (a missed one is the scene's policy, tested
    // with stalled shards in signals_shared).
    config.behaviour.deadline_ms = 1_000;
    config.behaviour.shards = 4;
    configure(&mut config);
    let running = vigia::app::start(&config, Some(2), clock)
        .await
        .unwrap_or_else(|e| panic!("vigia starts: {e}"));
    let handle = running.handle.clone();
    let state = running.state.clone();
    let behaviours = running.behaviours.clone();
    actix_web::rt::spawn(running.server);
    TestApp {
        base: format!("http://{}", running.addr),
        redis,
        client: Client::new(),
        rules_dir,
        data_dir,
        handle,
        state,
        behaviours,
    }
}

/// A rule file with one scene `s` over user, device and ip, and the given limits
/// (TOML `[[scene.s.limits]]` blocks), failing closed.
pub fn scene(limits: &str) -> String {
    format!(
        r#"
[scene.s]
on_store_error = "fail_close"
deny_message = "Agotado, vuelve mañana"
required = ["user", "device", "ip"]
{limits}

[validation]
device_id = {{ pattern = "^[A-Za-z0-9_-]{{8,64}}$" }}
"#
    )
}

/// One `[[scene.s.limits]]` block.
pub fn limit(
    name: &str,
    dims: &str,
    algorithm: &str,
    window: &str,
    max: u64,
    layer: &str,
) -> String {
    format!(
        r#"
[[scene.s.limits]]
name = "{name}"
dimensions = [{dims}]
algorithm = "{algorithm}"
window = "{window}"
max = {max}
layer = "{layer}"
"#
    )
}

/// A check body for scene `s`.
pub fn body(user: &str) -> Value {
    serde_json::json!({
        "scene": "s",
        "user_id": user,
        "device_id": "device-0001",
        "ip": "192.0.2.10",
    })
}
