//! The Redis decider: a whole [`CheckPlan`] in one EVALSHA of `lua/decide.lua`.
//!
//! This module owns the script's wire format: how a plan becomes KEYS and ARGV (the
//! script header documents both) and how the flat reply becomes a [`Decided`]. The
//! decision itself — facts, signals, score, limits, and the arithmetic of [`super::math`]
//! mirrored in Lua — runs inside Redis, atomically, so every node sharing the Redis sees
//! every observation and two checks never interleave.
//!
//! Like the window store it shares the node's [`RedisLink`] (one connection, one circuit
//! breaker, one deadline per call), loads its script at start-up so a Redis that cannot
//! take it fails then, and takes "now" from Redis `TIME` unless a test or a simulation
//! injects a clock.
//!
//! A check whose call fails or times out is answered by the scene's `on_store_error`, but
//! its script may still run when Redis answers: each attempt's record carries a
//! [`Stamp`], and such an attempt is released ([`crate::store::release`]) once Redis has
//! answered its call, so a request refused for want of the store never counts.

use std::sync::Arc;

use ::redis::{Cmd, Script, ToRedisArgs, Value};
use async_trait::async_trait;

use super::{CheckPlan, Decided, Decider, Facts, Judgement, LimitValue, Outcome, SignalValue};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::rules::Filter;
use crate::signal::member_of;
use crate::signal::MAX_CAP;
use crate::store::limits_script::LimitScripts;
use crate::store::redis::{
    algo_code, idempotency_field, parse_check_reply, repeats, tag_arg, CheckCall, Stamp,
    RELEASE_LUA, STARTUP_MIN_MS,
};
use crate::store::redis_link::{CallFailed, RedisLink, Sent};
use crate::store::release::{Release, Releaser, Settle};
use crate::store::{CheckOutcome, LimitState, StoreError};

/// The decision script: `lua/limits.lua` (the limits' arithmetic and recording, shared with
/// `lua/check.lua`), then `lua/decide.lua`, whose header documents KEYS, ARGV and the
/// reply. Redis loads and hashes the composed text.
pub(super) const DECIDE_LUA: &str = concat!(
    include_str!("../../lua/limits.lua"),
    include_str!("../../lua/decide.lua")
);

/// KEYS with [trust]: points, user and device sightings.
const TRUST_KEYS: usize = 3;
/// KEYS per signal: its set, its all-requests set, its last-user key.
const KEYS_PER_SIGNAL: usize = 3;
/// ARGV every call has; those of [trust] and of [score], sent only with them.
const FIXED_ARGS: usize = 9;
const TRUST_ARGS: usize = 13;
const SCORE_ARGS: usize = 3;
/// ARGV per signal.
const ARGS_PER_SIGNAL: usize = 10;

/// A [`Decider`] on the node's Redis.
pub struct RedisDecider {
    /// Shared with the window store and the trust ledger.
    link: Arc<RedisLink>,
    script: Arc<Script>,
    /// The scripts for a check with limits only (see [`limits_only`]): made for its shape of
    /// limits, or check.lua.
    shaped: LimitScripts,
    /// Gives back what a failed call's script recorded, once Redis has answered it.
    releaser: Releaser,
    /// `Some` (and not the wall clock) replaces Redis `TIME` with this clock.
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for RedisDecider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDecider")
            .field("link", &self.link)
            .field("script", &self.script.get_hash())
            .field("injected_clock", &self.injected_clock())
            .finish()
    }
}

impl RedisDecider {
    /// Builds the decider on the node's link and loads `decide.lua`, within
    /// `max(link timeout, 1 s)`: a Redis that cannot take the script fails here, not on
    /// the first check. Starts the release task on the calling runtime.
    ///
    /// `clock`: "now" for the script. `None` or the wall clock read Redis `TIME` (nodes with
    /// skewed clocks agree); any other clock (tests, simulations) is sent with each call.
    /// Key expiries still run on Redis's own clock, so keep such a clock near the real time.
    pub async fn new(
        link: Arc<RedisLink>,
        clock: Option<Arc<dyn Clock>>,
        metrics: Metrics,
    ) -> Result<RedisDecider, StoreError> {
        let timeout_ms = link.timeout_ms();
        let startup_ms = timeout_ms.max(STARTUP_MIN_MS);
        let script = Arc::new(Script::new(DECIDE_LUA));
        let shaped = LimitScripts::default();
        let release = Script::new(RELEASE_LUA);
        link.load_scripts(&[&*script, shaped.check_lua(), &release], startup_ms)
            .await?;
        let releaser = Releaser::start(link.clone(), release, metrics);
        Ok(RedisDecider {
            link,
            script,
            shaped,
            releaser,
            clock,
        })
    }

    /// Waits until every release queued so far has run (tests look at the keys after).
    pub async fn settled(&self) {
        self.releaser.settled().await;
    }

    /// Queues the release of an attempt whose call failed, unless the call was never sent
    /// (or the check was a dry run, which records nothing): once Redis has answered it.
    /// Returns the failure's error, for the check's `on_store_error`.
    fn release_failed(
        &self,
        plan: &CheckPlan,
        sent_limits: &[usize],
        stamp: Stamp,
        failed: CallFailed,
    ) -> StoreError {
        let late = match failed.sent {
            Sent::No => return failed.error,
            _ if plan.dry_run => return failed.error,
            Sent::Ended => None,
            Sent::Pending(late) => Some(late),
        };
        let release = Release {
            settle: Settle::Release,
            records_key: plan.records_key.clone(),
            keys: sent_limits
                .iter()
                .map(|&j| (plan.limits[j].key.clone(), plan.limits[j].algorithm))
                .collect(),
            request_id: plan.request_id.clone(),
            record_ttl_ms: plan.record_ttl_ms,
            idempotency_field: plan.idempotency_key.as_deref().map(idempotency_field),
            now: self.now_arg(),
            stamp,
        };
        self.releaser.release_after(late, release);
        failed.error
    }

    fn injected_clock(&self) -> bool {
        self.clock.as_ref().is_some_and(|c| !c.is_wall())
    }

    /// The script's `now` argument: `None` means "read Redis TIME".
    fn now_arg(&self) -> Option<u64> {
        script_now(&self.clock)
    }
}

#[async_trait]
impl Decider for RedisDecider {
    async fn decide(&self, plan: &CheckPlan) -> Result<Decided, StoreError> {
        let stamp = Stamp::attempt();
        if limits_only(plan) {
            let (script, cmd, sent) =
                limits_invocation(&self.shaped, plan, self.now_arg(), Some(stamp));
            let decided = match self.link.eval_call(&script, cmd).await {
                Ok(reply) => parse_check_reply(reply, sent.len())
                    .and_then(|outcome| limits_judged(outcome, plan, &sent))
                    .map_err(CallFailed::ended),
                Err(failed) => Err(failed),
            };
            return decided.map_err(|failed| self.release_failed(plan, &sent, stamp, failed));
        }
        let whole = Part {
            stamp: Some(stamp),
            ..Part::whole(plan)
        };
        let cmd = invocation(self.script.get_hash(), plan, &whole, self.now_arg());
        let decided = match self.link.eval_call(&self.script, cmd).await {
            Ok(reply) => parse_reply(reply, plan, &whole).map_err(CallFailed::ended),
            Err(failed) => Err(failed),
        };
        decided.map_err(|failed| {
            let all: Vec<usize> = (0..plan.limits.len()).collect();
            self.release_failed(plan, &all, stamp, failed)
        })
    }
}

/// A script's `now` from a decider's clock: `None` (read Redis `TIME`) without one or with
/// the wall clock, the clock's time otherwise (tests, simulations).
pub(super) fn script_now(clock: &Option<Arc<dyn Clock>>) -> Option<u64> {
    match clock {
        Some(clock) if !clock.is_wall() => Some(clock.now_ms()),
        _ => None,
    }
}

/// A check with limits only: no `[trust]` (no points, ages unknown), no `[score]`, no
/// signals. decide.lua would read no fact, count no signal and score 0, then run
/// limits.lua's two phases on the limits that apply; check.lua runs the same two phases
/// without the rest (its argument parsing, helpers and reply cost Redis ~15 % more per
/// check: `benches/lua-cpu.sh`).
pub(super) fn limits_only(plan: &CheckPlan) -> bool {
    plan.trust.is_none() && plan.score.is_none() && plan.signals.is_empty()
}

/// Whether a limit applies without `[trust]`: as decide.lua's `passes`, an unknown age is
/// not young, and a user with no trust holds no points.
pub(super) fn applies_without_trust(filter: Option<Filter>) -> bool {
    match filter {
        // Without [trust] (and so without a challenge to have passed) no one is verified.
        None | Some(Filter::Untrusted | Filter::Unverified) => true,
        Some(Filter::NewAccount | Filter::NewDevice) => false,
    }
}

/// The script for a [`limits_only`] plan (made for its shape of limits, or check.lua), its
/// EVALSHA, and the plan's indices of the limits sent (those that apply; the others are
/// neither read nor written, as in decide.lua).
fn limits_invocation(
    shaped: &LimitScripts,
    plan: &CheckPlan,
    now: Option<u64>,
    stamp: Option<Stamp>,
) -> (Arc<Script>, Cmd, Vec<usize>) {
    let sent: Vec<usize> = (0..plan.limits.len())
        .filter(|&j| applies_without_trust(plan.limits[j].filter))
        .collect();
    let call = CheckCall {
        records_key: &plan.records_key,
        idempotency_key: plan.idempotency_key.as_deref(),
        request_id: &plan.request_id,
        dry_run: plan.dry_run,
        id_given: plan.id_given,
        record_ttl_ms: plan.record_ttl_ms,
        now,
        stamp,
    };
    let limits = sent.iter().map(|&j| {
        let l = &plan.limits[j];
        (
            l.key.as_str(),
            l.algorithm,
            l.window_ms,
            l.base_max,
            l.retain_ms,
        )
    });
    let (script, cmd) = shaped.command(&call, limits);
    (script, cmd, sent)
}

/// check.lua's answer as decide.lua's would be: no points, ages unknown, no signal, score
/// 0; the limits sent in their places, the others not applying.
pub(super) fn limits_judged(
    outcome: CheckOutcome,
    plan: &CheckPlan,
    sent: &[usize],
) -> Result<Decided, StoreError> {
    let (allowed, states) = match outcome {
        CheckOutcome::Duplicate { of } => return Ok(Decided::Duplicate { of }),
        CheckOutcome::Held { of } => return Ok(Decided::Held { of }),
        CheckOutcome::Allowed { limits } => (true, limits),
        CheckOutcome::Denied { limits } => (false, limits),
    };
    let any_exceeded = states.iter().any(|s| s.exceeded);
    if allowed == any_exceeded {
        return Err(StoreError::Protocol(format!(
            "check.lua reply: {} with{} an exceeded limit",
            if allowed { "allow" } else { "deny" },
            if any_exceeded { "" } else { "out" }
        )));
    }
    let mut limits: Vec<LimitValue> = plan
        .limits
        .iter()
        .map(|l| LimitValue::not_applying(l.base_max))
        .collect();
    for (&j, state) in sent.iter().zip(states) {
        limits[j].applies = true;
        limits[j].state = state;
    }
    let outcome = if allowed {
        Outcome::Allowed { limits }
    } else {
        Outcome::Denied { limits }
    };
    Ok(Decided::Judged(Judgement {
        facts: Facts::default(),
        signals: Vec::new(),
        score: 0.0,
        outcome,
    }))
}

/// What of a plan one decide.lua call is sent: the whole plan on one Redis; on Redis
/// Cluster one slot group's share of it ([`super::cluster`]), whose script reads the facts
/// whose keys it holds and is given the others.
#[derive(Debug, Clone)]
pub(super) struct Part<'a> {
    pub records_key: &'a str,
    /// The idempotency record is written (and looked for) in one place only.
    pub idempotency_key: Option<&'a str>,
    /// The plan's indices of the signals and limits sent; `None`: all of them, in order.
    pub signals: Option<&'a [usize]>,
    pub limits: Option<&'a [usize]>,
    /// The trust keys this part holds (its script reads and records them); the others
    /// are stand-ins.
    pub holds_points: bool,
    pub holds_user_seen: bool,
    pub holds_device_seen: bool,
    /// Facts read elsewhere, sent as `=<value>` in the place of their key's flag.
    pub given: GivenFacts,
    /// Send the trust block (when the plan has one): without it the script reads no
    /// fact (no points, ages unknown) and holds every limit to its base max.
    pub trust: bool,
    /// Send the score's block: the script scores and may deny on it. A slot group does
    /// not (it sees only its own signals); the node scores.
    pub score: bool,
    /// What ends this attempt's record (a dry run sends none).
    pub stamp: Option<Stamp>,
}

/// Facts a slot group's script is given rather than reads: `None` each when not given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct GivenFacts {
    pub points: Option<u32>,
    pub new_account: Option<Option<bool>>,
    pub new_device: Option<Option<bool>>,
    /// Whether the user passed the scene's challenge, read with the points elsewhere.
    pub passed: Option<Option<bool>>,
    /// The user's keys are in another slot, but the request gave `user_created_at`: the
    /// script reckons the user's age from it on its own master's clock, in the same
    /// round as the user's slot, rather than waiting to be given it.
    pub age_from_created: bool,
}

impl<'a> Part<'a> {
    /// The whole plan, as one Redis decides it.
    pub fn whole(plan: &'a CheckPlan) -> Part<'a> {
        Part {
            records_key: &plan.records_key,
            idempotency_key: plan.idempotency_key.as_deref(),
            signals: None,
            limits: None,
            holds_points: true,
            holds_user_seen: true,
            holds_device_seen: true,
            given: GivenFacts::default(),
            trust: true,
            score: true,
            stamp: None,
        }
    }

    /// The plan's indices of the signals sent.
    pub fn signal_indices(&self, plan: &CheckPlan) -> impl Iterator<Item = usize> + Clone + 'a {
        indices(self.signals, plan.signals.len())
    }

    /// The plan's indices of the limits sent.
    pub fn limit_indices(&self, plan: &CheckPlan) -> impl Iterator<Item = usize> + Clone + 'a {
        indices(self.limits, plan.limits.len())
    }
}

/// `picked`, or `0..all` when `None`.
fn indices(picked: Option<&[usize]>, all: usize) -> impl Iterator<Item = usize> + Clone + '_ {
    let (some, none) = match picked {
        Some(p) => (Some(p.iter().copied()), None),
        None => (None, Some(0..all)),
    };
    some.into_iter().flatten().chain(none.into_iter().flatten())
}

/// A trust key's flag: a given fact (`=<value>`), else whether the key is real here.
fn fact_flag(cmd: &mut Cmd, given: Option<i64>, real: bool) {
    match given {
        Some(v) => cmd.arg(format!("={v}")),
        None => cmd.arg(flag(real)),
    };
}

fn tristate(x: Option<bool>) -> i64 {
    match x {
        None => -1,
        Some(false) => 0,
        Some(true) => 1,
    }
}

fn flag(b: bool) -> &'static str {
    if b {
        "1"
    } else {
        "0"
    }
}

fn filter_arg(filter: Option<Filter>) -> &'static str {
    filter.map(Filter::name).unwrap_or_default()
}

/// A signal's member as the script stores it: 16 lowercase hex digits, as the embedded
/// decider reads it ([`member_of`]): a hash already is kept, anything else (the request id
/// counted by `requests`) is hashed. A ZSET orders such members as the embedded sets order
/// their `u64`s, so members seen in one millisecond leave a full set in the same order on
/// both deciders.
fn script_member(member: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    // 8 bytes are 16 hex digits: the buffer always fits.
    let _ = hex::encode_to_slice(member_of(member).to_be_bytes(), &mut out);
    out
}

/// An optional key, or the records key standing in for it (its flag says which; the script
/// never touches a stand-in).
fn or_record<'a>(key: &'a Option<String>, records_key: &'a str) -> &'a str {
    key.as_deref().unwrap_or(records_key)
}

/// A trust key the part holds, or the records key standing in for it.
fn held<'a>(key: &'a Option<String>, holds: bool, records_key: &'a str) -> &'a str {
    match key {
        Some(k) if holds => k,
        _ => records_key,
    }
}

/// An optional argument: absent is "".
fn opt<T: ToRedisArgs>(cmd: &mut Cmd, x: Option<T>) {
    match x {
        Some(x) => cmd.arg(x),
        None => cmd.arg(""),
    };
}

/// The EVALSHA of one check (or of `part` of it), in the layout of the script header,
/// packed straight into one command: every key and argument is written once, into the
/// command's own buffer (numbers formatted in place), with no string of its own. `now`:
/// `None` reads Redis `TIME`.
pub(super) fn invocation(sha: &str, plan: &CheckPlan, part: &Part, now: Option<u64>) -> Cmd {
    let trust = plan.trust.as_ref().filter(|_| part.trust);
    let score = plan.score.as_ref().filter(|_| part.score);
    let signals = part.signal_indices(plan);
    let limits = part.limit_indices(plan);
    let (n_signals, n_limits) = (signals.clone().count(), limits.clone().count());
    let records_key = part.records_key;
    let n_keys =
        1 + if trust.is_some() { TRUST_KEYS } else { 0 } + KEYS_PER_SIGNAL * n_signals + n_limits;
    let n_args = FIXED_ARGS
        + usize::from(part.idempotency_key.is_some())
        + trust.map_or(0, |_| TRUST_ARGS)
        + score.map_or(0, |_| SCORE_ARGS)
        + ARGS_PER_SIGNAL * n_signals
        + n_limits * if trust.is_some() { 8 } else { 6 };
    let mut cmd = Cmd::with_capacity(3 + n_keys + n_args, 64 * (n_keys + n_args));
    cmd.arg("EVALSHA").arg(sha).arg(n_keys);

    cmd.arg(records_key);
    if let Some(t) = trust {
        cmd.arg(held(&t.points_key, part.holds_points, records_key))
            .arg(held(&t.user_seen_key, part.holds_user_seen, records_key))
            .arg(held(
                &t.device_seen_key,
                part.holds_device_seen,
                records_key,
            ));
    }
    for i in signals.clone() {
        let s = &plan.signals[i];
        cmd.arg(&s.key)
            .arg(or_record(&s.all_key, records_key))
            .arg(or_record(&s.last_key, records_key));
    }
    for j in limits.clone() {
        cmd.arg(&plan.limits[j].key);
    }

    cmd.arg(&plan.request_id);
    match part.stamp {
        Some(stamp) if !plan.dry_run => cmd.arg(format!("0{stamp}")),
        _ => cmd.arg(flag(plan.dry_run)),
    };
    cmd.arg(repeats(plan.id_given, part.idempotency_key.is_some()))
        .arg(plan.record_ttl_ms.max(1));
    opt(&mut cmd, now);
    cmd.arg(flag(trust.is_some()))
        .arg(flag(score.is_some()))
        .arg(n_signals)
        .arg(n_limits);
    if let Some(idem) = part.idempotency_key {
        cmd.arg(idempotency_field(idem));
    }
    if let Some(t) = trust {
        let g = part.given;
        fact_flag(
            &mut cmd,
            g.points.map(i64::from),
            part.holds_points && t.points_key.is_some(),
        );
        match g.new_account {
            // The user's slot is elsewhere; its age follows from user_created_at here.
            None if g.age_from_created => {
                cmd.arg("u");
            }
            given => fact_flag(
                &mut cmd,
                given.map(tristate),
                part.holds_user_seen && t.user_seen_key.is_some(),
            ),
        }
        fact_flag(
            &mut cmd,
            g.new_device.map(tristate),
            part.holds_device_seen && t.device_seen_key.is_some(),
        );
        opt(&mut cmd, t.user_created_ms);
        // PX 0 is an error in Redis; a sighting lives at least a millisecond.
        cmd.arg(t.seen_ttl_ms.max(1))
            .arg(t.max_points)
            .arg(t.bonus_per_point)
            .arg(t.discount_per_point);
        opt(&mut cmd, t.new_account.map(|(younger, _)| younger));
        opt(&mut cmd, t.new_account.map(|(_, factor)| factor));
        opt(&mut cmd, t.new_device_ms);
        // Passes are read with the points: only where the points key is real; elsewhere
        // the fact may be given ("=<0|1>", read by the points' group).
        let passes = t.passes.as_ref().filter(|_| part.holds_points);
        match g.passed {
            Some(passed) => cmd.arg(format!("={}", u8::from(passed == Some(true)))),
            None => cmd.arg(passes.map_or("", |p| p.any_device.as_str())),
        };
        opt(&mut cmd, passes.and_then(|p| p.this_device.as_deref()));
    }
    if let Some(score) = score {
        opt(&mut cmd, score.new_account_weight);
        cmd.arg(score.silent_deny_at);
        opt(&mut cmd, score.challenge_at);
    }
    for i in signals {
        let s = &plan.signals[i];
        cmd.arg(s.count.name())
            .arg(&script_member(&s.member)[..])
            .arg(filter_arg(s.filter))
            .arg(s.window_ms)
            .arg(s.max)
            // The embedded decider's bounds (`SignalSpec::of`): memory stays bounded
            // whatever a plan says.
            .arg(s.cap.clamp(1, MAX_CAP));
        opt(&mut cmd, s.min_share);
        cmd.arg(flag(s.all_key.is_some()))
            .arg(flag(s.last_key.is_some()));
        // Weights pair with signals like `zip` in math::score: a missing one adds nothing.
        opt(&mut cmd, score.and_then(|p| p.weights.get(i).copied()));
    }
    for j in limits {
        let l = &plan.limits[j];
        // A zero window would divide by zero in the script; the rule compiler rejects it,
        // this only keeps a bad plan from turning into a script error.
        let window_ms = l.window_ms.max(1);
        cmd.arg(algo_code(l.algorithm))
            .arg(window_ms)
            .arg(l.base_max)
            .arg(l.retain_ms.max(window_ms))
            .arg(filter_arg(l.filter))
            .arg(&tag_arg(l.algorithm, &l.key)[..]);
        if trust.is_some() {
            cmd.arg(flag(l.per_user)).arg(flag(l.trust_bonus));
        }
    }
    cmd
}

/// Reads the flat reply front to back; every error names the field it was reading.
struct Reply {
    items: std::vec::IntoIter<Value>,
    read: usize,
}

fn bad(why: impl std::fmt::Display) -> StoreError {
    StoreError::Protocol(format!("decide.lua reply: {why}"))
}

impl Reply {
    fn next(&mut self, what: &str) -> Result<Value, StoreError> {
        self.read += 1;
        self.items
            .next()
            .ok_or_else(|| bad(format!("ends before {what} (item {})", self.read)))
    }

    fn text(&mut self, what: &str) -> Result<String, StoreError> {
        match self.next(what)? {
            Value::BulkString(b) => {
                String::from_utf8(b).map_err(|_| bad(format!("{what}: not UTF-8")))
            }
            Value::SimpleString(s) => Ok(s),
            other => Err(bad(format!("{what}: expected text, got {other:?}"))),
        }
    }

    fn int(&mut self, what: &str) -> Result<i64, StoreError> {
        match self.next(what)? {
            Value::Int(i) => Ok(i),
            other => Err(bad(format!("{what}: expected an integer, got {other:?}"))),
        }
    }

    fn unsigned(&mut self, what: &str) -> Result<u64, StoreError> {
        let i = self.int(what)?;
        u64::try_from(i).map_err(|_| bad(format!("{what}: negative ({i})")))
    }

    fn flag(&mut self, what: &str) -> Result<bool, StoreError> {
        match self.int(what)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(bad(format!("{what}: expected 0 or 1, got {other}"))),
        }
    }

    /// -1 unknown, 0 no, 1 yes.
    fn tristate(&mut self, what: &str) -> Result<Option<bool>, StoreError> {
        match self.int(what)? {
            -1 => Ok(None),
            0 => Ok(Some(false)),
            1 => Ok(Some(true)),
            other => Err(bad(format!("{what}: expected -1, 0 or 1, got {other}"))),
        }
    }

    /// A finite float in [0, 1] (scores and shares).
    fn fraction(&mut self, what: &str) -> Result<f64, StoreError> {
        let text = self.text(what)?;
        match text.parse::<f64>() {
            // `+ 0.0`: a "-0" from the script is the score 0, never `-0.0` in an answer.
            Ok(x) if (0.0..=1.0).contains(&x) => Ok(x + 0.0),
            _ => Err(bad(format!("{what}: {text:?} is not a number in [0, 1]"))),
        }
    }

    fn count(&mut self, what: &str, expected: usize) -> Result<(), StoreError> {
        let n = self.int(what)?;
        if usize::try_from(n).ok() != Some(expected) {
            return Err(bad(format!("{what}: {n}, expected {expected}")));
        }
        Ok(())
    }

    fn end(self) -> Result<(), StoreError> {
        match self.items.len() {
            0 => Ok(()),
            rest => Err(bad(format!("{rest} values past the end"))),
        }
    }
}

/// Turns the script's reply into a [`Decided`], strictly: any shape but the header's is a
/// [`StoreError::Protocol`] naming what was wrong (a stale script, a foreign key shape).
/// `part`'s signals and limits, in its order, are what the reply holds.
pub(super) fn parse_reply(
    reply: Value,
    plan: &CheckPlan,
    part: &Part,
) -> Result<Decided, StoreError> {
    let Value::Array(items) = reply else {
        return Err(bad(format!("expected an array, got {reply:?}")));
    };
    let mut r = Reply {
        items: items.into_iter(),
        read: 0,
    };
    let kind = r.text("the kind")?;
    match kind.as_str() {
        "dup" | "held" => {
            let of = r.text("the counted request id")?;
            if of.is_empty() {
                return Err(bad("duplicate without the counted request id"));
            }
            r.end()?;
            return Ok(if kind == "held" {
                Decided::Held { of }
            } else {
                Decided::Duplicate { of }
            });
        }
        "judged" => {}
        other => return Err(bad(format!("unknown kind {other:?}"))),
    }

    let outcome = r.text("the outcome")?;
    let score = r.fraction("the score")?;
    let points = r.int("points")?;
    let points =
        u32::try_from(points).map_err(|_| bad(format!("points out of range ({points})")))?;
    let facts = Facts {
        points,
        new_account: r.tristate("new_account")?,
        new_device: r.tristate("new_device")?,
        passed: r.tristate("passed")?,
    };

    let n_signals = part.signal_indices(plan).count();
    r.count("the signal count", n_signals)?;
    let mut signals = Vec::with_capacity(n_signals);
    for s in part.signal_indices(plan).map(|i| &plan.signals[i]) {
        let at = |field: &str| format!("signal {:?} {field}", s.name);
        let applies = r.flag(&at("applies"))?;
        let value = r.unsigned(&at("value"))?;
        let share = match r.text(&at("share"))?.as_str() {
            "" => None,
            text => match text.parse::<f64>() {
                Ok(x) if (0.0..=1.0).contains(&x) => Some(x),
                _ => return Err(bad(format!("{}: {text:?} is not in [0, 1]", at("share")))),
            },
        };
        let fired = r.flag(&at("fired"))?;
        if fired && !applies {
            return Err(bad(format!("{} fired without applying", at(""))));
        }
        signals.push(SignalValue {
            applies,
            value,
            share,
            fired,
        });
    }

    let n_limits = match outcome.as_str() {
        "score" => 0,
        "allow" | "deny" | "challenge" => part.limit_indices(plan).count(),
        other => return Err(bad(format!("unknown outcome {other:?}"))),
    };
    r.count("the limit count", n_limits)?;
    let mut limits = Vec::with_capacity(n_limits);
    for j in part.limit_indices(plan).take(n_limits) {
        let l = &plan.limits[j];
        let at = |field: &str| format!("limit {j} ({}) {field}", l.key);
        let applies = r.flag(&at("applies"))?;
        let max = r.unsigned(&at("max"))?;
        let count = r.unsigned(&at("count"))?;
        let exceeded = r.flag(&at("exceeded"))?;
        let retry_after_ms = r.unsigned(&at("retry"))?;
        limits.push(LimitValue {
            applies,
            max,
            state: LimitState {
                count,
                exceeded,
                retry_after_ms,
            },
        });
    }
    r.end()?;

    let any_exceeded = limits.iter().any(|l| l.state.exceeded);
    let outcome = match outcome.as_str() {
        "score" => Outcome::ScoreDeny,
        "allow" if !any_exceeded => Outcome::Allowed { limits },
        "deny" if any_exceeded => Outcome::Denied { limits },
        "challenge" if !any_exceeded => Outcome::Challenged { limits },
        "allow" | "challenge" => return Err(bad(format!("{outcome} with an exceeded limit"))),
        _ => return Err(bad("a deny without an exceeded limit")),
    };
    Ok(Decided::Judged(Judgement {
        facts,
        signals,
        score,
        outcome,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{LimitPlan, ScorePlan, SignalPlan, TrustPlan};
    use crate::rules::{Algorithm, Count};
    use crate::store::redis::record_tag;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn int(i: i64) -> Value {
        Value::Int(i)
    }

    fn signal(name: &str, count: Count) -> SignalPlan {
        SignalPlan {
            name: name.into(),
            key: format!("p:s:sg:{name}"),
            all_key: None,
            last_key: (count == Count::UserSwitches).then(|| format!("p:s:sl:{name}")),
            count,
            member: "00000000000000aa".into(),
            filter: None,
            window_ms: 10_000,
            max: 3,
            min_share: None,
            cap: 4,
        }
    }

    fn limit(key: &str) -> LimitPlan {
        LimitPlan {
            key: key.into(),
            algorithm: Algorithm::SlidingWindow,
            window_ms: 10_000,
            base_max: 5,
            per_user: true,
            trust_bonus: false,
            retain_ms: 10_000,
            filter: None,
        }
    }

    /// Two signals, two limits, trust and a score.
    fn plan() -> CheckPlan {
        let mut shared = signal("upn", Count::Users);
        shared.all_key = Some("p:s:sa:upn".into());
        shared.min_share = Some(0.5);
        shared.filter = Some(Filter::NewAccount);
        CheckPlan {
            record_key: "p:s:req:r1".into(),
            records_key: "p:s:rq:all".into(),
            idempotency_key: None,
            request_id: "r1".into(),
            id_given: true,
            record_ttl_ms: 10_000,
            dry_run: false,
            trust: Some(TrustPlan {
                points_key: Some("p:trust-points:uid:u".into()),
                user_seen_key: Some("p:user-seen:uid:u".into()),
                device_seen_key: None,
                user_created_ms: None,
                seen_ttl_ms: 1_000,
                max_points: 5,
                bonus_per_point: 1,
                discount_per_point: 0.1,
                new_account: Some((86_400_000, 0.5)),
                new_device_ms: None,
                passes: None,
            }),
            signals: vec![shared, signal("sw", Count::UserSwitches)],
            score: Some(ScorePlan {
                weights: vec![0.6, 0.1],
                new_account_weight: None,
                silent_deny_at: 0.7,
                challenge_at: None,
            }),
            limits: vec![limit("p:s:uid:u"), limit("p:s:ip:1")],
        }
    }

    fn head(outcome: &str, score: &str) -> Vec<Value> {
        vec![
            bulk("judged"),
            bulk(outcome),
            bulk(score),
            int(2),
            int(1),
            int(-1),
            // passed: not looked for
            int(-1),
            int(2),
            // signal 1: applies, value 3, share 0.75, fired
            int(1),
            int(3),
            bulk("0.75"),
            int(1),
            // signal 2: does not apply
            int(0),
            int(0),
            bulk(""),
            int(0),
        ]
    }

    fn limits(exceeded: bool) -> Vec<Value> {
        vec![
            int(2),
            int(1),
            int(2),
            int(1),
            int(exceeded.into()),
            int(if exceeded { 500 } else { 0 }),
            int(0),
            int(5),
            int(0),
            int(0),
            int(0),
        ]
    }

    fn reply(parts: &[Vec<Value>]) -> Value {
        Value::Array(parts.concat())
    }

    /// What a command sends, as text.
    fn words(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                ::redis::Arg::Simple(b) => String::from_utf8(b.to_vec()).expect("utf-8"),
                other => panic!("not a plain word in an EVALSHA: {other:?}"),
            })
            .collect()
    }

    /// The KEYS and ARGV an invocation sends, as text.
    fn sent(p: &CheckPlan, now: Option<u64>) -> (Vec<String>, Vec<String>) {
        let words = words(&invocation("0123abcd", p, &Part::whole(p), now));
        assert_eq!(&words[..2], ["EVALSHA", "0123abcd"]);
        let n_keys: usize = words[2].parse().expect("numkeys");
        (words[3..3 + n_keys].to_vec(), words[3 + n_keys..].to_vec())
    }

    #[test]
    fn the_layout_is_the_headers() {
        let p = plan();
        let (keys, args) = sent(&p, Some(123));
        // No idempotency key: not sent. With [trust], its three keys follow the record.
        assert_eq!(keys.len(), 1 + TRUST_KEYS + 3 * 2 + 2);
        assert_eq!(
            args.len(),
            FIXED_ARGS + TRUST_ARGS + SCORE_ARGS + 10 * 2 + 8 * 2
        );
        // Absent optional keys are the records key; flags say which are real.
        assert_eq!(
            &keys[..4],
            [
                "p:s:rq:all",
                "p:trust-points:uid:u",
                "p:user-seen:uid:u",
                "p:s:rq:all"
            ]
        );
        assert_eq!(&keys[4..7], ["p:s:sg:upn", "p:s:sa:upn", "p:s:rq:all"]);
        assert_eq!(&keys[7..10], ["p:s:sg:sw", "p:s:rq:all", "p:s:sl:sw"]);
        assert_eq!(
            &args[..9],
            ["r1", "0", "r", "10000", "123", "1", "1", "2", "2"]
        );
        // The trust block, then the score block.
        assert_eq!(
            &args[9..25],
            [
                "1", "1", "0", "", "1000", "5", "1", "0.1", "86400000", "0.5", "", "", "", "",
                "0.7", ""
            ]
        );
        assert_eq!(
            &args[25..35],
            [
                "users",
                "00000000000000aa",
                "new_account",
                "10000",
                "3",
                "4",
                "0.5",
                "1",
                "0",
                "0.6"
            ]
        );
        // A sliding window has no tag: the record does not name it.
        assert_eq!(
            &args[45..53],
            ["s", "10000", "5", "10000", "", "", "1", "0"]
        );

        // Without [trust], [score], signals or an idempotency key, none of their blocks
        // is sent; Redis TIME is asked for with an empty now.
        // A fixed window's tag names it in the record.
        let fixed = LimitPlan {
            algorithm: Algorithm::FixedWindow,
            ..limit("p:s:fw:f:uid:u")
        };
        let tag = String::from_utf8(record_tag("p:s:fw:f:uid:u").to_vec()).expect("ASCII");
        let bare = CheckPlan {
            trust: None,
            score: None,
            signals: vec![],
            limits: vec![fixed],
            ..p
        };
        let (keys, args) = sent(&bare, None);
        assert_eq!(keys, ["p:s:rq:all", "p:s:fw:f:uid:u"]);
        assert_eq!(
            args,
            [
                "r1", "0", "r", "10000", "", "0", "0", "0", "1", "f", "10000", "5", "10000", "",
                &tag
            ]
        );
        // An idempotency key is a field of the records hash, sent after the counts.
        let idem = CheckPlan {
            idempotency_key: Some("p:s:idem:all:k".into()),
            ..bare
        };
        let (keys, args) = sent(&idem, None);
        assert_eq!(keys, ["p:s:rq:all", "p:s:fw:f:uid:u"]);
        assert_eq!(args[2], "ri");
        assert_eq!(&args[8..11], ["1", "i:k", "f"]);
        let made = CheckPlan {
            id_given: false,
            ..idem
        };
        assert_eq!(sent(&made, None).1[2], "i");
        let bare_made = CheckPlan {
            idempotency_key: None,
            ..made
        };
        assert_eq!(sent(&bare_made, None).1[2], "");
    }

    /// A plan with limits only goes to check.lua: the limits that apply without [trust]
    /// are sent, the others answered in their places as not applying.
    #[test]
    fn a_plan_with_limits_only_sends_the_applying_limits_to_check_lua() {
        let mut young = limit("p:s:new:uid:u");
        young.filter = Some(Filter::NewAccount);
        let mut untrusted = limit("p:s:unt:uid:u");
        untrusted.filter = Some(Filter::Untrusted);
        let p = CheckPlan {
            trust: None,
            score: None,
            signals: vec![],
            limits: vec![limit("p:s:uid:u"), young, untrusted],
            ..plan()
        };
        assert!(limits_only(&p));
        assert!(!limits_only(&plan()));
        let scripts = LimitScripts::default();
        let check_lua = scripts.check_lua();
        let (script, cmd, sent) = limits_invocation(&scripts, &p, None, None);
        assert_eq!(sent, [0, 2]);
        // The script made for this shape (two sliding windows of 10 s), sent the maxes only.
        assert_ne!(script.get_hash(), check_lua.get_hash());
        assert_eq!(
            words(&cmd),
            [
                "EVALSHA",
                script.get_hash(),
                "3",
                "p:s:rq:all",
                "p:s:uid:u",
                "p:s:unt:uid:u",
                "r1",
                "0",
                "r",
                "10000",
                "",
                // No idempotency key.
                "",
                // The record's entries: none for sliding windows.
                "",
                "5",
                "5"
            ]
        );
        // More limits than a shaped script takes: check.lua, five arguments per limit.
        let many = CheckPlan {
            limits: vec![limit("p:s:uid:u"); crate::store::limits_script::MAX_LIMITS + 1],
            ..p.clone()
        };
        let (script, cmd, _) = limits_invocation(&scripts, &many, None, None);
        assert_eq!(script.get_hash(), check_lua.get_hash());
        assert_eq!(words(&cmd).len(), 3 + 1 + 17 + 6 + 5 * 17);

        let state = |count, exceeded, retry_after_ms| LimitState {
            count,
            exceeded,
            retry_after_ms,
        };
        let Decided::Judged(j) = limits_judged(
            CheckOutcome::Denied {
                limits: vec![state(5, true, 700), state(1, false, 0)],
            },
            &p,
            &sent,
        )
        .expect("a deny") else {
            panic!("not judged")
        };
        assert_eq!((j.score, j.signals.len(), j.facts.points), (0.0, 0, 0));
        let Outcome::Denied { limits } = j.outcome else {
            panic!("not a deny")
        };
        assert_eq!(
            limits
                .iter()
                .map(|l| (l.applies, l.max, l.state))
                .collect::<Vec<_>>(),
            [
                (true, 5, state(5, true, 700)),
                (false, 5, state(0, false, 0)),
                (true, 5, state(1, false, 0))
            ]
        );
        assert_eq!(
            limits_judged(CheckOutcome::Duplicate { of: "r0".into() }, &p, &sent).expect("dup"),
            Decided::Duplicate { of: "r0".into() }
        );
        let contradiction = limits_judged(
            CheckOutcome::Allowed {
                limits: vec![state(5, true, 700), state(1, false, 0)],
            },
            &p,
            &sent,
        );
        assert!(
            matches!(&contradiction, Err(StoreError::Protocol(why)) if why.contains("allow with an exceeded")),
            "{contradiction:?}"
        );
    }

    #[test]
    fn parses_an_allow_a_deny_and_a_score_deny() {
        let p = plan();
        let Decided::Judged(j) = parse_reply(
            reply(&[head("allow", "0.6"), limits(false)]),
            &p,
            &Part::whole(&p),
        )
        .expect("allow") else {
            panic!("not judged")
        };
        assert_eq!(
            j.facts,
            Facts {
                points: 2,
                new_account: Some(true),
                new_device: None,
                passed: None,
            }
        );
        assert_eq!(j.score, 0.6);
        assert_eq!(
            j.signals,
            [
                SignalValue {
                    applies: true,
                    value: 3,
                    share: Some(0.75),
                    fired: true
                },
                SignalValue {
                    applies: false,
                    value: 0,
                    share: None,
                    fired: false
                }
            ]
        );
        assert_eq!(
            j.outcome,
            Outcome::Allowed {
                limits: vec![
                    LimitValue {
                        applies: true,
                        max: 2,
                        state: LimitState {
                            count: 1,
                            exceeded: false,
                            retry_after_ms: 0
                        }
                    },
                    LimitValue {
                        applies: false,
                        max: 5,
                        state: LimitState {
                            count: 0,
                            exceeded: false,
                            retry_after_ms: 0
                        }
                    }
                ]
            }
        );

        let denied = parse_reply(
            reply(&[head("deny", "0.6"), limits(true)]),
            &p,
            &Part::whole(&p),
        )
        .expect("deny");
        let Decided::Judged(Judgement {
            outcome: Outcome::Denied { limits: l },
            ..
        }) = denied
        else {
            panic!("not a deny: {denied:?}")
        };
        assert_eq!(l[0].state.retry_after_ms, 500);

        let score = parse_reply(
            reply(&[head("score", "0.69999999999999996"), vec![int(0)]]),
            &p,
            &Part::whole(&p),
        )
        .expect("score deny");
        let Decided::Judged(j) = score else {
            panic!("not judged")
        };
        assert_eq!((j.outcome, j.score), (Outcome::ScoreDeny, 0.7));
    }

    #[test]
    fn parses_a_duplicate() {
        let p = plan();
        assert_eq!(
            parse_reply(
                Value::Array(vec![bulk("dup"), bulk("r0")]),
                &p,
                &Part::whole(&p)
            )
            .expect("dup"),
            Decided::Duplicate { of: "r0".into() }
        );
    }

    fn protocol(reply: Value) -> String {
        match parse_reply(reply, &plan(), &Part::whole(&plan())) {
            Err(StoreError::Protocol(why)) => why,
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[test]
    fn rejects_malformed_replies_naming_what_is_wrong() {
        assert!(protocol(int(1)).contains("expected an array"));
        assert!(protocol(Value::Array(vec![])).contains("ends before the kind"));
        assert!(protocol(Value::Array(vec![bulk("dup"), bulk("")])).contains("request id"));
        assert!(
            protocol(Value::Array(vec![bulk("dup"), bulk("r"), int(0)])).contains("past the end")
        );
        assert!(protocol(Value::Array(vec![bulk("maybe")])).contains("unknown kind"));
        let odd = reply(&[head("perhaps", "0"), limits(false)]);
        assert!(protocol(odd).contains("unknown outcome"));

        // Counts that do not match the plan.
        let mut wrong_signals = head("allow", "0");
        wrong_signals[7] = int(3);
        assert!(protocol(reply(&[wrong_signals, limits(false)])).contains("signal count"));
        let mut wrong_limits = limits(false);
        wrong_limits[0] = int(1);
        assert!(protocol(reply(&[head("allow", "0"), wrong_limits])).contains("limit count"));
        assert!(protocol(reply(&[head("score", "1"), limits(false)])).contains("limit count"));

        // Truncated and overlong.
        let mut short = limits(false);
        short.pop();
        assert!(protocol(reply(&[head("allow", "0"), short])).contains("limit 1 (p:s:ip:1) retry"));
        assert!(
            protocol(reply(&[head("allow", "0"), limits(false), vec![int(0)]]))
                .contains("past the end")
        );

        // Values out of their domain.
        assert!(protocol(reply(&[head("allow", "1.5"), limits(false)])).contains("the score"));
        assert!(protocol(reply(&[head("allow", "nan"), limits(false)])).contains("the score"));
        let mut tri = head("allow", "0");
        tri[4] = int(2);
        assert!(protocol(reply(&[tri, limits(false)])).contains("new_account"));
        let mut passed = head("allow", "0");
        passed[6] = int(7);
        assert!(protocol(reply(&[passed, limits(false)])).contains("passed"));
        let mut neg = head("allow", "0");
        neg[3] = int(-1);
        assert!(protocol(reply(&[neg, limits(false)])).contains("points"));
        let mut share = head("allow", "0");
        share[10] = bulk("x");
        assert!(protocol(reply(&[share, limits(false)])).contains("signal \"upn\" share"));
        let mut typed = head("allow", "0");
        typed[9] = bulk("3");
        assert!(protocol(reply(&[typed, limits(false)])).contains("expected an integer"));
        let mut fired = head("allow", "0");
        fired[15] = int(1);
        assert!(protocol(reply(&[fired, limits(false)])).contains("fired without applying"));

        // An outcome its limits contradict.
        assert!(protocol(reply(&[head("allow", "0"), limits(true)])).contains("exceeded"));
        assert!(
            protocol(reply(&[head("deny", "0"), limits(false)])).contains("without an exceeded")
        );
        assert!(protocol(reply(&[head("challenge", "0"), limits(true)]))
            .contains("challenge with an exceeded limit"));
        let Decided::Judged(j) = parse_reply(
            reply(&[head("challenge", "0.5"), limits(false)]),
            &plan(),
            &Part::whole(&plan()),
        )
        .expect("a challenge") else {
            panic!("not judged")
        };
        assert!(matches!(j.outcome, Outcome::Challenged { .. }), "{j:?}");
    }
}
