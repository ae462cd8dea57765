//! The plan of one check: the request and its scene resolved into every key, threshold
//! and weight a decider needs ([`CheckPlan`]), so neither decider reads a rule.
//!
//! What is resolved here and what is left to the decider: everything that depends only on
//! the request and the rules is resolved here (keys, CIDR overrides, caps, weights); what
//! depends on what the store holds (points, ages, counts) is the decider's.

use super::quota::overridden_max;
use super::request::CheckRequest;
use crate::decide::{CheckPlan, LimitPlan, PassScopes, ScorePlan, SignalPlan, TrustPlan};
use crate::keys::{DimensionValues, KeyPrefix, KeySpace, SignalKey, SEEN_RETENTION_MS};
use crate::rules::{Algorithm, Count, Dimension, RuleSet, Scene, Signal, Trust};
use crate::signal::entity_hash;
use crate::signal::signal_cap;
use crate::trust::ledger::pass_scope;

/// The name of the new-account weight in `[scene.X.score].weights`.
pub const NEW_ACCOUNT: &str = "new_account";

/// Where each planned limit came from: `limits[i]` of the plan is `scene.limits[index[i]]`.
pub type LimitIndex = Vec<usize>;

/// The plan of `req` under `rules`, and which scene limit each planned limit is; its
/// records live for [`Scene::record_ttl_ms`] of `record_horizon_ms` (on Redis, up to twice
/// that: lua/limits.lua).
pub fn plan(
    prefix: &KeyPrefix,
    rules: &RuleSet,
    req: &CheckRequest,
    record_horizon_ms: u64,
) -> (CheckPlan, LimitIndex) {
    let scene = &req.scene;
    let ks = prefix.scene(&scene.name);
    let values = &req.values;
    let (limits, index) = limits(&ks, scene, values);
    let idempotency_key = req
        .idempotency_key
        .as_deref()
        .map(|k| ks.idempotency_key(values, &scene.required, k));
    let signals = scene
        .signals
        .iter()
        .filter_map(|s| signal(&ks, s, req, idempotency_key.as_deref()))
        .collect::<Vec<_>>();
    let score = scene.score.as_ref().map(|score| ScorePlan {
        weights: signals
            .iter()
            .map(|s| score.weights.get(&s.name).copied().unwrap_or(0.0))
            .collect(),
        new_account_weight: score.weights.get(NEW_ACCOUNT).copied(),
        silent_deny_at: score.silent_deny_at,
        challenge_at: score.challenge_at,
    });
    let plan = CheckPlan {
        record_key: ks.record_key(values, &scene.required, &req.request_id),
        records_key: ks.records_key(values, &scene.required),
        idempotency_key,
        request_id: req.request_id.clone(),
        id_given: req.id_given,
        record_ttl_ms: scene.record_ttl_ms(record_horizon_ms),
        dry_run: req.dry_run,
        trust: trust(prefix, rules, req),
        signals,
        score,
        limits,
    };
    (plan, index)
}

/// A rule set without `[trust]`: no points, no ages.
const NO_TRUST: Trust = Trust {
    payment_succeeded: None,
    identity_verified: None,
    challenge_passed: None,
    max_points: 0,
    bonus_per_point: 0,
    score_discount_per_point: 0.0,
    new_account: None,
    new_device: None,
};

/// The trust block: with `[trust]`, or for a scene that can challenge (its passes are
/// kept with the points; without `[trust]` there are no points, ages or filters to read).
fn trust(prefix: &KeyPrefix, rules: &RuleSet, req: &CheckRequest) -> Option<TrustPlan> {
    let scene = &req.scene;
    let t = match (&rules.trust, &scene.challenge) {
        (Some(t), _) => t,
        (None, Some(_)) => &NO_TRUST,
        (None, None) => return None,
    };
    let user = req.values.user.as_deref();
    let device = req.values.device.as_deref();
    let created = req
        .user_created_at
        .map(|c| u64::try_from(c.timestamp_millis()).unwrap_or(0));
    Some(TrustPlan {
        points_key: user.map(|u| prefix.trust_points_key(u)),
        // The sighting stands in for a creation time the backend did not send.
        user_seen_key: user
            .filter(|_| t.new_account.is_some() && created.is_none())
            .map(|u| prefix.user_seen_key(u)),
        device_seen_key: device
            .filter(|_| t.new_device.is_some())
            .map(|d| prefix.device_seen_key(d)),
        user_created_ms: created.filter(|_| user.is_some()),
        seen_ttl_ms: SEEN_RETENTION_MS,
        max_points: t.max_points,
        bonus_per_point: t.bonus_per_point,
        discount_per_point: t.score_discount_per_point,
        new_account: t.new_account.map(|n| (n.younger_than_ms, n.max_factor)),
        new_device_ms: t.new_device.map(|n| n.younger_than_ms),
        passes: scene.challenge.as_ref().and(user).map(|_| PassScopes {
            any_device: pass_scope(&scene.name, None),
            this_device: device.map(|d| pass_scope(&scene.name, Some(d))),
        }),
    })
}

/// A counted value as a set member: 16 hex digits of its stable hash, so a set's memory
/// does not depend on how long the ids are.
pub fn member_of(value: &str) -> String {
    format!("{:016x}", entity_hash(value))
}

/// `idempotency_key`: the check's, as a key (scoped to its first entity, so two users'
/// keys never count as one claim).
fn signal(
    ks: &KeySpace<'_>,
    s: &Signal,
    req: &CheckRequest,
    idempotency_key: Option<&str>,
) -> Option<SignalPlan> {
    let values = &req.values;
    let member = match s.count.counted() {
        Some(dim) => member_of(values.get(&dim)?),
        // A claim is named by its idempotency key when it has one: its copies are one
        // action of the user's (while it is challenged they are decided anew, and must
        // not count as a script's tries).
        None => idempotency_key.unwrap_or(&req.request_id).to_string(),
    };
    let key = ks.signal_key(SignalKey::Matching, &s.name, &s.per, values)?;
    let all_key = match s.min_share {
        Some(_) => Some(ks.signal_key(SignalKey::All, &s.name, &s.per, values)?),
        None => None,
    };
    let last_key = match s.count {
        Count::UserSwitches => Some(ks.signal_key(SignalKey::Last, &s.name, &s.per, values)?),
        _ => None,
    };
    Some(SignalPlan {
        name: s.name.clone(),
        key,
        all_key,
        last_key,
        count: s.count,
        member,
        filter: s.filter,
        window_ms: s.window_ms.max(1),
        max: s.max,
        min_share: s.min_share,
        cap: signal_cap(s.max, s.min_share),
    })
}

fn limits(
    ks: &KeySpace<'_>,
    scene: &Scene,
    values: &DimensionValues,
) -> (Vec<LimitPlan>, LimitIndex) {
    let mut planned: Vec<LimitPlan> = Vec::with_capacity(scene.limits.len());
    let mut index = Vec::with_capacity(scene.limits.len());
    for (i, limit) in scene.limits.iter().enumerate() {
        // Every dimension of a limit is required by the scene: a key always builds.
        let Some(key) = ks.limit_key(limit, values) else {
            continue;
        };
        planned.push(LimitPlan {
            key,
            algorithm: limit.algorithm,
            window_ms: limit.window_ms.max(1),
            base_max: overridden_max(scene, limit, values.ip.as_ref()),
            per_user: limit.dimensions.contains(&Dimension::User),
            trust_bonus: limit.trust_bonus,
            retain_ms: limit.window_ms.max(1),
            filter: limit.filter,
        });
        index.push(i);
    }
    // Sliding limits over the same dimensions share one ZSET: it must keep members for
    // the longest of their windows.
    for i in 0..planned.len() {
        if planned[i].algorithm != Algorithm::SlidingWindow {
            continue;
        }
        let retain = planned
            .iter()
            .filter(|o| o.algorithm == Algorithm::SlidingWindow && o.key == planned[i].key)
            .map(|o| o.window_ms)
            .max()
            .unwrap_or(planned[i].window_ms);
        planned[i].retain_ms = retain;
    }
    (planned, index)
}
