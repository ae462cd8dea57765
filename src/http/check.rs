//! `/v1/check` and `/v1/refund`: the status and headers of each decision.
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
use crate::check::decision::{ceil_secs, reason, CheckResponse, Verdict};

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

/// Status and headers for a decision.
pub fn respond(resp: &CheckResponse) -> HttpResponse {
    match resp.decision {
        Verdict::Allow | Verdict::SilentDeny => HttpResponse::Ok().json(resp),
        Verdict::FriendlyDeny => {
            let store_down = resp.reason.as_deref() == Some(reason::STORE_UNAVAILABLE);
            let status = if store_down {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            let mut http = HttpResponse::build(status);
            let retry_s = ceil_secs(resp.retry_after_ms.unwrap_or(1000));
            http.insert_header(("Retry-After", retry_s.to_string()));
            if let Some(rl) = &resp.rate_limit {
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
    }
}
