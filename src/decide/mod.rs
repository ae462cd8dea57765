//! The decision's one step: trust, signals, score and limits, where the windows are.
//!
//! The check path turns a request and its scene into a [`CheckPlan`] — every key, every
//! threshold, every weight, already resolved from the rules — and hands it to a
//! [`Decider`]. The decider answers with a [`Decided`]: what it learnt about the user and
//! device ([`Facts`]), every signal's value, the score, and the limits' states, or that the
//! request was a repeat. It never sees a rule file, and the check path never sees a key's
//! contents.
//!
//! Three deciders, the same answers (one behaviour suite runs against the first two; the
//! third is held to the first's answers, check by check, in `tests/it/cluster_parity.rs`):
//! - Redis: one EVALSHA of `lua/decide.lua` reads trust, records and counts every signal,
//!   scores, then evaluates and records every limit all-or-nothing. Every node sharing the
//!   Redis sees every observation.
//! - Embedded: the sled ledger, then the behaviour actors (signals), then the embedded
//!   window store, in that order, on this node.
//! - Redis Cluster ([`cluster`]): decide.lua per slot group, reserving; the node scores,
//!   decides and releases what a denied check reserved.
//!
//! The order inside one decision, and why:
//! 1. **Facts**: the user's trust points (capped), whether the user and the device are new.
//!    A user or device never seen is recorded as seen now (unless a dry run).
//! 2. **Signals**, in plan order. Each observes the request — before the score, so an
//!    attacker's denied tries still count against them — and answers its value.
//! 3. **Score**: weights of fired signals (and `new_account`), minus trust. At the line,
//!    the answer is a silent deny and no limit is touched: a denied request consumes no
//!    quota anywhere.
//! 4. **Limits**: each evaluated against its effective max (new-account factor, trust
//!    bonus); one exceeded and none records. Otherwise, a score in the challenge band that
//!    no reported pass lifts is a challenge and records nothing (a limit deny outranks it:
//!    asking a person to prove themselves and then denying them would be worse); else all
//!    record.
//!
//! [`math`] holds the arithmetic both deciders share (the embedded decider calls it; the
//! Lua script mirrors it line for line): filters, the score, the effective max; a
//! signal's plan, answer and arithmetic are [`crate::signal`]'s, which the behaviour
//! actors share without importing this module.

pub mod cluster;
mod cluster_layout;
pub mod embedded;
pub mod math;
pub mod redis;

pub use crate::signal::{SignalPlan, SignalValue};

use crate::rules::{Algorithm, Filter};
use crate::store::{LimitState, StoreError};

/// Everything one check asks of a decider.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckPlan {
    /// `<prefix>:<scene>:req:<dim>:<value>:<request_id>`: the request's record (repeat
    /// detection, refund) on the embedded store ([`crate::keys::KeySpace::record_key`]).
    pub record_key: String,
    /// `<prefix>:<scene>:rq:<dim>:<value>`: where Redis keeps the request and idempotency
    /// records of the check's first required entity
    /// ([`crate::keys::KeySpace::records_key`]).
    pub records_key: String,
    /// `<prefix>:<scene>:idem:<dim>:<value>:<key>`, when the check carries an idempotency
    /// key: the embedded store's key; on Redis a field of the records hash named by its
    /// last segment.
    pub idempotency_key: Option<String>,
    pub request_id: String,
    /// The caller named the request id, so the check may repeat an earlier one; an id the
    /// service made for this check (a fresh ULID) cannot have been counted, and the Redis
    /// decider does not look for its record.
    pub id_given: bool,
    /// How long the request and idempotency records live (the longest window, >= 1 s).
    pub record_ttl_ms: u64,
    /// Decide as if recording, record nothing (no sighting, no signal, no limit).
    pub dry_run: bool,
    /// `None` when the rule set has no `[trust]`: no points, no ages, no trust filters.
    pub trust: Option<TrustPlan>,
    pub signals: Vec<SignalPlan>,
    /// `None` when the scene has no `[score]`: signals are reported, nothing is denied.
    pub score: Option<ScorePlan>,
    pub limits: Vec<LimitPlan>,
}

/// What to read about the user and the device, and how to weigh it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrustPlan {
    /// `<prefix>:trust-points:uid:<user>`: a ZSET, member `<points>:<type>:<event_id>`,
    /// score = expiry ms. `None` without a user.
    pub points_key: Option<String>,
    /// `<prefix>:user-seen:uid:<user>`: unix ms of the first sighting. `None` without a
    /// user, or when no rule asks a user's age.
    pub user_seen_key: Option<String>,
    /// `<prefix>:device-seen:did:<device>`: unix ms of the device's first sighting.
    /// `None` without a device, or when no rule asks a device's age.
    pub device_seen_key: Option<String>,
    /// `user_created_at` of the check, ms: the user's age comes from it, not the sighting.
    pub user_created_ms: Option<u64>,
    /// How long a sighting is kept after the last one (refreshed on each).
    pub seen_ttl_ms: u64,
    pub max_points: u32,
    pub bonus_per_point: u32,
    pub discount_per_point: f64,
    /// `[trust].new_account`: `(younger_than_ms, max_factor)`.
    pub new_account: Option<(u64, f64)>,
    /// `[trust].new_device.younger_than`, ms.
    pub new_device_ms: Option<u64>,
    /// The scene can answer challenge and the check names a user: which reported passes
    /// (awards in the points key) lift the band. `None`: no pass is looked for.
    pub passes: Option<PassScopes>,
}

/// The ledger scopes of the passes that lift this check's challenge band: a pass reported
/// for the scene on any device, or on the check's device
/// ([`crate::trust::ledger::pass_scope`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassScopes {
    pub any_device: String,
    pub this_device: Option<String>,
}

impl PassScopes {
    /// Both scopes, the device's when there is one.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.any_device.as_str()).chain(self.this_device.as_deref())
    }
}

/// The scene's `[score]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScorePlan {
    /// Weight of each signal, parallel to [`CheckPlan::signals`] (0 when unweighted).
    pub weights: Vec<f64>,
    /// The weight of `new_account`, if the scene gives it one.
    pub new_account_weight: Option<f64>,
    pub silent_deny_at: f64,
    /// A score in `[challenge_at, silent_deny_at)` answers challenge, unless a pass lifts
    /// it ([`Facts::passed`]).
    pub challenge_at: Option<f64>,
}

/// One limit, resolved for this request.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitPlan {
    pub key: String,
    pub algorithm: Algorithm,
    pub window_ms: u64,
    /// The limit's max after any CIDR override; the decider applies the new-account
    /// factor and the trust bonus (they depend on facts it reads).
    pub base_max: u64,
    /// Counted per user: a new account gets `max_factor` of it.
    pub per_user: bool,
    /// Trust points raise it.
    pub trust_bonus: bool,
    /// Sliding windows: the longest window of any sliding limit sharing `key`.
    pub retain_ms: u64,
    /// The limit counts, and applies to, matching requests only.
    pub filter: Option<Filter>,
}

/// What the decider learnt about the user and the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// Unexpired trust points, capped by `max_points`.
    pub points: u32,
    /// `None` without `[trust].new_account` or without a user.
    pub new_account: Option<bool>,
    /// `None` without `[trust].new_device` or without a device.
    pub new_device: Option<bool>,
    /// The user passed a challenge of this scene (on this device, or on any) within its
    /// `pass_ttl`. `None` when no pass is looked for ([`TrustPlan::passes`]).
    pub passed: Option<bool>,
}

/// One limit's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitValue {
    /// The request matched the limit's filter: the limit was evaluated (and, on an allow,
    /// counted the request).
    pub applies: bool,
    /// The max it was held to (after the new-account factor and the trust bonus).
    pub max: u64,
    pub state: LimitState,
}

impl LimitValue {
    /// A limit that was not evaluated (its filter did not pass, or an answer reports only
    /// the limit that denies): nothing counted, held to `max`.
    pub fn not_applying(max: u64) -> LimitValue {
        LimitValue {
            applies: false,
            max,
            state: LimitState {
                count: 0,
                exceeded: false,
                retry_after_ms: 0,
            },
        }
    }
}

/// A limit's state as a deny (or a challenge) reports it, from an answer that counted the
/// request (a reservation, an evaluation as an allow): the count before the request, as a
/// single Redis reports a deny.
pub(crate) fn uncounted(state: LimitState) -> LimitState {
    LimitState {
        count: state.count.saturating_sub(1),
        ..state
    }
}

/// What a decider answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// The request id or idempotency key was counted before: nothing was read or written.
    /// `of` is the request id that was counted.
    Duplicate { of: String },
    /// Redis Cluster: the request id or idempotency key names an attempt not yet settled
    /// ([`CheckOutcome::Held`]): the check must be sent again shortly; nothing was kept.
    Held { of: String },
    /// Decided: facts, every signal (parallel to the plan's), the score; then either a
    /// score deny (no limit touched: `limits` empty) or the limits (parallel to the
    /// plan's).
    Judged(Judgement),
}

/// A decision that was not a repeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    pub facts: Facts,
    pub signals: Vec<SignalValue>,
    /// In [0, 1], rounded to 1e-9.
    pub score: f64,
    pub outcome: Outcome,
}

/// How the judgement ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The score reached `silent_deny_at`: no limit was evaluated or recorded.
    ScoreDeny,
    /// Every applying limit had room: the request is recorded in all of them (unless a
    /// dry run). `limits` is parallel to the plan's.
    Allowed { limits: Vec<LimitValue> },
    /// At least one applying limit was full: nothing recorded in any limit.
    Denied { limits: Vec<LimitValue> },
    /// Every applying limit had room but the score is in the challenge band and no pass
    /// lifts it: nothing recorded in any limit, no request or idempotency record (the
    /// claim sent again is decided anew). `limits` is parallel to the plan's.
    Challenged { limits: Vec<LimitValue> },
}

impl Outcome {
    /// The outcome of evaluated limits: `allowed` when every applying one had room, and
    /// then `challenged` when the score's band asks for a challenge.
    pub fn of_limits(allowed: bool, challenged: bool, limits: Vec<LimitValue>) -> Outcome {
        match (allowed, challenged) {
            (true, false) => Outcome::Allowed { limits },
            (true, true) => Outcome::Challenged { limits },
            (false, _) => Outcome::Denied { limits },
        }
    }
}

/// The decision's one step (see the module doc).
#[async_trait::async_trait]
pub trait Decider: Send + Sync + 'static {
    /// Decides one check. An error means the decider could not answer (the scene's
    /// `on_store_error` decides then); a deny is a value.
    async fn decide(&self, plan: &CheckPlan) -> Result<Decided, StoreError>;
}
