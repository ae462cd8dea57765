//! The one place errors become HTTP responses. Handlers return `Result<_, ApiError>` and
//! use `?`; every error body is `{"error": {"code", "message", "field"}}`.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::input::RequestError;
use crate::rules::RuleErrors;
use crate::store::StoreError;
use crate::trust::EventsError;

/// An error answer of the HTTP API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("the body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// The ops page: the browser is asked for HTTP Basic credentials (any user, the admin
    /// token as the password).
    #[error("missing or wrong credentials: any user name, the admin token as the password")]
    BrowserUnauthorized,
    #[error("no such route")]
    NotFound,
    /// The route exists but not for this method; `allow` is the method it answers.
    #[error("this route answers {allow} only")]
    MethodNotAllowed { allow: actix_web::http::Method },
    #[error("the store cannot answer: {0}")]
    StoreUnavailable(#[from] StoreError),
    /// `POST /v1/events`: an invalid event (400, the request codes) or a journal that
    /// cannot write (500 `journal_unavailable`, naming its folder).
    #[error(transparent)]
    Events(#[from] EventsError),
    /// `POST /v1/admin/reload`: the folder does not hold a valid rule set (422); the
    /// previous rules keep serving.
    #[error("invalid rules; the previous rules keep serving:\n{0}")]
    InvalidRules(RuleErrors),
    /// A server-side failure with no better name (500).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Every `error.code` the API answers: an enum, so the OpenAPI document lists exactly
/// the codes a client may meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidJson,
    UnknownScene,
    MissingDimension,
    InvalidField,
    Unauthorized,
    PayloadTooLarge,
    UnsupportedMediaType,
    NotFound,
    MethodNotAllowed,
    StoreUnavailable,
    JournalUnavailable,
    InvalidRules,
    Internal,
}

impl ErrorCode {
    /// The code of a request error. `RequestError::code` spells the same names for the
    /// simulator's report (a test keeps the two in step).
    fn of_request(e: &RequestError) -> ErrorCode {
        match e {
            RequestError::InvalidJson(_) => ErrorCode::InvalidJson,
            RequestError::UnknownScene(_) => ErrorCode::UnknownScene,
            RequestError::MissingDimension { .. } => ErrorCode::MissingDimension,
            RequestError::InvalidField { .. } => ErrorCode::InvalidField,
        }
    }
}

/// The error body's inner object.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
    /// The request field the error is about (`events[3].user_id`), or null.
    #[schema(required = true)]
    pub field: Option<String>,
    /// `invalid_rules`: the rule file of the first error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// `invalid_rules`: its line (1-based; 0 for the file as a whole).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

impl ApiError {
    fn code(&self) -> ErrorCode {
        match self {
            ApiError::Request(e) | ApiError::Events(EventsError::Invalid { source: e, .. }) => {
                ErrorCode::of_request(e)
            }
            ApiError::Events(EventsError::Journal(_)) => ErrorCode::JournalUnavailable,
            ApiError::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            ApiError::UnsupportedMediaType => ErrorCode::UnsupportedMediaType,
            ApiError::Unauthorized | ApiError::BrowserUnauthorized => ErrorCode::Unauthorized,
            ApiError::NotFound => ErrorCode::NotFound,
            ApiError::MethodNotAllowed { .. } => ErrorCode::MethodNotAllowed,
            ApiError::StoreUnavailable(_) => ErrorCode::StoreUnavailable,
            ApiError::InvalidRules(_) => ErrorCode::InvalidRules,
            ApiError::Internal(_) => ErrorCode::Internal,
        }
    }

    fn first_rule_error(&self) -> Option<&crate::rules::RuleError> {
        match self {
            ApiError::InvalidRules(errors) => errors.0.first(),
            _ => None,
        }
    }

    fn field(&self) -> Option<String> {
        match self {
            ApiError::Request(e) => e.field().map(str::to_string),
            ApiError::Events(e) => e.field(),
            _ => None,
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Request(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized | ApiError::BrowserUnauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Events(EventsError::Invalid { .. }) => StatusCode::BAD_REQUEST,
            ApiError::Events(EventsError::Journal(_)) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::InvalidRules(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut resp = HttpResponse::build(self.status_code());
        if matches!(self, ApiError::StoreUnavailable(_)) {
            resp.insert_header(("Retry-After", "1"));
        }
        if let ApiError::MethodNotAllowed { allow } = self {
            resp.insert_header((actix_web::http::header::ALLOW, allow.as_str()));
        }
        if matches!(self, ApiError::Unauthorized) {
            resp.insert_header(("WWW-Authenticate", "Bearer"));
        }
        if matches!(self, ApiError::BrowserUnauthorized) {
            resp.insert_header(("WWW-Authenticate", r#"Basic realm="vigia ops""#));
        }
        resp.json(ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
                field: self.field(),
                file: self.first_rule_error().map(|e| e.file.clone()),
                line: self.first_rule_error().map(|e| e.line),
            },
        })
    }
}

/// Maps actix's JSON extractor failures onto the API's errors.
pub fn json_error(err: actix_web::error::JsonPayloadError, limit: usize) -> ApiError {
    use actix_web::error::JsonPayloadError as E;
    match err {
        E::Overflow { .. } | E::OverflowKnownLength { .. } => ApiError::PayloadTooLarge { limit },
        E::ContentType => ApiError::UnsupportedMediaType,
        E::Deserialize(e) => ApiError::Request(RequestError::InvalidJson(format!(
            "invalid JSON at line {} column {}: {}",
            e.line(),
            e.column(),
            e
        ))),
        other => ApiError::Request(RequestError::InvalidJson(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trust::journal::JournalError;

    #[test]
    fn event_errors_keep_the_request_codes_and_name_the_journal() {
        let invalid = ApiError::from(EventsError::Invalid {
            at: "events[3].".into(),
            source: RequestError::MissingDimension {
                field: "user_id".into(),
                scene: "s".into(),
            },
        });
        assert_eq!(invalid.status_code(), StatusCode::BAD_REQUEST);
        assert_eq!(invalid.code(), ErrorCode::MissingDimension);
        assert_eq!(invalid.field().as_deref(), Some("events[3].user_id"));

        let journal = ApiError::from(EventsError::Journal(JournalError {
            path: "/var/lib/vigia/events".into(),
            message: "flush: disk full".into(),
        }));
        assert_eq!(journal.status_code(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(journal.code(), ErrorCode::JournalUnavailable);
        assert!(
            journal.to_string().contains("/var/lib/vigia/events"),
            "{journal}"
        );
    }

    #[test]
    fn request_error_codes_are_spelt_as_the_simulator_spells_them() {
        for e in [
            RequestError::InvalidJson("x".into()),
            RequestError::UnknownScene("s".into()),
            RequestError::MissingDimension {
                field: "user_id".into(),
                scene: "s".into(),
            },
            RequestError::invalid("ip", "bad"),
        ] {
            let wire = serde_json::to_value(ErrorCode::of_request(&e)).unwrap();
            assert_eq!(wire, e.code(), "{e:?}");
        }
    }
}
