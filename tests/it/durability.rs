//! The real binary on the embedded store: it serves with no Redis at all, and its windows
//! survive a clean stop (SIGTERM) and a crash (SIGKILL) followed by a restart.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vigia::store::embedded::FLUSH_EVERY_MS;

use crate::common::free_port;

/// The real binary as a child process (also used by `events`).
pub(crate) struct Vigia {
    child: Child,
    pub(crate) base: String,
}

impl Vigia {
    /// Starts `vigia` from the repository root with the shipped config.toml, overriding
    /// only the address and the data folder (and the rules folder when given).
    pub(crate) async fn start(port: u16, data: &Path, rules: Option<&Path>) -> Vigia {
        Self::start_with_env(port, data, rules, &[]).await
    }

    /// The same, with extra environment (e.g. `VIGIA_STORE`, `VIGIA_REDIS_URL`).
    pub(crate) async fn start_with_env(
        port: u16,
        data: &Path,
        rules: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Vigia {
        Self::start_with_args(port, data, rules, env, &[]).await
    }

    /// The same, with command-line arguments (e.g. `serve --config FILE`).
    pub(crate) async fn start_with_args(
        port: u16,
        data: &Path,
        rules: Option<&Path>,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Vigia {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigia"));
        cmd.args(args);
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("VIGIA_LISTEN", format!("127.0.0.1:{port}"))
            .env("VIGIA_DATA_DIR", data)
            .env_remove("VIGIA_STORE")
            .env_remove("VIGIA_REDIS_URL")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(r) = rules {
            cmd.env("VIGIA_RULES_DIR", r);
        }
        cmd.envs(env.iter().copied());
        let child = cmd.spawn().expect("spawn vigia");
        let v = Vigia {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        // Start-up is bounded: a service that is not up in 20 s has failed.
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = reqwest::Client::new();
        loop {
            if let Ok(r) = client.get(format!("{}/readyz", v.base)).send().await {
                assert_eq!(r.status(), 200);
                return v;
            }
            assert!(Instant::now() < deadline, "vigia did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn check(&self, body: &Value) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/check", self.base))
            .json(body)
            .send()
            .await
            .expect("check");
        (r.status().as_u16(), r.json().await.expect("json"))
    }

    /// The child's process id (to send it signals).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn sigterm(mut self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let exit = self.child.wait().expect("wait");
        assert!(exit.success(), "vigia exited {exit:?} on SIGTERM");
    }

    pub(crate) fn sigkill(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("wait");
    }
}

impl Drop for Vigia {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A claim by a long-standing user (the shipped rules halve a new account's quota).
fn claim(user: &str) -> Value {
    json!({"scene": "coupon_claim", "user_id": user, "device_id": "device-0001",
           "ip": "203.0.113.7", "user_created_at": "2020-01-01T00:00:00Z"})
}

fn rules_with(limit_window: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.toml"),
        format!(
            r#"
[scene.s]
on_store_error = "fail_close"
required = ["user", "ip"]
[[scene.s.limits]]
name = "user_day"
dimensions = ["user"]
algorithm = "sliding_window"
window = "{limit_window}"
max = 3
[[scene.s.limits]]
name = "ip_hour"
dimensions = ["ip"]
algorithm = "fixed_window"
window = "1h"
max = 100
[[scene.s.limits]]
name = "user_bucket"
dimensions = ["user"]
algorithm = "token_bucket"
window = "1d"
max = 3
"#
        ),
    )
    .unwrap();
    dir
}

fn s(user: &str) -> Value {
    json!({"scene": "s", "user_id": user, "ip": "198.51.100.1"})
}

#[tokio::test]
async fn the_shipped_config_serves_checks_with_no_redis() {
    let data = tempfile::tempdir().unwrap();
    let v = Vigia::start(free_port(), data.path(), None).await;
    let (status, b) = v.check(&claim("10086")).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["decision"], "allow");
    assert_eq!(b["degraded"], false);
    assert_eq!(b["limits"][0]["key"], "lt:coupon_claim:uid:10086");
    let (status, b) = v.check(&claim("10086")).await;
    assert_eq!((status, b["reason"].as_str()), (429, Some("user_10s")));
    let ready: Value = reqwest::get(format!("{}/readyz", v.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["store"], "embedded");
}

#[tokio::test]
async fn sigterm_then_restart_keeps_every_window() {
    let data = tempfile::tempdir().unwrap();
    let rules = rules_with("1d");
    let port = free_port();
    let v = Vigia::start(port, data.path(), Some(rules.path())).await;
    assert_eq!(v.check(&s("u")).await.0, 200);
    assert_eq!(v.check(&s("u")).await.0, 200);
    // Stopped right after the answers, well inside the journal's write interval.
    v.sigterm();
    let v = Vigia::start(port, data.path(), Some(rules.path())).await;
    let (status, b) = v.check(&s("u")).await;
    assert_eq!(status, 200, "{b}");
    let counts: Vec<u64> = (0..3)
        .map(|i| b["limits"][i]["count"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [3, 3, 3], "{b}");
    assert_eq!(v.check(&s("u")).await.0, 429);
}

#[tokio::test]
async fn a_crash_loses_at_most_the_last_flush_interval() {
    let data = tempfile::tempdir().unwrap();
    let rules = rules_with("1d");
    let port = free_port();
    let v = Vigia::start(port, data.path(), Some(rules.path())).await;
    assert_eq!(v.check(&s("u")).await.0, 200);
    assert_eq!(v.check(&s("u")).await.0, 200);
    // Past the documented bound (the journal syncs every FLUSH_EVERY_MS), then kill -9.
    tokio::time::sleep(Duration::from_millis(3 * FLUSH_EVERY_MS)).await;
    v.sigkill();
    let v = Vigia::start(port, data.path(), Some(rules.path())).await;
    let (status, b) = v.check(&s("u")).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["limits"][0]["count"], 3, "{b}");
    assert_eq!(b["limits"][1]["count"], 3, "{b}");
    assert_eq!(v.check(&s("u")).await.0, 429);
}

/// The shipped config.toml with a behaviour deadline a loaded debug build always meets:
/// this test is about what survives a restart, not about the deadline.
pub(crate) fn config_with_patient_behaviour(dir: &Path) -> std::path::PathBuf {
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml"))
            .expect("shipped config.toml");
    let patched = shipped.replace("deadline_ms = 5 ", "deadline_ms = 2000 ");
    assert_ne!(patched, shipped, "config.toml names behaviour.deadline_ms");
    let path = dir.join("config.toml");
    std::fs::write(&path, patched).expect("write config");
    path
}

#[tokio::test]
async fn behaviour_survives_sigterm_and_restart() {
    let data = tempfile::tempdir().unwrap();
    let config = config_with_patient_behaviour(data.path());
    let config = config.to_str().unwrap();
    let args = ["serve", "--config", config];
    let port = free_port();
    let claim_on = |user: &str| {
        json!({"scene": "coupon_claim", "user_id": user, "device_id": "device-farm-7",
               "ip": "203.0.113.9", "user_created_at": "2020-01-01T00:00:00Z"})
    };
    let signal = |b: &Value, name: &str| {
        b["signals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
    };
    // The copied config.toml's `rules_dir` is relative to its folder: name the shipped rules.
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let v = Vigia::start_with_args(port, data.path(), Some(&rules), &[], &args).await;
    for user in ["a1", "a2", "a3"] {
        let (status, b) = v.check(&claim_on(user)).await;
        assert_eq!(status, 200, "{b}");
    }
    v.sigterm();
    let v = Vigia::start_with_args(port, data.path(), Some(&rules), &[], &args).await;
    let (_, b) = v.check(&claim_on("a4")).await;
    let apd = signal(&b, "accounts_per_device").unwrap_or_else(|| panic!("signal in {b}"));
    assert_eq!(
        apd["value"], 4,
        "the three accounts before the restart still count: {b}"
    );
    assert_eq!(apd["contribution"], 0.6);
}
