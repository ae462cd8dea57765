//! A throwaway `redis-server` per test: a free port, no persistence, killed on drop.
//! Tests never touch the machine's shared Redis.
//!
//! Faults a test can inject: [`RedisServer::kill`] / [`RedisServer::restart`] (gone, or
//! back empty), [`RedisServer::pause`] / [`RedisServer::resume`] (SIGSTOP: hung, not
//! refusing), [`RedisServer::command`] (e.g. `SCRIPT FLUSH`) and
//! [`RedisServer::debug_sleep`] (the server busy in a side connection).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A `redis-server` child process owned by one test.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    /// Stopped with SIGSTOP and not yet continued.
    paused: bool,
    /// Options past the defaults (a cluster node's), kept for restarts.
    extra: Vec<String>,
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
        Self::start_with(port, &[])
    }

    /// Starts a server on `port` with more options (`--cluster-enabled yes`…), kept for
    /// [`Self::restart`], which also keeps the data directory (a cluster node's
    /// `nodes.conf`).
    pub fn start_with(port: u16, extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir for redis-server");
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            paused: false,
            extra: extra.iter().map(|a| a.to_string()).collect(),
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
            // Redis >= 7 refuses DEBUG unless enabled; older servers do not know the option
            // (and would refuse to start with it).
            .args(if redis_major_version() >= 7 {
                &["--enable-debug-command", "local"][..]
            } else {
                &[][..]
            })
            .args(&self.extra)
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

    /// Kills the server (SIGKILL) and waits for it. A paused server is continued first, so
    /// no stopped process is ever left behind.
    pub fn kill(&mut self) {
        if self.paused {
            self.resume();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the process is running (not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The server's process id (panics when it is not running).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("redis-server is running").id()
    }

    /// SIGSTOP: the server hangs. The kernel still accepts connections and buffers what
    /// clients send, so callers see timeouts, not refusals. Undone by [`Self::resume`]
    /// (and by [`Self::kill`] and drop).
    pub fn pause(&mut self) {
        self.signal("-STOP");
        self.paused = true;
    }

    /// SIGCONT: a paused server goes on, answering everything it was sent meanwhile.
    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.paused = false;
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(sig)
            .arg(self.pid().to_string())
            .status()
            .unwrap_or_else(|e| panic!("kill {sig}: {e}"));
        assert!(status.success(), "kill {sig} {} failed", self.pid());
    }

    /// Runs one command on a fresh connection and returns its reply; panics on an error
    /// reply. `command(&["SCRIPT", "FLUSH"])`, `command(&["DEBUG", "SLEEP", "0"])`.
    pub fn command(&self, args: &[&str]) -> redis::Value {
        let (name, rest) = args.split_first().expect("a command name");
        let mut cmd = redis::cmd(name);
        for a in rest {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("redis {args:?}: {e}"))
    }

    /// Keeps the server busy (`DEBUG SLEEP`) from a side connection until
    /// [`DebugSleep::stop`]: one `DEBUG SLEEP <chunk>` after another, each queued while the
    /// previous one still runs, so no other client is served in between.
    pub fn debug_sleep(&self, chunk: Duration) -> DebugSleep {
        // Fail here, clearly, if DEBUG is refused, rather than with a load that never
        // sees the fault.
        self.command(&["DEBUG", "SLEEP", "0"]);
        DebugSleep::start(self.port, chunk)
    }

    /// Starts `MONITOR` on a side connection: [`Monitor::client_commands`] then gives the
    /// commands clients sent, in order, without those a script ran inside the server
    /// (which `INFO commandstats` counts alike).
    pub fn monitor(&self) -> Monitor {
        Monitor::start(self.port)
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

/// A server kept busy by `DEBUG SLEEP` in a side connection; see [`RedisServer::debug_sleep`].
pub struct DebugSleep {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Instant>>,
}

/// Blocks until a `PING` on a fresh connection to `port` goes unanswered for 20 ms (the
/// server is busy); its late reply is dropped with the connection.
fn wait_until_asleep(port: u16) {
    loop {
        let probe = TcpStream::connect(("127.0.0.1", port)).expect("probe connection");
        probe
            .set_read_timeout(Some(Duration::from_millis(20)))
            .expect("probe read timeout");
        (&probe).write_all(b"PING\r\n").expect("send PING");
        let mut line = String::new();
        match BufReader::new(&probe).read_line(&mut line) {
            Ok(_) => continue, // answered: not asleep yet
            Err(_) => return,
        }
    }
}

impl DebugSleep {
    fn start(port: u16, chunk: Duration) -> DebugSleep {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("side connection");
        let secs = format!("{:.3}", chunk.as_secs_f64());
        // RESP: *3 $5 DEBUG $5 SLEEP $n <secs>
        let cmd = format!(
            "*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${}\r\n{secs}\r\n",
            secs.len()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        // Start of the sleep Redis is running now.
        let mut current = Instant::now();
        stream.write_all(cmd.as_bytes()).expect("send DEBUG SLEEP");
        // Return only once Redis is asleep: a request sent before it read the command
        // would be served normally, and the caller's load would see no fault.
        wait_until_asleep(port);
        let thread = std::thread::spawn(move || {
            let mut sent = 1;
            'queue: loop {
                // Halfway through the current sleep, queue the next one.
                while Instant::now() < current + chunk / 2 {
                    if stopping.load(Ordering::SeqCst) {
                        break 'queue;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                stream.write_all(cmd.as_bytes()).expect("send DEBUG SLEEP");
                sent += 1;
                current += chunk;
            }
            // Every queued sleep must run out: the fault ends with the last reply.
            let mut replies = BufReader::new(stream);
            for _ in 0..sent {
                let mut line = String::new();
                replies.read_line(&mut line).expect("DEBUG SLEEP reply");
                assert_eq!(line.trim_end(), "+OK", "DEBUG SLEEP replied {line:?}");
            }
            Instant::now()
        });
        DebugSleep {
            stop,
            thread: Some(thread),
        }
    }

    /// Queues no more sleeps and blocks until the last one is over; returns that moment
    /// (the end of the fault).
    pub fn stop(mut self) -> Instant {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().expect("stopped once");
        thread
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

impl Drop for DebugSleep {
    fn drop(&mut self) {
        // A test that failed before `stop`: queue nothing more; the queued sleeps end on
        // their own (or with the server).
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The major version of the `redis-server` on PATH (0 when it cannot be run; starting
/// it then fails with the clear message of [`RedisServer::start`]).
pub fn redis_major_version() -> u32 {
    static MAJOR: OnceLock<u32> = OnceLock::new();
    *MAJOR.get_or_init(|| {
        let out = Command::new("redis-server").arg("--version").output();
        // "Redis server v=7.0.15 sha=..."
        out.ok()
            .and_then(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                let v = text.split("v=").nth(1)?.split('.').next()?.to_string();
                v.parse().ok()
            })
            .unwrap_or(0)
    })
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind port 0")
        .local_addr()
        .expect("local addr")
        .port()
}

/// A `MONITOR` connection (see [`RedisServer::monitor`]).
pub struct Monitor {
    reader: BufReader<TcpStream>,
    port: u16,
}

impl Monitor {
    fn start(port: u16) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("monitor connects");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR sent");
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("MONITOR answered");
        assert_eq!(ok.trim_end(), "+OK", "MONITOR refused: {ok}");
        Monitor { reader, port }
    }

    /// The lower-case names of the commands clients sent since the monitor started (not
    /// those run by scripts, `[0 lua]`), up to an `ECHO` this call sends to mark the end.
    pub fn client_commands(mut self) -> Vec<String> {
        const END: &str = "vigia-monitor-end";
        let mut marker = TcpStream::connect(("127.0.0.1", self.port)).expect("connects");
        marker
            .write_all(format!("ECHO {END}\r\n").as_bytes())
            .expect("ECHO sent");
        let mut names = Vec::new();
        loop {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).expect("monitor line");
            assert!(n > 0, "MONITOR ended before the end marker");
            // +1700000000.123456 [0 127.0.0.1:5555] "evalsha" "…" …
            let Some((source, command)) = line.split_once("] ") else {
                continue;
            };
            if line.contains(END) {
                return names;
            }
            if source.ends_with(" lua") {
                continue;
            }
            let name = command.split('"').nth(1).unwrap_or_default().to_lowercase();
            names.push(name);
        }
    }
}
