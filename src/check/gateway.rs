//! The resource layer: one in-process token bucket per scene (governor's GCRA), consulted
//! before anything touches the store, so a flood is turned away without costing Redis a
//! round trip. Per node: with N nodes the scene admits up to N × rate.
//!
//! The buckets live in an immutable map swapped whole when the rule set changes; a scene
//! whose gateway settings did not change keeps its bucket (a reload never refills it).
//!
//! Time is the service's one [`Clock`] (so a simulated day refills
//! them as a real one would), read by governor as a `Duration` since the epoch. A wall
//! clock stepped back only stops refilling until it catches up; the burst covers that.
//!
//! A dry run looks at the bucket without taking a token ([`Use::Look`]): it answers what
//! the real check would meet now — `gateway_rate` while the node sheds load, which also
//! keeps a flood of dry runs off the store — yet records nothing, not even a token that a
//! real check would then miss.

use std::collections::HashMap;
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::time::Duration;

use arc_swap::ArcSwap;
use governor::clock::Clock as _;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::StateStore;
use governor::{Quota, RateLimiter};

use super::decision::{ceil_secs, FriendlyDeny, RateLimitInfo, Reason};
use crate::clock::Clock;
use crate::rules::{Gateway, RuleSet, Scene};

/// The service clock as governor reads it.
#[derive(Debug, Clone)]
struct GatewayClock(Arc<dyn Clock>);

impl governor::clock::Clock for GatewayClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        Duration::from_millis(self.0.now_ms())
    }
}

/// How a check meets its scene's bucket: the "key" governor hands the state with each
/// check (one bucket per scene either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Use {
    /// A real check: takes a token.
    Spend,
    /// A dry run: learns whether a token is there, takes none.
    Look,
}

/// A bucket's GCRA state — governor's theoretical arrival time, ns after the limiter's
/// start, 0 for none yet, as its own `InMemoryState` keeps it — which a [`Use::Look`] reads
/// and never writes.
#[derive(Debug, Default)]
struct BucketState(AtomicU64);

impl StateStore for BucketState {
    type Key = Use;

    fn measure_and_replace<T, F, E>(&self, key: &Use, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let read = |tat: u64| NonZeroU64::new(tat).map(|t| Nanos::from(t.get()));
        let mut prev = self.0.load(Ordering::Acquire);
        loop {
            let (out, next) = f(read(prev))?;
            if *key == Use::Look {
                return Ok(out);
            }
            match self.0.compare_exchange_weak(
                prev,
                next.into(),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(out),
                Err(now) => prev = now,
            }
        }
    }
}

type Limiter = RateLimiter<Use, BucketState, GatewayClock, NoOpMiddleware<Duration>>;

struct Bucket {
    settings: Gateway,
    limiter: Limiter,
}

/// The gateway buckets of every scene that has one.
pub struct Gateways {
    buckets: ArcSwap<HashMap<String, Arc<Bucket>>>,
    clock: GatewayClock,
}

impl std::fmt::Debug for Gateways {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateways")
            .field("scenes", &self.buckets.load().len())
            .finish()
    }
}

fn quota(g: Gateway) -> Quota {
    // The rule compiler guarantees rate >= 1 and burst >= 1.
    let rate = NonZeroU32::new(g.rate_per_s).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(g.burst).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rate).allow_burst(burst)
}

impl Gateways {
    /// No buckets yet ([`Gateways::sync`] makes them), on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Gateways {
            buckets: ArcSwap::from_pointee(HashMap::new()),
            clock: GatewayClock(clock),
        }
    }

    /// Makes the buckets match `rules`: new scenes get a full bucket, unchanged ones keep
    /// theirs, removed ones are dropped.
    pub fn sync(&self, rules: &RuleSet) {
        let old = self.buckets.load();
        let mut next = HashMap::new();
        for (name, scene) in &rules.scenes {
            let Some(g) = scene.gateway else { continue };
            let bucket = match old.get(name) {
                Some(b) if b.settings == g => b.clone(),
                _ => Arc::new(Bucket {
                    settings: g,
                    limiter: RateLimiter::new(quota(g), BucketState::default(), self.clock.clone()),
                }),
            };
            next.insert(name.clone(), bucket);
        }
        self.buckets.store(Arc::new(next));
    }

    /// Takes one token from the scene's bucket (a dry run only looks for one); without
    /// one, the resource layer's answer: a friendly deny until a token is free, naming the
    /// bucket in the `RateLimit-*` headers.
    pub fn admit(&self, scene: &Scene, dry_run: bool) -> Result<(), FriendlyDeny> {
        let buckets = self.buckets.load();
        let Some(bucket) = buckets.get(&scene.name) else {
            return Ok(());
        };
        let usage = if dry_run { Use::Look } else { Use::Spend };
        bucket.limiter.check_key(&usage).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
            let reason = Reason::GatewayRate;
            let rate_limit = RateLimitInfo {
                name: reason.name().to_string(),
                quota: u64::from(bucket.settings.rate_per_s),
                window_s: 1,
                remaining: 0,
                reset_s: ceil_secs(wait_ms),
            };
            FriendlyDeny::new(reason, scene, wait_ms).with_rate_limit(rate_limit)
        })
    }
}
