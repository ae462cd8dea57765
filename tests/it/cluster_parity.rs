//! The cluster decider answers as one Redis does: the same checks, built from real rule
//! files, sent one by one to a [`RedisDecider`] on one `redis-server` and to a
//! [`ClusterDecider`] on a local 3-master cluster, under one manual clock, get the same
//! [`Decided`] — facts, every signal's value and share, the score, every limit's max and
//! count, repeats — check after check. The workload mixes honest users, a farm (many new
//! accounts on one device and one network), repeats, idempotent retries under new request
//! ids, dry runs, trust awards and time passing.
//!
//! After each cluster check the test waits for its releases ([`ClusterDecider::settled`]):
//! a denied check's reservations are given back off the answer's path, and until then a
//! cluster may deny what one Redis admits (never the reverse; `cluster.rs` tests that
//! under concurrency). Settled, the two must agree exactly.

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::common::{RedisCluster, RedisServer};
use vigia::check::plan::plan;
use vigia::check::request::parse_check;
use vigia::clock::{Clock, ManualClock};
use vigia::decide::cluster::ClusterDecider;
use vigia::decide::redis::RedisDecider;
use vigia::decide::{Decided, Decider, Outcome};
use vigia::keys::KeyPrefix;
use vigia::metrics::Metrics;
use vigia::rules::{load_dir, RuleSet};
use vigia::store::breaker::{Breaker, BreakerSettings};
use vigia::store::redis::RedisStore;
use vigia::trust::{Award, AwardKind, RedisLedger, TrustLedger};

const TIMEOUT_MS: u64 = 2_000;
const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;

/// One side of the comparison: a decider and its trust ledger.
struct Side {
    prefix: KeyPrefix,
    decider: Arc<dyn Decider>,
    ledger: RedisLedger,
    cluster: Option<Arc<ClusterDecider>>,
}

impl Side {
    async fn single(server: &RedisServer, clock: &ManualClock) -> Side {
        let store = RedisStore::connect(&server.url(), TIMEOUT_MS)
            .await
            .expect("connect to redis-server");
        Self::on(store, KeyPrefix::plain("lt"), clock, false).await
    }

    async fn cluster(cluster: &RedisCluster, clock: &ManualClock) -> Side {
        let breaker = Arc::new(Breaker::new("redis", BreakerSettings::default(), None));
        let store = RedisStore::connect_cluster_with(&cluster.url_list(), TIMEOUT_MS, breaker)
            .await
            .expect("connect to the cluster");
        Self::on(store, KeyPrefix::tagged("lt"), clock, true).await
    }

    async fn on(store: RedisStore, prefix: KeyPrefix, clock: &ManualClock, cluster: bool) -> Side {
        let link = store.link();
        let clock: Arc<dyn Clock> = Arc::new(clock.clone());
        let ledger = RedisLedger::new(link.clone(), &prefix)
            .await
            .expect("trust ledger")
            .with_clock(clock.clone());
        let (decider, cluster): (Arc<dyn Decider>, _) = if cluster {
            let d = Arc::new(
                ClusterDecider::new(link, Some(clock), Metrics::new())
                    .await
                    .expect("cluster decider"),
            );
            (d.clone(), Some(d))
        } else {
            let d = RedisDecider::new(link, Some(clock), Metrics::new())
                .await
                .expect("redis decider");
            (Arc::new(d), None)
        };
        Side {
            prefix,
            decider,
            ledger,
            cluster,
        }
    }

    async fn decide(&self, rules: &RuleSet, body: &Value, now: u64) -> Decided {
        let req = parse_check(rules, body, now).expect("a valid check");
        let (plan, _) = plan(&self.prefix, rules, &req, DAY);
        let decided = self
            .decider
            .decide(&plan)
            .await
            .unwrap_or_else(|e| panic!("{body}: {e}"));
        if let Some(cluster) = &self.cluster {
            cluster.settled().await;
        }
        decided
    }
}

/// A deterministic stream of small numbers (a 64-bit LCG): the same workload every run.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// What the workload produced, so a run that never denied (say) cannot pass unnoticed.
#[derive(Debug, Default)]
struct Seen {
    allow: u32,
    limit_deny: u32,
    score_deny: u32,
    challenge: u32,
    duplicate: u32,
    fired: u32,
    new_account: u32,
    trusted: u32,
}

impl Seen {
    fn add(&mut self, d: &Decided) {
        match d {
            Decided::Duplicate { .. } => self.duplicate += 1,
            // One Redis never holds (it has no reservations); the answers are compared first.
            Decided::Held { of } => panic!("held by {of}, though every attempt was settled"),
            Decided::Judged(j) => {
                match j.outcome {
                    Outcome::Allowed { .. } => self.allow += 1,
                    Outcome::Denied { .. } => self.limit_deny += 1,
                    Outcome::ScoreDeny => self.score_deny += 1,
                    Outcome::Challenged { .. } => self.challenge += 1,
                }
                self.fired += j.signals.iter().filter(|s| s.fired).count() as u32;
                self.new_account += u32::from(j.facts.new_account == Some(true));
                self.trusted += u32::from(j.facts.points > 0);
            }
        }
    }
}

/// `n` checks of `scene` on both sides, compared one by one.
async fn compare(rules_dir: &Path, scene: &str, n: usize, seed: u64) -> Seen {
    let rules = load_dir(rules_dir).expect("rules load");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64;
    // Awards expire on Redis's own clock: the manual clock starts at the real time.
    let clock = ManualClock::new(now);
    let server = RedisServer::start();
    let cluster = RedisCluster::start();
    let one = Side::single(&server, &clock).await;
    let many = Side::cluster(&cluster, &clock).await;

    let mut dice = Dice(seed);
    let mut sent: Vec<Value> = Vec::new();
    let mut seen = Seen::default();
    let at = |t: u64| {
        chrono::DateTime::from_timestamp_millis(t as i64)
            .expect("a date")
            .to_rfc3339()
    };
    for i in 0..n {
        let t = clock.now_ms();
        let body = match dice.roll(20) {
            // A repeat of an earlier check, as sent.
            0 | 1 if !sent.is_empty() => sent[dice.roll(sent.len() as u64) as usize].clone(),
            // An idempotent retry under a new request id.
            2 if !sent.is_empty() => {
                let mut b = sent[dice.roll(sent.len() as u64) as usize].clone();
                b["request_id"] = json!(format!("retry-{i}"));
                b
            }
            // The farm: new accounts rotating on one device, from one network; a third
            // of them say they were created an hour ago (their age is then reckoned in
            // every slot that needs it, in one round).
            3..=8 => {
                let u = dice.roll(30);
                let mut b = json!({
                    "user_id": format!("farm-{u}"),
                    "device_id": "farm-device-01",
                    "ip": format!("203.0.113.{}", dice.roll(4)),
                });
                if u % 3 == 0 {
                    b["user_created_at"] = json!(at(t - HOUR));
                }
                b
            }
            // Honest users: their own device, addresses spread over a few networks;
            // half of them say when they were created.
            _ => {
                let u = dice.roll(16);
                let mut b = json!({
                    "user_id": format!("user-{u}"),
                    "device_id": format!("phone-{u:04}-{}", dice.roll(2)),
                    "ip": format!("198.51.{}.{}", 100 + u % 3, u),
                });
                if u % 2 == 0 {
                    b["user_created_at"] = json!(at(t - 90 * DAY));
                }
                b
            }
        };
        let mut body = body;
        if body.get("request_id").is_none() {
            body["scene"] = json!(scene);
            body["request_id"] = json!(format!("r{i}"));
            if dice.roll(8) == 0 {
                body["idempotency_key"] = json!(format!("k{i}"));
            }
            if dice.roll(12) == 0 {
                body["dry_run"] = json!(true);
            }
            sent.push(body.clone());
        }
        let a = one.decide(&rules, &body, t).await;
        let b = many.decide(&rules, &body, t).await;
        assert_eq!(a, b, "check {i} at +{} ms: {body}", t - now);
        seen.add(&a);

        // Now and then a payment earns an honest user a point, on both.
        if dice.roll(10) == 0 {
            let award = Award {
                event_id: format!("pay-{i}"),
                user_id: format!("user-{}", dice.roll(16)),
                kind: AwardKind::PaymentSucceeded,
                points: 1,
                expires_at_ms: t + DAY,
            };
            one.ledger.award(&award).await.expect("award on one Redis");
            many.ledger
                .award(&award)
                .await
                .expect("award on the cluster");
        }
        clock.advance(match dice.roll(40) {
            0 => 11 * 60_000,
            1 => 2 * HOUR,
            _ => dice.roll(2_500),
        });
    }
    seen
}

/// The shipped coupon_claim: five slot groups, two rounds (the network's and the scene's
/// new-account signals wait for the user's age), one when the request gives the user's
/// creation date.
#[actix_web::test]
async fn the_cluster_decides_the_shipped_coupon_claim_as_one_redis_does() {
    let seen = compare(Path::new("rules"), "coupon_claim", 400, 7).await;
    println!("{seen:?}");
    assert!(
        seen.allow > 0
            && seen.limit_deny > 0
            && seen.score_deny > 0
            && seen.challenge > 0
            && seen.duplicate > 0
            && seen.new_account > 0
            && seen.trusted > 0,
        "the workload covers every outcome: {seen:?}"
    );
}

/// Facts that cross slots every way: a per-user limit and a new-accounts-only bucket in
/// the address's slot, a trust bonus in the device's, an untrusted signal in the
/// network's, and the user's and device's slots each needing the other's age (the facts
/// are read first, then every group runs at once).
#[actix_web::test]
async fn facts_read_in_one_slot_decide_signals_and_limits_in_others_as_on_one_redis() {
    let dir = tempfile::tempdir().expect("rules dir");
    std::fs::write(
        dir.path().join("facts.toml"),
        include_str!("../fixtures/cluster/facts.toml"),
    )
    .expect("rules file");
    let seen = compare(dir.path(), "facts", 300, 11).await;
    println!("{seen:?}");
    assert!(
        seen.allow > 0
            && seen.limit_deny > 0
            && seen.score_deny > 0
            && seen.duplicate > 0
            && seen.fired > 0
            && seen.trusted > 0,
        "the workload covers every outcome: {seen:?}"
    );
}
