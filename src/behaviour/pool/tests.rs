//! The signal shards for real: real threads and actix Systems, real sled in a tempdir, a
//! manual clock. [`Behaviours::signals`] is asked as the embedded decider will ask it.

use std::time::Instant;

use super::*;
use crate::clock::{ManualClock, SystemClock};
use crate::rules::Count;
use crate::signal::{self, signal_cap};

const MIN: u64 = 60_000;
const T0: u64 = 1_700_000_000_000;

/// A deadline no healthy shard misses, even on a loaded machine.
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

impl Fixture {
    fn start(cfg: &BehaviourConfig, dir: &Path) -> Fixture {
        let clock = ManualClock::new(T0);
        let metrics = Metrics::new();
        let b = Behaviours::start(cfg, dir, Arc::new(clock.clone()), metrics.clone())
            .expect("behaviours start");
        Fixture { b, clock, metrics }
    }

    /// Records one check's signals, all applying, and answers their values.
    async fn check(&self, plans: &[SignalPlan]) -> Vec<SignalValue> {
        let applies = vec![true; plans.len()];
        self.ask(plans, &applies, false).await
    }

    async fn ask(&self, plans: &[SignalPlan], applies: &[bool], dry_run: bool) -> Vec<SignalValue> {
        self.b
            .signals(plans, applies, self.clock.now_ms(), dry_run)
            .await
            .expect("every shard answers")
    }

    /// One signal, recorded.
    async fn one(&self, plan: SignalPlan, applies: bool) -> SignalValue {
        self.ask(&[plan], &[applies], false).await[0]
    }

    /// One signal's value, as a dry run.
    async fn peek(&self, plan: SignalPlan) -> u64 {
        self.ask(&[plan], &[true], true).await[0].value
    }
}

/// The hash of a counted value, as the plan carries it.
fn hex(value: &str) -> String {
    format!("{:016x}", entity_hash(value))
}

/// `count` per `per` (the dimension values already in the key), counting `counted`: a
/// plan as the check path resolves it.
fn plan(
    name: &str,
    count: Count,
    per: &str,
    counted: &str,
    window_ms: u64,
    max: u64,
) -> SignalPlan {
    SignalPlan {
        name: name.into(),
        key: format!("vg:s:sg:{name}:{per}"),
        all_key: None,
        last_key: (count == Count::UserSwitches).then(|| format!("vg:s:sl:{name}:{per}")),
        count,
        member: match count {
            Count::Requests => counted.to_string(),
            _ => hex(counted),
        },
        filter: None,
        window_ms,
        max,
        min_share: None,
        cap: signal_cap(max, None),
    }
}

/// New accounts per network, firing at more than `max` when they are `min_share` of all.
fn new_on_net(net: &str, user: &str, max: u64, min_share: f64) -> SignalPlan {
    SignalPlan {
        all_key: Some(format!("vg:s:sa:new_on_net:{net}")),
        filter: Some(crate::rules::Filter::NewAccount),
        min_share: Some(min_share),
        cap: signal_cap(max, Some(min_share)),
        ..plan("new_on_net", Count::Users, net, user, 10 * MIN, max)
    }
}

fn users_on(device: &str, user: &str, window_ms: u64, max: u64) -> SignalPlan {
    plan(
        "users_per_device",
        Count::Users,
        device,
        user,
        window_ms,
        max,
    )
}

fn switches_on(device: &str, user: &str, window_ms: u64, max: u64) -> SignalPlan {
    plan(
        "switches",
        Count::UserSwitches,
        device,
        user,
        window_ms,
        max,
    )
}

fn metric(metrics: &Metrics, line: &str) -> i64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
        .unwrap_or(0)
}

/// One request as a check sees it.
struct Req<'a> {
    user: &'a str,
    device: &'a str,
    ip: &'a str,
    net: &'a str,
    id: &'a str,
}

/// Six signals of one scene, one per count, over four shards: answers come back in plan
/// order whichever shard holds them.
fn scene(r: &Req<'_>) -> Vec<SignalPlan> {
    let w = 10 * MIN;
    vec![
        plan("users_per_device", Count::Users, r.device, r.user, w, 9),
        plan("devices_per_user", Count::Devices, r.user, r.device, w, 9),
        plan("ips_per_user", Count::Ips, r.user, r.ip, w, 9),
        plan("nets_per_user", Count::Nets, r.user, r.net, w, 9),
        plan("requests_per_device", Count::Requests, r.device, r.id, w, 9),
        plan("switches", Count::UserSwitches, r.device, r.user, w, 9),
    ]
}

#[test]
fn handle_is_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Behaviours>();
}

#[tokio::test]
async fn every_count_counts_what_it_says_in_plan_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(4, 2), dir.path());
    let requests = [
        ("A", "ip1", "net1", "r1"),
        ("A", "ip2", "net1", "r2"),
        ("B", "ip3", "net2", "r3"),
        ("A", "ip1", "net1", "r4"),
    ];
    let mut values = Vec::new();
    for (user, ip, net, id) in requests {
        f.clock.advance(1_000);
        let r = Req {
            user,
            device: "d1",
            ip,
            net,
            id,
        };
        values.push(f.check(&scene(&r)).await);
    }
    let of = |i: usize| values.iter().map(|v| v[i].value).collect::<Vec<_>>();
    assert_eq!(of(0), [1, 1, 2, 2], "distinct users on d1");
    assert_eq!(of(1), [1, 1, 1, 1], "devices of A, then of B, then of A");
    assert_eq!(
        of(2),
        [1, 2, 1, 2],
        "ips of A: ip1, ip2; of B: ip3; A's ip1 again"
    );
    assert_eq!(of(3), [1, 1, 1, 1], "nets of A: net1 throughout");
    assert_eq!(of(4), [1, 2, 3, 4], "every request counts");
    assert_eq!(of(5), [0, 0, 1, 2], "A, A, B, A: two switches");
    assert!(values
        .iter()
        .flatten()
        .all(|v| v.applies && !v.fired && v.share.is_none()));
    // Keys: 6 per user or device touched (A's three, B's three, d1's three).
    assert_eq!(f.b.signal_entities().await, 9);
    assert_eq!(
        metric(&f.metrics, "vigia_behaviour_entities{dimension=\"signal\"}"),
        9
    );
}

#[tokio::test]
async fn a_member_counts_until_it_is_window_old() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(2, 1), dir.path());
    f.clock.set(10_000);
    f.one(users_on("dev", "A", 1_000, 5), true).await;
    f.clock.set(10_999);
    assert_eq!(f.one(users_on("dev", "B", 1_000, 5), true).await.value, 2);
    // A at 10_000 <= 11_000 - 1_000: out.
    f.clock.set(11_000);
    assert_eq!(f.one(users_on("dev", "C", 1_000, 5), true).await.value, 2);
    assert_eq!(
        f.one(users_on("dev", "B", 1_000, 5), true).await.value,
        2,
        "a repeat"
    );
}

#[tokio::test]
async fn a_saturated_count_stays_at_its_cap_and_fires() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(2, 1), dir.path());
    let mut last = None;
    for i in 0..50 {
        f.clock.advance(1);
        last = Some(
            f.one(users_on("farm", &format!("u{i}"), MIN, 3), true)
                .await,
        );
    }
    let last = last.expect("observed");
    assert_eq!(last.value, 4, "cap = max + 1");
    assert!(last.fired);
    let old = f.one(users_on("farm", "u0", MIN, 3), true).await;
    assert_eq!(old.value, 4, "u0 was evicted: new again, still capped");
}

#[tokio::test]
async fn a_signal_whose_filter_does_not_pass_neither_counts_nor_fires() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(2, 1), dir.path());
    f.one(users_on("dev", "A", MIN, 1), true).await;
    let got = f.one(users_on("dev", "B", MIN, 1), false).await;
    assert_eq!(
        got,
        SignalValue {
            applies: false,
            value: 0,
            share: None,
            fired: false
        }
    );
    let got = f.one(users_on("dev", "C", MIN, 1), true).await;
    assert_eq!(got.value, 2, "B was not counted");
    assert!(got.fired);
    let got = f.one(switches_on("dev", "A", MIN, 0), false).await;
    assert!(!got.applies && got.value == 0);
    assert_eq!(
        f.b.signal_entities().await,
        1,
        "a switch signal that never applied holds nothing"
    );
}

/// A network where twenty new accounts are nearly everyone fires; a campus where twenty
/// new accounts sign in among two hundred old ones, interleaved, does not.
#[tokio::test]
async fn min_share_tells_a_farm_from_a_campus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(3, 2), dir.path());
    let (max, share) = (10, 0.5);
    let mut farm = None;
    for i in 0..21 {
        f.clock.advance(1_000);
        if i % 7 == 0 {
            f.one(
                new_on_net("net-farm", &format!("old{i}"), max, share),
                false,
            )
            .await;
        }
        farm = Some(
            f.one(new_on_net("net-farm", &format!("new{i}"), max, share), true)
                .await,
        );
    }
    let farm = farm.expect("observed");
    assert_eq!(farm.value, 21);
    assert_eq!(farm.share, Some(signal::share(21, 24)));
    assert!(farm.fired);

    let mut campus = None;
    for i in 0..21 {
        for o in 0..10 {
            f.clock.advance(100);
            let old = format!("old{i}-{o}");
            let got = f
                .one(new_on_net("net-campus", &old, max, share), false)
                .await;
            assert!(!got.applies && got.share.is_none());
        }
        f.clock.advance(100);
        campus = Some(
            f.one(
                new_on_net("net-campus", &format!("new{i}"), max, share),
                true,
            )
            .await,
        );
    }
    let campus = campus.expect("observed");
    // The all set keeps the 44 most recent: the last four new accounts among 40 old
    // ones. What left the all set left the signal's set too.
    assert_eq!(signal_cap(max, Some(share)), 44);
    assert_eq!(campus.value, 4);
    assert_eq!(campus.share, Some(signal::share(4, 44)));
    assert!(!campus.fired);
}

#[tokio::test]
async fn switches_aaba_is_two_leave_with_the_window_and_ignore_other_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(2, 1), dir.path());
    let w = 10 * MIN;
    let mut values = Vec::new();
    for user in ["A", "A", "B", "A"] {
        f.clock.advance(MIN);
        values.push(f.one(switches_on("dev", user, w, 1), true).await);
    }
    assert_eq!(
        values.iter().map(|v| v.value).collect::<Vec<_>>(),
        [0, 0, 1, 2]
    );
    assert!(values[3].fired, "2 > max 1");
    // A request the filter does not pass changes nothing: C is not the last user.
    let other = f.one(switches_on("dev", "C", w, 1), false).await;
    assert!(!other.applies);
    assert_eq!(f.peek(switches_on("dev", "A", w, 1)).await, 2);
    // Switches at T0+3m and T0+4m; at T0+13m the first has left.
    f.clock.set(T0 + 13 * MIN);
    assert_eq!(f.one(switches_on("dev", "A", w, 1), true).await.value, 1);
    f.clock.set(T0 + 14 * MIN);
    assert_eq!(f.one(switches_on("dev", "A", w, 1), true).await.value, 0);
    // Silent for a window: the last user is forgotten, the next one is no switch.
    f.clock.set(T0 + 24 * MIN);
    assert_eq!(f.one(switches_on("dev", "B", w, 1), true).await.value, 0);
}

#[tokio::test]
async fn a_dry_run_answers_as_if_recorded_and_records_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(2, 1), dir.path());
    let r = |user, id| Req {
        user,
        device: "dev",
        ip: "ip",
        net: "net",
        id,
    };
    let plans = scene(&r("A", "r1"));
    let dry = f.ask(&plans, &[true; 6], true).await;
    assert_eq!(
        dry.iter().map(|v| v.value).collect::<Vec<_>>(),
        [1, 1, 1, 1, 1, 0]
    );
    assert_eq!(f.b.signal_entities().await, 0, "nothing created");
    let wet = f.check(&plans).await;
    assert_eq!(dry, wet, "the recording answers what the dry run did");
    f.b.snapshot().await.expect("snapshot");
    let tree = f.b.db().expect("db").open_tree("signal").expect("tree");
    let before: Vec<_> = tree.iter().collect::<Result<_, _>>().expect("read");
    f.clock.advance(1_000);
    let dry = f.ask(&scene(&r("B", "r2")), &[true; 6], true).await;
    assert_eq!(dry[0].value, 2);
    assert_eq!(dry[5].value, 1, "A -> B would be a switch");
    f.b.snapshot().await.expect("snapshot");
    let after: Vec<_> = tree.iter().collect::<Result<_, _>>().expect("read");
    assert_eq!(before, after, "nothing written");
    let again = f.check(&scene(&r("C", "r3"))).await;
    assert_eq!(again[0].value, 2, "A and C: B was never recorded");
    assert_eq!(again[5].value, 1, "A -> C");
}

/// Two devices' users and switches and a network's share, written by one run and read by
/// the next.
async fn restart_keeps_signals(first: BehaviourConfig, second: BehaviourConfig) {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&first, dir.path());
    let w = 10 * MIN;
    for (user, device) in [("A", "d1"), ("B", "d1"), ("A", "d2")] {
        f.clock.advance(1_000);
        f.check(&[
            users_on(device, user, w, 9),
            switches_on(device, user, w, 9),
        ])
        .await;
    }
    f.one(new_on_net("net", "new1", 1, 0.5), true).await;
    f.one(new_on_net("net", "old1", 1, 0.5), false).await;
    f.b.shutdown().await.expect("shutdown");

    let g = Fixture::start(&second, dir.path());
    assert_eq!(
        metric(&g.metrics, "vigia_behaviour_entities{dimension=\"signal\"}"),
        5,
        "the gauge counts restored signal keys"
    );
    g.clock.set(T0 + 10_000);
    let got = g
        .check(&[users_on("d1", "C", w, 9), switches_on("d1", "C", w, 9)])
        .await;
    assert_eq!(got[0].value, 3, "A, B and C on d1");
    assert_eq!(got[1].value, 2, "A->B before, B->C now");
    let got = g.check(&[switches_on("d2", "B", w, 9)]).await;
    assert_eq!(
        got[0].value, 1,
        "d2's last user, A, was restored: B is a switch"
    );
    let got = g.one(new_on_net("net", "new2", 1, 0.5), true).await;
    assert_eq!(got.value, 2);
    assert_eq!(got.share, Some(signal::share(2, 3)));
    assert!(got.fired);
    assert_eq!(g.b.signal_entities().await, 5);
    drop(f);
}

#[tokio::test]
async fn a_restart_restores_signals_from_the_snapshot() {
    restart_keeps_signals(cfg(4, 2), cfg(4, 2)).await;
}

#[tokio::test]
async fn a_restart_restores_signals_with_another_shard_count() {
    restart_keeps_signals(cfg(4, 2), cfg(3, 1)).await;
    restart_keeps_signals(cfg(1, 1), cfg(7, 3)).await;
}

#[tokio::test]
async fn corrupt_signal_snapshot_entries_are_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = sled::open(dir.path()).expect("sled");
        let tree = db.open_tree("signal").expect("tree");
        let mut good = SignalState::new();
        let spec = SignalSpec::of(&users_on("d1", "X", MIN, 9));
        good.observe(&spec, member_of(&hex("X")), true, T0);
        let key = |k: &str| entity_hash(k).to_be_bytes();
        tree.insert(key("vg:s:sg:users_per_device:d1"), good.to_bytes())
            .expect("write");
        tree.insert(key("vg:s:sg:users_per_device:d2"), &b"\x02dgarbage"[..])
            .expect("write");
        tree.insert(b"short", good.to_bytes()).expect("write");
        db.flush().expect("flush");
    }
    let f = Fixture::start(&cfg(2, 1), dir.path());
    assert_eq!(f.b.signal_entities().await, 1);
    f.clock.set(T0 + 1);
    assert_eq!(f.one(users_on("d1", "Y", MIN, 9), true).await.value, 2);
}

#[tokio::test]
async fn the_entity_cap_evicts_the_least_recently_seen_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(
        &BehaviourConfig {
            max_entities: 2,
            ..cfg(1, 1)
        },
        dir.path(),
    );
    let w = 10 * MIN;
    f.one(users_on("A", "u1", w, 9), true).await;
    f.one(users_on("B", "u1", w, 9), true).await;
    f.one(users_on("A", "u2", w, 9), true).await;
    f.one(users_on("C", "u1", w, 9), true).await;
    assert_eq!(f.b.signal_entities().await, 2);
    assert_eq!(
        metric(&f.metrics, "vigia_behaviour_entities{dimension=\"signal\"}"),
        2
    );
    assert_eq!(f.peek(users_on("B", "u9", w, 9)).await, 1, "B is gone");
    assert_eq!(f.peek(users_on("A", "u9", w, 9)).await, 3, "u1, u2, u9");
    assert_eq!(f.peek(users_on("C", "u9", w, 9)).await, 2, "u1, u9");
    f.b.snapshot().await.expect("snapshot");
    let tree = f.b.db().expect("db").open_tree("signal").expect("tree");
    let key = |d: &str| entity_hash(&users_on(d, "-", w, 9).key).to_be_bytes();
    assert!(
        tree.get(key("B")).expect("read").is_none(),
        "removed from sled too"
    );
    assert!(tree.get(key("A")).expect("read").is_some());
    assert!(tree.get(key("C")).expect("read").is_some());
}

#[tokio::test]
async fn a_stalled_shard_fails_the_ask_within_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(
        &BehaviourConfig {
            deadline_ms: 30,
            ..cfg(1, 1)
        },
        dir.path(),
    );
    // Warm up: the thread scheduled, a first message handled.
    f.one(users_on("d0", "u0", MIN, 1), true).await;
    f.b.stall(Duration::from_secs(3));
    let started = Instant::now();
    let got =
        f.b.signals(&[users_on("d1", "u1", MIN, 1)], &[true], T0, false)
            .await;
    let took = started.elapsed();
    assert_eq!(
        got,
        Err(Unanswered {
            dimension: "signal",
            reason: "timeout"
        })
    );
    assert!(took >= Duration::from_millis(30), "waited out the deadline");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(
        metric(
            &f.metrics,
            "vigia_behaviour_unanswered_total{dimension=\"signal\",reason=\"timeout\"}"
        ),
        1
    );
}

/// However many of a check's signals a shard holds, it gets one message; a full mailbox
/// bounds the wait and the queue (abandoned messages do not pile up).
#[tokio::test]
async fn one_message_per_shard_and_a_full_mailbox_bounds_the_queue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(
        &BehaviourConfig {
            mailbox: 2,
            deadline_ms: 50,
            ..cfg(1, 1)
        },
        dir.path(),
    );
    f.one(users_on("d0", "u0", MIN, 1), true).await;
    f.b.stall(Duration::from_millis(1_500));
    let r = Req {
        user: "u1",
        device: "d0",
        ip: "ip",
        net: "net",
        id: "r1",
    };
    let plans = scene(&r);
    let got = f.b.signals(&plans, &[true; 6], T0, false).await;
    assert!(matches!(
        got,
        Err(Unanswered {
            reason: "timeout",
            ..
        })
    ));
    assert_eq!(
        f.b.messages_queued(),
        1,
        "six signals, one shard, one message"
    );
    let started = Instant::now();
    let checks: Vec<_> = (0..10)
        .map(|i| {
            let b = f.b.clone();
            tokio::spawn(async move {
                let user = format!("u{}", i + 2);
                b.signals(&[users_on("d0", &user, MIN, 1)], &[true], T0, false)
                    .await
            })
        })
        .collect();
    for check in checks {
        let got = check.await.expect("check task");
        assert!(matches!(
            got,
            Err(Unanswered {
                reason: "timeout",
                ..
            })
        ));
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(
        f.b.messages_queued(),
        2,
        "the mailbox's two places, no more"
    );
    f.b.drain().await;
    assert_eq!(f.b.messages_queued(), 0);
    // Abandoned messages were skipped, not recorded: d0 still has only u0.
    f.clock.set(T0 + 1);
    assert_eq!(f.peek(users_on("d0", "u0", MIN, 1)).await, 1);
}

#[tokio::test]
async fn after_shutdown_the_ask_fails_with_mailbox_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(2, 2), dir.path());
    f.one(users_on("dev", "A", MIN, 1), true).await;
    let clone = f.b.clone();
    f.b.shutdown().await.expect("shutdown");
    let started = Instant::now();
    let got = clone
        .signals(&[users_on("dev", "B", MIN, 1)], &[true], T0, false)
        .await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "the deadline is 5 s"
    );
    assert_eq!(
        got,
        Err(Unanswered {
            dimension: "signal",
            reason: "mailbox"
        })
    );
    assert_eq!(
        clone.signals(&[], &[], T0, false).await,
        Ok(vec![]),
        "no plan, no ask"
    );
    assert_eq!(clone.signal_entities().await, 0);
    assert_eq!(
        metric(
            &f.metrics,
            "vigia_behaviour_unanswered_total{dimension=\"signal\",reason=\"mailbox\"}"
        ),
        1
    );
}

#[tokio::test]
async fn dead_signal_shards_answer_mailbox_before_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(2, 2), dir.path());
    f.one(users_on("dev", "A", MIN, 1), true).await;
    f.b.kill_threads().await;
    let started = Instant::now();
    let got =
        f.b.signals(&[users_on("dev", "B", MIN, 1)], &[true], T0, false)
            .await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "deadline is 5 s"
    );
    assert!(matches!(
        got,
        Err(Unanswered {
            reason: "mailbox",
            ..
        })
    ));
}

/// Hosted on the caller's System (`vigia simulate`): the same answers.
#[actix_web::test]
async fn signals_work_on_the_callers_system() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new(T0);
    let b = Behaviours::start_local(
        &cfg(3, 1),
        dir.path(),
        Arc::new(clock.clone()),
        Metrics::new(),
    )
    .expect("start_local");
    let mut values = Vec::new();
    for user in ["A", "B", "A"] {
        clock.advance(1_000);
        let got = b
            .signals(
                &[users_on("d", user, MIN, 1), switches_on("d", user, MIN, 1)],
                &[true, true],
                clock.now_ms(),
                false,
            )
            .await
            .expect("answered");
        values.push((got[0].value, got[1].value));
    }
    assert_eq!(values, [(1, 0), (2, 1), (2, 2)]);
    b.shutdown().await.expect("shutdown");
}

/// Inside an actix System (as actix-web runs it), `start` still hosts the shards on
/// threads of their own.
#[actix_web::test]
async fn signals_work_inside_the_callers_system_on_their_own_threads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(2, 2), dir.path());
    let mut values = Vec::new();
    for user in ["A", "B", "A"] {
        f.clock.advance(1_000);
        values.push(f.one(switches_on("d", user, MIN, 1), true).await.value);
    }
    assert_eq!(values, [0, 1, 2]);
    f.b.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn snapshot_writes_and_flushes_changed_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(&cfg(2, 1), dir.path());
    f.one(users_on("dev", "A", MIN, 9), true).await;
    f.one(users_on("dev", "B", MIN, 9), true).await;
    let db = f.b.db().expect("db");
    let tree = db.open_tree(DIMENSION).expect("tree");
    assert!(tree.is_empty(), "nothing written before the snapshot");
    f.b.snapshot().await.expect("snapshot");
    let key = entity_hash(&users_on("dev", "-", MIN, 9).key).to_be_bytes();
    let bytes = tree.get(key).expect("read").expect("written");
    let dev = SignalState::from_bytes(&bytes).expect("decodes");
    assert_eq!(dev.len(), 2);
    assert_eq!(tree.len(), 1);
}

/// The timer, not `snapshot()`, writes: wait (bounded) for the periodic write.
#[tokio::test]
async fn shards_snapshot_on_their_own_timer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = Fixture::start(
        &BehaviourConfig {
            snapshot_every_ms: 100,
            ..cfg(1, 1)
        },
        dir.path(),
    );
    f.one(users_on("dev", "A", MIN, 9), true).await;
    let tree = f.b.db().expect("db").open_tree(DIMENSION).expect("tree");
    let key = entity_hash(&users_on("dev", "-", MIN, 9).key).to_be_bytes();
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

/// A `tracing` writer into a shared buffer, to read what a test logged.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A data folder written before signals replaced the per-device, per-user and per-IP
/// state: its trees are dropped on open, in one log line, and the signal tree is restored
/// as always.
#[tokio::test]
async fn retired_trees_are_dropped_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let signal_key = users_on("d1", "-", MIN, 9).key;
    {
        let db = sled::open(dir.path()).expect("sled");
        for name in RETIRED_TREES {
            let tree = db.open_tree(name).expect("tree");
            tree.insert(entity_hash("dev1").to_be_bytes(), &b"\x01Dold"[..])
                .expect("write");
        }
        let mut good = SignalState::new();
        let spec = SignalSpec::of(&users_on("d1", "X", MIN, 9));
        good.observe(&spec, member_of(&hex("X")), true, T0);
        db.open_tree(DIMENSION)
            .expect("tree")
            .insert(entity_hash(&signal_key).to_be_bytes(), good.to_bytes())
            .expect("write");
        db.flush().expect("flush");
    }
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_ansi(false)
        .finish();
    let f =
        tracing::subscriber::with_default(subscriber, || Fixture::start(&cfg(2, 1), dir.path()));
    let logged = String::from_utf8(lock(&logs.0).clone()).expect("utf-8");
    let lines: Vec<&str> = logged.lines().filter(|l| l.contains("retired")).collect();
    assert_eq!(lines.len(), 1, "{logged}");
    assert!(
        lines[0].contains(r#"["device", "user", "ip"]"#),
        "names them: {logged}"
    );
    let names =
        |db: &sled::Db| -> Vec<Vec<u8>> { db.tree_names().iter().map(|n| n.to_vec()).collect() };
    let held = names(&f.b.db().expect("db"));
    for name in RETIRED_TREES {
        assert!(!held.contains(&name.as_bytes().to_vec()), "{name} is gone");
    }
    assert_eq!(f.b.signal_entities().await, 1, "the signal tree is kept");
    f.clock.set(T0 + 1);
    assert_eq!(f.one(users_on("d1", "Y", MIN, 9), true).await.value, 2);
    f.b.shutdown().await.expect("shutdown");
    // Gone for good: the next open finds nothing to drop.
    let db = open_db(dir.path()).expect("sled");
    let held = names(&db);
    for name in RETIRED_TREES {
        assert!(
            !held.contains(&name.as_bytes().to_vec()),
            "{name} stays gone"
        );
    }
}
