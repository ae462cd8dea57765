//! One behaviour suite for every [`Decider`]: what a check learns (trust points, first
//! sightings), what its signals count, how it scores, and how its limits hold, as a user
//! of the service would notice them. Every case runs on the Redis decider (`lua/decide.lua`
//! on a throwaway `redis-server` per test), on the cluster decider (a throwaway cluster of
//! 3 masters and 3 replicas per test, every limit and signal placed in a slot of its own, so
//! one check spans many slot groups and rounds) and on the embedded decider (sled ledger,
//! behaviour actors, embedded window store — journaled, and in memory), through
//! [`on_every_decider!`] and the arms of [`Env`]: the deciders give the same answers.
//!
//! Cases say what a user of the service would notice. Where that cannot show what matters
//! (a set's memory bound, what a dry run left behind) they look inside through [`Env`]'s
//! read-only inspection, which each arm answers from its own store.
//!
//! Cases move a [`ManualClock`] (never sleep). It starts at [`t0`], the current hour:
//! trust awards expire with PEXPIREAT in Redis's own clock, so the manual clock must stay
//! near the real time for an award to live as long as the test needs it. (For the same
//! reason no case lets a request record or a sighting outlive its TTL: on Redis those
//! expire on Redis's clock only.)
//!
//! Redis-only behaviour (one EVALSHA per check, NOSCRIPT, key names, expiries and the
//! request record's format) is at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use vigia::behaviour::signal::SignalState;
use vigia::behaviour::Behaviours;
use vigia::clock::{Clock, ManualClock};
use vigia::config::BehaviourConfig;
use vigia::decide::cluster::ClusterDecider;
use vigia::decide::embedded::EmbeddedDecider;
use vigia::decide::math::{effective_max, score as math_score};
use vigia::decide::redis::RedisDecider;
use vigia::decide::{
    CheckPlan, Decided, Decider, Judgement, LimitPlan, LimitValue, Outcome, PassScopes, ScorePlan,
    SignalPlan, SignalValue, TrustPlan,
};
use vigia::keys::KeyPrefix;
use vigia::metrics::Metrics;
use vigia::rules::{Algorithm, Count, Filter};
use vigia::signal::entity_hash;
use vigia::signal::signal_cap;
use vigia::store::embedded::EmbeddedStore;
use vigia::store::redis::{record_tag, RedisStore};
use vigia::store::{LimitState, RefundOp, WindowStore, EXPIRY_MARGIN_MS};
use vigia::trust::ledger::{pass_id, pass_scope};
use vigia::trust::{journal, Award, AwardKind, RedisLedger, SledLedger, TrustLedger};

use crate::common::{RedisCluster, RedisServer};
use crate::store_suite::{
    redis_evalsha_calls, redis_keys, redis_non_evalsha_script_calls, redis_pttl, redis_zcard, DAY,
    SEC, TEST_TIMEOUT_MS,
};
use vigia::store::breaker::{Breaker, BreakerSettings};

const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;
/// The prefix of every key (trust keys: `<PREFIX>:trust-points:…`).
const PREFIX: &str = "vg";
/// The scene's key prefix (`<prefix>:<scene>`).
const SCENE: &str = "vg:t";
/// The scene's name.
const SCENE_NAME: &str = "t";
/// `[trust]` of every plan with trust, unless a case changes it.
const SEEN_TTL: u64 = 30 * DAY;
const YOUNGER_THAN: u64 = 7 * DAY;
const NEW_FACTOR: f64 = 0.5;
const NEW_DEVICE: u64 = DAY;
const MAX_POINTS: u32 = 5;
const BONUS: u32 = 2;
const DISCOUNT: f64 = 0.1;
/// An expiry no write of a decider would choose (see [`Env::freeze_ttls`]).
const FROZEN_TTL_MS: u64 = 4_321_987;

/// The current hour, once per run: the start of every case's clock.
fn t0() -> u64 {
    static T0: OnceLock<u64> = OnceLock::new();
    *T0.get_or_init(|| {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as u64;
        now - now % HOUR
    })
}

/// A user created long ago (never new).
fn long_ago() -> u64 {
    t0() - 100 * DAY
}

/// A user created an hour before t0 (new for a week).
fn recently() -> u64 {
    t0() - HOUR
}

// ---------------------------------------------------------------------------------------
// Building plans
// ---------------------------------------------------------------------------------------

fn points_key(user: &str) -> String {
    format!("{PREFIX}:trust-points:uid:{user}")
}

fn user_seen_key(user: &str) -> String {
    format!("{PREFIX}:user-seen:uid:{user}")
}

fn device_seen_key(device: &str) -> String {
    format!("{PREFIX}:device-seen:did:{device}")
}

fn record_key(id: &str) -> String {
    format!("{SCENE}:req:{id}")
}

/// Where Redis keeps the suite's request records (the plans name no entity of their own).
fn records_key() -> String {
    format!("{SCENE}:rq:all")
}

/// The request's record on Redis: a field of the records hash of the generation `at` falls
/// in (every plan of the suite has a record TTL of an hour).
fn redis_record(server: &RedisServer, id: &str, at: u64) -> Option<String> {
    redis::cmd("HGET")
        .arg(format!("{}:{}", records_key(), at / HOUR))
        .arg(id)
        .query(&mut server.conn())
        .expect("HGET")
}

/// A check with nothing to read, count or limit.
fn check(id: &str) -> CheckPlan {
    CheckPlan {
        record_key: record_key(id),
        records_key: records_key(),
        idempotency_key: None,
        request_id: id.to_string(),
        id_given: true,
        record_ttl_ms: HOUR,
        dry_run: false,
        trust: None,
        signals: Vec::new(),
        score: None,
        limits: Vec::new(),
    }
}

/// `[trust]` with nobody to read.
fn trust() -> TrustPlan {
    TrustPlan {
        points_key: None,
        user_seen_key: None,
        device_seen_key: None,
        user_created_ms: None,
        seen_ttl_ms: SEEN_TTL,
        max_points: MAX_POINTS,
        bonus_per_point: BONUS,
        discount_per_point: DISCOUNT,
        new_account: Some((YOUNGER_THAN, NEW_FACTOR)),
        new_device_ms: Some(NEW_DEVICE),
        passes: None,
    }
}

/// Chained changes to a plan: `check("r1").user("ann").signal(s).limit(l)`.
trait PlanExt: Sized {
    fn plan(&mut self) -> &mut CheckPlan;

    fn trust_mut(&mut self) -> &mut TrustPlan {
        self.plan().trust.get_or_insert_with(trust)
    }

    /// With `[trust]`, even without a user.
    fn trusted(mut self) -> Self {
        self.trust_mut();
        self
    }
    /// The check's user (points and sighting keys).
    fn user(mut self, user: &str) -> Self {
        let t = self.trust_mut();
        t.points_key = Some(points_key(user));
        t.user_seen_key = Some(user_seen_key(user));
        self
    }
    /// `user_created_at`.
    fn created(mut self, ms: u64) -> Self {
        self.trust_mut().user_created_ms = Some(ms);
        self
    }
    fn device(mut self, device: &str) -> Self {
        self.trust_mut().device_seen_key = Some(device_seen_key(device));
        self
    }
    /// `[score]` at `silent_deny_at`, with `new_account`'s weight.
    fn score(mut self, silent_deny_at: f64, new_account_weight: Option<f64>) -> Self {
        let n = self.plan().signals.len();
        self.plan().score = Some(ScorePlan {
            weights: vec![0.0; n],
            new_account_weight,
            silent_deny_at,
            challenge_at: None,
        });
        self
    }
    /// The score's challenge band starts at `at` (after [`PlanExt::score`]).
    fn challenge(mut self, at: f64) -> Self {
        self.plan()
            .score
            .as_mut()
            .expect("a band needs a score")
            .challenge_at = Some(at);
        self
    }
    /// The scene can challenge: passes of `SCENE_NAME` (on any device, or on `device`)
    /// lift the band.
    fn passes(mut self, device: Option<&str>) -> Self {
        self.trust_mut().passes = Some(PassScopes {
            any_device: pass_scope(SCENE_NAME, None),
            this_device: device.map(|d| pass_scope(SCENE_NAME, Some(d))),
        });
        self
    }
    /// A signal; weight 0 when the plan has a score.
    fn signal(self, s: SignalPlan) -> Self {
        self.weighted(s, 0.0)
    }
    /// A signal and its weight (the weight only counts with a score).
    fn weighted(mut self, s: SignalPlan, weight: f64) -> Self {
        let p = self.plan();
        p.signals.push(s);
        if let Some(score) = p.score.as_mut() {
            score.weights.push(weight);
        }
        self
    }
    fn limit(mut self, l: LimitPlan) -> Self {
        self.plan().limits.push(l);
        self
    }
    fn dry(mut self) -> Self {
        self.plan().dry_run = true;
        self
    }
    /// The service made the request id (the caller named none).
    fn made_id(mut self) -> Self {
        self.plan().id_given = false;
        self
    }
    fn idem(mut self, key: &str) -> Self {
        self.plan().idempotency_key = Some(format!("{SCENE}:idem:{key}"));
        self
    }
}

impl PlanExt for CheckPlan {
    fn plan(&mut self) -> &mut CheckPlan {
        self
    }
}

/// The hash of a counted value as the check path sends it: 16 lowercase hex digits
/// (FNV-1a here; any hash will do). A value that already is one is kept, so a case can
/// choose members whose order it knows.
fn hashed(value: &str) -> String {
    let is_hash = value.len() == 16
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if is_hash {
        return value.to_string();
    }
    let hash = value.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// A signal counting `value` in `window_ms`, firing past `max`: for `requests` the value is
/// the request id, otherwise the counted user, device, ip or net (the user for
/// `user_switches`), sent hashed.
fn signal(name: &str, count: Count, value: &str, window_ms: u64, max: u64) -> SignalPlan {
    SignalPlan {
        name: name.to_string(),
        key: format!("{SCENE}:sg:{name}"),
        all_key: None,
        last_key: (count == Count::UserSwitches).then(|| format!("{SCENE}:sl:{name}")),
        count,
        member: match count {
            Count::Requests => value.to_string(),
            _ => hashed(value),
        },
        filter: None,
        window_ms,
        max,
        min_share: None,
        cap: signal_cap(max, None),
    }
}

trait SignalExt {
    fn only(self, filter: Filter) -> Self;
    fn share(self, min_share: f64) -> Self;
}

impl SignalExt for SignalPlan {
    fn only(mut self, filter: Filter) -> Self {
        self.filter = Some(filter);
        self
    }
    fn share(mut self, min_share: f64) -> Self {
        self.all_key = Some(format!("{SCENE}:sa:{}", self.name));
        self.min_share = Some(min_share);
        self.cap = signal_cap(self.max, Some(min_share));
        self
    }
}

fn limit(key: &str, algorithm: Algorithm, window_ms: u64, max: u64) -> LimitPlan {
    LimitPlan {
        key: format!("{SCENE}:{key}"),
        algorithm,
        window_ms,
        base_max: max,
        per_user: false,
        trust_bonus: false,
        retain_ms: window_ms,
        filter: None,
    }
}

fn sliding(key: &str, window_ms: u64, max: u64) -> LimitPlan {
    limit(key, Algorithm::SlidingWindow, window_ms, max)
}

fn fixed(key: &str, window_ms: u64, max: u64) -> LimitPlan {
    limit(key, Algorithm::FixedWindow, window_ms, max)
}

fn bucket(key: &str, window_ms: u64, max: u64) -> LimitPlan {
    limit(key, Algorithm::TokenBucket, window_ms, max)
}

trait LimitExt {
    fn per_user(self) -> Self;
    fn bonus(self) -> Self;
    fn only(self, filter: Filter) -> Self;
}

impl LimitExt for LimitPlan {
    fn per_user(mut self) -> Self {
        self.per_user = true;
        self
    }
    fn bonus(mut self) -> Self {
        self.trust_bonus = true;
        self
    }
    fn only(mut self, filter: Filter) -> Self {
        self.filter = Some(filter);
        self
    }
}

// ---------------------------------------------------------------------------------------
// Reading answers
// ---------------------------------------------------------------------------------------

fn limits_of(j: &Judgement) -> &[LimitValue] {
    match &j.outcome {
        Outcome::Allowed { limits }
        | Outcome::Denied { limits }
        | Outcome::Challenged { limits } => limits,
        Outcome::ScoreDeny => panic!("a score deny has no limits: {j:?}"),
    }
}

/// Asserts an allow; the per-limit counts.
fn allowed(j: &Judgement) -> Vec<u64> {
    let Outcome::Allowed { limits } = &j.outcome else {
        panic!("expected an allow, got {j:?}");
    };
    limits.iter().map(|l| l.state.count).collect()
}

/// Asserts a challenge; the per-limit counts (before the request: nothing was counted).
fn challenged(j: &Judgement) -> Vec<u64> {
    let Outcome::Challenged { limits } = &j.outcome else {
        panic!("expected a challenge, got {j:?}");
    };
    limits.iter().map(|l| l.state.count).collect()
}

/// Asserts a limit deny; the per-limit states.
fn denied(j: &Judgement) -> Vec<LimitState> {
    let Outcome::Denied { limits } = &j.outcome else {
        panic!("expected a limit deny, got {j:?}");
    };
    limits.iter().map(|l| l.state).collect()
}

fn maxes(j: &Judgement) -> Vec<u64> {
    limits_of(j).iter().map(|l| l.max).collect()
}

fn applies(j: &Judgement) -> Vec<bool> {
    limits_of(j).iter().map(|l| l.applies).collect()
}

fn value(j: &Judgement, i: usize) -> u64 {
    j.signals[i].value
}

fn sig(j: &Judgement, i: usize) -> SignalValue {
    j.signals[i]
}

/// The score the shared arithmetic gives for what the decider reported.
fn expected_score(plan: &CheckPlan, j: &Judgement) -> (f64, bool) {
    math_score(
        plan.score.as_ref(),
        &j.signals,
        &j.facts,
        plan.trust.as_ref().map_or(0.0, |t| t.discount_per_point),
    )
}

// ---------------------------------------------------------------------------------------
// The deciders
// ---------------------------------------------------------------------------------------

/// What a test can reach besides the decider's answers.
enum Backend {
    Redis {
        server: RedisServer,
        /// Refunds (refund.lua) go through the window store. (Boxed: the largest part.)
        store: Box<RedisStore>,
        /// Awards go through the trust ledger (trust_award.lua). (Boxed: a large part.)
        ledger: Box<RedisLedger>,
    },
    /// The cluster decider on a local 3-master cluster. The suite's keys are placed for it
    /// by [`tagged`] (each limit and signal in a slot of its own, the user's trust keys in
    /// the user's): a check spreads over many slot groups and rounds.
    Cluster {
        cluster: RedisCluster,
        store: Box<RedisStore>,
        ledger: Box<RedisLedger>,
        decider: Arc<ClusterDecider>,
    },
    /// The embedded decider's three parts, as `app::open_stores` builds them, under one
    /// temporary folder.
    Embedded {
        /// Limits, request records, idempotency keys (journaled, or in memory).
        windows: Arc<EmbeddedStore>,
        /// The signal shards.
        behaviours: Behaviours,
        /// Points and first sightings; awards go through its `TrustLedger` API.
        ledger: Arc<SledLedger>,
        /// The users and devices any plan named, for [`Env::snapshot`] (the ledger cannot
        /// be listed).
        named: Mutex<BTreeSet<Named>>,
        /// Last: removed once everything above is dropped.
        _dir: tempfile::TempDir,
    },
}

/// A user or a device some plan named.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Named {
    User(String),
    Device(String),
}

/// A fresh decider reading a manual clock at [`t0`], and a way to look inside.
struct Env {
    decider: Arc<dyn Decider>,
    clock: ManualClock,
    backend: Backend,
}

/// The id at the end of a key the suite built (`…:uid:<id>`, `…:did:<id>`): the suite's ids
/// need no encoding.
fn id_of(key: &str) -> String {
    key.rsplit(':').next().unwrap_or_default().to_string()
}

impl Env {
    async fn redis() -> Env {
        let server = RedisServer::start();
        let clock = ManualClock::new(t0());
        let store = RedisStore::connect(&server.url(), TEST_TIMEOUT_MS)
            .await
            .expect("connect")
            .with_clock(Arc::new(clock.clone()));
        let link = store.link();
        let ledger = RedisLedger::new(link.clone(), &KeyPrefix::plain(PREFIX))
            .await
            .expect("ledger")
            .with_clock(Arc::new(clock.clone()));
        assert_eq!(ledger.points_key("ann"), points_key("ann"));
        assert_eq!(ledger.seen_key("ann"), user_seen_key("ann"));
        let decider = RedisDecider::new(link, Some(Arc::new(clock.clone())), Metrics::new())
            .await
            .expect("decider");
        Env {
            decider: Arc::new(decider),
            clock,
            backend: Backend::Redis {
                server,
                store: Box::new(store),
                ledger: Box::new(ledger),
            },
        }
    }

    async fn cluster() -> Env {
        let cluster = RedisCluster::start();
        let clock = ManualClock::new(t0());
        let breaker = Arc::new(Breaker::new("redis", BreakerSettings::default(), None));
        let store = RedisStore::connect_cluster_with(&cluster.url_list(), TEST_TIMEOUT_MS, breaker)
            .await
            .expect("connect")
            .with_clock(Arc::new(clock.clone()));
        let link = store.link();
        let ledger = RedisLedger::new(link.clone(), &KeyPrefix::tagged(PREFIX))
            .await
            .expect("ledger")
            .with_clock(Arc::new(clock.clone()));
        assert_eq!(ledger.points_key("ann"), tagged(&points_key("ann")));
        assert_eq!(ledger.seen_key("ann"), tagged(&user_seen_key("ann")));
        let decider = Arc::new(
            ClusterDecider::new(link, Some(Arc::new(clock.clone())), Metrics::new())
                .await
                .expect("decider"),
        );
        Env {
            decider: decider.clone(),
            clock,
            backend: Backend::Cluster {
                cluster,
                store: Box::new(store),
                ledger: Box::new(ledger),
                decider,
            },
        }
    }

    /// The embedded decider on the journaled window store (the service's).
    fn embedded() -> Env {
        Self::embedded_on(|dir, clock| {
            EmbeddedStore::open(&dir.join("windows"), clock).expect("open the window store")
        })
    }

    /// The embedded decider on the in-memory window store (`vigia simulate`'s).
    fn in_memory() -> Env {
        Self::embedded_on(|_, clock| EmbeddedStore::in_memory(clock))
    }

    fn embedded_on(windows: impl FnOnce(&Path, Arc<dyn Clock>) -> Arc<EmbeddedStore>) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = ManualClock::new(t0());
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let windows = windows(dir.path(), shared.clone());
        let events = journal::open_db(&dir.path().join("events")).expect("events db");
        let ledger = Arc::new(SledLedger::open(&events, shared.clone()).expect("ledger"));
        let config = BehaviourConfig {
            shards: 2,
            threads: 1,
            // A bound, not a timing: a shard this late is stuck, and the test says so.
            deadline_ms: 60_000,
            ..BehaviourConfig::default()
        };
        let behaviours = Behaviours::start(
            &config,
            &dir.path().join("behaviour"),
            shared.clone(),
            Metrics::new(),
        )
        .expect("behaviours");
        let decider = EmbeddedDecider::new(
            windows.clone(),
            behaviours.clone(),
            Some(ledger.clone()),
            shared,
        );
        Env {
            decider: Arc::new(decider),
            clock,
            backend: Backend::Embedded {
                windows,
                behaviours,
                ledger,
                named: Mutex::new(BTreeSet::new()),
                _dir: dir,
            },
        }
    }

    /// Sets the clock to `t0() + ms`.
    fn at(&self, ms: u64) {
        self.clock.set(t0() + ms);
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Embedded: remembers the users and devices `plan` names, for [`Env::snapshot`].
    fn note(&self, plan: &CheckPlan) {
        if let (Backend::Embedded { named, .. }, Some(trust)) = (&self.backend, &plan.trust) {
            let mut named = named.lock().expect("named");
            for key in [&trust.points_key, &trust.user_seen_key]
                .into_iter()
                .flatten()
            {
                named.insert(Named::User(id_of(key)));
            }
            if let Some(key) = &trust.device_seen_key {
                named.insert(Named::Device(id_of(key)));
            }
        }
    }

    async fn decide(&self, plan: &CheckPlan) -> Decided {
        self.note(plan);
        let placed;
        let plan = match &self.backend {
            Backend::Cluster { .. } => {
                placed = placed_plan(plan);
                &placed
            }
            _ => plan,
        };
        let decided = self
            .decider
            .decide(plan)
            .await
            .unwrap_or_else(|e| panic!("decide {} failed: {e}", plan.request_id));
        if let Backend::Cluster { decider, .. } = &self.backend {
            // What a denied check reserved is given back before the case looks.
            decider.settled().await;
        }
        decided
    }

    /// Asserts the check was judged (not a repeat), and that its score is the shared
    /// arithmetic's for what it reported.
    async fn judged(&self, plan: &CheckPlan) -> Judgement {
        match self.decide(plan).await {
            Decided::Judged(j) => {
                let (score, deny) = expected_score(plan, &j);
                assert_eq!(j.score, score, "{} score, {j:?}", plan.request_id);
                assert_eq!(
                    j.outcome == Outcome::ScoreDeny,
                    deny,
                    "{} score deny, {j:?}",
                    plan.request_id
                );
                j
            }
            other => panic!("{} should be judged, got {other:?}", plan.request_id),
        }
    }

    /// Decides `plan` as a dry run, then for real: asserts that the dry run changed nothing
    /// (no key, no expiry, no signal, no sighting) and answered as the real check; the
    /// real answer.
    async fn dry_then_real(&self, plan: CheckPlan) -> Judgement {
        self.note(&plan);
        self.freeze_ttls();
        let before = self.snapshot().await;
        let dry = self.judged(&plan.clone().dry()).await;
        let what = format!("the dry run of {}", plan.request_id);
        assert_eq!(self.snapshot().await, before, "{what} changed something");
        self.assert_ttls_frozen(&what);
        let real = self.judged(&plan).await;
        assert_eq!(dry, real, "{what} answered otherwise");
        real
    }

    /// Awards `points` to `user` until `expires_at_ms`, through the decider's trust ledger.
    async fn award(&self, user: &str, points: u32, event_id: &str, expires_at_ms: u64) {
        let award = Award {
            event_id: event_id.to_string(),
            user_id: user.to_string(),
            kind: AwardKind::PaymentSucceeded,
            points,
            expires_at_ms,
        };
        match &self.backend {
            Backend::Redis { ledger, .. } => ledger.award(&award).await.expect("award"),
            Backend::Cluster { ledger, .. } => ledger.award(&award).await.expect("award"),
            Backend::Embedded { ledger, .. } => ledger.award(&award).await.expect("award"),
        }
    }

    /// Records a challenge pass of `user` for [`SCENE_NAME`] (on `device`, or any) until
    /// `expires_at_ms`, as the events service does.
    async fn pass(&self, user: &str, device: Option<&str>, event_id: &str, expires_at_ms: u64) {
        let award = Award {
            event_id: pass_id(&pass_scope(SCENE_NAME, device), event_id),
            user_id: user.to_string(),
            kind: AwardKind::ChallengePassed,
            points: 0,
            expires_at_ms,
        };
        match &self.backend {
            Backend::Redis { ledger, .. } => ledger.award(&award).await.expect("award"),
            Backend::Cluster { ledger, .. } => ledger.award(&award).await.expect("award"),
            Backend::Embedded { ledger, .. } => ledger.award(&award).await.expect("award"),
        }
    }

    async fn refund(&self, op: &RefundOp) -> bool {
        match &self.backend {
            Backend::Redis { store, .. } => store.refund(op).await.expect("refund"),
            Backend::Cluster { store, .. } => {
                let op = RefundOp {
                    records_key: tagged(&op.records_key),
                    keys: op.keys.iter().map(|k| tagged(k)).collect(),
                    ..op.clone()
                };
                store.refund(&op).await.expect("refund")
            }
            Backend::Embedded { windows, .. } => windows.refund(op).await.expect("refund"),
        }
    }

    // -- Inspection: what the answers cannot show (memory bounds, what a dry run left). --

    /// The window store's keys: limits, request records, idempotency keys (on Redis, every
    /// key but the signals' and trust's).
    fn window_keys(&self) -> BTreeSet<String> {
        match &self.backend {
            Backend::Redis { server, .. } => redis_keys(server)
                .into_iter()
                .filter(|k| !is_signal_or_trust_key(k))
                .collect(),
            // The records of the groups but the main one are the cluster's own: a single
            // Redis has none.
            Backend::Cluster { cluster, .. } => cluster_keys(cluster)
                .iter()
                .map(|k| untagged(k))
                .filter(|k| !is_signal_or_trust_key(k) && !is_group_records(k))
                .collect(),
            Backend::Embedded { windows, .. } => windows.keys().into_iter().collect(),
        }
    }

    /// A window-store key is held (limit, request record, idempotency key).
    fn exists(&self, key: &str) -> bool {
        self.window_keys().contains(key)
    }

    /// The request `id` has a record (it was counted), as of the clock's time: on Redis a
    /// field of the records hash, on the embedded store a key of its own.
    fn has_record(&self, id: &str) -> bool {
        match &self.backend {
            Backend::Redis { server, .. } => {
                let now = self.clock.now_ms();
                redis_record(server, id, now).is_some()
                    || redis_record(server, id, now - HOUR).is_some()
            }
            Backend::Cluster { cluster, .. } => {
                let now = self.clock.now_ms();
                [now, now - HOUR].into_iter().any(|at| {
                    let hash = format!("{}:{}", tagged(&records_key()), at / HOUR);
                    redis::cmd("HGET")
                        .arg(hash)
                        .arg(id)
                        .query::<Option<String>>(&mut cluster.conn())
                        .expect("HGET")
                        .is_some()
                })
            }
            Backend::Embedded { .. } => self.exists(&record_key(id)),
        }
    }

    /// Members of a sliding window's set (0 when absent).
    fn members(&self, key: &str) -> u64 {
        match &self.backend {
            Backend::Redis { server, .. } => redis_zcard(server, key),
            Backend::Cluster { cluster, .. } => cluster_query(cluster, "ZCARD", key),
            Backend::Embedded { windows, .. } => {
                windows.inspect(key).map_or(0, |info| info.weight as u64)
            }
        }
    }

    /// Ms until a window-store key expires (`None`: absent or immortal).
    fn window_ttl_ms(&self, key: &str) -> Option<u64> {
        match &self.backend {
            Backend::Redis { server, .. } => u64::try_from(redis_pttl(server, key)).ok(),
            Backend::Cluster { cluster, .. } => {
                u64::try_from(cluster_query::<i64>(cluster, "PTTL", key)).ok()
            }
            Backend::Embedded { windows, .. } => windows.inspect(key).map(|info| info.ttl_ms),
        }
    }

    /// The state the embedded decider holds for the signal named `name` (its plan key),
    /// once the shards have written it out.
    async fn signal_state(behaviours: &Behaviours, name: &str) -> Option<SignalState> {
        behaviours.snapshot().await.expect("behaviour snapshot");
        let hash = entity_hash(&format!("{SCENE}:sg:{name}"));
        behaviours
            .snapshotted_signals()
            .expect("snapshotted signals")
            .into_iter()
            .find_map(|(h, state)| (h == hash).then_some(state))
    }

    /// Members (switch times, for `user_switches`) the signal `name` holds in its set,
    /// expired ones included until trimmed (0 when it holds nothing).
    async fn signal_members(&self, name: &str) -> u64 {
        match &self.backend {
            Backend::Redis { server, .. } => redis_zcard(server, &format!("{SCENE}:sg:{name}")),
            Backend::Cluster { cluster, .. } => {
                cluster_query(cluster, "ZCARD", &format!("{SCENE}:sg:{name}"))
            }
            Backend::Embedded { behaviours, .. } => Self::signal_state(behaviours, name)
                .await
                .map_or(0, |s| s.len() as u64),
        }
    }

    /// Members the signal `name` holds in its all-requests set (`min_share`).
    async fn all_members(&self, name: &str) -> u64 {
        match &self.backend {
            Backend::Redis { server, .. } => redis_zcard(server, &format!("{SCENE}:sa:{name}")),
            Backend::Cluster { cluster, .. } => {
                cluster_query(cluster, "ZCARD", &format!("{SCENE}:sa:{name}"))
            }
            Backend::Embedded { behaviours, .. } => Self::signal_state(behaviours, name)
                .await
                .map_or(0, |s| s.all_len() as u64),
        }
    }

    /// The user's first sighting, as kept (reading it marks nothing).
    fn user_first_seen(&self, user: &str) -> Option<u64> {
        match &self.backend {
            Backend::Redis { server, .. } => redis_get(server, &user_seen_key(user))
                .map(|v| v.parse().expect("a sighting is unix ms")),
            Backend::Cluster { cluster, .. } => {
                cluster_query::<Option<u64>>(cluster, "GET", &user_seen_key(user))
            }
            Backend::Embedded { ledger, .. } => {
                ledger.user_seen(user, false, self.now()).expect("read")
            }
        }
    }

    /// The device's first sighting, as kept (reading it marks nothing).
    fn device_first_seen(&self, device: &str) -> Option<u64> {
        match &self.backend {
            Backend::Redis { server, .. } => redis_get(server, &device_seen_key(device))
                .map(|v| v.parse().expect("a sighting is unix ms")),
            Backend::Cluster { cluster, .. } => {
                cluster_query::<Option<u64>>(cluster, "GET", &device_seen_key(device))
            }
            Backend::Embedded { ledger, .. } => {
                ledger.device_seen(device, false, self.now()).expect("read")
            }
        }
    }

    /// Redis: sets every key's expiry to [`FROZEN_TTL_MS`], so [`Env::assert_ttls_frozen`]
    /// can tell later whether anything refreshed one. Embedded: nothing to do, the
    /// snapshot holds every expiry as a time on the manual clock.
    fn freeze_ttls(&self) {
        if let Backend::Cluster { cluster, .. } = &self.backend {
            let mut conn = cluster.conn();
            for key in cluster_keys(cluster) {
                let _: i64 = redis::cmd("PEXPIRE")
                    .arg(&key)
                    .arg(FROZEN_TTL_MS)
                    .query(&mut conn)
                    .expect("PEXPIRE");
            }
        }
        if let Backend::Redis { server, .. } = &self.backend {
            let mut conn = server.conn();
            for key in redis_keys(server) {
                let _: i64 = redis::cmd("PEXPIRE")
                    .arg(&key)
                    .arg(FROZEN_TTL_MS)
                    .query(&mut conn)
                    .expect("PEXPIRE");
            }
        }
    }

    /// Redis: no key's expiry was set since [`Env::freeze_ttls`] (a test runs in well
    /// under 2 s). Embedded: [`Env::snapshot`] compares the expiries.
    fn assert_ttls_frozen(&self, what: &str) {
        if let Backend::Cluster { cluster, .. } = &self.backend {
            let mut conn = cluster.conn();
            for key in cluster_keys(cluster) {
                let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).expect("PTTL");
                let ttl = u64::try_from(ttl).unwrap_or(0);
                assert!(
                    ttl <= FROZEN_TTL_MS && ttl + 2 * SEC > FROZEN_TTL_MS,
                    "{what} set the expiry of {key} (PTTL {ttl})"
                );
            }
        }
        if let Backend::Redis { server, .. } = &self.backend {
            for key in redis_keys(server) {
                let ttl = u64::try_from(redis_pttl(server, &key)).unwrap_or(0);
                assert!(
                    ttl <= FROZEN_TTL_MS && ttl + 2 * SEC > FROZEN_TTL_MS,
                    "{what} set the expiry of {key} (PTTL {ttl})"
                );
            }
        }
    }

    /// Everything held and its whole content, for before/after comparisons. Embedded: the
    /// window store's keys (members held, expiry time), every signal state, and the
    /// sightings and awards of every user and device a plan named.
    async fn snapshot(&self) -> BTreeMap<String, String> {
        match &self.backend {
            Backend::Redis { server, .. } => redis_snapshot(server),
            Backend::Cluster { cluster, .. } => cluster_snapshot(cluster),
            Backend::Embedded {
                windows,
                behaviours,
                ledger,
                named,
                ..
            } => {
                let now = self.now();
                let mut out: BTreeMap<String, String> = windows
                    .keys()
                    .into_iter()
                    .filter_map(|k| {
                        let info = windows.inspect(&k)?;
                        Some((k, format!("{} until {}", info.weight, now + info.ttl_ms)))
                    })
                    .collect();
                behaviours.snapshot().await.expect("behaviour snapshot");
                for (hash, state) in behaviours.snapshotted_signals().expect("signals") {
                    out.insert(format!("signal {hash:016x}"), format!("{state:?}"));
                }
                let named = named.lock().expect("named").clone();
                for n in named {
                    match n {
                        Named::User(user) => {
                            let seen = ledger.user_seen(&user, false, now).expect("read");
                            let awards = ledger.awards(&user).await.expect("awards");
                            out.insert(format!("user {user}"), format!("{seen:?} {awards:?}"));
                        }
                        Named::Device(device) => {
                            let seen = ledger.device_seen(&device, false, now).expect("read");
                            out.insert(format!("device {device}"), format!("{seen:?}"));
                        }
                    }
                }
                out
            }
        }
    }

    /// The Redis server (Redis-only cases).
    fn server(&self) -> &RedisServer {
        match &self.backend {
            Backend::Redis { server, .. } => server,
            Backend::Embedded { .. } | Backend::Cluster { .. } => {
                panic!("a Redis-only case on another decider")
            }
        }
    }
}

/// A suite key as the cluster arm places it: each limit and signal in a slot of its own
/// (`vg:t:{l:uid:ann}`, `vg:t:sg:{s:upd:d1}`, the signal's `sa`/`sl` keys with it), the
/// user's trust keys in the user's (`vg:trust-points:{uid:ann}`, as the ledger names
/// them), the scene's records tagged by the scene (`vg:{t}:rq:all`).
fn tagged(key: &str) -> String {
    // The scene's records key, and its hashes (`…:<generation>`).
    if let Some(rest) = key.strip_prefix(&records_key()) {
        return format!("{PREFIX}:{{t}}:rq:all{rest}");
    }
    for kind in ["trust-points", "user-seen", "device-seen"] {
        if let Some(rest) = key.strip_prefix(&format!("{PREFIX}:{kind}:")) {
            return format!("{PREFIX}:{kind}:{{{rest}}}");
        }
    }
    for kind in ["sg", "sa", "sl"] {
        if let Some(rest) = key.strip_prefix(&format!("{SCENE}:{kind}:")) {
            return format!("{SCENE}:{kind}:{{s:{rest}}}");
        }
    }
    match key.strip_prefix(&format!("{SCENE}:")) {
        Some(rest) if !rest.starts_with("idem:") && !rest.starts_with("req:") => {
            format!("{SCENE}:{{l:{rest}}}")
        }
        _ => key.to_string(),
    }
}

/// The suite's name of a key [`tagged`] placed (or of a records hash beside one).
fn untagged(key: &str) -> String {
    key.replace("{s:", "")
        .replace("{l:", "")
        .replace(['{', '}'], "")
}

/// A records hash of a slot group other than the scene's (the cluster's own bookkeeping).
fn is_group_records(key: &str) -> bool {
    key.starts_with(&format!("{SCENE}:rq:")) && !key.starts_with(&records_key())
}

/// `plan` with every key [`tagged`].
fn placed_plan(plan: &CheckPlan) -> CheckPlan {
    let mut p = plan.clone();
    p.records_key = tagged(&p.records_key);
    if let Some(t) = p.trust.as_mut() {
        for key in [
            &mut t.points_key,
            &mut t.user_seen_key,
            &mut t.device_seen_key,
        ] {
            if let Some(k) = key.as_mut() {
                *k = tagged(k);
            }
        }
    }
    for s in &mut p.signals {
        s.key = tagged(&s.key);
        for key in [&mut s.all_key, &mut s.last_key] {
            if let Some(k) = key.as_mut() {
                *k = tagged(k);
            }
        }
    }
    for l in &mut p.limits {
        l.key = tagged(&l.key);
    }
    p
}

/// One command on the suite key `key` ([`tagged`]), routed to its master.
fn cluster_query<T: redis::FromRedisValue>(cluster: &RedisCluster, cmd: &str, key: &str) -> T {
    redis::cmd(cmd)
        .arg(tagged(key))
        .query(&mut cluster.conn())
        .unwrap_or_else(|e| panic!("{cmd} {key}: {e}"))
}

/// Every key on every master.
fn cluster_keys(cluster: &RedisCluster) -> Vec<String> {
    let urls = cluster.url_list();
    let mut keys = Vec::new();
    for i in cluster.masters() {
        let mut conn = redis::Client::open(urls[i].as_str())
            .and_then(|c| c.get_connection())
            .expect("a master");
        let mut some: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
        keys.append(&mut some);
    }
    keys.sort();
    keys
}

/// Every key of the cluster and its whole content.
fn cluster_snapshot(cluster: &RedisCluster) -> BTreeMap<String, String> {
    snapshot(&mut cluster.conn(), cluster_keys(cluster))
}

/// Each of `keys` and its whole content, read on `conn`.
fn snapshot(conn: &mut impl redis::ConnectionLike, keys: Vec<String>) -> BTreeMap<String, String> {
    keys.into_iter()
        .map(|key| {
            let kind: String = redis::cmd("TYPE").arg(&key).query(conn).expect("TYPE");
            let content = match kind.as_str() {
                "string" => {
                    let v: Option<String> = redis::cmd("GET").arg(&key).query(conn).expect("GET");
                    format!("{v:?}")
                }
                "zset" => {
                    let m: Vec<(String, String)> = redis::cmd("ZRANGE")
                        .arg(&key)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query(conn)
                        .expect("ZRANGE");
                    format!("{m:?}")
                }
                "hash" => {
                    let h: BTreeMap<String, String> = redis::cmd("HGETALL")
                        .arg(&key)
                        .query(conn)
                        .expect("HGETALL");
                    format!("{h:?}")
                }
                other => format!("a {other}"),
            };
            (key, format!("{kind} {content}"))
        })
        .collect()
}

/// Keys of signals (`sg`, `sa`, `sl`) and of trust (points, sightings).
fn is_signal_or_trust_key(key: &str) -> bool {
    [":sg:", ":sa:", ":sl:"]
        .iter()
        .any(|part| key.starts_with(&format!("{SCENE}{part}")))
        || key.starts_with(&format!("{PREFIX}:trust-points:"))
        || key.starts_with(&format!("{PREFIX}:user-seen:"))
        || key.starts_with(&format!("{PREFIX}:device-seen:"))
}

/// A string key's value.
fn redis_get(server: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.conn())
        .expect("GET")
}

/// Every key and its whole content.
fn redis_snapshot(server: &RedisServer) -> BTreeMap<String, String> {
    snapshot(&mut server.conn(), redis_keys(server))
}

/// Defines each case on every decider: `on_redis::NAME` (`lua/decide.lua`),
/// `on_cluster::NAME` (`decide::cluster`), and the embedded decider on the journaled window store (`on_embedded::NAME`, the service's)
/// and on the in-memory one (`on_in_memory::NAME`, `vigia simulate`'s).
macro_rules! on_every_decider {
    ($( $(#[$meta:meta])* async fn $name:ident($env:ident: Env) $body:block )*) => {
        mod on_redis {
            use super::*;
            $( $(#[$meta])* async fn $name() { let $env = Env::redis().await; $body } )*
        }
        mod on_cluster {
            use super::*;
            $( $(#[$meta])* async fn $name() { let $env = Env::cluster().await; $body } )*
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

// ---------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------

on_every_decider! {
    #[tokio::test]
    async fn points_are_the_unexpired_awards_capped(env: Env) {
        env.award("ann", 2, "a1", t0() + DAY).await;
        env.award("ann", 3, "a2", t0() + 2 * DAY).await;
        env.award("ann", 4, "a3", t0() + 3 * DAY).await;
        env.award("bob", 2, "b1", t0() + DAY).await;
        env.award("bob", 1, "b2", t0() + 2 * DAY).await;
        let untrusted = |id: &str, user: &str| {
            check(id)
                .user(user)
                .created(long_ago())
                .signal(signal("untrusted", Count::Requests, id, HOUR, 100).only(Filter::Untrusted))
        };

        let ann = env.judged(&untrusted("r1", "ann")).await;
        assert_eq!(ann.facts.points, MAX_POINTS, "9 points, capped");
        assert!(!sig(&ann, 0).applies, "a trusted user is not untrusted");

        assert_eq!(env.judged(&untrusted("r2", "bob")).await.facts.points, 3);
        env.at(DAY - 1);
        assert_eq!(env.judged(&untrusted("r3", "bob")).await.facts.points, 3);
        // An award leaves at its expiry, exactly.
        env.at(DAY);
        let bob = env.judged(&untrusted("r4", "bob")).await;
        assert_eq!(bob.facts.points, 1);
        assert!(!sig(&bob, 0).applies);
        env.at(2 * DAY);
        let bob = env.judged(&untrusted("r5", "bob")).await;
        assert_eq!(bob.facts.points, 0);
        assert!(sig(&bob, 0).applies, "untrusted again at 0 points");

        let carol = env.judged(&untrusted("r6", "carol")).await;
        assert_eq!(carol.facts.points, 0);
        assert!(sig(&carol, 0).applies);
        assert_eq!(value(&carol, 0), 2, "bob's r5 and carol's r6");
        // Without a user there are no points to read.
        let nobody = env.judged(&check("r7").trusted()).await;
        assert_eq!(nobody.facts.points, 0);
    }

    #[tokio::test]
    async fn a_user_is_new_from_the_first_sighting_or_the_creation_date(env: Env) {
        let new = env.judged(&check("r1").user("ann")).await;
        assert_eq!(new.facts.new_account, Some(true), "never seen: new");
        assert_eq!(env.user_first_seen("ann"), Some(t0()));

        let old = env
            .judged(&check("r2").user("old").created(long_ago()))
            .await;
        assert_eq!(old.facts.new_account, Some(false));
        assert_eq!(
            env.user_first_seen("old"),
            None,
            "the creation date needs no sighting"
        );
        let created = env
            .judged(&check("r3").user("fresh").created(recently()))
            .await;
        assert_eq!(created.facts.new_account, Some(true));

        // A dry run sees a new user and records no sighting.
        let dry = env.judged(&check("d1").user("bea").dry()).await;
        assert_eq!(dry.facts.new_account, Some(true));
        assert_eq!(env.user_first_seen("bea"), None);
        // So the next real check, days later, is still the first sighting.
        env.at(3 * DAY);
        assert_eq!(
            env.judged(&check("r4").user("bea")).await.facts.new_account,
            Some(true)
        );
        env.at(3 * DAY + YOUNGER_THAN - 1);
        assert_eq!(
            env.judged(&check("r5").user("bea")).await.facts.new_account,
            Some(true)
        );
        env.at(3 * DAY + YOUNGER_THAN);
        assert_eq!(
            env.judged(&check("r6").user("bea")).await.facts.new_account,
            Some(false)
        );
        // Ann was first seen at t0: her age flips at exactly younger_than.
        env.at(YOUNGER_THAN - 1);
        assert_eq!(
            env.judged(&check("r7").user("ann")).await.facts.new_account,
            Some(true)
        );
        env.at(YOUNGER_THAN);
        assert_eq!(
            env.judged(&check("r8").user("ann")).await.facts.new_account,
            Some(false)
        );
        assert_eq!(env.user_first_seen("ann"), Some(t0()), "first, kept");

        // Unknown: no user, or no [trust].new_account.
        assert_eq!(
            env.judged(&check("r9").trusted()).await.facts.new_account,
            None
        );
        let mut plan = check("r10").user("cid");
        plan.trust.as_mut().expect("trust").new_account = None;
        assert_eq!(env.judged(&plan).await.facts.new_account, None);
        assert_eq!(env.user_first_seen("cid"), None, "nobody asked the age");
        assert_eq!(env.judged(&check("r11")).await.facts.new_account, None);
        // A creation date without a user: no user, no age.
        let nobody = env.judged(&check("r12").trusted().created(recently())).await;
        assert_eq!(nobody.facts.new_account, None);
    }

    #[tokio::test]
    async fn a_device_is_new_from_its_first_sighting(env: Env) {
        let first = env.judged(&check("r1").device("d1")).await;
        assert_eq!(first.facts.new_device, Some(true));
        assert_eq!(first.facts.new_account, None, "no user");
        assert_eq!(env.device_first_seen("d1"), Some(t0()));

        let dry = env.judged(&check("d1").device("d2").dry()).await;
        assert_eq!(dry.facts.new_device, Some(true));
        assert_eq!(env.device_first_seen("d2"), None);
        env.at(HOUR);
        assert_eq!(
            env.judged(&check("r2").device("d2")).await.facts.new_device,
            Some(true)
        );
        env.at(HOUR + NEW_DEVICE - 1);
        assert_eq!(
            env.judged(&check("r3").device("d2")).await.facts.new_device,
            Some(true)
        );
        env.at(HOUR + NEW_DEVICE);
        assert_eq!(
            env.judged(&check("r4").device("d2")).await.facts.new_device,
            Some(false)
        );
        assert_eq!(
            env.judged(&check("r5").device("d1")).await.facts.new_device,
            Some(false)
        );
        // What new_device filters: new d4 counts, old d1 does not.
        let per_device = |id: &str, device: &str| {
            check(id)
                .device(device)
                .signal(signal("nd", Count::Requests, id, DAY, 5).only(Filter::NewDevice))
                .limit(sliding("nd", DAY, 5).only(Filter::NewDevice))
        };
        let new = env.judged(&per_device("r5b", "d4")).await;
        assert_eq!((sig(&new, 0).applies, value(&new, 0)), (true, 1));
        assert_eq!((applies(&new), allowed(&new)), (vec![true], vec![1]));
        let old = env.judged(&per_device("r5c", "d1")).await;
        assert_eq!((sig(&old, 0).applies, value(&old, 0)), (false, 0));
        assert_eq!((applies(&old), allowed(&old)), (vec![false], vec![0]));

        assert_eq!(
            env.judged(&check("r6").user("ann")).await.facts.new_device,
            None
        );
        let mut plan = check("r7").device("d3");
        plan.trust.as_mut().expect("trust").new_device_ms = None;
        assert_eq!(env.judged(&plan).await.facts.new_device, None);
    }

    #[tokio::test]
    async fn each_count_counts_distinct_members_within_the_window(env: Env) {
        let w = 10 * SEC;
        for (k, count) in [Count::Users, Count::Devices, Count::Ips, Count::Nets]
            .into_iter()
            .enumerate()
        {
            let base = k as u64 * 10 * w;
            let see = |id: String, member: &str| {
                check(&id).signal(signal(count.name(), count, member, w, 2))
            };
            env.at(base);
            let a = env.judged(&see(format!("{k}a1"), "a")).await;
            assert_eq!((value(&a, 0), sig(&a, 0).fired), (1, false), "{count:?}");
            let again = env.judged(&see(format!("{k}a2"), "a")).await;
            assert_eq!(
                value(&again, 0),
                1,
                "{count:?}: a member seen twice counts once"
            );
            env.at(base + w - 1);
            let b = env.judged(&see(format!("{k}b"), "b")).await;
            assert_eq!(value(&b, 0), 2, "{count:?}: a is counted at window - 1 ms");
            env.at(base + w);
            // A dry run does not trim: it must still see that a has left.
            let back = env.judged(&see(format!("{k}a3"), "a").dry()).await;
            assert_eq!(
                value(&back, 0),
                2,
                "{count:?}: a comes back as new, b stays"
            );
            let c = env.judged(&see(format!("{k}c"), "c")).await;
            assert_eq!(value(&c, 0), 2, "{count:?}: a left at exactly the window");
            env.at(base + w + 1);
            let d = env.judged(&see(format!("{k}d"), "d")).await;
            assert_eq!(
                (value(&d, 0), sig(&d, 0).fired),
                (3, true),
                "{count:?}: past max"
            );
            assert!(sig(&d, 0).applies && sig(&d, 0).share.is_none());
        }
    }

    #[tokio::test]
    async fn requests_are_counted_and_saturate_at_the_cap(env: Env) {
        let w = 10 * SEC;
        let see = |id: &str| check(id).signal(signal("rq", Count::Requests, id, w, 2));
        let mut seen = Vec::new();
        for i in 0..6 {
            env.at(i);
            let j = env.judged(&see(&format!("r{i}"))).await;
            seen.push((value(&j, 0), sig(&j, 0).fired));
        }
        let cap = signal_cap(2, None);
        assert_eq!(cap, 3);
        assert_eq!(
            seen,
            [
                (1, false),
                (2, false),
                (3, true),
                (3, true),
                (3, true),
                (3, true)
            ]
        );
        assert_eq!(env.signal_members("rq").await, cap, "the set keeps the cap");
        // Everything leaves with the window.
        env.at(5 + w);
        assert_eq!(value(&env.judged(&see("late")).await, 0), 1);
    }

    #[tokio::test]
    async fn at_a_tie_requests_leave_the_share_sets_in_the_order_of_their_hash(env: Env) {
        // Requests of new accounts, at least all of the last four (max 1, min_share 1.0:
        // the sets keep 4), all in one millisecond: the all set evicts at a tie, by member,
        // and a request's member is the hash of its id. Five ids whose smallest hash is
        // not the smallest id, so the order of the ids would evict another.
        let ids = (0..)
            .map(|n| (0..5).map(|i| format!("t{n}-{i}")).collect::<Vec<_>>())
            .find(|ids| {
                let by_hash = ids.iter().min_by_key(|id| entity_hash(id));
                by_hash != ids.iter().min()
            })
            .expect("some five ids");
        let first = ids
            .iter()
            .min_by_key(|id| entity_hash(id))
            .expect("five")
            .clone();
        let rest: Vec<&String> = ids.iter().filter(|id| **id != first).collect();
        let see = |id: &str, user: &str, created: u64| {
            check(id).user(user).created(created).signal(
                signal("rq-new", Count::Requests, id, HOUR, 1)
                    .only(Filter::NewAccount)
                    .share(1.0),
            )
        };
        assert_eq!(signal_cap(1, Some(1.0)), 4);
        env.at(1);
        env.judged(&see(&first, "n1", recently())).await;
        for (i, id) in rest[..3].iter().enumerate() {
            env.judged(&see(id, &format!("o{i}"), long_ago())).await;
        }
        // The fifth pushes the smallest hash, the new account's first request, out of
        // both sets.
        let last = env.dry_then_real(see(rest[3], "n2", recently())).await;
        assert_eq!(
            sig(&last, 0),
            SignalValue {
                applies: true,
                value: 1,
                share: Some(0.25),
                fired: false
            }
        );
        assert_eq!(env.signal_members("rq-new").await, 1);
    }

    #[tokio::test]
    async fn a_filtered_signal_ignores_requests_that_do_not_match(env: Env) {
        let see = |id: &str, user: &str, created: u64| {
            check(id)
                .user(user)
                .created(created)
                .signal(signal("new-per-dev", Count::Users, user, HOUR, 1).only(Filter::NewAccount))
        };
        let old = env.judged(&see("r1", "old1", long_ago())).await;
        assert_eq!(
            sig(&old, 0),
            SignalValue {
                applies: false,
                value: 0,
                share: None,
                fired: false
            }
        );
        assert_eq!(
            env.signal_members("new-per-dev").await,
            0,
            "nothing written"
        );
        assert_eq!(
            value(&env.judged(&see("r2", "new1", recently())).await, 0),
            1
        );
        assert_eq!(
            value(&env.judged(&see("r3", "old2", long_ago())).await, 0),
            0
        );
        let new2 = env.judged(&see("r4", "new2", recently())).await;
        assert_eq!((value(&new2, 0), sig(&new2, 0).fired), (2, true));
        let old3 = env.judged(&see("r5", "old3", long_ago())).await;
        assert!(
            !sig(&old3, 0).fired,
            "a request it does not apply to cannot fire it"
        );
        assert_eq!(env.signal_members("new-per-dev").await, 2);
    }

    #[tokio::test]
    async fn min_share_tells_a_network_of_new_accounts_from_a_campus(env: Env) {
        // New accounts per network: more than 2, and at least half of the network's users.
        let see = |net: &str, id: &str, user: &str, created: u64| {
            check(id).user(user).created(created).signal(
                signal(&format!("upn:{net}"), Count::Users, user, HOUR, 2)
                    .only(Filter::NewAccount)
                    .share(0.5),
            )
        };
        let cap = signal_cap(2, Some(0.5));
        assert_eq!(cap, 12);
        let mut tick = 0;
        let mut next = |env: &Env| {
            tick += 1;
            env.at(tick);
        };

        // A network: one old account, three new ones.
        next(&env);
        let o = env.judged(&see("a", "a-o1", "o1", long_ago())).await;
        assert_eq!(
            sig(&o, 0),
            SignalValue {
                applies: false,
                value: 0,
                share: None,
                fired: false
            }
        );
        for (i, user) in ["n1", "n2", "n3"].into_iter().enumerate() {
            next(&env);
            let j = env
                .judged(&see("a", &format!("a-{user}"), user, recently()))
                .await;
            assert_eq!(value(&j, 0), i as u64 + 1);
        }
        next(&env);
        let n4 = env.judged(&see("a", "a-n3-again", "n3", recently())).await;
        assert_eq!(
            sig(&n4, 0),
            SignalValue {
                applies: true,
                value: 3,
                share: Some(0.75),
                fired: true
            }
        );

        // A campus: ten old accounts, then as many new ones as the network had.
        for i in 1..=10 {
            next(&env);
            env.judged(&see("b", &format!("b-o{i}"), &format!("o{i}"), long_ago()))
                .await;
        }
        let mut last = None;
        for user in ["n1", "n2", "n3"] {
            next(&env);
            last = Some(
                env.judged(&see("b", &format!("b-{user}"), user, recently()))
                    .await,
            );
        }
        let n3 = last.expect("three checks");
        assert_eq!(
            sig(&n3, 0),
            SignalValue {
                applies: true,
                value: 3,
                share: Some(0.25),
                fired: false
            },
            "3 of 12 (13 seen, the cap kept)"
        );

        // Past the cap the share is among the most recent: after twelve old accounts, six
        // new ones are half of the last twelve.
        for i in 1..=12 {
            next(&env);
            env.judged(&see("c", &format!("c-o{i}"), &format!("o{i}"), long_ago()))
                .await;
        }
        let mut shares = Vec::new();
        for i in 1..=6 {
            next(&env);
            let j = env
                .judged(&see("c", &format!("c-n{i}"), &format!("n{i}"), recently()))
                .await;
            shares.push((value(&j, 0), sig(&j, 0).share, sig(&j, 0).fired));
        }
        assert_eq!(shares[4], (5, Some(0.416666667), false));
        assert_eq!(shares[5], (6, Some(0.5), true));
        // Twelve more old accounts push the new ones out of both sets.
        for i in 13..=24 {
            next(&env);
            env.judged(&see("c", &format!("c-o{i}"), &format!("o{i}"), long_ago()))
                .await;
        }
        assert_eq!(env.signal_members("upn:c").await, 0);
        assert_eq!(env.all_members("upn:c").await, cap);
        next(&env);
        let n7 = env.judged(&see("c", "c-n7", "n7", recently())).await;
        assert_eq!(
            sig(&n7, 0),
            SignalValue {
                applies: true,
                value: 1,
                share: Some(0.083333333),
                fired: false
            }
        );
    }

    #[tokio::test]
    async fn user_switches_count_changes_of_user_on_a_device(env: Env) {
        let w = 10 * SEC;
        let see = |id: &str, user: &str| {
            check(id).signal(signal("sw:d1", Count::UserSwitches, user, w, 1))
        };
        let mut values = Vec::new();
        for (i, user) in ["A", "A", "B", "A"].into_iter().enumerate() {
            env.at(i as u64);
            let j = env.judged(&see(&format!("r{i}"), user)).await;
            values.push((value(&j, 0), sig(&j, 0).fired));
        }
        assert_eq!(
            values,
            [(0, false), (0, false), (1, false), (2, true)],
            "A,A,B,A: 2 switches"
        );
        // The switch at t0+2 leaves at t0+2+w; the one at t0+3 a millisecond later.
        env.at(2 + w - 1);
        assert_eq!(value(&env.judged(&see("r4", "A")).await, 0), 2);
        env.at(2 + w);
        assert_eq!(value(&env.judged(&see("r5", "A")).await, 0), 1);
        env.at(3 + w);
        assert_eq!(value(&env.judged(&see("r6", "A")).await, 0), 0);

        // The last user is remembered for a window after it was set, no longer: a device
        // silent for a window starts afresh.
        let quiet = |id: &str, user: &str| {
            check(id).signal(signal("sw:d3", Count::UserSwitches, user, w, 1))
        };
        env.at(10 * MIN);
        assert_eq!(value(&env.judged(&quiet("q1", "A")).await, 0), 0);
        env.at(10 * MIN + w);
        assert_eq!(
            value(&env.judged(&quiet("q2", "B")).await, 0),
            0,
            "A was forgotten"
        );
        env.at(10 * MIN + 2 * w - 1);
        assert_eq!(
            value(&env.judged(&quiet("q3", "A")).await, 0),
            1,
            "B was not"
        );

        // A request the signal does not apply to is no switch and leaves the last user.
        let new_only = |id: &str, user: &str, created: u64| {
            check(id)
                .user(user)
                .created(created)
                .signal(signal("sw:d2", Count::UserSwitches, user, w, 1).only(Filter::NewAccount))
        };
        env.at(HOUR);
        assert_eq!(
            value(&env.judged(&new_only("s1", "A", recently())).await, 0),
            0
        );
        let c = env.judged(&new_only("s2", "C", long_ago())).await;
        assert_eq!(
            sig(&c, 0),
            SignalValue {
                applies: false,
                value: 0,
                share: None,
                fired: false
            }
        );
        assert_eq!(
            value(&env.judged(&new_only("s3", "A", recently())).await, 0),
            0,
            "still A"
        );
        assert_eq!(
            value(&env.judged(&new_only("s4", "B", recently())).await, 0),
            1
        );
        assert_eq!(
            value(&env.judged(&new_only("s5", "C", long_ago())).await, 0),
            0
        );
        assert_eq!(
            value(&env.judged(&new_only("s6", "B", recently())).await, 0),
            1,
            "still B"
        );
        assert_eq!(env.signal_members("sw:d2").await, 1);

        // min_share with user_switches (the rules refuse it; a plan may still carry it):
        // there is no all set, so the share is 0 of nothing and the signal cannot fire.
        let shared = |id: &str, user: &str| {
            check(id).signal(signal("sw:d4", Count::UserSwitches, user, w, 0).share(0.5))
        };
        env.judged(&shared("m1", "A")).await;
        let b = env.judged(&shared("m2", "B")).await;
        assert_eq!(
            sig(&b, 0),
            SignalValue {
                applies: true,
                value: 1,
                share: Some(0.0),
                fired: false
            }
        );
    }

    #[tokio::test]
    async fn a_request_sent_again_after_a_score_deny_is_observed_again(env: Env) {
        // Every check is denied by its score: nothing is recorded, so an id may come back
        // (it is not a repeat), and its signals observe it again.
        let plan = |id: &str, user: &str| {
            check(id)
                .score(1.0, None)
                .weighted(signal("always", Count::Requests, id, HOUR, 0), 1.0)
                .signal(signal("sw:d9", Count::UserSwitches, user, HOUR, 10))
                .signal(signal("rq:d9", Count::Requests, id, HOUR, 10))
        };
        let mut seen = Vec::new();
        for (i, (id, user)) in [("r1", "A"), ("r2", "B"), ("r3", "A"), ("r2", "B"), ("r5", "A")]
            .into_iter()
            .enumerate()
        {
            env.at(i as u64);
            let j = env.judged(&plan(id, user)).await;
            assert_eq!(j.outcome, Outcome::ScoreDeny, "{id}");
            seen.push((value(&j, 1), value(&j, 2)));
        }
        // A, B, A, B, A: four switches, the one of the id sent again among them; that id
        // is still one request.
        assert_eq!(seen, [(0, 1), (1, 2), (2, 3), (3, 3), (4, 4)]);
        assert_eq!(env.signal_members("sw:d9").await, 4);
    }

    #[tokio::test]
    async fn the_score_weighs_fired_signals_new_accounts_and_trust(env: Env) {
        // "always" fires on every request (0.6); "second" from a user's second one (0.1).
        let scored = |id: &str, user: &str, created: u64| {
            check(id)
                .user(user)
                .created(created)
                .score(0.7, Some(0.2))
                .weighted(
                    signal(&format!("always:{user}"), Count::Requests, id, HOUR, 0),
                    0.6,
                )
                .weighted(
                    signal(&format!("second:{user}"), Count::Requests, id, HOUR, 1),
                    0.1,
                )
        };
        let first = env.judged(&scored("o1", "old", long_ago())).await;
        assert_eq!(first.score, 0.6);
        assert_eq!(allowed(&first), Vec::<u64>::new());
        // 0.6 + 0.1 reaches 0.7: the line is inclusive.
        let second = env.judged(&scored("o2", "old", long_ago())).await;
        assert_eq!((second.score, &second.outcome), (0.7, &Outcome::ScoreDeny));

        // new_account's weight: 0.6 + 0.2.
        let young = env.judged(&scored("n1", "young", recently())).await;
        assert_eq!((young.score, &young.outcome), (0.8, &Outcome::ScoreDeny));

        // Two points discount 0.2: 0.6 - 0.2, then 0.6 + 0.1 - 0.2, both allowed.
        env.award("rich", 2, "e1", t0() + DAY).await;
        let rich = env.judged(&scored("t1", "rich", long_ago())).await;
        assert_eq!((rich.facts.points, rich.score), (2, 0.4));
        allowed(&rich);
        let rich = env.judged(&scored("t2", "rich", long_ago())).await;
        assert_eq!(rich.score, 0.5);
        allowed(&rich);
        // Clamped at 0: five points and nothing fired.
        env.award("richer", 5, "e2", t0() + DAY).await;
        let quiet = check("q1")
            .user("richer")
            .created(long_ago())
            .score(0.7, None)
            .weighted(signal("quiet", Count::Requests, "q1", HOUR, 5), 0.9);
        assert_eq!(env.judged(&quiet).await.score, 0.0);
        // Without [score]: signals fire, nothing is weighed or denied.
        let mut unscored = scored("u1", "old", long_ago());
        unscored.score = None;
        let j = env.judged(&unscored).await;
        assert!(sig(&j, 0).fired && sig(&j, 1).fired);
        assert_eq!(j.score, 0.0);
        allowed(&j);
    }

    #[tokio::test]
    async fn a_score_deny_touches_no_limit_but_the_signals_observed_it(env: Env) {
        // New (for a minute more) and weighed 0.7: denied; a minute later, allowed.
        let created = t0() + MIN - YOUNGER_THAN;
        let limits = [
            sliding("uid:u", HOUR, 10).per_user(),
            fixed("fw:uid:u", HOUR, 10),
            bucket("tb:uid:u", HOUR, 10),
        ];
        let plan = |id: &str| {
            let mut p = check(id)
                .user("u")
                .created(created)
                .score(0.7, Some(0.7))
                .signal(signal("seen", Count::Requests, id, HOUR, 10));
            for l in &limits {
                p = p.limit(l.clone());
            }
            p
        };
        let first = env.judged(&plan("r1")).await;
        assert_eq!((first.score, &first.outcome), (0.7, &Outcome::ScoreDeny));
        for l in &limits {
            assert!(!env.exists(&l.key), "{} was touched by a score deny", l.key);
        }
        assert!(!env.has_record("r1"), "no request record");
        assert_eq!(env.signal_members("seen").await, 1, "the signal observed it");

        env.at(MIN);
        let later = env.judged(&plan("r2")).await;
        assert_eq!(later.facts.new_account, Some(false));
        assert_eq!(allowed(&later), [1, 1, 1], "the first in every window");
        assert!(env.has_record("r2"), "an allowed request has a record");
        assert_eq!(value(&later, 0), 2);
        // r1 was never counted: sent again, it is a new request, not a repeat.
        assert_eq!(allowed(&env.judged(&plan("r1")).await), [2, 2, 2]);
    }

    #[tokio::test]
    async fn a_filtered_limit_counts_only_matching_requests(env: Env) {
        let plan = |id: &str, user: &str, created: u64| {
            check(id)
                .user(user)
                .created(created)
                .limit(sliding("new:ip:1", HOUR, 2).only(Filter::NewAccount))
                .limit(sliding("ip:1", HOUR, 100))
        };
        let old = env.judged(&plan("r1", "old1", long_ago())).await;
        assert_eq!(applies(&old), [false, true]);
        assert_eq!(allowed(&old), [0, 1]);
        assert_eq!(
            allowed(&env.judged(&plan("r2", "n1", recently())).await),
            [1, 2]
        );
        assert_eq!(
            allowed(&env.judged(&plan("r3", "n2", recently())).await),
            [2, 3]
        );
        let full = denied(&env.judged(&plan("r4", "n3", recently())).await);
        assert_eq!(
            (full[0].count, full[0].exceeded, full[1].exceeded),
            (2, true, false)
        );
        // The full limit does not apply to an old account.
        assert_eq!(
            allowed(&env.judged(&plan("r5", "old2", long_ago())).await),
            [0, 4]
        );
        assert_eq!(env.members(&format!("{SCENE}:new:ip:1")), 2);
        assert_eq!(env.members(&format!("{SCENE}:ip:1")), 4);
    }

    #[tokio::test]
    async fn new_accounts_get_a_share_of_per_user_limits_only(env: Env) {
        let plan = |id: &str, user: &str, created: u64| {
            check(id)
                .user(user)
                .created(created)
                .limit(sliding(&format!("uid:{user}"), HOUR, 4).per_user())
                .limit(sliding("ip:1", HOUR, 4))
        };
        let j = env.judged(&plan("n1", "newbie", recently())).await;
        assert_eq!(maxes(&j), [2, 4]);
        assert_eq!(
            maxes(&j)[0],
            effective_max(&plan("x", "newbie", 0).limits[0], &j.facts, Some(&trust()))
        );
        assert_eq!(allowed(&j), [1, 1]);
        assert_eq!(
            allowed(&env.judged(&plan("n2", "newbie", recently())).await),
            [2, 2]
        );
        let third = denied(&env.judged(&plan("n3", "newbie", recently())).await);
        assert_eq!((third[0].exceeded, third[1].exceeded), (true, false));
        // An old account: the whole max.
        let old = env.judged(&plan("o1", "veteran", long_ago())).await;
        assert_eq!(maxes(&old), [4, 4]);
        assert_eq!(allowed(&old), [1, 3]);
        // Never below 1.
        let tiny = check("t1")
            .user("tiny")
            .created(recently())
            .limit(sliding("uid:tiny", HOUR, 1).per_user());
        assert_eq!(maxes(&env.judged(&tiny).await), [1]);
    }

    #[tokio::test]
    async fn trust_points_raise_bonus_limits(env: Env) {
        env.award("rich", 3, "e1", t0() + DAY).await;
        env.award("richest", 9, "e2", t0() + DAY).await;
        let plan = |id: &str, user: &str, created: u64| {
            check(id)
                .user(user)
                .created(created)
                .limit(sliding(&format!("uid:{user}"), HOUR, 2).per_user().bonus())
                .limit(sliding(&format!("plain:uid:{user}"), HOUR, 2))
        };
        assert_eq!(
            maxes(&env.judged(&plan("r1", "rich", long_ago())).await),
            [2 + 3 * 2, 2]
        );
        assert_eq!(
            maxes(&env.judged(&plan("r2", "richest", long_ago())).await),
            [2 + 5 * 2, 2],
            "points are capped first"
        );
        // New and trusted: the factor first, then the bonus.
        let j = env.judged(&plan("r3", "rich", recently())).await;
        assert_eq!(maxes(&j), [1 + 3 * 2, 2]);
        assert_eq!(
            maxes(&j)[0],
            effective_max(&plan("x", "rich", 0).limits[0], &j.facts, Some(&trust()))
        );
        assert_eq!(
            maxes(&env.judged(&plan("r4", "poor", long_ago())).await),
            [2, 2]
        );
    }

    #[tokio::test]
    async fn one_full_limit_and_none_records(env: Env) {
        let limits = [
            sliding("uid:u", HOUR, 10),
            sliding("did:d", HOUR, 1),
            fixed("fw:uid:u", HOUR, 10),
            bucket("tb:uid:u", HOUR, 10),
        ];
        let plan = |id: &str, limits: &[LimitPlan]| {
            limits.iter().fold(check(id), |p, l| p.limit(l.clone()))
        };
        assert_eq!(
            allowed(&env.judged(&plan("r1", &limits)).await),
            [1, 1, 1, 1]
        );
        let states = denied(&env.judged(&plan("r2", &limits)).await);
        assert_eq!(
            states.iter().map(|s| s.exceeded).collect::<Vec<_>>(),
            [false, true, false, false]
        );
        assert!(states.iter().all(|s| s.count == 1), "{states:?}");
        assert!(states[1].retry_after_ms > 0);
        assert!(!env.has_record("r2"));
        // The others still hold only r1.
        let others = [limits[0].clone(), limits[2].clone(), limits[3].clone()];
        assert_eq!(allowed(&env.judged(&plan("r3", &others)).await), [2, 2, 2]);
    }

    #[tokio::test]
    async fn a_repeat_is_a_duplicate_and_touches_nothing(env: Env) {
        let plan = |id: &str| {
            check(id)
                .user("ann")
                .device("d1")
                .idem("K")
                .signal(signal("rq", Count::Requests, id, HOUR, 5))
                .signal(signal("sw", Count::UserSwitches, "ann", HOUR, 5))
                .limit(sliding("uid:ann", HOUR, 5))
        };
        allowed(&env.judged(&plan("r1")).await);
        env.note(&plan("r2"));
        env.freeze_ttls();
        let before = env.snapshot().await;
        env.at(MIN);
        assert_eq!(
            env.decide(&plan("r1")).await,
            Decided::Duplicate { of: "r1".into() }
        );
        assert_eq!(
            env.decide(&plan("r2")).await,
            Decided::Duplicate { of: "r1".into() },
            "same idempotency key"
        );
        let mut no_idem = plan("r1");
        no_idem.idempotency_key = None;
        assert_eq!(
            env.decide(&no_idem).await,
            Decided::Duplicate { of: "r1".into() }
        );
        assert_eq!(
            env.decide(&plan("r1").dry()).await,
            Decided::Duplicate { of: "r1".into() }
        );
        assert_eq!(env.snapshot().await, before);
        env.assert_ttls_frozen("a repeat");
    }

    #[tokio::test]
    async fn a_dry_run_answers_as_the_real_check_and_writes_nothing(env: Env) {
        env.award("ann", 1, "e1", t0() + DAY).await;
        // One plan with everything: trust, sightings, every kind of signal, a score, every
        // algorithm and a filtered limit.
        let plan = |id: &str, user: &str, created: Option<u64>| {
            let mut p = check(id)
                .user(user)
                .device("d1")
                .idem(id)
                .score(0.9, Some(0.3))
                .weighted(signal("upd:d1", Count::Users, user, HOUR, 2), 0.3)
                .weighted(
                    signal("new-upn:n1", Count::Users, user, HOUR, 1)
                        .only(Filter::NewAccount)
                        .share(0.5),
                    0.2,
                )
                .weighted(signal("sw:d1", Count::UserSwitches, user, HOUR, 1), 0.3)
                .weighted(signal("rq:d1", Count::Requests, id, MIN, 10), 0.1)
                .limit(sliding(&format!("uid:{user}"), HOUR, 3).per_user().bonus())
                .limit(fixed("fw:did:d1", HOUR, 5))
                .limit(bucket("tb:did:d1", MIN, 4))
                .limit(sliding("new:did:d1", HOUR, 2).only(Filter::NewAccount));
            if let Some(ms) = created {
                p = p.created(ms);
            }
            p
        };
        let steps = [
            ("ann", None),
            ("ann", None),
            ("bob", Some(long_ago())),
            ("ann", None),
            ("cid", None),
            ("cid", None),
            ("dan", Some(recently())),
            ("ann", None),
            ("eve", None),
        ];
        let mut outcomes = BTreeSet::new();
        for (i, (user, created)) in steps.into_iter().enumerate() {
            // 10 s apart: the one-minute windows trim from the seventh step on.
            env.at(i as u64 * 10 * SEC);
            let real = env
                .dry_then_real(plan(&format!("r{i}"), user, created))
                .await;
            outcomes.insert(match real.outcome {
                Outcome::ScoreDeny => "score",
                Outcome::Allowed { .. } => "allow",
                Outcome::Denied { .. } => "deny",
                Outcome::Challenged { .. } => "challenge",
            });
        }
        assert_eq!(
            outcomes.len(),
            3,
            "every outcome was compared: {outcomes:?}"
        );
    }

    #[tokio::test]
    async fn at_the_share_cap_the_oldest_leave_both_sets_and_a_dry_run_foresees_it(env: Env) {
        // max 1, min_share 1.0: the sets keep 4 members. Members chosen in hash order.
        let [a, b, c, d, m] = ["1", "2", "3", "4", "5"].map(|x| x.repeat(16));
        let see = |name: &str, id: &str, user: &str, created: u64| {
            check(id).user(user).created(created).signal(
                signal(name, Count::Users, user, HOUR, 1)
                    .only(Filter::NewAccount)
                    .share(1.0),
            )
        };
        assert_eq!(signal_cap(1, Some(1.0)), 4);

        // a (new), then three old accounts: a is the oldest of 4.
        env.at(1);
        env.judged(&see("p", "p-a", &a, recently())).await;
        for (i, user) in [&b, &c, &d].into_iter().enumerate() {
            env.at(2 + i as u64);
            env.judged(&see("p", &format!("p-{i}"), user, long_ago()))
                .await;
        }
        env.at(10);
        // The real check pushes a out of both sets before it counts the signal's set, so
        // m is the only new account among the last four. The dry run evicts nothing and
        // answers the same.
        let real = env.dry_then_real(see("p", "p-m", &m, recently())).await;
        assert_eq!(
            sig(&real, 0),
            SignalValue {
                applies: true,
                value: 1,
                share: Some(0.25),
                fired: false
            }
        );
        assert_eq!(
            (env.signal_members("p").await, env.all_members("p").await),
            (1, 4),
            "a left both sets"
        );

        // Ties within one millisecond go by member, the new one included: the smallest
        // hash is evicted even when it is the one just added, and a stays.
        env.at(20);
        for (user, created) in [
            (&a, recently()),
            (&b, long_ago()),
            (&c, long_ago()),
            (&d, long_ago()),
        ] {
            env.judged(&see("q", &format!("q-{user}"), user, created))
                .await;
        }
        let zero = "0".repeat(16);
        let first = env.judged(&see("q", "q-0", &zero, recently())).await;
        assert_eq!(
            sig(&first, 0),
            SignalValue {
                applies: true,
                value: 2,
                share: Some(0.5),
                fired: false
            }
        );
        assert_eq!(env.all_members("q").await, 4);
        // The largest hash is kept, and a (the smallest left) is evicted.
        let last = env
            .judged(&see("q", "q-f", &"f".repeat(16), recently()))
            .await;
        assert_eq!(
            sig(&last, 0),
            SignalValue {
                applies: true,
                value: 2,
                share: Some(0.5),
                fired: false
            }
        );
        assert_eq!(
            env.signal_members("q").await,
            2,
            "0 and f; a left with the all set"
        );
    }

    #[tokio::test]
    async fn window_keys_expire_with_their_window_and_then_everything_counts_afresh(env: Env) {
        let first = decide_the_expiring_plans(&env).await;
        let bound: BTreeMap<String, u64> = expiry_bounds(&env)
            .into_iter()
            .filter(|(key, _)| !is_signal_or_trust_key(key))
            .collect();
        assert_eq!(
            env.window_keys(),
            bound.keys().cloned().collect::<BTreeSet<_>>()
        );
        for (key, max) in &bound {
            let ttl = env
                .window_ttl_ms(key)
                .unwrap_or_else(|| panic!("{key} does not expire"));
            assert!(ttl > 0 && ttl <= *max, "{key} lives {ttl} ms, more than {max}");
        }
        // The last check was at 5 s; 70 s later every window has passed it: ann's next
        // check is answered as her first was (the switch from cid is forgotten too).
        env.at(75 * SEC);
        let later = env.judged(&expiring_plan("late", "ann")).await;
        assert_eq!(later, first);
        assert_eq!(allowed(&later), [1, 1, 1]);
        assert_eq!(
            later.signals.iter().map(|s| s.value).collect::<Vec<_>>(),
            [1, 1, 0, 1]
        );
    }

    #[tokio::test]
    async fn refund_gives_back_a_decided_request_in_the_limits_it_counted_in(env: Env) {
        // The filtered limit is a fixed window: a refund that wrongly took a request out
        // of a limit it never counted in would show in its count.
        let limits = [
            sliding("uid:u", HOUR, 5),
            fixed("fw:uid:u", HOUR, 5),
            bucket("tb:uid:u", HOUR, 5),
            fixed("new:fw:uid:u", HOUR, 5).only(Filter::NewAccount),
        ];
        let plan = |id: &str, created: u64| {
            let p = check(id).user("u").created(created).signal(signal(
                "rq",
                Count::Requests,
                id,
                HOUR,
                10,
            ));
            limits.iter().fold(p, |p, l| p.limit(l.clone()))
        };
        assert_eq!(
            allowed(&env.judged(&plan("n0", recently())).await),
            [1, 1, 1, 1]
        );
        assert_eq!(
            allowed(&env.judged(&plan("r1", long_ago())).await),
            [2, 2, 2, 0]
        );
        assert_eq!(
            allowed(&env.judged(&plan("r2", long_ago())).await),
            [3, 3, 3, 0]
        );
        let refund = RefundOp {
            record_key: record_key("r1"),
            records_key: records_key(),
            record_ttl_ms: HOUR,
            request_id: "r1".into(),
            keys: limits.iter().map(|l| l.key.clone()).collect(),
        };
        assert!(env.refund(&refund).await);
        assert!(!env.refund(&refund).await, "once");
        assert_eq!(
            allowed(&env.judged(&plan("r3", long_ago())).await),
            [3, 3, 3, 0]
        );
        assert_eq!(
            allowed(&env.judged(&plan("n4", recently())).await),
            [4, 4, 4, 2],
            "r1 never counted in the new accounts' limit, and was not taken from it"
        );
        assert_eq!(
            env.decide(&plan("r1", long_ago())).await,
            Decided::Duplicate { of: "r1".into() },
            "a refunded request is still a repeat"
        );
    }

    #[tokio::test]
    async fn a_score_in_the_challenge_band_is_challenged_and_consumes_nothing(env: Env) {
        // "always" fires on every request: 0.5, in [0.4, 0.7).
        let plan = |id: &str| {
            check(id)
                .user("ann")
                .created(long_ago())
                .score(0.7, None)
                .challenge(0.4)
                .passes(None)
                .weighted(signal("always", Count::Requests, id, HOUR, 0), 0.5)
                .limit(sliding("uid:ann", HOUR, 2))
        };
        let first = env.judged(&plan("r1")).await;
        assert_eq!((first.score, first.facts.passed), (0.5, Some(false)));
        assert_eq!(challenged(&first), [0], "nothing counted");
        // Recorded nothing: the same request id is decided anew, not a repeat.
        env.at(SEC);
        assert_eq!(challenged(&env.judged(&plan("r1")).await), [0]);
        assert!(env.window_keys().iter().all(|k| !k.ends_with("uid:ann")), "{:?}", env.window_keys());

        env.pass("ann", None, "p1", t0() + 2 * HOUR).await;
        env.at(2 * SEC);
        let passed = env.judged(&plan("r1")).await;
        assert_eq!(passed.facts.passed, Some(true));
        assert_eq!(allowed(&passed), [1], "the pass lifts the band; the claim counts");
        assert_eq!(
            env.decide(&plan("r1")).await,
            Decided::Duplicate { of: "r1".into() },
            "the allowed claim is a repeat now"
        );
        allowed(&env.judged(&plan("r2")).await);
        // A limit deny outranks the band: full, the user is denied, not asked to prove
        // themselves first.
        let full = env.judged(&plan("r3")).await;
        assert!(denied(&full)[0].exceeded, "{full:?}");
    }

    #[tokio::test]
    async fn a_pass_lifts_the_band_on_its_device_until_it_expires(env: Env) {
        let plan = |id: &str, device: &str| {
            check(id)
                .user("bea")
                .device(device)
                .created(long_ago())
                .score(0.7, None)
                .challenge(0.4)
                .passes(Some(device))
                .weighted(signal("always", Count::Requests, id, HOUR, 0), 0.5)
        };
        env.pass("bea", Some("phone"), "p1", t0() + 2 * HOUR).await;
        // Another user's pass lifts nothing.
        env.pass("cid", None, "p2", t0() + 2 * HOUR).await;
        allowed(&env.judged(&plan("r1", "phone")).await);
        let other = env.judged(&plan("r2", "laptop")).await;
        assert_eq!(other.facts.passed, Some(false), "passed on another device");
        challenged(&other);
        // Past the pass's expiry the band is back.
        env.at(2 * HOUR);
        challenged(&env.judged(&plan("r3", "phone")).await);
    }

    #[tokio::test]
    async fn a_pass_never_lifts_a_score_at_the_line(env: Env) {
        let plan = |id: &str| {
            check(id)
                .user("dan")
                .created(long_ago())
                .score(0.7, None)
                .challenge(0.4)
                .passes(None)
                .weighted(signal("always", Count::Requests, id, HOUR, 0), 0.8)
        };
        env.pass("dan", None, "p1", t0() + 2 * HOUR).await;
        let j = env.judged(&plan("r1")).await;
        assert_eq!((j.score, &j.outcome), (0.8, &Outcome::ScoreDeny));
    }

    #[tokio::test]
    async fn a_claim_sent_again_while_still_challenged_is_strong_evidence(env: Env) {
        // "again" counts the user's requests while no pass lifts the band: the second
        // one before a pass is what a script does, not a backend waiting for its user.
        let plan = |id: &str| {
            check(id)
                .user("fay")
                .created(long_ago())
                .score(0.7, None)
                .challenge(0.4)
                .passes(None)
                .weighted(signal("always", Count::Requests, id, HOUR, 0), 0.4)
                .weighted(
                    signal("again:fay", Count::Requests, id, HOUR, 1).only(Filter::Unverified),
                    0.3,
                )
        };
        let first = env.judged(&plan("r1")).await;
        challenged(&first);
        assert_eq!((sig(&first, 1).applies, value(&first, 1)), (true, 1));
        env.at(SEC);
        let again = env.judged(&plan("r2")).await;
        assert_eq!((again.score, &again.outcome), (0.7, &Outcome::ScoreDeny));
        env.pass("fay", None, "p1", t0() + 2 * HOUR).await;
        env.at(2 * SEC);
        let passed = env.judged(&plan("r3")).await;
        assert!(!sig(&passed, 1).applies, "a verified user's requests are not counted");
        assert_eq!(passed.score, 0.4);
        allowed(&passed);
    }

    #[tokio::test]
    async fn a_challenged_claim_leaves_its_idempotency_key_free(env: Env) {
        let plan = |id: &str| {
            check(id)
                .user("eve")
                .created(long_ago())
                .idem("k1")
                .score(0.7, None)
                .challenge(0.4)
                .passes(None)
                .weighted(signal("always", Count::Requests, id, HOUR, 0), 0.5)
                .limit(sliding("uid:eve", HOUR, 5))
        };
        challenged(&env.judged(&plan("r1")).await);
        env.pass("eve", None, "p1", t0() + 2 * HOUR).await;
        // The retry after the pass, under the same key and a new request id, is decided
        // anew and counted once.
        assert_eq!(allowed(&env.judged(&plan("r2")).await), [1]);
        assert_eq!(
            env.decide(&plan("r3")).await,
            Decided::Duplicate { of: "r2".into() }
        );
    }
}

/// A check with a signal of every kind and a limit of every algorithm, each with its own
/// window (10 s to 70 s).
fn expiring_plan(id: &str, user: &str) -> CheckPlan {
    check(id)
        .user(user)
        .device("d1")
        .idem(id)
        .signal(signal("upd:d1", Count::Users, user, 10 * SEC, 5))
        .signal(
            signal("new-upn:n1", Count::Users, user, 20 * SEC, 1)
                .only(Filter::NewAccount)
                .share(0.5),
        )
        .signal(signal("sw:d1", Count::UserSwitches, user, 30 * SEC, 5))
        .signal(signal("rq:d1", Count::Requests, id, 40 * SEC, 5))
        .limit(sliding(&format!("uid:{user}"), 50 * SEC, 3))
        .limit(fixed("fw:did:d1", 60 * SEC, 10))
        .limit(bucket("tb:did:d1", 70 * SEC, 10))
}

/// [`expiring_plan`] for r0..r5, a second apart; the first answer.
async fn decide_the_expiring_plans(env: &Env) -> Judgement {
    let mut first = None;
    for (i, user) in ["ann", "bob", "ann", "bob", "ann", "cid"]
        .into_iter()
        .enumerate()
    {
        env.at(i as u64 * SEC);
        let j = env.judged(&expiring_plan(&format!("r{i}"), user)).await;
        first.get_or_insert(j);
    }
    first.expect("six checks")
}

/// Every key [`decide_the_expiring_plans`] leaves in `env`'s store, and the most it may
/// live.
fn expiry_bounds(env: &Env) -> BTreeMap<String, u64> {
    let m = EXPIRY_MARGIN_MS;
    let mut bound: BTreeMap<String, u64> = [
        (format!("{SCENE}:sg:upd:d1"), 10 * SEC + m),
        (format!("{SCENE}:sg:new-upn:n1"), 20 * SEC + m),
        (format!("{SCENE}:sa:new-upn:n1"), 20 * SEC + m),
        (format!("{SCENE}:sg:sw:d1"), 30 * SEC + m),
        (format!("{SCENE}:sl:sw:d1"), 30 * SEC + m),
        (format!("{SCENE}:sg:rq:d1"), 40 * SEC + m),
        (format!("{SCENE}:uid:ann"), 50 * SEC + m),
        (format!("{SCENE}:uid:bob"), 50 * SEC + m),
        (format!("{SCENE}:uid:cid"), 50 * SEC + m),
        (format!("{SCENE}:fw:did:d1"), 60 * SEC + m),
        (format!("{SCENE}:tb:did:d1"), 70 * SEC + m),
        (user_seen_key("ann"), SEEN_TTL),
        (user_seen_key("bob"), SEEN_TTL),
        (user_seen_key("cid"), SEEN_TTL),
        (device_seen_key("d1"), SEEN_TTL),
    ]
    .into_iter()
    .collect();
    if matches!(env.backend, Backend::Redis { .. } | Backend::Cluster { .. }) {
        // The records of all six, in the hash of the hour they fell in: kept until the end
        // of the next hour (lua/limits.lua).
        bound.insert(format!("{}:{}", records_key(), t0() / HOUR), 2 * HOUR + m);
    }
    if matches!(env.backend, Backend::Embedded { .. }) {
        // A record and an idempotency record each (on Redis: fields of the records hash).
        for i in 0..6 {
            bound.insert(record_key(&format!("r{i}")), HOUR);
            bound.insert(format!("{SCENE}:idem:r{i}"), HOUR);
        }
    }
    bound
}

// ---------------------------------------------------------------------------------------
// Redis only
// ---------------------------------------------------------------------------------------

/// A plan with every part, for counting round trips.
fn everything(id: &str) -> CheckPlan {
    check(id)
        .user("ann")
        .device("d1")
        .idem(id)
        .score(0.9, Some(0.1))
        .weighted(signal("upd:d1", Count::Users, "ann", HOUR, 2), 0.3)
        .weighted(
            signal("new-upn:n1", Count::Users, "ann", HOUR, 1)
                .only(Filter::NewAccount)
                .share(0.5),
            0.2,
        )
        .weighted(signal("sw:d1", Count::UserSwitches, "ann", HOUR, 1), 0.3)
        .limit(sliding("uid:ann", HOUR, 3).per_user().bonus())
        .limit(fixed("fw:did:d1", HOUR, 5))
        .limit(bucket("tb:did:d1", MIN, 4))
}

#[tokio::test]
async fn decide_on_redis_is_one_evalsha_and_nothing_else() {
    let env = Env::redis().await;
    let server = env.server();
    env.award("ann", 1, "e1", t0() + DAY).await;
    let scripts = redis_non_evalsha_script_calls(server);
    let before = redis_evalsha_calls(server);
    allowed(&env.judged(&everything("r1")).await);
    assert_eq!(redis_evalsha_calls(server), before + 1);
    env.judged(&everything("r2").dry()).await;
    assert_eq!(redis_evalsha_calls(server), before + 2);
    assert_eq!(
        env.decide(&everything("r1")).await,
        Decided::Duplicate { of: "r1".into() }
    );
    assert_eq!(redis_evalsha_calls(server), before + 3);
    assert_eq!(
        redis_non_evalsha_script_calls(server),
        scripts,
        "no EVAL, SCRIPT or MULTI"
    );
}

/// A request id the service made for this check is new by construction: the script does
/// not look for its record (a call per check saved), while an id the caller named is
/// still looked up, and its repeat counts once.
#[tokio::test]
async fn on_redis_only_a_named_request_id_is_looked_up() {
    let env = Env::redis().await;
    let server = env.server();
    let lookups = || server.command_calls().get("hget").copied().unwrap_or(0);
    let plan = |id: &str| check(id).user("ann").limit(sliding("uid:ann", HOUR, 5));

    allowed(&env.judged(&plan("m1").made_id()).await);
    allowed(&env.judged(&plan("m2").made_id()).await);
    assert_eq!(lookups(), 0, "no lookup for ids the service made");

    // A new id is looked for in this generation's records and the last one's.
    allowed(&env.judged(&plan("n1")).await);
    assert_eq!(lookups(), 2);
    assert_eq!(
        env.decide(&plan("n1")).await,
        Decided::Duplicate { of: "n1".into() }
    );
    assert_eq!(lookups(), 3, "found in this generation's");
    assert_eq!(
        allowed(&env.judged(&plan("n2")).await),
        [4],
        "the repeat counted once"
    );
}

#[tokio::test]
async fn decide_on_redis_survives_a_script_flush() {
    let env = Env::redis().await;
    env.server().command(&["SCRIPT", "FLUSH"]);
    allowed(&env.judged(&everything("r1")).await);
}

#[tokio::test]
async fn on_redis_every_key_is_named_and_expires_within_its_window_and_the_margin() {
    let env = Env::redis().await;
    decide_the_expiring_plans(&env).await;
    let bound = expiry_bounds(&env);
    let server = env.server();
    let keys: BTreeSet<String> = redis_keys(server).into_iter().collect();
    assert_eq!(keys, bound.keys().cloned().collect::<BTreeSet<_>>());
    for key in keys {
        let ttl = u64::try_from(redis_pttl(server, &key))
            .unwrap_or_else(|_| panic!("{key} does not expire"));
        assert!(
            ttl > 0 && ttl <= bound[&key],
            "{key} lives {ttl} ms, more than {}",
            bound[&key]
        );
    }
}

#[tokio::test]
async fn on_redis_a_real_check_trims_expired_awards() {
    let env = Env::redis().await;
    env.award("bob", 2, "b1", t0() + DAY).await;
    env.award("bob", 1, "b2", t0() + 2 * DAY).await;
    let plan = |id: &str| check(id).user("bob").created(long_ago());
    assert_eq!(redis_zcard(env.server(), &points_key("bob")), 2);
    env.at(DAY);
    env.judged(&plan("d1").dry()).await;
    assert_eq!(
        redis_zcard(env.server(), &points_key("bob")),
        2,
        "a dry run trims nothing"
    );
    assert_eq!(env.judged(&plan("r1")).await.facts.points, 1);
    assert_eq!(redis_zcard(env.server(), &points_key("bob")), 1);
}

/// A request record on one Redis without the stamp of the attempt that wrote it
/// (`~<digits>`, so a release after a failed call takes that attempt's record only).
fn unstamped(record: &str) -> &str {
    let (record, stamp) = record
        .rsplit_once('~')
        .unwrap_or_else(|| panic!("{record}: no attempt's stamp"));
    assert!(
        !stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_digit()),
        "{record}: the stamp is digits"
    );
    record
}

#[tokio::test]
async fn on_redis_the_request_record_names_the_fixed_windows_and_buckets_written() {
    // refund.lua's contract: what this request added to which fixed window or bucket (a
    // sliding window's member is the request id itself: refund.lua finds it there).
    let env = Env::redis().await;
    let plan = check("r1")
        .user("u")
        .created(long_ago())
        .limit(sliding("uid:u", HOUR, 5))
        .limit(fixed("fw:uid:u", HOUR, 5))
        .limit(bucket("tb:uid:u", HOUR, 5))
        .limit(sliding("new:uid:u", HOUR, 5).only(Filter::NewAccount));
    env.at(5 * SEC);
    assert_eq!(allowed(&env.judged(&plan).await), [1, 1, 1, 0]);
    let now = t0() + 5 * SEC;
    let record = redis_record(env.server(), "r1", now).expect("record");
    let tag = |key: &str| String::from_utf8(record_tag(key).to_vec()).expect("ASCII");
    assert_eq!(
        unstamped(&record),
        format!(
            "{}f{}t{}",
            now % HOUR,
            tag(&format!("{SCENE}:fw:uid:u")),
            tag(&format!("{SCENE}:tb:uid:u"))
        ),
        "when, and only the keys written"
    );
    // A request that counted nowhere, or in sliding windows only, still has a record.
    let nowhere = check("r2")
        .user("u")
        .created(long_ago())
        .limit(sliding("new:uid:u", HOUR, 5).only(Filter::NewAccount));
    assert_eq!(allowed(&env.judged(&nowhere).await), [0]);
    let record = redis_record(env.server(), "r2", now).expect("record");
    assert_eq!(unstamped(&record), (now % HOUR).to_string());
    let sliding_only = check("r3").user("u").limit(sliding("uid:u", HOUR, 5));
    assert_eq!(allowed(&env.judged(&sliding_only).await), [2]);
    let record = redis_record(env.server(), "r3", now).expect("record");
    assert_eq!(unstamped(&record), (now % HOUR).to_string());

    // Refunded, every key gives its unit back, once.
    let refund = |id: &str| RefundOp {
        record_key: record_key(id),
        records_key: records_key(),
        record_ttl_ms: HOUR,
        request_id: id.into(),
        keys: plan.limits.iter().map(|l| l.key.clone()).collect(),
    };
    assert!(env.refund(&refund("r1")).await);
    assert!(!env.refund(&refund("r1")).await, "once");
    assert!(env.refund(&refund("r3")).await, "a sliding-only request");
    assert!(!env.refund(&refund("r3")).await, "once");
    let again = check("r4")
        .user("u")
        .created(long_ago())
        .limit(sliding("uid:u", HOUR, 5))
        .limit(fixed("fw:uid:u", HOUR, 5))
        .limit(bucket("tb:uid:u", HOUR, 5));
    assert_eq!(allowed(&env.judged(&again).await), [1, 1, 1]);
}

/// A record written before 2026-12 is a key of its own (`<scene>:req:<id>`, JSON naming
/// fixed windows "f:<start>" and, earlier still, sliding keys "z"): a refund after the
/// upgrade, which names the request's per-entity record, still finds it there and gives
/// every unit back, once.
#[tokio::test]
async fn on_redis_a_record_from_before_the_records_hashes_is_still_refunded() {
    let env = Env::redis().await;
    let server = env.server();
    let key = format!("{SCENE}:uid:old");
    let fixed_key = format!("{SCENE}:fw:uid:old");
    let at = (t0() - 1_000).to_string();
    server.command(&["ZADD", &key, &at, "r-old"]);
    server.command(&["ZADD", &key, &at, "r-other"]);
    // The current hour's fixed window, counted by r-old and one other request.
    server.command(&["HSET", &fixed_key, "s", &t0().to_string(), "c", "2"]);
    server.command(&["PEXPIRE", &fixed_key, "60000"]);
    let record = format!(r#"{{"k":{{"{key}":"z","{fixed_key}":"f:{}"}}}}"#, t0());
    server.command(&["SET", &record_key("r-old"), &record, "PX", "60000"]);
    let refund = RefundOp {
        // Where a check made now keeps its record: not where this one is.
        record_key: format!("{SCENE}:req:all:r-old"),
        records_key: records_key(),
        record_ttl_ms: HOUR,
        request_id: "r-old".into(),
        keys: vec![key.clone(), fixed_key.clone()],
    };
    assert!(env.refund(&refund).await);
    assert!(!env.refund(&refund).await, "once");
    let check = check("r-new")
        .user("old")
        .limit(sliding("uid:old", HOUR, 5))
        .limit(fixed("fw:uid:old", HOUR, 5));
    assert_eq!(
        allowed(&env.judged(&check).await),
        [2, 2],
        "r-other stays in both"
    );
}
