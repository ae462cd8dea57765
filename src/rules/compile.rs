//! Turns rule files into a [`RuleSet`], or into every reason it cannot be one.
//!
//! This owns the rule set's validity: whatever a check, a key or a scorer could trip
//! over later is rejected here, with the file, the line and the field. Parts compile
//! independently and report into one list, so an operator fixes everything in one pass;
//! the list is sorted by file, then line.
//!
//! Set-wide rules live here too: a scene is defined in one file only, `[trust]` and
//! `[validation]` at most once, and `new_account` weights need `[trust].new_account`.

mod diag;
mod limits;
mod scene;
mod sections;
mod signals;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use toml::Spanned;

use super::load::{sorted, version_of};
use super::raw::{key_segment, parse_file, RawFile, Source};
use super::{Network, RuleError, RuleErrors, RuleSet, Scene, Validation};
use diag::Diag;
use scene::{compile_scene, NewAccountKnown, SetFacts, TrustShape};

/// Compiles rule files given as `(display path, contents)` into one rule set.
///
/// The display path is what errors show; its file name and the contents make the
/// version, so the same files give the same version wherever they are read from.
/// Every problem of every file is reported at once, sorted by file then line.
pub fn compile_files(files: &[(String, String)]) -> Result<RuleSet, RuleErrors> {
    let mut files: Vec<&(String, String)> = files.iter().collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));

    let mut errors = Vec::new();
    let parsed: Vec<(Source<'_>, RawFile)> = files
        .iter()
        .map(|(path, text)| {
            let src = Source::new(path, text);
            let (raw, errs) = parse_file(&src);
            errors.extend(errs);
            (src, raw)
        })
        .collect();

    let trust = compile_once(
        &parsed,
        "trust",
        |f| f.trust.as_ref(),
        &mut errors,
        sections::compile_trust,
    );
    let validation = compile_once(
        &parsed,
        "validation",
        |f| f.validation.as_ref(),
        &mut errors,
        |d, _, v| sections::compile_validation(d, v),
    );
    let network = compile_once(
        &parsed,
        "network",
        |f| f.network.as_ref(),
        &mut errors,
        sections::compile_network,
    );
    let attributes = compile_once(
        &parsed,
        "attributes",
        |f| f.attributes.as_ref(),
        &mut errors,
        sections::compile_attributes,
    );
    let facts = SetFacts {
        new_account: new_account_known(&parsed),
        attributes: attributes_known(&parsed),
        trust: trust_shape(&parsed),
        network: network_known(&parsed, network),
    };
    let scenes = compile_scenes(&parsed, &facts, &mut errors);

    if !errors.is_empty() {
        return Err(sorted(errors));
    }
    let version = version_of(files.iter().map(|(path, text)| {
        let name = Path::new(path)
            .file_name()
            .map_or_else(|| path.clone(), |n| n.to_string_lossy().into_owned());
        (name, text.as_str())
    }));
    Ok(RuleSet {
        version,
        scenes,
        trust,
        validation: validation.unwrap_or(Validation { device_id: None }),
        network: network.unwrap_or_default(),
        attributes: attributes.unwrap_or_default(),
    })
}

/// Compiles a section that may appear at most once in the whole set (`[trust]`,
/// `[validation]`); every later occurrence is an error naming the first.
/// `None` when the section is absent, or present but invalid (then it was reported).
fn compile_once<'a, R: 'a, T>(
    parsed: &'a [(Source<'a>, RawFile)],
    section: &str,
    get: impl Fn(&'a RawFile) -> Option<&'a Spanned<Option<R>>>,
    errors: &mut Vec<RuleError>,
    compile: impl FnOnce(&mut Diag, &Range<usize>, &R) -> Option<T>,
) -> Option<T> {
    let mut first: Option<(Source<'a>, &'a Spanned<Option<R>>)> = None;
    for (src, file) in parsed {
        let Some(found) = get(file) else {
            continue;
        };
        match &first {
            None => first = Some((*src, found)),
            Some((src0, found0)) => errors.push(src.error(
                &found.span(),
                format!(
                    "{section}: [{section}] is already defined at {}:{} (at most once in the rule set)",
                    src0.file,
                    src0.line_of(found0.span().start)
                ),
            )),
        }
    }
    let (src, found) = first?;
    let raw = found.get_ref().as_ref()?;
    compile(&mut Diag::new(src, errors), &found.span(), raw)
}

/// Whether any `[trust]` sets `new_account`; `None` when a broken `[trust]` hides it.
fn new_account_known(parsed: &[(Source<'_>, RawFile)]) -> NewAccountKnown {
    let sections = parsed.iter().filter_map(|(_, f)| f.trust.as_ref());
    let mut known = Some(false);
    for section in sections {
        match section.get_ref() {
            Some(t) if t.new_account.is_some() => return Some(true),
            Some(_) => {}
            None => known = None,
        }
    }
    known
}

/// What `[trust]` configures; `None` when a broken one hides it.
fn trust_shape(parsed: &[(Source<'_>, RawFile)]) -> Option<TrustShape> {
    let mut shape = TrustShape::default();
    for section in parsed.iter().filter_map(|(_, f)| f.trust.as_ref()) {
        let t = section.get_ref().as_ref()?;
        shape.present = true;
        shape.new_account |= t.new_account.is_some();
        shape.new_device |= t.new_device.is_some();
    }
    Some(shape)
}

/// The compiled `[network]`, its defaults when no file has one; `None` when a broken one
/// hides it.
fn network_known(parsed: &[(Source<'_>, RawFile)], compiled: Option<Network>) -> Option<Network> {
    let present = parsed.iter().any(|(_, f)| f.network.is_some());
    if present {
        compiled
    } else {
        Some(Network::default())
    }
}

/// The attribute names `[attributes]` declares; `None` when a broken one hides them.
fn attributes_known(parsed: &[(Source<'_>, RawFile)]) -> Option<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for section in parsed.iter().filter_map(|(_, f)| f.attributes.as_ref()) {
        let attrs = section.get_ref().as_ref()?;
        names.extend(attrs.0.keys().map(|k| k.get_ref().clone()));
    }
    Some(names)
}

/// Compiles every scene of every file; a scene defined in two files is an error at the
/// second, naming both.
fn compile_scenes(
    parsed: &[(Source<'_>, RawFile)],
    facts: &SetFacts,
    errors: &mut Vec<RuleError>,
) -> BTreeMap<String, Arc<Scene>> {
    let mut first_seen: BTreeMap<&str, String> = BTreeMap::new();
    let mut scenes = BTreeMap::new();
    for (src, file) in parsed {
        let mut d = Diag::new(*src, errors);
        for raw in &file.scenes {
            let name = raw.name.get_ref();
            let here = d.place(&raw.name.span());
            let compiled = compile_scene(&mut d, raw, facts);
            if let Some(there) = first_seen.get(name.as_str()) {
                d.at(
                    &raw.name.span(),
                    format!("scene{}: defined both at {there} and at {here} (a scene lives in one file)", key_segment(name)),
                );
                continue;
            }
            first_seen.insert(name, here);
            if let Some(scene) = compiled {
                scenes.insert(name.clone(), Arc::new(scene));
            }
        }
    }
    scenes
}
