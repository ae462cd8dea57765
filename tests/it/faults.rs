//! Fault injection: the check path while Redis is killed, hung (SIGSTOP), bounced empty,
//! stripped of its scripts, busy (`DEBUG SLEEP`), cut mid-request or partitioned (a
//! partition that heals, and one that heals only for new connections).
//!
//! One rule set, three scenes (one per `on_store_error` policy), vigia on Redis with
//! `store.timeout_ms = TIMEOUT_MS`. Each test injects one fault and asserts, per scene:
//! - every answer during the fault is the policy's (or a normal answer, where the fault
//!   allows one);
//! - the p99 latency of `PER_SCENE` checks sent during the fault stays under `P99_BOUND`;
//! - after the fault ends, a normal answer (`degraded: false`) arrives within
//!   `RECOVERY_BOUND`, measured from the end of the fault;
//! - and the service still answers `/healthz`.
//!
//! Every assertion of a test is evaluated before any fails, and the measured numbers are
//! printed (`cargo nextest run faults --no-capture`): a failure names fault, scene and
//! assertion with the numbers.

use std::cell::Cell;
use std::fmt;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{
    percentile, run_checks, spawn_app_configured, timed_check, RedisServer, Sample, TcpProxy,
    TestApp,
};

/// `store.timeout_ms` for every test here.
const TIMEOUT_MS: u64 = 100;

/// The p99 bound: one store timeout plus a margin. A check asks the store at most once
/// per stage that can block on it (the trust read, and only if it answered, the window
/// script), and the circuit breaker answers most checks of an outage at once; the first
/// few after the fault, and each half-open probe, wait their `TIMEOUT_MS`. The margin
/// covers a debug build sharing two CI cores with another test.
const P99_BOUND: Duration = Duration::from_millis(TIMEOUT_MS + 150);

/// After a fault ends, a normal answer must come within this.
const RECOVERY_BOUND: Duration = Duration::from_secs(2);

/// How long recovery is watched at most: past `RECOVERY_BOUND` only to report the real
/// time in the failure message.
const RECOVERY_WATCH: Duration = Duration::from_secs(5);

/// Checks per scene during a fault, and how many of a scene's are in flight at once (the
/// three scenes run side by side).
const PER_SCENE: usize = 100;
const CONCURRENCY: usize = 4;

/// The sever fault cuts the proxied connection this often while its load runs.
const SEVER_EVERY: Duration = Duration::from_millis(10);

/// Length of each `DEBUG SLEEP`; the next is queued before one ends, so Redis stays busy
/// for as long as the load needs.
const SLEEP_CHUNK: Duration = Duration::from_secs(2);

/// The limit every scene has: generous, so every store-backed answer is an allow.
const LIMIT: &str = "user_1m";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    FailOpen,
    FailClose,
    Local,
}

/// The scenes, named after their policy.
const SCENES: [(&str, Policy); 3] = [
    ("fail_open", Policy::FailOpen),
    ("fail_close", Policy::FailClose),
    ("local", Policy::Local),
];

/// Three scenes over `user`, one per policy, and the `[trust]` section of the shipped rules
/// (`rules/common.toml`), so each check also reads the trust ledger in Redis, as it does
/// in production.
fn rules() -> String {
    let mut text = String::new();
    for (name, policy) in SCENES {
        let policy = match policy {
            Policy::FailOpen => "fail_open",
            Policy::FailClose => "fail_close",
            Policy::Local => "local",
        };
        text.push_str(&format!(
            r#"
[scene.{name}]
on_store_error = "{policy}"
required = ["user"]

[[scene.{name}.limits]]
name = "{LIMIT}"
dimensions = ["user"]
algorithm = "sliding_window"
window = "1m"
max = 1000000
"#
        ));
    }
    text.push_str(
        r#"
[trust]
payment_succeeded = { points = 1, ttl = "30d" }
identity_verified = { points = 2, ttl = "180d" }
max_points = 3
bonus_per_point = 1
score_discount_per_point = 0.1
new_account = { younger_than = "7d", max_factor = 0.5 }
"#,
    );
    text
}

fn check_body(scene: &str, i: usize) -> Value {
    json!({"scene": scene, "user_id": format!("u{}", i % 8)})
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// (a) redis-server SIGKILLed; over when restarted (empty) on the same port.
    Kill,
    /// (b) redis-server SIGSTOPped: connections hang, nothing is refused; over at SIGCONT.
    Stop,
    /// (c) redis-server killed and restarted at once on the same port: vigia's connection
    /// is dead and the script cache empty. Over as soon as the new server answers PING.
    Bounce,
    /// (d) `SCRIPT FLUSH`: the client must reload the scripts invisibly.
    ScriptFlush,
    /// (e) `DEBUG SLEEP` in a side connection, chained for as long as the load runs.
    DebugSleep,
    /// (f) The proxied connection severed every `SEVER_EVERY` while the load runs.
    Sever,
    /// (g) The proxy blackholes the link (a partition that hangs); over when healed, and
    /// the held connections go on.
    Blackhole,
    /// (g') The same partition, but it heals only for new connections: those open during
    /// it stay open and silent forever (a firewall or NAT that lost its state, a failover
    /// behind one address). Recovery needs vigia to give up on its connection and dial
    /// again.
    BlackholeLost,
}

impl Fault {
    fn via_proxy(self) -> bool {
        matches!(self, Fault::Sever | Fault::Blackhole | Fault::BlackholeLost)
    }

    fn expect(self) -> Expect {
        match self {
            Fault::Kill
            | Fault::Stop
            | Fault::DebugSleep
            | Fault::Blackhole
            | Fault::BlackholeLost => Expect::Degraded,
            // The fault is a moment, not a state: the requests cut (or the first ones after
            // the bounce) answer by the policy, the others normally.
            Fault::Bounce | Fault::Sever => Expect::Either,
            Fault::ScriptFlush => Expect::Normal,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Fault::Kill => "kill",
            Fault::Stop => "sigstop",
            Fault::Bounce => "restart",
            Fault::ScriptFlush => "script_flush",
            Fault::DebugSleep => "debug_sleep",
            Fault::Sever => "sever",
            Fault::Blackhole => "blackhole",
            Fault::BlackholeLost => "blackhole_lost",
        };
        f.pad(name)
    }
}

/// Which answers are right during a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Only the scene policy's degraded answer.
    Degraded,
    /// Only a normal, store-backed allow.
    Normal,
    /// Either of them.
    Either,
}

/// Why a sample is not the scene policy's degraded answer, or `None` when it is.
fn not_degraded_answer(policy: Policy, s: &Sample) -> Option<&'static str> {
    let b = &s.body;
    if !s.degraded() {
        return Some("degraded is not true");
    }
    match policy {
        Policy::FailOpen => (s.status != 200 || b["decision"] != "allow")
            .then_some("fail_open must answer 200 allow"),
        Policy::FailClose => {
            if s.status != 503
                || b["decision"] != "friendly_deny"
                || b["reason"] != "store_unavailable"
            {
                Some("fail_close must answer 503 friendly_deny, reason store_unavailable")
            } else if s
                .retry_after
                .as_deref()
                .and_then(|r| r.parse::<u64>().ok())
                .is_none_or(|r| r == 0)
            {
                Some("fail_close must send Retry-After (whole seconds >= 1)")
            } else {
                None
            }
        }
        // Decided on the node's embedded store: its limit is counted and reported.
        Policy::Local => {
            let counted = b["limits"][0]["name"] == LIMIT
                && b["limits"][0]["count"].as_u64().is_some_and(|c| c >= 1);
            let allow = s.status == 200 && b["decision"] == "allow" && counted;
            let deny = s.status == 429 && b["decision"] == "friendly_deny" && b["reason"] == LIMIT;
            (!allow && !deny).then_some(
                "local must answer from the embedded store (200 allow counting the limit, or 429 by it)",
            )
        }
    }
}

/// What one scene showed during and after a fault.
struct SceneReport {
    scene: &'static str,
    samples: Vec<Sample>,
    /// From the end of the fault to the first normal answer; `None` if none came within
    /// `RECOVERY_WATCH`.
    recovery: Option<Duration>,
}

impl SceneReport {
    fn count(&self, f: impl Fn(&Sample) -> bool) -> usize {
        self.samples.iter().filter(|s| f(s)).count()
    }
}

/// Vigia over its own redis-server, through a proxy when the fault needs one.
async fn start(fault: Fault) -> (TestApp, Option<TcpProxy>) {
    let redis = RedisServer::start();
    let proxy = fault.via_proxy().then(|| TcpProxy::start(redis.port));
    let url = proxy.as_ref().map(TcpProxy::url);
    let app = spawn_app_configured(redis, &[("faults.toml", &rules())], |c| {
        c.store.timeout_ms = TIMEOUT_MS;
        if let Some(url) = url {
            c.store.redis_url = url;
        }
    })
    .await;
    (app, proxy)
}

/// `PER_SCENE` checks for every scene, the scenes side by side.
async fn load(app: &TestApp) -> Vec<Vec<Sample>> {
    futures::future::join_all(
        SCENES.iter().map(|&(scene, _)| {
            run_checks(app, PER_SCENE, CONCURRENCY, move |i| check_body(scene, i))
        }),
    )
    .await
}

/// The load, with the proxy severing every connection every `SEVER_EVERY` meanwhile.
/// Returns the samples and the moment of the last sever.
async fn load_while_severing(app: &TestApp, proxy: &TcpProxy) -> (Vec<Vec<Sample>>, Instant) {
    let last = Cell::new(Instant::now());
    let severing = async {
        loop {
            tokio::time::sleep(SEVER_EVERY).await;
            proxy.sever();
            last.set(Instant::now());
        }
    };
    let samples = tokio::select! {
        samples = load(app) => samples,
        _ = severing => unreachable!("severs until the load is done"),
    };
    (samples, last.get())
}

/// Time from `ended` to each scene's first normal answer: among the fault's own samples
/// that completed after `ended` (a fault that is a moment ends before its load), else by
/// polling every scene until each has one or `RECOVERY_WATCH` is over.
async fn recoveries(
    app: &TestApp,
    ended: Instant,
    samples: &[Vec<Sample>],
) -> Vec<Option<Duration>> {
    let mut found: Vec<Option<Duration>> = samples
        .iter()
        .map(|ss| {
            ss.iter()
                .filter(|s| s.done >= ended && s.is_normal_allow())
                .map(|s| s.done - ended)
                .min()
        })
        .collect();
    let mut i = 0;
    while found.iter().any(Option::is_none) && ended.elapsed() < RECOVERY_WATCH {
        let pending: Vec<usize> = (0..SCENES.len()).filter(|&k| found[k].is_none()).collect();
        let bodies: Vec<Value> = pending
            .iter()
            .map(|&k| check_body(SCENES[k].0, i))
            .collect();
        let polls = futures::future::join_all(bodies.iter().map(|b| timed_check(app, b))).await;
        for (k, s) in pending.into_iter().zip(polls) {
            if s.is_normal_allow() {
                found[k] = Some(s.done - ended);
            }
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    found
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Injects `fault`, drives the load, ends the fault, and asserts everything about it.
async fn exercise(fault: Fault) {
    let test_started = Instant::now();
    let (mut app, proxy) = start(fault).await;
    let proxy = proxy.as_ref();
    let proxy = || proxy.expect("this fault runs through the proxy");

    // Before the fault: every scene answers normally.
    for (scene, _) in SCENES {
        let s = timed_check(&app, &check_body(scene, 0)).await;
        assert!(
            s.is_normal_allow(),
            "{fault}/{scene}: before the fault the answer must be a normal allow: {}",
            s.describe()
        );
    }

    // Begin. A fault that is a moment (bounce, flush) also ends here.
    let mut ended = None;
    let mut sleeper = None;
    match fault {
        Fault::Kill => app.redis.kill(),
        Fault::Stop => app.redis.pause(),
        Fault::Bounce => {
            app.redis.restart();
            ended = Some(Instant::now());
        }
        Fault::ScriptFlush => {
            app.redis.command(&["SCRIPT", "FLUSH"]);
            ended = Some(Instant::now());
        }
        Fault::DebugSleep => sleeper = Some(app.redis.debug_sleep(SLEEP_CHUNK)),
        Fault::Sever => {}
        Fault::Blackhole | Fault::BlackholeLost => proxy().blackhole(true),
    }

    // During.
    let load_started = Instant::now();
    let (samples, last_sever) = if fault == Fault::Sever {
        let (samples, last) = load_while_severing(&app, proxy()).await;
        (samples, Some(last))
    } else {
        (load(&app).await, None)
    };
    let load_time = load_started.elapsed();

    // End.
    let ended = ended.unwrap_or_else(|| match fault {
        Fault::Kill => {
            app.redis.restart();
            Instant::now()
        }
        Fault::Stop => {
            app.redis.resume();
            Instant::now()
        }
        Fault::DebugSleep => sleeper.take().expect("sleeping").stop(),
        Fault::Sever => last_sever.expect("severed"),
        Fault::Blackhole => {
            proxy().blackhole(false);
            Instant::now()
        }
        Fault::BlackholeLost => {
            proxy().abandon();
            proxy().blackhole(false);
            Instant::now()
        }
        Fault::Bounce | Fault::ScriptFlush => unreachable!("ended when begun"),
    });
    let recovered = recoveries(&app, ended, &samples).await;

    let health = app
        .client
        .get(format!("{}/healthz", app.base))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status().as_u16());

    // Report, then assert.
    let reports: Vec<SceneReport> = SCENES
        .iter()
        .zip(samples)
        .zip(recovered)
        .map(|((&(scene, _), samples), recovery)| SceneReport {
            scene,
            samples,
            recovery,
        })
        .collect();
    let mut failures = Vec::new();
    for (r, &(_, policy)) in reports.iter().zip(SCENES.iter()) {
        let scene = r.scene;
        let normal = r.count(Sample::is_normal_allow);
        let degraded = r.count(|s| not_degraded_answer(policy, s).is_none());
        let (p50, p99) = (percentile(&r.samples, 0.50), percentile(&r.samples, 0.99));
        let max = percentile(&r.samples, 1.0);
        let recovery = r
            .recovery
            .map_or(format!("none in {}", ms(RECOVERY_WATCH)), ms);
        eprintln!(
            "faults: {fault:<14} {scene:<10} n={} normal={normal:<3} degraded={degraded:<3} \
             p50={:<7} p99={:<7} max={:<7} recovery={recovery}  (load {})",
            r.samples.len(),
            ms(p50),
            ms(p99),
            ms(max),
            ms(load_time),
        );

        if r.samples.len() < PER_SCENE {
            failures.push(format!(
                "{fault}/{scene}: only {} checks during the fault, want {PER_SCENE}",
                r.samples.len()
            ));
        }
        // Answers.
        let wrong: Vec<(&Sample, &str)> = r
            .samples
            .iter()
            .filter_map(|s| {
                let why = match fault.expect() {
                    Expect::Degraded => not_degraded_answer(policy, s),
                    Expect::Normal => (!s.is_normal_allow())
                        .then_some("a normal answer (200 allow, degraded false)"),
                    Expect::Either => (!s.is_normal_allow())
                        .then(|| not_degraded_answer(policy, s))
                        .flatten(),
                };
                why.map(|w| (s, w))
            })
            .collect();
        if let Some((first, why)) = wrong.first() {
            failures.push(format!(
                "{fault}/{scene} answers: {} of {} wrong ({why}); first: {}",
                wrong.len(),
                r.samples.len(),
                first.describe()
            ));
        }
        // Latency.
        if p99 > P99_BOUND {
            failures.push(format!(
                "{fault}/{scene} latency: p99 {} > bound {} (p50 {}, max {})",
                ms(p99),
                ms(P99_BOUND),
                ms(p50),
                ms(max)
            ));
        }
        // Recovery.
        match r.recovery {
            Some(t) if t <= RECOVERY_BOUND => {}
            Some(t) => failures.push(format!(
                "{fault}/{scene} recovery: first normal answer {} after the fault ended (bound {})",
                ms(t),
                ms(RECOVERY_BOUND)
            )),
            None => failures.push(format!(
                "{fault}/{scene} recovery: no normal answer within {} of the fault's end (bound {})",
                ms(RECOVERY_WATCH),
                ms(RECOVERY_BOUND)
            )),
        }
    }
    if fault == Fault::Sever {
        // The fault must have bitten, or this test tests nothing.
        let cut: usize = reports
            .iter()
            .map(|r| r.count(|s| !s.is_normal_allow()))
            .sum();
        if cut == 0 {
            failures.push(format!(
                "{fault}: no check was cut by {} severs (proxy accepted {} connections)",
                load_time.as_millis() / SEVER_EVERY.as_millis(),
                proxy().accepted()
            ));
        }
    }
    if health.as_ref().ok() != Some(&200) {
        failures.push(format!("{fault}: /healthz after the fault: {health:?}"));
    }
    eprintln!("faults: {fault:<14} wall {}", ms(test_started.elapsed()));
    assert!(
        failures.is_empty(),
        "{} fault assertion(s) failed:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

#[actix_web::test]
async fn redis_killed() {
    exercise(Fault::Kill).await;
}

#[actix_web::test]
async fn redis_stopped() {
    exercise(Fault::Stop).await;
}

#[actix_web::test]
async fn redis_restarted_with_empty_script_cache() {
    exercise(Fault::Bounce).await;
}

#[actix_web::test]
async fn scripts_flushed() {
    exercise(Fault::ScriptFlush).await;
}

#[actix_web::test]
async fn redis_busy_in_debug_sleep() {
    exercise(Fault::DebugSleep).await;
}

#[actix_web::test]
async fn connection_severed_mid_request() {
    exercise(Fault::Sever).await;
}

#[actix_web::test]
async fn link_blackholed() {
    exercise(Fault::Blackhole).await;
}

#[actix_web::test]
async fn link_blackholed_and_connections_lost() {
    exercise(Fault::BlackholeLost).await;
}

/// The proxy itself, on a bare socket, so a failure above is vigia's and not the proxy's:
/// it forwards, holds while blackholed and delivers on heal, abandons only the
/// connections open at that moment, and severs every live connection.
#[test]
fn proxy_forwards_holds_abandons_and_severs() {
    use std::io::{BufRead, BufReader, ErrorKind, Write};
    use std::net::TcpStream;

    struct Conn(TcpStream, BufReader<TcpStream>);
    impl Conn {
        fn open(port: u16) -> Conn {
            let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the proxy");
            s.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            let r = BufReader::new(s.try_clone().unwrap());
            Conn(s, r)
        }
        fn send_ping(&mut self) {
            self.0.write_all(b"PING\r\n").expect("write PING");
        }
        /// The next reply line; `Err` on a read timeout, `Ok("")` on EOF.
        fn reply(&mut self) -> std::io::Result<String> {
            let mut line = String::new();
            self.1.read_line(&mut line)?;
            Ok(line.trim_end().to_string())
        }
        fn ping(&mut self) -> std::io::Result<String> {
            self.send_ping();
            self.reply()
        }
    }
    // Controls take effect on the proxy's thread a moment after the call.
    let settle = || std::thread::sleep(Duration::from_millis(50));
    let timed_out = |r: std::io::Result<String>| matches!(r, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut));

    let redis = RedisServer::start();
    let proxy = TcpProxy::start(redis.port);
    let mut a = Conn::open(proxy.port());
    assert_eq!(a.ping().unwrap(), "+PONG");

    // Blackholed: an open connection and a new one both hang, neither is refused.
    proxy.blackhole(true);
    settle();
    a.send_ping();
    assert!(timed_out(a.reply()), "a blackholed link must hang");
    let mut b = Conn::open(proxy.port());
    b.send_ping();
    assert!(timed_out(b.reply()), "a new connection must hang too");
    // Healed: what was held arrives.
    proxy.blackhole(false);
    assert_eq!(a.reply().unwrap(), "+PONG");
    assert_eq!(b.reply().unwrap(), "+PONG");

    // Abandoned: the open connections hang for good; a new one works.
    proxy.abandon();
    settle();
    assert!(timed_out(a.ping()), "an abandoned connection must hang");
    let mut c = Conn::open(proxy.port());
    assert_eq!(c.ping().unwrap(), "+PONG");

    // Severed: every live connection is closed (abandoned ones too); a new one works.
    proxy.sever();
    settle();
    let closed = |r: std::io::Result<String>| match r {
        Ok(line) => line.is_empty(),
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    };
    assert!(closed(c.ping()), "a severed connection is closed");
    assert!(
        closed(b.reply()),
        "an abandoned connection is closed by a sever"
    );
    let mut d = Conn::open(proxy.port());
    assert_eq!(d.ping().unwrap(), "+PONG");
    assert_eq!(proxy.accepted(), 4);
}
