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
//! reserved, for a refund or a release there. For a check with limits only, the check's
//! first entity's group (the main group) holds the idempotency record and answers whether
//! the request is a repeat.
//!
//! A check with limits only runs the shaped limits scripts one Redis runs for it. A check
//! with trust, signals or a score runs decide.lua per group (`decide_judged`): each group
//! observes its own signals, reads the facts whose keys it holds (the user's points and
//! age in the user's slot, the device's age in the device's) and reserves its limits
//! against the effective max those facts give. A group whose signals or limits depend on
//! a fact held elsewhere runs in a later round, given the fact (`cluster_layout`). The node
//! scores all the signals with [`math`], as the embedded decider does, and a score deny
//! or a limit deny releases every reservation. Every group keeps the request id and the
//! idempotency key, so a repeat is known in each before anything is counted.

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::join_all;
use redis::Script;

use super::cluster_layout::{Known, Layout};
use super::math;
use super::redis::{
    applies_without_trust, invocation, limits_judged, limits_only, parse_reply, script_now,
    GivenFacts, Part, DECIDE_LUA,
};
use super::{uncounted, CheckPlan, Decided, Decider, Judgement, LimitValue, Outcome, SignalValue};
use crate::clock::Clock;
use crate::keys::{slot_groups, SlotGroup};
use crate::metrics::Metrics;
use crate::store::limits_script::LimitScripts;
use crate::store::redis::{
    idempotency_field, parse_check_reply, CheckCall, Stamp, RELEASE_LUA, STARTUP_MIN_MS,
};
use crate::store::redis_link::{CallFailed, LateReply, RedisLink, Sent};
use crate::store::release::{Release, Releaser, Settle};
use crate::store::{CheckOutcome, LimitState, StoreError};

/// A [`Decider`] on a Redis Cluster.
pub struct ClusterDecider {
    link: Arc<RedisLink>,
    /// decide.lua, for a check with trust, signals or a score: one call per slot group.
    script: Arc<Script>,
    /// For a check with limits only (the cheaper scripts a single Redis runs for one).
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
        let script = Arc::new(Script::new(DECIDE_LUA));
        let release = Script::new(RELEASE_LUA);
        link.load_scripts(&[shaped.check_lua(), &*script, &release], startup_ms)
            .await?;
        let releaser = Releaser::start(link.clone(), release, metrics);
        Ok(ClusterDecider {
            link,
            script,
            shaped,
            releaser,
            clock,
        })
    }

    /// Waits until every release queued so far has run: the next check sees none of the
    /// reservations of the checks denied before it (tests compare answers with one Redis's).
    pub async fn settled(&self) {
        self.releaser.settled().await;
    }

    /// Queues the release of the reservation of the group at `place` (its `limits`; the
    /// idempotency record too when `idempotent` and the check has one), once `late` (the
    /// group's call, if it timed out) has been answered.
    #[allow(clippy::too_many_arguments)]
    fn release(
        &self,
        plan: &CheckPlan,
        place: &SlotGroup,
        limits: &[usize],
        idempotent: bool,
        now: Option<u64>,
        stamp: Stamp,
        late: Option<LateReply>,
    ) {
        self.releaser.release_after(
            late,
            Release {
                records_key: place.records_key.clone(),
                keys: limits
                    .iter()
                    .map(|&j| (plan.limits[j].key.clone(), plan.limits[j].algorithm))
                    .collect(),
                request_id: plan.request_id.clone(),
                record_ttl_ms: plan.record_ttl_ms,
                idempotency_field: plan
                    .idempotency_key
                    .as_deref()
                    .filter(|_| idempotent)
                    .map(idempotency_field),
                now,
                stamp,
                settle: Settle::Release,
            },
        );
    }

    /// Queues the commit of an allowed check's record in the main group among `places`: a
    /// copy sent from then on is a repeat of the allow (until then it is held).
    fn commit<'p>(
        &self,
        plan: &CheckPlan,
        mut places: impl Iterator<Item = &'p SlotGroup>,
        now: Option<u64>,
        stamp: Stamp,
    ) {
        let Some(place) = places.find(|p| p.main).filter(|_| !plan.dry_run) else {
            return;
        };
        self.releaser.release(Release {
            records_key: place.records_key.clone(),
            keys: Vec::new(),
            request_id: plan.request_id.clone(),
            record_ttl_ms: plan.record_ttl_ms,
            idempotency_field: None,
            now,
            stamp,
            settle: Settle::Commit,
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

/// What the groups' answers (none a repeat or an error) make of a judged check: the facts
/// read, every signal, the node's score, and the limits all-or-nothing. No side effects:
/// the caller commits or releases what the groups reserved by what this returns.
fn combine(
    plan: &CheckPlan,
    layout: &Layout,
    answers: &[Option<Result<Decided, StoreError>>],
    known: &Known,
) -> Result<Judgement, StoreError> {
    let facts = known.facts();
    let mut signals: Vec<Option<SignalValue>> = vec![None; plan.signals.len()];
    // Each limit's value, and whether its group counted the request in it.
    let mut limits: Vec<Option<(LimitValue, bool)>> = vec![None; plan.limits.len()];
    let mut allowed = true;
    for (g, answer) in layout.groups.iter().zip(answers) {
        let Some(Ok(Decided::Judged(j))) = answer else {
            return Err(StoreError::Protocol(format!(
                "slot group {} gave no answer",
                g.place.records_key
            )));
        };
        for (&i, &v) in g.signals.iter().zip(&j.signals) {
            signals[i] = Some(v);
        }
        let (values, counted) = match &j.outcome {
            Outcome::Allowed { limits } => (limits, true),
            Outcome::Denied { limits } => {
                allowed = false;
                (limits, false)
            }
            Outcome::ScoreDeny | Outcome::Challenged { .. } => {
                return Err(StoreError::Protocol(format!(
                    "slot group {} scored, though sent no score",
                    g.place.records_key
                )))
            }
        };
        for (&j, &v) in g.limits.iter().zip(values) {
            limits[j] = Some((v, counted));
        }
    }
    let signals: Vec<SignalValue> = collect_all(signals, "signal")?;
    let discount = plan.trust.as_ref().map_or(0.0, |t| t.discount_per_point);
    let (score, deny) = math::score(plan.score.as_ref(), &signals, &facts, discount);
    if deny {
        return Ok(Judgement {
            facts,
            signals,
            score,
            outcome: Outcome::ScoreDeny,
        });
    }
    // A challenge records nothing: what the groups reserved is released, as on a deny.
    let challenged = allowed && math::challenged(plan.score.as_ref(), score, &facts);
    // A deny (or a challenge) reports the counts before the request, as one Redis does:
    // what a group that allowed counted is taken off (its reservation is released).
    let kept = allowed && !challenged;
    let limits = collect_all(limits, "limit")?
        .into_iter()
        .map(|(v, counted)| match (kept, counted && v.applies) {
            (false, true) => LimitValue {
                state: uncounted(v.state),
                ..v
            },
            _ => v,
        })
        .collect();
    let outcome = Outcome::of_limits(allowed, challenged, limits);
    Ok(Judgement {
        facts,
        signals,
        score,
        outcome,
    })
}

/// What the groups' repeats make of a check. A record a commit settled (only ever in the
/// main group, and only for an allowed check) makes it a repeat of that allow, whatever
/// the other groups say: they keep their reservation's stamp for good. Else a reservation
/// not yet settled in any group makes it held: its attempt may yet be denied, so the copy
/// must neither pass as its repeat nor count as a new request. `None`: no repeat.
fn repeat_of<'a>(answers: impl Iterator<Item = &'a Decided> + Clone) -> Option<Decided> {
    let settled = answers
        .clone()
        .find(|a| matches!(a, Decided::Duplicate { .. }));
    settled
        .or_else(|| answers.clone().find(|a| matches!(a, Decided::Held { .. })))
        .cloned()
}

#[async_trait]
impl Decider for ClusterDecider {
    async fn decide(&self, plan: &CheckPlan) -> Result<Decided, StoreError> {
        if !limits_only(plan) {
            return self.decide_judged(plan).await;
        }
        let sent: Vec<usize> = (0..plan.limits.len())
            .filter(|&j| applies_without_trust(plan.limits[j].filter))
            .collect();
        let groups = groups(plan, &sent)?;
        let now = script_now(&self.clock);
        // This attempt's reservations, told apart from another attempt's with the same
        // request id (a retry after an error answer): a release takes only its own.
        let stamp = Stamp::reservation();
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
                let reply = self.link.eval_call(&script, cmd).await?;
                parse_check_reply(reply, n).map_err(CallFailed::ended)
            }
        });
        let (outcomes, mut fates) = split(join_all(calls).await);

        // What each group holds of the request, to give back on anything but an allow: a
        // group that failed or timed out may have run (release finds nothing if not).
        let holds = |i: usize| {
            !plan.dry_run
                && !matches!(
                    outcomes[i],
                    Ok(CheckOutcome::Denied { .. }
                        | CheckOutcome::Duplicate { .. }
                        | CheckOutcome::Held { .. })
                )
        };
        let mut release_all = || {
            for (i, g) in groups.iter().enumerate() {
                if let Some(late) = may_hold(holds(i), &mut fates[i]) {
                    self.release(plan, &g.place, &g.limits, g.place.main, now, stamp, late);
                }
            }
        };
        if let Some(e) = outcomes.iter().find_map(|o| o.as_ref().err()) {
            release_all();
            return Err(e.clone());
        }
        // A repeat (or a copy of an attempt not yet settled): nothing of this call stays.
        let repeats: Vec<Decided> = outcomes
            .iter()
            .filter_map(|o| match o {
                Ok(CheckOutcome::Duplicate { of }) => Some(Decided::Duplicate { of: of.clone() }),
                Ok(CheckOutcome::Held { of }) => Some(Decided::Held { of: of.clone() }),
                _ => None,
            })
            .collect();
        if let Some(repeat) = repeat_of(repeats.iter()) {
            release_all();
            return Ok(repeat);
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
        let judged = sent
            .iter()
            .map(|&j| {
                states[j]
                    .ok_or_else(|| StoreError::Protocol(format!("no group answered limit {j}")))
            })
            .collect::<Result<Vec<LimitState>, _>>()
            .and_then(|states| {
                let outcome = if allowed {
                    CheckOutcome::Allowed { limits: states }
                } else {
                    CheckOutcome::Denied { limits: states }
                };
                limits_judged(outcome, plan, &sent)
            });
        // The reservations follow the answer, a malformed one included: committed on an
        // allow, released on anything else.
        match &judged {
            Ok(_) if allowed => self.commit(plan, groups.iter().map(|g| &g.place), now, stamp),
            _ => release_all(),
        }
        judged
    }
}

impl ClusterDecider {
    /// A check with trust, signals or a score ([`Layout`]): decide.lua per slot group, in
    /// rounds when a group needs a fact read in another; the node then scores and decides
    /// with [`math`], as the embedded decider does.
    async fn decide_judged(&self, plan: &CheckPlan) -> Result<Decided, StoreError> {
        let layout = Layout::of(plan).map_err(|why| {
            StoreError::Protocol(format!("{why}: keys on a cluster must be placed by entity"))
        })?;
        let now = script_now(&self.clock);
        let stamp = Stamp::reservation();
        let mut known = Known::default();

        if !layout.prelude.is_empty() {
            // The groups' needs go round in a circle: read the facts first, writing nothing.
            // (Repeats are the rounds' to find: this read looks for none.)
            let dry = CheckPlan {
                dry_run: true,
                id_given: false,
                idempotency_key: None,
                ..plan.clone()
            };
            let reads = layout.prelude.iter().map(|&i| {
                let g = &layout.groups[i];
                let part = Part {
                    records_key: &g.place.records_key,
                    idempotency_key: None,
                    signals: Some(&[]),
                    limits: Some(&[]),
                    holds_points: g.holds_points,
                    holds_user_seen: g.holds_user_seen,
                    holds_device_seen: g.holds_device_seen,
                    given: GivenFacts::default(),
                    trust: true,
                    score: false,
                    stamp: None,
                };
                self.run(&dry, part, now)
            });
            for (&i, read) in layout.prelude.iter().zip(join_all(reads).await) {
                // A dry run writes nothing: a failed read leaves nothing to release.
                match read.map_err(|f| f.error)? {
                    Decided::Judged(j) => layout.learn(i, &j.facts, &mut known),
                    Decided::Duplicate { of } | Decided::Held { of } => {
                        return Err(StoreError::Protocol(format!(
                            "a facts-only read answered a repeat of {of}"
                        )))
                    }
                }
            }
        }

        // Each group's answer, once its round has run (`None`: it did not run), and what
        // became of its call when it failed.
        let mut answers: Vec<Option<Result<Decided, StoreError>>> = vec![None; layout.groups.len()];
        let mut fates: Vec<Option<Sent>> = layout.groups.iter().map(|_| None).collect();
        for round in &layout.rounds {
            let calls = round.iter().map(|&i| {
                let g = &layout.groups[i];
                let part = Part {
                    records_key: &g.place.records_key,
                    // In every group: a repeat is then known to each before it observes
                    // anything (a signal counts a retry under a new request id once).
                    idempotency_key: plan.idempotency_key.as_deref(),
                    signals: Some(&g.signals),
                    limits: Some(&g.limits),
                    holds_points: g.holds_points,
                    holds_user_seen: g.holds_user_seen,
                    holds_device_seen: g.holds_device_seen,
                    given: layout.given(i, &known),
                    trust: g.trust,
                    score: false,
                    stamp: Some(stamp),
                };
                self.run(plan, part, now)
            });
            let (done, failed) = split(join_all(calls).await);
            let mut stop = false;
            for ((&i, answer), failed) in round.iter().zip(done).zip(failed) {
                fates[i] = failed;
                match &answer {
                    Ok(Decided::Judged(j)) => layout.learn(i, &j.facts, &mut known),
                    // A repeat or an error decides the check: no later group observes it.
                    Ok(Decided::Duplicate { .. } | Decided::Held { .. }) | Err(_) => stop = true,
                }
                answers[i] = Some(answer);
            }
            if stop {
                break;
            }
        }

        // What each group may hold of the request, to give back on anything but an allow:
        // one that failed or timed out may have run (a release finds nothing if not).
        let holds = |i: usize| {
            !plan.dry_run
                && matches!(
                    &answers[i],
                    Some(Err(_))
                        | Some(Ok(Decided::Judged(Judgement {
                            outcome: Outcome::Allowed { .. },
                            ..
                        })))
                )
        };
        let mut release_all = || {
            for (i, g) in layout.groups.iter().enumerate() {
                if let Some(late) = may_hold(holds(i), &mut fates[i]) {
                    self.release(plan, &g.place, &g.limits, true, now, stamp, late);
                }
            }
        };
        if let Some(e) = answers.iter().flatten().find_map(|a| a.as_ref().err()) {
            release_all();
            return Err(e.clone());
        }
        if let Some(repeat) = repeat_of(answers.iter().flatten().filter_map(|a| a.as_ref().ok())) {
            release_all();
            return Ok(repeat);
        }

        // Whatever the answers make of the check (a malformed one included), the
        // reservations follow it: committed on an allow, released on anything else.
        let judged = combine(plan, &layout, &answers, &known);
        match &judged {
            Ok(Judgement {
                outcome: Outcome::Allowed { .. },
                ..
            }) => self.commit(plan, layout.groups.iter().map(|g| &g.place), now, stamp),
            _ => release_all(),
        }
        judged.map(Decided::Judged)
    }

    /// One group's decide.lua call.
    async fn run(
        &self,
        plan: &CheckPlan,
        part: Part<'_>,
        now: Option<u64>,
    ) -> Result<Decided, CallFailed> {
        let cmd = invocation(self.script.get_hash(), plan, &part, now);
        let reply = self.link.eval_call(&self.script, cmd).await?;
        parse_reply(reply, plan, &part).map_err(CallFailed::ended)
    }
}

/// The groups' answers, and what became of each call that failed (`None`: it answered).
fn split<T>(
    results: Vec<Result<T, CallFailed>>,
) -> (Vec<Result<T, StoreError>>, Vec<Option<Sent>>) {
    results
        .into_iter()
        .map(|r| match r {
            Ok(v) => (Ok(v), None),
            Err(CallFailed { error, sent }) => (Err(error), Some(sent)),
        })
        .unzip()
}

/// Whether a group's attempt is to be released (`Some`, with the late reply to wait for):
/// it `holds` something of the request, or may, unless its call was never sent.
fn may_hold(holds: bool, sent: &mut Option<Sent>) -> Option<Option<LateReply>> {
    match sent.take() {
        _ if !holds => None,
        Some(Sent::No) => None,
        Some(Sent::Pending(late)) => Some(Some(late)),
        Some(Sent::Ended) | None => Some(None),
    }
}

/// Every item answered, or the first that was not (a protocol error: no group held it).
fn collect_all<T>(items: Vec<Option<T>>, what: &str) -> Result<Vec<T>, StoreError> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            v.ok_or_else(|| StoreError::Protocol(format!("no group answered {what} {i}")))
        })
        .collect()
}
