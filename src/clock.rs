//! The one source of "now". `app::build` takes one [`Clock`] and hands it to every part
//! that reads time: the windows of the embedded store, the behaviour actors, the trust
//! ledger and events journal, the gateway buckets, the rules' load and error times, and
//! the traffic recorder. Production passes [`SystemClock`]; tests pass a [`ManualClock`]
//! to cross window edges without sleeping, and `vigia simulate` one it sets to each
//! traffic line's time, so a day replays in seconds.
//!
//! With the wall clock the Redis store and ledger read Redis `TIME` instead, so nodes with
//! skewed clocks agree; with any other clock the scripts take "now" from it too.
//!
//! Not time in this sense: the circuit breaker's open intervals and latency measurements
//! (they measure real elapsed time on the monotonic clock, whatever the simulated hour).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now_ms(&self) -> u64;

    /// Whether this is the process's wall clock: then Redis scripts read Redis `TIME`
    /// rather than this node's clock.
    fn is_wall(&self) -> bool {
        false
    }
}

/// `ms` since the Unix epoch as RFC 3339 UTC with milliseconds (`2026-12-24T10:00:00.120Z`).
pub fn rfc3339(ms: u64) -> String {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The process's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn is_wall(&self) -> bool {
        true
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start_ms)))
    }

    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
