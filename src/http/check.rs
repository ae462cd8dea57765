//! `/v1/check` and `/v1/refund`. [`respond`] is the one place a check's [`Decision`]
//! becomes HTTP: status, headers and body.
//!
//! A silent deny is a 200 with no header an allow would not have: the backend reads the
//! body, the abuser sees success. A friendly deny is a 429 (or 503 when the store is down
//! and the scene fails closed) with `Retry-After` in whole seconds and, for a limit, the
//! IETF httpapi `RateLimit-Policy` / `RateLimit` headers (structured-field form of
//! draft-ietf-httpapi-ratelimit-headers: `"name";q=QUOTA;w=WINDOW_S` and
//! `"name";r=REMAINING;t=RESET_S`).

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::errors::ApiError;
use super::AppState;
use crate::check::decision::{ceil_secs, CheckResponse, Decision, Reason};

/// `POST /v1/check` request body (documentation; the handler validates field by field).
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckBody {
    /// A scene of the current rule set.
    pub scene: String,
    /// 1-64 of `[A-Za-z0-9_-]`; a ULID is made when absent. The same id twice counts once.
    pub request_id: Option<String>,
    pub user_id: Option<String>,
    pub device_id: Option<String>,
    /// IPv4 or IPv6 text.
    pub ip: Option<String>,
    pub activity_id: Option<String>,
    /// Attributes declared in the rule set's `[attributes]` (string values matching
    /// their patterns), usable as `attr.NAME` dimensions.
    pub attrs: Option<std::collections::BTreeMap<String, String>>,
    /// A retry with the same key consumes no further quota.
    pub idempotency_key: Option<String>,
    /// RFC 3339.
    pub user_created_at: Option<String>,
    /// Decide, but record nothing.
    pub dry_run: Option<bool>,
}

/// `POST /v1/refund` request body.
#[derive(Debug, Serialize, ToSchema)]
pub struct RefundBody {
    pub scene: String,
    pub request_id: String,
    pub user_id: Option<String>,
    pub device_id: Option<String>,
    pub ip: Option<String>,
    pub activity_id: Option<String>,
}

/// `POST /v1/refund` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct RefundAnswer {
    /// False when the request was never counted, has expired, or was refunded already.
    pub refunded: bool,
}

/// Decide one action.
#[utoipa::path(
    post, path = "/v1/check", request_body = CheckBody,
    responses(
        (status = 200, description = "allow or silent_deny", body = CheckResponse),
        (status = 429, description = "friendly_deny by a business limit or the gateway", body = CheckResponse),
        (status = 503, description = "friendly_deny: store unavailable and the scene fails closed", body = CheckResponse),
        (status = 400, description = "invalid request", body = super::errors::ErrorBody),
        (status = 401, description = "check token missing or wrong", body = super::errors::ErrorBody),
        (status = 413, description = "body over 64 KiB", body = super::errors::ErrorBody),
        (status = 415, description = "not JSON", body = super::errors::ErrorBody),
    )
)]
pub async fn check(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    super::auth::require_check(&req, &state.auth.check_token)?;
    let rules = state.rules.current();
    let resp = state.checker.check(&rules, &body).await?;
    if let Some(recording) = &state.recording {
        recording.check(&body, &resp);
    }
    if let Some(log) = &state.decision_log {
        log.write(&body, &resp);
    }
    Ok(respond(&resp))
}

/// Give back a request's quota.
#[utoipa::path(
    post, path = "/v1/refund", request_body = RefundBody,
    responses(
        (status = 200, body = RefundAnswer),
        (status = 400, body = super::errors::ErrorBody),
        (status = 401, description = "admin token missing or wrong (or, without one, a non-loopback peer)", body = super::errors::ErrorBody),
        (status = 503, description = "store unavailable", body = super::errors::ErrorBody),
    )
)]
pub async fn refund(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    super::auth::require_admin(&req, &state.auth.admin_token)?;
    let rules = state.rules.current();
    let refunded = state.refunds.refund(&rules, &body).await??;
    Ok(HttpResponse::Ok().json(RefundAnswer { refunded }))
}

/// The one place a check's answer becomes HTTP: status and headers from the decision,
/// the body (the same shape for every decision) from the whole response.
pub fn respond(resp: &CheckResponse) -> HttpResponse {
    let deny = match &resp.decision {
        Decision::Allow | Decision::SilentDeny { .. } => return HttpResponse::Ok().json(resp),
        Decision::FriendlyDeny(deny) => deny,
    };
    // A store that cannot answer is the service's trouble, not the client's rate: 503.
    let status = match deny.reason {
        Reason::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        Reason::Limit(_) | Reason::GatewayRate | Reason::Score | Reason::InvalidDeviceId => {
            StatusCode::TOO_MANY_REQUESTS
        }
    };
    let mut http = HttpResponse::build(status);
    http.insert_header(("Retry-After", ceil_secs(deny.retry_after_ms).to_string()));
    if let Some(rl) = &deny.rate_limit {
        http.insert_header((
            "RateLimit-Policy",
            format!("\"{}\";q={};w={}", rl.name, rl.quota, rl.window_s),
        ));
        http.insert_header((
            "RateLimit",
            format!("\"{}\";r={};t={}", rl.name, rl.remaining, rl.reset_s),
        ));
    }
    http.json(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::decision::{FriendlyDeny, RateLimitInfo};
    use actix_web::http::header::HeaderMap;

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
