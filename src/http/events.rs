//! `POST /v1/events` and `GET /v1/trust/{user_id}`: the admin surface of trust.
//!
//! Both need the admin token (or, without one, a loopback peer): a forged payment event is
//! free trust points, a forged rollback is free quota.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::errors::ApiError;
use super::AppState;
use crate::clock::rfc3339;
use crate::input::{RequestError, MAX_ID_LEN};
use crate::trust::{Award, IngestReport, TrustView};

/// The largest body `/v1/events` reads: a full batch of 1000 rollbacks carrying their
/// dimension values fits with room to spare.
pub const MAX_EVENTS_BODY: usize = 1024 * 1024;

/// One event of `POST /v1/events` (documentation; the handler validates field by field).
/// The body is one such object, or `{"events": [...]}` with 1 to 1000 of them.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventBody {
    /// 1-128 bytes; an id seen before is counted once.
    pub event_id: String,
    /// `payment_succeeded`, `identity_verified` or `benefit_rolled_back`.
    #[serde(rename = "type")]
    pub kind: String,
    /// String or integer; required for the two trust types.
    pub user_id: Option<String>,
    /// RFC 3339.
    pub occurred_at: String,
    /// `benefit_rolled_back`: the scene of the check to refund.
    pub scene: Option<String>,
    /// `benefit_rolled_back`: the request to refund (with the check's dimension values).
    pub request_id: Option<String>,
}

/// One unexpired award.
#[derive(Debug, Serialize, ToSchema)]
pub struct AwardAnswer {
    pub event_id: String,
    /// `payment_succeeded` or `identity_verified`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub points: u32,
    /// RFC 3339.
    pub expires_at: String,
}

/// `GET /v1/trust/{user_id}` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct TrustAnswer {
    pub user_id: String,
    /// `raw_points` capped by `[trust].max_points` (0 without `[trust]`).
    pub points: u32,
    /// Sum of the unexpired awards.
    pub raw_points: u32,
    pub max_points: u32,
    /// Oldest expiry first.
    pub awards: Vec<AwardAnswer>,
    /// RFC 3339; null when the service never saw the user in a check.
    pub first_seen: Option<String>,
    /// Events this node accepted and has not applied yet (all users): non-zero while the
    /// store is down.
    pub pending_events: usize,
}

impl From<TrustView> for TrustAnswer {
    fn from(v: TrustView) -> Self {
        TrustAnswer {
            user_id: v.user_id,
            points: v.points,
            raw_points: v.raw_points,
            max_points: v.max_points,
            awards: v
                .awards
                .into_iter()
                .map(|a: Award| AwardAnswer {
                    event_id: a.event_id,
                    kind: a.kind.name(),
                    points: a.points,
                    expires_at: rfc3339(a.expires_at_ms),
                })
                .collect(),
            first_seen: v.first_seen_ms.map(rfc3339),
            pending_events: v.pending_events,
        }
    }
}

/// Take trust events; 202 once they are durable.
#[utoipa::path(
    post, path = "/v1/events", request_body = EventBody,
    responses(
        (status = 202, description = "journaled durably (applied now, or as soon as the store answers)", body = IngestReport),
        (status = 400, description = "an invalid event: the whole body is refused; `field` names it (`events[3].user_id`)", body = super::errors::ErrorBody),
        (status = 401, description = "admin token missing or wrong (or, without one, a non-loopback peer)", body = super::errors::ErrorBody),
        (status = 413, description = "body over 1 MiB", body = super::errors::ErrorBody),
        (status = 500, description = "the journal cannot write: nothing was taken", body = super::errors::ErrorBody),
    )
)]
pub async fn ingest(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<serde_json::Value>,
) -> Result<HttpResponse, ApiError> {
    super::auth::require_admin(&req, &state.auth.admin_token)?;
    let rules = state.rules.current();
    let report = state.events.ingest(&rules, &body).await?;
    if let Some(recording) = &state.recording {
        recording.events(&body);
    }
    Ok(HttpResponse::Accepted().json(report))
}

/// A user's trust points, awards and first sighting.
#[utoipa::path(
    get, path = "/v1/trust/{user_id}",
    params(("user_id" = String, Path, description = "as in checks and events (1-128 bytes)")),
    responses(
        (status = 200, body = TrustAnswer),
        (status = 400, body = super::errors::ErrorBody),
        (status = 401, description = "admin token missing or wrong (or, without one, a non-loopback peer)", body = super::errors::ErrorBody),
        (status = 503, description = "the trust ledger cannot answer", body = super::errors::ErrorBody),
    )
)]
pub async fn trust(
    req: HttpRequest,
    state: web::Data<AppState>,
    user_id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    super::auth::require_admin(&req, &state.auth.admin_token)?;
    let user_id = user_id.into_inner();
    if user_id.is_empty() || user_id.len() > MAX_ID_LEN {
        return Err(RequestError::InvalidField {
            field: "user_id".into(),
            message: format!("must be 1-{MAX_ID_LEN} bytes"),
        }
        .into());
    }
    let rules = state.rules.current();
    let view = state.events.trust(&rules, &user_id).await?;
    Ok(HttpResponse::Ok().json(TrustAnswer::from(view)))
}
