//! The rolling state of ONE signal key (`count × per × where × window`), as plain data and
//! functions: what the embedded decider's signal shards hold, and the semantics
//! `lua/decide.lua` implements with ZSETs. Both must give identical answers, so this
//! module follows the script operation for operation (see [`SignalState::observe`]).
//!
//! # Shape
//!
//! One [`SignalState`] per plan `key` (`<prefix>:<scene>:sg:<signal>[:<dims>]`). The
//! Redis side spreads one signal over up to three keys (the set, the all-requests set
//! `all_key`, the last user `last_key`); they always travel together, so here they are one
//! entity, routed by the hash of `key`. Which sets it holds depends on the count:
//!
//! - `users`, `devices`, `ips`, `nets`, `requests`: the members seen by the requests the
//!   filter lets through (`matching`), and with `min_share` the members seen by every
//!   request (`all`);
//! - `user_switches`: the last user (and when it was set) and the times of the switches.
//!
//! Members are `u64`: the plan's member is the hash of the counted value as 16 lowercase
//! hex digits, parsed back ([`member_of`](crate::signal::member_of)); anything else (a request id, for `requests`)
//! is hashed with [`entity_hash`](crate::signal::entity_hash).
//!
//! # Time
//!
//! A member seen at `t` is inside while `t > now - window` (the window store's rule too).
//! The last user is remembered while it was set inside the window, like any member (the
//! script stores `<ms>:<member>` and compares the time with `now`; its key's expiry only
//! cleans up): a device silent for a window starts afresh, and its next user is no switch.
//! Trimming what left the window is invisible to every answer (nothing outside the window
//! is counted, matched or evicted), so it may happen on any access and on the sweep, by
//! the window of the last recorded plan (kept in the state, so the sweep needs no rules).
//!
//! # Order and ties
//!
//! Sets are sorted by `(last seen, member)`: a ZSET's order (score, then member bytes; for
//! 16 lowercase hex digits that is the numeric order of the parsed `u64`). Eviction takes
//! the front — the least recently seen, and at equal times the smallest member — exactly
//! the members `ZRANGE key 0 n-cap-1` names. A member that is not 16 lowercase hex digits
//! (today: the request id of `requests`) is hashed with [`member_of`](crate::signal::member_of); the Redis decider
//! sends the script every member in that same form, so ties go the same way on both.
//!
//! # Layout
//!
//! [`SignalState`] is 56 bytes inline: the window (8) and a 48-byte enum of the three
//! shapes (two `Vec`s for the widest; the others fit beside the `Vec` capacity niche that
//! holds the tag). A member is 16 bytes (hash, ms), a switch time 8. `Vec`s start at one
//! slot, not `Vec`'s four (most sets hold one member), and double up to the cap; a trim
//! that leaves a set at most half full gives the memory back.
//!
//! # Memory per key
//!
//! In a shard, one key costs **~130 B with one member, + 16 B per further member slot**:
//! an 80-byte LRU node (the key's hash, this state, two links), ~35 B of the LRU's map
//! slot, and the set's buffer of 16 B per slot. Slots double (1, 2, 4, …), so `n`
//! members take 16–32 B each, and never more than `cap` slots: `max + 1`, or with
//! `min_share` `2 × (max + 1) / min_share` in each of its two sets (so a farm's device or
//! a campus network costs its cap, not one entry per user ever seen). A `user_switches`
//! key holds 8-byte switch times instead of members. glibc's rounding and chunk headers
//! add ~32 B per key (~160 B with one member), and a key changed since the last snapshot
//! ~20 B more in the dirty set until it is written. [`SignalState::approx_bytes`] counts
//! the state and its buffers (72 B with one member); the shard's part is a constant
//! ~58 B beside it. Measured with a counting allocator by
//! `shard::tests::bytes_per_signal_key_by_members` (4 096 keys per shard; a million keys
//! over 16 shards measure the same per key).
//!
//! # Snapshots
//!
//! [`SignalState::to_bytes`] / [`SignalState::from_bytes`]: big-endian, headed by
//! [`FORMAT_VERSION`] (2; 1 was the removed per-device, per-user and per-IP state) and a
//! shape byte, decoded strictly: lengths are checked against [`MAX_CAP`] and the
//! bytes present before anything is allocated, and the sort and uniqueness invariants are
//! verified.

use std::mem::size_of;

use crate::rules::Count;
use crate::signal::{fires, share, SignalPlan, SignalValue, MAX_CAP};

/// The snapshot format version of a signal state, its first byte.
pub const FORMAT_VERSION: u8 = 2;

const SHAPE_DISTINCT: u8 = b'd';
const SHAPE_SHARED: u8 = b's';
const SHAPE_SWITCHES: u8 = b'w';

/// What the state needs of a [`SignalPlan`]: small, `Copy`, and free of strings, so it can
/// travel to a shard in a message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignalSpec {
    /// `user_switches`: count changes of the member, not distinct members.
    pub switches: bool,
    /// Keep the all-requests set (the plan has an `all_key`).
    pub shared: bool,
    pub window_ms: u64,
    pub max: u64,
    pub min_share: Option<f64>,
    /// The most members (or switch times) a set keeps, in `1..=MAX_CAP`.
    pub cap: u32,
}

impl SignalSpec {
    /// The spec of one plan. The cap is clamped to `1..=MAX_CAP` ([`signal_cap`](crate::signal::signal_cap)
    /// never leaves that range; the clamp bounds memory and snapshot decoding whatever a
    /// plan says).
    pub fn of(plan: &SignalPlan) -> Self {
        let switches = plan.count == Count::UserSwitches;
        SignalSpec {
            switches,
            shared: !switches && plan.all_key.is_some(),
            window_ms: plan.window_ms,
            max: plan.max,
            min_share: plan.min_share,
            // MAX_CAP (10 000) fits a u32.
            cap: plan.cap.clamp(1, MAX_CAP) as u32,
        }
    }

    fn cap(&self) -> usize {
        self.cap as usize
    }
}

/// One member of a set and when it was last seen. Ordered by `(at, member)`, a ZSET's
/// order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    member: u64,
    at: u64,
}

impl Entry {
    fn order(&self) -> (u64, u64) {
        (self.at, self.member)
    }
}

/// The last user of a `user_switches` signal and when it was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Last {
    member: u64,
    at: u64,
}

impl Last {
    /// Still remembered at `now`: set inside the window.
    fn live(&self, now: u64, window: u64) -> bool {
        in_window(self.at, now, window)
    }

    /// A switch to `member`, at `now`.
    fn switched_to(last: Option<Last>, member: u64, now: u64, window: u64) -> bool {
        last.is_some_and(|l| l.live(now, window) && l.member != member)
    }
}

/// What one signal key holds; the shape follows the count (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sets {
    /// Distinct members of the matching requests. Empty, it is the empty state.
    Distinct { matching: Vec<Entry> },
    /// The same, and the distinct members of every request (`min_share`).
    Shared {
        matching: Vec<Entry>,
        all: Vec<Entry>,
    },
    /// `user_switches`: the last user (remembered while set inside the window; an expired
    /// one reads as none) and the switch times, ascending.
    Switches { last: Last, times: Vec<u64> },
}

impl Default for Sets {
    fn default() -> Self {
        Sets::Distinct {
            matching: Vec::new(),
        }
    }
}

/// The state of one signal key: its window (of the last recorded plan, for the sweep) and
/// its sets. See the module doc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignalState {
    window_ms: u64,
    sets: Sets,
}

/// The answer of a signal that does not apply to the request.
fn not_applying() -> SignalValue {
    SignalValue {
        applies: false,
        value: 0,
        share: None,
        fired: false,
    }
}

/// The answer of an applying signal: its share (with `min_share`, over `all`; 0 of
/// nothing without an all set) and whether it fires.
fn applying(spec: &SignalSpec, value: u64, all: Option<u64>) -> SignalValue {
    let share = spec.min_share.map(|_| share(value, all.unwrap_or(0)));
    SignalValue {
        applies: true,
        value,
        share,
        fired: fires(true, value, spec.max, share, spec.min_share),
    }
}

/// Is `at` inside `(now - window, ..]`? Written without underflow: while `now < window`
/// every time counts.
fn in_window(at: u64, now: u64, window: u64) -> bool {
    match now.checked_sub(window) {
        Some(lower) => at > lower,
        None => true,
    }
}

/// Index of the first of the ascending-by-time `items` inside the window: everything
/// before it is out, everything from it on is in.
fn first_in_window<T>(items: &[T], at: impl Fn(&T) -> u64, now: u64, window: u64) -> usize {
    items.partition_point(|x| !in_window(at(x), now, window))
}

/// Grows `v` by one slot when full: doubling, but never past `cap` and never starting at
/// four slots (`Vec`'s default for small types), because most sets hold one member.
fn reserve_one<T>(v: &mut Vec<T>, cap: usize) {
    if v.len() == v.capacity() {
        let extra = v.len().max(1).min(cap.saturating_sub(v.len()).max(1));
        v.reserve_exact(extra);
    }
}

/// Gives memory back after a trim left a set mostly empty.
fn shrink_after_trim<T>(v: &mut Vec<T>) {
    if v.len() <= v.capacity() / 2 {
        v.shrink_to_fit();
    }
}

/// The members of `set` inside the window, plus `member` when it is not among them, at
/// most `cap`: the count as it will be with this request.
fn count_with(set: &[Entry], member: u64, now: u64, window: u64, cap: usize) -> u64 {
    let live = &set[first_in_window(set, |e| e.at, now, window)..];
    // Newest last: a repeat visitor is found first from the end.
    let absent = !live.iter().rev().any(|e| e.member == member);
    (live.len() + usize::from(absent)).min(cap) as u64
}

/// The members [`touch`] would evict from `live` (a set's members inside the window, in
/// order) when `member` is seen at `now` and `over` of them must leave: the first `over`
/// in `(last seen, member)` order once `member` has moved to `now` — possibly `member`
/// itself. What a dry run foresees of a recording.
fn would_evict(live: &[Entry], member: u64, now: u64, over: usize) -> Vec<u64> {
    if over == 0 {
        return Vec::new();
    }
    let moved = Entry { member, at: now };
    let mut gone = Vec::with_capacity(over);
    let mut placed = false;
    for e in live.iter().filter(|e| e.member != member) {
        if !placed && moved.order() < e.order() {
            placed = true;
            gone.push(member);
        }
        gone.push(e.member);
        if gone.len() >= over {
            break;
        }
    }
    if !placed {
        gone.push(member);
    }
    gone.truncate(over);
    gone
}

/// Switch times inside the window.
fn live_times(times: &[u64], now: u64, window: u64) -> usize {
    times.len() - first_in_window(times, |&t| t, now, window)
}

/// Drops what left the window (everything at or before `now - window`).
fn drop_expired<T>(set: &mut Vec<T>, at: impl Fn(&T) -> u64, now: u64, window: u64) {
    let keep_from = first_in_window(set, at, now, window);
    if keep_from > 0 {
        set.drain(..keep_from);
        shrink_after_trim(set);
    }
}

/// Inserts `item` at `pos` of the sorted `v`, then drops the front beyond `cap` — as a
/// `ZADD` and then `ZREMRANGEBYRANK 0 n-cap-1` would, but without ever growing past `cap`:
/// the front is dropped first, or `item` itself when it sorts among what is dropped (an
/// older time from a skewed clock, or an equal time and a smaller member). `gone` gets
/// each dropped item. More than one is dropped only when the cap shrank since `v` filled.
fn insert_capped<T>(v: &mut Vec<T>, pos: usize, item: T, cap: usize, mut gone: impl FnMut(T)) {
    // cap >= 1, so over - 1 <= v.len().
    let over = (v.len() + 1).saturating_sub(cap);
    if pos < over {
        v.drain(..over - 1).for_each(&mut gone);
        gone(item);
    } else {
        v.drain(..over).for_each(&mut gone);
        reserve_one(v, cap);
        v.insert(pos - over, item);
    }
    if over > 1 {
        shrink_after_trim(v);
    }
}

/// `ZADD set now member` and the eviction of the least recently seen beyond `cap`
/// (`evicted` is called with each, possibly `member` itself).
fn touch(set: &mut Vec<Entry>, member: u64, now: u64, cap: usize, mut evicted: impl FnMut(u64)) {
    if let Some(i) = set.iter().rposition(|e| e.member == member) {
        set.remove(i);
    }
    let entry = Entry { member, at: now };
    let pos = set.partition_point(|e| e.order() < entry.order());
    insert_capped(set, pos, entry, cap, |gone| evicted(gone.member));
}

fn remove_member(set: &mut Vec<Entry>, member: u64) {
    if let Some(i) = set.iter().rposition(|e| e.member == member) {
        set.remove(i);
    }
}

impl SignalState {
    /// Nothing seen.
    pub fn new() -> Self {
        SignalState::default()
    }

    /// What [`SignalState::observe`] would answer, changing nothing: the dry run. A state
    /// of another shape (the rule's count changed) reads as empty, as `observe` would
    /// reset it.
    ///
    /// A recording that fills the all set past its cap evicts from it — and so from the
    /// signal's set — before it counts the signal's set; the dry run evicts nothing but
    /// works out what that eviction would take ([`would_evict`]) and leaves it out of
    /// the count, so it answers exactly as the recording would.
    pub fn peek(&self, spec: &SignalSpec, member: u64, applies: bool, now: u64) -> SignalValue {
        let window = spec.window_ms;
        if spec.switches {
            if !applies {
                return not_applying();
            }
            let (last, times): (Option<Last>, &[u64]) = match &self.sets {
                Sets::Switches { last, times } => (Some(*last), times),
                _ => (None, &[]),
            };
            let switched = Last::switched_to(last, member, now, window);
            let value = (live_times(times, now, window) + usize::from(switched)).min(spec.cap());
            return applying(spec, value as u64, None);
        }
        let (matching, all): (&[Entry], &[Entry]) = match &self.sets {
            Sets::Distinct { matching } => (matching, &[]),
            Sets::Shared { matching, all } => (matching, all),
            Sets::Switches { .. } => (&[], &[]),
        };
        // What the recording would evict from the all set, and so from the signal's set.
        let mut gone = Vec::new();
        let all = spec.shared.then(|| {
            let live = &all[first_in_window(all, |e| e.at, now, window)..];
            let absent = !live.iter().rev().any(|e| e.member == member);
            let n = live.len() + usize::from(absent);
            gone = would_evict(live, member, now, n.saturating_sub(spec.cap()));
            n.min(spec.cap()) as u64
        });
        if !applies {
            return not_applying();
        }
        let live = &matching[first_in_window(matching, |e| e.at, now, window)..];
        let held = |m: u64| live.iter().rev().any(|e| e.member == m);
        let evicted = gone.iter().filter(|&&g| held(g)).count();
        let present = held(member) && !gone.contains(&member);
        let value = (live.len() - evicted + usize::from(!present)).min(spec.cap());
        applying(spec, value as u64, all)
    }

    /// Records one request and answers the signal's value, this request included: the
    /// recording half of `decide.lua`'s signal step, operation for operation.
    ///
    /// `applies` is the filter's verdict.
    /// - `user_switches`: not applying, nothing is read or written. Otherwise switched =
    ///   a last user is remembered and is not `member`; value = min(switches in the
    ///   window + switched, cap); a switch is recorded at `now` (the oldest beyond the cap
    ///   leave) and `member` becomes the last user, at `now`.
    /// - other counts, with an all set (`spec.shared`), for every request: all =
    ///   min(members in the window + (member absent), cap); `member` is recorded at `now`
    ///   in the all set, the least recently seen beyond the cap leave it *and* the
    ///   signal's set. Then, applying: the same count, record and eviction on the
    ///   signal's set, and with `min_share` share = value / all (rounded like the score).
    /// - fired: [`fires`].
    ///
    /// A state of another shape than the spec's (the rule changed) starts afresh, except
    /// that an all set appears beside, or outlives, the signal's set (as the Redis keys
    /// would).
    pub fn observe(
        &mut self,
        spec: &SignalSpec,
        member: u64,
        applies: bool,
        now: u64,
    ) -> SignalValue {
        let window = spec.window_ms;
        if spec.switches {
            if !applies {
                return not_applying();
            }
            self.window_ms = window;
            let (last, mut times) = match std::mem::take(&mut self.sets) {
                Sets::Switches { last, times } => (Some(last), times),
                _ => (None, Vec::new()),
            };
            drop_expired(&mut times, |&t| t, now, window);
            let switched = Last::switched_to(last, member, now, window);
            let value = (times.len() + usize::from(switched)).min(spec.cap());
            if switched {
                let pos = times.partition_point(|&t| t <= now);
                insert_capped(&mut times, pos, now, spec.cap(), |_| {});
            }
            self.sets = Sets::Switches {
                last: Last { member, at: now },
                times,
            };
            return applying(spec, value as u64, None);
        }

        self.window_ms = window;
        let (mut matching, mut all) = match std::mem::take(&mut self.sets) {
            Sets::Distinct { matching } => (matching, None),
            Sets::Shared { matching, all } => (matching, Some(all)),
            Sets::Switches { .. } => (Vec::new(), None),
        };
        // Trimming first is invisible (module doc) and makes "present" mean "present and
        // inside the window", as after the script's ZREMRANGEBYSCORE.
        drop_expired(&mut matching, |e| e.at, now, window);
        if let Some(all) = &mut all {
            drop_expired(all, |e| e.at, now, window);
        }
        let mut all_count = None;
        if spec.shared {
            let all = all.get_or_insert_with(Vec::new);
            all_count = Some(count_with(all, member, now, window, spec.cap()));
            // The share is taken among the most recent members of both sets: what leaves
            // the all set leaves the signal's set too.
            touch(all, member, now, spec.cap(), |gone| {
                remove_member(&mut matching, gone)
            });
        }
        let value = applies.then(|| {
            let value = count_with(&matching, member, now, window, spec.cap());
            touch(&mut matching, member, now, spec.cap(), |_| {});
            value
        });
        self.sets = match all {
            // Without the all set in the rule any more, it is kept until it empties, as
            // its Redis key would live on until it expires.
            Some(all) if spec.shared || !all.is_empty() => Sets::Shared { matching, all },
            _ => Sets::Distinct { matching },
        };
        match value {
            Some(value) => applying(spec, value, all_count),
            None => not_applying(),
        }
    }

    /// [`SignalState::peek`] for a dry run, [`SignalState::observe`] otherwise.
    pub fn apply(
        &mut self,
        spec: &SignalSpec,
        member: u64,
        applies: bool,
        now: u64,
        dry_run: bool,
    ) -> SignalValue {
        if dry_run {
            self.peek(spec, member, applies, now)
        } else {
            self.observe(spec, member, applies, now)
        }
    }

    /// Drops what left the window of the last recorded plan; a last user no longer
    /// remembered is forgotten once no switch is left either.
    pub fn trim(&mut self, now: u64) {
        let window = self.window_ms;
        match &mut self.sets {
            Sets::Distinct { matching } => drop_expired(matching, |e| e.at, now, window),
            Sets::Shared { matching, all } => {
                drop_expired(matching, |e| e.at, now, window);
                drop_expired(all, |e| e.at, now, window);
            }
            Sets::Switches { last, times } => {
                drop_expired(times, |&t| t, now, window);
                if times.is_empty() && !last.live(now, window) {
                    self.sets = Sets::default();
                }
            }
        }
    }

    /// Holds nothing: the shard may drop it. (Trim first: an expired member still counts
    /// as held until trimmed.)
    pub fn is_empty(&self) -> bool {
        match &self.sets {
            Sets::Distinct { matching } => matching.is_empty(),
            Sets::Shared { matching, all } => matching.is_empty() && all.is_empty(),
            Sets::Switches { .. } => false,
        }
    }

    /// The latest time anything in the state was seen (for the shard's LRU on restore).
    pub fn last_seen(&self) -> Option<u64> {
        let newest = |set: &[Entry]| set.iter().map(|e| e.at).max();
        match &self.sets {
            Sets::Distinct { matching } => newest(matching),
            Sets::Shared { matching, all } => newest(matching).max(newest(all)),
            Sets::Switches { last, times } => Some(last.at.max(times.last().copied().unwrap_or(0))),
        }
    }

    /// The window of the last recorded plan, ms.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// Members held in the signal's set (switch times for `user_switches`), expired ones
    /// included until trimmed.
    pub fn len(&self) -> usize {
        match &self.sets {
            Sets::Distinct { matching } | Sets::Shared { matching, .. } => matching.len(),
            Sets::Switches { times, .. } => times.len(),
        }
    }

    /// Members held in the all set (0 without one).
    pub fn all_len(&self) -> usize {
        match &self.sets {
            Sets::Shared { all, .. } => all.len(),
            _ => 0,
        }
    }

    /// Inline plus heap bytes (allocated capacity), allocator overhead not included.
    pub fn approx_bytes(&self) -> usize {
        let heap = match &self.sets {
            Sets::Distinct { matching } => matching.capacity() * size_of::<Entry>(),
            Sets::Shared { matching, all } => {
                (matching.capacity() + all.capacity()) * size_of::<Entry>()
            }
            Sets::Switches { times, .. } => times.capacity() * size_of::<u64>(),
        };
        size_of::<Self>() + heap
    }

    /// The snapshot encoding: version, shape, window, then the shape's sets (a set: `u32`
    /// length, then member and time per entry; switches: the last user and its time, then
    /// `u32` length and the times).
    pub fn to_bytes(&self) -> Vec<u8> {
        let shape = match &self.sets {
            Sets::Distinct { .. } => SHAPE_DISTINCT,
            Sets::Shared { .. } => SHAPE_SHARED,
            Sets::Switches { .. } => SHAPE_SWITCHES,
        };
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(FORMAT_VERSION);
        out.push(shape);
        out.extend_from_slice(&self.window_ms.to_be_bytes());
        match &self.sets {
            Sets::Distinct { matching } => encode_set(matching, &mut out),
            Sets::Shared { matching, all } => {
                encode_set(matching, &mut out);
                encode_set(all, &mut out);
            }
            Sets::Switches { last, times } => {
                out.extend_from_slice(&last.member.to_be_bytes());
                out.extend_from_slice(&last.at.to_be_bytes());
                out.extend_from_slice(&(times.len() as u32).to_be_bytes());
                for t in times {
                    out.extend_from_slice(&t.to_be_bytes());
                }
            }
        }
        out
    }

    fn encoded_len(&self) -> usize {
        let set = |s: &[Entry]| 4 + 16 * s.len();
        10 + match &self.sets {
            Sets::Distinct { matching } => set(matching),
            Sets::Shared { matching, all } => set(matching) + set(all),
            Sets::Switches { times, .. } => 20 + 8 * times.len(),
        }
    }

    /// Decodes [`SignalState::to_bytes`], refusing anything it would not have written.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = r.u8()?;
        if version != FORMAT_VERSION {
            return Err(DecodeError::UnknownVersion(version));
        }
        let shape = r.u8()?;
        let window_ms = r.u64()?;
        let sets = match shape {
            SHAPE_DISTINCT => Sets::Distinct {
                matching: decode_set(&mut r)?,
            },
            SHAPE_SHARED => Sets::Shared {
                matching: decode_set(&mut r)?,
                all: decode_set(&mut r)?,
            },
            SHAPE_SWITCHES => {
                let last = Last {
                    member: r.u64()?,
                    at: r.u64()?,
                };
                Sets::Switches {
                    last,
                    times: decode_times(&mut r)?,
                }
            }
            _ => return Err(DecodeError::Corrupt("unknown signal shape")),
        };
        r.finish()?;
        Ok(SignalState { window_ms, sets })
    }
}

/// Why a snapshot failed to decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("snapshot is truncated")]
    Truncated,
    #[error("snapshot has {0} unexpected trailing bytes")]
    TrailingBytes(usize),
    #[error("unknown snapshot format version {0}")]
    UnknownVersion(u8),
    #[error("corrupt snapshot: {0}")]
    Corrupt(&'static str),
}

/// A cursor over snapshot bytes; every read checks the length.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    fn need(&self, n: usize) -> Result<(), DecodeError> {
        if self.rest.len() < n {
            Err(DecodeError::Truncated)
        } else {
            Ok(())
        }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self
            .rest
            .split_first_chunk::<N>()
            .ok_or(DecodeError::Truncated)?;
        self.rest = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    fn finish(self) -> Result<(), DecodeError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

fn encode_set(set: &[Entry], out: &mut Vec<u8>) {
    out.extend_from_slice(&(set.len() as u32).to_be_bytes());
    for e in set {
        out.extend_from_slice(&e.member.to_be_bytes());
        out.extend_from_slice(&e.at.to_be_bytes());
    }
}

/// A length no set can reach (see [`MAX_CAP`]) is corrupt, and the bytes must be
/// there before anything is allocated for them.
fn decode_len(r: &mut Reader<'_>, entry_bytes: usize) -> Result<usize, DecodeError> {
    let len = r.u32()? as usize;
    if len as u64 > MAX_CAP {
        return Err(DecodeError::Corrupt("set larger than any cap"));
    }
    r.need(len.saturating_mul(entry_bytes))?;
    Ok(len)
}

fn decode_set(r: &mut Reader<'_>) -> Result<Vec<Entry>, DecodeError> {
    let len = decode_len(r, 16)?;
    let mut set = Vec::with_capacity(len);
    for _ in 0..len {
        set.push(Entry {
            member: r.u64()?,
            at: r.u64()?,
        });
    }
    if set.windows(2).any(|w| w[0].order() >= w[1].order()) {
        return Err(DecodeError::Corrupt(
            "set not sorted by last seen and member",
        ));
    }
    let mut members: Vec<u64> = set.iter().map(|e| e.member).collect();
    members.sort_unstable();
    if members.windows(2).any(|w| w[0] == w[1]) {
        return Err(DecodeError::Corrupt("a member twice in one set"));
    }
    Ok(set)
}

fn decode_times(r: &mut Reader<'_>) -> Result<Vec<u64>, DecodeError> {
    let len = decode_len(r, 8)?;
    let mut times = Vec::with_capacity(len);
    for _ in 0..len {
        times.push(r.u64()?);
    }
    if times.windows(2).any(|w| w[0] > w[1]) {
        return Err(DecodeError::Corrupt("switch times not sorted"));
    }
    Ok(times)
}

#[cfg(test)]
mod tests;
