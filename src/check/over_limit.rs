//! The over-limit cache: a node-local memory of limit keys the store just found full, so
//! that the next checks on them are denied without a store round trip (Envoy's
//! "over-limit cache").
//!
//! Why it is correct: a denied check consumes nothing, so answering it here instead of in
//! the store changes no count. A key stays full until the store's own retry time, unless
//! quota comes back early — a refund, a trust award that raises a max, a rule change — and
//! every one of those on this node invalidates the whole cache at once (one epoch counter;
//! see [`OverLimit::invalidate`]). Those events on *another* node cannot reach this one, so
//! an entry is held at most `hold_ms` (default 1 s) even when the store said to wait
//! longer: a refund elsewhere costs at most that long a deny here.
//!
//! What it will not answer, and why:
//! - a check carrying a `request_id` or an `idempotency_key`: it may be the retry of a
//!   request that was allowed before the key filled, whose answer is that allow
//!   (`duplicate_of`), not a deny. Only checks whose id the service made are eligible:
//!   they cannot be repeats.
//! - a dry run (it is asked for the store's view, and costs nothing to keep honest).
//! - a check whose scene has a signal that counts every attempt (requests, user switches):
//!   the cache would hide the attempts it counts; and a check that would record something
//!   the full key's deny did not (another device in a signal's set, a first sighting):
//!   the store must see it.
//! - a limit with a filter, or a trust bonus on a limit not counted per user: whether it
//!   applies, or its max, depends on who is asking, not only on the key.
//!
//! What the answer leaves out: the store is not asked, so signals, the score and trust
//! points are not read (the response reports no signal and 0 points) and the check is not
//! observed by the signals — only signals counting distinct users, devices, IPs or
//! networks may be in the plan, and those already hold this check's members.
//!
//! Memory: at most `max_keys` entries (each the key plus ~50 bytes), least recently used
//! evicted first; an entry past its hold is dropped when next read; and 64 KiB of
//! [`MaybeHeld`] bits.
//!
//! Cost: every eligible check asks about each of its keys, and most keys are not held. A
//! lookup in the cache takes a lock of its shard (shared with every other worker) and
//! ~50–70 ns; 3–4 % of an embedded check's CPU went to the four lookups of the bench
//! scene's checks (perf). So a key is looked up only when [`MaybeHeld`] — plain bits
//! read without a lock — says it may be held.

use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use quick_cache::sync::Cache;

use crate::decide::{CheckPlan, Decided, Facts, Judgement, LimitPlan, LimitValue, Outcome};
use crate::rules::Count;
use crate::signal::{SignalPlan, SignalValue};
use crate::store::LimitState;

/// What the store said of a full key.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The invalidation epoch the store's answer was asked in.
    epoch: u64,
    /// Answered from here until then (node clock, ms).
    hold_until: u64,
    /// When the store said the key admits one more (node clock, ms).
    free_at: u64,
    /// The limit's max after overrides (part of what the key must match).
    base_max: u64,
    /// The max it was held to, and its count, as the store reported them.
    max: u64,
    count: u64,
    /// What the deny's check observed ([`observed`]): a check answered from here must
    /// observe the same, or the store must see it.
    observed: u64,
}

/// The cache (see the module doc). `None`-free: a cache of 0 keys is simply never built.
pub struct OverLimit {
    held: Cache<String, Held>,
    maybe: MaybeHeld,
    epoch: AtomicU64,
    hold_ms: u64,
}

impl std::fmt::Debug for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverLimit")
            .field("keys", &self.held.len())
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .field("hold_ms", &self.hold_ms)
            .finish()
    }
}

/// The invalidation epoch of one check: taken before its plan goes to the store, so a
/// deny decided before a refund is never cached after it.
#[derive(Debug, Clone, Copy)]
pub struct Epoch(u64);

impl OverLimit {
    /// A cache of at most `max_keys` keys, each held at most `hold_ms`.
    pub fn new(max_keys: usize, hold_ms: u64) -> Self {
        OverLimit {
            held: Cache::new(max_keys.max(1)),
            maybe: MaybeHeld::new(hold_ms),
            epoch: AtomicU64::new(0),
            hold_ms,
        }
    }

    /// Forgets every key: quota may have come back (a refund, an award, new rules).
    pub fn invalidate(&self) {
        // Entries of older epochs are ignored (and dropped when read), so this is exact
        // at once; clearing too frees their memory now.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.held.clear();
    }

    /// How many keys it holds (expired ones included until read).
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The epoch to learn a store answer under.
    pub fn epoch(&self) -> Epoch {
        Epoch(self.epoch.load(Ordering::Acquire))
    }

    /// A deny for `plan` without the store, when one of its limits is held full at
    /// `now` and the check is eligible (see the module doc); `None` asks the store.
    /// `repeatable`: the check carries a request id or an idempotency key of its own.
    pub fn answer(&self, plan: &CheckPlan, repeatable: bool, now: u64) -> Option<Decided> {
        if repeatable || plan.dry_run || !plan.signals.iter().all(unmoved_by_repeats) {
            return None;
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        let mut seen = None;
        let (i, held) = plan.limits.iter().enumerate().find_map(|(i, l)| {
            if !cacheable(l) || !self.maybe.may_hold(&l.key) {
                return None;
            }
            let held = self.held.get(l.key.as_str())?;
            if held.epoch != epoch || now >= held.hold_until {
                self.held.remove(l.key.as_str());
                return None;
            }
            let seen = *seen.get_or_insert_with(|| observed(plan));
            (held.base_max == l.base_max && held.observed == seen).then_some((i, held))
        })?;
        let limits = plan
            .limits
            .iter()
            .enumerate()
            .map(|(j, l)| {
                if j == i {
                    LimitValue {
                        applies: true,
                        max: held.max,
                        state: LimitState {
                            count: held.count,
                            exceeded: true,
                            retry_after_ms: held.free_at.saturating_sub(now).max(1),
                        },
                    }
                } else {
                    // Not evaluated: the answer reports only the limit that denies.
                    LimitValue::not_applying(l.base_max)
                }
            })
            .collect();
        let not_read = SignalValue {
            applies: false,
            value: 0,
            share: None,
            fired: false,
        };
        Some(Decided::Judged(Judgement {
            facts: Facts::default(),
            signals: vec![not_read; plan.signals.len()],
            score: 0.0,
            outcome: Outcome::Denied { limits },
        }))
    }

    /// Remembers every full key of a store's deny, asked at `now` in `epoch`.
    pub fn learn(&self, plan: &CheckPlan, decided: &Decided, epoch: Epoch, now: u64) {
        let Decided::Judged(Judgement {
            outcome: Outcome::Denied { limits },
            ..
        }) = decided
        else {
            return;
        };
        if plan.dry_run || !plan.signals.iter().all(unmoved_by_repeats) {
            return;
        }
        let observed = observed(plan);
        for (l, v) in plan.limits.iter().zip(limits) {
            if !(v.applies && v.state.exceeded && cacheable(l)) {
                continue;
            }
            let free_at = now.saturating_add(v.state.retry_after_ms);
            let held = Held {
                epoch: epoch.0,
                hold_until: free_at.min(now.saturating_add(self.hold_ms)),
                free_at,
                base_max: l.base_max,
                max: v.max,
                count: v.state.count,
                observed,
            };
            self.maybe.insert(&l.key, now);
            self.held.insert(l.key.clone(), held);
        }
    }
}

/// Bits per generation of [`MaybeHeld`] (32 KiB): with a few thousand keys held, a key
/// that is not held finds its bit set in one check in ~100.
const MAYBE_BITS: usize = 1 << 18;

/// Which keys may be in the cache: a key's bit is set when it is learnt, so a clear bit
/// means "not held" and the lookup is skipped; a set bit (the key, or another key of the
/// same bit) means "look". Bits are never cleared one by one: learning happens in
/// generations of `hold_ms` (time / hold_ms, alternating between two bit arrays), a
/// lookup reads both, and a generation's array is cleared when it is reused two
/// generations later — after every entry learnt in it has outlived its hold.
///
/// Every race here can only lose a bit (a learn whose bit a concurrent clearing wipes), and
/// a lost bit only sends that key's checks to the store, which answers them correctly: the
/// cache is never made to answer for a key it does not hold.
struct MaybeHeld {
    bits: [Box<[AtomicU64]>; 2],
    /// The generation each array was last cleared for.
    cleared: [AtomicU64; 2],
    span_ms: u64,
    hasher: foldhash::fast::RandomState,
}

impl MaybeHeld {
    fn new(hold_ms: u64) -> Self {
        let array = || (0..MAYBE_BITS / 64).map(|_| AtomicU64::new(0)).collect();
        MaybeHeld {
            bits: [array(), array()],
            cleared: [AtomicU64::new(0), AtomicU64::new(0)],
            span_ms: hold_ms.max(1),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The word and bit of `key`.
    fn slot(&self, key: &str) -> (usize, u64) {
        let h = self.hasher.hash_one(key);
        ((h >> 6) as usize % (MAYBE_BITS / 64), 1 << (h & 63))
    }

    fn may_hold(&self, key: &str) -> bool {
        let (word, bit) = self.slot(key);
        self.bits
            .iter()
            .any(|b| b[word].load(Ordering::Relaxed) & bit != 0)
    }

    /// Marks `key`, learnt at `now` (node ms).
    fn insert(&self, key: &str, now: u64) {
        let generation = now / self.span_ms;
        let g = (generation % 2) as usize;
        // The first learn of a generation clears what its array held two generations ago.
        if self.cleared[g].fetch_max(generation, Ordering::AcqRel) < generation {
            for word in self.bits[g].iter() {
                word.store(0, Ordering::Relaxed);
            }
        }
        let (word, bit) = self.slot(key);
        self.bits[g][word].fetch_or(bit, Ordering::Relaxed);
    }
}

/// Whether a signal's value stays what it was when one more attempt with the same members
/// goes unobserved: a count of distinct users, devices, IPs or networks (and the
/// all-requests set behind its `min_share`, which holds the same members) already holds
/// them; their last-seen time lags by at most the hold. A count of requests or of user
/// switches counts every attempt, so a plan with one of them always asks the store.
fn unmoved_by_repeats(s: &SignalPlan) -> bool {
    matches!(
        s.count,
        Count::Users | Count::Devices | Count::Ips | Count::Nets
    )
}

/// A fingerprint of everything a check records besides its limits: each signal's sets and
/// member, and the user's and device's sighting keys. Two checks with the same fingerprint
/// leave the same state behind, so once the store has seen one, the other may go unseen;
/// a held user trying a new device (a member its signals have not seen) asks the store.
fn observed(plan: &CheckPlan) -> u64 {
    let mut h = DefaultHasher::new();
    for s in &plan.signals {
        (&s.key, &s.all_key, &s.member).hash(&mut h);
    }
    if let Some(t) = &plan.trust {
        (&t.user_seen_key, &t.device_seen_key).hash(&mut h);
    }
    h.finish()
}

/// Whether a full `l` is full for every check naming its key: no filter (it would apply
/// to some requests only), and a trust bonus only where the key is the user's own.
fn cacheable(l: &LimitPlan) -> bool {
    l.filter.is_none() && (!l.trust_bonus || l.per_user)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Algorithm, Filter};

    fn limit(key: &str, max: u64) -> LimitPlan {
        LimitPlan {
            key: key.into(),
            algorithm: Algorithm::SlidingWindow,
            window_ms: 10_000,
            base_max: max,
            per_user: true,
            trust_bonus: false,
            retain_ms: 10_000,
            filter: None,
        }
    }

    fn plan(limits: Vec<LimitPlan>) -> CheckPlan {
        CheckPlan {
            record_key: "lt:s:req:r1".into(),
            records_key: "lt:s:rq:all".into(),
            idempotency_key: None,
            request_id: "r1".into(),
            id_given: true,
            record_ttl_ms: 10_000,
            dry_run: false,
            trust: None,
            signals: Vec::new(),
            score: None,
            limits,
        }
    }

    fn value(exceeded: bool, count: u64, retry: u64) -> LimitValue {
        LimitValue {
            applies: true,
            max: 3,
            state: LimitState {
                count,
                exceeded,
                retry_after_ms: retry,
            },
        }
    }

    /// The store's answer for a plan whose first limit is full.
    fn denied(retry: u64) -> Decided {
        Decided::Judged(Judgement {
            facts: Facts::default(),
            signals: Vec::new(),
            score: 0.0,
            outcome: Outcome::Denied {
                limits: vec![value(true, 3, retry), value(false, 1, 0)],
            },
        })
    }

    fn held_limit(d: &Decided) -> Option<(usize, LimitValue)> {
        match d {
            Decided::Judged(Judgement {
                outcome: Outcome::Denied { limits },
                ..
            }) => limits
                .iter()
                .enumerate()
                .find(|(_, v)| v.applies)
                .map(|(i, v)| (i, *v)),
            _ => None,
        }
    }

    #[test]
    fn a_full_key_is_denied_until_the_store_frees_it_without_reporting_other_limits() {
        let c = OverLimit::new(100, 60_000);
        let p = plan(vec![limit("lt:s:uid:1", 3), limit("lt:s:ip:1", 100)]);
        c.learn(&p, &denied(4_000), c.epoch(), 1_000);
        let d = c.answer(&p, false, 2_000).expect("held");
        let (i, v) = held_limit(&d).expect("a deny");
        assert_eq!(i, 0);
        assert_eq!(
            v.state.retry_after_ms, 3_000,
            "the store's retry, less the time since"
        );
        assert_eq!((v.max, v.state.count), (3, 3));
        // Another user on the same ip is not held by this user's key.
        let other = plan(vec![limit("lt:s:uid:2", 3), limit("lt:s:ip:1", 100)]);
        assert!(c.answer(&other, false, 2_000).is_none());
        // The store said it admits one more at 5_000: from then the store decides.
        assert!(c.answer(&p, false, 5_000).is_none());
    }

    #[test]
    fn a_key_learnt_at_the_end_of_a_generation_is_held_into_the_next_and_no_further() {
        // Generations of hold_ms: learnt at 1_999 (generation 1), held until 2_999 in
        // generation 2, whose first learn must not wipe it; gone in generation 3.
        let c = OverLimit::new(100, 1_000);
        let p = plan(vec![limit("lt:s:uid:1", 3), limit("lt:s:ip:1", 100)]);
        c.learn(&p, &denied(60_000), c.epoch(), 1_999);
        let other = plan(vec![limit("lt:s:uid:2", 3), limit("lt:s:ip:2", 100)]);
        c.learn(&other, &denied(60_000), c.epoch(), 2_000);
        assert!(
            c.answer(&p, false, 2_998).is_some(),
            "held into the next generation"
        );
        assert!(c.answer(&other, false, 2_998).is_some());
        // Generation 3 reuses generation 1's bits: the key learnt then is past its hold.
        let third = plan(vec![limit("lt:s:uid:3", 3), limit("lt:s:ip:3", 100)]);
        c.learn(&third, &denied(60_000), c.epoch(), 3_000);
        assert!(c.answer(&p, false, 3_000).is_none());
        assert!(
            c.answer(&other, false, 2_999).is_some(),
            "generation 2 is kept"
        );
        assert!(c.answer(&third, false, 3_500).is_some());
        // Another generation later, generation 2's array is cleared and reused in turn.
        c.learn(&p, &denied(60_000), c.epoch(), 4_000);
        assert!(c.answer(&p, false, 4_999).is_some());
        assert!(
            c.answer(&third, false, 3_999).is_some(),
            "generation 3 is kept"
        );
    }

    #[test]
    fn a_hold_never_outlasts_hold_ms_so_a_refund_elsewhere_reaches_this_node() {
        let c = OverLimit::new(100, 1_000);
        let p = plan(vec![limit("lt:s:uid:1", 3), limit("lt:s:ip:1", 100)]);
        c.learn(&p, &denied(86_000_000), c.epoch(), 0);
        assert!(c.answer(&p, false, 999).is_some());
        assert!(c.answer(&p, false, 1_000).is_none());
    }

    #[test]
    fn invalidation_forgets_every_key_and_a_deny_asked_before_it_is_not_learnt() {
        let c = OverLimit::new(100, 60_000);
        let p = plan(vec![limit("lt:s:uid:1", 3), limit("lt:s:ip:1", 100)]);
        c.learn(&p, &denied(4_000), c.epoch(), 0);
        c.invalidate();
        assert!(c.answer(&p, false, 1).is_none());
        // A check that went to the store before a refund, and answered after it.
        let before = c.epoch();
        c.invalidate();
        c.learn(&p, &denied(4_000), before, 2);
        assert!(c.answer(&p, false, 3).is_none());
    }

    #[test]
    fn repeatable_checks_dry_runs_and_filtered_limits_always_go_to_the_store() {
        let c = OverLimit::new(100, 60_000);
        let p = plan(vec![limit("lt:s:uid:1", 3), limit("lt:s:ip:1", 100)]);
        c.learn(&p, &denied(4_000), c.epoch(), 0);
        assert!(
            c.answer(&p, true, 1).is_none(),
            "may repeat an allowed request"
        );
        let mut dry = p.clone();
        dry.dry_run = true;
        assert!(c.answer(&dry, false, 1).is_none());

        let c = OverLimit::new(100, 60_000);
        let mut filtered = p.clone();
        filtered.limits[0].filter = Some(Filter::NewAccount);
        c.learn(&filtered, &denied(4_000), c.epoch(), 0);
        assert!(c.answer(&filtered, false, 1).is_none());
        assert!(c.is_empty());
    }

    #[test]
    fn a_scene_counting_every_attempt_always_asks_the_store() {
        let signal = |count: Count, all: bool| SignalPlan {
            name: "s".into(),
            key: "lt:s:sig:d1".into(),
            all_key: all.then(|| "lt:s:sig-all:d1".into()),
            last_key: None,
            count,
            member: "00000000000000aa".into(),
            filter: None,
            window_ms: 60_000,
            max: 3,
            min_share: all.then_some(0.5),
            cap: 10,
        };
        let c = OverLimit::new(100, 60_000);
        let mut p = plan(vec![limit("lt:s:uid:1", 3), limit("lt:s:ip:1", 100)]);
        p.signals = vec![signal(Count::Users, false)];
        c.learn(&p, &denied(4_000), c.epoch(), 0);
        assert!(
            c.answer(&p, false, 1).is_some(),
            "a distinct count holds the user already"
        );
        let mut other_member = p.clone();
        other_member.signals[0].member = "00000000000000bb".into();
        assert!(
            c.answer(&other_member, false, 1).is_none(),
            "a member the signal has not seen goes to the store"
        );
        p.signals = vec![signal(Count::Users, true)];
        assert!(
            c.answer(&p, false, 1).is_none(),
            "a set the deny did not observe"
        );
        for count in [Count::Requests, Count::UserSwitches] {
            let c = OverLimit::new(100, 60_000);
            p.signals = vec![signal(count, false)];
            c.learn(&p, &denied(4_000), c.epoch(), 0);
            assert!(c.answer(&p, false, 1).is_none(), "{count:?}");
            assert!(c.is_empty(), "{count:?}");
        }
    }

    #[test]
    fn a_changed_max_for_the_same_key_goes_to_the_store() {
        // A CIDR override (or new rules) gives the key another max: the old "full" does
        // not hold.
        let c = OverLimit::new(100, 60_000);
        let p = plan(vec![limit("lt:s:uid:1", 3), limit("lt:s:ip:1", 100)]);
        c.learn(&p, &denied(4_000), c.epoch(), 0);
        let raised = plan(vec![limit("lt:s:uid:1", 5), limit("lt:s:ip:1", 100)]);
        assert!(c.answer(&raised, false, 1).is_none());
    }

    #[test]
    fn allows_and_score_denies_teach_nothing() {
        let c = OverLimit::new(100, 60_000);
        let p = plan(vec![limit("lt:s:uid:1", 3)]);
        let allowed = Decided::Judged(Judgement {
            facts: Facts::default(),
            signals: Vec::new(),
            score: 0.0,
            outcome: Outcome::Allowed {
                limits: vec![value(false, 1, 0)],
            },
        });
        c.learn(&p, &allowed, c.epoch(), 0);
        let score = Decided::Judged(Judgement {
            facts: Facts::default(),
            signals: Vec::new(),
            score: 0.9,
            outcome: Outcome::ScoreDeny,
        });
        c.learn(&p, &score, c.epoch(), 0);
        assert!(c.is_empty());
    }

    #[test]
    fn memory_is_bounded_by_max_keys() {
        let c = OverLimit::new(50, 60_000);
        for u in 0..1_000 {
            let p = plan(vec![limit(&format!("lt:s:uid:{u}"), 3)]);
            let d = Decided::Judged(Judgement {
                facts: Facts::default(),
                signals: Vec::new(),
                score: 0.0,
                outcome: Outcome::Denied {
                    limits: vec![value(true, 3, 4_000)],
                },
            });
            c.learn(&p, &d, c.epoch(), 0);
        }
        assert!(c.len() <= 50, "{} keys held", c.len());
    }
}
