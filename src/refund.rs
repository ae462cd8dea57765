//! Refunds: a request's quota given back in every key it counted in, by `POST /v1/refund`
//! and by a `benefit_rolled_back` event.
//!
//! Its own module, below both callers, because they use it differently: the HTTP layer
//! refunds a body at once; the events service (`trust::events`) computes the op when it
//! accepts the event, journals it, and applies it later — possibly after a restart. Neither
//! goes through the check path, and the check path needs nothing from here.
//!
//! The op is computed once, from the rules in force when it is asked for, so a journaled
//! refund replays against the same keys even after a rule change. Applying it is
//! idempotent (the store only touches keys whose record names the request): a replay, or a
//! refund of a request never counted, changes nothing.

use std::sync::Arc;

use serde_json::Value;

use crate::input::{self, RequestError};
use crate::keys::{DimensionValues, KeyPrefix, KeySpace};
use crate::metrics::Metrics;
use crate::rules::{RuleSet, Scene};
use crate::store::{RefundOp, Refunded, StoreError, WindowStore};

/// Every field a refund reads: the check's scene, request id and dimension values. A
/// `benefit_rolled_back` event may carry these besides its own.
pub const FIELDS: [&str; 7] = [
    "scene",
    "request_id",
    "user_id",
    "device_id",
    "ip",
    "activity_id",
    "attrs",
];

/// A valid refund: the request to give back and the dimension values it was checked with.
#[derive(Debug, Clone)]
pub struct RefundRequest {
    pub scene: Arc<Scene>,
    pub request_id: String,
    pub values: DimensionValues,
}

/// Validates a `/v1/refund` body (or a `benefit_rolled_back` event): the scene, the
/// request id, and the dimension values the check carried (they name the keys the request
/// counted in). Every dimension a limit of the scene counts on and the scene requires of a
/// check must be there: without it the refund could not name the key the request counted
/// in, and would answer `refunded: false` for a request that was counted. Fields it does
/// not name are ignored: an event carries more.
pub fn parse(rules: &RuleSet, body: &Value) -> Result<RefundRequest, RequestError> {
    let obj = input::object(body)?;
    let scene = input::scene(rules, obj)?;
    if obj.get("request_id").is_none_or(Value::is_null) {
        return Err(RequestError::invalid("request_id", "is required"));
    }
    let request_id = input::request_id(obj, 0)?;
    let (values, _) = input::values(rules, obj)?;
    require(&scene, &values)?;
    Ok(RefundRequest {
        scene,
        request_id,
        values,
    })
}

/// The first dimension the scene requires (so every counted check carried it) that the
/// body lacks, as `missing_dimension`: the refund's keys, and where its record is kept (the
/// first required entity's records), are made from them. A dimension the scene does not
/// require may be absent: a check without it did not count in its limits either.
fn require(scene: &Scene, values: &DimensionValues) -> Result<(), RequestError> {
    let missing = scene.required.iter().find(|d| values.get(d).is_none());
    match missing {
        None => Ok(()),
        Some(d) => Err(RequestError::MissingDimension {
            field: d.request_field().into_owned(),
            scene: scene.name.clone(),
        }),
    }
}

/// Refunds on one window store, under one key prefix.
pub struct Refunds {
    store: Arc<dyn WindowStore>,
    metrics: Metrics,
    key_prefix: KeyPrefix,
    /// `[store] record_horizon_ms`, as the checks were given it: a refund finds a record
    /// where the check wrote it only with the same record TTL (`Scene::record_ttl_ms`).
    record_horizon_ms: u64,
}

impl std::fmt::Debug for Refunds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refunds")
            .field("store", &self.store.kind())
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl Refunds {
    /// Refunds on `store` (the windows the checks count in) under `key_prefix`.
    pub fn new(store: Arc<dyn WindowStore>, metrics: Metrics, key_prefix: &KeyPrefix) -> Self {
        Refunds {
            store,
            metrics,
            key_prefix: key_prefix.clone(),
            record_horizon_ms: crate::config::DEFAULT_RECORD_HORIZON_MS,
        }
    }

    /// The checks' record horizon (`[store] record_horizon_ms`); the default otherwise.
    pub fn with_record_horizon(mut self, ms: u64) -> Self {
        self.record_horizon_ms = ms;
        self
    }

    /// Validates a `/v1/refund` body, gives the request's quota back and says which of
    /// the scene's limits gave it back.
    pub async fn refund(
        &self,
        rules: &RuleSet,
        body: &Value,
    ) -> Result<Result<RefundReport, StoreError>, RequestError> {
        let req = parse(rules, body)?;
        let op = self.op_of(&req);
        Ok(self
            .apply_keys(&op)
            .await
            .map(|given| RefundReport::of(&self.key_prefix, &req, &op, &given)))
    }

    /// The store op that refunds the request a body names, computed now so it can be
    /// journaled and applied later against the same keys.
    pub fn op(&self, rules: &RuleSet, body: &Value) -> Result<RefundOp, RequestError> {
        Ok(self.op_of(&parse(rules, body)?))
    }

    fn op_of(&self, req: &RefundRequest) -> RefundOp {
        let ks = self.key_prefix.scene(&req.scene.name);
        RefundOp {
            record_key: ks.record_key(&req.values, &req.scene.required, &req.request_id),
            records_key: ks.records_key(&req.values, &req.scene.required),
            record_ttl_ms: req.scene.record_ttl_ms(self.record_horizon_ms),
            request_id: req.request_id.clone(),
            keys: keys(&ks, &req.scene, &req.values),
        }
    }

    /// Runs a refund op. `Ok(false)` when the store does not know the request (never
    /// counted, expired, or already refunded): applying a refund twice is harmless.
    pub async fn apply(&self, op: &RefundOp) -> Result<bool, StoreError> {
        self.apply_keys(op).await.map(|given| given.any())
    }

    /// [`Refunds::apply`], saying which of the op's keys gave something back.
    async fn apply_keys(&self, op: &RefundOp) -> Result<Refunded, StoreError> {
        let result = self.store.refund_keys(op).await;
        if let Err(e) = &result {
            self.metrics.store_error(self.store.kind(), e.kind());
        }
        result
    }

    /// Makes every applied refund durable: the events journal forgets a rollback only
    /// after this, so a crash cannot lose a refund it no longer holds.
    pub async fn sync(&self) -> Result<(), StoreError> {
        self.store.sync().await
    }
}

/// What a refund gave back, by the scene's limits (those whose dimensions the refund
/// carried: a check without an optional dimension did not count in its limits either).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundReport {
    /// Some limit gave the request back.
    pub refunded: bool,
    /// The limits whose key gave the request back.
    pub given_back: Vec<String>,
    /// The limits whose key held nothing of the request: a dimension value the check did
    /// not carry (a wrong `device_id` names keys the request never counted in, while the
    /// user's keys, where its record is kept, are given back), a limit whose `where` the
    /// request did not match, a sliding window that has moved past it, or a refund before.
    /// A refund naming the right values gives back what is left.
    pub held_nothing: Vec<String>,
}

impl RefundReport {
    /// Maps the store's per-key answer onto the limits that count in each key (sliding
    /// limits over the same dimensions share one).
    fn of(prefix: &KeyPrefix, req: &RefundRequest, op: &RefundOp, given: &Refunded) -> Self {
        let ks = prefix.scene(&req.scene.name);
        let mut report = RefundReport {
            refunded: given.any(),
            given_back: Vec::new(),
            held_nothing: Vec::new(),
        };
        for limit in &req.scene.limits {
            let Some(key) = ks.limit_key(limit, &req.values) else {
                continue;
            };
            let back = op
                .keys
                .iter()
                .position(|k| *k == key)
                .and_then(|i| given.keys.get(i).copied())
                .unwrap_or(false);
            let list = if back {
                &mut report.given_back
            } else {
                &mut report.held_nothing
            };
            list.push(limit.name.clone());
        }
        report
    }
}

/// Every key the scene's limits make from these values, without repeats (sliding limits
/// over the same dimensions share one key, and the store would otherwise remove twice).
fn keys(ks: &KeySpace, scene: &Scene, values: &DimensionValues) -> Vec<String> {
    let mut keys: Vec<String> = scene
        .limits
        .iter()
        .filter_map(|l| ks.limit_key(l, values))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use serde_json::json;

    fn rules() -> RuleSet {
        let toml = r#"
[scene.s]
on_store_error = "fail_close"
required = ["user", "ip"]

[[scene.s.limits]]
name = "user_10s"
dimensions = ["user"]
algorithm = "sliding_window"
window = "10s"
max = 1

[[scene.s.limits]]
name = "user_1h"
dimensions = ["user"]
algorithm = "sliding_window"
window = "1h"
max = 5

[[scene.s.limits]]
name = "ip_1m"
dimensions = ["ip"]
algorithm = "fixed_window"
window = "1m"
max = 10
"#;
        crate::rules::compile_files(&[("r.toml".into(), toml.into())]).unwrap()
    }

    fn refunds() -> Refunds {
        let clock: Arc<dyn crate::clock::Clock> =
            Arc::new(crate::clock::ManualClock::new(1_700_000_000_000));
        Refunds::new(
            EmbeddedStore::in_memory(clock),
            Metrics::new(),
            &KeyPrefix::plain("lt"),
        )
    }

    #[test]
    fn an_op_names_each_key_once_with_the_request_record() {
        let body = json!({"scene": "s", "request_id": "r1", "user_id": "u:1", "ip": "192.0.2.1"});
        let op = refunds().op(&rules(), &body).unwrap();
        assert_eq!(op.record_key, "lt:s:req:uid:u%3A1:r1");
        // On Redis the record sits with the user, in hashes of 1 h generations: the
        // scene's longest window (1 h) caps the 1 h default horizon.
        assert_eq!(op.records_key, "lt:s:rq:uid:u%3A1");
        assert_eq!(op.record_ttl_ms, 3_600_000);
        let shorter = refunds().with_record_horizon(60_000);
        assert_eq!(shorter.op(&rules(), &body).unwrap().record_ttl_ms, 60_000);
        assert_eq!(op.request_id, "r1");
        // The two sliding limits over `user` share one key: named once.
        assert_eq!(
            op.keys,
            ["lt:s:fw:ip_1m:ip:192.0.2.1", "lt:s:uid:u%3A1"].map(String::from)
        );
    }

    #[test]
    fn a_refund_names_its_request_and_scene() {
        let r = refunds();
        let e = r
            .op(&rules(), &json!({"scene": "s", "user_id": "u"}))
            .unwrap_err();
        assert_eq!(e.field(), Some("request_id"));
        let e = r
            .op(&rules(), &json!({"scene": "nope", "request_id": "r"}))
            .unwrap_err();
        assert_eq!(e.code(), "unknown_scene");
    }

    #[test]
    fn a_refund_without_a_dimension_the_limits_count_on_names_it() {
        let r = refunds();
        let e = r
            .op(
                &rules(),
                &json!({"scene": "s", "request_id": "r1", "user_id": "u"}),
            )
            .unwrap_err();
        assert_eq!(e.code(), "missing_dimension");
        assert_eq!(e.field(), Some("ip"));
        let e = r
            .op(
                &rules(),
                &json!({"scene": "s", "request_id": "r1", "ip": "192.0.2.1"}),
            )
            .unwrap_err();
        assert_eq!(e.field(), Some("user_id"));
    }

    #[test]
    fn a_refund_names_every_dimension_the_scene_requires_even_one_no_limit_counts_on() {
        // The record sits with the first required entity: a refund without the device
        // would look for it elsewhere and answer `refunded: false` for a counted request.
        let toml = r#"
[scene.d]
on_store_error = "fail_close"
required = ["user", "device"]

[[scene.d.limits]]
name = "user_10s"
dimensions = ["user"]
algorithm = "sliding_window"
window = "10s"
max = 1
"#;
        let rules = crate::rules::compile_files(&[("r.toml".into(), toml.into())]).unwrap();
        let e = refunds()
            .op(
                &rules,
                &json!({"scene": "d", "request_id": "r1", "user_id": "u"}),
            )
            .unwrap_err();
        assert_eq!(e.code(), "missing_dimension");
        assert_eq!(e.field(), Some("device_id"));
    }
}
