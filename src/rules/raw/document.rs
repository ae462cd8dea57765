//! Reads one rule file into a [`RawFile`], part by part.
//!
//! The TOML is parsed once into the toml crate's spanned tree; then each part (a scene's
//! own keys, each limit, each override, behaviour, score, `[trust]`, `[validation]`) is
//! deserialized on its own. serde stops at a part's first error, so splitting finely is
//! what lets one run report every broken part of every file.

use serde::de::DeserializeOwned;
use toml::de::{DeString, DeTable, DeValue, ValueDeserializer};
use toml::Spanned;

use super::locate::{key_segment, path_to};
use super::{RawFile, RawScene, Source};
use crate::rules::RuleError;

/// The keys a rule file may hold at its top level.
const TOP_LEVEL: &str = "scene.NAME, [trust], [validation], [network] and [attributes]";

/// Parses `src` into its parts, with every problem found on the way.
///
/// Invalid TOML is one error at the line the parser stopped; anything else is reported
/// per part, and the parts that could be read are returned.
pub fn parse_file(src: &Source<'_>) -> (RawFile, Vec<RuleError>) {
    let mut errors = Vec::new();
    let mut file = RawFile::default();
    let root = match DeTable::parse(src.text) {
        Ok(root) => root,
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            let message = e.message().replace('\n', " ");
            errors.push(src.error(&span, format!("invalid TOML: {message}")));
            return (file, errors);
        }
    };
    for (key, value) in root.into_inner() {
        let key_span = key.span();
        match key.get_ref().as_ref() {
            "scene" => read_scenes(src, value, &mut file, &mut errors),
            "trust" => {
                let trust = read(src, "trust", value, &mut errors);
                file.trust = Some(Spanned::new(key_span, trust));
            }
            "validation" => {
                let validation = read(src, "validation", value, &mut errors);
                file.validation = Some(Spanned::new(key_span, validation));
            }
            "network" => {
                let network = read(src, "network", value, &mut errors);
                file.network = Some(Spanned::new(key_span, network));
            }
            "attributes" => {
                let attributes = read(src, "attributes", value, &mut errors);
                file.attributes = Some(Spanned::new(key_span, attributes));
            }
            other => errors.push(src.error(
                &key_span,
                format!(
                    "{}: unknown key (a rule file holds {TOP_LEVEL})",
                    key_segment(other).trim_start_matches('.')
                ),
            )),
        }
    }
    (file, errors)
}

fn read_scenes(
    src: &Source<'_>,
    value: Spanned<DeValue<'_>>,
    file: &mut RawFile,
    errors: &mut Vec<RuleError>,
) {
    let span = value.span();
    match value.into_inner() {
        DeValue::Table(scenes) => {
            for (name, body) in scenes {
                file.scenes.push(read_scene(src, name, body, errors));
            }
        }
        _ => errors.push(src.error(&span, "scene: expected tables [scene.NAME]")),
    }
}

fn read_scene(
    src: &Source<'_>,
    name: Spanned<DeString<'_>>,
    body: Spanned<DeValue<'_>>,
    errors: &mut Vec<RuleError>,
) -> RawScene {
    let path = format!("scene{}", key_segment(name.get_ref()));
    let mut scene = RawScene {
        name: Spanned::new(name.span(), name.into_inner().into_owned()),
        head: None,
        limits: Vec::new(),
        overrides: Vec::new(),
        signals: Vec::new(),
        behaviour: None,
        score: None,
        challenge: None,
        complete: false,
    };
    let body_span = body.span();
    let DeValue::Table(table) = body.into_inner() else {
        errors.push(src.error(&body_span, format!("{path}: expected a table")));
        return scene;
    };
    let mut complete = true;
    let mut head = DeTable::new();
    for (key, value) in table {
        let part = format!("{path}.{}", key.get_ref());
        match key.get_ref().as_ref() {
            "limits" => scene.limits = read_each(src, &part, value, &mut complete, errors),
            "overrides" => scene.overrides = read_each(src, &part, value, &mut complete, errors),
            "signals" => scene.signals = read_each(src, &part, value, &mut complete, errors),
            "behaviour" => {
                scene.behaviour = read(src, &part, value, errors);
                complete &= scene.behaviour.is_some();
            }
            "score" => {
                scene.score = read(src, &part, value, errors);
                complete &= scene.score.is_some();
            }
            "challenge" => {
                scene.challenge = read(src, &part, value, errors);
                complete &= scene.challenge.is_some();
            }
            _ => {
                head.insert(key, value);
            }
        }
    }
    scene.head = read(
        src,
        &path,
        Spanned::new(body_span, DeValue::Table(head)),
        errors,
    );
    let entries_ok = scene.limits.iter().all(Option::is_some)
        && scene.overrides.iter().all(Option::is_some)
        && scene.signals.iter().all(Option::is_some);
    scene.complete = complete && entries_ok && scene.head.is_some();
    scene
}

/// Reads an array of tables entry by entry; `None` marks an entry that could not be read.
fn read_each<T: DeserializeOwned>(
    src: &Source<'_>,
    path: &str,
    value: Spanned<DeValue<'_>>,
    complete: &mut bool,
    errors: &mut Vec<RuleError>,
) -> Vec<Option<T>> {
    let span = value.span();
    match value.into_inner() {
        DeValue::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| read(src, &format!("{path}[{i}]"), item, errors))
            .collect(),
        _ => {
            *complete = false;
            errors.push(src.error(
                &span,
                format!("{path}: expected an array of tables ([[{path}]])"),
            ));
            Vec::new()
        }
    }
}

/// Deserializes one part; on failure reports it under `path` plus the offending field.
fn read<T: DeserializeOwned>(
    src: &Source<'_>,
    path: &str,
    value: Spanned<DeValue<'_>>,
    errors: &mut Vec<RuleError>,
) -> Option<T> {
    let copy = value.clone();
    match T::deserialize(ValueDeserializer::from(value)) {
        Ok(part) => Some(part),
        Err(e) => {
            let span = e.span().unwrap_or_else(|| copy.span());
            let field = path_to(&copy, &span);
            let message = plain_types(e.message());
            errors.push(src.error(&span, format!("{path}{field}: {message}")));
            None
        }
    }
}

/// serde names Rust types (`expected i64`); operators write TOML.
fn plain_types(message: &str) -> String {
    message
        .replace("expected i64", "expected an integer")
        .replace("expected f64", "expected a number")
        .replace("expected u64", "expected an integer")
}
