//! The real binary (`target/debug/vigia`) serving a config file and rules of the test's
//! own, its JSON log kept for the test to read.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running `vigia serve`; killed when dropped.
pub struct Served {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Served {
    /// Serves `rules` (one rule file) with a config of `config` (TOML, after `listen`,
    /// `rules_dir`, `data_dir` and `log_format`), under `open_files` = (soft, hard)
    /// `RLIMIT_NOFILE` when given.
    pub fn start(config: &str, rules: &str, open_files: Option<(u64, u64)>) -> Served {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("rules")).expect("rules dir");
        std::fs::write(dir.path().join("rules/rules.toml"), rules).expect("rules");
        let file = dir.path().join("config.toml");
        std::fs::write(
            &file,
            format!(
                "listen = \"127.0.0.1:0\"\nrules_dir = \"rules\"\ndata_dir = \"data\"\n\
                 log_format = \"json\"\n{config}\n"
            ),
        )
        .expect("config");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigia"));
        for (var, ..) in vigia::config::ENV {
            cmd.env_remove(var);
        }
        cmd.args(["serve", "--config"])
            .arg(&file)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some((soft, hard)) = open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is one system call, safe between fork and exec.
            unsafe {
                cmd.pre_exec(move || rlimit::setrlimit(rlimit::Resource::NOFILE, soft, hard));
            }
        }
        let mut child = cmd.spawn().expect("spawn vigia");
        let stdout = child.stdout.take().expect("stdout");
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let mut served = Served {
            child,
            addr: String::new(),
            log,
            _dir: dir,
        };
        let listening = served.line_with("vigia listening");
        served.addr = listening["fields"]["addr"]
            .as_str()
            .expect("addr on the start-up line")
            .to_string();
        served
    }

    /// Every log line so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The first log line whose message is `message`, as JSON; panics naming it if none
    /// comes within a minute (a hang, not a timing assertion) or the process exits.
    pub fn line_with(&mut self, message: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = self.log().iter().find_map(|l| {
                let v: Value = serde_json::from_str(l).ok()?;
                (v["fields"]["message"] == message).then_some(v)
            });
            if let Some(v) = found {
                return v;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("vigia exited ({status}) before logging {message:?}");
            }
            assert!(Instant::now() < deadline, "no log line {message:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The rule file of one scene `s`: `max` checks per user per hour, refusing when the
/// store cannot answer (the scene an exhausted process stopped serving).
pub fn one_scene(max: u64) -> String {
    format!(
        r#"
[scene.s]
on_store_error = "fail_close"
required = ["user", "ip"]
[[scene.s.limits]]
name = "user_1h"
dimensions = ["user"]
algorithm = "fixed_window"
window = "1h"
max = {max}
"#
    )
}
