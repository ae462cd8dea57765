//! Who is asking: the behaviour actors' signals and the user's trust, gathered
//! concurrently for one check. Neither may stall a check: the actors answer within their
//! deadline or give no signal; the ledger is bounded by the store timeout (and breaker).
//! A ledger that cannot answer means no trust (points 0, age unknown), and because the
//! ledger lives in the store (Redis, or sled beside the embedded store) its failure is
//! reported as a store failure: the scene's `on_store_error` decides at once, instead of
//! the check waiting a second timeout on the window store.

use std::sync::Arc;

use futures::future::OptionFuture;

use super::quota::MaxAdjust;
use super::request::CheckRequest;
use crate::behaviour::state::{Signals, StateBounds};
use crate::behaviour::{Behaviours, Observation};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::rules::{Dimension, RuleSet};
use crate::store::StoreError;
use crate::trust::{TrustLedger, TrustRead};

/// What the scorer and the quota need to know about the request's user, device and IP.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    pub signals: Signals,
    /// Trust points, capped by `[trust].max_points`.
    pub points: u32,
    /// `None` when the rule set has no `[trust].new_account` or the age is unknown.
    pub new_account: Option<bool>,
    pub adjust: MaxAdjust,
    /// The ledger could not answer because the store is down.
    pub store_error: Option<StoreError>,
}

/// Gathers [`Profile`]s.
#[derive(Clone)]
pub struct Profiler {
    behaviours: Option<Behaviours>,
    ledger: Option<Arc<dyn TrustLedger>>,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
}

impl Profiler {
    pub fn new(
        behaviours: Option<Behaviours>,
        ledger: Option<Arc<dyn TrustLedger>>,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
    ) -> Self {
        Profiler {
            behaviours,
            ledger,
            clock,
            metrics,
        }
    }

    /// Asks the actors and the ledger at once; only what the scene and rule set use.
    pub async fn profile(&self, rules: &RuleSet, req: &CheckRequest) -> Profile {
        let scene = &req.scene;
        let user = req.values.get(&Dimension::User);
        let behaviour = &scene.behaviour;
        let wants_signals = behaviour.accounts_per_device.is_some()
            || behaviour.account_switches.is_some()
            || behaviour.devices_per_user.is_some()
            || behaviour.accounts_per_ip.is_some();
        let observe: OptionFuture<_> = self
            .behaviours
            .as_ref()
            .filter(|_| wants_signals)
            .map(|b| {
                // State is shared by every scene, so its caps and retention come from all
                // of them; a handful of scenes makes this cheap next to the round trip.
                let bounds =
                    StateBounds::from_behaviours(rules.scenes.values().map(|s| &s.behaviour));
                b.observe(Observation {
                    user,
                    device: req.values.get(&Dimension::Device),
                    ip: req.values.get(&Dimension::Ip),
                    behaviour,
                    bounds,
                    dry_run: req.dry_run,
                })
            })
            .into();
        let trust = rules.trust.as_ref();
        let mark_seen = !req.dry_run
            && req.user_created_at.is_none()
            && trust.is_some_and(|t| t.new_account.is_some());
        let read: OptionFuture<_> = match (&self.ledger, trust, user) {
            (Some(ledger), Some(_), Some(user)) => Some(ledger.read(user, mark_seen)),
            _ => None,
        }
        .into();
        let (observed, read) = futures::join!(observe, read);

        let mut profile = Profile::default();
        // Unanswered shards are counted by the behaviour pool itself; here they simply
        // give no signal.
        if let Some(observed) = observed {
            profile.signals = observed.signals;
        }
        let Some(trust) = trust else {
            return profile;
        };
        let read: Option<TrustRead> = match read {
            Some(Ok(read)) => Some(read),
            Some(Err(e)) => {
                self.metrics.trust_error("read");
                tracing::debug!(error = %e, "trust ledger read failed; checking without trust");
                if matches!(
                    e,
                    StoreError::Timeout(_) | StoreError::Unavailable(_) | StoreError::CircuitOpen
                ) {
                    profile.store_error = Some(e);
                }
                None
            }
            None => None,
        };
        profile.points = read.map_or(0, |r| r.points.min(trust.max_points));
        profile.adjust.trust_bonus = u64::from(profile.points) * u64::from(trust.bonus_per_point);
        if let (Some(na), Some(_)) = (trust.new_account, user) {
            let now = self.clock.now_ms();
            let born_ms = match (req.user_created_at, read) {
                (Some(created), _) => Some(u64::try_from(created.timestamp_millis()).unwrap_or(0)),
                (None, Some(r)) => Some(r.first_seen_ms.unwrap_or(now)),
                // The ledger did not answer: the age is unknown; an honest user is not
                // made stricter for our outage.
                (None, None) => None,
            };
            profile.new_account = born_ms.map(|born| now.saturating_sub(born) < na.younger_than_ms);
            if profile.new_account == Some(true) {
                profile.adjust.new_account_factor = Some(na.max_factor);
            }
        }
        profile
    }
}
