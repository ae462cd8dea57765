//! Untrusted JSON in, typed values out: the one validation error ([`RequestError`], a 400
//! naming the field) and the field readers that `/v1/check` (`check::request`),
//! `/v1/refund` ([`crate::refund`]) and `/v1/events` (`trust::event`) share. It sits below
//! all three so none of them imports another to read an id the same way.
//!
//! Ids may be JSON strings or integers (many backends keep numeric user ids). Any character
//! is allowed in an id — keys encode it — but length is bounded so a hostile 10 KB id costs
//! nothing downstream. The bound counts characters, not bytes: that is what JSON Schema's
//! `maxLength` counts, so `/openapi.json` can state the bound exactly (at most 4 bytes a
//! character, an id stays small).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Map, Number, Value};

use crate::keys::DimensionValues;
use crate::rules::{RuleSet, Scene};

/// Longest id accepted (user, activity, idempotency key, attribute value, event), in
/// characters.
pub const MAX_ID_LEN: usize = 128;

/// Why a body is not a valid request. Each names the field involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{0}")]
    InvalidJson(String),
    #[error("scene {0:?} is not in the current rule set")]
    UnknownScene(String),
    #[error("{field} is required by scene {scene}")]
    MissingDimension { field: String, scene: String },
    #[error("{field}: {message}")]
    InvalidField { field: String, message: String },
}

impl RequestError {
    /// An `invalid_field` error.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        RequestError::InvalidField {
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// The API's error code (`invalid_json`, `unknown_scene`, `missing_dimension`,
    /// `invalid_field`).
    pub fn code(&self) -> &'static str {
        match self {
            RequestError::InvalidJson(_) => "invalid_json",
            RequestError::UnknownScene(_) => "unknown_scene",
            RequestError::MissingDimension { .. } => "missing_dimension",
            RequestError::InvalidField { .. } => "invalid_field",
        }
    }

    /// The field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            RequestError::InvalidJson(_) => None,
            RequestError::UnknownScene(_) => Some("scene"),
            RequestError::MissingDimension { field, .. } => Some(field),
            RequestError::InvalidField { field, .. } => Some(field),
        }
    }
}

/// One field of a body as JSON gave it: what the readers below look at, whether the body
/// was read into a `serde_json::Value` (refunds, events, simulate) or straight into a typed
/// body (`check::body::CheckBody`, the hot path).
#[derive(Debug, Clone, Copy)]
pub enum Field<'a> {
    Null,
    Bool(bool),
    Number(&'a Number),
    Str(&'a str),
    Array,
    Object(&'a dyn Fields),
}

/// A JSON object the readers can read fields of.
pub trait Fields: std::fmt::Debug {
    /// The field `name`; `None` when absent.
    fn field(&self, name: &str) -> Option<Field<'_>>;
    /// Every field name, in sorted order.
    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_>;
    /// The first field name (in sorted order, as a `serde_json::Map` iterates) not among
    /// `known`.
    fn first_unknown(&self, known: &[&str]) -> Option<&str> {
        self.names().find(|k| !known.contains(k))
    }
}

impl<'a> From<&'a Value> for Field<'a> {
    fn from(v: &'a Value) -> Self {
        match v {
            Value::Null => Field::Null,
            Value::Bool(b) => Field::Bool(*b),
            Value::Number(n) => Field::Number(n),
            Value::String(s) => Field::Str(s),
            Value::Array(_) => Field::Array,
            Value::Object(map) => Field::Object(map),
        }
    }
}

impl Fields for Map<String, Value> {
    fn field(&self, name: &str) -> Option<Field<'_>> {
        self.get(name).map(Field::from)
    }

    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        Box::new(self.keys().map(String::as_str))
    }
}

/// Absent or null.
fn present<'a>(obj: &'a (impl Fields + ?Sized), name: &str) -> Option<Field<'a>> {
    obj.field(name).filter(|f| !matches!(f, Field::Null))
}

/// The body as a JSON object.
pub fn object(body: &Value) -> Result<&Map<String, Value>, RequestError> {
    body.as_object().ok_or_else(not_an_object)
}

/// The error of a body that is valid JSON but no object.
pub fn not_an_object() -> RequestError {
    RequestError::InvalidJson("the body must be a JSON object".into())
}

/// The `scene` field: a scene of the current rule set.
pub fn scene(rules: &RuleSet, obj: &(impl Fields + ?Sized)) -> Result<Arc<Scene>, RequestError> {
    match present(obj, "scene") {
        None => Err(RequestError::invalid("scene", "is required")),
        Some(Field::Str(s)) => rules
            .scene(s)
            .cloned()
            .ok_or_else(|| RequestError::UnknownScene(truncate(s))),
        Some(_) => Err(RequestError::invalid("scene", "must be a string")),
    }
}

/// Error messages quote user input; keep them short.
pub fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// An integer id's text. JSON has one number type, so `10086.0` is the integer 10086 (as
/// JSON Schema's `integer` says) and names the same user as `10086`. A fraction is no id,
/// and neither is a number past `i64`/`u64`: serde_json reads those as floats, rounded, so
/// `-9223372036854775809` would pass for `i64::MIN`. Only floats up to 2^53 are integers
/// known exactly.
pub fn integer_text(n: &serde_json::Number) -> Option<String> {
    if n.is_u64() || n.is_i64() {
        return Some(n.to_string());
    }
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    let f = n.as_f64()?;
    (f.fract() == 0.0 && f.abs() <= EXACT).then(|| (f as i64).to_string())
}

/// A string or integer id; `Ok(None)` when absent or null.
pub fn id(obj: &(impl Fields + ?Sized), field: &str) -> Result<Option<String>, RequestError> {
    let s = match present(obj, field) {
        None => return Ok(None),
        Some(Field::Str(s)) => s.to_owned(),
        Some(Field::Number(n)) => integer_text(n)
            .ok_or_else(|| RequestError::invalid(field, "must be a string or an integer"))?,
        Some(_) => {
            return Err(RequestError::invalid(
                field,
                "must be a string or an integer",
            ))
        }
    };
    if s.is_empty() {
        return Err(RequestError::invalid(field, "must not be empty"));
    }
    Ok(Some(s))
}

/// Whether `s` is longer than [`MAX_ID_LEN`] characters.
pub fn too_long(s: &str) -> bool {
    s.chars().nth(MAX_ID_LEN).is_some()
}

/// `s` if it is at most [`MAX_ID_LEN`] characters.
pub fn bounded(field: &str, s: String) -> Result<String, RequestError> {
    if too_long(&s) {
        return Err(RequestError::invalid(
            field,
            format!("is {} characters; at most {MAX_ID_LEN}", s.chars().count()),
        ));
    }
    Ok(s)
}

/// The body's request id, or a new ULID: time-ordered on the service clock, random below.
pub fn request_id(obj: &(impl Fields + ?Sized), now_ms: u64) -> Result<String, RequestError> {
    match present(obj, "request_id") {
        None => Ok(ulid::Ulid::from_parts(now_ms, rand::random::<u128>()).to_string()),
        Some(Field::Str(s))
            if (1..=64).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
        {
            Ok(s.to_owned())
        }
        Some(_) => Err(RequestError::invalid(
            "request_id",
            "must be 1-64 characters of [A-Za-z0-9_-]",
        )),
    }
}

/// The `ip` field: one address, IPv4 or IPv6. What it counts as (its `ip` and `net`) is
/// the rule set's to say (`rules::Network`).
pub fn ip(obj: &(impl Fields + ?Sized)) -> Result<Option<IpAddr>, RequestError> {
    match present(obj, "ip") {
        None => Ok(None),
        // Exactly the address text (no surrounding blanks), as the API document's
        // ipv4/ipv6 formats say. The IPv4 parser takes only the canonical dotted quad (no
        // leading zeros, no other notation).
        Some(Field::Str(s)) => s
            .parse::<IpAddr>()
            .map(Some)
            .map_err(|_| RequestError::invalid("ip", "is not an IPv4 or IPv6 address")),
        Some(_) => Err(RequestError::invalid("ip", "must be a string")),
    }
}

/// An RFC 3339 date-time (`user_created_at`, an event's `occurred_at`). chrono also takes a
/// space between date and time (RFC 3339 allows it "for readability" in prose), which the
/// API document's `date-time` format does not: refused, so the two agree.
pub fn rfc3339(s: &str) -> Result<chrono::DateTime<chrono::FixedOffset>, String> {
    if s.as_bytes().get(10) == Some(&b' ') {
        return Err("the date and the time are separated by T, not a space".into());
    }
    chrono::DateTime::parse_from_rfc3339(s).map_err(|e| e.to_string())
}

/// Refuses a field not in `fields`, naming it.
pub fn known_fields(obj: &(impl Fields + ?Sized), fields: &[&str]) -> Result<(), RequestError> {
    match obj.first_unknown(fields) {
        None => Ok(()),
        Some(unknown) => Err(RequestError::invalid(
            &truncate(unknown),
            format!("is not a field of this request ({})", fields.join(", ")),
        )),
    }
}

/// `attrs`: an object of declared attributes, each a string (or integer) matching its
/// pattern.
pub fn attrs(
    rules: &RuleSet,
    obj: &(impl Fields + ?Sized),
) -> Result<BTreeMap<Arc<str>, String>, RequestError> {
    let mut out = BTreeMap::new();
    let map = match present(obj, "attrs") {
        None => return Ok(out),
        Some(Field::Object(map)) => map,
        Some(_) => return Err(RequestError::invalid("attrs", "must be an object")),
    };
    for name in map.names() {
        let field = format!("attrs.{}", truncate(name));
        let Some((key, attr)) = rules.attributes.get_key_value(name) else {
            return Err(RequestError::invalid(
                &field,
                "is not declared in the rule set's [attributes]",
            ));
        };
        let Some(value) = id(map, name)? else {
            continue;
        };
        let value = bounded(&field, value)?;
        if !attr.pattern.is_match(&value) {
            return Err(RequestError::invalid(
                &field,
                format!("does not match {}", attr.pattern.as_str()),
            ));
        }
        out.insert(key.clone(), value);
    }
    Ok(out)
}

/// Reads the dimension fields; every present one is checked, required or not. The flag is
/// a device id longer than [`MAX_ID_LEN`]: for a check that is a forged id (a security
/// verdict), not an input error.
pub fn values(
    rules: &RuleSet,
    obj: &(impl Fields + ?Sized),
) -> Result<(DimensionValues, bool), RequestError> {
    let user = id(obj, "user_id")?
        .map(|s| bounded("user_id", s))
        .transpose()?;
    let activity = id(obj, "activity_id")?
        .map(|s| bounded("activity_id", s))
        .transpose()?;
    let device = id(obj, "device_id")?;
    // A forged device id is a security verdict, not an input error; an absurd length is
    // forged whatever the pattern says.
    let device_too_long = device.as_deref().is_some_and(too_long);
    let addr = ip(obj)?;
    let ip = addr.map(|a| rules.network.ip_of(a));
    let net = addr.map(|a| rules.network.of(a));
    Ok((
        DimensionValues {
            user,
            device,
            ip,
            net,
            activity,
            attrs: attrs(rules, obj)?,
        },
        device_too_long,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip_of(text: &str) -> Result<Option<String>, RequestError> {
        let body = serde_json::json!({ "ip": text });
        let obj = body.as_object().expect("an object");
        let rules = crate::rules::compile_files(&[]).expect("an empty rule set");
        values(&rules, obj).map(|(v, _)| v.ip.map(|ip| ip.as_str().to_string()))
    }

    /// One client, one key: every spelling of an address names the same key (an IPv6
    /// address's is its /64), and no spelling that is not an address is taken.
    #[test]
    fn an_address_is_its_canonical_text() {
        for (given, key) in [
            ("203.0.113.9", "203.0.113.9"),
            ("0.0.0.0", "0.0.0.0"),
            ("::ffff:203.0.113.9", "203.0.113.9"),
            ("2001:DB8:0:0:0:0:0:1", "2001:db8::/64"),
            ("2001:db8::1", "2001:db8::/64"),
            ("2001:db8::ffff:1", "2001:db8::/64"),
        ] {
            assert_eq!(ip_of(given).unwrap().as_deref(), Some(key), "{given}");
        }
        for bad in [
            "203.0.113.09",
            "203.0.113",
            " 203.0.113.9",
            "203.0.113.9 ",
            "0x1.2.3.4",
        ] {
            let err = ip_of(bad).unwrap_err();
            assert_eq!(err.field(), Some("ip"), "{bad}");
        }
    }
}
