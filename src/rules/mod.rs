//! The rule set: what the operators wrote in `rules/*.toml`, compiled into an immutable
//! value that one check reads from start to end.
//!
//! `raw` is the on-disk model (serde, with spans so every error names its line);
//! `compile` turns it into [`RuleSet`], rejecting anything a check could trip over later;
//! `load` reads a folder and computes the version. A `RuleSet` is never mutated: a reload
//! builds a new one and swaps it in whole (see [`RulesHandle`]).

mod compile;
mod duration;
mod load;
mod network;
mod raw;

/// Names the key a TOML deserialization error is about (`.gateway.burst`, `[2]`): shared
/// with the other strict TOML files (scenarios).
pub(crate) use raw::path_to;
pub mod reload;
pub mod watch;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use ipnet::IpNet;
use regex::Regex;

use crate::clock::Clock;

pub use compile::compile_files;
pub use duration::parse_duration_ms;
pub use load::{load_dir, RuleError, RuleErrors};
pub use network::{IpGroup, Network, RangeError, DEFAULT_IPV6_IP_PREFIX};
pub use reload::{Reloaded, Reloader, RulesError, Trigger};

/// A dimension of a check: who or what an action is attributed to.
///
/// `Ip` and `Net` are derived from the check's IP (by default an IPv6 address's `ip` is
/// its /64 and its `net` its /48, per [`Network`]); `Attr` is a value the backend carries
/// in `attrs`, declared in `[attributes]` (a phone number's range, a payment instrument's
/// hash…).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    User,
    Device,
    Ip,
    Net,
    Activity,
    Attr(Arc<str>),
}

impl Dimension {
    /// The fixed dimensions, in the order they are reported.
    pub const FIXED: [Dimension; 5] = [
        Dimension::User,
        Dimension::Device,
        Dimension::Ip,
        Dimension::Net,
        Dimension::Activity,
    ];

    /// The name used in rule files (`user`, `device`, `ip`, `net`, `activity`,
    /// `attr.NAME`).
    pub fn name(&self) -> Cow<'static, str> {
        match self {
            Dimension::User => "user".into(),
            Dimension::Device => "device".into(),
            Dimension::Ip => "ip".into(),
            Dimension::Net => "net".into(),
            Dimension::Activity => "activity".into(),
            Dimension::Attr(name) => format!("attr.{name}").into(),
        }
    }

    /// The abbreviation used in store keys (`uid`, `did`, `ip`, `net`, `aid`,
    /// `at.NAME`).
    pub fn key_abbrev(&self) -> Cow<'static, str> {
        match self {
            Dimension::User => "uid".into(),
            Dimension::Device => "did".into(),
            Dimension::Ip => "ip".into(),
            Dimension::Net => "net".into(),
            Dimension::Activity => "aid".into(),
            Dimension::Attr(name) => format!("at.{name}").into(),
        }
    }

    /// The field of a check request that carries this dimension (`net` comes from `ip`).
    pub fn request_field(&self) -> Cow<'static, str> {
        match self {
            Dimension::User => "user_id".into(),
            Dimension::Device => "device_id".into(),
            Dimension::Ip | Dimension::Net => "ip".into(),
            Dimension::Activity => "activity_id".into(),
            Dimension::Attr(name) => format!("attrs.{name}").into(),
        }
    }

    /// Parses a rule-file dimension name; `attr.NAME` is taken as written (whether NAME
    /// is declared is the compiler's question).
    pub fn from_name(s: &str) -> Option<Dimension> {
        if let Some(attr) = s.strip_prefix("attr.") {
            return Some(Dimension::Attr(attr.into()));
        }
        Dimension::FIXED.into_iter().find(|d| d.name() == s)
    }
}

/// One `[attributes]` entry: a backend-supplied value a check may carry in `attrs`.
#[derive(Debug, Clone)]
pub struct Attribute {
    /// A value that does not match is a 400 naming `attrs.NAME`.
    pub pattern: Regex,
}

/// How a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Exact sliding window over a ZSET of request ids scored by time.
    SlidingWindow,
    /// A counter per window aligned to multiples of the window length.
    FixedWindow,
    /// Capacity `max`, refilled continuously at `max` per window.
    TokenBucket,
}

impl Algorithm {
    /// The name used in rule files.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::TokenBucket => "token_bucket",
        }
    }
}

/// Which answer a tripped limit gives.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, utoipa::ToSchema,
)]
// The wire names are `Layer::name`'s (a test in `check::decision` holds them together).
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// The scene's in-process gateway bucket: protects the service itself.
    Resource,
    /// Fairness of the promotion: friendly deny (429, Retry-After, a message).
    Business,
    /// Abuse: silent deny, indistinguishable from an allow.
    Security,
}

impl Layer {
    /// The name used in rule files and responses.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Resource => "resource",
            Layer::Business => "business",
            Layer::Security => "security",
        }
    }
}

/// What a scene does when the window store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorPolicy {
    FailOpen,
    FailClose,
    Local,
}

impl StoreErrorPolicy {
    pub fn name(self) -> &'static str {
        match self {
            StoreErrorPolicy::FailOpen => "fail_open",
            StoreErrorPolicy::FailClose => "fail_close",
            StoreErrorPolicy::Local => "local",
        }
    }
}

/// One counted limit of a scene.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// Unique within the scene; `[A-Za-z0-9_]+`.
    pub name: String,
    /// No repeats, in the order the rule file lists them (the key follows it); empty is
    /// one budget for the whole scene.
    pub dimensions: Vec<Dimension>,
    pub algorithm: Algorithm,
    /// > 0.
    pub window_ms: u64,
    /// >= 1.
    pub max: u64,
    pub layer: Layer,
    /// Trust points may raise `max` (issue 4).
    pub trust_bonus: bool,
    /// `where`: the limit counts, and applies to, matching requests only.
    pub filter: Option<Filter>,
}

/// A CIDR range whose IP-limited traffic gets a different max (a campus or office NAT).
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// As [`Network::range`] gives it (IPv4-embedded forms as IPv4, no IPv6 range
    /// narrower than one `ip`); a check matches it by [`IpGroup::within`].
    pub cidr: IpNet,
    /// Name of a limit of the same scene whose dimensions include `ip` or `net`.
    pub limit: String,
    /// >= 1.
    pub max: u64,
}

/// The scene's in-process token bucket (resource layer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gateway {
    /// > 0.
    pub rate_per_s: u32,
    /// >= 1.
    pub burst: u32,
}

/// What a signal counts, per entity, within its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Count {
    /// Distinct users.
    Users,
    /// Distinct devices.
    Devices,
    /// Distinct addresses.
    Ips,
    /// Distinct networks (`net`).
    Nets,
    /// Changes of user (on a device, typically).
    UserSwitches,
    /// Requests: distinct claims, so a retry under the same `idempotency_key` (a double
    /// click's copy, the claim sent again after a challenge) counts once.
    Requests,
}

impl Count {
    pub const ALL: [Count; 6] = [
        Count::Users,
        Count::Devices,
        Count::Ips,
        Count::Nets,
        Count::UserSwitches,
        Count::Requests,
    ];

    /// The name used in rule files.
    pub fn name(self) -> &'static str {
        match self {
            Count::Users => "users",
            Count::Devices => "devices",
            Count::Ips => "ips",
            Count::Nets => "nets",
            Count::UserSwitches => "user_switches",
            Count::Requests => "requests",
        }
    }

    /// The dimension whose values are counted (`None` for requests).
    pub fn counted(self) -> Option<Dimension> {
        match self {
            Count::Users | Count::UserSwitches => Some(Dimension::User),
            Count::Devices => Some(Dimension::Device),
            Count::Ips => Some(Dimension::Ip),
            Count::Nets => Some(Dimension::Net),
            Count::Requests => None,
        }
    }
}

/// Which requests a limit or signal counts, and applies to (`where`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Filter {
    /// The user is younger than `[trust].new_account.younger_than`.
    NewAccount,
    /// The device was first seen less than `[trust].new_device.younger_than` ago.
    NewDevice,
    /// The user holds no trust points.
    Untrusted,
    /// The user has not passed the scene's challenge within its `pass_ttl` (every request
    /// of a scene that never challenges): what a backend sends again while its user is
    /// still challenged.
    Unverified,
}

impl Filter {
    pub const ALL: [Filter; 4] = [
        Filter::NewAccount,
        Filter::NewDevice,
        Filter::Untrusted,
        Filter::Unverified,
    ];

    /// The name used in rule files.
    pub fn name(self) -> &'static str {
        match self {
            Filter::NewAccount => "new_account",
            Filter::NewDevice => "new_device",
            Filter::Untrusted => "untrusted",
            Filter::Unverified => "unverified",
        }
    }
}

/// One rolling signal: `count` per `per`, over the requests `filter` lets through, within
/// `window_ms`; it fires when its value (the current request included) exceeds `max` and,
/// with `min_share`, the matching ones are at least that share of all counted.
#[derive(Debug, Clone, PartialEq)]
pub struct Signal {
    /// Unique within the scene; `[A-Za-z0-9_]+` (it goes into store keys).
    pub name: String,
    pub count: Count,
    /// `[]` is the whole scene.
    pub per: Vec<Dimension>,
    pub filter: Option<Filter>,
    pub window_ms: u64,
    pub max: u64,
    /// In (0, 1]; only with a filter.
    pub min_share: Option<f64>,
}

/// A rolling behaviour signal threshold (issue 4): `max` within `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignalRule {
    pub window_ms: u64,
    pub max: u64,
}

/// `[scene.X.behaviour]`; every field optional. Only the rules compiler reads it: each
/// shorthand becomes a [`Signal`] of the scene (`Scene::signals`), which is all a check
/// uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Behaviour {
    pub accounts_per_device: Option<SignalRule>,
    pub account_switches: Option<SignalRule>,
    pub devices_per_user: Option<SignalRule>,
    pub accounts_per_ip: Option<SignalRule>,
}

/// `[scene.X.score]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    /// Signal name -> weight in [0, 1]. Names are the behaviour signals or `new_account`.
    pub weights: BTreeMap<String, f64>,
    /// In (0, 1]; a score at or over it is a silent deny.
    pub silent_deny_at: f64,
    /// In (0, silent_deny_at): a score at or over it, below `silent_deny_at`, answers
    /// challenge (the scene then has a [`Challenge`]).
    pub challenge_at: Option<f64>,
}

/// `[scene.X.challenge]`: what a challenge answer asks the backend to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Challenge {
    /// Free text the backend acts on (`captcha`, `sms`…), echoed in the answer.
    pub kind: String,
    pub message: Option<String>,
    /// How long a reported pass keeps the user (on that device) out of the band.
    pub pass_ttl_ms: u64,
}

/// One protected action.
#[derive(Debug, Clone)]
pub struct Scene {
    pub name: String,
    pub on_store_error: StoreErrorPolicy,
    pub deny_message: Option<String>,
    /// Dimensions a check must carry.
    pub required: Vec<Dimension>,
    pub gateway: Option<Gateway>,
    pub limits: Vec<Limit>,
    pub overrides: Vec<Override>,
    /// Every signal: the `[behaviour]` shorthands first (in their fixed order), then
    /// `[[signals]]` in file order.
    pub signals: Vec<Signal>,
    pub score: Option<Score>,
    pub challenge: Option<Challenge>,
}

impl Scene {
    /// The longest window of any limit, in ms (0 when the scene has no limits).
    pub fn longest_window_ms(&self) -> u64 {
        self.limits.iter().map(|l| l.window_ms).max().unwrap_or(0)
    }

    /// How long a check's request and idempotency records live: while the request counts
    /// in some window of the scene (a record past the longest window would guard nothing),
    /// and at most the horizon (`[store] record_horizon_ms`): a duplicate, an idempotent
    /// retry or a refund comes within minutes, and a record kept for a whole day-long window
    /// would make every allowed check cost more memory than the window members it adds. At
    /// least 1 s. Checks and refunds both read it: on Redis it is also the length of a
    /// generation of the records hash (lua/limits.lua).
    pub fn record_ttl_ms(&self, record_horizon_ms: u64) -> u64 {
        self.longest_window_ms().min(record_horizon_ms).max(1000)
    }
}

/// A trust event kind's award.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrustAward {
    pub points: u32,
    pub ttl_ms: u64,
}

/// `[trust]` (issue 4).
#[derive(Debug, Clone, PartialEq)]
pub struct Trust {
    pub payment_succeeded: Option<TrustAward>,
    pub identity_verified: Option<TrustAward>,
    pub challenge_passed: Option<TrustAward>,
    pub max_points: u32,
    pub bonus_per_point: u32,
    pub score_discount_per_point: f64,
    pub new_account: Option<NewAccount>,
    pub new_device: Option<NewDevice>,
}

/// `[trust].new_device`: devices first seen recently.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NewDevice {
    pub younger_than_ms: u64,
}

/// Users first seen recently get stricter limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NewAccount {
    pub younger_than_ms: u64,
    /// In (0, 1].
    pub max_factor: f64,
}

/// `[validation]`.
#[derive(Debug, Clone)]
pub struct Validation {
    /// A device id that does not match is a silent deny (`invalid_device_id`).
    pub device_id: Option<Regex>,
}

/// A whole, valid rule set. Immutable: replaced, never edited.
#[derive(Debug, Clone)]
pub struct RuleSet {
    /// Hex hash of the files' names and contents, sorted by name.
    pub version: String,
    pub scenes: BTreeMap<String, Arc<Scene>>,
    pub trust: Option<Trust>,
    pub validation: Validation,
    pub network: Network,
    /// `[attributes]`, by name.
    pub attributes: BTreeMap<Arc<str>, Attribute>,
}

impl RuleSet {
    pub fn scene(&self, name: &str) -> Option<&Arc<Scene>> {
        self.scenes.get(name)
    }
}

/// The current rule set, swapped atomically. Readers take one snapshot per request
/// (`current()`) and pass it down; nothing below the handler reads the handle again.
///
/// When a set was put in service is the handle's business, not the set's: the same files
/// compile to the same value whenever they are read, and the time comes from the
/// service's clock.
#[derive(Debug)]
pub struct RulesHandle {
    current: ArcSwap<Serving>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug)]
struct Serving {
    rules: Arc<RuleSet>,
    loaded_at_ms: u64,
}

impl RulesHandle {
    /// Serves `rules` from now on `clock`.
    pub fn new(rules: RuleSet, clock: Arc<dyn Clock>) -> Self {
        let loaded_at_ms = clock.now_ms();
        RulesHandle {
            current: ArcSwap::from_pointee(Serving {
                rules: Arc::new(rules),
                loaded_at_ms,
            }),
            clock,
        }
    }

    /// One consistent snapshot; cheap; hold it for the whole request.
    pub fn current(&self) -> Arc<RuleSet> {
        self.current.load().rules.clone()
    }

    /// When the set in force was swapped in, ms since the epoch.
    pub fn loaded_at_ms(&self) -> u64 {
        self.current.load().loaded_at_ms
    }

    /// The service clock the handle stamps loads with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Replaces the rule set whole.
    pub fn swap(&self, rules: RuleSet) {
        self.current.store(Arc::new(Serving {
            rules: Arc::new(rules),
            loaded_at_ms: self.clock.now_ms(),
        }));
    }
}
