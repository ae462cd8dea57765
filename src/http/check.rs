//! `/v1/check` and `/v1/refund`. [`respond`] is the one place a check's [`Decision`]
//! becomes HTTP: status, headers and body.
//!
//! A silent deny is a 200 with no header an allow would not have: the backend reads the
//! body, the abuser sees success. A friendly deny is a 429 (or 503 when the store is down
//! and the scene fails closed) with `Retry-After` in whole seconds and, for a limit, the
//! IETF httpapi `RateLimit-Policy` / `RateLimit` headers (structured-field form of
//! draft-ietf-httpapi-ratelimit-headers: `"name";q=QUOTA;w=WINDOW_S` and
//! `"name";r=REMAINING;t=RESET_S`).

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use super::errors::{ApiError, ErrorBody};
use super::AppState;
use crate::check::body::RawCheck;
use crate::check::decision::{ceil_secs, CheckResponse, Decision, Reason};
use crate::input::MAX_ID_LEN;
use crate::strict_json::StrictJson;

/// An id (`user_id`, `activity_id`, `idempotency_key`, an attribute value): a string of 1 to
/// [`MAX_ID_LEN`] characters, or an integer (many backends keep numeric user ids; `10086`
/// and `"10086"` are one user). Documentation of what `crate::input` reads.
pub struct Id;

impl PartialSchema for Id {
    fn schema() -> RefOr<Schema> {
        string_or_integer(Some(MAX_ID_LEN))
    }
}

impl ToSchema for Id {}

/// A device id: like [`Id`] but unbounded. A device id that fails the rule set's
/// `[validation]` pattern, or is absurdly long, is forged: a silent deny, not a 400.
pub struct DeviceId;

impl PartialSchema for DeviceId {
    fn schema() -> RefOr<Schema> {
        string_or_integer(None)
    }
}

impl ToSchema for DeviceId {}

/// A string of 1 to `max_len` characters, or an integer in the range JSON numbers take
/// without loss (`i64` and `u64`): the service refuses a fraction or a larger number.
fn string_or_integer(max_len: Option<usize>) -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(max_len),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(isize::MIN))
                .maximum(Some(usize::MAX)),
        )
        .into()
}

/// An IP address: IPv4 or IPv6 text (`::ffff:1.2.3.4` counts as `1.2.3.4`; an IPv6
/// address counts as its /64, `[network] ipv6_ip_prefix`).
pub struct IpText;

impl PartialSchema for IpText {
    fn schema() -> RefOr<Schema> {
        let ip = |format: &str| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::Custom(format.into())))
        };
        OneOfBuilder::new().item(ip("ipv4")).item(ip("ipv6")).into()
    }
}

impl ToSchema for IpText {}

/// A request id: 1 to 64 of `[A-Za-z0-9_-]`, as `crate::input::request_id` takes it (a
/// test holds the two together).
pub struct RequestId;

/// [`RequestId`]'s pattern.
const REQUEST_ID_PATTERN: &str = "^[A-Za-z0-9_-]{1,64}$";

impl PartialSchema for RequestId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(REQUEST_ID_PATTERN))
            .into()
    }
}

impl ToSchema for RequestId {}

/// `Retry-After`: whole seconds, at least 1.
pub struct RetryAfterSeconds;

impl PartialSchema for RetryAfterSeconds {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(1))
            .into()
    }
}

impl ToSchema for RetryAfterSeconds {}

/// `RateLimit-Policy` as [`respond`] writes it.
pub struct RateLimitPolicy;

impl PartialSchema for RateLimitPolicy {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^\"[^\"]+\";q=[0-9]+;w=[0-9]+$"))
            .into()
    }
}

impl ToSchema for RateLimitPolicy {}

/// `RateLimit` as [`respond`] writes it.
pub struct RateLimitState;

impl PartialSchema for RateLimitState {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^\"[^\"]+\";r=[0-9]+;t=[0-9]+$"))
            .into()
    }
}

impl ToSchema for RateLimitState {}

// Documentation of what `check::request` reads field by field (the handler takes any JSON
// and names the field it refuses).
/// A `POST /v1/check` body. `/openapi.json` narrows it to the rule set in force: `scene`
/// to its scenes, and per scene the dimensions it requires, `attrs` to the declared
/// attributes.
#[derive(Debug, Serialize, ToSchema)]
// The service refuses a field this body does not name (a misspelt `dryRun` must not
// record a real request): `additionalProperties: false`.
#[serde(deny_unknown_fields)]
pub struct CheckBody {
    /// A scene of the current rule set.
    pub scene: String,
    /// A ULID is made when absent. The same id twice counts once.
    #[schema(value_type = Option<RequestId>)]
    pub request_id: Option<String>,
    #[schema(value_type = Option<Id>)]
    pub user_id: Option<String>,
    #[schema(value_type = Option<DeviceId>)]
    pub device_id: Option<String>,
    #[schema(value_type = Option<IpText>)]
    pub ip: Option<String>,
    #[schema(value_type = Option<Id>)]
    pub activity_id: Option<String>,
    /// Attributes declared in the rule set's `[attributes]` (values matching their
    /// patterns), usable as `attr.NAME` dimensions.
    #[schema(value_type = Option<std::collections::BTreeMap<String, Id>>)]
    pub attrs: Option<std::collections::BTreeMap<String, String>>,
    /// A retry with the same key consumes no further quota (`duplicate_of` names the
    /// first request).
    #[schema(value_type = Option<Id>)]
    pub idempotency_key: Option<String>,
    /// When the account was created, from the backend's own records. Like every field
    /// here it is trusted input: never forward it from a client. When absent, the first
    /// time the service saw the user stands in (for `new_account`).
    #[schema(format = DateTime)]
    pub user_created_at: Option<String>,
    /// Decide, but record nothing: the answer carries `"dry_run": true`. A dry run looks
    /// at the scene's gateway bucket without taking a token, so it meets the
    /// `gateway_rate` deny a real check would meet now.
    pub dry_run: Option<bool>,
}

/// `POST /v1/refund` request body: the check's scene, request id and dimension values
/// (they name the keys the request counted in). Other fields are ignored. `/openapi.json`
/// narrows it to the rule set in force, as [`CheckBody`].
#[derive(Debug, Serialize, ToSchema)]
pub struct RefundBody {
    pub scene: String,
    #[schema(value_type = RequestId)]
    pub request_id: String,
    #[schema(value_type = Option<Id>)]
    pub user_id: Option<String>,
    #[schema(value_type = Option<DeviceId>)]
    pub device_id: Option<String>,
    #[schema(value_type = Option<IpText>)]
    pub ip: Option<String>,
    #[schema(value_type = Option<Id>)]
    pub activity_id: Option<String>,
    #[schema(value_type = Option<std::collections::BTreeMap<String, Id>>)]
    pub attrs: Option<std::collections::BTreeMap<String, String>>,
}

/// `POST /v1/refund` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct RefundAnswer {
    /// Some limit gave the request back. False when the request was never counted, has
    /// expired, or was refunded already.
    pub refunded: bool,
    /// The scene's limits whose key gave the request back.
    pub given_back: Vec<String>,
    /// The scene's limits whose key held nothing of the request: a dimension value the
    /// check did not carry (a wrong `device_id`: the user's limits are given back, the
    /// device's are listed here), a limit whose `where` the request did not match, a
    /// sliding window that has moved past it, or an earlier refund. A refund naming the
    /// right values gives back what is left.
    pub held_nothing: Vec<String>,
}

impl From<crate::refund::RefundReport> for RefundAnswer {
    fn from(r: crate::refund::RefundReport) -> Self {
        RefundAnswer {
            refunded: r.refunded,
            given_back: r.given_back,
            held_nothing: r.held_nothing,
        }
    }
}

/// Decide one action.
#[utoipa::path(
    post, path = "/v1/check", request_body = CheckBody,
    security(("check_token" = [])),
    responses(
        (status = 200, description = "allow, or silent_deny (nothing on the wire tells the two apart; only the body's `decision` does)", body = CheckResponse),
        (status = 403, description = "challenge: the score is in the scene's challenge band and no reported pass lifts it. The backend must verify the person (`challenge.kind`: captcha, sms…), report `challenge_passed` on `/v1/events`, and send the claim again; nothing was consumed or recorded, so the same claim under the same `idempotency_key` is decided anew", body = CheckResponse),
        (status = 429, description = "friendly_deny by a business limit or the scene's gateway bucket", body = CheckResponse, headers(
            ("Retry-After" = RetryAfterSeconds, description = "whole seconds until every exceeded limit admits again, at least 1"),
            ("RateLimit-Policy" = RateLimitPolicy, description = "the limit that denied (IETF httpapi draft): `\"name\";q=QUOTA;w=WINDOW_S`"),
            ("RateLimit" = RateLimitState, description = "its state: `\"name\";r=REMAINING;t=RESET_S`"),
        )),
        (status = 503, description = "friendly_deny: the store cannot answer and the scene fails closed (`reason: store_unavailable`)", body = CheckResponse, headers(
            ("Retry-After" = RetryAfterSeconds, description = "whole seconds, at least 1"),
        )),
        (status = 400, description = "invalid request: `invalid_json` (a key named twice in one object among them), `unknown_scene`, `missing_dimension`, `invalid_field` (`field` names it)", body = ErrorBody),
        (status = 401, description = "check token missing or wrong (only when the service has a check token)", body = ErrorBody, headers(
            ("WWW-Authenticate" = String, description = "`Bearer`"),
        )),
        (status = 413, description = "body over 64 KiB", body = ErrorBody),
        (status = 415, description = "the body is not `application/json`", body = ErrorBody),
    )
)]
pub async fn check(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<RawCheck>,
) -> Result<HttpResponse, ApiError> {
    super::auth::require_check(&req, &state.auth.check_token)?;
    let rules = state.rules.current();
    let resp = state.checker.check(&rules, &*body).await?;
    // What the caller sent, as JSON, only for the sinks that keep it.
    if state.recording.is_some() || state.decision_log.is_some() {
        let sent = body.to_value();
        if let Some(recording) = &state.recording {
            recording.check(&sent, &resp);
        }
        if let Some(log) = &state.decision_log {
            log.write(&sent, &resp);
        }
    }
    Ok(respond(&resp))
}

/// Give back a request's quota in every key it counted in (admin).
#[utoipa::path(
    post, path = "/v1/refund", request_body = RefundBody,
    security(("admin_token" = [])),
    responses(
        (status = 200, body = RefundAnswer, description = "the request's quota is given back in every limit listed in `given_back` (none: `refunded: false`); `held_nothing` lists the limits that held nothing of it"),
        (status = 400, description = "invalid request (`field` names it); a key named twice in one object is `invalid_json`", body = ErrorBody),
        (status = 401, description = "admin token missing or wrong (or, without one, a non-loopback peer)", body = ErrorBody, headers(
            ("WWW-Authenticate" = String, description = "`Bearer`"),
        )),
        (status = 413, description = "body over 64 KiB", body = ErrorBody),
        (status = 415, description = "the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "the store cannot answer; nothing was refunded", body = ErrorBody, headers(
            ("Retry-After" = RetryAfterSeconds, description = "whole seconds, at least 1"),
        )),
    )
)]
pub async fn refund(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<StrictJson>,
) -> Result<HttpResponse, ApiError> {
    super::auth::require_admin(&req, &state.auth.admin_token)?;
    let rules = state.rules.current();
    let report = state.refunds.refund(&rules, &body).await??;
    Ok(HttpResponse::Ok().json(RefundAnswer::from(report)))
}

/// The one place a check's answer becomes HTTP: status and headers from the decision,
/// the body (the same shape for every decision) from the whole response.
pub fn respond(resp: &CheckResponse) -> HttpResponse {
    let deny = match &resp.decision {
        Decision::Allow | Decision::SilentDeny { .. } => return json(HttpResponse::Ok(), resp),
        // A backend that reads only the status refuses: safe.
        Decision::Challenge { .. } => return json(HttpResponse::Forbidden(), resp),
        Decision::FriendlyDeny(deny) => deny,
    };
    // A store that cannot answer is the service's trouble, not the client's rate: 503.
    let status = match deny.reason {
        Reason::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::Limit(_)
        | Reason::GatewayRate
        | Reason::Score
        | Reason::InvalidDeviceId
        | Reason::InFlight => StatusCode::TOO_MANY_REQUESTS,
    };
    let mut http = HttpResponse::build(status);
    http.insert_header((
        RETRY_AFTER,
        HeaderValue::from(ceil_secs(deny.retry_after_ms)),
    ));
    if let Some(rl) = &deny.rate_limit {
        // A limit name is a rule identifier; one that could not be a header value is left
        // out rather than failing the answer.
        if let Some(v) = item(&rl.name, ";q=", rl.quota, ";w=", rl.window_s) {
            http.insert_header((RATELIMIT_POLICY, v));
        }
        if let Some(v) = item(&rl.name, ";r=", rl.remaining, ";t=", rl.reset_s) {
            http.insert_header((RATELIMIT, v));
        }
    }
    json(http, resp)
}

const RETRY_AFTER: HeaderName = actix_web::http::header::RETRY_AFTER;
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// One structured-field item of the ratelimit headers, `"name";a=1;b=2`, written into one
/// buffer.
fn item(name: &str, a: &str, x: u64, b: &str, y: u64) -> Option<HeaderValue> {
    let mut n = itoa::Buffer::new();
    let mut v = Vec::with_capacity(name.len() + 32);
    v.push(b'"');
    v.extend_from_slice(name.as_bytes());
    v.push(b'"');
    v.extend_from_slice(a.as_bytes());
    v.extend_from_slice(n.format(x).as_bytes());
    v.extend_from_slice(b.as_bytes());
    v.extend_from_slice(n.format(y).as_bytes());
    HeaderValue::from_bytes(&v).ok()
}

/// Room for an answer, so serialising it does not regrow the buffer (actix's `json` starts
/// from an empty String): the fixed fields (with the 64-digit rules version), then about
/// what each limit and signal takes (the bench scene's four limits answer in 818 bytes).
fn answer_capacity(resp: &CheckResponse) -> usize {
    320 + 160 * resp.limits.len() + 112 * resp.signals.len()
}

/// `HttpResponseBuilder::json`, written once into a buffer sized for an answer.
fn json(mut http: actix_web::HttpResponseBuilder, resp: &CheckResponse) -> HttpResponse {
    let mut body = Vec::with_capacity(answer_capacity(resp));
    match serde_json::to_writer(&mut body, resp) {
        Ok(()) => http
            .content_type(actix_web::http::header::ContentType::json())
            .body(body),
        Err(e) => HttpResponse::from_error(actix_web::error::JsonPayloadError::Serialize(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::decision::{FriendlyDeny, RateLimitInfo};
    use actix_web::http::header::HeaderMap;
    use serde_json::Value;

    fn respond_to(decision: Decision) -> (StatusCode, HeaderMap, Value) {
        let mut resp = CheckResponse::allow("s", "r1", "v1");
        resp.decision = decision;
        let http = respond(&resp);
        let status = http.status();
        let headers = http.headers().clone();
        let body = ready(actix_web::body::to_bytes(http.into_body())).unwrap();
        (status, headers, serde_json::from_slice(&body).unwrap())
    }

    /// `to_bytes` on a complete body is ready at once; no runtime needed to poll it.
    fn ready<F: std::future::Future>(f: F) -> F::Output {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => out,
            std::task::Poll::Pending => panic!("a complete body is ready at once"),
        }
    }

    fn friendly(reason: Reason, rate_limit: Option<RateLimitInfo>) -> Decision {
        Decision::FriendlyDeny(FriendlyDeny {
            reason,
            message: Some("Agotado".into()),
            retry_after_ms: 8_001,
            rate_limit,
        })
    }

    fn header<'h>(headers: &'h HeaderMap, name: &str) -> &'h str {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    fn names(headers: &HeaderMap) -> Vec<String> {
        let mut names: Vec<String> = headers.keys().map(|k| k.as_str().to_string()).collect();
        names.sort();
        names
    }

    /// The bench scene's answer (four limits, a 64-digit rules version, a service-made id)
    /// fits the buffer it is written into.
    #[test]
    fn an_answer_fits_its_buffer() {
        let mut resp = CheckResponse::allow("bench", "01M9596E7R46HWFPEQAYEMVJSN", &"8".repeat(64));
        for (name, key, max, window_ms) in [
            ("user_10s", "lt:bench:uid:u100000", 3, 10_000),
            ("device_1d", "lt:bench:did:dev00100000", 10, 86_400_000),
            ("ip_60s", "lt:bench:fw:ip_60s:ip:10.39.249.250", 100, 60_000),
            (
                "activity_60s",
                "lt:bench:fw:activity_60s:aid:a1",
                100_000_000,
                60_000,
            ),
        ] {
            resp.limits.push(crate::check::decision::LimitReport {
                name: name.into(),
                key: key.into(),
                count: 1,
                max,
                remaining: max - 1,
                window_ms,
                exceeded: false,
            });
        }
        let body = serde_json::to_vec(&resp).unwrap();
        assert!(
            body.len() <= answer_capacity(&resp),
            "{} bytes, room for {}",
            body.len(),
            answer_capacity(&resp)
        );
    }

    #[test]
    fn the_documented_request_id_pattern_is_the_one_the_service_checks() {
        let pattern = regex::Regex::new(REQUEST_ID_PATTERN).unwrap();
        let long = "a".repeat(64);
        let too_long = "a".repeat(65);
        for id in [
            "01JX",
            "a_b-C9",
            &long,
            &too_long,
            "",
            "has space",
            "ü",
            "a:b",
            "a\nb",
        ] {
            let body = serde_json::json!({ "request_id": id });
            let taken = crate::input::request_id(body.as_object().unwrap(), 0).is_ok();
            assert_eq!(pattern.is_match(id), taken, "{id:?}");
        }
    }

    #[test]
    fn an_allow_and_a_silent_deny_look_the_same_on_the_wire() {
        let (status, allow_headers, body) = respond_to(Decision::Allow);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["decision"], "allow");
        for reason in [
            Reason::Limit("ip_burst".into()),
            Reason::Score,
            Reason::InvalidDeviceId,
        ] {
            let (status, headers, body) = respond_to(Decision::silent(reason.clone()));
            assert_eq!(status, StatusCode::OK, "{reason:?}");
            assert_eq!(names(&headers), names(&allow_headers), "{reason:?}");
            assert_eq!(body["decision"], "silent_deny");
            assert_eq!(body["reason"], reason.name());
        }
    }

    #[test]
    fn a_challenge_is_a_403_without_retry_headers() {
        let (status, headers, body) = respond_to(Decision::Challenge {
            reason: Reason::Score,
            ask: crate::check::decision::ChallengeAsk {
                kind: "captcha".into(),
                message: None,
            },
        });
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(headers.get("retry-after").is_none());
        assert_eq!(body["decision"], "challenge");
        assert_eq!(body["layer"], "security");
        assert_eq!(body["challenge"]["kind"], "captcha");
    }

    #[test]
    fn a_limit_or_gateway_deny_is_a_429_with_retry_after_and_the_ratelimit_headers() {
        for (reason, name) in [
            (Reason::Limit("user_10s".into()), "user_10s"),
            (Reason::GatewayRate, "gateway_rate"),
        ] {
            let rl = RateLimitInfo {
                name: name.into(),
                quota: 1,
                window_s: 10,
                remaining: 0,
                reset_s: 9,
            };
            let (status, headers, body) = respond_to(friendly(reason, Some(rl)));
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{name}");
            // 8001 ms is 9 whole seconds, rounded up.
            assert_eq!(header(&headers, "retry-after"), "9");
            assert_eq!(
                header(&headers, "ratelimit-policy"),
                format!("\"{name}\";q=1;w=10").as_str()
            );
            assert_eq!(
                header(&headers, "ratelimit"),
                format!("\"{name}\";r=0;t=9").as_str()
            );
            assert_eq!(body["reason"], name);
            assert_eq!(body["retry_after_ms"], 8_001);
            assert_eq!(body["message"], "Agotado");
        }
    }

    #[test]
    fn a_store_unavailable_deny_is_a_503_with_retry_after_only() {
        let (status, headers, body) = respond_to(friendly(Reason::StoreUnavailable, None));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&headers, "retry-after"), "9");
        assert!(!headers.contains_key("ratelimit"));
        assert!(!headers.contains_key("ratelimit-policy"));
        assert_eq!(body["decision"], "friendly_deny");
        assert_eq!(body["layer"], "resource");
        assert_eq!(body["reason"], "store_unavailable");
    }
}
