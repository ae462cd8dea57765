//! The last minutes of counts, for the ops page's charts: a background task samples the
//! registry every `every_ms` and keeps each interval's deltas in a fixed-size ring, so
//! memory is bounded (samples × the rule set's scenes, limits and signals) and the check
//! path does no extra counting.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::Serialize;
use utoipa::ToSchema;

use super::totals::Totals;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::rules::RulesHandle;

/// How far back the charts reach: 15 minutes.
pub const SPAN_MS: u64 = 15 * 60 * 1000;
/// The most samples kept, whatever the interval.
const MAX_SAMPLES: usize = 900;

/// What counted in one interval.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Sample {
    /// The interval's end, ms since the epoch.
    pub at_ms: u64,
    /// Its length, ms (about `every_ms`; the first may be shorter).
    pub ms: u64,
    pub counts: Totals,
}

/// The sampled history (oldest first).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HistoryView {
    /// The sampling interval, ms.
    pub every_ms: u64,
    /// The most samples kept (`capacity × every_ms` ≈ 15 minutes).
    pub capacity: usize,
    pub samples: Vec<Sample>,
}

struct Ring {
    /// The counters at the last sample, and when.
    last: Totals,
    last_ms: u64,
    samples: VecDeque<Sample>,
}

/// The ring and what it samples from.
pub struct History {
    metrics: Metrics,
    rules: Arc<RulesHandle>,
    clock: Arc<dyn Clock>,
    every_ms: u64,
    capacity: usize,
    ring: Mutex<Ring>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("every_ms", &self.every_ms)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl History {
    /// An empty history sampling every `every_ms`, its baseline the counters now.
    pub fn new(metrics: Metrics, rules: Arc<RulesHandle>, every_ms: u64) -> Self {
        let every_ms = every_ms.max(1);
        let clock = rules.clock().clone();
        let capacity = usize::try_from(SPAN_MS / every_ms)
            .unwrap_or(MAX_SAMPLES)
            .clamp(1, MAX_SAMPLES);
        let last = Totals::read(&metrics.gather(), &rules.current());
        let ring = Ring {
            last,
            last_ms: clock.now_ms(),
            samples: VecDeque::with_capacity(capacity),
        };
        History {
            metrics,
            rules,
            clock,
            every_ms,
            capacity,
            ring: Mutex::new(ring),
        }
    }

    /// The counters now (what the page computes live rates from).
    pub fn totals(&self) -> Totals {
        Totals::read(&self.metrics.gather(), &self.rules.current())
    }

    /// Takes one sample now: the deltas since the previous one join the ring (the
    /// oldest leaves it when full). The background task calls this every `every_ms`.
    pub fn sample(&self) {
        let now = self.totals();
        let at_ms = self.clock.now_ms();
        // A panic elsewhere while holding the lock leaves a consistent ring: take it.
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let counts = now.since(&ring.last);
        let ms = at_ms.saturating_sub(ring.last_ms);
        if ring.samples.len() == self.capacity {
            ring.samples.pop_front();
        }
        ring.samples.push_back(Sample { at_ms, ms, counts });
        ring.last = now;
        ring.last_ms = at_ms;
    }

    /// The samples, oldest first.
    pub fn view(&self) -> HistoryView {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        HistoryView {
            every_ms: self.every_ms,
            capacity: self.capacity,
            samples: ring.samples.iter().cloned().collect(),
        }
    }

    /// Samples every `every_ms` on the current tokio runtime until the history is
    /// dropped (the task holds only a weak reference, so it ends with the service).
    pub fn spawn_sampler(self: &Arc<Self>) {
        let weak: Weak<History> = Arc::downgrade(self);
        let period = Duration::from_millis(self.every_ms);
        tokio::spawn(async move {
            // The first tick of `interval` is immediate; the baseline was taken at `new`.
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match weak.upgrade() {
                    Some(history) => history.sample(),
                    None => return,
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn history(every_ms: u64) -> (Metrics, Arc<ManualClock>, History) {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let rules = crate::rules::compile_files(&[(
            "s.toml".into(),
            "[scene.s]\non_store_error = \"fail_open\"\n".into(),
        )])
        .expect("valid rules");
        let handle = Arc::new(RulesHandle::new(rules, clock.clone()));
        let metrics = Metrics::new();
        let h = History::new(metrics.clone(), handle, every_ms);
        (metrics, clock, h)
    }

    #[test]
    fn each_sample_holds_its_interval_and_the_ring_keeps_fifteen_minutes() {
        let (metrics, clock, h) = history(10_000);
        assert_eq!(h.view().capacity, 90);
        metrics.decision("s", "allow", "none", "none");
        clock.advance(10_000);
        h.sample();
        metrics.decision("s", "allow", "none", "none");
        metrics.decision("s", "allow", "none", "none");
        clock.advance(10_000);
        h.sample();
        let v = h.view();
        let allowed: Vec<u64> = v
            .samples
            .iter()
            .map(|s| s.counts.scenes["s"].decisions.allow)
            .collect();
        assert_eq!(allowed, [1, 2]);
        assert_eq!(v.samples[1].ms, 10_000);
        assert_eq!(h.totals().scenes["s"].decisions.allow, 3);

        for _ in 0..200 {
            h.sample();
        }
        assert_eq!(h.view().samples.len(), 90);
    }
}
