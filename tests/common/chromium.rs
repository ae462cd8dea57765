//! Headless Chromium driven over the Chrome DevTools Protocol: a small synchronous client
//! on one websocket (tungstenite), enough to open a page, read its DOM, collect its console
//! errors and take a screenshot. Debian's `chromium` must be on PATH: a missing browser
//! fails the test, it never skips it.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// How long one DevTools answer may take before the test fails (not a timing assertion:
/// a hung browser must not hang the suite).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// A headless Chromium with one page attached; killed on drop.
pub struct Chromium {
    child: Child,
    _profile: tempfile::TempDir,
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// The page's flattened session.
    session: String,
    /// Every event the page sent so far (console calls, exceptions, log entries, ...).
    events: Vec<Value>,
}

impl Chromium {
    /// Starts `chromium --headless` on a fresh profile and attaches to a blank page with
    /// the Runtime, Log and Page domains enabled.
    pub fn launch() -> Chromium {
        let profile = tempfile::tempdir().expect("chromium profile dir");
        let mut child = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--remote-debugging-port=0",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--window-size=1280,1800",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `chromium` ({e}): install Debian's package with `apt-get install chromium`")
            });
        let stderr = child.stderr.take().expect("chromium stderr");
        let mut lines = BufReader::new(stderr);
        let mut seen = String::new();
        // Chromium prints the browser's websocket URL once it listens.
        let url = loop {
            let mut line = String::new();
            match lines.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = child.kill();
                    panic!("chromium exited before its DevTools listened:\n{seen}");
                }
                Ok(_) => {}
            }
            if let Some(url) = line.trim().strip_prefix("DevTools listening on ") {
                break url.to_string();
            }
            seen.push_str(&line);
        };
        // Keep draining stderr so Chromium never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.lines() {});
        let (ws, _) = tungstenite::connect(url.as_str())
            .unwrap_or_else(|e| panic!("connect to chromium's DevTools at {url}: {e}"));
        if let MaybeTlsStream::Plain(stream) = ws.get_ref() {
            stream
                .set_read_timeout(Some(ANSWER_WITHIN))
                .expect("read timeout");
        }
        let mut browser = Chromium {
            child,
            _profile: profile,
            ws,
            next_id: 0,
            session: String::new(),
            events: Vec::new(),
        };
        let target = browser.call_on(None, "Target.createTarget", json!({"url": "about:blank"}));
        let target = target["targetId"].as_str().expect("targetId").to_string();
        let attached = browser.call_on(
            None,
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_string();
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            browser.call(domain, json!({}));
        }
        browser
    }

    /// Sends one command (to the page's session, or to the browser with `None`) and
    /// returns its result; events read meanwhile are kept.
    fn call_on(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .unwrap_or_else(|e| panic!("send {method} to chromium: {e}"));
        loop {
            let text = match self.ws.read() {
                Ok(Message::Text(t)) => t,
                Ok(_) => continue,
                Err(e) => panic!("read chromium's answer to {method}: {e}"),
            };
            let v: Value = serde_json::from_str(text.as_str()).expect("DevTools JSON");
            if v["id"].as_u64() == Some(id) {
                if let Some(err) = v.get("error") {
                    panic!("chromium refused {method}: {err}");
                }
                return v["result"].clone();
            }
            if v.get("method").is_some() {
                self.events.push(v);
            }
        }
    }

    /// A command to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.call_on(Some(&session), method, params)
    }

    /// Opens `url` in the page.
    pub fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({"url": url}));
        assert!(
            r.get("errorText").is_none(),
            "navigate to {url}: {}",
            r["errorText"]
        );
    }

    /// The value of a JavaScript expression in the page (JSON-serialisable values).
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression} threw: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Evaluates `expression` until it is truthy (not null, false, 0 or ""), and returns
    /// it; fails after `within` with `what` and the last value.
    pub fn wait_for(&mut self, expression: &str, within: Duration, what: &str) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.eval(expression);
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: still {v} after {within:?}; page errors: {:?}",
                self.errors()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Console errors, uncaught exceptions and error log entries the page produced.
    pub fn errors(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| match e["method"].as_str() {
                Some("Runtime.consoleAPICalled") => {
                    matches!(e["params"]["type"].as_str(), Some("error" | "assert"))
                }
                Some("Runtime.exceptionThrown") => true,
                Some("Log.entryAdded") => e["params"]["entry"]["level"] == "error",
                _ => false,
            })
            .cloned()
            .collect()
    }

    /// The whole page as PNG bytes.
    pub fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine as _;
        let r = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("screenshot base64")
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.ws.close(None);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
