//! The actors for real: real threads and actix Systems, real sled in a tempdir.

use std::time::Instant;

use super::*;
use crate::behaviour::state::StateBounds;
use crate::clock::{ManualClock, SystemClock};
use crate::rules::{Behaviour, SignalRule};

const MIN: u64 = 60_000;
const T0: u64 = 1_700_000_000_000;

fn rule(window_ms: u64, max: u64) -> Option<SignalRule> {
    Some(SignalRule { window_ms, max })
}

/// Every signal over 10 minutes.
fn all_signals() -> Behaviour {
    Behaviour {
        accounts_per_device: rule(10 * MIN, 50),
        account_switches: rule(10 * MIN, 50),
        devices_per_user: rule(10 * MIN, 50),
        accounts_per_ip: rule(10 * MIN, 50),
    }
}

/// A deadline no healthy shard misses, even on a loaded machine: tests that are not about
/// the deadline must not be decided by it.
fn cfg(shards: usize, threads: usize) -> BehaviourConfig {
    BehaviourConfig {
        shards,
        threads,
        mailbox: 64,
        deadline_ms: 5_000,
        max_entities: 10_000,
        snapshot_every_ms: 3_600_000,
    }
}

struct Fixture {
    b: Behaviours,
    clock: ManualClock,
    metrics: Metrics,
}

fn start_at(cfg: &BehaviourConfig, dir: &Path) -> Fixture {
    let clock = ManualClock::new(T0);
    let metrics = Metrics::new();
    let b = Behaviours::start(cfg, dir, Arc::new(clock.clone()), metrics.clone())
        .expect("behaviours start");
    Fixture { b, clock, metrics }
}

fn obs<'a>(
    beh: &'a Behaviour,
    user: Option<&'a str>,
    device: Option<&'a str>,
    ip: Option<&'a str>,
) -> Observation<'a> {
    Observation {
        user,
        device,
        ip,
        behaviour: beh,
        bounds: StateBounds::from_behaviours([beh]),
        dry_run: false,
    }
}

async fn see(b: &Behaviours, beh: &Behaviour, user: &str, device: &str) -> Signals {
    let got = b
        .observe(obs(beh, Some(user), Some(device), Some("198.51.100.7")))
        .await;
    assert!(got.unanswered.is_empty(), "{:?}", got.unanswered);
    got.signals
}

fn metric(metrics: &Metrics, prefix: &str) -> i64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn handle_is_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Behaviours>();
}

#[tokio::test]
async fn device_farm_ten_users_on_one_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(&cfg(4, 2), dir.path());
    let beh = all_signals();
    let mut last = Signals::default();
    for i in 0..10 {
        f.clock.advance(1_000);
        last = see(&f.b, &beh, &format!("user-{i}"), "dev-farm").await;
    }
    assert_eq!(last.accounts_per_device, Some(10));
    assert_eq!(last.account_switches, Some(9));
    assert_eq!(last.accounts_per_ip, Some(10));
    assert_eq!(last.devices_per_user, Some(1));
    assert_eq!(f.b.entity_counts().await, (1, 10, 1));
    assert_eq!(
        metric(&f.metrics, "vigia_behaviour_entities{dimension=\"user\"}"),
        10
    );
}

/// Inside an actix System (as actix-web runs it): the shards live on their own Systems.
#[actix_web::test]
async fn account_switches_abab_is_three_and_leave_with_the_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(&cfg(2, 1), dir.path());
    let beh = Behaviour {
        account_switches: rule(10 * MIN, 2),
        ..Behaviour::default()
    };
    let mut last = Signals::default();
    for user in ["A", "B", "A", "B"] {
        f.clock.advance(MIN);
        last = see(&f.b, &beh, user, "dev-1").await;
    }
    assert_eq!(last.account_switches, Some(3));
    assert_eq!(last.accounts_per_device, None, "not configured");
    // Switches happened at T0+2m, +3m, +4m; at T0+12m the first is exactly out.
    f.clock.set(T0 + 12 * MIN);
    let again = see(&f.b, &beh, "B", "dev-1").await;
    assert_eq!(again.account_switches, Some(2), "B again is no switch");
}

#[tokio::test]
async fn devices_per_user_and_accounts_per_ip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(&cfg(3, 2), dir.path());
    let beh = Behaviour {
        devices_per_user: rule(10 * MIN, 2),
        accounts_per_ip: rule(10 * MIN, 3),
        ..Behaviour::default()
    };
    let mut last = Signals::default();
    for device in ["d1", "d2", "d3", "d1"] {
        last = see(&f.b, &beh, "alice", device).await;
    }
    assert_eq!(last.devices_per_user, Some(3));
    assert_eq!(last.accounts_per_ip, Some(1));
    for user in ["bob", "carol", "dave", "bob"] {
        last = see(&f.b, &beh, user, "d9").await;
    }
    assert_eq!(last.accounts_per_ip, Some(4));
    assert_eq!(last.accounts_per_device, None);
    assert_eq!(
        f.b.entity_counts().await,
        (0, 4, 1),
        "no device signal: no device entity"
    );
}

#[tokio::test]
async fn an_entry_leaves_exactly_when_it_is_window_old() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(&cfg(1, 1), dir.path());
    let beh = Behaviour {
        accounts_per_device: rule(1_000, 5),
        ..Behaviour::default()
    };
    f.clock.set(10_000);
    see(&f.b, &beh, "A", "dev").await;
    f.clock.set(10_999);
    assert_eq!(
        see(&f.b, &beh, "B", "dev").await.accounts_per_device,
        Some(2)
    );
    // A at 10_000 <= 11_000 - 1_000: out.
    f.clock.set(11_000);
    assert_eq!(
        see(&f.b, &beh, "C", "dev").await.accounts_per_device,
        Some(2)
    );
}

#[tokio::test]
async fn dry_run_records_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(&cfg(2, 1), dir.path());
    let beh = all_signals();
    let dry = |user| Observation {
        dry_run: true,
        ..obs(&beh, Some(user), Some("dev"), Some("203.0.113.1"))
    };
    let got = f.b.observe(dry("A")).await;
    assert_eq!(got.signals.accounts_per_device, Some(1), "as if recorded");
    assert_eq!(got.signals.devices_per_user, Some(1));
    assert_eq!(got.signals.accounts_per_ip, Some(1));
    assert_eq!(f.b.entity_counts().await, (0, 0, 0), "no entity created");
    assert_eq!(
        see(&f.b, &beh, "B", "dev").await.accounts_per_device,
        Some(1)
    );
    let got = f.b.observe(dry("C")).await;
    assert_eq!(got.signals.accounts_per_device, Some(2));
    assert_eq!(got.signals.account_switches, Some(1));
    let last = see(&f.b, &beh, "D", "dev").await;
    assert_eq!(
        last.accounts_per_device,
        Some(2),
        "B and D: neither A nor C"
    );
    assert_eq!(last.account_switches, Some(1));
    assert_eq!(f.b.entity_counts().await, (1, 2, 1));
}

#[tokio::test]
async fn no_message_when_no_signal_is_needed() {
    let dir = tempfile::tempdir().expect("tempdir");
    // One thread: stalling it stalls every shard, so any message would time out.
    let f = start_at(
        &BehaviourConfig {
            deadline_ms: 50,
            ..cfg(1, 1)
        },
        dir.path(),
    );
    f.b.stall("device", Duration::from_secs(2));
    let none = Behaviour::default();
    let got =
        f.b.observe(obs(&none, Some("u"), Some("d"), Some("ip")))
            .await;
    assert_eq!(got, Observed::default());
    let apd = Behaviour {
        accounts_per_device: rule(MIN, 1),
        devices_per_user: rule(MIN, 1),
        ..Behaviour::default()
    };
    let got = f.b.observe(obs(&apd, Some("u"), None, Some("ip"))).await;
    assert_eq!(got, Observed::default(), "no device id: nothing to ask");
    let ipb = Behaviour {
        accounts_per_ip: rule(MIN, 1),
        ..Behaviour::default()
    };
    let got = f.b.observe(obs(&ipb, None, Some("d"), Some("ip"))).await;
    assert_eq!(got, Observed::default(), "no user id: nothing to ask");
    // And the stalled thread really would have cost a deadline.
    let got = f.b.observe(obs(&ipb, Some("u"), None, Some("ip"))).await;
    assert_eq!(
        got.unanswered,
        vec![Unanswered {
            dimension: "ip",
            reason: "timeout"
        }]
    );
}

#[tokio::test]
async fn entity_cap_evicts_the_least_recently_seen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(
        &BehaviourConfig {
            max_entities: 2,
            ..cfg(1, 1)
        },
        dir.path(),
    );
    let beh = Behaviour {
        accounts_per_device: rule(10 * MIN, 9),
        ..Behaviour::default()
    };
    see(&f.b, &beh, "u1", "A").await;
    see(&f.b, &beh, "u1", "B").await;
    see(&f.b, &beh, "u2", "A").await;
    see(&f.b, &beh, "u1", "C").await;
    assert_eq!(f.b.entity_counts().await.0, 2);
    let gauge = "vigia_behaviour_entities{dimension=\"device\"}";
    assert_eq!(metric(&f.metrics, gauge), 2);
    let peek = |device| Observation {
        dry_run: true,
        ..obs(&beh, Some("u9"), Some(device), None)
    };
    let count = |o: Observed| o.signals.accounts_per_device;
    assert_eq!(count(f.b.observe(peek("B")).await), Some(1), "B is gone");
    assert_eq!(count(f.b.observe(peek("A")).await), Some(3), "u1, u2, u9");
    assert_eq!(count(f.b.observe(peek("C")).await), Some(2), "u1, u9");
    // The evicted device is removed from the snapshot too.
    f.b.snapshot().await.expect("snapshot");
    let tree = f.b.db().expect("db").open_tree("device").expect("tree");
    let key = |d: &str| entity_hash(d).to_be_bytes();
    assert!(tree.get(key("B")).expect("read").is_none());
    assert!(tree.get(key("A")).expect("read").is_some());
    assert!(tree.get(key("C")).expect("read").is_some());
}

/// A, B on dev1; restart on the same directory; C on dev1 sees three accounts.
async fn restart_keeps_signals(first: BehaviourConfig, second: BehaviourConfig) {
    let dir = tempfile::tempdir().expect("tempdir");
    let beh = all_signals();
    let f = start_at(&first, dir.path());
    see(&f.b, &beh, "A", "dev1").await;
    f.clock.advance(1_000);
    see(&f.b, &beh, "B", "dev1").await;
    see(&f.b, &beh, "B", "dev2").await;
    f.b.shutdown().await.expect("shutdown");
    // The directory is free again even while a handle lives on.
    let g = start_at(&second, dir.path());
    assert_eq!(
        metric(&g.metrics, "vigia_behaviour_entities{dimension=\"device\"}"),
        2,
        "the gauge counts restored entities"
    );
    g.clock.set(T0 + 2_000);
    let got = see(&g.b, &beh, "C", "dev1").await;
    assert_eq!(got.accounts_per_device, Some(3));
    assert_eq!(got.account_switches, Some(2), "A->B before, B->C now");
    assert_eq!(got.accounts_per_ip, Some(3));
    let got = see(&g.b, &beh, "B", "dev3").await;
    assert_eq!(got.devices_per_user, Some(3));
    assert_eq!(g.b.entity_counts().await, (3, 3, 1));
    drop(f);
}

#[tokio::test]
async fn restart_keeps_signals_same_shards() {
    restart_keeps_signals(cfg(4, 2), cfg(4, 2)).await;
}

#[tokio::test]
async fn restart_keeps_signals_with_another_shard_count() {
    restart_keeps_signals(cfg(4, 2), cfg(3, 1)).await;
    restart_keeps_signals(cfg(1, 1), cfg(7, 3)).await;
}

#[tokio::test]
async fn corrupt_snapshot_entries_are_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = sled::open(dir.path()).expect("sled");
        let devices = db.open_tree("device").expect("tree");
        let beh = all_signals();
        let mut good = DeviceState::new(&StateBounds::from_behaviours([&beh]));
        good.observe(entity_hash("X"), T0);
        devices
            .insert(entity_hash("dev1").to_be_bytes(), good.to_bytes())
            .expect("write");
        devices
            .insert(entity_hash("dev2").to_be_bytes(), &b"\x01Dgarbage"[..])
            .expect("write");
        devices.insert(b"short", good.to_bytes()).expect("write");
        db.open_tree("user")
            .expect("tree")
            .insert(entity_hash("X").to_be_bytes(), good.to_bytes())
            .expect("write: a device record in the user tree");
        db.flush().expect("flush");
    }
    let f = start_at(&cfg(2, 1), dir.path());
    assert_eq!(f.b.entity_counts().await, (1, 0, 0));
    let got = see(&f.b, &all_signals(), "Y", "dev1").await;
    assert_eq!(got.accounts_per_device, Some(2));
}

#[tokio::test]
async fn a_stalled_shard_costs_its_signal_not_the_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Two threads, one shard each: device and ip on thread 0, user on thread 1.
    let f = start_at(
        &BehaviourConfig {
            deadline_ms: 20,
            ..cfg(1, 2)
        },
        dir.path(),
    );
    let beh = Behaviour {
        accounts_per_device: rule(MIN, 1),
        devices_per_user: rule(MIN, 1),
        ..Behaviour::default()
    };
    // Warm up: threads scheduled, first messages handled.
    see(&f.b, &beh, "u0", "d0").await;
    f.b.stall("device", Duration::from_secs(3));
    let started = Instant::now();
    let got = f.b.observe(obs(&beh, Some("u1"), Some("d1"), None)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(took >= Duration::from_millis(20), "waited out the deadline");
    assert_eq!(
        got.unanswered,
        vec![Unanswered {
            dimension: "device",
            reason: "timeout"
        }]
    );
    assert_eq!(got.signals.accounts_per_device, None);
    assert_eq!(
        got.signals.devices_per_user,
        Some(1),
        "the user shard answered"
    );
    assert_eq!(
        metric(
            &f.metrics,
            "vigia_behaviour_unanswered_total{dimension=\"device\",reason=\"timeout\"}"
        ),
        1
    );
}

/// A full mailbox makes checks wait at most the deadline, and abandoned checks do not pile
/// up in a stalled shard's queue (their permits travel in their messages).
#[tokio::test]
async fn a_full_mailbox_bounds_the_wait_and_the_queue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(
        &BehaviourConfig {
            mailbox: 1,
            deadline_ms: 50,
            ..cfg(1, 1)
        },
        dir.path(),
    );
    let beh = Behaviour {
        accounts_per_device: rule(MIN, 1),
        ..Behaviour::default()
    };
    see(&f.b, &beh, "u0", "d0").await;
    f.b.stall("device", Duration::from_millis(1_500));
    let started = Instant::now();
    // One task per check, as actix-web runs them.
    let checks: Vec<_> = (0..20)
        .map(|i| {
            let (b, beh) = (f.b.clone(), beh.clone());
            tokio::spawn(async move {
                let user = format!("u{}", i + 1);
                b.observe(obs(&beh, Some(&user), Some("d0"), None)).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for check in checks {
        answers.push(check.await.expect("check task"));
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");
    for got in answers {
        assert_eq!(got.signals.accounts_per_device, None);
        assert_eq!(
            got.unanswered,
            vec![Unanswered {
                dimension: "device",
                reason: "timeout"
            }]
        );
    }
    assert_eq!(
        f.b.device_messages_queued(),
        1,
        "twenty checks gave up; one message holds the one place in the mailbox"
    );
    f.b.drain_devices().await;
    assert_eq!(f.b.device_messages_queued(), 0);
    // The abandoned message was skipped, not recorded: the device still has only u0.
    let peek = Observation {
        dry_run: true,
        ..obs(&beh, Some("u0"), Some("d0"), None)
    };
    assert_eq!(f.b.observe(peek).await.signals.accounts_per_device, Some(1));
}

#[tokio::test]
async fn after_shutdown_every_dimension_answers_mailbox_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(&cfg(2, 2), dir.path());
    let beh = all_signals();
    see(&f.b, &beh, "A", "dev").await;
    let clone = f.b.clone();
    f.b.shutdown().await.expect("shutdown");
    clone
        .shutdown()
        .await
        .expect("a second shutdown does nothing");
    let started = Instant::now();
    let got = clone
        .observe(obs(&beh, Some("A"), Some("dev"), Some("ip")))
        .await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "the deadline is 5 s"
    );
    assert_eq!(got.signals, Signals::default());
    let mailbox = |dimension| Unanswered {
        dimension,
        reason: "mailbox",
    };
    assert_eq!(
        got.unanswered,
        vec![mailbox("device"), mailbox("user"), mailbox("ip")]
    );
    assert!(matches!(
        clone.snapshot().await,
        Err(BehaviourError::Stopped)
    ));
    assert_eq!(clone.entity_counts().await, (0, 0, 0));
    assert_eq!(
        metric(&f.metrics, "vigia_behaviour_entities{dimension=\"device\"}"),
        0,
        "stopped shards hold nothing"
    );
}

/// Shards that died without a shutdown (the threads stopped) answer `mailbox`, not
/// `timeout`: the closed mailbox is seen at once, long before the deadline.
#[tokio::test]
async fn dead_shards_answer_mailbox_before_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(&cfg(2, 2), dir.path());
    let beh = all_signals();
    see(&f.b, &beh, "A", "dev").await;
    f.b.kill_threads().await;
    let started = Instant::now();
    let got = f.b.observe(obs(&beh, Some("A"), Some("dev"), None)).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "deadline is 5 s"
    );
    let reasons: Vec<_> = got.unanswered.iter().map(|u| u.reason).collect();
    assert_eq!(reasons, ["mailbox", "mailbox"]);
}

#[tokio::test]
async fn snapshot_writes_and_flushes_changed_entities() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(&cfg(2, 1), dir.path());
    let beh = all_signals();
    see(&f.b, &beh, "A", "dev").await;
    see(&f.b, &beh, "B", "dev").await;
    let db = f.b.db().expect("db");
    let tree = db.open_tree("device").expect("tree");
    assert!(tree.is_empty(), "nothing written before the snapshot");
    f.b.snapshot().await.expect("snapshot");
    let bytes = tree
        .get(entity_hash("dev").to_be_bytes())
        .expect("read")
        .expect("written");
    let dev = DeviceState::from_bytes(&bytes).expect("decodes");
    assert_eq!(dev.accounts(f.clock.now_ms(), MIN), 2);
    assert_eq!(db.open_tree("user").expect("tree").len(), 2);
    assert_eq!(db.open_tree("ip").expect("tree").len(), 1);
}

/// The timer, not `snapshot()`, writes: wait (bounded) for the periodic write.
#[tokio::test]
async fn shards_snapshot_on_their_own_timer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = start_at(
        &BehaviourConfig {
            snapshot_every_ms: 100,
            ..cfg(1, 1)
        },
        dir.path(),
    );
    see(&f.b, &all_signals(), "A", "dev").await;
    let tree = f.b.db().expect("db").open_tree("device").expect("tree");
    let key = entity_hash("dev").to_be_bytes();
    let until = Instant::now() + Duration::from_secs(10);
    while tree.get(key).expect("read").is_none() {
        assert!(Instant::now() < until, "no periodic snapshot within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn start_names_the_path_it_cannot_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("write");
    let err = Behaviours::start(&cfg(1, 1), &file, Arc::new(SystemClock), Metrics::new())
        .expect_err("a file is no sled directory");
    assert!(err.to_string().contains("not-a-dir"), "{err}");
}
