//! The embedded decider: one node, no Redis. The same four steps as `lua/decide.lua`, on
//! the node's own state: the sled ledger (facts), the behaviour actors (signals), the
//! shared arithmetic ([`math`]), the embedded window store (limits).
//!
//! Not one atomic step as the script is: two checks of one farm may interleave between
//! the actors and the window store. What each step holds is still exact — the actors
//! serialise each entity, the window store locks each check's keys — and a decision
//! reads nothing it wrote in another step, so the answers are the script's.
//!
//! Without a ledger (a Redis node deciding a `local` scene on its own state while Redis is
//! down) nothing is known about trust: no points, ages unknown.

use std::sync::Arc;

use async_trait::async_trait;

use super::math::{self, effective_max, passes};
use super::{
    CheckPlan, Decided, Decider, Facts, Judgement, LimitValue, Outcome, SignalValue, TrustPlan,
};
use crate::behaviour::Behaviours;
use crate::clock::Clock;
use crate::keys::decode_segment;
use crate::store::embedded::EmbeddedStore;
use crate::store::{CheckOp, CheckOutcome, LimitOp, LimitState, StoreError, WindowStore};
use crate::trust::SledLedger;

/// The [`Decider`] of the embedded store.
pub struct EmbeddedDecider {
    windows: Arc<EmbeddedStore>,
    behaviours: Behaviours,
    ledger: Option<Arc<SledLedger>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for EmbeddedDecider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedDecider")
            .field("windows", &self.windows)
            .field("ledger", &self.ledger.is_some())
            .finish()
    }
}

impl EmbeddedDecider {
    pub fn new(
        windows: Arc<EmbeddedStore>,
        behaviours: Behaviours,
        ledger: Option<Arc<SledLedger>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        EmbeddedDecider {
            windows,
            behaviours,
            ledger,
            clock,
        }
    }

    /// Points and ages, marking the user and device seen unless a dry run.
    fn facts(
        &self,
        trust: Option<&TrustPlan>,
        dry_run: bool,
        now: u64,
    ) -> Result<Facts, StoreError> {
        let (Some(trust), Some(ledger)) = (trust, &self.ledger) else {
            return Ok(Facts::default());
        };
        let mut facts = Facts::default();
        if let Some(user) = trust.points_key.as_deref().and_then(user_of) {
            let scopes: Vec<&str> = trust.passes.iter().flat_map(|p| p.iter()).collect();
            let (points, passed) = ledger.points_and_pass(&user, &scopes, now)?;
            facts.points = points.min(trust.max_points);
            facts.passed = trust.passes.as_ref().map(|_| passed);
        }
        // Without a user there is no age, whatever the check says it was created.
        let has_user = trust.points_key.is_some() || trust.user_seen_key.is_some();
        if let (Some((younger_than, _)), true) = (trust.new_account, has_user) {
            let born = match (trust.user_created_ms, trust.user_seen_key.as_deref()) {
                (Some(created), _) => Some(created),
                // A user never seen is seen now (a dry run records nothing, but the
                // answer is the one a real check would get).
                (None, Some(key)) => match user_of(key) {
                    Some(user) => Some(ledger.user_seen(&user, !dry_run, now)?.unwrap_or(now)),
                    None => None,
                },
                (None, None) => None,
            };
            facts.new_account = born.map(|b| math::is_young(b, now, younger_than));
        }
        let device = trust.device_seen_key.as_deref().and_then(device_of);
        if let (Some(younger_than), Some(device)) = (trust.new_device_ms, device) {
            let born = ledger.device_seen(&device, !dry_run, now)?.unwrap_or(now);
            facts.new_device = Some(math::is_young(born, now, younger_than));
        }
        Ok(facts)
    }
}

/// The raw user id of a trust or sighting key (`<prefix>:<kind>:uid:<encoded id>`): the
/// sled ledger is keyed by raw ids, as the events that fill it name them.
fn user_of(key: &str) -> Option<String> {
    key.split_once(":uid:")
        .and_then(|(_, id)| decode_segment(id))
}

/// The raw device id of a sighting key (`<prefix>:device-seen:did:<encoded id>`).
fn device_of(key: &str) -> Option<String> {
    key.split_once(":did:")
        .and_then(|(_, id)| decode_segment(id))
}

#[async_trait]
impl Decider for EmbeddedDecider {
    async fn decide(&self, plan: &CheckPlan) -> Result<Decided, StoreError> {
        // A repeat must not mark sightings or feed the actors, so it is answered before
        // either. With neither in the plan the window store's own test (under its locks)
        // is the only one needed, and this one would lock the record's shard twice.
        let marks = plan.trust.is_some() && self.ledger.is_some();
        if marks || !plan.signals.is_empty() {
            if let Some(of) = self.windows.counted(
                plan.id_given.then_some(plan.record_key.as_str()),
                plan.idempotency_key.as_deref(),
                &plan.request_id,
            ) {
                return Ok(Decided::Duplicate { of });
            }
        }
        let now = self.clock.now_ms();
        let facts = self.facts(plan.trust.as_ref(), plan.dry_run, now)?;
        let applies: Vec<bool> = plan
            .signals
            .iter()
            .map(|s| s.filter.is_none_or(|f| passes(f, &facts)))
            .collect();
        let signals: Vec<SignalValue> = if plan.signals.is_empty() {
            Vec::new()
        } else {
            self.behaviours
                .signals(&plan.signals, &applies, now, plan.dry_run)
                .await
                .map_err(|u| {
                    StoreError::Unavailable(format!(
                        "behaviour {} shard gave no answer ({})",
                        u.dimension, u.reason
                    ))
                })?
        };
        let discount = plan.trust.as_ref().map_or(0.0, |t| t.discount_per_point);
        let (score, deny) = math::score(plan.score.as_ref(), &signals, &facts, discount);
        // A challenge records nothing: its limits are evaluated as a dry run would.
        let challenged = !deny && math::challenged(plan.score.as_ref(), score, &facts);
        if deny {
            return Ok(Decided::Judged(Judgement {
                facts,
                signals,
                score,
                outcome: Outcome::ScoreDeny,
            }));
        }
        let mut values: Vec<LimitValue> = plan
            .limits
            .iter()
            .map(|l| LimitValue {
                applies: l.filter.is_none_or(|f| passes(f, &facts)),
                max: effective_max(l, &facts, plan.trust.as_ref()),
                state: LimitState {
                    count: 0,
                    exceeded: false,
                    retry_after_ms: 0,
                },
            })
            .collect();
        let op = CheckOp {
            record_key: plan.record_key.clone(),
            // The embedded store keeps one record per entity and request id (`record_key`).
            records_key: String::new(),
            idempotency_key: plan.idempotency_key.clone(),
            request_id: plan.request_id.clone(),
            id_given: plan.id_given,
            record_ttl_ms: plan.record_ttl_ms,
            dry_run: plan.dry_run || challenged,
            limits: plan
                .limits
                .iter()
                .zip(&values)
                .filter(|(_, v)| v.applies)
                .map(|(l, v)| LimitOp {
                    key: l.key.clone(),
                    algorithm: l.algorithm,
                    window_ms: l.window_ms,
                    max: v.max,
                    retain_ms: l.retain_ms,
                })
                .collect(),
        };
        let (allowed, states) = match self.windows.check(&op).await? {
            CheckOutcome::Allowed { limits } => (true, limits),
            CheckOutcome::Denied { limits } => (false, limits),
            CheckOutcome::Duplicate { of } => return Ok(Decided::Duplicate { of }),
            // The embedded store keeps no reservations; answered as a store would.
            CheckOutcome::Held { of } => return Ok(Decided::Held { of }),
        };
        let mut states = states.into_iter();
        for v in values.iter_mut().filter(|v| v.applies) {
            if let Some(state) = states.next() {
                // A challenge counted nothing: its counts are those before the request,
                // as a deny's (the evaluation answered as an allow would).
                v.state = if allowed && challenged {
                    super::uncounted(state)
                } else {
                    state
                };
            }
        }
        let outcome = Outcome::of_limits(allowed, challenged, values);
        Ok(Decided::Judged(Judgement {
            facts,
            signals,
            score,
            outcome,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::clock::ManualClock;
    use crate::config::BehaviourConfig;
    use crate::decide::SignalPlan;
    use crate::metrics::Metrics;
    use crate::rules::Count;

    fn plan(request_id: &str) -> CheckPlan {
        CheckPlan {
            record_key: format!("vg:s:req:{request_id}"),
            records_key: "vg:s:rq:all".into(),
            idempotency_key: None,
            request_id: request_id.into(),
            id_given: true,
            record_ttl_ms: 60_000,
            dry_run: false,
            trust: None,
            signals: vec![SignalPlan {
                name: "users_per_device".into(),
                key: "vg:s:sg:users_per_device:d1".into(),
                all_key: None,
                last_key: None,
                count: Count::Users,
                member: format!("{:016x}", 7),
                filter: None,
                window_ms: 60_000,
                max: 3,
                min_share: None,
                cap: crate::signal::signal_cap(3, None),
            }],
            score: None,
            limits: Vec::new(),
        }
    }

    /// A signal shard that does not answer within the deadline fails the decision as a
    /// store that does not answer would (the checker then applies the scene's
    /// `on_store_error`): the decider never goes on without its signals.
    #[tokio::test]
    async fn an_unanswered_signal_shard_is_a_store_error_not_an_allow() {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let cfg = BehaviourConfig {
            shards: 1,
            threads: 1,
            // Long enough for a loaded debug build's warm-up to be answered.
            deadline_ms: 500,
            ..BehaviourConfig::default()
        };
        let behaviours =
            Behaviours::start(&cfg, dir.path(), clock.clone(), Metrics::new()).expect("start");
        let windows = EmbeddedStore::in_memory(clock.clone());
        let decider = EmbeddedDecider::new(windows, behaviours.clone(), None, clock);
        let answered = decider.decide(&plan("r1")).await.expect("answered");
        assert!(matches!(answered, Decided::Judged(_)), "{answered:?}");
        behaviours.stall(Duration::from_secs(5));
        let started = Instant::now();
        let got = decider.decide(&plan("r2")).await;
        assert!(matches!(got, Err(StoreError::Unavailable(_))), "{got:?}");
        assert!(started.elapsed() < Duration::from_secs(3), "one deadline");
    }
}
