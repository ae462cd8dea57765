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

/// A request counted before 2026-12 has its record under `<prefix>:<scene>:req:<id>`, not
/// under its entity: a refund made after the upgrade still finds it there, once.
#[tokio::test]
async fn a_request_counted_before_records_moved_to_their_entity_is_still_refunded() {
    let clock = ManualClock::new(T0);
    let store = EmbeddedStore::in_memory(Arc::new(clock.clone()));
    let limits = [
        sliding("lt:test:uid:old", 10 * SEC, 3),
        fixed("lt:test:fw:ip:old", 10 * SEC, 3),
    ];
    let mut before = op("old", &limits);
    before.record_key = "lt:test:req:old".into();
    allowed(store.as_ref(), &before).await;
    let refund = refund_op("old", &limits);
    assert_ne!(refund.record_key, before.record_key);
    assert!(store.refund(&refund).await.expect("refund"));
    assert_eq!(counts(store.as_ref(), &limits).await, [0, 0]);
    assert!(!store.refund(&refund).await.expect("refund"), "once");
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

/// Checks keep counting while generations switch under them (what the reaper does when
/// the journal has grown): every allowed check is still there after a restart, in the
/// generation it was journaled to.
#[tokio::test]
async fn checks_during_compactions_all_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    // A fixed window too: its records are whole counts, so one replayed out of order
    // (taken before a switch, replayed after the snapshot) would show.
    let shared = [
        sliding("lt:test:uid:shared", 1000 * SEC, 1_000_000),
        fixed("lt:test:fw:shared", 1000 * SEC, 1_000_000),
    ];
    let store = open(dir.path(), &clock);
    let per_thread = 500;
    std::thread::scope(|s| {
        let shared = &shared;
        for t in 0..3 {
            let store = &store;
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                for i in 0..per_thread {
                    rt.block_on(allowed(store.as_ref(), &op(&format!("t{t}-{i}"), shared)));
                }
            });
        }
        let store = &store;
        s.spawn(move || {
            for _ in 0..20 {
                store.compact().unwrap();
            }
        });
    });
    drop(store);
    let store = open(dir.path(), &clock);
    assert_eq!(
        counts(store.as_ref(), &shared).await,
        [3 * per_thread as u64; 2]
    );
}

/// A crash in the middle of a journal write leaves a torn record at the end of the file:
/// the store opens, keeps every whole record before it, and counts on.
#[tokio::test]
async fn a_torn_journal_tail_costs_only_the_torn_record() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let lim = [sliding("lt:test:uid:torn", 100 * SEC, 10)];
    {
        let store = open(dir.path(), &clock);
        allowed(store.as_ref(), &op("a", &lim)).await;
        allowed(store.as_ref(), &op("b", &lim)).await;
        store.flush().unwrap();
    }
    let generation = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .max()
        .unwrap();
    let journal = generation.join("journal.log");
    let mut bytes = std::fs::read(&journal).unwrap();
    assert!(
        !bytes.is_empty(),
        "{} holds the two checks",
        journal.display()
    );
    // Half of a third record: its header promises more bytes than follow.
    bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3, 4, 5]);
    std::fs::write(&journal, &bytes).unwrap();
    let store = open(dir.path(), &clock);
    assert_eq!(counts(store.as_ref(), &lim).await, [2]);
    allowed(store.as_ref(), &op("c", &lim)).await;
    assert_eq!(counts(store.as_ref(), &lim).await, [3]);
}
