//! The circuit breaker in front of Redis: an outage costs no request its full timeout.
//!
//! Closed, it lets every call through and counts consecutive failures (timeouts and lost
//! connections; a script error is Redis answering, not an outage). At `failures` in a row
//! it opens: calls fail at once with [`StoreError::CircuitOpen`] and each scene's
//! `on_store_error` answers without waiting. After a jittered delay (growing from
//! `open_min_ms` to `open_max_ms` while probes keep failing) it lets calls through again
//! (half-open); the first success closes it, a failure re-opens it. `open_max_ms` stays
//! well under 2 s so normal answers return within 2 s of Redis returning.
//!
//! The store and the trust ledger share one breaker: they share the Redis connection, so
//! they are down together. The state machine is `failsafe`'s; this module adds the
//! telemetry: one log line when the breaker opens and one when it closes — not one per
//! request and not one per failed probe — and a gauge of its state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::hash::{BuildHasher, RandomState};

use failsafe::failure_policy::{self, ConsecutiveFailures};
use failsafe::{Config, Instrument, StateMachine};

use super::StoreError;
use crate::metrics::Metrics;

/// When the breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Consecutive failed calls that open the breaker.
    pub failures: u32,
    /// First open interval, ms.
    pub open_min_ms: u64,
    /// Longest open interval, ms (reached while probes keep failing).
    pub open_max_ms: u64,
}

impl Default for BreakerSettings {
    /// Three failures in a row: one lost packet or a slow script does not open it, a dead
    /// Redis opens it within three requests. Open 100 ms at first, at most 1 s: a probe
    /// per node per second costs Redis nothing, and recovery stays well inside 2 s.
    fn default() -> Self {
        BreakerSettings {
            failures: 3,
            open_min_ms: 100,
            open_max_ms: 1_000,
        }
    }
}

/// Logs and counts transitions; remembers whether the breaker is open.
#[derive(Debug)]
struct Telemetry {
    store: &'static str,
    open: AtomicBool,
    /// Set when the breaker lets a probe through; taken by the caller that makes it.
    probe: AtomicBool,
    metrics: Option<Metrics>,
}

/// `failsafe` owns its instrument; the breaker keeps a second handle to read the state.
#[derive(Debug, Clone)]
struct Shared(Arc<Telemetry>);

impl std::ops::Deref for Shared {
    type Target = Telemetry;
    fn deref(&self) -> &Telemetry {
        &self.0
    }
}

impl Instrument for Shared {
    fn on_call_rejected(&self) {}

    fn on_open(&self) {
        // A failed half-open probe re-opens an open breaker: not news.
        if !self.open.swap(true, Ordering::AcqRel) {
            tracing::warn!(store = self.store, "store circuit breaker opened: answering by each scene's on_store_error until the store answers again");
            if let Some(m) = &self.metrics {
                m.breaker(self.store, true);
            }
        }
    }

    fn on_half_open(&self) {
        self.probe.store(true, Ordering::Release);
    }

    fn on_closed(&self) {
        // `failsafe` reports the initial closed state too; only a close after an open is news.
        if self.open.swap(false, Ordering::AcqRel) {
            tracing::info!(
                store = self.store,
                "store circuit breaker closed: the store answers again"
            );
            if let Some(m) = &self.metrics {
                m.breaker(self.store, false);
            }
        }
    }
}

/// Open intervals: doubling from `open_min_ms` to `open_max_ms`, each with "equal
/// jitter" (half fixed, half random) so the nodes of a fleet do not probe in step.
/// `failsafe`'s own jittered backoffs refuse intervals under a second, and recovery must
/// take well under two.
#[derive(Debug, Clone)]
struct Backoff {
    next_ms: u64,
    max_ms: u64,
    random: RandomState,
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = self.next_ms;
        self.next_ms = (self.next_ms.saturating_mul(2)).min(self.max_ms);
        let half = base / 2;
        let jitter = self.random.hash_one(std::time::Instant::now()) % (half + 1);
        Some(Duration::from_millis(base - half + jitter))
    }
}

type Machine = StateMachine<ConsecutiveFailures<Backoff>, Shared>;

/// A circuit breaker for one store.
pub struct Breaker {
    machine: Machine,
    telemetry: Arc<Telemetry>,
    settings: BreakerSettings,
    /// Closed with no failure since the last success: the state nearly every call finds.
    /// Then a call is permitted and a success recorded without the state machine's locks
    /// (a success there would change nothing). Cleared before a failure reaches the
    /// machine; set again once a success leaves it closed.
    healthy: AtomicBool,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("store", &self.telemetry.store)
            .field("open", &self.is_open())
            .field("settings", &self.settings)
            .finish()
    }
}

impl Breaker {
    /// A closed breaker for `store` (a metrics label: `redis`).
    pub fn new(store: &'static str, settings: BreakerSettings, metrics: Option<Metrics>) -> Self {
        let telemetry = Arc::new(Telemetry {
            store,
            open: AtomicBool::new(false),
            probe: AtomicBool::new(false),
            metrics,
        });
        if let Some(m) = &telemetry.metrics {
            m.breaker(store, false);
        }
        let backoff = Backoff {
            next_ms: settings.open_min_ms.max(1),
            max_ms: settings.open_max_ms.max(settings.open_min_ms).max(1),
            random: RandomState::new(),
        };
        let machine = Config::new()
            .failure_policy(failure_policy::consecutive_failures(
                settings.failures.max(1),
                backoff,
            ))
            .instrument(Shared(telemetry.clone()))
            .build();
        Breaker {
            machine,
            telemetry,
            settings,
            healthy: AtomicBool::new(true),
        }
    }

    /// `Ok` when a call may go to the store now (closed, or half-open and probing).
    pub fn permit(&self) -> Result<(), StoreError> {
        if self.healthy.load(Ordering::Acquire) || self.machine.is_call_permitted() {
            Ok(())
        } else {
            Err(StoreError::CircuitOpen)
        }
    }

    /// Feeds a call's result back. Only outages count: a timeout or a lost connection.
    pub fn record<T>(&self, result: &Result<T, StoreError>) {
        match result {
            Err(StoreError::Timeout(_)) | Err(StoreError::Unavailable(_)) => {
                self.healthy.store(false, Ordering::Release);
                self.machine.on_error()
            }
            // The breaker itself refused: nothing was asked.
            Err(StoreError::CircuitOpen) => {}
            Ok(_) | Err(StoreError::Protocol(_)) => {
                if !self.healthy.load(Ordering::Acquire) {
                    self.machine.on_success();
                    // Half-open closes on this success; open stays open (a late answer
                    // to a call made before it opened).
                    self.healthy.store(!self.is_open(), Ordering::Release);
                }
            }
        }
    }

    /// `true` once per half-open transition: the caller is the probe (and may want to
    /// rebuild its connection before asking).
    pub fn take_probe(&self) -> bool {
        self.telemetry.probe.swap(false, Ordering::AcqRel)
    }

    /// Whether the breaker is open (half-open counts as open until a probe succeeds).
    pub fn is_open(&self) -> bool {
        self.telemetry.open.load(Ordering::Acquire)
    }

    pub fn settings(&self) -> BreakerSettings {
        self.settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fast() -> BreakerSettings {
        BreakerSettings {
            failures: 3,
            open_min_ms: 30,
            open_max_ms: 30,
        }
    }

    #[test]
    fn open_intervals_double_up_to_the_max_with_equal_jitter() {
        let b = Backoff {
            next_ms: 100,
            max_ms: 1_000,
            random: RandomState::new(),
        };
        let got: Vec<u64> = b.take(6).map(|d| d.as_millis() as u64).collect();
        for (ms, base) in got.iter().zip([100, 200, 400, 800, 1_000, 1_000]) {
            assert!(
                (base / 2..=base).contains(ms),
                "{ms} outside [{}, {base}]",
                base / 2
            );
        }
    }

    fn fail(b: &Breaker) {
        b.permit().expect("permitted");
        b.record::<()>(&Err(StoreError::Timeout(50)));
    }

    /// Two failures, a success, two failures: still closed.
    fn a_success_in_between_resets_the_count(b: &Breaker) {
        fail(b);
        fail(b);
        b.record::<()>(&Ok(()));
        fail(b);
        fail(b);
        assert!(b.permit().is_ok(), "a success in between resets the count");
    }

    #[test]
    fn opens_after_consecutive_outage_failures_only() {
        let b = Breaker::new("redis", fast(), None);
        a_success_in_between_resets_the_count(&b);
        b.record::<()>(&Err(StoreError::Protocol("bad reply".into())));
        assert!(
            b.permit().is_ok(),
            "Redis answering with an error is not an outage"
        );
        fail(&b);
        fail(&b);
        fail(&b);
        assert!(b.is_open());
        assert!(matches!(b.permit(), Err(StoreError::CircuitOpen)));
    }

    #[test]
    fn half_open_probe_closes_on_success_and_reopens_on_failure() {
        let metrics = Metrics::new();
        let b = Breaker::new("redis", fast(), Some(metrics.clone()));
        for _ in 0..3 {
            fail(&b);
        }
        assert!(b.permit().is_err());
        assert!(metrics
            .render()
            .contains("vigia_store_breaker_open{store=\"redis\"} 1"));
        // Past the open interval one probe goes through; its failure re-opens at once.
        std::thread::sleep(Duration::from_millis(60));
        fail(&b);
        assert!(b.permit().is_err(), "a failed probe re-opens");
        std::thread::sleep(Duration::from_millis(60));
        b.permit().expect("probe permitted");
        b.record::<()>(&Ok(()));
        assert!(!b.is_open());
        assert!(b.permit().is_ok());
        // Closed again, successes take the fast path, and failures still count from zero.
        b.record::<()>(&Ok(()));
        a_success_in_between_resets_the_count(&b);
        fail(&b);
        assert!(b.is_open(), "three in a row open it again");
        assert!(matches!(b.permit(), Err(StoreError::CircuitOpen)));
        let text = metrics.render();
        assert!(
            text.contains("vigia_store_breaker_open{store=\"redis\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("vigia_store_breaker_transitions_total{store=\"redis\",to=\"open\"} 2"),
            "re-opening after a failed probe is not a new outage (the second is): {text}"
        );
        assert!(
            text.contains("vigia_store_breaker_transitions_total{store=\"redis\",to=\"closed\"} 1"),
            "{text}"
        );
    }
}
