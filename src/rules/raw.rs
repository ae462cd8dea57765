//! The on-disk model of a rule file: exactly what an operator may write, nothing more.
//!
//! Every type denies unknown fields, so a typo (`windw = "10s"`) is an error instead of a
//! silently ignored setting. Values that need checking keep their byte span
//! ([`Spanned`]) so `compile` can name the line. Enumerations and durations stay strings
//! here: `compile` parses them and says what was wrong in the operator's words, which
//! serde's generic "unknown variant" could not.
//!
//! A file is not deserialized in one go: [`document`] splits it into parts (each scene's
//! head, every limit, every override, behaviour, score, `[trust]`, `[validation]`) and
//! deserializes each part on its own, so one broken part does not hide the problems of
//! the others.

mod document;
mod locate;
mod source;

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

pub use document::parse_file;
pub use locate::{key_segment, path_to};
pub use source::Source;

/// A number as written; range checks happen in `compile` so they can name the field.
pub type Int = Spanned<i64>;
/// A string as written (enum names, durations, patterns, CIDRs).
pub type Text = Spanned<String>;

/// One parsed rule file. Parts that failed to deserialize are missing here and their
/// error is already reported; `complete` is false then, so cross-references into the
/// missing parts are not reported as dangling.
#[derive(Debug, Default)]
pub struct RawFile {
    pub scenes: Vec<RawScene>,
    /// `[trust]`, when the file has one. `None` inside: present but broken.
    pub trust: Option<Spanned<Option<RawTrust>>>,
    /// `[validation]`, when the file has one. `None` inside: present but broken.
    pub validation: Option<Spanned<Option<RawValidation>>>,
    /// `[network]`, when the file has one. `None` inside: present but broken.
    pub network: Option<Spanned<Option<RawNetwork>>>,
    /// `[attributes]`, when the file has one. `None` inside: present but broken.
    pub attributes: Option<Spanned<Option<RawAttributes>>>,
}

/// `[scene.NAME]` and its sub-tables, each part read on its own.
#[derive(Debug)]
pub struct RawScene {
    /// The scene name, spanned at its first mention in the file.
    pub name: Text,
    pub head: Option<RawSceneHead>,
    /// In file order; `None` for an entry that could not be read.
    pub limits: Vec<Option<RawLimit>>,
    /// In file order; `None` for an entry that could not be read.
    pub overrides: Vec<Option<RawOverride>>,
    /// `[[scene.NAME.signals]]` in file order; `None` for an entry that could not be read.
    pub signals: Vec<Option<RawSignalEntry>>,
    pub behaviour: Option<RawBehaviour>,
    pub score: Option<RawScore>,
    /// `[scene.NAME.challenge]`: what the backend is to ask of a person in the grey zone.
    pub challenge: Option<RawChallenge>,
    /// False when any part of the scene could not be read.
    pub complete: bool,
}

/// The scene's own keys (everything but its limits, overrides, behaviour and score).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a scene table")]
pub struct RawSceneHead {
    /// Required; an `Option` so the error can list the choices.
    pub on_store_error: Option<Text>,
    pub deny_message: Option<Spanned<String>>,
    #[serde(default)]
    pub required: Vec<Text>,
    pub gateway: Option<Spanned<RawGateway>>,
}

/// `gateway = { rate_per_s, burst }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table { rate_per_s, burst }")]
pub struct RawGateway {
    pub rate_per_s: Int,
    pub burst: Int,
}

/// One `[[scene.NAME.limits]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a limit table")]
pub struct RawLimit {
    pub name: Text,
    pub dimensions: Spanned<Vec<Text>>,
    pub algorithm: Text,
    pub window: Text,
    pub max: Int,
    pub layer: Option<Text>,
    #[serde(default)]
    pub trust_bonus: bool,
    /// `where`: the limit counts, and applies to, matching requests only.
    #[serde(rename = "where")]
    pub filter: Option<Text>,
}

/// One `[[scene.NAME.signals]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a signal table")]
pub struct RawSignalEntry {
    pub name: Text,
    pub count: Text,
    pub per: Spanned<Vec<Text>>,
    /// `where`: the signal counts, and applies to, matching requests only.
    #[serde(rename = "where")]
    pub filter: Option<Text>,
    pub window: Text,
    pub max: Int,
    pub min_share: Option<Spanned<f64>>,
}

/// One `[[scene.NAME.overrides]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an override table")]
pub struct RawOverride {
    pub cidr: Text,
    pub limit: Text,
    pub max: Int,
}

/// `[scene.NAME.behaviour]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a behaviour table")]
pub struct RawBehaviour {
    pub accounts_per_device: Option<Spanned<RawSignal>>,
    pub account_switches: Option<Spanned<RawSignal>>,
    pub devices_per_user: Option<Spanned<RawSignal>>,
    pub accounts_per_ip: Option<Spanned<RawSignal>>,
}

/// `{ window = "..", max = N }` of one behaviour signal.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table { window, max }")]
pub struct RawSignal {
    pub window: Text,
    pub max: Int,
}

/// `[scene.NAME.score]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a score table")]
pub struct RawScore {
    pub weights: BTreeMap<String, Spanned<f64>>,
    pub silent_deny_at: Spanned<f64>,
    /// A score in `[challenge_at, silent_deny_at)` answers challenge.
    pub challenge_at: Option<Spanned<f64>>,
}

/// `[scene.NAME.challenge]`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a challenge table { kind, message, pass_ttl }"
)]
pub struct RawChallenge {
    pub kind: Text,
    pub message: Option<Text>,
    pub pass_ttl: Text,
}

/// `[trust]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a trust table")]
pub struct RawTrust {
    pub payment_succeeded: Option<Spanned<RawAward>>,
    pub identity_verified: Option<Spanned<RawAward>>,
    /// Points a reported `challenge_passed` earns (none without it).
    pub challenge_passed: Option<Spanned<RawAward>>,
    /// Required; an `Option` so the error can say what it is for.
    pub max_points: Option<Int>,
    pub bonus_per_point: Option<Int>,
    pub score_discount_per_point: Option<Spanned<f64>>,
    pub new_account: Option<Spanned<RawNewAccount>>,
    pub new_device: Option<Spanned<RawNewDevice>>,
}

/// `new_device = { younger_than = ".." }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table { younger_than }")]
pub struct RawNewDevice {
    pub younger_than: Text,
}

/// `{ points = N, ttl = ".." }` of one trust event kind.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table { points, ttl }")]
pub struct RawAward {
    pub points: Int,
    pub ttl: Text,
}

/// `new_account = { younger_than = "..", max_factor = F }`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table { younger_than, max_factor }"
)]
pub struct RawNewAccount {
    pub younger_than: Text,
    pub max_factor: Spanned<f64>,
}

/// `[validation]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a validation table")]
pub struct RawValidation {
    pub device_id: Option<Spanned<RawPattern>>,
}

/// `[network]`: the prefix lengths that make an IP's `net`, and an IPv6 address's `ip`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a network table { ipv4_prefix, ipv6_prefix, ipv6_ip_prefix }"
)]
pub struct RawNetwork {
    pub ipv4_prefix: Option<Int>,
    pub ipv6_prefix: Option<Int>,
    pub ipv6_ip_prefix: Option<Int>,
}

/// `[attributes]`: `NAME = { pattern = ".." }` per declared attribute.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct RawAttributes(pub BTreeMap<Spanned<String>, Spanned<RawPattern>>);

/// `{ pattern = ".." }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table { pattern }")]
pub struct RawPattern {
    pub pattern: Text,
}

/// Behaviour signal names, as written in rule files and score weights.
pub const SIGNALS: [&str; 4] = [
    "accounts_per_device",
    "account_switches",
    "devices_per_user",
    "accounts_per_ip",
];

impl RawBehaviour {
    /// The configured signals with their names, in [`SIGNALS`] order.
    pub fn signals(&self) -> [(&'static str, Option<&Spanned<RawSignal>>); 4] {
        [
            (SIGNALS[0], self.accounts_per_device.as_ref()),
            (SIGNALS[1], self.account_switches.as_ref()),
            (SIGNALS[2], self.devices_per_user.as_ref()),
            (SIGNALS[3], self.accounts_per_ip.as_ref()),
        ]
    }
}
