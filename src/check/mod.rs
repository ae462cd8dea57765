//! The check path as one readable async fn: validate -> gateway -> profile (behaviour
//! actors and trust, concurrently) -> score -> keys and effective max -> store -> decision. Each stage is its own module; this one only sequences them and records
//! telemetry. The rule set is one snapshot passed in by the caller and used throughout.

pub mod decision;
pub mod gateway;
pub mod keys;
pub mod profile;
pub mod quota;
pub mod request;
pub mod score;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::rules::{Algorithm, Layer, Limit, RuleSet, Scene, StoreErrorPolicy};
use crate::store::{CheckOp, CheckOutcome, LimitOp, RefundOp, StoreError, WindowStore};
use decision::{apply_denied, reason, reports, AppliedLimit, CheckResponse, RateLimitInfo};
use gateway::Gateways;
use keys::{DimensionValues, KeySpace};
use profile::{Profile, Profiler};
use quota::effective_max;
pub use request::{CheckRequest, RequestError};

/// How long a store-unavailable deny tells the client to wait.
const STORE_UNAVAILABLE_RETRY_MS: u64 = 1000;

/// Runs checks and refunds against one window store.
pub struct Checker {
    store: Arc<dyn WindowStore>,
    /// The node's own store, for scenes whose policy is `local` (none until one exists:
    /// then `local` answers like `fail_close`).
    local: Option<Arc<dyn WindowStore>>,
    gateways: Gateways,
    profiler: Profiler,
    metrics: Metrics,
    key_prefix: String,
    clock: Arc<dyn Clock>,
}

impl Checker {
    /// A checker over `store` (and `local` for scenes whose policy is `local`); `clock` is
    /// the service's one clock (gateway buckets, new-account ages).
    pub fn new(
        store: Arc<dyn WindowStore>,
        local: Option<Arc<dyn WindowStore>>,
        metrics: Metrics,
        key_prefix: &str,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Checker {
            store,
            local,
            gateways: Gateways::new(clock.clone()),
            profiler: Profiler::new(None, None, clock.clone(), metrics.clone()),
            metrics,
            key_prefix: key_prefix.to_string(),
            clock,
        }
    }

    /// Uses `profiler` for behaviour signals and trust (without one, every check has no
    /// signals and no trust).
    pub fn with_profiler(mut self, profiler: Profiler) -> Self {
        self.profiler = profiler;
        self
    }

    /// Brings per-scene in-process state (gateway buckets) in line with a new rule set.
    pub fn sync_rules(&self, rules: &RuleSet) {
        self.gateways.sync(rules);
    }

    /// The store the checker counts in.
    pub fn store(&self) -> &Arc<dyn WindowStore> {
        &self.store
    }

    /// Validates and decides one `/v1/check` body.
    pub async fn check(
        &self,
        rules: &RuleSet,
        body: &Value,
    ) -> Result<CheckResponse, RequestError> {
        let started = Instant::now();
        let req = request::parse_check(rules, body, self.clock.now_ms())?;
        let resp = self.decide(rules, &req).await;
        self.record(&req.scene, &resp, started);
        Ok(resp)
    }

    async fn decide(&self, rules: &RuleSet, req: &CheckRequest) -> CheckResponse {
        let scene = &req.scene;
        let mut resp = CheckResponse::allow(&scene.name, &req.request_id, &rules.version);
        if req.device_invalid {
            resp.silent_deny(reason::INVALID_DEVICE_ID);
            return resp;
        }
        // Resource layer first: a deny here costs the store nothing. A dry run records
        // nothing, so it takes no token either.
        if !req.dry_run {
            if let Err(wait_ms) = self.gateways.admit(&scene.name) {
                resp.friendly_deny(Layer::Resource, reason::GATEWAY_RATE, scene, wait_ms);
                if let Some(g) = scene.gateway {
                    resp.rate_limit = Some(RateLimitInfo {
                        name: reason::GATEWAY_RATE.into(),
                        quota: u64::from(g.rate_per_s),
                        window_s: 1,
                        remaining: 0,
                        reset_s: decision::ceil_secs(wait_ms),
                    });
                }
                return resp;
            }
        }
        let profile = self.profiler.profile(rules, req).await;
        let scored = score::score(
            scene,
            &profile.signals,
            profile.new_account,
            rules.trust.as_ref(),
            profile.points,
        );
        resp.score = scored.score;
        resp.signals = scored.signals;
        resp.trust.points = profile.points;
        // Security outranks business: a score over the line is a silent deny whatever the
        // limits say, and it consumes no quota (a denied request counts nowhere).
        if scored.deny {
            resp.silent_deny(reason::SCORE);
            return resp;
        }
        let (op, applied) = self.check_op(scene, req, &profile);
        // The ledger shares the store: if it could not answer, neither can the store, and
        // the policy decides now rather than after a second timeout.
        let result = match profile.store_error {
            Some(e) => Err(e),
            None => self.store.check(&op).await,
        };
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => match self.on_store_error(scene, &op, &e).await {
                Some(outcome) => {
                    resp.degraded = true;
                    outcome
                }
                None => {
                    resp.degraded = true;
                    if scene.on_store_error == StoreErrorPolicy::FailOpen {
                        return resp;
                    }
                    resp.friendly_deny(
                        Layer::Resource,
                        reason::STORE_UNAVAILABLE,
                        scene,
                        STORE_UNAVAILABLE_RETRY_MS,
                    );
                    return resp;
                }
            },
        };
        match outcome {
            CheckOutcome::Allowed { limits } => resp.limits = reports(&applied, scene, &limits),
            CheckOutcome::Denied { limits } => {
                resp.limits = reports(&applied, scene, &limits);
                apply_denied(&mut resp, &applied, scene, &limits);
            }
            CheckOutcome::Duplicate { of } => resp.duplicate_of = Some(of),
        }
        resp
    }

    /// The store failed: log and count it, then let the scene's policy decide. `Some` is
    /// an outcome from the node's local store; `None` means answer without one.
    async fn on_store_error(
        &self,
        scene: &Scene,
        op: &CheckOp,
        e: &StoreError,
    ) -> Option<CheckOutcome> {
        self.metrics
            .store_error(self.store.kind(), store_error_kind(e));
        self.metrics
            .degraded(&scene.name, scene.on_store_error.name());
        // Per request at debug only: an outage is logged once, when the breaker opens.
        tracing::debug!(scene = %scene.name, error = %e, policy = scene.on_store_error.name(), "store failed; scene policy decides");
        if scene.on_store_error != StoreErrorPolicy::Local {
            return None;
        }
        let local = self.local.as_ref()?;
        local.check(op).await.ok()
    }

    /// The store op of one check: every limit of the scene with its key and effective max.
    fn check_op(
        &self,
        scene: &Scene,
        req: &CheckRequest,
        profile: &Profile,
    ) -> (CheckOp, Vec<AppliedLimit>) {
        let ks = KeySpace {
            prefix: &self.key_prefix,
            scene: &scene.name,
        };
        let ip: Option<IpAddr> = req.values.ip.as_deref().and_then(|s| s.parse().ok());
        let mut applied: Vec<AppliedLimit> = scene
            .limits
            .iter()
            .enumerate()
            .filter_map(|(index, limit)| {
                let key = ks.limit_key(limit, &req.values)?;
                Some(AppliedLimit {
                    index,
                    op: LimitOp {
                        key,
                        algorithm: limit.algorithm,
                        window_ms: limit.window_ms,
                        max: effective_max(scene, limit, ip, &profile.adjust),
                        retain_ms: limit.window_ms,
                    },
                })
            })
            .collect();
        // Sliding limits over the same dimensions share one ZSET: it must keep members for
        // the longest of their windows.
        for i in 0..applied.len() {
            if applied[i].op.algorithm != Algorithm::SlidingWindow {
                continue;
            }
            let retain = applied
                .iter()
                .filter(|o| {
                    o.op.algorithm == Algorithm::SlidingWindow && o.op.key == applied[i].op.key
                })
                .map(|o| o.op.window_ms)
                .max()
                .unwrap_or(applied[i].op.window_ms);
            applied[i].op.retain_ms = retain;
        }
        let op = CheckOp {
            record_key: ks.record_key(&req.request_id),
            idempotency_key: req
                .idempotency_key
                .as_deref()
                .map(|k| ks.idempotency_key(k)),
            request_id: req.request_id.clone(),
            record_ttl_ms: record_ttl_ms(scene),
            dry_run: req.dry_run,
            limits: applied.iter().map(|a| a.op.clone()).collect(),
        };
        (op, applied)
    }

    fn record(&self, scene: &Scene, resp: &CheckResponse, started: Instant) {
        let m = &self.metrics;
        m.decision(
            &scene.name,
            resp.decision.name(),
            resp.layer.map_or("none", Layer::name),
            resp.reason.as_deref().unwrap_or("none"),
        );
        for l in resp.limits.iter().filter(|l| l.exceeded) {
            if let Some(limit) = scene.limits.iter().find(|s| s.name == l.name) {
                m.block(&scene.name, &limit.name, &dimension_label(limit));
            }
        }
        m.check_latency(&scene.name, started.elapsed().as_secs_f64());
    }

    /// Validates a `/v1/refund` body and gives the request's quota back in every key it
    /// counted in. `Ok(false)` when the store does not know the request.
    pub async fn refund(
        &self,
        rules: &RuleSet,
        body: &Value,
    ) -> Result<Result<bool, StoreError>, RequestError> {
        let op = self.refund_op(rules, body)?;
        Ok(self.refund_with(&op).await)
    }

    /// The store op that refunds the request a `/v1/refund` body (or a
    /// `benefit_rolled_back` event) names, computed once so it can be journaled and
    /// replayed later against the same keys.
    pub fn refund_op(&self, rules: &RuleSet, body: &Value) -> Result<RefundOp, RequestError> {
        let req = request::parse_refund(rules, body)?;
        let ks = KeySpace {
            prefix: &self.key_prefix,
            scene: &req.scene.name,
        };
        Ok(RefundOp {
            record_key: ks.record_key(&req.request_id),
            request_id: req.request_id.clone(),
            keys: refund_keys(&ks, &req.scene, &req.values),
        })
    }

    /// Runs a refund op against the store. `Ok(false)` when the store does not know the
    /// request (never counted, expired, or already refunded): replaying a refund is harmless.
    pub async fn refund_with(&self, op: &RefundOp) -> Result<bool, StoreError> {
        let result = self.store.refund(op).await;
        if let Err(e) = &result {
            self.metrics
                .store_error(self.store.kind(), store_error_kind(e));
        }
        result
    }
}

/// Every key the scene's limits make from these values, without repeats.
fn refund_keys(ks: &KeySpace, scene: &Scene, values: &DimensionValues) -> Vec<String> {
    let mut keys: Vec<String> = scene
        .limits
        .iter()
        .filter_map(|l| ks.limit_key(l, values))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The request and idempotency records must outlive every window the request counted in,
/// so a duplicate inside any window is recognised.
fn record_ttl_ms(scene: &Scene) -> u64 {
    scene.longest_window_ms().max(1000)
}

fn dimension_label(limit: &Limit) -> String {
    limit
        .dimensions
        .iter()
        .map(|d| d.name())
        .collect::<Vec<_>>()
        .join("+")
}

fn store_error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Timeout(_) => "timeout",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Protocol(_) => "protocol",
        StoreError::CircuitOpen => "circuit_open",
    }
}
