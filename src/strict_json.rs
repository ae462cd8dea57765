//! A JSON body read as a `serde_json::Value`, refusing an object that names a key twice.
//!
//! serde_json keeps the last of two equal keys without a word, so
//! `{"dry_run": true, …, "dry_run": false}` would be counted by one reader and taken as a
//! dry run by another (a proxy, a log, the backend's own validation). A body that says two
//! things is refused instead: a 400 `invalid_json` whose message names the key. Every body
//! the API reads goes through here — [`StrictJson`] for `/v1/refund` and `/v1/events`, and
//! `check::body` (which reads `/v1/check` without a `Value`) with the same [`duplicate_key`]
//! error.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// A JSON value in which no object names a key twice.
#[derive(Debug, Clone, PartialEq)]
pub struct StrictJson(pub Value);

impl std::ops::Deref for StrictJson {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.0
    }
}

/// The error of an object that names `key` twice (serde_json adds where).
pub fn duplicate_key<E: de::Error>(key: &str) -> E {
    E::custom(format_args!(
        "the key {:?} appears twice in one object; send it once",
        crate::input::truncate(key)
    ))
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        // As `Value` reads it (JSON has no NaN or infinity to lose).
        Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(StrictJson(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(duplicate_key(&key));
            }
            let StrictJson(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

impl<'de> Deserialize<'de> for StrictJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StrictJson, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictJson)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a repeated key, the value is exactly serde_json's.
    #[test]
    fn a_body_without_repeats_reads_as_its_value_does() {
        for text in [
            r#"{"scene":"s","user_id":10086,"n":1.5,"big":18446744073709551616,"neg":-3}"#,
            r#"{"events":[{"a":{"b":[1,{"c":null}]}},true,"x"]}"#,
            r#"[1,2,{"a":1}]"#,
            "3",
            "null",
        ] {
            let strict: StrictJson = serde_json::from_str(text).expect(text);
            let value: Value = serde_json::from_str(text).expect(text);
            assert_eq!(strict.0, value, "{text}");
        }
    }

    /// A key twice is an error naming it, at any depth.
    #[test]
    fn a_key_twice_in_any_object_is_refused_naming_it() {
        for (text, key) in [
            (r#"{"dry_run":true,"scene":"s","dry_run":false}"#, "dry_run"),
            (
                r#"{"events":[{"user_id":"a"},{"user_id":"a","user_id":"b"}]}"#,
                "user_id",
            ),
            (r#"{"attrs":{"tier":"a","tier":"b"}}"#, "tier"),
        ] {
            let e = serde_json::from_str::<StrictJson>(text).unwrap_err();
            assert!(
                e.to_string().contains(&format!("{key:?} appears twice")),
                "{e}"
            );
        }
        // The same key in two objects is no repeat.
        serde_json::from_str::<StrictJson>(r#"{"a":{"k":1},"b":{"k":2}}"#).expect("two objects");
    }
}
