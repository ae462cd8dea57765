//! The HTTP face: one route table, one state, one error mapping (`errors`).
//!
//! Handlers take one rule-set snapshot each and pass it down; nothing below them reads
//! the global handle again.

pub mod admin;
pub mod answers;
pub mod arrival;
pub mod auth;
pub mod check;
pub mod deadline;
pub mod errors;
pub mod events;
pub mod ops;
pub mod ops_page;
pub mod recording;
pub mod server;

use std::sync::Arc;

use actix_web::http::Method;
use actix_web::{web, FromRequest, Handler, HttpResponse, Responder};
use arc_swap::ArcSwapOption;
use utoipa::OpenApi;

use crate::check::Checker;
use crate::config::AuthConfig;
use crate::metrics::Metrics;
use crate::refund::Refunds;
use crate::rules::{Reloader, RulesHandle};
use crate::trust::Events;

/// The largest body `/v1/check` and `/v1/refund` read: 64 KiB.
pub const MAX_BODY: usize = 64 * 1024;

/// Everything a handler may use.
pub struct AppState {
    pub rules: Arc<RulesHandle>,
    pub checker: Arc<Checker>,
    /// `/v1/refund`, on the windows the checker counts in.
    pub refunds: Arc<Refunds>,
    pub metrics: Metrics,
    pub last_rules_error: Arc<ArcSwapOption<ops::RulesError>>,
    /// Reloads the rules folder (shared with the watch and SIGHUP).
    pub reloader: Arc<Reloader>,
    /// The rules folder watch; dropped (stopped) with the state. `None` when it could
    /// not start (logged; SIGHUP and the admin endpoint still reload).
    pub rules_watcher: Option<crate::rules::watch::RulesWatcher>,
    pub auth: AuthConfig,
    /// Trust events: journal, ledger, replayer.
    pub events: Arc<Events>,
    /// `[record]`: answered checks and accepted events as traffic lines.
    pub recording: Option<recording::Recording>,
    /// `decision_log`: one log line per answered check; `None` when off.
    pub decision_log: Option<crate::decision_log::DecisionLog>,
    /// The counters' last minutes, for `GET /ops`.
    pub ops: Arc<crate::dashboard::History>,
    /// `data_dir` and its folders: `/readyz` fails while one cannot take a write.
    pub state_folders: crate::data_dir::StateFolders,
}

/// Every route: (method, path). `/openapi.json` documents exactly these (tested).
pub const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/check"),
    ("post", "/v1/refund"),
    ("get", "/v1/rules"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("post", "/v1/events"),
    ("get", "/v1/trust/{user_id}"),
    ("post", "/v1/admin/reload"),
    ("get", "/ops"),
    ("get", "/v1/admin/ops"),
];

mod openapi;
use openapi::SecuritySchemes;

/// The OpenAPI document, derived from the handlers' `#[utoipa::path]` and the body types;
/// [`openapi_document`] completes it for the rule set in force.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "vigia",
        description = "Multi-dimensional rate limiting and risk scoring for marketing APIs."
    ),
    modifiers(&SecuritySchemes),
    paths(
        check::check,
        check::refund,
        ops::rules,
        ops::healthz,
        ops::readyz,
        ops::metrics,
        ops::openapi,
        events::ingest,
        events::trust,
        admin::reload,
        ops_page::page,
        ops_page::data
    ),
    components(schemas(
        crate::check::decision::CheckResponse,
        crate::check::decision::Verdict,
        crate::check::decision::LimitReport,
        crate::check::decision::SignalReport,
        crate::check::decision::TrustReport,
        crate::rules::Layer,
        check::CheckBody,
        check::RefundBody,
        check::RefundAnswer,
        check::Id,
        check::DeviceId,
        check::IpText,
        check::RequestId,
        check::RetryAfterSeconds,
        check::RateLimitPolicy,
        check::RateLimitState,
        errors::ErrorBody,
        errors::ErrorDetail,
        errors::ErrorCode,
        ops::Ready,
        ops::Health,
        ops::RulesInfo,
        ops::RulesError,
        crate::rules::RuleError,
        events::EventsBody,
        events::EventBody,
        events::EventBatch,
        events::AwardEvent,
        events::PassEvent,
        events::RollbackEvent,
        crate::trust::event::EventKind,
        events::AwardAnswer,
        events::TrustAnswer,
        crate::trust::IngestReport,
        admin::ReloadAnswer,
        ops_page::OpsView,
        ops_page::OpsRules,
        ops_page::OpsChallenge,
        ops_page::OpsStore,
        crate::dashboard::Totals,
        crate::dashboard::SceneTotals,
        crate::dashboard::Decisions,
        crate::dashboard::HistoryView,
        crate::dashboard::Sample,
    ))
)]
pub struct ApiDoc;

/// The OpenAPI document served at `/openapi.json`: [`ApiDoc`], plus the 405 (with its
/// `Allow` header) every route answers to another method (see [`route`]), and the request
/// bodies narrowed to `rules` (see [`openapi::narrow_to_rules`]).
pub fn openapi_document(rules: &crate::rules::RuleSet) -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    openapi::add_method_not_allowed(&mut doc);
    openapi::require_documented_headers(&mut doc);
    openapi::forbid_events_in_single_events(&mut doc);
    openapi::narrow_to_rules(&mut doc, rules);
    doc
}

/// Registers every route of [`ROUTES`] on an actix app. Each is a resource of one
/// method (see [`route`]): another method on it is a 405 naming the one it answers, and a
/// path that is no route is a 404.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let json = web::JsonConfig::default()
        .limit(MAX_BODY)
        .error_handler(|err, _req| errors::json_error(err, MAX_BODY).into());
    cfg.app_data(json)
        .service(route("/v1/check", Method::POST, check::check))
        .service(route("/v1/refund", Method::POST, check::refund))
        .service(route("/v1/rules", Method::GET, ops::rules))
        .service(route("/healthz", Method::GET, ops::healthz))
        .service(route("/readyz", Method::GET, ops::readyz))
        .service(route("/metrics", Method::GET, ops::metrics))
        .service(route("/openapi.json", Method::GET, ops::openapi))
        .service(
            // A batch of events is larger than a check: its own body limit.
            route("/v1/events", Method::POST, events::ingest).app_data(
                web::JsonConfig::default()
                    .limit(events::MAX_EVENTS_BODY)
                    .error_handler(|err, _req| {
                        errors::json_error(err, events::MAX_EVENTS_BODY).into()
                    }),
            ),
        )
        .service(route("/v1/trust/{user_id}", Method::GET, events::trust))
        .service(route("/v1/admin/reload", Method::POST, admin::reload))
        .service(route("/ops", Method::GET, ops_page::page))
        .service(route("/v1/admin/ops", Method::GET, ops_page::data))
        .default_service(web::to(not_found));
}

/// One route: `path` answered by `handler` for `method`, and by a 405 with
/// `Allow: <method>` for any other method.
fn route<F, Args>(path: &str, method: Method, handler: F) -> actix_web::Resource
where
    F: Handler<Args>,
    Args: FromRequest + 'static,
    F::Output: Responder + 'static,
{
    let allow = method.clone();
    web::resource(path)
        .route(web::method(method).to(handler))
        .default_service(web::to(move || {
            let allow = allow.clone();
            async move { Err::<HttpResponse, _>(errors::ApiError::MethodNotAllowed { allow }) }
        }))
}

async fn not_found() -> Result<HttpResponse, errors::ApiError> {
    Err(errors::ApiError::NotFound)
}
