//! The decision: what one check answers, as one value ([`Decision`]) that each stage of
//! the check path returns — the device-id check, the gateway, the scene's store-failure
//! policy, the decider's answer ([`fill`]) — and the HTTP layer turns into status, headers
//! and body in one place (`http::check::respond`). Why a request was denied is a
//! [`Reason`], never a string to compare: its name is only written, into the body, the
//! metrics and the recorded traffic.
//!
//! The layers rank: security outranks business (a request that trips both is a silent
//! deny — an abuser learns nothing), and the resource layer answers before either is asked.
//! A friendly deny's `retry_after_ms` is when every exceeded limit admits again, so a
//! client that honours it is not denied a second time by another limit.

use std::borrow::Cow;

use serde::{Serialize, Serializer};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use super::plan::NEW_ACCOUNT;
use crate::decide::{CheckPlan, Decided, LimitPlan, LimitValue, Outcome};
use crate::rules::{Layer, Limit, Scene};

/// The four answers, as the body's `decision` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Challenge,
    FriendlyDeny,
    SilentDeny,
}

impl Verdict {
    pub const ALL: [Verdict; 4] = [
        Verdict::Allow,
        Verdict::Challenge,
        Verdict::FriendlyDeny,
        Verdict::SilentDeny,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Challenge => "challenge",
            Verdict::FriendlyDeny => "friendly_deny",
            Verdict::SilentDeny => "silent_deny",
        }
    }
}

/// Why a request was denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A limit of the scene, by name: a business limit denies friendly, a security limit
    /// silently.
    Limit(String),
    /// The score reached the scene's `silent_deny_at`.
    Score,
    /// The scene's gateway bucket is empty (resource layer).
    GatewayRate,
    /// The store could not answer and the scene fails closed (resource layer).
    StoreUnavailable,
    /// The device id fails the rule set's pattern, or is absurdly long: forged.
    InvalidDeviceId,
    /// Redis Cluster: the request id or idempotency key names an attempt whose node has
    /// not yet settled it (it may still be denied): sent again shortly, the copy is a
    /// repeat of an allow or a new check.
    InFlight,
}

impl Reason {
    /// Its name on the wire: the body's `reason`, the metrics label, the recorded line.
    pub fn name(&self) -> &str {
        match self {
            Reason::Limit(name) => name,
            Reason::Score => "score",
            Reason::GatewayRate => "gateway_rate",
            Reason::StoreUnavailable => "store_unavailable",
            Reason::InvalidDeviceId => "invalid_device_id",
            Reason::InFlight => "in_flight",
        }
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
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

/// A friendly deny: the client may come back, and is told when.
#[derive(Debug, Clone, PartialEq)]
pub struct FriendlyDeny {
    /// A business limit's name, `gateway_rate` or `store_unavailable`.
    pub reason: Reason,
    /// The scene's `deny_message`.
    pub message: Option<String>,
    /// When every exceeded limit admits again; at least 1.
    pub retry_after_ms: u64,
    /// The limit (or gateway bucket) that denied, for the `RateLimit-*` headers; `None`
    /// when no limit did (the store is down).
    pub rate_limit: Option<RateLimitInfo>,
}

impl FriendlyDeny {
    /// A friendly deny of `scene` (its message) for `reason`, to retry in `retry_after_ms`.
    pub fn new(reason: Reason, scene: &Scene, retry_after_ms: u64) -> Self {
        FriendlyDeny {
            reason,
            message: scene.deny_message.clone(),
            retry_after_ms: retry_after_ms.max(1),
            rate_limit: None,
        }
    }

    /// The same, naming the limit that denied in the `RateLimit-*` headers.
    pub fn with_rate_limit(self, rate_limit: RateLimitInfo) -> Self {
        FriendlyDeny {
            rate_limit: Some(rate_limit),
            ..self
        }
    }

    /// A limit's deny is the business layer's (a security limit denies silently); the
    /// gateway's and the store's are the resource layer's.
    pub fn layer(&self) -> Layer {
        match self.reason {
            Reason::Limit(_) => Layer::Business,
            _ => Layer::Resource,
        }
    }
}

/// What a challenge asks of the backend: the scene's `[challenge]`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChallengeAsk {
    /// What to ask the person (`captcha`, `sms`…): the scene's `challenge.kind`.
    pub kind: String,
    /// The scene's `challenge.message`, to show the person.
    #[schema(required = true)]
    pub message: Option<String>,
}

/// What one check decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Allow,
    /// 403: the backend verifies the person (the scene says how), reports the pass, and
    /// sends the claim again. Consumed nothing, recorded nothing.
    Challenge {
        reason: Reason,
        ask: ChallengeAsk,
    },
    /// 429 (503 for `store_unavailable`) with `Retry-After`, and the message.
    FriendlyDeny(FriendlyDeny),
    /// Looks like an allow on the wire; only the body tells the backend.
    SilentDeny {
        reason: Reason,
    },
}

impl Decision {
    /// A silent deny for `reason`.
    pub fn silent(reason: Reason) -> Self {
        Decision::SilentDeny { reason }
    }

    pub fn verdict(&self) -> Verdict {
        match self {
            Decision::Allow => Verdict::Allow,
            Decision::Challenge { .. } => Verdict::Challenge,
            Decision::FriendlyDeny(_) => Verdict::FriendlyDeny,
            Decision::SilentDeny { .. } => Verdict::SilentDeny,
        }
    }

    /// The layer that denied; `None` for an allow. Every silent deny and challenge is the
    /// security layer's.
    pub fn layer(&self) -> Option<Layer> {
        match self {
            Decision::Allow => None,
            Decision::Challenge { .. } => Some(Layer::Security),
            Decision::FriendlyDeny(d) => Some(d.layer()),
            Decision::SilentDeny { .. } => Some(Layer::Security),
        }
    }

    /// Why the request was denied; `None` for an allow.
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            Decision::Allow => None,
            Decision::Challenge { reason, .. } => Some(reason),
            Decision::FriendlyDeny(d) => Some(&d.reason),
            Decision::SilentDeny { reason } => Some(reason),
        }
    }
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

/// Everything one `/v1/check` answers: the decision and what the check learnt on the way.
/// It serialises as the body of API.md ([`Body`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckResponse {
    pub decision: Decision,
    pub request_id: String,
    pub scene: String,
    pub rules_version: String,
    pub score: f64,
    pub degraded: bool,
    pub duplicate_of: Option<String>,
    pub limits: Vec<LimitReport>,
    pub signals: Vec<SignalReport>,
    pub trust: TrustReport,
    /// The check was a dry run: decided, nothing recorded.
    pub dry_run: bool,
}

impl CheckResponse {
    /// An allow with nothing counted yet; the pipeline fills the rest.
    pub fn allow(scene: &str, request_id: &str, rules_version: &str) -> Self {
        CheckResponse {
            decision: Decision::Allow,
            request_id: request_id.to_string(),
            scene: scene.to_string(),
            rules_version: rules_version.to_string(),
            score: 0.0,
            degraded: false,
            duplicate_of: None,
            limits: Vec::new(),
            signals: Vec::new(),
            trust: TrustReport::default(),
            dry_run: false,
        }
    }
}

// The wire form of a `CheckResponse`: the decision spread over `decision`, `layer`,
// `reason`, `message` and `retry_after_ms`, in API.md's field order (the decision leads, its
// details follow the ids). Serialising goes through it, and so does the OpenAPI schema, so
// the two cannot drift apart.
/// The body of every `/v1/check` answer, the same shape for every decision.
#[derive(Serialize, ToSchema)]
pub struct Body<'a> {
    decision: Verdict,
    request_id: &'a str,
    scene: &'a str,
    rules_version: &'a str,
    /// The layer that denied; null for an allow.
    #[schema(required = true)]
    layer: Option<Layer>,
    /// Why: a limit's name, `gateway_rate`, `store_unavailable`, `score` or
    /// `invalid_device_id`; null for an allow.
    #[schema(value_type = Option<String>, required = true)]
    reason: Option<&'a Reason>,
    /// The scene's `deny_message` on a friendly deny, its `challenge.message` on a
    /// challenge; else null.
    #[schema(required = true)]
    message: Option<&'a str>,
    /// A friendly deny: when every exceeded limit admits again (at least 1); else null.
    #[schema(required = true, minimum = 1)]
    retry_after_ms: Option<u64>,
    /// A challenge: what the backend must ask the person before the action may proceed;
    /// else null.
    #[schema(required = true)]
    challenge: Option<&'a ChallengeAsk>,
    /// The risk score, 0 to 1.
    #[schema(minimum = 0.0, maximum = 1.0)]
    score: f64,
    /// The store could not answer and the scene's `on_store_error` decided.
    degraded: bool,
    /// A retry with a known `idempotency_key`: the request id of the first; else null.
    #[schema(required = true)]
    duplicate_of: Option<&'a str>,
    limits: &'a [LimitReport],
    signals: &'a [SignalReport],
    trust: &'a TrustReport,
    /// Present, and true, only on a dry run: the check was decided but nothing was
    /// recorded, so an allow here is no allow a backend may act on.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(schema_with = only_true)]
    dry_run: bool,
}

/// `dry_run` in an answer: `true` or absent.
fn only_true() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::Boolean)
        .enum_values(Some([true]))
        .build()
}

impl<'a> From<&'a CheckResponse> for Body<'a> {
    fn from(r: &'a CheckResponse) -> Self {
        let friendly = match &r.decision {
            Decision::FriendlyDeny(d) => Some(d),
            _ => None,
        };
        let ask = match &r.decision {
            Decision::Challenge { ask, .. } => Some(ask),
            _ => None,
        };
        Body {
            decision: r.decision.verdict(),
            request_id: &r.request_id,
            scene: &r.scene,
            rules_version: &r.rules_version,
            layer: r.decision.layer(),
            reason: r.decision.reason(),
            message: friendly
                .and_then(|d| d.message.as_deref())
                .or_else(|| ask.and_then(|a| a.message.as_deref())),
            retry_after_ms: friendly.map(|d| d.retry_after_ms),
            challenge: ask,
            score: r.score,
            degraded: r.degraded,
            duplicate_of: r.duplicate_of.as_deref(),
            limits: &r.limits,
            signals: &r.signals,
            trust: &r.trust,
            dry_run: r.dry_run,
        }
    }
}

impl Serialize for CheckResponse {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Body::from(self).serialize(s)
    }
}

// The schema is the wire form's, under the name the API has always used.
impl PartialSchema for CheckResponse {
    fn schema() -> RefOr<Schema> {
        <Body<'static> as PartialSchema>::schema()
    }
}

impl ToSchema for CheckResponse {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("CheckResponse")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        <Body<'static> as ToSchema>::schemas(schemas);
    }
}

/// How long a copy of an unsettled attempt is told to wait (`Retry-After: 1`).
pub const IN_FLIGHT_RETRY_MS: u64 = 1_000;

/// Whole seconds for a header, rounded up, at least 1.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// The decider's stage: fills the response's report from its answer (the facts, every
/// applying signal and the new-account flag with their contributions, the score, the
/// limits) and returns the decision they make: the score deny, else the limits' (security
/// outranks business), else an allow — a repeat of a counted request included.
#[must_use]
pub fn fill(
    resp: &mut CheckResponse,
    scene: &Scene,
    plan: &CheckPlan,
    index: &[usize],
    decided: Decided,
) -> Decision {
    let j = match decided {
        Decided::Duplicate { of } => {
            resp.duplicate_of = Some(of);
            return Decision::Allow;
        }
        // Neither a repeat of an allow nor a new check yet: never granted; the attempt it
        // copies is settled within a round trip or two (a release or commit).
        Decided::Held { .. } => {
            return Decision::FriendlyDeny(FriendlyDeny::new(
                Reason::InFlight,
                scene,
                IN_FLIGHT_RETRY_MS,
            ))
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
    let (limits, denied, challenged) = match j.outcome {
        Outcome::ScoreDeny => return Decision::silent(Reason::Score),
        Outcome::Allowed { limits } => (limits, false, false),
        Outcome::Denied { limits } => (limits, true, false),
        Outcome::Challenged { limits } => (limits, false, true),
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
        return deny_by_limits(scene, &applied);
    }
    if !challenged {
        return Decision::Allow;
    }
    // Nothing was recorded: this is never turned into an allow. (A scene with a band has
    // a `[challenge]`: the rules refuse one without it.)
    let ask = scene.challenge.as_ref().map_or(
        ChallengeAsk {
            kind: "challenge".into(),
            message: None,
        },
        |c| ChallengeAsk {
            kind: c.kind.clone(),
            message: c.message.clone(),
        },
    );
    Decision::Challenge {
        reason: Reason::Score,
        ask,
    }
}

/// A limits deny: security outranks business; among business limits the one that clears
/// last is named, and its wait is the answer's. A store that denies with no limit over
/// (it should not) is not turned into a deny no limit explains.
fn deny_by_limits(scene: &Scene, applied: &[(&Limit, &LimitPlan, &LimitValue)]) -> Decision {
    let exceeded = || applied.iter().filter(|(_, _, v)| v.state.exceeded);
    if let Some((limit, _, _)) = exceeded().find(|(l, _, _)| l.layer == Layer::Security) {
        return Decision::silent(Reason::Limit(limit.name.clone()));
    }
    let Some((limit, p, v)) = exceeded().max_by_key(|(_, _, v)| v.state.retry_after_ms) else {
        return Decision::Allow;
    };
    let retry_after_ms = v.state.retry_after_ms;
    Decision::FriendlyDeny(
        FriendlyDeny::new(Reason::Limit(limit.name.clone()), scene, retry_after_ms)
            .with_rate_limit(RateLimitInfo {
                name: limit.name.clone(),
                quota: v.max,
                window_s: ceil_secs(p.window_ms),
                remaining: v.max.saturating_sub(v.state.count),
                reset_s: ceil_secs(retry_after_ms),
            }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{plan, request};
    use crate::decide::{Facts, Judgement};
    use crate::rules::RuleSet;
    use crate::store::LimitState;
    use serde_json::{json, Value};

    const RULES: &str = r#"
[scene.s]
on_store_error = "fail_close"
deny_message = "Agotado"
required = ["user", "ip"]

[[scene.s.limits]]
name = "user_10s"
dimensions = ["user"]
algorithm = "sliding_window"
window = "10s"
max = 1

[[scene.s.limits]]
name = "user_1m"
dimensions = ["user"]
algorithm = "fixed_window"
window = "1m"
max = 3

[[scene.s.limits]]
name = "ip_burst"
dimensions = ["ip"]
algorithm = "sliding_window"
window = "1s"
max = 20
layer = "security"
"#;

    fn rules() -> RuleSet {
        crate::rules::compile_files(&[("r.toml".into(), RULES.into())]).unwrap()
    }

    /// A check `r1` of scene `s` under `rules`, planned.
    fn planned(rules: &RuleSet) -> (request::CheckRequest, CheckPlan, Vec<usize>) {
        let body = json!({"scene": "s", "request_id": "r1", "user_id": "u", "ip": "192.0.2.1"});
        let req = request::parse_check(rules, &body, 0).unwrap();
        let (plan, index) = plan::plan(
            &crate::keys::KeyPrefix::plain("lt"),
            rules,
            &req,
            crate::config::DEFAULT_RECORD_HORIZON_MS,
        );
        (req, plan, index)
    }

    /// The decider's answer to a check of `s`: every limit applied, `exceeded` naming
    /// which are over (with their waits).
    fn fill_with(exceeded: &[(&str, u64)]) -> (CheckResponse, Decision) {
        let rules = rules();
        let (req, plan, index) = planned(&rules);
        let limits = index
            .iter()
            .map(|&i| {
                let wait = exceeded
                    .iter()
                    .find(|(n, _)| *n == req.scene.limits[i].name)
                    .map(|(_, ms)| *ms);
                LimitValue {
                    applies: true,
                    max: req.scene.limits[i].max,
                    state: LimitState {
                        count: req.scene.limits[i].max,
                        exceeded: wait.is_some(),
                        retry_after_ms: wait.unwrap_or(0),
                    },
                }
            })
            .collect();
        let outcome = if exceeded.is_empty() {
            Outcome::Allowed { limits }
        } else {
            Outcome::Denied { limits }
        };
        let judged = Decided::Judged(Judgement {
            facts: Facts::default(),
            signals: Vec::new(),
            score: 0.0,
            outcome,
        });
        let mut resp = CheckResponse::allow("s", "r1", &rules.version);
        let decision = fill(&mut resp, &req.scene, &plan, &index, judged);
        (resp, decision)
    }

    #[test]
    fn the_limits_decide_security_first_then_the_business_limit_that_clears_last() {
        let (resp, d) = fill_with(&[]);
        assert_eq!(d, Decision::Allow);
        assert_eq!(resp.limits.len(), 3);

        let (_, d) = fill_with(&[("user_10s", 4_000), ("user_1m", 50_000)]);
        let Decision::FriendlyDeny(deny) = d else {
            panic!("a business limit denies friendly: {d:?}");
        };
        assert_eq!(deny.reason, Reason::Limit("user_1m".into()));
        assert_eq!(deny.layer(), Layer::Business);
        assert_eq!(deny.retry_after_ms, 50_000);
        assert_eq!(deny.message.as_deref(), Some("Agotado"));
        assert_eq!(
            deny.rate_limit,
            Some(RateLimitInfo {
                name: "user_1m".into(),
                quota: 3,
                window_s: 60,
                remaining: 0,
                reset_s: 50,
            })
        );

        let (_, d) = fill_with(&[("user_10s", 4_000), ("ip_burst", 500)]);
        assert_eq!(d, Decision::silent(Reason::Limit("ip_burst".into())));
        assert_eq!(d.layer(), Some(Layer::Security));
    }

    #[test]
    fn a_score_deny_is_silent_and_a_repeat_is_an_allow() {
        let rules = rules();
        let body = json!({"scene": "s", "user_id": "u", "ip": "192.0.2.1"});
        let req = request::parse_check(&rules, &body, 0).unwrap();
        let (plan, index) = plan::plan(
            &crate::keys::KeyPrefix::plain("lt"),
            &rules,
            &req,
            crate::config::DEFAULT_RECORD_HORIZON_MS,
        );
        let mut resp = CheckResponse::allow("s", "r1", "v");
        let score = Decided::Judged(Judgement {
            facts: Facts::default(),
            signals: Vec::new(),
            score: 1.0,
            outcome: Outcome::ScoreDeny,
        });
        let d = fill(&mut resp, &req.scene, &plan, &index, score);
        assert_eq!(d, Decision::silent(Reason::Score));
        let repeat = Decided::Duplicate { of: "r0".into() };
        let d = fill(&mut resp, &req.scene, &plan, &index, repeat);
        assert_eq!(d, Decision::Allow);
        assert_eq!(resp.duplicate_of.as_deref(), Some("r0"));
    }

    fn with(decision: Decision) -> CheckResponse {
        let mut r = CheckResponse::allow("s", "r1", "v1");
        r.decision = decision;
        r
    }

    fn business_deny() -> Decision {
        Decision::FriendlyDeny(FriendlyDeny {
            reason: Reason::Limit("user_10s".into()),
            message: Some("Agotado".into()),
            retry_after_ms: 8000,
            rate_limit: None,
        })
    }

    #[test]
    fn the_body_keeps_the_field_order_and_names_of_the_contract() {
        let body = serde_json::to_string(&with(business_deny())).unwrap();
        assert_eq!(
            body,
            r#"{"decision":"friendly_deny","request_id":"r1","scene":"s","rules_version":"v1","layer":"business","reason":"user_10s","message":"Agotado","retry_after_ms":8000,"challenge":null,"score":0.0,"degraded":false,"duplicate_of":null,"limits":[],"signals":[],"trust":{"points":0}}"#
        );
        let allow = serde_json::to_value(with(Decision::Allow)).unwrap();
        for field in ["layer", "reason", "message", "retry_after_ms", "challenge"] {
            assert_eq!(allow[field], Value::Null, "{field}");
        }
    }

    #[test]
    fn each_decision_names_its_verdict_layer_and_reason() {
        let silent = |r| with(Decision::silent(r));
        let friendly = |r| {
            with(Decision::FriendlyDeny(FriendlyDeny {
                reason: r,
                message: None,
                retry_after_ms: 1,
                rate_limit: None,
            }))
        };
        let cases = [
            (with(Decision::Allow), "allow", Value::Null, Value::Null),
            (
                with(business_deny()),
                "friendly_deny",
                json!("business"),
                json!("user_10s"),
            ),
            (
                friendly(Reason::GatewayRate),
                "friendly_deny",
                json!("resource"),
                json!("gateway_rate"),
            ),
            (
                friendly(Reason::StoreUnavailable),
                "friendly_deny",
                json!("resource"),
                json!("store_unavailable"),
            ),
            (
                silent(Reason::Limit("ip_burst".into())),
                "silent_deny",
                json!("security"),
                json!("ip_burst"),
            ),
            (
                silent(Reason::Score),
                "silent_deny",
                json!("security"),
                json!("score"),
            ),
            (
                silent(Reason::InvalidDeviceId),
                "silent_deny",
                json!("security"),
                json!("invalid_device_id"),
            ),
            (
                with(challenge()),
                "challenge",
                json!("security"),
                json!("score"),
            ),
        ];
        for (resp, decision, layer, reason) in cases {
            let body = serde_json::to_value(&resp).unwrap();
            assert_eq!(body["decision"], json!(decision), "{body}");
            assert_eq!(body["layer"], layer, "{body}");
            assert_eq!(body["reason"], reason, "{body}");
            if matches!(
                resp.decision.verdict(),
                Verdict::Allow | Verdict::SilentDeny
            ) {
                // A silent deny tells nothing an allow would not.
                assert_eq!(body["message"], Value::Null, "{body}");
                assert_eq!(body["retry_after_ms"], Value::Null, "{body}");
            }
        }
    }

    fn challenge() -> Decision {
        Decision::Challenge {
            reason: Reason::Score,
            ask: ChallengeAsk {
                kind: "captcha".into(),
                message: Some("Confirma que eres tú".into()),
            },
        }
    }

    #[test]
    fn a_challenge_says_what_to_ask_and_nothing_of_a_deny() {
        let body = serde_json::to_value(with(challenge())).unwrap();
        assert_eq!(
            body["challenge"],
            json!({"kind": "captcha", "message": "Confirma que eres tú"})
        );
        assert_eq!(body["message"], json!("Confirma que eres tú"));
        assert_eq!(body["retry_after_ms"], Value::Null);
        assert_eq!(body["duplicate_of"], Value::Null);
        let deny = serde_json::to_value(with(business_deny())).unwrap();
        assert_eq!(deny["challenge"], Value::Null);
    }

    #[test]
    fn a_challenged_outcome_is_a_challenge_unless_a_limit_is_full() {
        let rules = crate::rules::compile_files(&[(
            "r.toml".into(),
            format!(
                "{RULES}\n[scene.s.score]\nweights = {{}}\nsilent_deny_at = 0.7\nchallenge_at = 0.4\n[scene.s.challenge]\nkind = \"sms\"\npass_ttl = \"30m\"\n"
            ),
        )])
        .unwrap();
        let (req, plan, index) = planned(&rules);
        let judged = |outcome| {
            Decided::Judged(Judgement {
                facts: Facts::default(),
                signals: Vec::new(),
                score: 0.5,
                outcome,
            })
        };
        let room = |exceeded: bool| -> Vec<LimitValue> {
            index
                .iter()
                .map(|&i| LimitValue {
                    applies: true,
                    max: req.scene.limits[i].max,
                    state: LimitState {
                        count: 0,
                        exceeded: exceeded && i == 0,
                        retry_after_ms: if exceeded && i == 0 { 5_000 } else { 0 },
                    },
                })
                .collect()
        };
        let mut resp = CheckResponse::allow("s", "r1", &rules.version);
        let d = fill(
            &mut resp,
            &req.scene,
            &plan,
            &index,
            judged(Outcome::Challenged {
                limits: room(false),
            }),
        );
        assert_eq!(
            d,
            Decision::Challenge {
                reason: Reason::Score,
                ask: ChallengeAsk {
                    kind: "sms".into(),
                    message: None
                }
            }
        );
        assert_eq!(resp.limits.len(), 3, "the limits are reported");
        let d = fill(
            &mut resp,
            &req.scene,
            &plan,
            &index,
            judged(Outcome::Denied { limits: room(true) }),
        );
        assert_eq!(d.verdict(), Verdict::FriendlyDeny);
    }

    #[test]
    fn the_schema_documents_exactly_the_body() {
        let schema = serde_json::to_value(<CheckResponse as PartialSchema>::schema()).unwrap();
        let mut documented: Vec<&str> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let body = serde_json::to_value(with(business_deny())).unwrap();
        let mut sent: Vec<&str> = body
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        // Sent only in a dry run's answer.
        assert!(!sent.contains(&"dry_run"));
        sent.push("dry_run");
        documented.sort_unstable();
        sent.sort_unstable();
        assert_eq!(documented, sent);
        assert_eq!(<CheckResponse as ToSchema>::name(), "CheckResponse");
    }
}
