//! The window store's behaviour, against a real `redis-server` per test.
//!
//! The `case_*` functions take a `&dyn WindowStore` and the [`ManualClock`] the store reads,
//! and inspect only through the store itself (a dry-run check reports counts), so the same
//! cases can run against the embedded store. Redis-only inspection (ZCARD, PTTL, DBSIZE,
//! INFO commandstats) is kept to the `redis_*` helpers and the tests that wrap the cases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vigia::clock::ManualClock;
use vigia::rules::Algorithm;
use vigia::store::redis::RedisStore;
use vigia::store::{
    CheckOp, CheckOutcome, LimitOp, LimitState, RefundOp, StoreError, WindowStore, EXPIRY_MARGIN_MS,
};

use crate::common::RedisServer;

/// An instant aligned to 10 s (and to 1 s), so fixed windows start on it.
const T0: u64 = 1_700_000_000_000;
const SEC: u64 = 1_000;
const DAY: u64 = 86_400_000;
/// Generous: a debug build on two shared cores, 50 concurrent callers.
const TEST_TIMEOUT_MS: u64 = 2_000;

// ---------------------------------------------------------------------------------------
// Building ops
// ---------------------------------------------------------------------------------------

fn limit(key: &str, algorithm: Algorithm, window_ms: u64, max: u64) -> LimitOp {
    LimitOp {
        key: key.to_string(),
        algorithm,
        window_ms,
        max,
        retain_ms: window_ms,
    }
}

fn sliding(key: &str, window_ms: u64, max: u64) -> LimitOp {
    limit(key, Algorithm::SlidingWindow, window_ms, max)
}

fn fixed(key: &str, window_ms: u64, max: u64) -> LimitOp {
    limit(key, Algorithm::FixedWindow, window_ms, max)
}

fn bucket(key: &str, window_ms: u64, max: u64) -> LimitOp {
    limit(key, Algorithm::TokenBucket, window_ms, max)
}

fn record_key(request_id: &str) -> String {
    format!("lt:test:req:{request_id}")
}

fn op(request_id: &str, limits: &[LimitOp]) -> CheckOp {
    let longest = limits.iter().map(|l| l.retain_ms).max().unwrap_or(0);
    CheckOp {
        record_key: record_key(request_id),
        idempotency_key: None,
        request_id: request_id.to_string(),
        record_ttl_ms: longest.max(SEC),
        dry_run: false,
        limits: limits.to_vec(),
    }
}

fn with_idem(mut op: CheckOp, idem: &str) -> CheckOp {
    op.idempotency_key = Some(format!("lt:test:idem:{idem}"));
    op
}

fn refund_op(request_id: &str, limits: &[LimitOp]) -> RefundOp {
    RefundOp {
        record_key: record_key(request_id),
        request_id: request_id.to_string(),
        keys: limits.iter().map(|l| l.key.clone()).collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Reading answers
// ---------------------------------------------------------------------------------------

async fn check(store: &dyn WindowStore, op: &CheckOp) -> CheckOutcome {
    store
        .check(op)
        .await
        .unwrap_or_else(|e| panic!("check {} failed: {e}", op.request_id))
}

/// Asserts an allow and returns the per-limit counts.
async fn allowed(store: &dyn WindowStore, op: &CheckOp) -> Vec<u64> {
    match check(store, op).await {
        CheckOutcome::Allowed { limits } => {
            assert!(limits.iter().all(|l| !l.exceeded), "{limits:?}");
            limits.iter().map(|l| l.count).collect()
        }
        other => panic!("{} should be allowed, got {other:?}", op.request_id),
    }
}

/// Asserts a deny and returns the per-limit states.
async fn denied(store: &dyn WindowStore, op: &CheckOp) -> Vec<LimitState> {
    match check(store, op).await {
        CheckOutcome::Denied { limits } => limits,
        other => panic!("{} should be denied, got {other:?}", op.request_id),
    }
}

/// What each limit holds now, asked of the store itself with a dry run: an allow reports
/// counts as if added (minus one), a deny reports them as they are.
async fn counts(store: &dyn WindowStore, limits: &[LimitOp]) -> Vec<u64> {
    let mut probe = op("probe-counts", limits);
    probe.dry_run = true;
    match check(store, &probe).await {
        CheckOutcome::Allowed { limits } => limits.iter().map(|l| l.count - 1).collect(),
        CheckOutcome::Denied { limits } => limits.iter().map(|l| l.count).collect(),
        CheckOutcome::Duplicate { of } => panic!("probe was a duplicate of {of}"),
    }
}

// ---------------------------------------------------------------------------------------
// Redis-only inspection
// ---------------------------------------------------------------------------------------

struct Env {
    server: RedisServer,
    store: Arc<RedisStore>,
    clock: ManualClock,
}

/// A fresh server and a store on it reading a manual clock at [`T0`].
async fn env() -> Env {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect(&server.url(), TEST_TIMEOUT_MS)
        .await
        .expect("connect")
        .with_clock(Arc::new(clock.clone()));
    Env {
        server,
        store: Arc::new(store),
        clock,
    }
}

fn redis_zcard(server: &RedisServer, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query(&mut server.conn())
        .expect("ZCARD")
}

fn redis_pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.conn())
        .expect("PTTL")
}

fn redis_dbsize(server: &RedisServer) -> u64 {
    redis::cmd("DBSIZE")
        .query(&mut server.conn())
        .expect("DBSIZE")
}

fn redis_keys(server: &RedisServer) -> Vec<String> {
    // A test database holds a handful of keys; SCAN keeps to the habit all the same.
    let mut conn = server.conn();
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// No key without an expiry, and none longer than `max_ttl_ms`.
fn redis_assert_every_key_expires(server: &RedisServer, max_ttl_ms: u64) {
    for key in redis_keys(server) {
        let pttl = redis_pttl(server, &key);
        assert!(pttl > 0, "{key} has no expiry (PTTL {pttl})");
        assert!(
            pttl as u64 <= max_ttl_ms,
            "{key} lives {pttl} ms, more than {max_ttl_ms}"
        );
    }
}

/// Calls of EVAL, SCRIPT (any subcommand) and MULTI: none of them belong on the check path.
fn redis_non_evalsha_script_calls(server: &RedisServer) -> u64 {
    server
        .command_calls()
        .into_iter()
        .filter(|(name, _)| {
            name == "eval" || name == "eval_ro" || name.starts_with("script") || name == "multi"
        })
        .map(|(_, n)| n)
        .sum()
}

fn redis_evalsha_calls(server: &RedisServer) -> u64 {
    server.command_calls().get("evalsha").copied().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Cases, store-agnostic
// ---------------------------------------------------------------------------------------

/// Case 1: N allowed, the N+1-th denied.
async fn case_n_then_deny(store: &dyn WindowStore, clock: &ManualClock, lim: &LimitOp) {
    let lims = std::slice::from_ref(lim);
    for i in 1..=lim.max {
        assert_eq!(allowed(store, &op(&format!("r{i}"), lims)).await, [i]);
        clock.advance(1);
    }
    let states = denied(store, &op("over", lims)).await;
    assert_eq!(states[0].count, lim.max);
    assert!(states[0].exceeded);
    assert!(states[0].retry_after_ms >= 1 && states[0].retry_after_ms <= lim.window_ms);
}

/// Case 2: Across a window edge: no double peak, and the first ones leave exactly one window
/// after they came.
async fn case_no_double_peak(store: &dyn WindowStore, clock: &ManualClock, lim: &LimitOp) {
    let lims = std::slice::from_ref(lim);
    // max 3 per 10 s: a, b, c at T0, T0+1, T0+2.
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        clock.set(T0 + i as u64);
        allowed(store, &op(id, lims)).await;
    }
    // Just before the window ends for a: still three inside.
    clock.set(T0 + 9_999);
    let d = denied(store, &op("d", lims)).await;
    assert_eq!((d[0].count, d[0].retry_after_ms), (3, 1));
    // Exactly one window after a: a has left (a member at t counts while t > now - window).
    clock.set(T0 + 10_000);
    assert_eq!(allowed(store, &op("d", lims)).await, [3]);
    let e = denied(store, &op("e", lims)).await;
    assert_eq!(
        (e[0].count, e[0].retry_after_ms),
        (3, 1),
        "b leaves at T0+10001"
    );
    clock.set(T0 + 10_001);
    assert_eq!(allowed(store, &op("e", lims)).await, [3]);
    // Past the first members' window, the newer ones still count: d and e are inside.
    clock.set(T0 + 12_000);
    assert_eq!(counts(store, lims).await, [2]);
}

/// Case 3: Many concurrent checks on one key: exactly `max` allowed.
async fn case_concurrent(store: Arc<dyn WindowStore>, lim: &LimitOp, callers: usize) -> usize {
    let lims = std::slice::from_ref(lim);
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let store = store.clone();
            let op = op(&format!("c{i}"), lims);
            tokio::spawn(async move { store.check(&op).await })
        })
        .collect();
    let mut allowed = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(CheckOutcome::Allowed { .. }) => allowed += 1,
            Ok(CheckOutcome::Denied { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    allowed
}

/// Case 4: All-or-nothing: a deny by one limit leaves every other limit as it was.
async fn case_all_or_nothing(store: &dyn WindowStore, limits: &[LimitOp]) {
    // limits[1] is the strict one (max 1).
    let first = allowed(store, &op("first", limits)).await;
    assert!(first.iter().all(|&c| c == 1), "{first:?}");
    let second = denied(store, &op("second", limits)).await;
    let exceeded: Vec<bool> = second.iter().map(|l| l.exceeded).collect();
    let mut expect = vec![false; limits.len()];
    expect[1] = true;
    assert_eq!(exceeded, expect);
    assert!(second.iter().all(|l| l.count == 1), "{second:?}");
    assert_eq!(counts(store, limits).await, vec![1; limits.len()]);
    // Every other limit alone still has room for exactly what it had.
    let others: Vec<LimitOp> = limits
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, l)| l.clone())
        .collect();
    assert_eq!(counts(store, &others).await, vec![1; others.len()]);
}

/// Case 7: Refunds: exact in every algorithm, once, and only for counted requests.
async fn case_refund(store: &dyn WindowStore, limits: &[LimitOp]) {
    allowed(store, &op("r1", limits)).await;
    assert_eq!(
        allowed(store, &op("r2", limits)).await,
        vec![2; limits.len()]
    );

    // Candidate keys the record does not name give nothing back and do not use it up.
    let mut wrong = refund_op("r1", limits);
    wrong.keys = vec!["lt:test:uid:someone-else".into()];
    assert!(!store.refund(&wrong).await.expect("refund"));

    assert!(store
        .refund(&refund_op("r1", limits))
        .await
        .expect("refund"));
    assert_eq!(counts(store, limits).await, vec![1; limits.len()]);
    assert!(
        !store
            .refund(&refund_op("r1", limits))
            .await
            .expect("refund"),
        "second refund"
    );
    assert_eq!(counts(store, limits).await, vec![1; limits.len()]);
    assert!(!store
        .refund(&refund_op("never-seen", limits))
        .await
        .expect("refund"));

    // A refunded id sent again is still the same request: it does not count anew.
    assert_eq!(
        check(store, &op("r1", limits)).await,
        CheckOutcome::Duplicate { of: "r1".into() }
    );

    // A denied request consumed nothing, so there is nothing to refund.
    let strict = [sliding("lt:test:uid:strict", 10 * SEC, 1)];
    allowed(store, &op("s1", &strict)).await;
    denied(store, &op("s2", &strict)).await;
    assert!(!store
        .refund(&refund_op("s2", &strict))
        .await
        .expect("refund"));
    assert_eq!(counts(store, &strict).await, [1]);
}

/// Case 8: Idempotency keys and repeated request ids.
async fn case_idempotency(store: &dyn WindowStore, clock: &ManualClock) {
    let lim = [sliding("lt:test:uid:idem", 10 * SEC, 5)];
    assert_eq!(allowed(store, &with_idem(op("i1", &lim), "K")).await, [1]);
    assert_eq!(
        check(store, &with_idem(op("i2", &lim), "K")).await,
        CheckOutcome::Duplicate { of: "i1".into() }
    );
    assert_eq!(counts(store, &lim).await, [1]);
    // The same request id twice counts once, with or without an idempotency key.
    assert_eq!(
        check(store, &op("i1", &lim)).await,
        CheckOutcome::Duplicate { of: "i1".into() }
    );
    assert_eq!(counts(store, &lim).await, [1]);

    // A denied first attempt leaves no idempotency record: the retry is evaluated fresh.
    let strict = [sliding("lt:test:uid:idem-strict", 10 * SEC, 1)];
    allowed(store, &op("x", &strict)).await;
    denied(store, &with_idem(op("j1", &strict), "K2")).await;
    clock.advance(10 * SEC);
    assert_eq!(
        allowed(store, &with_idem(op("j2", &strict), "K2")).await,
        [1]
    );
    assert_eq!(
        check(store, &with_idem(op("j3", &strict), "K2")).await,
        CheckOutcome::Duplicate { of: "j2".into() }
    );
}

/// Case 9: Dry runs answer right and record nothing (the Redis test also checks DBSIZE).
async fn case_dry_run(store: &dyn WindowStore, limits: &[LimitOp]) {
    let dry = |id: &str| {
        let mut o = op(id, limits);
        o.dry_run = true;
        o
    };
    assert_eq!(allowed(store, &dry("d0")).await, vec![1; limits.len()]);
    assert_eq!(allowed(store, &dry("d0")).await, vec![1; limits.len()]);
    // Fill every limit (max 2 each) for real, then a dry run is denied and still writes nothing.
    allowed(store, &op("real1", limits)).await;
    allowed(store, &op("real2", limits)).await;
    let states = denied(store, &dry("d1")).await;
    assert!(
        states.iter().all(|l| l.exceeded && l.count == 2),
        "{states:?}"
    );
    // A dry run with an id that was counted is a duplicate, like the real check would be.
    assert_eq!(
        check(store, &dry("real1")).await,
        CheckOutcome::Duplicate { of: "real1".into() }
    );
}

/// Case 10a: Fixed windows: aligned edges, exact retry.
async fn case_fixed_window(store: &dyn WindowStore, clock: &ManualClock) {
    let lim = [fixed("lt:test:fw:uid:1", 10 * SEC, 2)];
    clock.set(T0 + 3_000);
    assert_eq!(allowed(store, &op("f1", &lim)).await, [1]);
    assert_eq!(allowed(store, &op("f2", &lim)).await, [2]);
    let d = denied(store, &op("f3", &lim)).await;
    assert_eq!(
        (d[0].count, d[0].exceeded, d[0].retry_after_ms),
        (2, true, 7_000)
    );
    clock.set(T0 + 9_999);
    assert_eq!(denied(store, &op("f3", &lim)).await[0].retry_after_ms, 1);
    // The next aligned window starts empty, however recent the last requests were.
    clock.set(T0 + 10_000);
    assert_eq!(allowed(store, &op("f3", &lim)).await, [1]);
    assert_eq!(allowed(store, &op("f4", &lim)).await, [2]);
    assert_eq!(
        denied(store, &op("f5", &lim)).await[0].retry_after_ms,
        10_000
    );
}

/// Case 10b: Token buckets: a burst of `max`, then one token per window / max.
async fn case_token_bucket(store: &dyn WindowStore, clock: &ManualClock) {
    // 5 per 10 s: one token every 2 s.
    let lim = [bucket("lt:test:tb:uid:1", 10 * SEC, 5)];
    clock.set(T0);
    for i in 1..=5 {
        assert_eq!(allowed(store, &op(&format!("t{i}"), &lim)).await, [i]);
    }
    let d = denied(store, &op("t6", &lim)).await;
    assert_eq!((d[0].count, d[0].retry_after_ms), (5, 2_000));
    clock.advance(1_999);
    assert_eq!(denied(store, &op("t6", &lim)).await[0].retry_after_ms, 1);
    clock.advance(1);
    assert_eq!(allowed(store, &op("t6", &lim)).await, [5]);
    assert_eq!(
        denied(store, &op("t7", &lim)).await[0].retry_after_ms,
        2_000
    );
    // Half a token's time: the retry is the other half.
    clock.advance(1_000);
    assert_eq!(
        denied(store, &op("t7", &lim)).await[0].retry_after_ms,
        1_000
    );
    // Long idle: full again, never more than the capacity.
    clock.advance(60 * SEC);
    assert_eq!(counts(store, &lim).await, [0]);
    for i in 1..=5 {
        assert_eq!(allowed(store, &op(&format!("u{i}"), &lim)).await, [i]);
    }
    denied(store, &op("u6", &lim)).await;
}

/// Case 11: Two sliding limits sharing one ZSET (1 per 10 s and 3 per day, retained a day).
async fn case_shared_key(store: &dyn WindowStore, clock: &ManualClock) {
    let key = "lt:test:uid:shared";
    let mut short = sliding(key, 10 * SEC, 1);
    short.retain_ms = DAY;
    let mut long = sliding(key, DAY, 3);
    long.retain_ms = DAY;
    let both = [short, long];

    clock.set(T0);
    assert_eq!(allowed(store, &op("s1", &both)).await, [1, 1]);
    clock.set(T0 + 5 * SEC);
    let d = denied(store, &op("s2", &both)).await;
    assert_eq!(
        d,
        [
            LimitState {
                count: 1,
                exceeded: true,
                retry_after_ms: 5_000
            },
            LimitState {
                count: 1,
                exceeded: false,
                retry_after_ms: 0
            }
        ]
    );
    clock.set(T0 + 10 * SEC);
    assert_eq!(allowed(store, &op("s2", &both)).await, [1, 2]);
    clock.set(T0 + 20 * SEC);
    assert_eq!(allowed(store, &op("s3", &both)).await, [1, 3]);
    clock.set(T0 + 30 * SEC);
    let d = denied(store, &op("s4", &both)).await;
    assert_eq!(
        d[1],
        LimitState {
            count: 3,
            exceeded: true,
            retry_after_ms: DAY - 30 * SEC
        }
    );
    assert!(!d[0].exceeded);
    // A day after the first: it has left the long window, the other two have not.
    clock.set(T0 + DAY);
    assert_eq!(allowed(store, &op("s4", &both)).await, [1, 3]);
}

// ---------------------------------------------------------------------------------------
// Tests on Redis
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn n_allowed_then_denied_and_zset_holds_n() {
    let env = env().await;
    let lim = sliding("lt:test:uid:10086", 10 * SEC, 5);
    case_n_then_deny(env.store.as_ref(), &env.clock, &lim).await;
    assert_eq!(redis_zcard(&env.server, &lim.key), 5);
    assert_eq!(env.store.kind(), "redis");
    env.store.ping().await.expect("ping");
}

#[tokio::test]
async fn no_double_peak_and_expiry_follows_newest_member() {
    let env = env().await;
    let lim = sliding("lt:test:uid:edge", 10 * SEC, 3);
    case_no_double_peak(env.store.as_ref(), &env.clock, &lim).await;
    // After every add the key outlives its newest member's window, and no key is immortal.
    let pttl = redis_pttl(&env.server, &lim.key);
    assert!(pttl >= lim.window_ms as i64, "PTTL {pttl}");
    redis_assert_every_key_expires(&env.server, lim.retain_ms + EXPIRY_MARGIN_MS);
}

/// The seed's bug needs real time to show: PEXPIRE only on the first write drops the key
/// one window (plus margin) after its first member, while a later member is still inside.
/// Here the store reads Redis TIME.
#[tokio::test]
async fn a_member_inside_the_window_survives_the_first_ones_expiry() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), TEST_TIMEOUT_MS)
        .await
        .expect("connect");
    let window = 2 * SEC;
    let lim = [sliding("lt:test:uid:real-time", window, 5)];
    let started = Instant::now();
    assert_eq!(allowed(&store, &op("first", &lim)).await, [1]);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(allowed(&store, &op("second", &lim)).await, [2]);
    // Set on every add: a fresh window + margin, not what was left of the first one's.
    let pttl = redis_pttl(&server, &lim[0].key);
    assert!(
        pttl > (window + EXPIRY_MARGIN_MS) as i64 - 400,
        "PTTL {pttl}: the expiry did not follow the newest member"
    );
    // Past the first member's window + margin, the second is still inside its window.
    let until = Duration::from_millis(window + EXPIRY_MARGIN_MS + 300);
    tokio::time::sleep(until.saturating_sub(started.elapsed())).await;
    assert_eq!(
        redis_zcard(&server, &lim[0].key),
        2,
        "untrimmed, not expired"
    );
    assert_eq!(counts(&store, &lim).await, [1], "second still counts");
}

#[tokio::test]
async fn concurrent_checks_admit_exactly_max() {
    let env = env().await;
    let lim = sliding("lt:test:uid:hot", 10 * SEC, 5);
    let store: Arc<dyn WindowStore> = env.store.clone();
    assert_eq!(case_concurrent(store, &lim, 50).await, 5);
    assert_eq!(redis_zcard(&env.server, &lim.key), 5);
}

#[tokio::test]
async fn a_deny_consumes_nothing_anywhere() {
    let env = env().await;
    let limits = [
        sliding("lt:test:uid:u1", 10 * SEC, 10),
        sliding("lt:test:did:d1", 10 * SEC, 1),
        fixed("lt:test:fw:uid:u1", 10 * SEC, 10),
        bucket("lt:test:tb:uid:u1", 10 * SEC, 10),
    ];
    // Expiries before the deny, then a little real time, then the deny: none refreshed.
    allowed(env.store.as_ref(), &op("ttl-first", &limits)).await;
    let before: Vec<i64> = limits
        .iter()
        .map(|l| redis_pttl(&env.server, &l.key))
        .collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let second = denied(env.store.as_ref(), &op("ttl-second", &limits)).await;
    assert!(second[1].exceeded);
    let after: Vec<i64> = limits
        .iter()
        .map(|l| redis_pttl(&env.server, &l.key))
        .collect();
    for ((l, b), a) in limits.iter().zip(&before).zip(&after) {
        assert!(
            a < b,
            "{}: PTTL {b} -> {a}, the deny touched the expiry",
            l.key
        );
    }
    assert_eq!(redis_zcard(&env.server, &limits[0].key), 1);

    // And the store-agnostic case on fresh keys.
    let fresh = [
        sliding("lt:test:uid:u2", 10 * SEC, 10),
        sliding("lt:test:did:d2", 10 * SEC, 1),
        fixed("lt:test:fw:uid:u2", 10 * SEC, 10),
        bucket("lt:test:tb:uid:u2", 10 * SEC, 10),
    ];
    case_all_or_nothing(env.store.as_ref(), &fresh).await;
    assert_eq!(redis_zcard(&env.server, &fresh[0].key), 1);
}

#[tokio::test]
async fn one_evalsha_per_check_and_nothing_else() {
    let env = env().await;
    let evalsha_before = redis_evalsha_calls(&env.server);
    let other_before = redis_non_evalsha_script_calls(&env.server);
    let limits = [
        sliding("lt:test:uid:rt", 10 * SEC, 3),
        fixed("lt:test:fw:uid:rt", 10 * SEC, 3),
        bucket("lt:test:tb:uid:rt", 10 * SEC, 3),
    ];
    for i in 0..5 {
        // Allowed, then denied: both are one round trip.
        let _ = check(env.store.as_ref(), &op(&format!("rt{i}"), &limits)).await;
    }
    assert_eq!(redis_evalsha_calls(&env.server) - evalsha_before, 5);
    assert_eq!(redis_non_evalsha_script_calls(&env.server), other_before);
}

#[tokio::test]
async fn noscript_is_reloaded_invisibly() {
    let env = env().await;
    let lim = [sliding("lt:test:uid:flush", 10 * SEC, 2)];
    assert_eq!(allowed(env.store.as_ref(), &op("n1", &lim)).await, [1]);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut env.server.conn())
        .expect("SCRIPT FLUSH");
    let loads_before = env.server.command_calls().get("script|load").copied();
    assert_eq!(allowed(env.store.as_ref(), &op("n2", &lim)).await, [2]);
    // It really was reloaded (once), not answered some other way.
    let loads_after = env.server.command_calls().get("script|load").copied();
    assert_eq!(loads_after, loads_before.map(|n| n + 1));
    denied(env.store.as_ref(), &op("n3", &lim)).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut env.server.conn())
        .expect("SCRIPT FLUSH");
    assert!(env
        .store
        .refund(&refund_op("n1", &lim))
        .await
        .expect("refund after flush"));
}

#[tokio::test]
async fn recovers_after_redis_restarts() {
    let mut env = env().await;
    let lim = [sliding("lt:test:uid:restart", 10 * SEC, 2)];
    allowed(env.store.as_ref(), &op("b1", &lim)).await;
    env.server.restart();
    // The first calls may fail while the connection is re-established; then the script is
    // reloaded on NOSCRIPT and the answer is right for the (empty) restarted server.
    let deadline = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        match env.store.check(&op("b2", &lim)).await {
            Ok(o) => break o,
            Err(e) => {
                assert!(Instant::now() < deadline, "no recovery: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(
        outcome,
        CheckOutcome::Allowed {
            limits: vec![LimitState {
                count: 1,
                exceeded: false,
                retry_after_ms: 0
            }]
        }
    );
}

#[tokio::test]
async fn refunds_are_exact_and_once() {
    let env = env().await;
    let limits = [
        sliding("lt:test:uid:rf", 10 * SEC, 5),
        fixed("lt:test:fw:uid:rf", 10 * SEC, 5),
        bucket("lt:test:tb:uid:rf", 10 * SEC, 5),
    ];
    case_refund(env.store.as_ref(), &limits).await;
    assert_eq!(redis_zcard(&env.server, &limits[0].key), 1);
    redis_assert_every_key_expires(&env.server, 10 * SEC + EXPIRY_MARGIN_MS);
}

#[tokio::test]
async fn refund_of_a_fixed_window_that_has_rolled_over_takes_nothing_from_the_new_one() {
    let env = env().await;
    let lim = [fixed("lt:test:fw:uid:roll", 10 * SEC, 5)];
    env.clock.set(T0 + 9_000);
    allowed(env.store.as_ref(), &op("old", &lim)).await;
    env.clock.set(T0 + 10_000);
    allowed(env.store.as_ref(), &op("new", &lim)).await;
    assert!(env
        .store
        .refund(&refund_op("old", &lim))
        .await
        .expect("refund"));
    assert_eq!(counts(env.store.as_ref(), &lim).await, [1]);
}

#[tokio::test]
async fn idempotency_and_repeated_ids() {
    let env = env().await;
    case_idempotency(env.store.as_ref(), &env.clock).await;
    assert_eq!(redis_zcard(&env.server, "lt:test:uid:idem"), 1);
    redis_assert_every_key_expires(&env.server, 10 * SEC + EXPIRY_MARGIN_MS);
}

#[tokio::test]
async fn dry_runs_write_nothing() {
    let env = env().await;
    let limits = [
        sliding("lt:test:uid:dry", 10 * SEC, 2),
        fixed("lt:test:fw:uid:dry", 10 * SEC, 2),
        bucket("lt:test:tb:uid:dry", 10 * SEC, 2),
    ];
    let mut dry = op("only-dry", &limits);
    dry.dry_run = true;
    let mut dry = with_idem(dry, "dry-idem");
    allowed(env.store.as_ref(), &dry).await;
    dry.request_id = "only-dry-2".into();
    allowed(env.store.as_ref(), &dry).await;
    assert_eq!(redis_dbsize(&env.server), 0, "a dry run created keys");

    case_dry_run(env.store.as_ref(), &limits).await;
    // Two real checks: three limit keys and two request records.
    assert_eq!(redis_dbsize(&env.server), 5);
    // Past the window, a dry run does not even trim.
    env.clock.advance(60 * SEC);
    let mut late = op("late", &limits);
    late.dry_run = true;
    assert_eq!(allowed(env.store.as_ref(), &late).await, [1, 1, 1]);
    assert_eq!(redis_zcard(&env.server, &limits[0].key), 2);
}

#[tokio::test]
async fn fixed_window_edges_and_retry() {
    let env = env().await;
    case_fixed_window(env.store.as_ref(), &env.clock).await;
    redis_assert_every_key_expires(&env.server, 10 * SEC + EXPIRY_MARGIN_MS);
}

#[tokio::test]
async fn token_bucket_burst_refill_and_retry() {
    let env = env().await;
    case_token_bucket(env.store.as_ref(), &env.clock).await;
    // Time to refill fully plus the margin, at most.
    redis_assert_every_key_expires(&env.server, 10 * SEC + EXPIRY_MARGIN_MS);
}

#[tokio::test]
async fn sliding_limits_sharing_one_zset() {
    let env = env().await;
    case_shared_key(env.store.as_ref(), &env.clock).await;
    redis_assert_every_key_expires(&env.server, DAY + EXPIRY_MARGIN_MS);
    // s1 is a day old and trimmed; s2, s3, s4 remain.
    assert_eq!(redis_zcard(&env.server, "lt:test:uid:shared"), 3);
}

#[tokio::test]
async fn connect_to_nothing_is_an_error() {
    let port = crate::common::free_port();
    let started = Instant::now();
    let result = RedisStore::connect(&format!("redis://127.0.0.1:{port}"), 200).await;
    match result {
        Err(StoreError::Unavailable(_) | StoreError::Timeout(_)) => {}
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(matches!(
        RedisStore::connect("not a url", 200).await,
        Err(StoreError::Unavailable(_))
    ));
}

#[tokio::test]
async fn a_dead_server_fails_within_the_timeout() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), 200)
        .await
        .expect("connect");
    let lim = [sliding("lt:test:uid:dead", 10 * SEC, 5)];
    allowed(&store, &op("alive", &lim)).await;
    server.kill();
    for id in ["dead1", "dead2", "dead3"] {
        let started = Instant::now();
        let result = store.check(&op(id, &lim)).await;
        assert!(result.is_err(), "{result:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
    }
    let started = Instant::now();
    assert!(store.refund(&refund_op("alive", &lim)).await.is_err());
    assert!(store.ping().await.is_err());
    assert!(started.elapsed() < Duration::from_secs(4));
}
