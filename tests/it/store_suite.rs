//! One behaviour suite, two stores: every test here runs against a real `redis-server`
//! (started per test) and against the embedded store (a fresh sled folder per test).
//!
//! The `case_*` functions take a `&dyn WindowStore` and the [`ManualClock`] the store reads,
//! and inspect only through the store itself (a dry-run check reports counts). What each
//! store holds afterwards is read through [`Env`] (ZCARD/PTTL/DBSIZE on Redis, the
//! embedded store's own inspection otherwise). Redis-only behaviour (one EVALSHA, NOSCRIPT,
//! restarts) is in `store_redis`; embedded-only (durability, reclaiming) in `store_embedded`.

use std::sync::Arc;

use vigia::clock::ManualClock;
use vigia::rules::Algorithm;
use vigia::store::embedded::EmbeddedStore;
use vigia::store::redis::RedisStore;
use vigia::store::{
    CheckOp, CheckOutcome, LimitOp, LimitState, RefundOp, WindowStore, EXPIRY_MARGIN_MS,
};

use crate::common::RedisServer;

/// An instant aligned to 10 s (and to 1 s), so fixed windows start on it.
pub(crate) const T0: u64 = 1_700_000_000_000;
pub(crate) const SEC: u64 = 1_000;
pub(crate) const DAY: u64 = 86_400_000;
/// Generous: a debug build on two shared cores, 50 concurrent callers.
pub(crate) const TEST_TIMEOUT_MS: u64 = 2_000;

// ---------------------------------------------------------------------------------------
// Building ops
// ---------------------------------------------------------------------------------------

pub(crate) fn limit(key: &str, algorithm: Algorithm, window_ms: u64, max: u64) -> LimitOp {
    LimitOp {
        key: key.to_string(),
        algorithm,
        window_ms,
        max,
        retain_ms: window_ms,
    }
}

pub(crate) fn sliding(key: &str, window_ms: u64, max: u64) -> LimitOp {
    limit(key, Algorithm::SlidingWindow, window_ms, max)
}

pub(crate) fn fixed(key: &str, window_ms: u64, max: u64) -> LimitOp {
    limit(key, Algorithm::FixedWindow, window_ms, max)
}

pub(crate) fn bucket(key: &str, window_ms: u64, max: u64) -> LimitOp {
    limit(key, Algorithm::TokenBucket, window_ms, max)
}

/// The embedded store's record of a request (`keys::KeySpace::record_key`, no entity).
pub(crate) fn record_key(request_id: &str) -> String {
    format!("lt:test:req:all:{request_id}")
}

/// Where Redis keeps the suite's records (the ops name no entity).
pub(crate) const RECORDS_KEY: &str = "lt:test:rq:all";

/// The record TTL of a check over `limits`: its longest window, at least a second.
fn record_ttl_ms(limits: &[LimitOp]) -> u64 {
    let longest = limits.iter().map(|l| l.retain_ms).max().unwrap_or(0);
    longest.max(SEC)
}

pub(crate) fn op(request_id: &str, limits: &[LimitOp]) -> CheckOp {
    CheckOp {
        record_key: record_key(request_id),
        records_key: RECORDS_KEY.into(),
        idempotency_key: None,
        request_id: request_id.to_string(),
        id_given: true,
        record_ttl_ms: record_ttl_ms(limits),
        dry_run: false,
        limits: limits.to_vec(),
    }
}

pub(crate) fn with_idem(mut op: CheckOp, idem: &str) -> CheckOp {
    op.idempotency_key = Some(format!("lt:test:idem:{idem}"));
    op
}

pub(crate) fn refund_op(request_id: &str, limits: &[LimitOp]) -> RefundOp {
    RefundOp {
        record_key: record_key(request_id),
        records_key: RECORDS_KEY.into(),
        record_ttl_ms: record_ttl_ms(limits),
        request_id: request_id.to_string(),
        keys: limits.iter().map(|l| l.key.clone()).collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Reading answers
// ---------------------------------------------------------------------------------------

pub(crate) async fn check(store: &dyn WindowStore, op: &CheckOp) -> CheckOutcome {
    store
        .check(op)
        .await
        .unwrap_or_else(|e| panic!("check {} failed: {e}", op.request_id))
}

/// Asserts an allow and returns the per-limit counts.
pub(crate) async fn allowed(store: &dyn WindowStore, op: &CheckOp) -> Vec<u64> {
    match check(store, op).await {
        CheckOutcome::Allowed { limits } => {
            assert!(limits.iter().all(|l| !l.exceeded), "{limits:?}");
            limits.iter().map(|l| l.count).collect()
        }
        other => panic!("{} should be allowed, got {other:?}", op.request_id),
    }
}

/// Asserts a deny and returns the per-limit states.
pub(crate) async fn denied(store: &dyn WindowStore, op: &CheckOp) -> Vec<LimitState> {
    match check(store, op).await {
        CheckOutcome::Denied { limits } => limits,
        other => panic!("{} should be denied, got {other:?}", op.request_id),
    }
}

/// What each limit holds now, asked of the store itself with a dry run: an allow reports
/// counts as if added (minus one), a deny reports them as they are.
pub(crate) async fn counts(store: &dyn WindowStore, limits: &[LimitOp]) -> Vec<u64> {
    let mut probe = op("probe-counts", limits);
    probe.dry_run = true;
    match check(store, &probe).await {
        CheckOutcome::Allowed { limits } => limits.iter().map(|l| l.count - 1).collect(),
        CheckOutcome::Denied { limits } => limits.iter().map(|l| l.count).collect(),
        CheckOutcome::Duplicate { of } | CheckOutcome::Held { of } => {
            panic!("probe was a duplicate of {of}")
        }
    }
}

// ---------------------------------------------------------------------------------------
// Redis-only inspection
// ---------------------------------------------------------------------------------------

pub(crate) fn redis_zcard(server: &RedisServer, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query(&mut server.conn())
        .expect("ZCARD")
}

pub(crate) fn redis_pttl(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.conn())
        .expect("PTTL")
}

pub(crate) fn redis_dbsize(server: &RedisServer) -> u64 {
    redis::cmd("DBSIZE")
        .query(&mut server.conn())
        .expect("DBSIZE")
}

pub(crate) fn redis_keys(server: &RedisServer) -> Vec<String> {
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

/// No key without an expiry, and none longer than `max_ttl_ms`, except a records hash: it
/// lives until the end of the generation after its own (lua/limits.lua), so up to twice
/// the record TTL (the longest window, within `max_ttl_ms`) plus the margin.
pub(crate) fn redis_assert_every_key_expires(server: &RedisServer, max_ttl_ms: u64) {
    for key in redis_keys(server) {
        let pttl = redis_pttl(server, &key);
        assert!(pttl > 0, "{key} has no expiry (PTTL {pttl})");
        let most = if key.starts_with(RECORDS_KEY) {
            2 * max_ttl_ms
        } else {
            max_ttl_ms
        };
        assert!(
            pttl as u64 <= most,
            "{key} lives {pttl} ms, more than {most}"
        );
    }
}

/// Calls of EVAL, SCRIPT (any subcommand) and MULTI: none of them belong on the check path.
pub(crate) fn redis_non_evalsha_script_calls(server: &RedisServer) -> u64 {
    server
        .command_calls()
        .into_iter()
        .filter(|(name, _)| {
            name == "eval" || name == "eval_ro" || name.starts_with("script") || name == "multi"
        })
        .map(|(_, n)| n)
        .sum()
}

pub(crate) fn redis_evalsha_calls(server: &RedisServer) -> u64 {
    server.command_calls().get("evalsha").copied().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// The two stores
// ---------------------------------------------------------------------------------------

/// What a test can look at besides the store's answers.
pub(crate) enum Inspect {
    Redis(RedisServer),
    /// The folder lives as long as the store (none for the in-memory twin).
    Embedded(
        Arc<EmbeddedStore>,
        #[allow(dead_code)] Option<tempfile::TempDir>,
    ),
}

/// A fresh store reading a manual clock at [`T0`], and a way to look inside it.
pub(crate) struct Env {
    pub store: Arc<dyn WindowStore>,
    pub clock: ManualClock,
    pub inspect: Inspect,
}

impl Env {
    pub async fn redis() -> Env {
        let server = RedisServer::start();
        let clock = ManualClock::new(T0);
        let store = RedisStore::connect(&server.url(), TEST_TIMEOUT_MS)
            .await
            .expect("connect")
            .with_clock(Arc::new(clock.clone()));
        Env {
            store: Arc::new(store),
            clock,
            inspect: Inspect::Redis(server),
        }
    }

    pub fn embedded() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = ManualClock::new(T0);
        let store = EmbeddedStore::open(dir.path(), Arc::new(clock.clone())).expect("open");
        Env {
            store: store.clone(),
            clock,
            inspect: Inspect::Embedded(store, Some(dir)),
        }
    }

    /// The embedded store without its journal (what `vigia simulate` counts in).
    pub fn in_memory() -> Env {
        let clock = ManualClock::new(T0);
        let store = EmbeddedStore::in_memory(Arc::new(clock.clone()));
        Env {
            store: store.clone(),
            clock,
            inspect: Inspect::Embedded(store, None),
        }
    }

    pub fn dyn_store(&self) -> &dyn WindowStore {
        self.store.as_ref()
    }

    /// Members of a sliding window key (0 when absent).
    pub fn members(&self, key: &str) -> u64 {
        match &self.inspect {
            Inspect::Redis(server) => redis_zcard(server, key),
            Inspect::Embedded(store, _) => store.inspect(key).map_or(0, |k| k.weight as u64),
        }
    }

    /// Keys the store holds.
    pub fn key_count(&self) -> u64 {
        match &self.inspect {
            Inspect::Redis(server) => redis_dbsize(server),
            Inspect::Embedded(store, _) => store.keys().len() as u64,
        }
    }

    /// No key without an expiry, and none living longer than `max_ttl_ms`.
    pub fn assert_every_key_expires(&self, max_ttl_ms: u64) {
        match &self.inspect {
            Inspect::Redis(server) => redis_assert_every_key_expires(server, max_ttl_ms),
            Inspect::Embedded(store, _) => {
                for key in store.keys() {
                    let ttl = store.inspect(&key).map_or(0, |k| k.ttl_ms);
                    assert!(
                        ttl > 0 && ttl <= max_ttl_ms,
                        "{key} lives {ttl} ms (max {max_ttl_ms})"
                    );
                }
            }
        }
    }
}
// ---------------------------------------------------------------------------------------
// Cases, store-agnostic
// ---------------------------------------------------------------------------------------

/// Case 1: N allowed, the N+1-th denied.
pub(crate) async fn case_n_then_deny(store: &dyn WindowStore, clock: &ManualClock, lim: &LimitOp) {
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
pub(crate) async fn case_no_double_peak(
    store: &dyn WindowStore,
    clock: &ManualClock,
    lim: &LimitOp,
) {
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
pub(crate) async fn case_concurrent(
    store: Arc<dyn WindowStore>,
    lim: &LimitOp,
    callers: usize,
) -> usize {
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
pub(crate) async fn case_all_or_nothing(store: &dyn WindowStore, limits: &[LimitOp]) {
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
pub(crate) async fn case_refund(store: &dyn WindowStore, limits: &[LimitOp]) {
    allowed(store, &op("r1", limits)).await;
    assert_eq!(
        allowed(store, &op("r2", limits)).await,
        vec![2; limits.len()]
    );

    // Candidate keys the record does not name give nothing back and do not use it up:
    // another entity's windows, which other requests did count in, keep their counts.
    let others: Vec<LimitOp> = limits
        .iter()
        .map(|l| LimitOp {
            key: format!("{}-someone-else", l.key),
            ..l.clone()
        })
        .collect();
    allowed(store, &op("o1", &others)).await;
    let mut wrong = refund_op("r1", limits);
    wrong.keys = others.iter().map(|l| l.key.clone()).collect();
    assert!(!store.refund(&wrong).await.expect("refund"));
    assert_eq!(counts(store, &others).await, vec![1; others.len()]);

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
pub(crate) async fn case_idempotency(store: &dyn WindowStore, clock: &ManualClock) {
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
pub(crate) async fn case_dry_run(store: &dyn WindowStore, limits: &[LimitOp]) {
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
pub(crate) async fn case_fixed_window(store: &dyn WindowStore, clock: &ManualClock) {
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
pub(crate) async fn case_token_bucket(store: &dyn WindowStore, clock: &ManualClock) {
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
pub(crate) async fn case_shared_key(store: &dyn WindowStore, clock: &ManualClock) {
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
// The suite, on both stores
// ---------------------------------------------------------------------------------------

/// Defines each test on every store: `on_redis::NAME`, `on_embedded::NAME` and
/// `on_in_memory::NAME` (the embedded store without its journal, as `vigia simulate` uses
/// it: the same answers are the point).
macro_rules! on_every_store {
    ($( $(#[$meta:meta])* async fn $name:ident($env:ident: Env) $body:block )*) => {
        mod on_redis {
            use super::*;
            $( $(#[$meta])* async fn $name() { let $env = Env::redis().await; $body } )*
        }
        mod on_embedded {
            use super::*;
            $( $(#[$meta])* async fn $name() { let $env = Env::embedded(); $body } )*
        }
        mod on_in_memory {
            use super::*;
            $( $(#[$meta])* async fn $name() { let $env = Env::in_memory(); $body } )*
        }
    };
}

on_every_store! {
    #[tokio::test]
    async fn n_allowed_then_denied_and_the_window_holds_n(env: Env) {
        let lim = sliding("lt:test:uid:10086", 10 * SEC, 5);
        case_n_then_deny(env.dyn_store(), &env.clock, &lim).await;
        assert_eq!(env.members(&lim.key), 5);
        env.store.ping().await.expect("ping");
    }

    #[tokio::test]
    async fn no_double_peak_and_every_key_expires(env: Env) {
        let lim = sliding("lt:test:uid:edge", 10 * SEC, 3);
        case_no_double_peak(env.dyn_store(), &env.clock, &lim).await;
        env.assert_every_key_expires(lim.retain_ms + EXPIRY_MARGIN_MS);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_checks_admit_exactly_max(env: Env) {
        let lim = sliding("lt:test:uid:hot", 10 * SEC, 5);
        assert_eq!(case_concurrent(env.store.clone(), &lim, 50).await, 5);
        assert_eq!(env.members(&lim.key), 5);
    }

    #[tokio::test]
    async fn a_deny_consumes_nothing_anywhere(env: Env) {
        let fresh = [
            sliding("lt:test:uid:u2", 10 * SEC, 10),
            sliding("lt:test:did:d2", 10 * SEC, 1),
            fixed("lt:test:fw:uid:u2", 10 * SEC, 10),
            bucket("lt:test:tb:uid:u2", 10 * SEC, 10),
        ];
        case_all_or_nothing(env.dyn_store(), &fresh).await;
        assert_eq!(env.members(&fresh[0].key), 1);
    }

    #[tokio::test]
    async fn refunds_are_exact_and_once(env: Env) {
        let limits = [
            sliding("lt:test:uid:rf", 10 * SEC, 5),
            fixed("lt:test:fw:uid:rf", 10 * SEC, 5),
            bucket("lt:test:tb:uid:rf", 10 * SEC, 5),
        ];
        case_refund(env.dyn_store(), &limits).await;
        assert_eq!(env.members(&limits[0].key), 1);
        env.assert_every_key_expires(10 * SEC + EXPIRY_MARGIN_MS);
    }

    #[tokio::test]
    async fn refund_of_a_fixed_window_that_has_rolled_over_takes_nothing_from_the_new_one(env: Env) {
        let lim = [fixed("lt:test:fw:uid:roll", 10 * SEC, 5)];
        env.clock.set(T0 + 9_000);
        allowed(env.dyn_store(), &op("old", &lim)).await;
        env.clock.set(T0 + 10_000);
        allowed(env.dyn_store(), &op("new", &lim)).await;
        assert!(env.store.refund(&refund_op("old", &lim)).await.expect("refund"));
        assert_eq!(counts(env.dyn_store(), &lim).await, [1]);
    }

    #[tokio::test]
    async fn a_service_made_id_is_recorded_without_being_looked_for(env: Env) {
        // The service's own ids are fresh, so the store skips the repeat lookup; the
        // record is still written: the client may send that id again, or refund it.
        let lim = [
            sliding("lt:test:uid:made", 10 * SEC, 5),
            fixed("lt:test:fw:uid:made", 10 * SEC, 5),
        ];
        let made = |id: &str| CheckOp { id_given: false, ..op(id, &lim) };
        allowed(env.dyn_store(), &made("m1")).await;
        allowed(env.dyn_store(), &made("m2")).await;
        assert_eq!(
            check(env.dyn_store(), &op("m1", &lim)).await,
            CheckOutcome::Duplicate { of: "m1".into() }
        );
        assert!(env.store.refund(&refund_op("m2", &lim)).await.expect("refund"));
        assert_eq!(counts(env.dyn_store(), &lim).await, [1, 1]);
    }

    #[tokio::test]
    async fn idempotency_and_repeated_ids(env: Env) {
        case_idempotency(env.dyn_store(), &env.clock).await;
        assert_eq!(env.members("lt:test:uid:idem"), 1);
        env.assert_every_key_expires(10 * SEC + EXPIRY_MARGIN_MS);
    }

    #[tokio::test]
    async fn dry_runs_write_nothing(env: Env) {
        let limits = [
            sliding("lt:test:uid:dry", 10 * SEC, 2),
            fixed("lt:test:fw:uid:dry", 10 * SEC, 2),
            bucket("lt:test:tb:uid:dry", 10 * SEC, 2),
        ];
        let mut dry = op("only-dry", &limits);
        dry.dry_run = true;
        let mut dry = with_idem(dry, "dry-idem");
        allowed(env.dyn_store(), &dry).await;
        dry.request_id = "only-dry-2".into();
        allowed(env.dyn_store(), &dry).await;
        assert_eq!(env.key_count(), 0, "a dry run created keys");

        case_dry_run(env.dyn_store(), &limits).await;
        // Two real checks: three limit keys and two request records (on Redis, fields of
        // one records hash).
        let records = match env.inspect {
            Inspect::Redis(_) => 1,
            Inspect::Embedded(..) => 2,
        };
        assert_eq!(env.key_count(), 3 + records);
        // Past the window (inside the expiry margin), a dry run does not even trim.
        env.clock.set(T0 + 10 * SEC + EXPIRY_MARGIN_MS / 2);
        let mut late = op("late", &limits);
        late.dry_run = true;
        assert_eq!(allowed(env.dyn_store(), &late).await, [1, 1, 1]);
        assert_eq!(env.members(&limits[0].key), 2);
    }

    #[tokio::test]
    async fn fixed_window_edges_and_retry(env: Env) {
        case_fixed_window(env.dyn_store(), &env.clock).await;
        env.assert_every_key_expires(10 * SEC + EXPIRY_MARGIN_MS);
    }

    #[tokio::test]
    async fn token_bucket_burst_refill_and_retry(env: Env) {
        case_token_bucket(env.dyn_store(), &env.clock).await;
        // Time to refill fully plus the margin, at most.
        env.assert_every_key_expires(10 * SEC + EXPIRY_MARGIN_MS);
    }

    #[tokio::test]
    async fn sliding_limits_sharing_one_zset(env: Env) {
        case_shared_key(env.dyn_store(), &env.clock).await;
        env.assert_every_key_expires(DAY + EXPIRY_MARGIN_MS);
        // s1 is a day old and trimmed; s2, s3, s4 remain.
        assert_eq!(env.members("lt:test:uid:shared"), 3);
    }
}
