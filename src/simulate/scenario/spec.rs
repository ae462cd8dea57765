//! A validated scenario: the raw file checked field by field, every number in range and
//! every duration, time and CIDR parsed, so generating can no longer fail.
//!
//! The first problem found is the error, named by file, line and field path
//! (`x.toml:12: nat[0].addresses: ...`): a scenario is one short file, fixed one line at
//! a time.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::ops::Range;
use std::path::Path;

use chrono::DateTime;
use ipnet::IpNet;
use toml::Spanned;

use super::net;
use super::raw::{
    self, Int, Price, RawAttacker, RawCost, RawHabits, RawHonest, RawNat, RawProxies, Share, Text,
};
use super::ScenarioError;
use crate::input::MAX_ID_LEN;
use crate::rules::parse_duration_ms;
use crate::simulate::traffic::Cost;

/// `challenge_pass` of honest and NAT users when the file gives none: nearly everyone
/// gets through a captcha, a few give up.
pub const PEOPLE_PASS: f64 = 0.95;

/// Most members one population may have, and most claims or tries each: every line is
/// held in memory to be sorted, so a typo of three extra zeros must not exhaust it.
pub const MAX_COUNT: i64 = 10_000_000;

/// Most check lines one scenario may write: every line is held in memory to be sorted
/// (56 bytes, about 85 with the stable sort's buffer), so this bounds that to under two
/// gigabytes.
pub const MAX_CHECKS: u64 = 20_000_000;

/// Most `[[nat]]` and `[[attacker]]` sections one file may hold together: records
/// number their population in 16 bits, and no real scenario comes close.
pub const MAX_SECTIONS: usize = 1_000;

/// Longest label: a user id is the label, a cohort number and six digits, and must stay
/// well within the service's id limit.
const MAX_LABEL_LEN: usize = 64;

/// The last instant a traffic line can carry: RFC 3339 has four-digit years.
const MAX_MS: u64 = 253_402_300_799_999;

/// Honest and NAT accounts are made up to three years before `start`, and paid up to 25
/// days before: `start` must leave room for both after 1970.
const OLDEST_HOME_ACCOUNT_MS: u64 = 3 * 365 * 86_400_000;

/// A parsed, validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// The seed the file names; the CLI may pass another to [`super::write`].
    pub seed: u64,
    /// The scene every check names.
    pub scene: String,
    /// When the drop opens, ms since the epoch.
    pub start_ms: u64,
    /// Honest and NAT claims fall uniformly in `[start_ms, start_ms + span_ms)` (a
    /// rusher's in its population's `rush.within`).
    pub span_ms: u64,
    /// Sent as `activity_id` on every check when set.
    pub activity_id: Option<String>,
    /// `[honest]`, when present.
    pub honest: Option<Honest>,
    /// The `[[nat]]` sections, in file order.
    pub nats: Vec<Nat>,
    /// The `[[attacker]]` cohorts, in file order.
    pub attackers: Vec<Attacker>,
}

/// How honest and NAT users claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Habits {
    /// Claims per user, each at a uniform time in the span (a rusher's in the rush).
    pub claims: u64,
    /// Share with one `payment_succeeded` event before the drop.
    pub paid_share: f64,
    /// Share of brand-new accounts (made 10 min to 24 h before their first claim).
    pub new_share: f64,
    /// Share whose every claim is sent twice, 150 to 600 ms apart.
    pub double_click_share: f64,
    /// The chance a user passes a challenge (default [`PEOPLE_PASS`]).
    pub challenge_pass: f64,
    /// Users who come at the opening.
    pub rush: Option<Rush>,
}

/// `rush`: a share of the users claim in the first minutes after `start`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rush {
    /// Share of the users who rush.
    pub share: f64,
    /// Their claims fall in `[start_ms, start_ms + within_ms)` instead of over the span.
    pub within_ms: u64,
}

/// `[honest]`: users at home, each on one residential address and one device.
#[derive(Debug, Clone, PartialEq)]
pub struct Honest {
    /// The `label` of its check lines (default `honest`).
    pub label: String,
    /// Prefix of the user ids: the label, made unique across the file.
    pub id_prefix: String,
    pub users: u64,
    /// Residential /24s the home addresses are drawn from.
    pub networks: u64,
    pub habits: Habits,
}

/// `[[nat]]`: users sharing a few public addresses of one range (a campus, an office).
#[derive(Debug, Clone, PartialEq)]
pub struct Nat {
    /// The `label` of its check lines (default `nat`).
    pub label: String,
    /// Prefix of the user ids: the label, made unique across the file.
    pub id_prefix: String,
    pub users: u64,
    /// The NAT's public range.
    pub cidr: IpNet,
    /// How many addresses of `cidr` the users share.
    pub addresses: u64,
    pub habits: Habits,
}

/// `[[attacker]]`: a cohort of scripted accounts.
#[derive(Debug, Clone, PartialEq)]
pub struct Attacker {
    /// The `label` of its check lines (default `attacker`).
    pub label: String,
    /// Prefix of the user ids: the label, made unique across the file.
    pub id_prefix: String,
    /// Position among the attacker cohorts; names farm devices (`farm{cohort}-00007`).
    pub cohort: usize,
    pub accounts: u64,
    pub devices: Devices,
    pub proxies: Proxies,
    /// Claims per account.
    pub tries: u64,
    /// Accounts are made `account_age * uniform(0.9, 1.1)` before `start`.
    pub account_age_ms: u64,
    /// Each account's first try falls in `[start, start + arrive_within)`.
    pub arrive_within_ms: u64,
    /// Between one account's tries, plus up to a second of jitter.
    pub interval_ms: u64,
    /// Share of accounts with a payment, made between the account's creation and the
    /// event batch an hour before start.
    pub paid_share: f64,
    /// The chance an account passes a challenge (a solver's success rate; default 0).
    pub challenge_pass: f64,
    /// What the cohort's accounts, addresses, devices and solved challenges cost it.
    pub cost: Option<Cost>,
}

/// The devices a cohort claims from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    /// A farm of this many phones: account `i` uses phone `i % n`.
    Farm(u64),
    /// A fresh spoofed fingerprint per account, kept for all its tries.
    PerAccount,
}

/// Where a cohort's tries come from: each try draws one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proxies {
    /// A random address in a random one of these networks.
    Cidrs(Vec<IpNet>),
    /// A random one of these addresses.
    Addresses(Vec<IpAddr>),
    /// A random address in a random one of this many residential /24s (a residential
    /// proxy pool).
    RandomNetworks(u64),
}

impl Scenario {
    /// Reads and validates the scenario file at `path`.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            file: file.clone(),
            source,
        })?;
        Scenario::parse(&file, &text)
    }

    /// Validates the scenario text `text`; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Scenario, ScenarioError> {
        let v = Validator { file, text };
        let raw = raw::read(text).map_err(|e| match e {
            raw::ReadError::Syntax { span, message } => ScenarioError::Syntax {
                file: file.to_string(),
                line: v.line_of(span.start),
                message,
            },
            raw::ReadError::Field {
                span,
                field,
                message,
            } => v.error(&span, &field, message),
        })?;
        v.scenario(raw)
    }

    /// Check lines the scenario writes (its size before writing anything).
    pub fn checks(&self) -> u64 {
        let home = |users: u64, h: &Habits| {
            let doubles = share_of(users, h.double_click_share);
            (users + doubles) * h.claims
        };
        let honest = self.honest.iter().map(|h| home(h.users, &h.habits));
        let nats = self.nats.iter().map(|n| home(n.users, &n.habits));
        let attackers = self.attackers.iter().map(|a| a.accounts * a.tries);
        honest.chain(nats).chain(attackers).sum()
    }
}

/// How many of `n` members a share selects: rounded, so 30% of 3000 is exactly 900
/// whatever the seed, and totals can be checked against the file.
pub fn share_of(n: u64, share: f64) -> u64 {
    // share is in [0, 1] and n ≤ MAX_COUNT: the product is exact enough and in range.
    ((n as f64 * share).round() as u64).min(n)
}

/// Turns spans into lines and raw values into checked ones, for one file.
struct Validator<'a> {
    file: &'a str,
    text: &'a str,
}

type Checked<T> = Result<T, ScenarioError>;

impl Validator<'_> {
    /// The 1-based line holding byte `offset`.
    fn line_of(&self, offset: usize) -> usize {
        let before = self
            .text
            .as_bytes()
            .get(..offset)
            .unwrap_or(self.text.as_bytes());
        1 + before.iter().filter(|&&b| b == b'\n').count()
    }

    fn error(&self, span: &Range<usize>, field: &str, message: impl Into<String>) -> ScenarioError {
        ScenarioError::Invalid {
            file: self.file.to_string(),
            line: self.line_of(span.start),
            field: field.to_string(),
            message: message.into(),
        }
    }

    fn scenario(&self, raw: raw::RawScenario) -> Checked<Scenario> {
        let seed = u64::try_from(*raw.seed.get_ref())
            .map_err(|_| self.error(&raw.seed.span(), "seed", "must not be negative"))?;
        let scene = self.id(&raw.scene, "scene")?;
        let start_ms = self.start(&raw.start)?;
        let span_ms = self.duration(&raw.span, "span")?;
        if start_ms.checked_add(span_ms).is_none_or(|end| end > MAX_MS) {
            return Err(self.error(&raw.span.span(), "span", "ends after the year 9999"));
        }
        let activity_id = raw
            .activity_id
            .as_ref()
            .map(|a| self.id(a, "activity_id"))
            .transpose()?;
        let honest = (raw.honest.as_ref())
            .map(|h| self.honest(h, span_ms))
            .transpose()?;
        let nats = (raw.nat.iter().enumerate())
            .map(|(i, n)| self.nat(n, &format!("nat[{i}]"), span_ms))
            .collect::<Checked<Vec<_>>>()?;
        self.not_too_many(&raw)?;
        let attackers = (raw.attacker.iter().enumerate())
            .map(|(i, a)| self.attacker(a, i, start_ms))
            .collect::<Checked<Vec<_>>>()?;
        let mut scenario = Scenario {
            seed,
            scene,
            start_ms,
            span_ms,
            activity_id,
            honest,
            nats,
            attackers,
        };
        if scenario.honest.is_none() && scenario.nats.is_empty() && scenario.attackers.is_empty() {
            return Err(ScenarioError::Empty {
                file: self.file.to_string(),
            });
        }
        self.unique_ids(&raw, &mut scenario)?;
        self.one_cost_per_label(&raw, &scenario)?;
        let checks = scenario.checks();
        if checks > MAX_CHECKS {
            return Err(ScenarioError::TooBig {
                file: self.file.to_string(),
                checks,
            });
        }
        Ok(scenario)
    }

    /// Refuses the first section past [`MAX_SECTIONS`].
    fn not_too_many(&self, raw: &raw::RawScenario) -> Checked<()> {
        let limit = MAX_SECTIONS;
        if raw.nat.len() + raw.attacker.len() <= limit {
            return Ok(());
        }
        let (field, span) = match raw.nat.get(limit) {
            Some(n) => (format!("nat[{limit}]"), n.users.span()),
            None => {
                let i = limit - raw.nat.len();
                let span = raw.attacker.get(i).map_or(0..0, |a| a.accounts.span());
                (format!("attacker[{i}]"), span)
            }
        };
        Err(self.error(
            &span,
            &field,
            format!("a file holds at most {limit} [[nat]] and [[attacker]] sections together"),
        ))
    }

    fn start(&self, raw: &Spanned<toml::Value>) -> Checked<u64> {
        let bad = |m: String| self.error(&raw.span(), "start", m);
        let text = match raw.get_ref() {
            toml::Value::String(s) => s.clone(),
            toml::Value::Datetime(d) => d.to_string(),
            other => {
                return Err(bad(format!(
                    "expected an RFC 3339 time like \"2026-12-24T10:00:00Z\", found a {}",
                    other.type_str()
                )))
            }
        };
        let at = DateTime::parse_from_rfc3339(&text).map_err(|e| {
            bad(format!(
                "{text:?} is not an RFC 3339 time with a zone, like \"2026-12-24T10:00:00Z\": {e}"
            ))
        })?;
        u64::try_from(at.timestamp_millis())
            .ok()
            .filter(|&ms| ms >= OLDEST_HOME_ACCOUNT_MS + 26 * 86_400_000)
            .ok_or_else(|| {
                bad(format!(
                    "{text:?} is too early: accounts are made up to three years before start, and must fall after 1970"
                ))
            })
    }

    /// A label, a scene or an activity id: non-empty and short enough to be an id.
    fn id(&self, raw: &Text, field: &str) -> Checked<String> {
        let s = raw.get_ref();
        if s.is_empty() {
            return Err(self.error(&raw.span(), field, "must not be empty"));
        }
        if s.len() > MAX_ID_LEN {
            return Err(self.error(
                &raw.span(),
                field,
                format!("is {} bytes; at most {MAX_ID_LEN}", s.len()),
            ));
        }
        Ok(s.clone())
    }

    fn label(&self, raw: Option<&Text>, default: &str, path: &str) -> Checked<String> {
        let Some(raw) = raw else {
            return Ok(default.to_string());
        };
        let field = format!("{path}.label");
        let label = self.id(raw, &field)?;
        if label.len() > MAX_LABEL_LEN {
            return Err(self.error(
                &raw.span(),
                &field,
                format!(
                    "is {} bytes; at most {MAX_LABEL_LEN} (user ids are made from it)",
                    label.len()
                ),
            ));
        }
        Ok(label)
    }

    fn count(&self, raw: &Int, field: &str) -> Checked<u64> {
        let n = *raw.get_ref();
        if n < 1 {
            return Err(self.error(&raw.span(), field, format!("{n} is less than 1")));
        }
        if n > MAX_COUNT {
            return Err(self.error(
                &raw.span(),
                field,
                format!("{n} is more than {MAX_COUNT} (every line is sorted in memory)"),
            ));
        }
        Ok(n as u64)
    }

    fn count_or(&self, raw: Option<&Int>, default: u64, field: &str) -> Checked<u64> {
        raw.map_or(Ok(default), |r| self.count(r, field))
    }

    fn share(&self, raw: Option<&Share>, field: &str) -> Checked<f64> {
        self.share_or(raw, 0.0, field)
    }

    fn share_or(&self, raw: Option<&Share>, default: f64, field: &str) -> Checked<f64> {
        let Some(raw) = raw else {
            return Ok(default);
        };
        let s = *raw.get_ref();
        if !(0.0..=1.0).contains(&s) {
            return Err(self.error(&raw.span(), field, format!("{s} is not between 0 and 1")));
        }
        Ok(s)
    }

    fn duration(&self, raw: &Text, field: &str) -> Checked<u64> {
        parse_duration_ms(raw.get_ref()).ok_or_else(|| {
            self.error(
                &raw.span(),
                field,
                format!(
                    "{:?} is not a duration like 500ms, 11s, 2m, 3h or 2d (more than zero)",
                    raw.get_ref()
                ),
            )
        })
    }

    fn cidr(&self, raw: &Text, field: &str) -> Checked<IpNet> {
        let net: IpNet = raw.get_ref().parse().map_err(|_| {
            self.error(
                &raw.span(),
                field,
                format!("{:?} is not a CIDR like 10.8.0.0/16", raw.get_ref()),
            )
        })?;
        if !net::is_network(&net) {
            return Err(self.error(
                &raw.span(),
                field,
                format!("{net} has host bits set; did you mean {}?", net.trunc()),
            ));
        }
        Ok(net)
    }

    fn habits(&self, path: &str, raw: RawHabits<'_>, span_ms: u64) -> Checked<Habits> {
        let f = |name: &str| format!("{path}.{name}");
        let habits = Habits {
            claims: self.count_or(raw.claims, 1, &f("claims"))?,
            paid_share: self.share(raw.paid_share, &f("paid_share"))?,
            new_share: self.share(raw.new_share, &f("new_share"))?,
            double_click_share: self.share(raw.double_click_share, &f("double_click_share"))?,
            challenge_pass: self.share_or(raw.challenge_pass, PEOPLE_PASS, &f("challenge_pass"))?,
            rush: raw
                .rush
                .map(|r| self.rush(r.get_ref(), &f("rush"), span_ms))
                .transpose()?,
        };
        // Payments are weeks old; a brand-new account cannot have made one. Paid users are
        // drawn among the established ones, so there must be enough of them.
        let paid = raw.paid_share;
        if let Some(paid) = paid.filter(|_| habits.paid_share + habits.new_share > 1.0) {
            return Err(self.error(
                &paid.span(),
                &format!("{path}.paid_share"),
                format!(
                    "{} plus new_share {} is more than 1: payments weeks before the drop belong to established accounts, not brand-new ones",
                    habits.paid_share, habits.new_share
                ),
            ));
        }
        Ok(habits)
    }

    fn rush(&self, raw: &raw::RawRush, path: &str, span_ms: u64) -> Checked<Rush> {
        let share = self.share(Some(&raw.share), &format!("{path}.share"))?;
        let field = format!("{path}.within");
        let within_ms = self.duration(&raw.within, &field)?;
        if within_ms > span_ms {
            return Err(self.error(
                &raw.within.span(),
                &field,
                format!(
                    "{:?} is longer than span: the rush is the opening part of it",
                    raw.within.get_ref()
                ),
            ));
        }
        Ok(Rush { share, within_ms })
    }

    fn cost(&self, raw: &Spanned<RawCost>, path: &str) -> Checked<Cost> {
        let c = raw.get_ref();
        let price = |p: Option<&Price>, name: &str| -> Checked<f64> {
            let Some(p) = p else {
                return Ok(0.0);
            };
            let v = *p.get_ref();
            if !v.is_finite() || v < 0.0 {
                return Err(self.error(
                    &p.span(),
                    &format!("{path}.{name}"),
                    format!("{v} is not a price: a number, 0 or more"),
                ));
            }
            Ok(v)
        };
        if c.account.is_none()
            && c.proxy_address.is_none()
            && c.device.is_none()
            && c.challenge_solved.is_none()
        {
            return Err(self.error(
                &raw.span(),
                path,
                "name at least one price: account, proxy_address, device or challenge_solved",
            ));
        }
        Ok(Cost {
            account: price(c.account.as_ref(), "account")?,
            proxy_address: price(c.proxy_address.as_ref(), "proxy_address")?,
            device: price(c.device.as_ref(), "device")?,
            challenge_solved: price(c.challenge_solved.as_ref(), "challenge_solved")?,
        })
    }

    fn honest(&self, raw: &RawHonest, span_ms: u64) -> Checked<Honest> {
        let path = "honest";
        let users = self.count(&raw.users, "honest.users")?;
        let networks = self.count_or(raw.networks.as_ref(), users, "honest.networks")?;
        if networks > net::RESIDENTIAL_NETWORKS {
            let span = raw.networks.as_ref().map_or(raw.users.span(), |n| n.span());
            return Err(self.error(
                &span,
                "honest.networks",
                format!(
                    "{networks} is more than the {} residential /24s there are to draw from",
                    net::RESIDENTIAL_NETWORKS
                ),
            ));
        }
        Ok(Honest {
            label: self.label(raw.label.as_ref(), "honest", path)?,
            id_prefix: String::new(),
            users,
            networks,
            habits: self.habits(path, raw.habits(), span_ms)?,
        })
    }

    fn nat(&self, raw: &RawNat, path: &str, span_ms: u64) -> Checked<Nat> {
        let users = self.count(&raw.users, &format!("{path}.users"))?;
        let cidr = self.cidr(&raw.cidr, &format!("{path}.cidr"))?;
        let field = format!("{path}.addresses");
        let addresses = self.count(&raw.addresses, &field)?;
        let size = net::size(&cidr);
        if u128::from(addresses) > size {
            return Err(self.error(
                &raw.addresses.span(),
                &field,
                format!("{addresses} is more than the {size} addresses of {cidr}"),
            ));
        }
        Ok(Nat {
            label: self.label(raw.label.as_ref(), "nat", path)?,
            id_prefix: String::new(),
            users,
            cidr,
            addresses,
            habits: self.habits(path, raw.habits(), span_ms)?,
        })
    }

    fn attacker(&self, raw: &RawAttacker, cohort: usize, start_ms: u64) -> Checked<Attacker> {
        let path = format!("attacker[{cohort}]");
        let f = |name: &str| format!("{path}.{name}");
        let accounts = self.count(&raw.accounts, &f("accounts"))?;
        let tries = self.count(&raw.tries, &f("tries"))?;
        let account_age_ms = self.duration(&raw.account_age, &f("account_age"))?;
        // The oldest account is made 1.1 × account_age before start.
        if account_age_ms.saturating_add(account_age_ms / 10) > start_ms {
            return Err(self.error(
                &raw.account_age.span(),
                &f("account_age"),
                "puts accounts before 1970",
            ));
        }
        let arrive_within_ms = self.duration(&raw.arrive_within, &f("arrive_within"))?;
        let interval_ms = self.duration(&raw.interval, &f("interval"))?;
        // The last try: the latest arrival, then tries - 1 intervals with a second of
        // jitter each.
        let last = (interval_ms.checked_add(1_000))
            .and_then(|step| step.checked_mul(tries - 1))
            .and_then(|t| t.checked_add(arrive_within_ms))
            .and_then(|t| t.checked_add(start_ms));
        if last.is_none_or(|t| t > MAX_MS) {
            return Err(self.error(
                &raw.tries.span(),
                &f("tries"),
                "the last try would fall after the year 9999",
            ));
        }
        let paid_share = self.share(raw.paid_share.as_ref(), &f("paid_share"))?;
        // Attackers' payments fall between account creation and the event batch an hour
        // before start, so the youngest account must predate that batch.
        if let Some(paid) = raw.paid_share.as_ref().filter(|_| paid_share > 0.0) {
            if account_age_ms - account_age_ms / 10 <= 3_600_000 {
                return Err(self.error(
                    &paid.span(),
                    &f("paid_share"),
                    "needs account_age of at least 2h: accounts pay before the events are delivered, an hour before start",
                ));
            }
        }
        Ok(Attacker {
            label: self.label(raw.label.as_ref(), "attacker", &path)?,
            id_prefix: String::new(),
            cohort,
            accounts,
            devices: self.devices(&raw.devices, &f("devices"))?,
            proxies: self.proxies(&raw.proxies, &f("proxies"))?,
            tries,
            account_age_ms,
            arrive_within_ms,
            interval_ms,
            paid_share,
            challenge_pass: self.share(raw.challenge_pass.as_ref(), &f("challenge_pass"))?,
            cost: (raw.cost.as_ref())
                .map(|c| self.cost(c, &f("cost")))
                .transpose()?,
        })
    }

    fn devices(&self, raw: &Spanned<toml::Value>, field: &str) -> Checked<Devices> {
        match raw.get_ref() {
            toml::Value::String(s) if s == "per_account" => Ok(Devices::PerAccount),
            toml::Value::Integer(n) => {
                let n = Spanned::new(raw.span(), *n);
                self.count(&n, field).map(Devices::Farm)
            }
            other => Err(self.error(
                &raw.span(),
                field,
                format!("{other} is neither a number of devices nor \"per_account\""),
            )),
        }
    }

    fn proxies(&self, raw: &Spanned<RawProxies>, path: &str) -> Checked<Proxies> {
        let p = raw.get_ref();
        match (&p.cidrs, &p.addresses, &p.random_networks) {
            (Some(cidrs), None, None) => {
                let field = format!("{path}.cidrs");
                if cidrs.is_empty() {
                    return Err(self.error(&raw.span(), &field, "must name at least one CIDR"));
                }
                (cidrs.iter().enumerate())
                    .map(|(i, c)| self.cidr(c, &format!("{field}[{i}]")))
                    .collect::<Checked<_>>()
                    .map(Proxies::Cidrs)
            }
            (None, Some(addresses), None) => {
                let field = format!("{path}.addresses");
                if addresses.is_empty() {
                    return Err(self.error(&raw.span(), &field, "must name at least one address"));
                }
                (addresses.iter().enumerate())
                    .map(|(i, a)| {
                        a.get_ref().parse::<IpAddr>().map_err(|_| {
                            self.error(
                                &a.span(),
                                &format!("{field}[{i}]"),
                                format!("{:?} is not an IP address", a.get_ref()),
                            )
                        })
                    })
                    .collect::<Checked<_>>()
                    .map(Proxies::Addresses)
            }
            (None, None, Some(n)) => {
                let field = format!("{path}.random_networks");
                let count = self.count(n, &field)?;
                if count > net::RESIDENTIAL_NETWORKS {
                    return Err(self.error(
                        &n.span(),
                        &field,
                        format!(
                            "{count} is more than the {} residential /24s there are to draw from",
                            net::RESIDENTIAL_NETWORKS
                        ),
                    ));
                }
                Ok(Proxies::RandomNetworks(count))
            }
            _ => Err(self.error(
                &raw.span(),
                path,
                "give exactly one of cidrs, addresses or random_networks",
            )),
        }
    }

    /// Gives every population its user-id prefix: its label when no other population
    /// shares it, else the label and its rank among those that do (`attacker1`,
    /// `attacker2`), so ids are unique across the file however the labels repeat.
    fn unique_ids(&self, raw: &raw::RawScenario, s: &mut Scenario) -> Checked<()> {
        let mut uses: BTreeMap<String, usize> = BTreeMap::new();
        let labels = (s.honest.iter().map(|h| &h.label))
            .chain(s.nats.iter().map(|n| &n.label))
            .chain(s.attackers.iter().map(|a| &a.label));
        for label in labels {
            *uses.entry(label.clone()).or_default() += 1;
        }
        let mut rank: BTreeMap<String, usize> = BTreeMap::new();
        let mut prefix = |label: &str| {
            if uses.get(label).copied().unwrap_or(0) < 2 {
                return label.to_string();
            }
            let r = rank.entry(label.to_string()).or_default();
            *r += 1;
            format!("{label}{r}")
        };
        // Each prefix, with the span and field that made it (for a clash).
        let mut made: Vec<(String, Range<usize>, String)> = Vec::new();
        let at =
            |label: Option<&Text>, fallback: Range<usize>| label.map_or(fallback, |l| l.span());
        if let (Some(h), Some(r)) = (s.honest.as_mut(), raw.honest.as_ref()) {
            h.id_prefix = prefix(&h.label);
            made.push((
                h.id_prefix.clone(),
                at(r.label.as_ref(), r.users.span()),
                "honest.label".into(),
            ));
        }
        for (i, (n, r)) in s.nats.iter_mut().zip(&raw.nat).enumerate() {
            n.id_prefix = prefix(&n.label);
            made.push((
                n.id_prefix.clone(),
                at(r.label.as_ref(), r.users.span()),
                format!("nat[{i}].label"),
            ));
        }
        for (i, (a, r)) in s.attackers.iter_mut().zip(&raw.attacker).enumerate() {
            a.id_prefix = prefix(&a.label);
            made.push((
                a.id_prefix.clone(),
                at(r.label.as_ref(), r.accounts.span()),
                format!("attacker[{i}].label"),
            ));
        }
        // `attacker` twice gives `attacker1`, which a population labelled `attacker1`
        // would share: refuse rather than mix two populations' users.
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (id, span, field) in &made {
            if let Some(first) = seen.insert(id, field) {
                return Err(self.error(
                    span,
                    field,
                    format!("user ids {id}-NNNNNN would clash with those of {first}; choose another label"),
                ));
            }
        }
        Ok(())
    }

    /// Cohorts sharing a label share one line of the report, so they must share one cost
    /// (or all have none): the report could not tell which cohort's prices to use.
    fn one_cost_per_label(&self, raw: &raw::RawScenario, s: &Scenario) -> Checked<()> {
        // Label -> the first population's field path and cost.
        let mut first: BTreeMap<&str, (String, Option<Cost>)> = BTreeMap::new();
        if let Some(h) = &s.honest {
            first.insert(&h.label, ("[honest]".into(), None));
        }
        for (i, n) in s.nats.iter().enumerate() {
            first
                .entry(&n.label)
                .or_insert_with(|| (format!("nat[{i}]"), None));
        }
        for (i, (a, r)) in s.attackers.iter().zip(&raw.attacker).enumerate() {
            let (by, cost) = first
                .entry(&a.label)
                .or_insert_with(|| (format!("attacker[{i}]"), a.cost));
            if *cost != a.cost {
                let span = r.cost.as_ref().map_or(r.accounts.span(), |c| c.span());
                return Err(self.error(
                    &span,
                    &format!("attacker[{i}].cost"),
                    format!(
                        "{by} shares the label {:?} and another cost: one label, one line of the report, one cost",
                        a.label
                    ),
                ));
            }
        }
        Ok(())
    }
}
