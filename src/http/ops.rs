//! Operations endpoints: liveness, readiness, metrics, the loaded rules, the API spec.

use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;

/// `GET /healthz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    #[schema(schema_with = ok)]
    pub status: &'static str,
}

fn ok() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(["ok"]))
        .build()
}

/// `GET /readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Ready {
    pub ready: bool,
    pub rules_version: String,
    /// The store backend: `embedded`, `redis` or `redis_cluster`.
    pub store: &'static str,
    /// What is wrong, when not ready.
    pub problems: Vec<String>,
}

/// The last rule load that failed (kept by the reloader).
pub use crate::rules::RulesError;

/// `GET /v1/rules`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RulesInfo {
    pub version: String,
    #[schema(format = DateTime)]
    pub loaded_at: String,
    pub scenes: Vec<String>,
    /// The last load that failed, while the previous rules keep serving; else null.
    #[schema(required = true)]
    pub last_error: Option<RulesError>,
}

/// 200 while the process runs.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health, description = "the process runs")))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// 200 when rules are loaded, the store answers and `data_dir` takes writes; 503 with
/// what is wrong otherwise.
#[utoipa::path(get, path = "/readyz", responses(
    (status = 200, body = Ready, description = "rules loaded, the store answers, and `data_dir` and its folders take writes"),
    (status = 503, body = Ready, description = "not ready: `problems` says what is wrong (the store; a data folder gone or not writable, named)"),
))]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let rules = state.rules.current();
    let store = state.checker.store();
    let mut problems = Vec::new();
    if let Err(e) = store.ping().await {
        problems.push(format!("store ({}): {e}", store.kind()));
    }
    let folders = state.state_folders.clone();
    match web::block(move || folders.problems()).await {
        Ok(folder_problems) => problems.extend(folder_problems),
        Err(e) => problems.push(format!("data folders: not checked: {e}")),
    }
    let body = Ready {
        ready: problems.is_empty(),
        rules_version: rules.version.clone(),
        store: store.kind(),
        problems,
    };
    if body.ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", responses((status = 200, content_type = "text/plain", body = String, description = "Prometheus text exposition format 0.0.4")))]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}

/// The rule set in force.
#[utoipa::path(get, path = "/v1/rules", responses((status = 200, body = RulesInfo, description = "the version serving, its scenes and the last failed load")))]
pub async fn rules(state: web::Data<AppState>) -> HttpResponse {
    let rules = state.rules.current();
    HttpResponse::Ok().json(RulesInfo {
        version: rules.version.clone(),
        loaded_at: crate::clock::rfc3339(state.rules.loaded_at_ms()),
        scenes: rules.scenes.keys().cloned().collect(),
        last_error: state.last_rules_error.load_full().map(|e| (*e).clone()),
    })
}

/// This API as OpenAPI 3.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, body = Object, description = "OpenAPI 3.1, narrowed to the rule set in force (its scenes and attributes)")))]
pub async fn openapi(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(super::openapi_document(&state.rules.current()))
}
