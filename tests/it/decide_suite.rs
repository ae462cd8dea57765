//! One behaviour suite for every [`Decider`]: what a check learns (trust points, first
//! sightings), what its signals count, how it scores, and how its limits hold, as a user
//! of the service would notice them. Today it runs on the Redis decider (`lua/decide.lua`
//! on a throwaway `redis-server` per test); another decider joins by one line in
//! [`on_every_decider!`] and its arms in [`Env`].
//!
//! Cases move a [`ManualClock`] (never sleep). It starts at [`t0`], the current hour:
//! trust awards expire with PEXPIREAT in Redis's own clock, so the manual clock must stay
//! near the real time for an award to live as long as the test needs it.
//!
//! Redis-only behaviour (one EVALSHA per check, NOSCRIPT) is at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use vigia::clock::ManualClock;
use vigia::decide::math::{effective_max, score as math_score, signal_cap};
use vigia::decide::redis::RedisDecider;
use vigia::decide::{
    CheckPlan, Decided, Decider, Judgement, LimitPlan, LimitValue, Outcome, ScorePlan, SignalPlan,
    SignalValue, TrustPlan,
};
use vigia::rules::{Algorithm, Count, Filter};
use vigia::store::redis::RedisStore;
use vigia::store::{LimitState, RefundOp, WindowStore, EXPIRY_MARGIN_MS};
use vigia::trust::{Award, AwardKind, RedisLedger, TrustLedger};

use crate::common::RedisServer;
use crate::store_suite::{
    redis_evalsha_calls, redis_keys, redis_non_evalsha_script_calls, redis_pttl, redis_zcard, DAY,
    SEC, TEST_TIMEOUT_MS,
};

const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;
/// The prefix of every key (trust keys: `<PREFIX>:trust-points:…`).
const PREFIX: &str = "vg";
/// The scene's key prefix (`<prefix>:<scene>`).
const SCENE: &str = "vg:t";
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

/// A check with nothing to read, count or limit.
fn check(id: &str) -> CheckPlan {
    CheckPlan {
        record_key: record_key(id),
        idempotency_key: None,
        request_id: id.to_string(),
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
        Outcome::Allowed { limits } | Outcome::Denied { limits } => limits,
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
        /// Refunds (refund.lua) go through the window store.
        store: RedisStore,
        /// Awards go through the trust ledger (trust_award.lua).
        ledger: RedisLedger,
    },
}

/// A fresh decider reading a manual clock at [`t0`], and a way to look inside.
struct Env {
    decider: Arc<dyn Decider>,
    clock: ManualClock,
    backend: Backend,
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
        let ledger = RedisLedger::new(link.clone(), PREFIX)
            .await
            .expect("ledger")
            .with_clock(Arc::new(clock.clone()));
        assert_eq!(ledger.points_key("ann"), points_key("ann"));
        assert_eq!(ledger.seen_key("ann"), user_seen_key("ann"));
        let decider = RedisDecider::new(link, Some(Arc::new(clock.clone())))
            .await
            .expect("decider");
        Env {
            decider: Arc::new(decider),
            clock,
            backend: Backend::Redis {
                server,
                store,
                ledger,
            },
        }
    }

    /// Sets the clock to `t0() + ms`.
    fn at(&self, ms: u64) {
        self.clock.set(t0() + ms);
    }

    async fn decide(&self, plan: &CheckPlan) -> Decided {
        self.decider
            .decide(plan)
            .await
            .unwrap_or_else(|e| panic!("decide {} failed: {e}", plan.request_id))
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

    /// Decides `plan` as a dry run, then for real: asserts that the dry run changed no key
    /// and no expiry, and answered as the real check; the real answer.
    async fn dry_then_real(&self, plan: CheckPlan) -> Judgement {
        self.freeze_ttls();
        let before = self.snapshot();
        let dry = self.judged(&plan.clone().dry()).await;
        let what = format!("the dry run of {}", plan.request_id);
        assert_eq!(self.snapshot(), before, "{what} changed something");
        self.assert_ttls_frozen(&what);
        let real = self.judged(&plan).await;
        assert_eq!(dry, real, "{what} answered otherwise");
        real
    }

    /// Awards `points` to `user` until `expires_at_ms`.
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
        }
    }

    async fn refund(&self, op: &RefundOp) -> bool {
        match &self.backend {
            Backend::Redis { store, .. } => store.refund(op).await.expect("refund"),
        }
    }

    /// Every key held.
    fn keys(&self) -> BTreeSet<String> {
        match &self.backend {
            Backend::Redis { server, .. } => redis_keys(server).into_iter().collect(),
        }
    }

    fn exists(&self, key: &str) -> bool {
        self.keys().contains(key)
    }

    /// Members of a set (0 when absent).
    fn members(&self, key: &str) -> u64 {
        match &self.backend {
            Backend::Redis { server, .. } => redis_zcard(server, key),
        }
    }

    /// A string key's value.
    fn get(&self, key: &str) -> Option<String> {
        match &self.backend {
            Backend::Redis { server, .. } => redis::cmd("GET")
                .arg(key)
                .query(&mut server.conn())
                .expect("GET"),
        }
    }

    /// Ms until `key` expires (`None`: absent or immortal).
    fn ttl_ms(&self, key: &str) -> Option<u64> {
        match &self.backend {
            Backend::Redis { server, .. } => u64::try_from(redis_pttl(server, key)).ok(),
        }
    }

    /// Sets every key's expiry to [`FROZEN_TTL_MS`], so [`Env::assert_ttls_frozen`] can tell
    /// later whether anything refreshed one.
    fn freeze_ttls(&self) {
        match &self.backend {
            Backend::Redis { server, .. } => {
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
    }

    /// No key's expiry was set since [`Env::freeze_ttls`] (a test runs in well under 2 s).
    fn assert_ttls_frozen(&self, what: &str) {
        for key in self.keys() {
            let ttl = self.ttl_ms(&key).unwrap_or(0);
            assert!(
                ttl <= FROZEN_TTL_MS && ttl + 2 * SEC > FROZEN_TTL_MS,
                "{what} set the expiry of {key} (PTTL {ttl})"
            );
        }
    }

    /// Every key and its whole content, for before/after comparisons.
    fn snapshot(&self) -> BTreeMap<String, String> {
        match &self.backend {
            Backend::Redis { server, .. } => {
                let mut conn = server.conn();
                redis_keys(server)
                    .into_iter()
                    .map(|key| {
                        let kind: String =
                            redis::cmd("TYPE").arg(&key).query(&mut conn).expect("TYPE");
                        let content = match kind.as_str() {
                            "string" => format!("{:?}", self.get(&key)),
                            "zset" => {
                                let m: Vec<(String, String)> = redis::cmd("ZRANGE")
                                    .arg(&key)
                                    .arg(0)
                                    .arg(-1)
                                    .arg("WITHSCORES")
                                    .query(&mut conn)
                                    .expect("ZRANGE");
                                format!("{m:?}")
                            }
                            "hash" => {
                                let h: BTreeMap<String, String> = redis::cmd("HGETALL")
                                    .arg(&key)
                                    .query(&mut conn)
                                    .expect("HGETALL");
                                format!("{h:?}")
                            }
                            other => format!("a {other}"),
                        };
                        (key, format!("{kind} {content}"))
                    })
                    .collect()
            }
        }
    }
}

/// Defines each case on every decider: `on_redis::NAME` (add `on_embedded` here when the
/// embedded decider lands, with its arms in [`Env`]).
macro_rules! on_every_decider {
    ($( $(#[$meta:meta])* async fn $name:ident($env:ident: Env) $body:block )*) => {
        mod on_redis {
            use super::*;
            $( $(#[$meta])* async fn $name() { let $env = Env::redis().await; $body } )*
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
        assert_eq!(
            env.members(&points_key("bob")),
            1,
            "the expired award is trimmed"
        );
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
        assert_eq!(env.get(&user_seen_key("ann")), Some(t0().to_string()));

        let old = env
            .judged(&check("r2").user("old").created(long_ago()))
            .await;
        assert_eq!(old.facts.new_account, Some(false));
        assert!(
            !env.exists(&user_seen_key("old")),
            "the creation date needs no sighting"
        );
        let created = env
            .judged(&check("r3").user("fresh").created(recently()))
            .await;
        assert_eq!(created.facts.new_account, Some(true));

        // A dry run sees a new user and records no sighting.
        let dry = env.judged(&check("d1").user("bea").dry()).await;
        assert_eq!(dry.facts.new_account, Some(true));
        assert!(!env.exists(&user_seen_key("bea")));
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
        assert_eq!(
            env.get(&user_seen_key("ann")),
            Some(t0().to_string()),
            "first, kept"
        );

        // Unknown: no user, or no [trust].new_account.
        assert_eq!(
            env.judged(&check("r9").trusted()).await.facts.new_account,
            None
        );
        let mut plan = check("r10").user("cid");
        plan.trust.as_mut().expect("trust").new_account = None;
        assert_eq!(env.judged(&plan).await.facts.new_account, None);
        assert!(!env.exists(&user_seen_key("cid")), "nobody asked the age");
        assert_eq!(env.judged(&check("r11")).await.facts.new_account, None);
    }

    #[tokio::test]
    async fn a_device_is_new_from_its_first_sighting(env: Env) {
        let first = env.judged(&check("r1").device("d1")).await;
        assert_eq!(first.facts.new_device, Some(true));
        assert_eq!(first.facts.new_account, None, "no user");
        assert!(env.exists(&device_seen_key("d1")));

        let dry = env.judged(&check("d1").device("d2").dry()).await;
        assert_eq!(dry.facts.new_device, Some(true));
        assert!(!env.exists(&device_seen_key("d2")));
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
        assert_eq!(
            env.members(&format!("{SCENE}:sg:rq")),
            cap,
            "the set keeps the cap"
        );
        // Everything leaves with the window.
        env.at(5 + w);
        assert_eq!(value(&env.judged(&see("late")).await, 0), 1);
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
        assert!(
            !env.exists(&format!("{SCENE}:sg:new-per-dev")),
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
        assert_eq!(env.members(&format!("{SCENE}:sg:new-per-dev")), 2);
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
        assert_eq!(env.members(&format!("{SCENE}:sg:upn:c")), 0);
        assert_eq!(env.members(&format!("{SCENE}:sa:upn:c")), cap);
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
        assert_eq!(env.members(&format!("{SCENE}:sg:sw:d2")), 1);
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
        assert!(!env.exists(&record_key("r1")), "no request record");
        assert_eq!(
            env.members(&format!("{SCENE}:sg:seen")),
            1,
            "the signal observed it"
        );

        env.at(MIN);
        let later = env.judged(&plan("r2")).await;
        assert_eq!(later.facts.new_account, Some(false));
        assert_eq!(allowed(&later), [1, 1, 1], "the first in every window");
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
        let record: serde_json::Value =
            serde_json::from_str(&env.get(&record_key("r5")).expect("record")).expect("json");
        assert_eq!(
            record,
            serde_json::json!({"k": {format!("{SCENE}:ip:1"): "z"}})
        );
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
        assert!(!env.exists(&record_key("r2")));
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
        env.freeze_ttls();
        let before = env.snapshot();
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
        assert_eq!(env.snapshot(), before);
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
        assert_eq!(env.members(&format!("{SCENE}:sa:q")), 4);
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
            env.members(&format!("{SCENE}:sg:q")),
            2,
            "0 and f; a left with the all set"
        );
    }

    #[tokio::test]
    async fn every_key_written_expires_within_its_window_and_the_margin(env: Env) {
        let m = EXPIRY_MARGIN_MS;
        let plan = |id: &str, user: &str| {
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
        };
        for (i, user) in ["ann", "bob", "ann", "bob", "ann", "cid"]
            .into_iter()
            .enumerate()
        {
            env.at(i as u64 * SEC);
            env.judged(&plan(&format!("r{i}"), user)).await;
        }
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
        for i in 0..6 {
            bound.insert(record_key(&format!("r{i}")), HOUR);
            bound.insert(format!("{SCENE}:idem:r{i}"), HOUR);
        }
        let keys = env.keys();
        assert_eq!(keys, bound.keys().cloned().collect::<BTreeSet<_>>());
        for key in keys {
            let ttl = env
                .ttl_ms(&key)
                .unwrap_or_else(|| panic!("{key} does not expire"));
            assert!(
                ttl > 0 && ttl <= bound[&key],
                "{key} lives {ttl} ms, more than {}",
                bound[&key]
            );
        }
    }

    #[tokio::test]
    async fn refund_gives_back_a_decided_request(env: Env) {
        let limits = [
            sliding("uid:u", HOUR, 5),
            fixed("fw:uid:u", HOUR, 5),
            bucket("tb:uid:u", HOUR, 5),
            sliding("new:uid:u", HOUR, 5).only(Filter::NewAccount),
        ];
        let plan = |id: &str| {
            let p = check(id).user("u").created(long_ago()).signal(signal(
                "rq",
                Count::Requests,
                id,
                HOUR,
                10,
            ));
            limits.iter().fold(p, |p, l| p.limit(l.clone()))
        };
        assert_eq!(allowed(&env.judged(&plan("r1")).await), [1, 1, 1, 0]);
        assert_eq!(allowed(&env.judged(&plan("r2")).await), [2, 2, 2, 0]);
        let record: serde_json::Value =
            serde_json::from_str(&env.get(&record_key("r1")).expect("record")).expect("json");
        let fixed_start = t0() - t0() % HOUR;
        assert_eq!(
            record,
            serde_json::json!({"k": {
                format!("{SCENE}:uid:u"): "z",
                format!("{SCENE}:fw:uid:u"): format!("f:{fixed_start}"),
                format!("{SCENE}:tb:uid:u"): "t",
            }}),
            "only the keys written"
        );
        let refund = RefundOp {
            record_key: record_key("r1"),
            request_id: "r1".into(),
            keys: limits.iter().map(|l| l.key.clone()).collect(),
        };
        assert!(env.refund(&refund).await);
        assert!(!env.refund(&refund).await, "once");
        assert_eq!(allowed(&env.judged(&plan("r3")).await), [2, 2, 2, 0]);
        assert_eq!(
            env.decide(&plan("r1")).await,
            Decided::Duplicate { of: "r1".into() }
        );
    }
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
    let Backend::Redis { server, .. } = &env.backend;
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

#[tokio::test]
async fn decide_on_redis_survives_a_script_flush() {
    let env = Env::redis().await;
    let Backend::Redis { server, .. } = &env.backend;
    server.command(&["SCRIPT", "FLUSH"]);
    allowed(&env.judged(&everything("r1")).await);
}
