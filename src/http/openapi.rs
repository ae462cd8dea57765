//! What `/openapi.json` adds to the derived [`super::ApiDoc`]: the bearer schemes, the 405
//! every route answers, and the request bodies narrowed to the rule set in force.
//!
//! Which scenes exist, which dimensions each requires and which attributes are declared
//! are the rule files' to say, not the code's: a document that said "any string" for
//! `scene` would describe requests the service refuses, and a generated client could not
//! form a valid call. So the served document is the derived one, specialised per scene
//! from the same `RuleSet` the handlers validate against.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::Modify;

use crate::rules::{Dimension, RuleSet, Scene};

/// The two bearer tokens of `[auth]`: `check_token` for `/v1/check`, `admin_token` for
/// the admin surface; and, for the ops page a browser opens, the admin token as a Basic
/// password. Each operation names the ones it takes.
pub struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = |description: &str| {
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(description))
                    .build(),
            )
        };
        components.add_security_scheme(
            "check_token",
            bearer("`[auth].check_token`; when the service has none, /v1/check needs no token"),
        );
        components.add_security_scheme(
            "admin_basic",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Basic)
                    .description(Some(
                        "the ops page and its data only: any user name, `[auth].admin_token` as the password (what a browser sends after asking)",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "admin_token",
            bearer(
                "`[auth].admin_token`; when the service has none, only loopback peers are admins",
            ),
        );
    }
}

/// Every operation's response map, mutably.
fn responses_mut(doc: &mut Value) -> impl Iterator<Item = &mut Map<String, Value>> {
    doc.get_mut("paths")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(Value::as_object_mut)
        .flat_map(|ops| ops.values_mut())
        .filter_map(|op| op.get_mut("responses").and_then(Value::as_object_mut))
}

/// The 405 (with its `Allow` header) every route answers to another method (see
/// `super::route`), documented once here rather than on each handler.
pub fn add_method_not_allowed(doc: &mut Value) {
    let not_allowed = json!({
        "description": "the route exists, not for this method",
        "headers": {"Allow": {"description": "the method the route answers", "schema": {"type": "string"}}},
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    });
    for responses in responses_mut(doc) {
        responses.insert("405".into(), not_allowed.clone());
    }
}

/// Every header the document names is sent with every answer of its status (the handlers
/// and `ApiError` set them unconditionally), so each is marked `required`, which utoipa's
/// header type cannot say: a client may rely on `Retry-After` with a 429.
pub fn require_documented_headers(doc: &mut Value) {
    for responses in responses_mut(doc) {
        for response in responses.values_mut() {
            let headers = response
                .get_mut("headers")
                .and_then(Value::as_object_mut)
                .into_iter()
                .flat_map(|h| h.values_mut())
                .filter_map(Value::as_object_mut);
            for header in headers {
                header.insert("required".into(), Value::Bool(true));
            }
        }
    }
}

/// A body with `events` is a batch (which holds nothing else), so a single event may not
/// carry that field; said here because utoipa's derive has no "forbidden property".
pub fn forbid_events_in_single_events(doc: &mut Value) {
    for name in ["AwardEvent", "PassEvent", "RollbackEvent"] {
        let pointer = format!("/components/schemas/{name}/properties");
        if let Some(props) = doc.pointer_mut(&pointer).and_then(Value::as_object_mut) {
            props.insert(
                "events".into(),
                json!({"not": {}, "description": "a body with `events` is a batch"}),
            );
        }
    }
}

/// Replaces the `CheckBody`, `RefundBody` and `RollbackEvent` schemas by a `oneOf` with one
/// variant per scene of `rules`: `scene` is that scene's name, the dimensions the service
/// demands of it are required (and not null), and `attrs` holds the declared attributes
/// with their patterns.
pub fn narrow_to_rules(doc: &mut Value, rules: &RuleSet) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (name, demanded) in [
        ("CheckBody", check_fields as fn(&Scene) -> BTreeSet<String>),
        ("RefundBody", refund_fields),
        ("RollbackEvent", refund_fields),
    ] {
        if let Some(schema) = schemas.get_mut(name) {
            *schema = per_scene(schema, rules, demanded);
        }
    }
    if let Some(props) = schemas
        .get_mut("PassEvent")
        .and_then(|s| s.get_mut("properties"))
        .and_then(Value::as_object_mut)
    {
        narrow_pass(props, rules);
    }
}

/// A `challenge_passed` event under `rules`: its `scene`, when given, is one that can
/// challenge (the service refuses any other, `crate::trust::events`), so with no such
/// scene it can only be absent; its `device_id` matches `[validation].device_id`, which the
/// service applies to a pass's device (a 400, where a check's forged device is a silent
/// deny).
fn narrow_pass(props: &mut Map<String, Value>, rules: &RuleSet) {
    let challenging: Vec<&str> = rules
        .scenes
        .values()
        .filter(|s| s.challenge.is_some())
        .map(|s| s.name.as_str())
        .collect();
    let description = props.get("scene").and_then(description_of);
    let mut scene = if challenging.is_empty() {
        json!({"type": "null"})
    } else {
        json!({"oneOf": [{"type": "null"}, {"type": "string", "enum": challenging}]})
    };
    if let Some(d) = description {
        scene["description"] = d;
    }
    props.insert("scene".into(), scene);
    if let Some(pattern) = &rules.validation.device_id {
        // A string only: an integer id is read as its decimal text, which a pattern
        // cannot be checked to admit; a client sends device ids as strings.
        let mut device = json!({"oneOf": [{"type": "null"}, {
            "type": "string",
            "minLength": 1,
            "maxLength": crate::input::MAX_ID_LEN,
            "pattern": pattern.as_str(),
        }]});
        if let Some(d) = props.get("device_id").and_then(description_of) {
            device["description"] = d;
        }
        props.insert("device_id".into(), device);
    }
}

/// The fields a check of `scene` must carry: its required dimensions (see
/// `check::request`).
fn check_fields(scene: &Scene) -> BTreeSet<String> {
    scene
        .required
        .iter()
        .map(|d| d.request_field().into_owned())
        .collect()
}

/// The fields a refund of `scene` must carry: every dimension the scene requires, even
/// one no limit counts on, since the request's record is found through them (see
/// `crate::refund::require`).
fn refund_fields(scene: &Scene) -> BTreeSet<String> {
    check_fields(scene)
}

fn per_scene(base: &Value, rules: &RuleSet, demanded: fn(&Scene) -> BTreeSet<String>) -> Value {
    let variants: Vec<Value> = rules
        .scenes
        .values()
        .map(|scene| variant(base, rules, scene, &demanded(scene)))
        .collect();
    let mut narrowed = Map::new();
    if let Some(description) = base.get("description") {
        narrowed.insert("description".into(), description.clone());
    }
    if variants.is_empty() {
        // No scene: every request is refused (`unknown_scene`).
        narrowed.insert("not".into(), json!({}));
    } else {
        narrowed.insert("oneOf".into(), Value::Array(variants));
    }
    Value::Object(narrowed)
}

fn variant(base: &Value, rules: &RuleSet, scene: &Scene, demanded: &BTreeSet<String>) -> Value {
    let mut schema = base.clone();
    if let Some(obj) = schema.as_object_mut() {
        obj.remove("description");
        obj.insert("title".into(), Value::String(scene.name.clone()));
    }
    // `attrs.NAME` fields are demanded inside `attrs`; the rest at the top.
    let attrs_demanded: Vec<&str> = scene
        .required
        .iter()
        .filter_map(|d| match d {
            Dimension::Attr(name) => Some(&**name),
            _ => None,
        })
        .filter(|name| demanded.contains(&format!("attrs.{name}")))
        .collect();
    let top: BTreeSet<String> = demanded
        .iter()
        .map(|f| f.split('.').next().unwrap_or(f).to_string())
        .collect();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert(
            "scene".into(),
            json!({"type": "string", "enum": [scene.name]}),
        );
        if props.contains_key("attrs") {
            props.insert("attrs".into(), attrs_schema(rules, &attrs_demanded));
        }
        for field in &top {
            if let Some(prop) = props.get_mut(field) {
                *prop = not_null(prop.take());
            }
        }
    }
    if let Some(obj) = schema.as_object_mut() {
        let mut required: BTreeSet<String> = obj
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        required.extend(top);
        required.insert("scene".into());
        obj.insert(
            "required".into(),
            Value::Array(required.into_iter().map(Value::String).collect()),
        );
    }
    schema
}

/// `attrs`: the declared attributes, each a string matching its pattern (null counts as
/// absent), none other; `demanded` ones present and not null.
fn attrs_schema(rules: &RuleSet, demanded: &[&str]) -> Value {
    let properties: Map<String, Value> = rules
        .attributes
        .iter()
        .map(|(name, attr)| {
            let mut value = json!({
                "type": "string",
                "minLength": 1,
                "maxLength": crate::input::MAX_ID_LEN,
                "pattern": attr.pattern.as_str(),
            });
            if !demanded.contains(&&**name) {
                value = json!({"oneOf": [{"type": "null"}, value]});
            }
            (name.to_string(), value)
        })
        .collect();
    let mut schema = json!({
        "type": if demanded.is_empty() { json!(["object", "null"]) } else { json!("object") },
        "properties": properties,
        "additionalProperties": false,
    });
    if !demanded.is_empty() {
        schema["required"] = json!(demanded);
    }
    schema
}

/// A property's description: utoipa writes it beside the property's schema, or (for an
/// optional reference) inside the referring alternative of its `oneOf`.
fn description_of(prop: &Value) -> Option<Value> {
    prop.get("description").cloned().or_else(|| {
        prop.get("oneOf")?
            .as_array()?
            .iter()
            .find_map(|alt| alt.get("description").cloned())
    })
}

/// The schema without its `null` alternative: a demanded field that is null is missing.
fn not_null(schema: Value) -> Value {
    let is_null = |s: &Value| s.get("type") == Some(&json!("null"));
    match schema {
        Value::Object(mut obj) => {
            let only_one_of = obj.len() == 1;
            if let Some(Value::Array(alternatives)) = obj.get_mut("oneOf") {
                alternatives.retain(|s| !is_null(s));
                if alternatives.len() == 1 && only_one_of {
                    return alternatives.remove(0);
                }
            }
            if let Some(Value::Array(types)) = obj.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    obj.insert("type".into(), only);
                }
            }
            Value::Object(obj)
        }
        other => other,
    }
}
