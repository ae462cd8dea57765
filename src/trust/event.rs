//! `POST /v1/events` bodies: one event object, or `{"events": [...]}` with 1 to
//! [`MAX_BATCH`] events, become typed [`Event`]s or an error naming the field
//! (`events[3].user_id`). Nothing is half-accepted: the first invalid event refuses the
//! whole body. A batch body holds `events` only, and an event the fields of its type only
//! ([`EventKind::fields`]): a misspelt `devce_id` would otherwise pass a challenge for every
//! device, or refund a key the backend did not mean. A `benefit_rolled_back` carries the
//! check's dimension values ([`crate::refund::FIELDS`]), which the refund parser reads from
//! the same object.

use serde_json::{Map, Value};

use crate::input::{integer_text, too_long, RequestError, MAX_ID_LEN};

/// Most events one request may carry: a backlog replays in batches, and a batch is one
/// sled transaction held in memory until it commits.
pub const MAX_BATCH: usize = 1000;

/// Longest event id, in characters.
pub const MAX_EVENT_ID_LEN: usize = 128;

/// What happened: an event's `type`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[schema(as = EventType)]
pub enum EventKind {
    PaymentSucceeded,
    IdentityVerified,
    ChallengePassed,
    BenefitRolledBack,
}

impl EventKind {
    /// The wire name, also the `type` label of the events metric.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::PaymentSucceeded => "payment_succeeded",
            EventKind::IdentityVerified => "identity_verified",
            EventKind::ChallengePassed => "challenge_passed",
            EventKind::BenefitRolledBack => "benefit_rolled_back",
        }
    }

    /// The kinds that award trust points (the others carry no user's points).
    pub const AWARDS: [EventKind; 2] = [EventKind::PaymentSucceeded, EventKind::IdentityVerified];

    const ALL: [EventKind; 4] = [
        EventKind::PaymentSucceeded,
        EventKind::IdentityVerified,
        EventKind::ChallengePassed,
        EventKind::BenefitRolledBack,
    ];

    fn from_name(s: &str) -> Option<EventKind> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Every field an event of this type may carry; another is refused, naming it.
    pub fn fields(self) -> Vec<&'static str> {
        let extra: &[&'static str] = match self {
            EventKind::PaymentSucceeded | EventKind::IdentityVerified => &[],
            EventKind::ChallengePassed => &["device_id", "scene"],
            EventKind::BenefitRolledBack => &crate::refund::FIELDS,
        };
        let mut fields = COMMON_FIELDS.to_vec();
        fields.extend(extra.iter().filter(|f| !COMMON_FIELDS.contains(f)));
        fields
    }
}

/// The fields of every event.
const COMMON_FIELDS: [&str; 4] = ["event_id", "type", "user_id", "occurred_at"];

/// One valid event. `raw` is its JSON object, for the refund parser.
#[derive(Debug, Clone)]
pub struct Event<'a> {
    /// Where the event sits in the body, as a field-path prefix: `events[3].`, or empty
    /// for a single-event body.
    pub at: String,
    pub event_id: String,
    pub kind: EventKind,
    pub user_id: Option<String>,
    /// Unix ms (0 for anything before the epoch: such an event has long expired).
    pub occurred_at_ms: u64,
    /// `challenge_passed`: the scene it was passed for (`None`: every scene that
    /// challenges) and the device it was passed on (`None`: any).
    pub scene: Option<String>,
    pub device_id: Option<String>,
    pub raw: &'a Value,
}

/// An invalid body: which event (as a field-path prefix) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub at: String,
    pub error: RequestError,
    /// The event's type when it had a valid one (for the metric label).
    pub kind: Option<EventKind>,
}

fn invalid(at: &str, field: &str, message: impl Into<String>) -> Invalid {
    Invalid {
        at: at.to_string(),
        error: RequestError::InvalidField {
            field: field.to_string(),
            message: message.into(),
        },
        kind: None,
    }
}

/// Parses a whole body; the first invalid event refuses it.
pub fn parse_body(body: &Value) -> Result<Vec<Event<'_>>, Invalid> {
    let Some(obj) = body.as_object() else {
        return Err(Invalid {
            at: String::new(),
            error: RequestError::InvalidJson("the body must be a JSON object".into()),
            kind: None,
        });
    };
    let Some(events) = obj.get("events") else {
        return Ok(vec![parse_event(String::new(), body)?]);
    };
    // A body that is a batch and looks like an event too is refused, not read as the batch
    // alone: the event would be dropped without a word.
    if let Some(other) = obj.keys().find(|k| *k != "events") {
        return Err(invalid(
            "",
            &crate::input::truncate(other),
            "a batch body holds `events` only",
        ));
    }
    let Value::Array(events) = events else {
        return Err(invalid("", "events", "must be an array of events"));
    };
    if events.is_empty() {
        return Err(invalid("", "events", "must hold at least one event"));
    }
    if events.len() > MAX_BATCH {
        return Err(invalid(
            "",
            "events",
            format!(
                "holds {} events; at most {MAX_BATCH} per request",
                events.len()
            ),
        ));
    }
    events
        .iter()
        .enumerate()
        .map(|(i, e)| parse_event(format!("events[{i}]."), e))
        .collect()
}

fn parse_event(at: String, value: &Value) -> Result<Event<'_>, Invalid> {
    let Some(obj) = value.as_object() else {
        // `events[3].` names the element itself without its trailing dot.
        let field = at.trim_end_matches('.').to_string();
        return Err(invalid("", &field, "must be an event object"));
    };
    let kind = match obj.get("type") {
        None | Some(Value::Null) => return Err(invalid(&at, "type", "is required")),
        Some(Value::String(s)) => EventKind::from_name(s).ok_or_else(|| {
            invalid(
                &at,
                "type",
                "must be payment_succeeded, identity_verified, challenge_passed or benefit_rolled_back",
            )
        })?,
        Some(_) => return Err(invalid(&at, "type", "must be a string")),
    };
    let with_kind = |mut e: Invalid| {
        e.kind = Some(kind);
        e
    };
    let fields = kind.fields();
    if let Some(unknown) = obj.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(with_kind(invalid(
            &at,
            &crate::input::truncate(unknown),
            format!(
                "is not a field of a {} event ({})",
                kind.name(),
                fields.join(", ")
            ),
        )));
    }
    let event_id = event_id(&at, obj).map_err(with_kind)?;
    let user_id = user_id(&at, obj).map_err(with_kind)?;
    if user_id.is_none() && kind != EventKind::BenefitRolledBack {
        return Err(with_kind(invalid(
            &at,
            "user_id",
            format!("is required for {}", kind.name()),
        )));
    }
    let occurred_at_ms = occurred_at(&at, obj).map_err(with_kind)?;
    // Only a pass reads these here (a rollback's scene and dimensions are the refund
    // parser's, from `raw`).
    let (scene, device_id) = if kind == EventKind::ChallengePassed {
        (
            text(&at, obj, "scene").map_err(with_kind)?,
            id(&at, obj, "device_id").map_err(with_kind)?,
        )
    } else {
        (None, None)
    };
    Ok(Event {
        at,
        event_id,
        kind,
        user_id,
        occurred_at_ms,
        scene,
        device_id,
        raw: value,
    })
}

fn event_id(at: &str, obj: &Map<String, Value>) -> Result<String, Invalid> {
    match obj.get("event_id") {
        None | Some(Value::Null) => Err(invalid(at, "event_id", "is required")),
        Some(Value::String(s)) if s.is_empty() => Err(invalid(at, "event_id", "must not be empty")),
        Some(Value::String(s)) if s.chars().nth(MAX_EVENT_ID_LEN).is_some() => Err(invalid(
            at,
            "event_id",
            format!(
                "is {} characters; at most {MAX_EVENT_ID_LEN}",
                s.chars().count()
            ),
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(invalid(at, "event_id", "must be a string")),
    }
}

fn user_id(at: &str, obj: &Map<String, Value>) -> Result<Option<String>, Invalid> {
    id(at, obj, "user_id")
}

/// A string or integer id, as `/v1/check` takes it, so `10086` and `"10086"` are one user.
fn id(at: &str, obj: &Map<String, Value>, field: &str) -> Result<Option<String>, Invalid> {
    let s = match obj.get(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => {
            integer_text(n).ok_or_else(|| invalid(at, field, "must be a string or an integer"))?
        }
        Some(_) => return Err(invalid(at, field, "must be a string or an integer")),
    };
    if s.is_empty() {
        return Err(invalid(at, field, "must not be empty"));
    }
    if too_long(&s) {
        return Err(invalid(
            at,
            field,
            format!("is {} characters; at most {MAX_ID_LEN}", s.chars().count()),
        ));
    }
    Ok(Some(s))
}

/// An optional non-empty string.
fn text(at: &str, obj: &Map<String, Value>, field: &str) -> Result<Option<String>, Invalid> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Err(invalid(at, field, "must not be empty")),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(at, field, "must be a string")),
    }
}

fn occurred_at(at: &str, obj: &Map<String, Value>) -> Result<u64, Invalid> {
    match obj.get("occurred_at") {
        None | Some(Value::Null) => Err(invalid(at, "occurred_at", "is required")),
        Some(Value::String(s)) => crate::input::rfc3339(s)
            .map(|t| u64::try_from(t.timestamp_millis()).unwrap_or(0))
            .map_err(|e| invalid(at, "occurred_at", format!("is not RFC 3339: {e}"))),
        Some(_) => Err(invalid(at, "occurred_at", "must be an RFC 3339 string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pay(id: &str) -> Value {
        json!({"event_id": id, "type": "payment_succeeded", "user_id": 10086,
               "occurred_at": "2026-01-02T03:04:05Z"})
    }

    fn field(e: &Invalid) -> String {
        format!("{}{}", e.at, e.error.field().unwrap_or(""))
    }

    #[test]
    fn one_event_or_a_batch() {
        let single = pay("e1");
        let events = parse_body(&single).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].user_id.as_deref(), Some("10086"));
        assert_eq!(events[0].occurred_at_ms, 1_767_323_045_000);
        assert_eq!(events[0].at, "");
        let batch = json!({"events": [pay("e1"), pay("e2")]});
        let events = parse_body(&batch).unwrap();
        assert_eq!(events[1].at, "events[1].");
        assert_eq!(events[1].event_id, "e2");
    }

    #[test]
    fn errors_name_the_event_and_field() {
        let mut bad = pay("e2");
        bad["user_id"] = json!(null);
        let e = parse_body(&json!({"events": [pay("e1"), bad]})).unwrap_err();
        assert_eq!(field(&e), "events[1].user_id");
        assert_eq!(e.kind, Some(EventKind::PaymentSucceeded));

        let mut bad = pay("e2");
        bad["occurred_at"] = json!("yesterday");
        let e = parse_body(&json!({"events": [bad]})).unwrap_err();
        assert_eq!(field(&e), "events[0].occurred_at");

        let e = parse_body(&json!({"events": [pay("e1"), 7]})).unwrap_err();
        assert_eq!(field(&e), "events[1]");

        let e = parse_body(
            &json!({"event_id": "x".repeat(129), "type": "payment_succeeded",
            "user_id": "u", "occurred_at": "2026-01-02T03:04:05Z"}),
        )
        .unwrap_err();
        assert_eq!(field(&e), "event_id");

        let e = parse_body(&json!({"event_id": "e", "type": "refund"})).unwrap_err();
        assert_eq!(field(&e), "type");

        let e = parse_body(&json!({"events": []})).unwrap_err();
        assert_eq!(field(&e), "events");
        let many: Vec<Value> = (0..=MAX_BATCH).map(|i| pay(&i.to_string())).collect();
        let e = parse_body(&json!({ "events": many })).unwrap_err();
        assert_eq!(field(&e), "events");
    }

    #[test]
    fn a_pass_names_its_scene_and_device_or_neither() {
        let pass = json!({"event_id": "p", "type": "challenge_passed", "user_id": 7,
                          "device_id": 12345678, "scene": "claim",
                          "occurred_at": "2026-01-02T03:04:05Z"});
        let events = parse_body(&pass).unwrap();
        assert_eq!(events[0].kind, EventKind::ChallengePassed);
        assert_eq!(events[0].scene.as_deref(), Some("claim"));
        assert_eq!(events[0].device_id.as_deref(), Some("12345678"));
        let bare = json!({"event_id": "p", "type": "challenge_passed", "user_id": "u",
                          "occurred_at": "2026-01-02T03:04:05Z"});
        let events = parse_body(&bare).unwrap();
        assert_eq!(
            (events[0].scene.as_ref(), events[0].device_id.as_ref()),
            (None, None)
        );
        for (field_name, bad) in [
            ("scene", json!(3)),
            ("scene", json!("")),
            ("device_id", json!([])),
        ] {
            let mut e = bare.clone();
            e[field_name] = bad;
            assert_eq!(field(&parse_body(&e).unwrap_err()), field_name);
        }
        let mut no_user = bare.clone();
        no_user.as_object_mut().unwrap().remove("user_id");
        assert_eq!(field(&parse_body(&no_user).unwrap_err()), "user_id");
    }

    /// A field its type does not carry is refused, naming it (and the event); the fields
    /// of a rollback are a refund's.
    #[test]
    fn an_unknown_field_is_refused_naming_it() {
        let mut e = pay("e1");
        e["amount"] = json!(12);
        let err = parse_body(&json!({"events": [pay("e0"), e]})).unwrap_err();
        assert_eq!(field(&err), "events[1].amount");
        assert_eq!(err.kind, Some(EventKind::PaymentSucceeded));
        let pass = json!({"event_id": "p", "type": "challenge_passed", "user_id": "u",
                          "devce_id": "dev-0001", "occurred_at": "2026-01-02T03:04:05Z"});
        assert_eq!(field(&parse_body(&pass).unwrap_err()), "devce_id");
        let rollback = json!({"event_id": "r", "type": "benefit_rolled_back", "scene": "s",
                              "request_id": "req1", "user_id": "u", "device_id": "d",
                              "ip": "192.0.2.1", "activity_id": "a", "attrs": {},
                              "occurred_at": "2026-01-02T03:04:05Z"});
        parse_body(&rollback).expect("a refund's fields");
        let mut copied = rollback.clone();
        copied["dry_run"] = json!(false);
        assert_eq!(field(&parse_body(&copied).unwrap_err()), "dry_run");
    }

    #[test]
    fn a_rollback_needs_no_user() {
        let e = json!({"event_id": "r", "type": "benefit_rolled_back", "scene": "s",
                       "request_id": "req1", "occurred_at": "2026-01-02T03:04:05+01:00"});
        let events = parse_body(&e).unwrap();
        assert_eq!(events[0].kind, EventKind::BenefitRolledBack);
        assert_eq!(events[0].user_id, None);
    }
}
