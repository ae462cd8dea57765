//! Every connection is bounded, against the real binary: a request whose body (or whose
//! head, on a keep-alive connection) trickles in is closed at `[http] request_timeout_ms`,
//! checks are answered meanwhile, and more connections than the open-file limit allows
//! wait their turn instead of running the process out of files.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::common::served::{one_scene, Served};

/// The request deadline the tests configure.
const TIMEOUT: Duration = Duration::from_millis(1_000);

/// What a busy two-core machine may add to the deadline before a connection is closed.
const MARGIN: Duration = Duration::from_secs(4);

/// How long a slow client waits for the server to close it before it says it never did
/// (the clients were all still open after 12 s).
const GIVE_UP: Duration = Duration::from_secs(15);

const SLOW_CLIENTS: usize = 1_500;

/// A check's head announcing a body of 1000 bytes.
fn slow_head(addr: &str) -> String {
    format!(
        "POST /v1/check HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 1000\r\n\r\n"
    )
}

/// How a slow client's connection ended, timed from its first byte.
#[derive(Debug)]
enum Ended {
    ClosedAfter(Duration),
    StillOpen,
}

/// Sends `head` (then tells `sent_head`), then one more byte every 2 s, until the server
/// closes the connection (or [`GIVE_UP`] passes). The byte keeps a head valid (it grows
/// a header's name) as well as a body: a head made invalid would be refused at once.
async fn trickle(mut conn: TcpStream, head: &[u8], sent_head: mpsc::Sender<()>) -> Ended {
    let sent = Instant::now();
    if conn.write_all(head).await.is_err() {
        return Ended::ClosedAfter(sent.elapsed());
    }
    let _ = sent_head.send(()).await;
    let mut bytes = tokio::time::interval_at(
        (sent + Duration::from_secs(2)).into(),
        Duration::from_secs(2),
    );
    let give_up = tokio::time::sleep(GIVE_UP);
    tokio::pin!(give_up);
    let mut buf = [0u8; 512];
    loop {
        tokio::select! {
            read = conn.read(&mut buf) => match read {
                Ok(0) | Err(_) => return Ended::ClosedAfter(sent.elapsed()),
                Ok(_) => {}
            },
            _ = bytes.tick() => {
                if conn.write_all(b"x").await.is_err() {
                    return Ended::ClosedAfter(sent.elapsed());
                }
            }
            () = &mut give_up => return Ended::StillOpen,
        }
    }
}

/// [`SLOW_CLIENTS`] slow-body clients, each on a connection of its own, once every one
/// has sent its head.
async fn slow_bodies(addr: SocketAddr) -> Vec<tokio::task::JoinHandle<Ended>> {
    let (sent_head, mut heads) = mpsc::channel(SLOW_CLIENTS);
    let clients = (0..SLOW_CLIENTS)
        .map(|_| {
            let sent_head = sent_head.clone();
            tokio::spawn(async move {
                let conn = TcpStream::connect(addr).await.expect("connect");
                trickle(conn, slow_head(&addr.to_string()).as_bytes(), sent_head).await
            })
        })
        .collect();
    for _ in 0..SLOW_CLIENTS {
        heads
            .recv()
            .await
            .expect("every slow client sends its head");
    }
    clients
}

/// How each of `clients` ended.
async fn ends(clients: Vec<tokio::task::JoinHandle<Ended>>) -> Vec<Ended> {
    let mut ended = Vec::new();
    for c in clients {
        ended.push(c.await.expect("slow client"));
    }
    ended
}

/// A client whose every request has a minute to be answered (a hang fails the test).
fn client(pooled: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(60));
    if !pooled {
        b = b.pool_max_idle_per_host(0);
    }
    b.build().expect("client")
}

/// The test process holds as many sockets as it opens to the server, and more.
fn room_for(sockets: usize) {
    let soft = rlimit::increase_nofile_limit(u64::MAX).expect("raise the open-file limit");
    assert!(
        soft >= sockets as u64 + 512,
        "the test needs an open-file limit above {sockets} sockets (ulimit -n is {soft})"
    );
}

fn check_body(user: &str) -> Value {
    json!({"scene": "s", "user_id": user, "ip": "203.0.113.7"})
}

/// A check and its status, with how long its answer took.
async fn timed_check(client: &reqwest::Client, addr: &str, user: &str) -> (u16, Duration) {
    let started = Instant::now();
    let status = client
        .post(format!("http://{addr}/v1/check"))
        .json(&check_body(user))
        .send()
        .await
        .expect("the check is answered")
        .status()
        .as_u16();
    (status, started.elapsed())
}

/// `vigia_http_late_requests_total` from `/metrics`.
async fn late_requests(addr: &str) -> u64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix("vigia_http_late_requests_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("vigia_http_late_requests_total in /metrics")
}

fn assert_closed_on_time(ended: &[Ended]) {
    let open = ended
        .iter()
        .filter(|e| matches!(e, Ended::StillOpen))
        .count();
    assert_eq!(
        open,
        0,
        "{open} of {} slow connections still open after {GIVE_UP:?}",
        ended.len()
    );
    let times: Vec<Duration> = ended
        .iter()
        .filter_map(|e| match e {
            Ended::ClosedAfter(d) => Some(*d),
            Ended::StillOpen => None,
        })
        .collect();
    let (first, last) = (times.iter().min().unwrap(), times.iter().max().unwrap());
    // Not before the deadline (nothing else closes them), and not long after it.
    assert!(
        *first >= TIMEOUT,
        "a slow connection closed after {first:?}"
    );
    assert!(
        *last < TIMEOUT + MARGIN,
        "a slow connection closed after {last:?}"
    );
}

/// The attack: 1 500 connections each sending a check's head, then a byte every
/// 2 s. Each is closed at the deadline, while checks keep being answered as the rules say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_are_closed_at_the_deadline_while_checks_are_answered() {
    room_for(SLOW_CLIENTS);
    let served = Served::start("[http]\nrequest_timeout_ms = 1000\n", &one_scene(20), None);
    let addr: SocketAddr = served.addr.parse().unwrap();

    let slow = slow_bodies(addr).await;
    // While they are all open, a backend checks one user 40 times: 20 allowed, then
    // refused.
    let client = client(true);
    let mut answers = Vec::new();
    for _ in 0..40 {
        answers.push(timed_check(&client, &served.addr, "u1").await);
    }
    let ended = ends(slow).await;

    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    let mut expected = vec![200; 20];
    expected.extend([429; 20]);
    assert_eq!(statuses, expected);
    let slowest = answers.iter().map(|(_, d)| *d).max().unwrap();
    assert!(slowest < Duration::from_secs(2), "a check took {slowest:?}");
    assert_closed_on_time(&ended);
    assert_eq!(late_requests(&served.addr).await, SLOW_CLIENTS as u64);
}

/// actix bounds only a connection's first head: after one answered check, a next request
/// whose head trickles in is closed at the deadline too.
#[tokio::test]
async fn a_keep_alive_connections_next_head_is_bounded_too() {
    let served = Served::start("[http]\nrequest_timeout_ms = 1000\n", &one_scene(20), None);
    let mut conn = TcpStream::connect(&served.addr).await.expect("connect");
    let body = check_body("u1").to_string();
    let check = format!(
        "POST /v1/check HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        served.addr,
        body.len()
    );
    conn.write_all(check.as_bytes()).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = conn.read(&mut buf).await.unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let (sent_head, _heads) = mpsc::channel(1);
    let ended = trickle(conn, b"POST /v1/check HTTP/1.1\r\n", sent_head).await;
    assert_closed_on_time(&[ended]);
}

/// With its open-file limit at 1024 the service holds 384 connections on each of its two
/// workers (a tenth of the limit, at least 256 files, kept for the rest): 1 500 slow
/// clients, more than the limit, never run it out of files; the connections past the cap
/// wait in the backlog, and checks behind them are answered as the rules say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_connections_than_files_wait_their_turn_and_checks_are_answered() {
    room_for(SLOW_CLIENTS);
    let mut served = Served::start(
        "workers = 2\n[http]\nrequest_timeout_ms = 1000\n",
        &one_scene(10),
        Some((512, 1024)),
    );
    // The soft limit was raised to the hard one, and both were logged.
    let limit = served.line_with("open-file limit");
    assert_eq!(
        (
            &limit["fields"]["soft_before"],
            &limit["fields"]["soft"],
            &limit["fields"]["hard"]
        ),
        (&json!(512), &json!(1024), &json!(1024)),
        "{limit}"
    );
    let listening = served.line_with("vigia listening");
    assert_eq!(
        listening["fields"]["connections_per_worker"], 384,
        "{listening}"
    );
    let addr: SocketAddr = served.addr.parse().unwrap();

    let slow = slow_bodies(addr).await;
    // Checks on connections of their own, queued behind the slow ones.
    let client = client(false);
    let checks: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            let addr = served.addr.clone();
            tokio::spawn(async move { timed_check(&client, &addr, "u1").await })
        })
        .collect();
    let mut statuses = Vec::new();
    for c in checks {
        statuses.push(c.await.expect("check").0);
    }
    let ended = ends(slow).await;
    assert!(
        ended.iter().all(|e| matches!(e, Ended::ClosedAfter(_))),
        "a slow connection was never closed"
    );

    statuses.sort_unstable();
    let mut expected = vec![200; 10];
    expected.extend([429; 10]);
    assert_eq!(statuses, expected);
    let exhausted: Vec<String> = served
        .log()
        .into_iter()
        .filter(|l| l.contains("Too many open files") || l.contains("os error 24"))
        .collect();
    assert!(exhausted.is_empty(), "{exhausted:#?}");
    let ready = reqwest::get(format!("http://{}/readyz", served.addr))
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
}
