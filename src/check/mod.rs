//! The check path as one readable async fn: validate -> gateway -> plan (keys, overrides,
//! caps, weights) -> decide (trust, signals, score, limits: one step on the store) ->
//! decision. Each stage is its own module and answers with a value — a typed request or a
//! 400, a [`Decision`] or the go-ahead — and this one only sequences them and records
//! telemetry; the HTTP layer makes the response from the decision. The rule set is one
//! snapshot passed in by the caller and used throughout.
//!
//! It builds on [`crate::keys`], [`crate::input`] and the deciders ([`crate::decide`]);
//! trust is the deciders' to read, and refunds are [`crate::refund`]'s: nothing here
//! imports `trust` or `refund`.

pub mod body;
pub mod decision;
pub mod gateway;
pub mod over_limit;
pub mod plan;
pub mod quota;
pub mod request;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use crate::clock::Clock;
use crate::decide::{Decided, Decider};
use crate::input::RequestError;
use crate::keys::KeyPrefix;
use crate::metrics::Metrics;
use crate::rules::{Layer, Limit, RuleSet, Scene, StoreErrorPolicy};
use crate::store::{StoreError, WindowStore};
use decision::{CheckResponse, Decision, FriendlyDeny, Reason};
use gateway::Gateways;
use over_limit::OverLimit;
pub use request::CheckRequest;

/// How long a store-unavailable deny tells the client to wait.
const STORE_UNAVAILABLE_RETRY_MS: u64 = 1000;

/// Runs checks, through a decider. Refunds are not its business: [`crate::refund`].
pub struct Checker {
    /// Where a decision is made: one script on Redis, the node's state when embedded.
    decider: Arc<dyn Decider>,
    /// The same store's windows: its name for the metrics, and readiness (`/readyz`).
    store: Arc<dyn WindowStore>,
    /// The node's own decider, for scenes whose policy is `local` (none: `local` answers
    /// like `fail_close`).
    local: Option<Arc<dyn Decider>>,
    gateways: Gateways,
    metrics: Metrics,
    key_prefix: KeyPrefix,
    clock: Arc<dyn Clock>,
    /// Keys the store just found full, answered without it (`None`: off).
    over_limit: Option<Arc<OverLimit>>,
    /// The longest a check's records live (`[store] record_horizon_ms`).
    record_horizon_ms: u64,
}

impl Checker {
    /// A checker deciding on `decider` (over `store`'s windows), with `local` for scenes
    /// whose policy is `local`; `clock` is the service's one clock (gateway buckets,
    /// request ids).
    pub fn new(
        decider: Arc<dyn Decider>,
        store: Arc<dyn WindowStore>,
        local: Option<Arc<dyn Decider>>,
        metrics: Metrics,
        key_prefix: &KeyPrefix,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Checker {
            decider,
            store,
            local,
            gateways: Gateways::new(clock.clone()),
            metrics,
            key_prefix: key_prefix.clone(),
            clock,
            over_limit: None,
            record_horizon_ms: crate::config::DEFAULT_RECORD_HORIZON_MS,
        }
    }

    /// The record horizon `ms` (see [`crate::rules::Scene::record_ttl_ms`]).
    pub fn with_record_horizon(mut self, ms: u64) -> Self {
        self.record_horizon_ms = ms;
        self
    }

    /// Denies checks on keys the store just found full without asking it again (see
    /// [`over_limit`]); whoever gives quota back must invalidate `cache`.
    pub fn with_over_limit(mut self, cache: Arc<OverLimit>) -> Self {
        self.over_limit = Some(cache);
        self
    }

    /// Brings per-scene in-process state (gateway buckets, the over-limit cache) in line
    /// with a new rule set.
    pub fn sync_rules(&self, rules: &RuleSet) {
        self.gateways.sync(rules);
        // New rules may raise a max or drop a limit: what was full may not be.
        if let Some(cache) = &self.over_limit {
            cache.invalidate();
        }
    }

    /// The store the checker counts in.
    pub fn store(&self) -> &Arc<dyn WindowStore> {
        &self.store
    }

    /// Validates and decides one `/v1/check` body.
    pub async fn check(
        &self,
        rules: &RuleSet,
        body: &(impl request::Body + ?Sized),
    ) -> Result<CheckResponse, RequestError> {
        let started = Instant::now();
        let req = request::parse_check(rules, body, self.clock.now_ms())?;
        let resp = self.decide(rules, &req).await;
        self.record(&req.scene, &resp, started);
        Ok(resp)
    }

    /// Runs the stages in order; the first that denies decides, and each stage's answer
    /// is a [`Decision`] value the response carries to the HTTP layer.
    async fn decide(&self, rules: &RuleSet, req: &CheckRequest) -> CheckResponse {
        let scene = &req.scene;
        let mut resp = CheckResponse::allow(&scene.name, &req.request_id, &rules.version);
        resp.dry_run = req.dry_run;
        if req.device_invalid {
            resp.decision = Decision::silent(Reason::InvalidDeviceId);
            return resp;
        }
        // Resource layer first: a deny here costs the store nothing. A dry run records
        // nothing, so it only looks for a token: it meets the gateway a real check would.
        if let Err(deny) = self.gateways.admit(scene, req.dry_run) {
            resp.decision = Decision::FriendlyDeny(deny);
            return resp;
        }
        let (plan, index) = plan::plan(&self.key_prefix, rules, req, self.record_horizon_ms);
        let cache = self.over_limit.as_deref();
        let now = self.clock.now_ms();
        let repeatable = req.id_given || req.idempotency_key.is_some();
        if let Some(held) = cache.and_then(|c| c.answer(&plan, repeatable, now)) {
            self.metrics.over_limit_answer(&scene.name);
            resp.decision = decision::fill(&mut resp, scene, &plan, &index, held);
            return resp;
        }
        let epoch = cache.map(OverLimit::epoch);
        let decided = match self.decider.decide(&plan).await {
            Ok(decided) => {
                if let (Some(c), Some(epoch)) = (cache, epoch) {
                    c.learn(&plan, &decided, epoch, now);
                }
                decided
            }
            Err(e) => {
                resp.degraded = true;
                match self.on_store_error(scene, &plan, &e).await {
                    Some(decided) => decided,
                    None => {
                        resp.decision = without_store(scene);
                        return resp;
                    }
                }
            }
        };
        resp.decision = decision::fill(&mut resp, scene, &plan, &index, decided);
        resp
    }

    /// The store failed: log and count it, then let the scene's policy decide. `Some` is
    /// an outcome from the node's local store; `None` means answer without one.
    async fn on_store_error(
        &self,
        scene: &Scene,
        plan: &crate::decide::CheckPlan,
        e: &StoreError,
    ) -> Option<Decided> {
        self.metrics.store_error(self.store.kind(), e.kind());
        self.metrics
            .degraded(&scene.name, scene.on_store_error.name());
        // Per request at debug only: an outage is logged once, when the breaker opens.
        tracing::debug!(scene = %scene.name, error = %e, policy = scene.on_store_error.name(), "store failed; scene policy decides");
        if scene.on_store_error != StoreErrorPolicy::Local {
            return None;
        }
        let local = self.local.as_ref()?;
        local.decide(plan).await.ok()
    }

    fn record(&self, scene: &Scene, resp: &CheckResponse, started: Instant) {
        let m = &self.metrics;
        let d = &resp.decision;
        m.decision(
            &scene.name,
            d.verdict().name(),
            d.layer().map_or("none", Layer::name),
            d.reason().map_or("none", Reason::name),
        );
        for l in resp.limits.iter().filter(|l| l.exceeded) {
            if let Some(limit) = scene.limits.iter().find(|s| s.name == l.name) {
                m.block(&scene.name, &limit.name, &dimension_label(limit));
            }
        }
        for s in resp.signals.iter().filter(|s| s.fired) {
            m.signal_fired(&scene.name, &s.name);
        }
        m.check_latency(&scene.name, started.elapsed().as_secs_f64());
    }
}

/// The answer when neither the store nor the node could decide: `fail_open` allows;
/// `fail_close`, and `local` without a local answer, deny until the store is back.
fn without_store(scene: &Scene) -> Decision {
    match scene.on_store_error {
        StoreErrorPolicy::FailOpen => Decision::Allow,
        StoreErrorPolicy::FailClose | StoreErrorPolicy::Local => Decision::FriendlyDeny(
            FriendlyDeny::new(Reason::StoreUnavailable, scene, STORE_UNAVAILABLE_RETRY_MS),
        ),
    }
}

fn dimension_label(limit: &Limit) -> Cow<'static, str> {
    match limit.dimensions.as_slice() {
        // The common case, under attack on every deny: no allocation.
        [one] => one.name(),
        many => many
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join("+")
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Algorithm, Dimension, Layer};

    /// The `dimension` label of `vigia_blocks_total`: the limit's dimensions joined by `+`.
    #[test]
    fn a_block_is_labelled_with_the_limits_dimensions() {
        let limit = |dimensions: Vec<Dimension>| Limit {
            name: "l".into(),
            dimensions,
            algorithm: Algorithm::SlidingWindow,
            window_ms: 1000,
            max: 1,
            layer: Layer::Business,
            trust_bonus: false,
            filter: None,
        };
        assert_eq!(dimension_label(&limit(vec![Dimension::User])), "user");
        assert_eq!(
            dimension_label(&limit(vec![
                Dimension::User,
                Dimension::Device,
                Dimension::Attr("tier".into())
            ])),
            "user+device+attr.tier"
        );
    }
}
