//! Validation of a `/v1/check` body: it becomes a typed [`CheckRequest`] or a
//! [`RequestError`] naming the field. Nothing past this module sees untyped input. The
//! field readers are [`crate::input`]'s, shared with refunds and events.
//!
//! A device id that fails the rule set's pattern is not an input error: it is a security
//! verdict (silent deny), decided by the caller from `device_invalid`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::body::{RawCheck, FIELDS};
use crate::input::{
    bounded, id, known_fields, not_an_object, object, request_id, scene, values, Field, Fields,
    RequestError,
};
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

/// A `/v1/check` body as it came: read into a `serde_json::Value` (simulate, tests) or
/// straight into a [`RawCheck`] (the HTTP handler).
pub trait Body {
    /// The body's fields, or the error of a body that is no JSON object.
    fn fields(&self) -> Result<&dyn Fields, RequestError>;
}

impl Body for Value {
    fn fields(&self) -> Result<&dyn Fields, RequestError> {
        Ok(object(self)?)
    }
}

impl Body for RawCheck {
    fn fields(&self) -> Result<&dyn Fields, RequestError> {
        if self.not_object {
            return Err(not_an_object());
        }
        Ok(self)
    }
}

/// Validates a `/v1/check` body against the current rule set; `now_ms` dates the request
/// id made when the body has none.
pub fn parse_check(
    rules: &RuleSet,
    body: &(impl Body + ?Sized),
    now_ms: u64,
) -> Result<CheckRequest, RequestError> {
    let obj = body.fields()?;
    known_fields(obj, &FIELDS)?;
    let scene = scene(rules, obj)?;
    let request_id = request_id(obj, now_ms)?;
    let id_given = !matches!(obj.field("request_id"), None | Some(Field::Null));
    let (values, device_too_long) = values(rules, obj)?;
    require(&scene, &values)?;
    let idempotency_key = id(obj, "idempotency_key")?
        .map(|s| bounded("idempotency_key", s))
        .transpose()?;
    let user_created_at = match obj.field("user_created_at") {
        None | Some(Field::Null) => None,
        Some(Field::Str(s)) => Some(
            crate::input::rfc3339(s)
                .map_err(|e| {
                    RequestError::invalid("user_created_at", format!("not RFC 3339: {e}"))
                })?
                .with_timezone(&Utc),
        ),
        Some(_) => return Err(RequestError::invalid("user_created_at", "must be a string")),
    };
    let dry_run = match obj.field("dry_run") {
        None | Some(Field::Null) => false,
        Some(Field::Bool(b)) => b,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> RuleSet {
        // A file of its own: fixtures live in files.
        let toml = include_str!("../../tests/fixtures/request/rules.toml");
        crate::rules::compile_files(&[("request/rules.toml".into(), toml.into())])
            .expect("rules compile")
    }

    /// What a parse gives, comparable: the request's fields or the error.
    fn outcome(r: Result<CheckRequest, RequestError>) -> String {
        match r {
            Ok(req) => format!(
                "{} {} {:?} {:?} {:?} {} {}",
                req.scene.name,
                req.request_id,
                req.values,
                req.idempotency_key,
                req.user_created_at,
                req.dry_run,
                req.device_invalid
            ),
            Err(e) => format!("{} {:?}: {e}", e.code(), e.field()),
        }
    }

    /// The HTTP handler reads a [`RawCheck`]; simulate and the tests a `Value`. Every body,
    /// good or bad, must come out the same both ways, down to the error message.
    #[test]
    fn a_raw_check_and_its_value_parse_alike() {
        let rules = rules();
        let bodies = [
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":"192.0.2.1","device_id":"dev-0001"}"#,
            r#"{"scene":"s","request_id":"r1","user_id":10086.0,"ip":"::ffff:192.0.2.1","attrs":{"phone_range":"1234"}}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":"192.0.2.1","device_id":"bad id","dry_run":true,"idempotency_key":7,"user_created_at":"2026-01-02T03:04:05Z"}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":"192.0.2.1","dryRun":true,"zz":1,"b":[1]}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":"192.0.2.1","attrs":{"phone_range":"12","other":"x"}}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":"192.0.2.1","attrs":{"zz":1,"phone_range":{"a":1}}}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":"192.0.2.1","attrs":[1]}"#,
            r#"{"scene":"s","request_id":"has space","user_id":"u","ip":"192.0.2.1"}"#,
            r#"{"scene":"s","request_id":"r1","user_id":["u"],"ip":"192.0.2.1"}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"","ip":"192.0.2.1"}"#,
            r#"{"scene":"s","request_id":"r1","user_id":1.5,"ip":"192.0.2.1"}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":42}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":" 192.0.2.1"}"#,
            r#"{"scene":"s","request_id":"r1","ip":"192.0.2.1"}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":"192.0.2.1","dry_run":"yes"}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":"192.0.2.1","user_created_at":"2026-01-02 03:04:05Z"}"#,
            r#"{"scene":"s","request_id":"r1","user_id":"u","ip":"192.0.2.1","user_created_at":5}"#,
            r#"{"scene":"nope","request_id":"r1"}"#,
            r#"{"scene":7}"#,
            r#"{"scene":null,"request_id":"r1"}"#,
            r#"{}"#,
            r#"[1,2]"#,
            r#""s""#,
            r#"null"#,
        ];
        for text in bodies {
            let value: Value = serde_json::from_str(text).expect(text);
            let raw: RawCheck = serde_json::from_str(text).expect(text);
            assert_eq!(
                outcome(parse_check(&rules, &raw, 1)),
                outcome(parse_check(&rules, &value, 1)),
                "{text}"
            );
        }
    }
}
