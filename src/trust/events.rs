//! The events service: accept, journal, acknowledge, apply, and replay what could not be
//! applied yet.
//!
//! An accepted batch is journaled in one sled transaction and flushed before
//! `POST /v1/events` answers 202: from then on no crash or restart loses it. Its effects
//! are decided at acceptance from the rules then in force (an award with its points and
//! expiry, or the refund op of a rolled-back benefit) and journaled with it, so a replay
//! does exactly what the first attempt would have done.
//!
//! Right after the flush the batch's entries are applied, one at a time in seq order,
//! under a mutex shared with the replayer; an entry leaves `pending` once its effect is
//! applied and durable. A store that cannot answer stops the run; the request is still
//! answered 202 (the events are durable) and the replayer ([`Events::spawn_replayer`],
//! every [`REPLAY_EVERY`]) applies the rest once the store is back.
//!
//! Exactly-once *effect* comes from idempotent application, not from exactly-once
//! delivery: an award is keyed by its event id in the ledger, and refunding an
//! already-refunded request is a no-op. So a crash between applying an entry and marking
//! it applied only applies it again on restart, which changes nothing.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::event::{self, Event, EventKind, Invalid};
use super::journal::{self, Effect, Entry, Journal, JournalError};
use super::ledger::{pass_id, pass_scope, Award, AwardKind, TrustLedger, POINTS_ONLY};
use crate::clock::Clock;
use crate::input::RequestError;
use crate::metrics::Metrics;
use crate::refund::Refunds;
use crate::rules::{RuleSet, Scene};
use crate::store::StoreError;

/// How often the replayer looks for pending entries: a store back from an outage sees
/// its backlog within a quarter second, and an idle journal costs one empty range scan.
pub const REPLAY_EVERY: Duration = Duration::from_millis(250);

/// Entries applied per hold of the apply mutex: a long backlog never makes a fresh
/// request wait for more than one chunk.
const APPLY_CHUNK: usize = 256;

/// How often (in replayer ticks, ~1 min) old applied entries are pruned, and how many per
/// go, so pruning a large journal never stalls the replayer.
const PRUNE_EVERY_TICKS: u64 = 240;
const PRUNE_LIMIT: usize = 10_000;

/// Why events could not be taken (or the journal opened). The one error of this boundary;
/// `http::errors` maps it.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// An invalid body or event. `at` is the event's field-path prefix (`events[3].`, or
    /// empty), `source` says what is wrong with which field.
    #[error("{at}{source}")]
    Invalid { at: String, source: RequestError },
    /// The journal cannot write (or be opened): nothing was acknowledged.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl EventsError {
    /// The full field path (`events[3].user_id`), if the error is about a field.
    pub fn field(&self) -> Option<String> {
        match self {
            EventsError::Invalid { at, source } => source
                .field()
                .map(|f| format!("{at}{f}"))
                .or_else(|| (!at.is_empty()).then(|| at.trim_end_matches('.').to_string())),
            EventsError::Journal(_) => None,
        }
    }
}

/// What `ingest` returns; the name the HTTP layer knows it by.
pub type IngestError = EventsError;

/// `POST /v1/events` answer: events newly journaled, and events whose id was seen before
/// (or earlier in the same batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct IngestReport {
    pub accepted: usize,
    pub duplicates: usize,
}

/// A user's trust as `GET /v1/trust/{user_id}` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrustView {
    pub user_id: String,
    /// `raw_points` capped by `[trust].max_points` (0 when the rules have no `[trust]`:
    /// then points change nothing).
    pub points: u32,
    /// Sum of the unexpired awards.
    pub raw_points: u32,
    pub max_points: u32,
    /// Unexpired awards, oldest expiry first.
    pub awards: Vec<Award>,
    pub first_seen_ms: Option<u64>,
    /// Events this node accepted and has not applied yet (all users).
    pub pending_events: usize,
}

/// The events service.
pub struct Events {
    journal: Journal,
    ledger: Arc<dyn TrustLedger>,
    /// A rollback is a refund: its op is computed at acceptance and applied here.
    refunds: Arc<Refunds>,
    metrics: Metrics,
    clock: Arc<dyn Clock>,
    /// One application at a time: the request path and the replayer share it, so an
    /// entry is never applied by both at once.
    apply_lock: tokio::sync::Mutex<()>,
    /// Entries whose application failed for a reason other than an absent store, already
    /// reported once: logged at debug afterwards, not at every replay tick.
    reported: Mutex<HashSet<u64>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("journal", &self.journal)
            .field("ledger", &self.ledger.kind())
            .finish()
    }
}

fn award_kind(kind: EventKind) -> Option<AwardKind> {
    match kind {
        EventKind::PaymentSucceeded => Some(AwardKind::PaymentSucceeded),
        EventKind::IdentityVerified => Some(AwardKind::IdentityVerified),
        EventKind::ChallengePassed => Some(AwardKind::ChallengePassed),
        EventKind::BenefitRolledBack => None,
    }
}

fn is_store_down(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Timeout(_) | StoreError::Unavailable(_) | StoreError::CircuitOpen
    )
}

impl Events {
    /// Opens the journal at `dir` (created if needed) over `ledger` (awards) and `refunds`
    /// (rollbacks).
    pub fn open(
        dir: &Path,
        ledger: Arc<dyn TrustLedger>,
        refunds: Arc<Refunds>,
        metrics: Metrics,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Events>, EventsError> {
        let db = journal::open_db(dir)?;
        Events::open_in(db, dir, ledger, refunds, metrics, clock)
    }

    /// The same over a database opened already (with [`journal::open_db`]): the embedded
    /// mode's sled ledger lives in it too, and sled opens a folder once per process.
    pub fn open_in(
        db: sled::Db,
        dir: &Path,
        ledger: Arc<dyn TrustLedger>,
        refunds: Arc<Refunds>,
        metrics: Metrics,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Events>, EventsError> {
        Ok(Arc::new(Events {
            journal: Journal::new(db, dir)?,
            ledger,
            refunds,
            metrics,
            clock,
            apply_lock: tokio::sync::Mutex::new(()),
            reported: Mutex::new(HashSet::new()),
        }))
    }

    /// The ledger events are applied to (and checks read).
    pub fn ledger(&self) -> Arc<dyn TrustLedger> {
        self.ledger.clone()
    }

    /// Events accepted and not applied yet.
    pub fn pending(&self) -> usize {
        self.journal.pending_len()
    }

    /// Validates a `POST /v1/events` body, journals its new events durably, then applies
    /// them. `Ok` means durable: an effect the store could not take yet is left to the
    /// replayer. An invalid event refuses the whole body and journals nothing.
    pub async fn ingest(&self, rules: &RuleSet, body: &Value) -> Result<IngestReport, IngestError> {
        let now = self.clock.now_ms();
        let parsed = event::parse_body(body).map_err(|e| self.refuse(e))?;
        let entries = parsed
            .iter()
            .map(|ev| self.entry(rules, ev, now))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.refuse(e))?;
        let placed = self.journal.append(&entries)?;
        self.journal.flush().await?;

        let mut seqs = Vec::with_capacity(placed.len());
        for (entry, slot) in entries.iter().zip(&placed) {
            let result = if let Some(seq) = slot {
                seqs.push(*seq);
                if entry.kind == EventKind::ChallengePassed {
                    self.metrics.challenge_pass(pass_scene(entry));
                }
                "accepted"
            } else {
                "duplicate"
            };
            self.metrics.event(entry.kind.name(), result);
        }
        let report = IngestReport {
            accepted: seqs.len(),
            duplicates: placed.len() - seqs.len(),
        };
        if let Err(e) = self.apply(&seqs).await {
            tracing::warn!(error = %e, journal = %self.journal.path().display(), "events: accepted and journaled, applying deferred");
        }
        for (entry, slot) in entries.iter().zip(&placed) {
            if slot.is_some_and(|seq| self.journal.is_pending(seq).unwrap_or(false)) {
                self.metrics.event(entry.kind.name(), "deferred");
            }
        }
        Ok(report)
    }

    fn refuse(&self, e: Invalid) -> EventsError {
        self.metrics
            .event(e.kind.map_or("unknown", EventKind::name), "invalid");
        EventsError::Invalid {
            at: e.at,
            source: e.error,
        }
    }

    /// The journal entry of one valid event: its effect decided now, from `rules`.
    fn entry(&self, rules: &RuleSet, ev: &Event<'_>, now: u64) -> Result<Entry, Invalid> {
        let invalid = |error| Invalid {
            at: ev.at.clone(),
            error,
            kind: Some(ev.kind),
        };
        let effect = match award_kind(ev.kind) {
            None => Effect::Refund(self.refunds.op(rules, ev.raw).map_err(invalid)?),
            Some(AwardKind::ChallengePassed) => {
                let awards = passes(rules, ev, now).map_err(invalid)?;
                if awards.is_empty() {
                    Effect::None
                } else {
                    Effect::Awards(awards)
                }
            }
            Some(kind) => award(rules, ev, kind, now).map_or(Effect::None, Effect::Award),
        };
        Ok(Entry {
            event_id: ev.event_id.clone(),
            kind: ev.kind,
            user_id: ev.user_id.clone(),
            occurred_at_ms: ev.occurred_at_ms,
            accepted_at_ms: now,
            effect,
            scene: ev.scene.clone(),
        })
    }

    /// Applies every pending entry, oldest first; returns how many were applied. Stops at
    /// the first entry the store cannot take (that error is returned; the rest wait).
    pub async fn replay(&self) -> Result<usize, StoreError> {
        let mut applied = 0;
        let mut after = None;
        loop {
            let seqs = self
                .journal
                .pending_after(after, APPLY_CHUNK)
                .map_err(journal_as_store)?;
            let Some(&last) = seqs.last() else {
                return Ok(applied);
            };
            applied += self.apply(&seqs).await?;
            after = Some(last);
        }
    }

    /// Applies the given entries in order (those still pending), a chunk per hold of the
    /// apply mutex. An entry leaves `pending` only once its effect is durable.
    async fn apply(&self, seqs: &[u64]) -> Result<usize, StoreError> {
        let mut applied = 0;
        for chunk in seqs.chunks(APPLY_CHUNK) {
            let _one_at_a_time = self.apply_lock.lock().await;
            let mut done: Vec<(u64, EventKind)> = Vec::with_capacity(chunk.len());
            let (mut awarded, mut refunded) = (false, false);
            let mut stopped = None;
            for &seq in chunk {
                match self.journal.is_pending(seq) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        stopped = Some(journal_as_store(e));
                        break;
                    }
                }
                let entry = match self.journal.get(seq) {
                    Ok(Some(entry)) => entry,
                    Ok(None) => {
                        // Pending without an entry cannot be applied: let it go.
                        self.journal.unpend(&[seq]).map_err(journal_as_store)?;
                        continue;
                    }
                    Err(e) => {
                        self.report_failure(seq, "unknown", &e.to_string());
                        continue;
                    }
                };
                match self.apply_one(&entry).await {
                    Ok(()) => {
                        awarded |= matches!(entry.effect, Effect::Award(_) | Effect::Awards(_));
                        refunded |= matches!(entry.effect, Effect::Refund(_));
                        done.push((seq, entry.kind));
                    }
                    Err(e) if is_store_down(&e) => {
                        stopped = Some(e);
                        break;
                    }
                    // A reply we cannot use is no outage: it would repeat forever. Leave
                    // the entry pending (an operator can look at it), go on with the rest.
                    Err(e) => self.report_failure(seq, entry.kind.name(), &e.to_string()),
                }
            }
            if !done.is_empty() {
                // Durable first, then forgotten: a crash in between re-applies, harmlessly.
                if awarded {
                    self.ledger.sync().await?;
                }
                if refunded {
                    self.refunds.sync().await?;
                }
                let seqs: Vec<u64> = done.iter().map(|(s, _)| *s).collect();
                self.journal.unpend(&seqs).map_err(journal_as_store)?;
                for (_, kind) in &done {
                    self.metrics.event(kind.name(), "applied");
                }
                applied += done.len();
            }
            if let Some(e) = stopped {
                return Err(e);
            }
        }
        Ok(applied)
    }

    async fn apply_one(&self, entry: &Entry) -> Result<(), StoreError> {
        match &entry.effect {
            Effect::None => Ok(()),
            Effect::Award(award) => self.ledger.award(award).await.inspect_err(|_| {
                self.metrics.trust_error("award");
            }),
            Effect::Awards(awards) => {
                for award in awards {
                    self.ledger.award(award).await.inspect_err(|_| {
                        self.metrics.trust_error("award");
                    })?;
                }
                Ok(())
            }
            // Ok(false): already refunded (or the request expired) — the goal is reached.
            Effect::Refund(op) => self.refunds.apply(op).await.map(|_| ()),
        }
    }

    fn report_failure(&self, seq: u64, kind: &str, error: &str) {
        let first = self
            .reported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(seq);
        if first {
            self.metrics.event(kind, "failed");
            tracing::error!(seq, error, journal = %self.journal.path().display(), "events: entry cannot be applied; it stays pending");
        } else {
            tracing::debug!(seq, error, "events: entry still cannot be applied");
        }
    }

    /// Starts the replayer: once now, then every [`REPLAY_EVERY`], it applies pending
    /// entries; about once a minute it prunes old applied ones. It ends when the service
    /// is dropped.
    pub fn spawn_replayer(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REPLAY_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            for n in 0u64.. {
                tick.tick().await;
                let Some(events) = weak.upgrade() else { return };
                match events.replay().await {
                    Ok(applied) => {
                        if failing {
                            tracing::info!(applied, "events: store back, pending events applied");
                        }
                        failing = false;
                    }
                    Err(e) => {
                        // Once per outage, not every tick.
                        if !failing {
                            tracing::warn!(error = %e, pending = events.pending(), "events: store unavailable, events wait");
                        }
                        failing = true;
                    }
                }
                if n % PRUNE_EVERY_TICKS == 0 {
                    events.prune();
                }
            }
        })
    }

    /// Drops applied entries past the journal's retention.
    pub fn prune(&self) {
        let cutoff = self.clock.now_ms().saturating_sub(journal::RETENTION_MS);
        match self.journal.prune(cutoff, PRUNE_LIMIT) {
            Ok(0) => {}
            Ok(n) => tracing::debug!(pruned = n, "events: old applied entries pruned"),
            Err(e) => tracing::warn!(error = %e, "events: pruning failed"),
        }
    }

    /// A user's trust: unexpired awards, points (capped by the rules' `[trust]`), first
    /// sighting, and this node's pending events. Reads; marks nothing.
    pub async fn trust(&self, rules: &RuleSet, user_id: &str) -> Result<TrustView, StoreError> {
        let read = async {
            let awards = self.ledger.awards(user_id).await?;
            let seen = self.ledger.read(user_id, false).await?;
            Ok::<_, StoreError>((awards, seen))
        };
        let (awards, seen) = read.await.inspect_err(|_| {
            self.metrics.trust_error("read");
        })?;
        let raw_points = awards
            .iter()
            .fold(0u32, |sum, a| sum.saturating_add(a.points));
        let max_points = rules.trust.as_ref().map_or(0, |t| t.max_points);
        Ok(TrustView {
            user_id: user_id.to_string(),
            points: raw_points.min(max_points),
            raw_points,
            max_points,
            awards,
            first_seen_ms: seen.first_seen_ms,
            pending_events: self.pending(),
        })
    }

    /// Makes the journal durable (at shutdown; every acknowledged batch already is).
    pub fn flush(&self) -> Result<(), EventsError> {
        Ok(self.journal.flush_blocking()?)
    }
}

/// The award an event earns under `rules` at `now`: `None` without a `[trust]` entry for
/// its type, or when it has expired already. An `occurred_at` in the future counts from
/// now: a sender's clock must not stretch an award.
fn award(rules: &RuleSet, ev: &Event<'_>, kind: AwardKind, now: u64) -> Option<Award> {
    let trust = rules.trust.as_ref()?;
    let cfg = match kind {
        AwardKind::PaymentSucceeded => trust.payment_succeeded,
        AwardKind::IdentityVerified => trust.identity_verified,
        AwardKind::ChallengePassed => trust.challenge_passed,
    }?;
    let expires_at_ms = ev.occurred_at_ms.min(now).saturating_add(cfg.ttl_ms);
    if cfg.points == 0 || expires_at_ms <= now {
        return None;
    }
    Some(Award {
        event_id: ev.event_id.clone(),
        user_id: ev.user_id.clone()?,
        kind,
        points: cfg.points,
        expires_at_ms,
    })
}

/// The scene a journaled pass names, for the metric: `all` when it named none.
fn pass_scene(entry: &Entry) -> &str {
    entry.scene.as_deref().unwrap_or("all")
}

/// What a `challenge_passed` event leaves under `rules` at `now`: a pass for its scene
/// (or for every scene that can challenge, without one), scoped to its device when it
/// names one, until `occurred_at + pass_ttl`; and the points `[trust].challenge_passed`
/// gives, if any. A pass already past its `pass_ttl` leaves nothing. A scene the rules do
/// not know, one that never challenges, or a device id the rules' pattern refuses is an
/// error naming the field.
fn passes(rules: &RuleSet, ev: &Event<'_>, now: u64) -> Result<Vec<Award>, RequestError> {
    let field = |field: &str, message: String| RequestError::InvalidField {
        field: field.to_string(),
        message,
    };
    let Some(user_id) = ev.user_id.clone() else {
        return Err(field("user_id", "is required for challenge_passed".into()));
    };
    if let (Some(device), Some(pattern)) = (&ev.device_id, &rules.validation.device_id) {
        if !pattern.is_match(device) {
            return Err(field(
                "device_id",
                format!("does not match the rules' [validation].device_id pattern {pattern}"),
            ));
        }
    }
    let scenes: Vec<&Scene> = match &ev.scene {
        Some(name) => {
            let scene = rules.scenes.get(name).ok_or_else(|| {
                field(
                    "scene",
                    format!("{name:?} is not a scene of the current rules"),
                )
            })?;
            if scene.challenge.is_none() {
                return Err(field(
                    "scene",
                    format!("{name:?} has no [scene.{name}.challenge]: it never challenges"),
                ));
            }
            vec![scene]
        }
        None => rules.scenes.values().map(|s| &**s).collect(),
    };
    // A sender's clock must not stretch a pass: a future `occurred_at` counts from now.
    let at = ev.occurred_at_ms.min(now);
    let device = ev.device_id.as_deref();
    let mut awards: Vec<Award> = scenes
        .into_iter()
        .filter_map(|s| Some((s, s.challenge.as_ref()?)))
        .map(|(s, c)| Award {
            event_id: pass_id(&pass_scope(&s.name, device), &ev.event_id),
            user_id: user_id.clone(),
            kind: AwardKind::ChallengePassed,
            points: 0,
            expires_at_ms: at.saturating_add(c.pass_ttl_ms),
        })
        .filter(|a| a.expires_at_ms > now)
        .collect();
    if let Some(mut points) = award(rules, ev, AwardKind::ChallengePassed, now) {
        points.event_id = pass_id(POINTS_ONLY, &ev.event_id);
        awards.push(points);
    }
    Ok(awards)
}

/// The journal failing under the replayer is, to its caller, the same as a store that
/// cannot answer: the entries wait.
fn journal_as_store(e: JournalError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}
