//! Embedded-only behaviour: windows survive a restart, expired state is reclaimed.
//! (The shared semantics run in `store_suite` on both stores.)

use std::sync::Arc;

use vigia::clock::ManualClock;
use vigia::store::embedded::EmbeddedStore;
use vigia::store::{CheckOutcome, WindowStore};

use crate::store_suite::*;

fn open(dir: &std::path::Path, clock: &ManualClock) -> Arc<EmbeddedStore> {
    EmbeddedStore::open(dir, Arc::new(clock.clone())).expect("open embedded store")
}

#[tokio::test]
async fn a_restart_keeps_every_window_record_and_idempotency_key() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let limits = [
        sliding("lt:test:uid:r", 10 * SEC, 3),
        fixed("lt:test:fw:ip:r", 10 * SEC, 3),
        bucket("lt:test:tb:did:r", 10 * SEC, 3),
    ];
    {
        let store = open(dir.path(), &clock);
        allowed(store.as_ref(), &op("a", &limits)).await;
        clock.advance(1);
        allowed(store.as_ref(), &with_idem(op("b", &limits), "K")).await;
        store.flush().unwrap();
    }
    clock.advance(1);
    let store = open(dir.path(), &clock);
    assert_eq!(counts(store.as_ref(), &limits).await, [2, 2, 2]);
    // Records came back too: the same id is still a duplicate, the key still names b.
    assert_eq!(
        check(store.as_ref(), &op("a", &limits)).await,
        CheckOutcome::Duplicate { of: "a".into() }
    );
    assert_eq!(
        check(store.as_ref(), &with_idem(op("c", &limits), "K")).await,
        CheckOutcome::Duplicate { of: "b".into() }
    );
    // And refunds still work across the restart.
    assert!(store.refund(&refund_op("a", &limits)).await.unwrap());
    assert_eq!(counts(store.as_ref(), &limits).await, [1, 1, 1]);
    // Windows still end when they should: 10 s after b, everything has left.
    clock.set(T0 + 10 * SEC + 1);
    assert_eq!(counts(store.as_ref(), &limits).await, [0, 0, 0]);
}

#[tokio::test]
async fn state_expired_while_down_is_not_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let lim = [sliding("lt:test:uid:gone", SEC, 1)];
    {
        let store = open(dir.path(), &clock);
        allowed(store.as_ref(), &op("x", &lim)).await;
    }
    clock.advance(60 * SEC);
    let store = open(dir.path(), &clock);
    let stats = store.stats();
    assert_eq!(stats.keys, 0, "{stats:?}");
}

/// A campaign's worth of distinct users through a 1 s window, then silence: memory returns
/// to nothing, and once the store compacts, so do the files (the old generation is
/// removed whole). A second wave ends the same way: nothing accumulates with history.
#[tokio::test]
async fn a_million_users_through_a_one_second_window_then_the_store_shrinks_back() {
    const USERS: usize = 1_000_000;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = open(dir.path(), &clock);
    let idle_disk = store.stats().disk_bytes;
    for wave in 0..2 {
        for u in 0..USERS {
            // A thousand users per millisecond: the wave spans a second.
            if u % 1000 == 0 {
                clock.advance(1);
            }
            let lim = [sliding(&format!("lt:test:uid:{wave}-{u}"), SEC, 1)];
            let mut o = op(&format!("w{wave}-{u}"), &lim);
            o.record_ttl_ms = SEC;
            if !matches!(store.check(&o).await.unwrap(), CheckOutcome::Allowed { .. }) {
                panic!("user {u} denied");
            }
        }
        store.flush().unwrap();
        let full = store.stats();
        assert_eq!(full.keys, 2 * USERS, "a window and a record per user");
        clock.advance(10 * SEC);
        // What the reaper thread does every second: reap, then compact since the journal
        // now far outgrows the (empty) live state.
        store.maintain().unwrap();
        let empty = store.stats();
        eprintln!("wave {wave}: full {full:?}, after reaping and compacting {empty:?}");
        assert_eq!(
            (empty.keys, empty.weight, empty.journal_records),
            (0, 0, 0),
            "{empty:?}"
        );
        assert!(
            empty.disk_bytes < full.disk_bytes / 10,
            "the files did not shrink: {full:?} -> {empty:?}"
        );
        assert!(
            empty.disk_bytes < idle_disk + 4 * 1024 * 1024,
            "the files keep history: idle {idle_disk}, now {empty:?}"
        );
    }
}
