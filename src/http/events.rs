//! `POST /v1/events` and `GET /v1/trust/{user_id}`: the admin surface of trust.
//!
//! Both need the admin token (or, without one, a loopback peer): a forged payment event is
//! free trust points, a forged rollback is free quota.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::check::{DeviceId, Id, IpText, RequestId};
use super::errors::{ApiError, ErrorBody};
use super::AppState;
use crate::clock::rfc3339;
use crate::input::{too_long, RequestError, MAX_ID_LEN};
use crate::trust::event::EventKind;
use crate::trust::{Award, IngestReport, TrustView};

/// The largest body `/v1/events` reads: a full batch of 1000 rollbacks carrying their
/// dimension values fits with room to spare.
pub const MAX_EVENTS_BODY: usize = 1024 * 1024;

// Documentation of what `crate::trust::event` reads field by field.
/// `payment_succeeded` or `identity_verified`: trust points for a user. A field not named
/// here is a 400 naming it (`events[3].amount`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AwardEvent {
    /// An id seen before is counted once.
    #[schema(min_length = 1, max_length = 128)]
    pub event_id: String,
    #[serde(rename = "type")]
    #[schema(schema_with = award_kinds)]
    pub kind: EventKind,
    #[schema(value_type = Id)]
    pub user_id: String,
    #[schema(format = DateTime)]
    pub occurred_at: String,
}

/// `challenge_passed`: the person behind a challenged check passed it. For the scene's
/// `pass_ttl` (counted from `occurred_at`) that user, on that device when given, is not
/// challenged again by the score band; strong evidence still silently denies. A field not
/// named here is a 400 naming it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PassEvent {
    /// An id seen before is counted once.
    #[schema(min_length = 1, max_length = 128)]
    pub event_id: String,
    #[serde(rename = "type")]
    #[schema(schema_with = pass_kind)]
    pub kind: EventKind,
    #[schema(value_type = Id)]
    pub user_id: String,
    /// The device the challenge was passed on; absent: any device. Unlike a check's, a
    /// pass's device id is read as an id (1 to 128 characters) and must match the rules'
    /// `[validation].device_id` pattern, else the event is refused (400).
    #[schema(value_type = Option<Id>)]
    pub device_id: Option<String>,
    /// A scene with a `[challenge]`; absent: every scene that challenges.
    pub scene: Option<String>,
    #[schema(format = DateTime)]
    pub occurred_at: String,
}

/// `benefit_rolled_back`: refunds a check's quota, named as `POST /v1/refund` names it
/// (scene, request id, the check's dimension values). `/openapi.json` narrows it to the
/// rule set in force. A field not named here is a 400 naming it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackEvent {
    /// An id seen before is counted once.
    #[schema(min_length = 1, max_length = 128)]
    pub event_id: String,
    #[serde(rename = "type")]
    #[schema(schema_with = rollback_kind)]
    pub kind: EventKind,
    #[schema(value_type = Option<Id>)]
    pub user_id: Option<String>,
    #[schema(format = DateTime)]
    pub occurred_at: String,
    pub scene: String,
    #[schema(value_type = RequestId)]
    pub request_id: String,
    #[schema(value_type = Option<DeviceId>)]
    pub device_id: Option<String>,
    #[schema(value_type = Option<IpText>)]
    pub ip: Option<String>,
    #[schema(value_type = Option<Id>)]
    pub activity_id: Option<String>,
    #[schema(value_type = Option<std::collections::BTreeMap<String, Id>>)]
    pub attrs: Option<std::collections::BTreeMap<String, String>>,
}

fn kinds(kinds: &[EventKind]) -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(kinds.iter().map(|k| k.name())))
        .build()
}

fn award_kinds() -> utoipa::openapi::Object {
    kinds(&EventKind::AWARDS)
}

fn answer_kinds() -> utoipa::openapi::Object {
    kinds(&[
        EventKind::PaymentSucceeded,
        EventKind::IdentityVerified,
        EventKind::ChallengePassed,
    ])
}

fn pass_kind() -> utoipa::openapi::Object {
    kinds(&[EventKind::ChallengePassed])
}

fn rollback_kind() -> utoipa::openapi::Object {
    kinds(&[EventKind::BenefitRolledBack])
}

/// One event: the `type` tells which.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum EventBody {
    Award(AwardEvent),
    Pass(PassEvent),
    Rollback(RollbackEvent),
}

/// A batch: refused whole when one event is invalid. It holds `events` only.
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventBatch {
    #[schema(min_items = 1, max_items = 1000)]
    pub events: Vec<EventBody>,
}

/// The body of `POST /v1/events`: one event, or `{"events": [...]}`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum EventsBody {
    One(Box<EventBody>),
    Batch(EventBatch),
}

/// One unexpired award.
#[derive(Debug, Serialize, ToSchema)]
pub struct AwardAnswer {
    pub event_id: String,
    #[serde(rename = "type")]
    #[schema(schema_with = answer_kinds)]
    pub kind: &'static str,
    /// A challenge pass: the scene whose band it lifts (absent for its trust points and
    /// for other awards).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scene: Option<String>,
    pub points: u32,
    #[schema(format = DateTime)]
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
    /// Null when the service never saw the user in a check.
    #[schema(format = DateTime, required = true)]
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
                .map(|a: Award| {
                    let (sent, scene) = a.sent_id_and_scene();
                    AwardAnswer {
                        event_id: sent.to_string(),
                        scene: scene.map(str::to_string),
                        kind: a.kind.name(),
                        points: a.points,
                        expires_at: rfc3339(a.expires_at_ms),
                    }
                })
                .collect(),
            first_seen: v.first_seen_ms.map(rfc3339),
            pending_events: v.pending_events,
        }
    }
}

/// Take trust events (admin); 202 once they are durable.
#[utoipa::path(
    post, path = "/v1/events", request_body = EventsBody,
    security(("admin_token" = [])),
    responses(
        (status = 202, description = "journaled durably (applied now, or as soon as the store answers)", body = IngestReport),
        (status = 400, description = "an invalid event: the whole body is refused; `field` names it (`events[3].user_id`, or a field the event's type does not carry: `events[3].amount`); a key named twice in one object is `invalid_json`", body = ErrorBody),
        (status = 401, description = "admin token missing or wrong (or, without one, a non-loopback peer)", body = ErrorBody, headers(
            ("WWW-Authenticate" = String, description = "`Bearer`"),
        )),
        (status = 413, description = "body over 1 MiB", body = ErrorBody),
        (status = 415, description = "the body is not `application/json`", body = ErrorBody),
        (status = 500, description = "the journal cannot write (`journal_unavailable`): nothing was taken", body = ErrorBody),
    )
)]
pub async fn ingest(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<crate::strict_json::StrictJson>,
) -> Result<HttpResponse, ApiError> {
    super::auth::require_admin(&req, &state.auth.admin_token)?;
    let rules = state.rules.current();
    let report = state.events.ingest(&rules, &body).await?;
    if let Some(recording) = &state.recording {
        recording.events(&body);
    }
    Ok(HttpResponse::Accepted().json(report))
}

/// A user's trust points, awards and first sighting (admin).
#[utoipa::path(
    get, path = "/v1/trust/{user_id}",
    security(("admin_token" = [])),
    params(("user_id" = String, Path, min_length = 1, max_length = 128, description = "as in checks and events")),
    responses(
        (status = 200, body = TrustAnswer, description = "the user's trust (zero points for a user never seen)"),
        (status = 400, description = "`user_id` longer than 128 characters", body = ErrorBody),
        (status = 401, description = "admin token missing or wrong (or, without one, a non-loopback peer)", body = ErrorBody, headers(
            ("WWW-Authenticate" = String, description = "`Bearer`"),
        )),
        (status = 503, description = "the trust ledger cannot answer", body = ErrorBody, headers(
            ("Retry-After" = super::check::RetryAfterSeconds, description = "whole seconds, at least 1"),
        )),
    )
)]
pub async fn trust(
    req: HttpRequest,
    state: web::Data<AppState>,
    user_id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    super::auth::require_admin(&req, &state.auth.admin_token)?;
    let user_id = user_id.into_inner();
    if user_id.is_empty() || too_long(&user_id) {
        return Err(RequestError::InvalidField {
            field: "user_id".into(),
            message: format!("must be 1-{MAX_ID_LEN} characters"),
        }
        .into());
    }
    let rules = state.rules.current();
    let view = state.events.trust(&rules, &user_id).await?;
    Ok(HttpResponse::Ok().json(TrustAnswer::from(view)))
}
