//! Validation of a `/v1/check` body: it becomes a typed [`CheckRequest`] or a
//! [`RequestError`] naming the field. Nothing past this module sees untyped input. The
//! field readers are [`crate::input`]'s, shared with refunds and events.
//!
//! A device id that fails the rule set's pattern is not an input error: it is a security
//! verdict (silent deny), decided by the caller from `device_invalid`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::input::{bounded, id, known_fields, object, request_id, scene, values, RequestError};
use crate::keys::DimensionValues;
use crate::rules::{Dimension, RuleSet, Scene};

/// A valid check.
#[derive(Debug, Clone)]
pub struct CheckRequest {
    pub scene: Arc<Scene>,
    pub request_id: String,
    /// The body named the request id (otherwise the service made it, and the check
    /// cannot be a repeat of an earlier one).
    pub id_given: bool,
    /// Only the dimensions the body carried (IP canonicalised).
    pub values: DimensionValues,
    pub idempotency_key: Option<String>,
    pub user_created_at: Option<DateTime<Utc>>,
    pub dry_run: bool,
    /// The device id does not match the rule set's pattern (or is absurdly long).
    pub device_invalid: bool,
}

/// Every field a `/v1/check` body may carry: anything else is refused, so a misspelt
/// `dryRun` cannot record a real request.
const CHECK_FIELDS: [&str; 10] = [
    "scene",
    "request_id",
    "user_id",
    "device_id",
    "ip",
    "activity_id",
    "attrs",
    "idempotency_key",
    "user_created_at",
    "dry_run",
];

fn require(scene: &Scene, values: &DimensionValues) -> Result<(), RequestError> {
    for d in &scene.required {
        if values.get(d).is_none() {
            return Err(RequestError::MissingDimension {
                field: d.request_field().into_owned(),
                scene: scene.name.clone(),
            });
        }
    }
    Ok(())
}

/// Validates a `/v1/check` body against the current rule set; `now_ms` dates the request
/// id made when the body has none.
pub fn parse_check(
    rules: &RuleSet,
    body: &Value,
    now_ms: u64,
) -> Result<CheckRequest, RequestError> {
    let obj = object(body)?;
    known_fields(obj, &CHECK_FIELDS)?;
    let scene = scene(rules, obj)?;
    let request_id = request_id(obj, now_ms)?;
    let id_given = obj.get("request_id").is_some_and(|v| !v.is_null());
    let (values, device_too_long) = values(rules, obj)?;
    require(&scene, &values)?;
    let idempotency_key = id(obj, "idempotency_key")?
        .map(|s| bounded("idempotency_key", s))
        .transpose()?;
    let user_created_at = match obj.get("user_created_at") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            crate::input::rfc3339(s)
                .map_err(|e| {
                    RequestError::invalid("user_created_at", format!("not RFC 3339: {e}"))
                })?
                .with_timezone(&Utc),
        ),
        Some(_) => return Err(RequestError::invalid("user_created_at", "must be a string")),
    };
    let dry_run = match obj.get("dry_run") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(RequestError::invalid("dry_run", "must be true or false")),
    };
    let device_invalid = device_too_long
        || match (&rules.validation.device_id, values.get(&Dimension::Device)) {
            (Some(pattern), Some(device)) => !pattern.is_match(device),
            _ => false,
        };
    Ok(CheckRequest {
        scene,
        request_id,
        id_given,
        values,
        idempotency_key,
        user_created_at,
        dry_run,
        device_invalid,
    })
}
