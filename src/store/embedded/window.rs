//! The per-key state of the embedded store and the three algorithms, as plain data and
//! functions — the same arithmetic as `lua/limits.lua` (which `lua/check.lua` and
//! `lua/decide.lua` run), limit for limit, so both stores answer alike (one behaviour
//! suite runs against both).

use std::collections::BTreeSet;

use crate::store::{LimitState, EXPIRY_MARGIN_MS};

/// Float tolerance for token arithmetic (as in limits.lua).
const EPS: f64 = 1e-9;

/// A sliding window: members (request ids) ordered by score (ms).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sliding {
    pub members: BTreeSet<(u64, Box<str>)>,
}

impl Sliding {
    /// Removes every member at or before `cutoff`; returns how many left.
    pub fn trim(&mut self, cutoff: u64) -> usize {
        // A check trims what expired since the last one: a few members from the front,
        // usually none. Popping them costs that few; `split_off` rebuilt the tree.
        let mut removed = 0;
        while self.members.first().is_some_and(|(t, _)| *t <= cutoff) {
            self.members.pop_first();
            removed += 1;
        }
        removed
    }

    fn in_window(&self, now: u64, window: u64) -> impl Iterator<Item = &(u64, Box<str>)> {
        // A member at t counts while t > now - window.
        let lower = now.saturating_sub(window).saturating_add(1);
        self.members.range((lower, Box::from(""))..)
    }

    /// Evaluates one sliding limit.
    pub fn evaluate(&self, now: u64, window: u64, max: u64) -> LimitEval {
        let count = self.in_window(now, window).count() as u64;
        let mut eval = LimitEval::new(count);
        if count + 1 > max {
            eval.state.exceeded = true;
            // One more fits once count - max + 1 members have left.
            let offset = count.saturating_sub(max) as usize;
            eval.state.retry_after_ms = match self.in_window(now, window).nth(offset) {
                Some((t, _)) => (t + window).saturating_sub(now).max(1),
                None => window,
            };
        }
        eval
    }

    /// Removes one member wherever it sits; true when it was there.
    pub fn remove(&mut self, member: &str) -> bool {
        let found = self.members.iter().find(|(_, m)| &**m == member).cloned();
        found.is_some_and(|m| self.members.remove(&m))
    }
}

/// A fixed window aligned to multiples of its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    pub start: u64,
    pub count: u64,
}

impl Fixed {
    pub fn window_start(now: u64, window: u64) -> u64 {
        now - now % window.max(1)
    }

    /// Evaluates a fixed limit over the stored state (absent = empty).
    pub fn evaluate(stored: Option<&Fixed>, now: u64, window: u64, max: u64) -> LimitEval {
        let start = Fixed::window_start(now, window);
        let count = stored.filter(|f| f.start == start).map_or(0, |f| f.count);
        let mut eval = LimitEval::new(count);
        if count + 1 > max {
            eval.state.exceeded = true;
            eval.state.retry_after_ms = (start + window - now).max(1);
        }
        eval
    }

    /// Expiry of the key after an add at `now`.
    pub fn expires_at(&self, window: u64) -> u64 {
        self.start + window + EXPIRY_MARGIN_MS
    }
}

/// A token bucket: `tokens` left at `ts`, capacity `cap`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub tokens: f64,
    pub ts: u64,
    pub cap: u64,
}

impl Bucket {
    /// Tokens available at `now` (absent = full).
    pub fn level(stored: Option<&Bucket>, now: u64, window: u64, max: u64) -> f64 {
        match stored {
            None => max as f64,
            Some(b) => {
                let elapsed = now.saturating_sub(b.ts) as f64;
                // Multiply before dividing: exact whenever the refill is whole tokens.
                (b.tokens + elapsed * max as f64 / window as f64).min(max as f64)
            }
        }
    }

    pub fn evaluate(tokens: f64, window: u64, max: u64) -> LimitEval {
        let count = (max as f64 - tokens - EPS).ceil().max(0.0) as u64;
        let mut eval = LimitEval::new(count);
        eval.after = (max as f64 - (tokens - 1.0) - EPS).ceil().max(0.0) as u64;
        if max == 0 {
            eval.state.exceeded = true;
            eval.state.retry_after_ms = window;
        } else if tokens < 1.0 - EPS {
            eval.state.exceeded = true;
            let wait = ((1.0 - tokens) * window as f64 / max as f64 - EPS).ceil();
            eval.state.retry_after_ms = (wait as u64).max(1);
        }
        eval
    }

    /// The bucket after spending one token at `now`, and when it is full again (+ margin).
    pub fn spend(tokens: f64, now: u64, window: u64, max: u64) -> (Bucket, u64) {
        let tk = tokens - 1.0;
        let refill = ((max as f64 - tk) * window as f64 / max as f64 - EPS).ceil() as u64;
        (
            Bucket {
                tokens: tk,
                ts: now,
                cap: max,
            },
            now + refill.max(1) + EXPIRY_MARGIN_MS,
        )
    }
}

/// One limit's verdict before anything is written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitEval {
    /// count: before this request; exceeded; retry.
    pub state: LimitState,
    /// The count to report when the request is allowed.
    pub after: u64,
}

impl LimitEval {
    fn new(count: u64) -> Self {
        LimitEval {
            state: LimitState {
                count,
                exceeded: false,
                retry_after_ms: 0,
            },
            after: count + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sliding(scores: &[u64]) -> Sliding {
        Sliding {
            members: scores
                .iter()
                .enumerate()
                .map(|(i, &t)| (t, format!("r{i}").into_boxed_str()))
                .collect(),
        }
    }

    #[test]
    fn sliding_counts_strictly_inside_the_window() {
        let s = sliding(&[1000, 2000, 3000]);
        // At 11000 with a 10 s window the member at 1000 has just left.
        assert_eq!(s.evaluate(11_000, 10_000, 5).state.count, 2);
        assert_eq!(s.evaluate(10_999, 10_000, 5).state.count, 3);
    }

    #[test]
    fn sliding_retry_is_when_enough_members_leave() {
        let s = sliding(&[1000, 2000, 3000]);
        let e = s.evaluate(5000, 10_000, 2);
        assert!(e.state.exceeded);
        // Two must leave for one more to fit under max 2: the one at 2000, at 12000.
        assert_eq!(e.state.retry_after_ms, 7000);
    }

    #[test]
    fn trim_is_inclusive_and_returns_the_removed() {
        let mut s = sliding(&[1000, 2000, 3000]);
        assert_eq!(s.trim(2000), 2);
        assert_eq!(s.members.len(), 1);
        assert!(s.remove("r2"));
        assert!(!s.remove("r2"));
    }

    #[test]
    fn fixed_windows_align_and_reset() {
        let f = Fixed {
            start: 60_000,
            count: 3,
        };
        let e = Fixed::evaluate(Some(&f), 61_000, 60_000, 3);
        assert!(e.state.exceeded);
        assert_eq!(e.state.retry_after_ms, 59_000);
        let e = Fixed::evaluate(Some(&f), 120_000, 60_000, 3);
        assert_eq!(e.state.count, 0);
        assert!(!e.state.exceeded);
    }

    #[test]
    fn buckets_refill_linearly() {
        let (b, _) = Bucket::spend(1.0, 0, 10_000, 10);
        assert_eq!(Bucket::level(Some(&b), 0, 10_000, 10), 0.0);
        let e = Bucket::evaluate(0.0, 10_000, 10);
        assert!(e.state.exceeded);
        assert_eq!(e.state.retry_after_ms, 1000);
        assert!((Bucket::level(Some(&b), 1000, 10_000, 10) - 1.0).abs() < 1e-12);
        assert_eq!(Bucket::level(Some(&b), 1_000_000, 10_000, 10), 10.0);
    }
}
