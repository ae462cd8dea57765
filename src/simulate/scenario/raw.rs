//! The on-disk model of a scenario file: exactly what an author may write, nothing more.
//!
//! Every table denies unknown fields, so `acounts = 1500` is an error instead of an
//! attacker-free scenario. Values that need checking keep their byte span ([`Spanned`]) so
//! [`super::spec`] can name the line; numbers stay `i64` and durations, times and CIDRs
//! stay strings here, so a bad value is reported in the author's words ("-3 is less than
//! 1") rather than serde's ("invalid value: integer `-3`, expected u64").

use std::ops::Range;

use serde::Deserialize;
use toml::de::{DeTable, DeValue, ValueDeserializer};
use toml::Spanned;

use crate::rules::path_to;

/// An integer as written.
pub type Int = Spanned<i64>;
/// A string as written (labels, durations, CIDRs, addresses).
pub type Text = Spanned<String>;
/// A share as written (`0.3`, or `0` and `1` as integers).
pub type Share = Spanned<f64>;
/// A price as written (`0.35`, or an integer).
pub type Price = Spanned<f64>;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScenario {
    pub seed: Int,
    pub scene: Text,
    /// A string or a bare TOML date-time: both are RFC 3339 to an author.
    pub start: Spanned<toml::Value>,
    pub span: Text,
    pub activity_id: Option<Text>,
    pub honest: Option<RawHonest>,
    #[serde(default)]
    pub nat: Vec<RawNat>,
    #[serde(default)]
    pub attacker: Vec<RawAttacker>,
}

/// `[honest]`. The habit fields repeat in [`RawNat`] rather than being flattened:
/// serde's `flatten` defeats both `deny_unknown_fields` and spans.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHonest {
    pub label: Option<Text>,
    pub users: Int,
    pub networks: Option<Int>,
    pub claims: Option<Int>,
    pub paid_share: Option<Share>,
    pub new_share: Option<Share>,
    pub double_click_share: Option<Share>,
    pub challenge_pass: Option<Share>,
    pub rush: Option<Spanned<RawRush>>,
}

/// One `[[nat]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNat {
    pub label: Option<Text>,
    pub users: Int,
    pub cidr: Text,
    pub addresses: Int,
    pub claims: Option<Int>,
    pub paid_share: Option<Share>,
    pub new_share: Option<Share>,
    pub double_click_share: Option<Share>,
    pub challenge_pass: Option<Share>,
    pub rush: Option<Spanned<RawRush>>,
}

/// `rush = { share = 0.6, within = "5m" }`: both required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRush {
    pub share: Share,
    pub within: Text,
}

/// The habit fields `[honest]` and `[[nat]]` share, borrowed from either.
pub struct RawHabits<'a> {
    pub claims: Option<&'a Int>,
    pub paid_share: Option<&'a Share>,
    pub new_share: Option<&'a Share>,
    pub double_click_share: Option<&'a Share>,
    pub challenge_pass: Option<&'a Share>,
    pub rush: Option<&'a Spanned<RawRush>>,
}

impl RawHonest {
    pub fn habits(&self) -> RawHabits<'_> {
        RawHabits {
            claims: self.claims.as_ref(),
            paid_share: self.paid_share.as_ref(),
            new_share: self.new_share.as_ref(),
            double_click_share: self.double_click_share.as_ref(),
            challenge_pass: self.challenge_pass.as_ref(),
            rush: self.rush.as_ref(),
        }
    }
}

impl RawNat {
    pub fn habits(&self) -> RawHabits<'_> {
        RawHabits {
            claims: self.claims.as_ref(),
            paid_share: self.paid_share.as_ref(),
            new_share: self.new_share.as_ref(),
            double_click_share: self.double_click_share.as_ref(),
            challenge_pass: self.challenge_pass.as_ref(),
            rush: self.rush.as_ref(),
        }
    }
}

/// One `[[attacker]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAttacker {
    pub label: Option<Text>,
    pub accounts: Int,
    /// A count, or `"per_account"`: read as a plain value so either is accepted and
    /// anything else gets an error listing both.
    pub devices: Spanned<toml::Value>,
    pub proxies: Spanned<RawProxies>,
    pub tries: Int,
    pub account_age: Text,
    pub arrive_within: Text,
    pub interval: Text,
    pub paid_share: Option<Share>,
    pub challenge_pass: Option<Share>,
    pub cost: Option<Spanned<RawCost>>,
}

/// `cost = { account = .., proxy_address = .., device = .., challenge_solved = .. }`: each
/// optional, at least one checked in `spec`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCost {
    pub account: Option<Price>,
    pub proxy_address: Option<Price>,
    pub device: Option<Price>,
    pub challenge_solved: Option<Price>,
}

/// `proxies = { cidrs = [...] }`, `{ addresses = [...] }` or `{ random_networks = N }`:
/// exactly one, checked in `spec` so the error can say so.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProxies {
    pub cidrs: Option<Vec<Text>>,
    pub addresses: Option<Vec<Text>>,
    pub random_networks: Option<Int>,
}

/// Why a file could not be read into a [`RawScenario`].
#[derive(Debug)]
pub enum ReadError {
    /// The text is not TOML.
    Syntax { span: Range<usize>, message: String },
    /// TOML, but a field is missing, unknown or of the wrong type.
    Field {
        span: Range<usize>,
        /// `nat[0].addresses`; `(top level)` when the error names no key.
        field: String,
        message: String,
    },
}

/// Parses and deserializes `text`.
///
/// The text is parsed once into toml's spanned tree and deserialized from it, so a serde
/// error can be traced back to the key or element it is about: the toml crate reports
/// only a byte span, and an author needs the field named.
pub fn read(text: &str) -> Result<RawScenario, ReadError> {
    let root = DeTable::parse(text).map_err(|e| ReadError::Syntax {
        span: e.span().unwrap_or(0..0),
        message: e.message().replace('\n', " "),
    })?;
    let root = Spanned::new(root.span(), DeValue::Table(root.into_inner()));
    let copy = root.clone();
    RawScenario::deserialize(ValueDeserializer::from(root)).map_err(|e| {
        let span = e.span().unwrap_or_else(|| copy.span());
        // An error about the whole file (a missing top-level key) is about no key in it.
        let mut field = if span.is_empty() || span == copy.span() {
            String::new()
        } else {
            path_to(&copy, &span)
        };
        let mut message = plain_types(e.message());
        // "missing field `x`" points at the table that lacks it: name the field itself.
        if let Some(missing) = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.strip_suffix('`'))
        {
            field = format!("{field}.{missing}");
            message = "is required".to_string();
        }
        let field = match field.trim_start_matches('.') {
            "" => "(top level)".to_string(),
            path => path.to_string(),
        };
        ReadError::Field {
            span,
            field,
            message,
        }
    })
}

/// serde names Rust types (`expected i64`); authors write TOML.
fn plain_types(message: &str) -> String {
    message
        .replace("expected i64", "expected an integer")
        .replace("expected f64", "expected a number")
        .replace('\n', " ")
}
