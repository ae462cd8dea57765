//! A `/v1/check` body read straight from its bytes into its fields, without a
//! `serde_json::Value` tree in between (a map node and a key string per field, then a copy
//! of each value out of it: the hot path's largest parsing cost).
//!
//! It reads any JSON the `Value` route would: every field keeps whatever JSON it held
//! ([`Raw`]), so `check::request` judges it with the same readers and the same messages — a
//! number where a string belongs, an unknown field, a body that is no object. A key named
//! twice in one object (the body or `attrs`) is refused, as [`crate::strict_json`] refuses
//! it in the other bodies: `"dry_run": true, …, "dry_run": false` must not be counted.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::input::{Field, Fields};
use crate::strict_json::duplicate_key;

/// A field's JSON, owned. Arrays keep nothing: no reader takes one.
#[derive(Debug, Clone, PartialEq)]
pub enum Raw {
    Null,
    Bool(bool),
    Number(Number),
    Str(String),
    Array,
    Object(BTreeMap<String, Raw>),
}

impl Raw {
    fn field(&self) -> Field<'_> {
        match self {
            Raw::Null => Field::Null,
            Raw::Bool(b) => Field::Bool(*b),
            Raw::Number(n) => Field::Number(n),
            Raw::Str(s) => Field::Str(s),
            Raw::Array => Field::Array,
            Raw::Object(map) => Field::Object(map),
        }
    }

    fn to_value(&self) -> Value {
        match self {
            Raw::Null => Value::Null,
            Raw::Bool(b) => Value::Bool(*b),
            Raw::Number(n) => Value::Number(n.clone()),
            Raw::Str(s) => Value::String(s.clone()),
            Raw::Array => Value::Array(Vec::new()),
            Raw::Object(map) => {
                Value::Object(map.iter().map(|(k, v)| (k.clone(), v.to_value())).collect())
            }
        }
    }
}

impl Fields for BTreeMap<String, Raw> {
    fn field(&self, name: &str) -> Option<Field<'_>> {
        self.get(name).map(Raw::field)
    }

    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        Box::new(self.keys().map(String::as_str))
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Raw, E> {
        Ok(Raw::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Raw, E> {
        Ok(Raw::Number(n.into()))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Raw, E> {
        // As `Value` reads it (JSON has no NaN or infinity to lose).
        Ok(Number::from_f64(f).map_or(Raw::Null, Raw::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Raw, E> {
        Ok(Raw::Str(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Raw, E> {
        Ok(Raw::Str(s))
    }
    fn visit_unit<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Raw::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(duplicate_key(&k));
            }
            let v = map.next_value::<Raw>()?;
            out.insert(k, v);
        }
        Ok(Raw::Object(out))
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Raw, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

/// A `/v1/check` body: each field of the API as it came, the first unknown field's name
/// (refused by `check::request`), or that the body is no JSON object at all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawCheck {
    /// The body is valid JSON but not an object.
    pub not_object: bool,
    fields: [Option<Raw>; FIELDS.len()],
    /// The smallest unknown field name (the one a `Value` map would name first).
    unknown: Option<String>,
}

/// Every field a `/v1/check` body may carry: anything else is refused, so a misspelt
/// `dryRun` cannot record a real request.
pub const FIELDS: [&str; 10] = [
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

impl RawCheck {
    /// The body as a `serde_json::Value`, for the decision log and the recording (which
    /// write what the caller sent). Only read when one of them is on.
    pub fn to_value(&self) -> Value {
        let map: Map<String, Value> = FIELDS
            .iter()
            .zip(&self.fields)
            .filter_map(|(name, raw)| Some(((*name).to_owned(), raw.as_ref()?.to_value())))
            .collect();
        Value::Object(map)
    }
}

impl Fields for RawCheck {
    fn field(&self, name: &str) -> Option<Field<'_>> {
        let i = FIELDS.iter().position(|f| *f == name)?;
        self.fields[i].as_ref().map(Raw::field)
    }

    fn first_unknown(&self, known: &[&str]) -> Option<&str> {
        // The fields kept are FIELDS'; any other name is in `unknown`.
        self.unknown.as_deref().or_else(|| {
            FIELDS
                .iter()
                .zip(&self.fields)
                .filter(|(_, raw)| raw.is_some())
                .map(|(name, _)| *name)
                .filter(|name| !known.contains(name))
                .min()
        })
    }

    /// The known fields present and the first unknown one.
    fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        let mut names: Vec<&str> = FIELDS
            .iter()
            .zip(&self.fields)
            .filter(|(_, raw)| raw.is_some())
            .map(|(name, _)| *name)
            .chain(self.unknown.as_deref())
            .collect();
        names.sort_unstable();
        Box::new(names.into_iter())
    }
}

/// A field name, matched without allocating unless it is unknown.
enum Name {
    Known(usize),
    Unknown(String),
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
        struct NameVisitor;
        impl Visitor<'_> for NameVisitor {
            type Value = Name;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Name, E> {
                Ok(match FIELDS.iter().position(|f| *f == s) {
                    Some(i) => Name::Known(i),
                    None => Name::Unknown(s.to_owned()),
                })
            }
        }
        d.deserialize_str(NameVisitor)
    }
}

struct BodyVisitor;

impl<'de> Visitor<'de> for BodyVisitor {
    type Value = RawCheck;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawCheck, A::Error> {
        let mut body = RawCheck::default();
        // Unknown names, only to refuse one named twice as `StrictJson` does: the body is
        // refused for its first unknown field anyway, so this stays empty in a valid one. A
        // set, so 64 KiB of unknown names costs no quadratic search.
        let mut unknown_seen: HashSet<String> = HashSet::new();
        while let Some(name) = map.next_key::<Name>()? {
            match name {
                Name::Known(i) if body.fields[i].is_some() => {
                    return Err(duplicate_key(FIELDS[i]));
                }
                Name::Known(i) => body.fields[i] = Some(map.next_value::<Raw>()?),
                Name::Unknown(name) => {
                    if !unknown_seen.insert(name.clone()) {
                        return Err(duplicate_key(&name));
                    }
                    map.next_value::<IgnoredAny>()?;
                    if body.unknown.as_ref().is_none_or(|u| name < *u) {
                        body.unknown = Some(name);
                    }
                }
            }
        }
        Ok(body)
    }
    // Valid JSON that is no object: the request's error, not a JSON one.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawCheck, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(RawCheck::not_an_object())
    }
    fn visit_bool<E>(self, _: bool) -> Result<RawCheck, E> {
        Ok(RawCheck::not_an_object())
    }
    fn visit_i64<E>(self, _: i64) -> Result<RawCheck, E> {
        Ok(RawCheck::not_an_object())
    }
    fn visit_u64<E>(self, _: u64) -> Result<RawCheck, E> {
        Ok(RawCheck::not_an_object())
    }
    fn visit_f64<E>(self, _: f64) -> Result<RawCheck, E> {
        Ok(RawCheck::not_an_object())
    }
    fn visit_str<E>(self, _: &str) -> Result<RawCheck, E> {
        Ok(RawCheck::not_an_object())
    }
    fn visit_unit<E>(self) -> Result<RawCheck, E> {
        Ok(RawCheck::not_an_object())
    }
}

impl RawCheck {
    fn not_an_object() -> RawCheck {
        RawCheck {
            not_object: true,
            ..RawCheck::default()
        }
    }
}

impl<'de> Deserialize<'de> for RawCheck {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawCheck, D::Error> {
        d.deserialize_any(BodyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever JSON a body holds, the typed body gives back the `Value` of its known
    /// fields and names the same first unknown field a `Value` map would.
    #[test]
    fn a_body_reads_as_its_value_does() {
        let cases = [
            r#"{"scene":"s","user_id":10086,"ip":"1.2.3.4","dry_run":true}"#,
            r#"{"scene":"s","user_id":10086.0,"device_id":null,"attrs":{"tier":"gold","n":[1,{"a":2}]}}"#,
            r#"{"zz":1,"scene":"s","dryRun":true,"aa":{"x":[1,2]}}"#,
            r#"{"user_id":["x"],"ip":{"v":4},"activity_id":-3,"idempotency_key":"k\u00e9\"y"}"#,
            r#"{"user_id":18446744073709551616,"device_id":1e300}"#,
        ];
        for text in cases {
            let value: Value = serde_json::from_str(text).expect(text);
            let body: RawCheck = serde_json::from_str(text).expect(text);
            let obj = value.as_object().expect("an object");
            assert!(!body.not_object, "{text}");
            let known: Map<String, Value> = obj
                .iter()
                .filter(|(k, _)| FIELDS.contains(&k.as_str()))
                .map(|(k, v)| {
                    // Arrays keep nothing (no reader takes one).
                    let v = if v.is_array() {
                        Value::Array(vec![])
                    } else {
                        v.clone()
                    };
                    (k.clone(), v)
                })
                .collect();
            let mut expected = Value::Object(known);
            if let Some(Value::Object(attrs)) = expected.get_mut("attrs") {
                for v in attrs.values_mut() {
                    if v.is_array() {
                        *v = Value::Array(vec![]);
                    }
                }
            }
            assert_eq!(body.to_value(), expected, "{text}");
            assert_eq!(
                body.first_unknown(&FIELDS),
                obj.first_unknown(&FIELDS),
                "{text}"
            );
            let body_names: Vec<&str> = body.names().filter(|n| FIELDS.contains(n)).collect();
            let obj_names: Vec<&str> = obj.names().filter(|n| FIELDS.contains(n)).collect();
            assert_eq!(body_names, obj_names, "{text}");
        }
    }

    /// A key twice, known, unknown or inside `attrs`, is an error naming it, as
    /// `StrictJson` makes it for the other bodies.
    #[test]
    fn a_key_twice_is_refused_naming_it() {
        for (text, key) in [
            (r#"{"scene":"a","scene":"b","request_id":"r-1"}"#, "scene"),
            (r#"{"dry_run":true,"scene":"s","dry_run":false}"#, "dry_run"),
            (r#"{"scene":"s","dryRun":true,"dryRun":false}"#, "dryRun"),
            (r#"{"scene":"s","attrs":{"tier":"a","tier":"b"}}"#, "tier"),
        ] {
            let e = serde_json::from_str::<RawCheck>(text).unwrap_err();
            let strict = serde_json::from_str::<crate::strict_json::StrictJson>(text).unwrap_err();
            assert!(
                e.to_string().contains(&format!("{key:?} appears twice")),
                "{e}"
            );
            assert_eq!(e.to_string(), strict.to_string(), "{text}");
        }
    }

    #[test]
    fn valid_json_that_is_no_object_is_marked_not_bad_json() {
        for text in ["[]", "[1,{\"a\":2}]", "3", "-1.5", "\"s\"", "true", "null"] {
            let body: RawCheck = serde_json::from_str(text).expect(text);
            assert!(body.not_object, "{text}");
        }
        for bad in ["", "{", "{\"scene\":}", "{\"a\":1} x", "{\"a\":1,}"] {
            assert!(serde_json::from_str::<RawCheck>(bad).is_err(), "{bad:?}");
            assert!(serde_json::from_str::<Value>(bad).is_err(), "{bad:?}");
        }
    }
}
