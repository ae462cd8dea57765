//! `POST /v1/admin/reload`: reload the rules folder now (admin only).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::require_admin;
use super::errors::{ApiError, ErrorBody};
use super::AppState;
use crate::rules::Trigger;

/// `POST /v1/admin/reload` → 200.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReloadAnswer {
    /// The rule-set version now serving.
    pub version: String,
    /// False when the folder held the version already serving.
    pub changed: bool,
}

/// Reads and validates the rules folder and swaps it in. An invalid set is a 422 naming
/// the file and line of its first error; the previous rules keep serving.
#[utoipa::path(post, path = "/v1/admin/reload",
    security(("admin_token" = [])),
    responses(
        (status = 200, body = ReloadAnswer, description = "the folder's rule set is serving"),
        (status = 401, description = "admin token missing or wrong (or, without one, a non-loopback peer)", body = ErrorBody, headers(
            ("WWW-Authenticate" = String, description = "`Bearer`"),
        )),
        (status = 422, description = "invalid rules (`invalid_rules`, with the `file` and `line` of the first error); the previous rules keep serving", body = ErrorBody),
    )
)]
pub async fn reload(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&req, &state.auth.admin_token)?;
    let reloader = state.reloader.clone();
    // File reads and compilation stay off the async workers.
    let result = web::block(move || reloader.reload(Trigger::Admin))
        .await
        .map_err(|e| ApiError::Internal(format!("reload task: {e}")))?;
    let reloaded = result.map_err(ApiError::InvalidRules)?;
    Ok(HttpResponse::Ok().json(ReloadAnswer {
        version: reloaded.version,
        changed: reloaded.changed,
    }))
}
