//! Redis-only behaviour of the window store: one EVALSHA per check, NOSCRIPT, restarts,
//! expiries in Redis's own clock, a dead server. The shared behaviour is `store_suite`.

use std::time::{Duration, Instant};

use vigia::store::redis::RedisStore;
use vigia::store::{CheckOutcome, LimitState, StoreError, WindowStore, EXPIRY_MARGIN_MS};

use crate::common::RedisServer;
use crate::store_suite::*;

#[tokio::test]
async fn no_double_peak_and_expiry_follows_newest_member() {
    let env = Env::redis().await;
    let Inspect::Redis(server) = &env.inspect else {
        unreachable!()
    };
    let lim = sliding("lt:test:uid:edge", 10 * SEC, 3);
    case_no_double_peak(env.dyn_store(), &env.clock, &lim).await;
    // After every add the key outlives its newest member's window, and no key is immortal.
    let pttl = redis_pttl(server, &lim.key);
    assert!(pttl >= lim.window_ms as i64, "PTTL {pttl}");
    redis_assert_every_key_expires(server, lim.retain_ms + EXPIRY_MARGIN_MS);
}

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
async fn a_sliding_key_is_trimmed_only_by_an_add_that_finds_a_member_in_its_window() {
    // A trim is a Redis call (~4 % of the bench scene's script); most adds go to a key
    // that does not exist yet, where there is nothing to trim.
    let env = Env::redis().await;
    let Inspect::Redis(server) = &env.inspect else {
        unreachable!()
    };
    let trims = |s: &RedisServer| {
        s.command_calls()
            .get("zremrangebyscore")
            .copied()
            .unwrap_or(0)
    };
    let lim = [sliding("lt:test:uid:trim", 10 * SEC, 5)];
    env.clock.set(T0);
    assert_eq!(allowed(env.dyn_store(), &op("t1", &lim)).await, [1]);
    assert_eq!(trims(server), 0, "a new key was trimmed");
    // Past t1's window, inside its key's expiry margin: no count sees t1, and this add
    // finds no member in the window, so t1 stays.
    env.clock.set(T0 + 10 * SEC + EXPIRY_MARGIN_MS / 2);
    assert_eq!(allowed(env.dyn_store(), &op("t2", &lim)).await, [1]);
    assert_eq!(trims(server), 0);
    assert_eq!(redis_zcard(server, &lim[0].key), 2);
    // The next add finds t2 in the window: t1 goes.
    env.clock.advance(SEC);
    assert_eq!(allowed(env.dyn_store(), &op("t3", &lim)).await, [2]);
    assert_eq!(trims(server), 1);
    assert_eq!(redis_zcard(server, &lim[0].key), 2);
    assert_eq!(counts(env.dyn_store(), &lim).await, [2]);
}

#[tokio::test]
async fn a_deny_touches_no_expiry() {
    let env = Env::redis().await;
    let Inspect::Redis(server) = &env.inspect else {
        unreachable!()
    };
    let limits = [
        sliding("lt:test:uid:u1", 10 * SEC, 10),
        sliding("lt:test:did:d1", 10 * SEC, 1),
        fixed("lt:test:fw:uid:u1", 10 * SEC, 10),
        bucket("lt:test:tb:uid:u1", 10 * SEC, 10),
    ];
    // Expiries before the deny, then a little real time, then the deny: none refreshed.
    allowed(env.dyn_store(), &op("ttl-first", &limits)).await;
    let before: Vec<i64> = limits.iter().map(|l| redis_pttl(server, &l.key)).collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let second = denied(env.dyn_store(), &op("ttl-second", &limits)).await;
    assert!(second[1].exceeded);
    let after: Vec<i64> = limits.iter().map(|l| redis_pttl(server, &l.key)).collect();
    for ((l, b), a) in limits.iter().zip(&before).zip(&after) {
        assert!(
            a < b,
            "{}: PTTL {b} -> {a}, the deny touched the expiry",
            l.key
        );
    }
    assert_eq!(redis_zcard(server, &limits[0].key), 1);
}

#[tokio::test]
async fn one_evalsha_per_check_and_nothing_else() {
    let env = Env::redis().await;
    let Inspect::Redis(server) = &env.inspect else {
        unreachable!()
    };
    let limits = [
        sliding("lt:test:uid:rt", 10 * SEC, 3),
        fixed("lt:test:fw:uid:rt", 10 * SEC, 3),
        bucket("lt:test:tb:uid:rt", 10 * SEC, 3),
    ];
    // The first check of a shape of limits loads the script made for it (once: NOSCRIPT,
    // SCRIPT LOAD, EVALSHA again).
    let loads = |server: &RedisServer| server.command_calls().get("script|load").copied();
    let loads_before = loads(server);
    let _ = check(env.dyn_store(), &op("rt-first", &limits)).await;
    assert_eq!(loads(server), Some(loads_before.unwrap_or(0) + 1));
    let evalsha_before = redis_evalsha_calls(server);
    let other_before = redis_non_evalsha_script_calls(server);
    for i in 0..5 {
        // Allowed, then denied: both are one round trip.
        let _ = check(env.dyn_store(), &op(&format!("rt{i}"), &limits)).await;
    }
    assert_eq!(redis_evalsha_calls(server) - evalsha_before, 5);
    assert_eq!(redis_non_evalsha_script_calls(server), other_before);
}

#[tokio::test]
async fn noscript_is_reloaded_invisibly() {
    let env = Env::redis().await;
    let Inspect::Redis(server) = &env.inspect else {
        unreachable!()
    };
    let lim = [sliding("lt:test:uid:flush", 10 * SEC, 2)];
    assert_eq!(allowed(env.dyn_store(), &op("n1", &lim)).await, [1]);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .expect("SCRIPT FLUSH");
    let loads_before = server.command_calls().get("script|load").copied();
    assert_eq!(allowed(env.dyn_store(), &op("n2", &lim)).await, [2]);
    // It really was reloaded (once), not answered some other way.
    let loads_after = server.command_calls().get("script|load").copied();
    assert_eq!(loads_after, loads_before.map(|n| n + 1));
    denied(env.dyn_store(), &op("n3", &lim)).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .expect("SCRIPT FLUSH");
    assert!(env
        .store
        .refund(&refund_op("n1", &lim))
        .await
        .expect("refund after flush"));
}

#[tokio::test]
async fn recovers_after_redis_restarts() {
    let Env {
        store,
        inspect: Inspect::Redis(mut server),
        ..
    } = Env::redis().await
    else {
        unreachable!()
    };
    let lim = [sliding("lt:test:uid:restart", 10 * SEC, 2)];
    allowed(store.as_ref(), &op("b1", &lim)).await;
    server.restart();
    // The first calls may fail while the connection is re-established; then the script is
    // reloaded on NOSCRIPT and the answer is right for the (empty) restarted server.
    let deadline = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        match store.check(&op("b2", &lim)).await {
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

/// A Redis that is down at start-up is an outage, not a start-up error (API.md): the store
/// opens, and each call fails as refused (not as a timeout) until Redis is there.
#[tokio::test]
async fn connect_to_nothing_opens_a_store_whose_calls_are_refused() {
    let port = crate::common::free_port();
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}"), 200)
        .await
        .expect("a store down at start-up still opens");
    match store.ping().await {
        Err(StoreError::Unavailable(m)) => {
            assert!(m.to_lowercase().contains("refused"), "{m}")
        }
        other => panic!("expected a refused connection, got {other:?}"),
    }
    // An unusable URL is a configuration error, at once.
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
