//! `GET /ops`: the page for the people running a campaign, and `GET /v1/admin/ops`, the
//! JSON it polls. One HTML file with its script and styles inline (no build step, no
//! external asset: its Content-Security-Policy forbids them). Admin auth, also as HTTP
//! Basic so a browser can prompt for the token.

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::require_admin_browser;
use super::errors::{ApiError, ErrorBody};
use super::ops::RulesError;
use super::AppState;
use crate::dashboard::{breaker_state, HistoryView, Totals};

/// The page itself.
const PAGE: &str = include_str!("ops.html");

/// Only inline script and style, data: images, and fetches to this origin.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The rule set in force and the last load that failed.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpsRules {
    pub version: String,
    /// RFC 3339, UTC.
    pub loaded_at: String,
    /// The last load that failed, until one succeeds (the previous rules keep serving).
    pub last_error: Option<RulesError>,
    /// The scenes that can answer challenge (a `[scene.X.challenge]`), by name: what they
    /// ask. The page shows a pass rate for these (and for any scene that counted one).
    pub challenges: BTreeMap<String, OpsChallenge>,
}

/// What a scene's challenge asks (`[scene.X.challenge]`).
#[derive(Debug, Serialize, ToSchema)]
pub struct OpsChallenge {
    /// `captcha`, `sms`…, as the answer's `challenge.kind` says it.
    pub kind: String,
    /// How long a reported pass keeps the user out of the band, ms.
    pub pass_ttl_ms: u64,
}

/// The store's state.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpsStore {
    /// `redis` or `embedded`.
    pub kind: &'static str,
    /// Whether it answered a ping just now.
    pub ready: bool,
    /// Why not, when not ready.
    pub problem: Option<String>,
    /// `open` or `closed`; null for a store without a breaker (embedded).
    pub breaker: Option<&'static str>,
}

/// `GET /v1/admin/ops`: current totals (the page derives live rates from consecutive
/// polls) and the sampled history of the last 15 minutes.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpsView {
    /// ms since the epoch, on the service's clock.
    pub now_ms: u64,
    pub rules: OpsRules,
    pub store: OpsStore,
    /// Counts since the process started.
    pub totals: Totals,
    pub history: HistoryView,
}

/// The ops page (HTML). A browser without credentials is asked for them: any user
/// name, the admin token as the password (none needed from loopback when no token is set).
/// The 401 of the ops page and its data.
const UNAUTHORIZED: &str = "admin token missing or wrong, as a bearer token or as the password of Basic credentials (or, without one, a non-loopback peer)";

#[utoipa::path(get, path = "/ops",
    security(("admin_token" = []), ("admin_basic" = [])),
    responses(
        (status = 200, content_type = "text/html", body = String, description = "the page; it fetches /v1/admin/ops every 2 s"),
        (status = 401, description = UNAUTHORIZED, body = ErrorBody, headers(
            ("WWW-Authenticate" = String, description = "`Basic realm=\"vigia ops\"`: a browser asks for the credentials"),
        )),
    )
)]
pub async fn page(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    require_admin_browser(&req, &state.auth.admin_token)?;
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("Content-Security-Policy", CSP))
        .insert_header(("Cache-Control", "no-store"))
        .body(PAGE))
}

/// What the ops page shows, as JSON: per scene decisions, blocks by limit and dimension,
/// signals fired and challenge passes reported (totals and 15 minutes of sampled deltas);
/// rules; store state.
#[utoipa::path(get, path = "/v1/admin/ops",
    security(("admin_token" = []), ("admin_basic" = [])),
    responses(
        (status = 200, body = OpsView, description = "the counters now and their last 15 minutes"),
        (status = 401, description = UNAUTHORIZED, body = ErrorBody, headers(
            ("WWW-Authenticate" = String, description = "`Basic realm=\"vigia ops\"`"),
        )),
    )
)]
pub async fn data(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    require_admin_browser(&req, &state.auth.admin_token)?;
    let rules = state.rules.current();
    let store = state.checker.store();
    let problem = store.ping().await.err().map(|e| e.to_string());
    let families = state.metrics.gather();
    let view = OpsView {
        now_ms: state.rules.clock().now_ms(),
        rules: OpsRules {
            version: rules.version.clone(),
            loaded_at: crate::clock::rfc3339(state.rules.loaded_at_ms()),
            last_error: state.last_rules_error.load_full().map(|e| (*e).clone()),
            challenges: rules
                .scenes
                .iter()
                .filter_map(|(name, scene)| {
                    let c = scene.challenge.as_ref()?;
                    let ask = OpsChallenge {
                        kind: c.kind.clone(),
                        pass_ttl_ms: c.pass_ttl_ms,
                    };
                    Some((name.clone(), ask))
                })
                .collect(),
        },
        store: OpsStore {
            kind: store.kind(),
            ready: problem.is_none(),
            problem,
            breaker: breaker_state(&families),
        },
        totals: Totals::read(&families, &rules),
        history: state.ops.view(),
    };
    Ok(HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .json(view))
}
