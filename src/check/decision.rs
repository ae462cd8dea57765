//! The decision: what one check answers, as the value the HTTP layer serialises.
//!
//! The layers rank: security outranks business (a request that trips both is a silent
//! deny — an abuser learns nothing), and the resource layer answers before either is asked.
//! A friendly deny's `retry_after_ms` is when every exceeded limit admits again, so a
//! client that honours it is not denied a second time by another limit.

use serde::Serialize;
use utoipa::ToSchema;

use super::plan::NEW_ACCOUNT;
use crate::decide::{CheckPlan, Decided, LimitPlan, LimitValue, Outcome};
use crate::rules::{Layer, Limit, Scene};

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

/// One signal that applied to the request (and `new_account`, when the age is known).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SignalReport {
    pub name: String,
    /// Its value, this request included (exact up to `max + 1`).
    pub value: u64,
    pub max: u64,
    /// Its weight when it fired, else 0.
    pub contribution: f64,
    /// It fired (past its max, and its share when it has one), weighted or not: for the
    /// metrics, not part of the body.
    #[serde(skip)]
    #[schema(ignore)]
    pub fired: bool,
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

/// Fills the response from a decider's answer: the facts, every applying signal and the
/// new-account flag with their contributions, the score, then the score deny or the
/// limits (security outranks business).
pub fn fill(
    resp: &mut CheckResponse,
    scene: &Scene,
    plan: &CheckPlan,
    index: &[usize],
    decided: Decided,
) {
    let j = match decided {
        Decided::Duplicate { of } => {
            resp.duplicate_of = Some(of);
            return;
        }
        Decided::Judged(j) => j,
    };
    resp.trust.points = j.facts.points;
    resp.score = j.score;
    let weights = plan.score.as_ref();
    resp.signals = plan
        .signals
        .iter()
        .zip(&j.signals)
        .enumerate()
        .filter(|(_, (_, v))| v.applies)
        .map(|(i, (s, v))| SignalReport {
            name: s.name.clone(),
            value: v.value,
            max: s.max,
            contribution: match weights.and_then(|w| w.weights.get(i)) {
                Some(&w) if v.fired => w,
                _ => 0.0,
            },
            fired: v.fired,
        })
        .collect();
    if let Some(is_new) = j.facts.new_account {
        let weight = weights.and_then(|w| w.new_account_weight).unwrap_or(0.0);
        resp.signals.push(SignalReport {
            name: NEW_ACCOUNT.to_string(),
            value: u64::from(is_new),
            max: 0,
            contribution: if is_new { weight } else { 0.0 },
            fired: is_new,
        });
    }
    let (limits, denied) = match j.outcome {
        Outcome::ScoreDeny => {
            resp.silent_deny(reason::SCORE);
            return;
        }
        Outcome::Allowed { limits } => (limits, false),
        Outcome::Denied { limits } => (limits, true),
    };
    let applied: Vec<(&Limit, &LimitPlan, &LimitValue)> = index
        .iter()
        .zip(&plan.limits)
        .zip(&limits)
        .filter(|(_, v)| v.applies)
        .filter_map(|((&i, p), v)| Some((scene.limits.get(i)?, p, v)))
        .collect();
    resp.limits = applied
        .iter()
        .map(|(l, p, v)| LimitReport {
            name: l.name.clone(),
            key: p.key.clone(),
            count: v.state.count,
            max: v.max,
            remaining: v.max.saturating_sub(v.state.count),
            window_ms: p.window_ms,
            exceeded: v.state.exceeded,
        })
        .collect();
    if denied {
        deny_by_limits(resp, scene, &applied);
    }
}

/// A limits deny: security outranks business; among business limits the one that clears
/// last is named, and its wait is the answer's.
fn deny_by_limits(
    resp: &mut CheckResponse,
    scene: &Scene,
    applied: &[(&Limit, &LimitPlan, &LimitValue)],
) {
    let exceeded = || applied.iter().filter(|(_, _, v)| v.state.exceeded);
    if let Some((limit, _, _)) = exceeded().find(|(l, _, _)| l.layer == Layer::Security) {
        resp.silent_deny(&limit.name);
        return;
    }
    let Some((limit, p, v)) = exceeded().max_by_key(|(_, _, v)| v.state.retry_after_ms) else {
        return;
    };
    resp.friendly_deny(Layer::Business, &limit.name, scene, v.state.retry_after_ms);
    resp.rate_limit = Some(RateLimitInfo {
        name: limit.name.clone(),
        quota: v.max,
        window_s: ceil_secs(p.window_ms),
        remaining: v.max.saturating_sub(v.state.count),
        reset_s: ceil_secs(v.state.retry_after_ms),
    });
}
