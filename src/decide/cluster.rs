//! The decider on Redis Cluster: one check, one script per slot group, all at once.
//!
//! A check's keys are hash-tagged by entity (`crate::keys::KeyPrefix::tagged`), so they
//! fall into a few slot groups: the user's, the device's, the address's… No script may
//! span slots, so no single script can decide all-or-nothing. Instead every group runs the
//! limits script on its own limits at the same time, reading its own master's clock, and
//! *reserves* (records the request, as a single Redis would) only when none of its own
//! limits is full. The node then decides: every group reserved, the check is allowed;
//! one said no, it is denied and the groups that reserved are released
//! ([`crate::store::release`]: by request id, idempotently, off the answer's path).
//!
//! Never over-admitting: a group reserves atomically on its master, so a request admitted
//! there saw a count that included every request reserved before it, released or not. A
//! reservation that is released later only made others see one more than there was: a
//! doomed reservation can deny a request it should not have for one round trip, never
//! admit one it should not have.
//!
//! Each group also keeps its own records (`<prefix>:<scene>:rq:{<entity>}`): what it
//! reserved, for a refund or a release there. The check's first entity's group (the main
//! group) holds the idempotency record and answers whether the request is a repeat.
//!
//! What this decider decides today: scenes with limits only. Trust, signals and a score
//! read facts held in other slots (whether the user is new decides what the address's
//! signal counts); those scenes are refused at start on a cluster, and a reload that adds
//! them answers their checks with the scene's `on_store_error`.

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::join_all;
use redis::Script;

use super::redis::{applies_without_trust, limits_judged, limits_only, script_now};
use super::{CheckPlan, Decided, Decider};
use crate::clock::Clock;
use crate::keys::{slot_groups, SlotGroup};
use crate::metrics::Metrics;
use crate::store::limits_script::LimitScripts;
use crate::store::redis::{
    idempotency_field, parse_check_reply, CheckCall, RELEASE_LUA, STARTUP_MIN_MS,
};
use crate::store::redis_link::RedisLink;
use crate::store::release::{Release, Releaser};
use crate::store::{CheckOutcome, LimitState, StoreError};

/// A [`Decider`] on a Redis Cluster.
pub struct ClusterDecider {
    link: Arc<RedisLink>,
    shaped: LimitScripts,
    releaser: Releaser,
    /// `Some` (and not the wall clock) replaces each master's `TIME` with this clock.
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for ClusterDecider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterDecider")
            .field("link", &self.link)
            .field("releaser", &self.releaser)
            .finish()
    }
}

/// One slot group of a check: its limits (plan indices) and where it keeps its records.
struct Group {
    place: SlotGroup,
    limits: Vec<usize>,
}

impl ClusterDecider {
    /// Builds the decider on a cluster link ([`RedisLink::open_cluster`]) and loads its
    /// scripts on every node; starts the release task on the calling runtime.
    pub async fn new(
        link: Arc<RedisLink>,
        clock: Option<Arc<dyn Clock>>,
        metrics: Metrics,
    ) -> Result<ClusterDecider, StoreError> {
        let startup_ms = link.timeout_ms().max(STARTUP_MIN_MS);
        let shaped = LimitScripts::default();
        let release = Script::new(RELEASE_LUA);
        link.load_scripts(&[shaped.check_lua(), &release], startup_ms)
            .await?;
        let releaser = Releaser::start(link.clone(), release, metrics);
        Ok(ClusterDecider {
            link,
            shaped,
            releaser,
            clock,
        })
    }

    /// Queues the release of `group`'s reservation.
    fn release(&self, plan: &CheckPlan, group: &Group, now: Option<u64>, stamp: u64) {
        self.releaser.release(Release {
            records_key: group.place.records_key.clone(),
            keys: group
                .limits
                .iter()
                .map(|&j| (plan.limits[j].key.clone(), plan.limits[j].algorithm))
                .collect(),
            request_id: plan.request_id.clone(),
            record_ttl_ms: plan.record_ttl_ms,
            idempotency_field: plan
                .idempotency_key
                .as_deref()
                .filter(|_| group.place.main)
                .map(idempotency_field),
            now,
            stamp,
        });
    }
}

/// The slot groups of `plan`'s limits `sent` ([`slot_groups`]: the main group first).
fn groups(plan: &CheckPlan, sent: &[usize]) -> Result<Vec<Group>, StoreError> {
    let keys = sent.iter().map(|&j| plan.limits[j].key.as_str());
    let groups = slot_groups(&plan.records_key, keys).map_err(|why| {
        StoreError::Protocol(format!("{why}: keys on a cluster must be placed by entity"))
    })?;
    Ok(groups
        .into_iter()
        .map(|g| Group {
            limits: g.members.iter().map(|&i| sent[i]).collect(),
            place: g,
        })
        .collect())
}

/// A limit's state in a denied answer, from a group that allowed (and counted) it: the
/// count before the request, as a single Redis reports a deny.
fn uncounted(state: LimitState) -> LimitState {
    LimitState {
        count: state.count.saturating_sub(1),
        ..state
    }
}

#[async_trait]
impl Decider for ClusterDecider {
    async fn decide(&self, plan: &CheckPlan) -> Result<Decided, StoreError> {
        if !limits_only(plan) {
            return Err(StoreError::Unavailable(
                "on redis_cluster a scene with [trust], signals or a score is not decided yet"
                    .into(),
            ));
        }
        let sent: Vec<usize> = (0..plan.limits.len())
            .filter(|&j| applies_without_trust(plan.limits[j].filter))
            .collect();
        let groups = groups(plan, &sent)?;
        let now = script_now(&self.clock);
        // This attempt's reservations, told apart from another attempt's with the same
        // request id (a retry after an error answer): a release takes only its own.
        let stamp: u64 = rand::random();
        let calls = groups.iter().map(|g| {
            let call = CheckCall {
                records_key: &g.place.records_key,
                idempotency_key: plan.idempotency_key.as_deref().filter(|_| g.place.main),
                request_id: &plan.request_id,
                dry_run: plan.dry_run,
                id_given: plan.id_given,
                record_ttl_ms: plan.record_ttl_ms,
                now,
                stamp: Some(stamp),
            };
            let limits = g.limits.iter().map(|&j| {
                let l = &plan.limits[j];
                (
                    l.key.as_str(),
                    l.algorithm,
                    l.window_ms,
                    l.base_max,
                    l.retain_ms,
                )
            });
            let (script, cmd) = self.shaped.command(&call, limits);
            let n = g.limits.len();
            async move {
                let reply = self.link.eval(&script, &cmd).await?;
                parse_check_reply(reply, n)
            }
        });
        let outcomes = join_all(calls).await;

        // What each group holds of the request, to give back on anything but an allow: a
        // group that failed or timed out may have run (release finds nothing if not).
        let holds = |i: usize| {
            !plan.dry_run
                && !matches!(
                    outcomes[i],
                    Ok(CheckOutcome::Denied { .. } | CheckOutcome::Duplicate { .. })
                )
        };
        let release_all = || {
            for (i, g) in groups.iter().enumerate() {
                if holds(i) {
                    self.release(plan, g, now, stamp);
                }
            }
        };
        if let Some(e) = outcomes.iter().find_map(|o| o.as_ref().err()) {
            release_all();
            return Err(e.clone());
        }
        // A repeat in the main group (else in any: a group that kept the id from an
        // earlier count) is a repeat: nothing of this call stays.
        let dup = outcomes.iter().find_map(|o| match o {
            Ok(CheckOutcome::Duplicate { of }) => Some(of.clone()),
            _ => None,
        });
        if let Some(of) = dup {
            release_all();
            return Ok(Decided::Duplicate { of });
        }
        let allowed = outcomes
            .iter()
            .all(|o| matches!(o, Ok(CheckOutcome::Allowed { .. })));
        let mut states: Vec<Option<LimitState>> = vec![None; plan.limits.len()];
        for (g, outcome) in groups.iter().zip(&outcomes) {
            let (group_states, counted) = match outcome {
                Ok(CheckOutcome::Allowed { limits }) => (limits, true),
                Ok(CheckOutcome::Denied { limits }) => (limits, false),
                // Errors and repeats were answered above.
                _ => continue,
            };
            for (&j, &state) in g.limits.iter().zip(group_states) {
                states[j] = Some(if counted && !allowed {
                    uncounted(state)
                } else {
                    state
                });
            }
        }
        if !allowed {
            release_all();
        }
        let states: Vec<LimitState> = sent
            .iter()
            .map(|&j| {
                states[j]
                    .ok_or_else(|| StoreError::Protocol(format!("no group answered limit {j}")))
            })
            .collect::<Result<_, _>>()?;
        let outcome = if allowed {
            CheckOutcome::Allowed { limits: states }
        } else {
            CheckOutcome::Denied { limits: states }
        };
        limits_judged(outcome, plan, &sent)
    }
}
