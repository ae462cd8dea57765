//! Compiles the set-wide sections: `[trust]` (points from payment and identity events,
//! new-account strictness) and `[validation]` (what a well-formed device id looks like).

use std::ops::Range;

use regex::Regex;
use toml::Spanned;

use super::diag::Diag;
use crate::rules::raw::{RawAward, RawNewAccount, RawTrust, RawValidation};
use crate::rules::{NewAccount, Trust, TrustAward, Validation};

/// Checks `[trust]`; `Some` only when wholly valid.
///
/// `at` locates the section (its `[trust]` header), for a missing required key.
pub fn compile_trust(d: &mut Diag, at: &Range<usize>, t: &RawTrust) -> Option<Trust> {
    let payment_succeeded = award(d, "trust.payment_succeeded", t.payment_succeeded.as_ref());
    let identity_verified = award(d, "trust.identity_verified", t.identity_verified.as_ref());
    let max_points = match &t.max_points {
        Some(n) => d.at_least_u32("trust.max_points", n, 0),
        None => {
            d.at(
                at,
                "trust.max_points: missing (the most points a user can hold; 0 turns trust off)"
                    .to_string(),
            );
            None
        }
    };
    let bonus_per_point = match &t.bonus_per_point {
        Some(n) => d.at_least_u32("trust.bonus_per_point", n, 0),
        None => Some(0),
    };
    let score_discount_per_point = match &t.score_discount_per_point {
        Some(x) => d.fraction("trust.score_discount_per_point", x, true),
        None => Some(0.0),
    };
    let new_account = match &t.new_account {
        Some(n) => new_account(d, n.get_ref()).map(Some),
        None => Some(None),
    };
    Some(Trust {
        payment_succeeded: payment_succeeded?,
        identity_verified: identity_verified?,
        max_points: max_points?,
        bonus_per_point: bonus_per_point?,
        score_discount_per_point: score_discount_per_point?,
        new_account: new_account?,
    })
}

/// An optional award; `Some(None)` when absent.
fn award(d: &mut Diag, path: &str, raw: Option<&Spanned<RawAward>>) -> Option<Option<TrustAward>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let raw = raw.get_ref();
    let points = d.at_least_u32(&format!("{path}.points"), &raw.points, 0);
    let ttl_ms = d.duration(&format!("{path}.ttl"), &raw.ttl);
    Some(Some(TrustAward {
        points: points?,
        ttl_ms: ttl_ms?,
    }))
}

fn new_account(d: &mut Diag, raw: &RawNewAccount) -> Option<NewAccount> {
    let younger_than_ms = d.duration("trust.new_account.younger_than", &raw.younger_than);
    let max_factor = d.fraction("trust.new_account.max_factor", &raw.max_factor, false);
    Some(NewAccount {
        younger_than_ms: younger_than_ms?,
        max_factor: max_factor?,
    })
}

/// Checks `[validation]`: the device id pattern must be a valid regex.
pub fn compile_validation(d: &mut Diag, raw: &RawValidation) -> Option<Validation> {
    let Some(device_id) = &raw.device_id else {
        return Some(Validation { device_id: None });
    };
    let pattern = &device_id.get_ref().pattern;
    match Regex::new(pattern.get_ref()) {
        Ok(re) => Some(Validation {
            device_id: Some(re),
        }),
        Err(e) => {
            d.at(
                &pattern.span(),
                format!(
                    "validation.device_id.pattern: {:?} is not a valid regex: {}",
                    pattern.get_ref(),
                    regex_problem(&e)
                ),
            );
            None
        }
    }
}

/// The regex error on one line: its own text spans several, with a caret diagram.
fn regex_problem(e: &regex::Error) -> String {
    let text = e.to_string();
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(&text);
    last.trim().trim_start_matches("error: ").to_string()
}
