//! The service's log as an operator reads it: `log_format = "text"` and the decision log,
//! from the real binary's standard output.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

/// The binary on the shipped config and rules, with a private data folder, its stdout
/// lines sent to the returned channel.
fn start(env: &[(&str, &str)], data: &std::path::Path) -> (Child, Receiver<String>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigia"));
    for (var, ..) in vigia::config::ENV {
        cmd.env_remove(var);
    }
    let mut child = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("VIGIA_LISTEN", "127.0.0.1:0")
        .env("VIGIA_DATA_DIR", data)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn vigia");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// The next line containing `needle`; panics naming it if the process says nothing like
/// it within a minute (a hang, not a timing assertion).
fn line_with(rx: &Receiver<String>, needle: &str) -> String {
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => continue,
            Err(e) => panic!("no log line with {needle:?}: {e}"),
        }
    }
}

/// POSTs `body` to `/v1/check` over plain HTTP/1.1; the answer's status line.
fn post_check(addr: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/check HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    answer.lines().next().unwrap_or_default().to_string()
}

#[test]
fn text_logs_and_a_hashed_decision_line_per_check() {
    let data = tempfile::tempdir().expect("data dir");
    let (mut child, rx) = start(
        &[
            ("VIGIA_LOG_FORMAT", "text"),
            ("VIGIA_DECISION_LOG", "hashed"),
        ],
        data.path(),
    );
    let listening = line_with(&rx, "vigia listening");
    // Text, not JSON: `LEVEL target: message key=value`.
    assert!(!listening.starts_with('{'), "{listening}");
    assert!(listening.contains(" INFO "), "{listening}");
    let addr = listening
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .expect("addr= on the start-up line")
        .to_string();

    let status = post_check(
        &addr,
        r#"{"scene":"coupon_claim","request_id":"audit-1","user_id":"10086",
            "device_id":"a1b2c3d4e5","ip":"203.0.113.7","activity_id":"2026verano",
            "user_created_at":"2025-03-01T00:00:00Z"}"#,
    );
    assert!(status.contains(" 200 "), "{status}");
    let line = line_with(&rx, "request_id=audit-1");
    let _ = child.kill();
    let _ = child.wait();

    assert!(line.contains("vigia::decision"), "{line}");
    assert!(line.contains("scene=coupon_claim"), "{line}");
    assert!(line.contains("decision=\"allow\""), "{line}");
    // printf %s 10086 | sha256sum | cut -c1-16
    assert!(line.contains("user_id=\"9646f275f10ae73f\""), "{line}");
    for clear in ["10086", "a1b2c3d4e5", "203.0.113.7", "2026verano"] {
        assert!(!line.contains(clear), "{clear} logged in clear: {line}");
    }
}
