//! The decision: what one check answers, as the value the HTTP layer serialises.
//!
//! The layers rank: security outranks business (a request that trips both is a silent
//! deny — an abuser learns nothing), and the resource layer answers before either is asked.
//! A friendly deny's `retry_after_ms` is when every exceeded limit admits again, so a
//! client that honours it is not denied a second time by another limit.

use serde::Serialize;
use utoipa::ToSchema;

use crate::rules::{Layer, Scene};
use crate::store::{LimitOp, LimitState};

/// The three answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    FriendlyDeny,
    SilentDeny,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::FriendlyDeny => "friendly_deny",
            Verdict::SilentDeny => "silent_deny",
        }
    }
}

/// Why a request was decided the way it was, when it was not a plain allow.
pub mod reason {
    pub const GATEWAY_RATE: &str = "gateway_rate";
    pub const STORE_UNAVAILABLE: &str = "store_unavailable";
    pub const INVALID_DEVICE_ID: &str = "invalid_device_id";
    pub const SCORE: &str = "score";
}

/// One limit as the response reports it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct LimitReport {
    pub name: String,
    pub key: String,
    pub count: u64,
    pub max: u64,
    pub remaining: u64,
    pub window_ms: u64,
    pub exceeded: bool,
}

/// One behaviour signal (filled by the behaviour actors; empty until they exist).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SignalReport {
    pub name: String,
    pub value: u64,
    pub max: u64,
    pub contribution: f64,
}

/// The user's trust.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct TrustReport {
    pub points: u32,
}

/// What the `RateLimit-Policy` and `RateLimit` headers describe: the limit that denied.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitInfo {
    pub name: String,
    pub quota: u64,
    pub window_s: u64,
    pub remaining: u64,
    pub reset_s: u64,
}

/// The body of every `/v1/check` answer, and what the HTTP layer needs beside it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct CheckResponse {
    pub decision: Verdict,
    pub request_id: String,
    pub scene: String,
    pub rules_version: String,
    #[schema(value_type = Option<String>, example = "business")]
    #[serde(serialize_with = "layer_name")]
    pub layer: Option<Layer>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub retry_after_ms: Option<u64>,
    pub score: f64,
    pub degraded: bool,
    pub duplicate_of: Option<String>,
    pub limits: Vec<LimitReport>,
    pub signals: Vec<SignalReport>,
    pub trust: TrustReport,
    /// For the headers of a friendly deny; not part of the body.
    #[serde(skip)]
    #[schema(ignore)]
    pub rate_limit: Option<RateLimitInfo>,
}

fn layer_name<S: serde::Serializer>(l: &Option<Layer>, s: S) -> Result<S::Ok, S::Error> {
    match l {
        Some(l) => s.serialize_str(l.name()),
        None => s.serialize_none(),
    }
}

impl CheckResponse {
    /// An allow with nothing counted yet; the pipeline fills the rest.
    pub fn allow(scene: &str, request_id: &str, rules_version: &str) -> Self {
        CheckResponse {
            decision: Verdict::Allow,
            request_id: request_id.to_string(),
            scene: scene.to_string(),
            rules_version: rules_version.to_string(),
            layer: None,
            reason: None,
            message: None,
            retry_after_ms: None,
            score: 0.0,
            degraded: false,
            duplicate_of: None,
            limits: Vec::new(),
            signals: Vec::new(),
            trust: TrustReport::default(),
            rate_limit: None,
        }
    }

    /// Turns this into a friendly deny.
    pub fn friendly_deny(&mut self, layer: Layer, reason: &str, scene: &Scene, retry_ms: u64) {
        self.decision = Verdict::FriendlyDeny;
        self.layer = Some(layer);
        self.reason = Some(reason.to_string());
        self.message = scene.deny_message.clone();
        self.retry_after_ms = Some(retry_ms.max(1));
    }

    /// Turns this into a silent deny.
    pub fn silent_deny(&mut self, reason: &str) {
        self.decision = Verdict::SilentDeny;
        self.layer = Some(Layer::Security);
        self.reason = Some(reason.to_string());
        self.message = None;
        self.retry_after_ms = None;
    }
}

/// Whole seconds for a header, rounded up, at least 1.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// The limits of a scene that applied to this request, parallel to the store op.
#[derive(Debug, Clone)]
pub struct AppliedLimit {
    /// Index into `Scene::limits`.
    pub index: usize,
    pub op: LimitOp,
}

/// Reports the store's per-limit states.
pub fn reports(applied: &[AppliedLimit], scene: &Scene, states: &[LimitState]) -> Vec<LimitReport> {
    applied
        .iter()
        .zip(states)
        .map(|(a, s)| LimitReport {
            name: scene.limits[a.index].name.clone(),
            key: a.op.key.clone(),
            count: s.count,
            max: a.op.max,
            remaining: a.op.max.saturating_sub(s.count),
            window_ms: a.op.window_ms,
            exceeded: s.exceeded,
        })
        .collect()
}

/// Applies a store deny: security outranks business; among business limits the one that
/// clears last is named, and its wait is the answer's.
pub fn apply_denied(
    resp: &mut CheckResponse,
    applied: &[AppliedLimit],
    scene: &Scene,
    states: &[LimitState],
) {
    let exceeded = || {
        applied
            .iter()
            .zip(states)
            .filter(|(_, s)| s.exceeded)
            .map(|(a, s)| (&scene.limits[a.index], a, s))
    };
    if let Some((limit, _, _)) = exceeded().find(|(l, _, _)| l.layer == Layer::Security) {
        resp.silent_deny(&limit.name);
        return;
    }
    let Some((limit, a, s)) = exceeded().max_by_key(|(_, _, s)| s.retry_after_ms) else {
        return;
    };
    resp.friendly_deny(Layer::Business, &limit.name, scene, s.retry_after_ms);
    resp.rate_limit = Some(RateLimitInfo {
        name: limit.name.clone(),
        quota: a.op.max,
        window_s: ceil_secs(a.op.window_ms),
        remaining: a.op.max.saturating_sub(s.count),
        reset_s: ceil_secs(s.retry_after_ms),
    });
}
