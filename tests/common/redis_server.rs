//! A throwaway `redis-server` per test: a free port, no persistence, killed on drop.
//! Tests never touch the machine's shared Redis.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process owned by one test.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a fresh server on a free port and waits until it answers PING.
    /// Panics with a clear message when `redis-server` is not installed: such a test
    /// must fail, never skip silently.
    pub fn start() -> RedisServer {
        let port = free_port();
        Self::start_on(port)
    }

    /// Starts a server on a given port (for restart tests).
    pub fn start_on(port: u16) -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir for redis-server");
        let mut server = RedisServer {
            child: None,
            port,
            dir,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): this test needs `redis-server` on PATH \
                     (Debian: apt-get install redis-server)"
                )
            });
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = self.client().get_connection() {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer PING within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain client for assertions.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis client")
    }

    /// A blocking connection for assertions.
    pub fn conn(&self) -> redis::Connection {
        self.client().get_connection().expect("redis connection")
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// How many times Redis ran each command, from `INFO commandstats` (lower-case names).
    pub fn command_calls(&self) -> std::collections::BTreeMap<String, u64> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .expect("INFO commandstats");
        let mut calls = std::collections::BTreeMap::new();
        for line in info.lines() {
            // cmdstat_evalsha:calls=3,usec=...
            if let Some(rest) = line.strip_prefix("cmdstat_") {
                if let Some((name, stats)) = rest.split_once(':') {
                    if let Some(n) = stats
                        .split(',')
                        .find_map(|kv| kv.strip_prefix("calls="))
                        .and_then(|n| n.parse().ok())
                    {
                        calls.insert(name.to_string(), n);
                    }
                }
            }
        }
        calls
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind port 0")
        .local_addr()
        .expect("local addr")
        .port()
}
