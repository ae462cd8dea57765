//! Compiles the set-wide sections: `[trust]` (points from payment and identity events,
//! new-account strictness), `[validation]` (what a well-formed device id looks like),
//! `[network]` (how an IP becomes its `ip` and its `net`) and `[attributes]`
//! (backend-supplied values a check may carry, each with its pattern).

use std::ops::Range;

use regex::Regex;
use toml::Spanned;

use super::diag::Diag;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::rules::raw::{
    Int, RawAttributes, RawAward, RawNetwork, RawNewAccount, RawPattern, RawTrust, RawValidation,
};
use crate::rules::{
    Attribute, Network, NewAccount, NewDevice, Trust, TrustAward, Validation,
    DEFAULT_IPV6_IP_PREFIX,
};

/// Checks `[trust]`; `Some` only when wholly valid.
///
/// `at` locates the section (its `[trust]` header), for a missing required key.
pub fn compile_trust(d: &mut Diag, at: &Range<usize>, t: &RawTrust) -> Option<Trust> {
    let payment_succeeded = award(d, "trust.payment_succeeded", t.payment_succeeded.as_ref());
    let identity_verified = award(d, "trust.identity_verified", t.identity_verified.as_ref());
    let challenge_passed = award(d, "trust.challenge_passed", t.challenge_passed.as_ref());
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
    let new_device = match &t.new_device {
        Some(n) => d
            .duration("trust.new_device.younger_than", &n.get_ref().younger_than)
            .map(|younger_than_ms| Some(NewDevice { younger_than_ms })),
        None => Some(None),
    };
    Some(Trust {
        payment_succeeded: payment_succeeded?,
        identity_verified: identity_verified?,
        challenge_passed: challenge_passed?,
        max_points: max_points?,
        bonus_per_point: bonus_per_point?,
        score_discount_per_point: score_discount_per_point?,
        new_account: new_account?,
        new_device: new_device?,
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
    let re = pattern(d, "validation.device_id.pattern", device_id.get_ref())?;
    Some(Validation {
        device_id: Some(re),
    })
}

/// A `{ pattern }` as an anchored-as-written regex, or the error at its line.
fn pattern(d: &mut Diag, path: &str, raw: &RawPattern) -> Option<Regex> {
    match Regex::new(raw.pattern.get_ref()) {
        Ok(re) => Some(re),
        Err(e) => {
            d.at(
                &raw.pattern.span(),
                format!(
                    "{path}: {:?} is not a valid regex: {}",
                    raw.pattern.get_ref(),
                    regex_problem(&e)
                ),
            );
            None
        }
    }
}

/// Checks `[network]`: prefix lengths within their address family, and an IPv6 `ip` no
/// wider than its `net` (the `ip` is the finer of the two: one client within a network).
/// Unset, `ipv6_ip_prefix` is the /64 — or `ipv6_prefix` when that is longer, so a rule
/// set that narrowed its nets past /64 before the `ip` was grouped still loads.
pub fn compile_network(d: &mut Diag, _at: &Range<usize>, raw: &RawNetwork) -> Option<Network> {
    let default = Network::default();
    let prefix = |d: &mut Diag, path: &str, value: Option<&Int>, lowest: u8, bits: u8, dflt: u8| {
        let Some(value) = value else {
            return Some(dflt);
        };
        let n = *value.get_ref();
        match u8::try_from(n) {
            Ok(n) if (lowest..=bits).contains(&n) => Some(n),
            _ => {
                d.at(
                    &value.span(),
                    format!("{path}: {n} is not a prefix length {lowest}..={bits}"),
                );
                None
            }
        }
    };
    let ipv4_prefix = prefix(
        d,
        "network.ipv4_prefix",
        raw.ipv4_prefix.as_ref(),
        0,
        32,
        default.ipv4_prefix,
    );
    let ipv6_prefix = prefix(
        d,
        "network.ipv6_prefix",
        raw.ipv6_prefix.as_ref(),
        0,
        128,
        default.ipv6_prefix,
    );
    // An `ip` of /0 would be every IPv6 client at once.
    let ipv6_ip_prefix = prefix(
        d,
        "network.ipv6_ip_prefix",
        raw.ipv6_ip_prefix.as_ref(),
        1,
        128,
        DEFAULT_IPV6_IP_PREFIX.max(ipv6_prefix.unwrap_or(0)),
    );
    if let (Some(ip), Some(net), Some(value)) =
        (ipv6_ip_prefix, ipv6_prefix, raw.ipv6_ip_prefix.as_ref())
    {
        if ip < net {
            d.at(
                &value.span(),
                format!(
                    "network.ipv6_ip_prefix: {ip} is shorter than network.ipv6_prefix ({net}): \
                     an address's `ip` (one client) must lie within its `net`"
                ),
            );
            return None;
        }
    }
    Some(Network {
        ipv4_prefix: ipv4_prefix?,
        ipv6_prefix: ipv6_prefix?,
        ipv6_ip_prefix: ipv6_ip_prefix?,
    })
}

/// Checks `[attributes]`: each name goes into store keys (`at.NAME`) and each pattern
/// must compile.
pub fn compile_attributes(
    d: &mut Diag,
    _at: &Range<usize>,
    raw: &RawAttributes,
) -> Option<BTreeMap<Arc<str>, Attribute>> {
    let mut out = Some(BTreeMap::new());
    for (name, entry) in &raw.0 {
        let path = format!("attributes.{}", name.get_ref());
        let name_ok = d.key_name(&path, "attribute name", name);
        let re = pattern(d, &format!("{path}.pattern"), entry.get_ref());
        out = match (out, re) {
            (Some(mut all), Some(pattern)) if name_ok => {
                all.insert(name.get_ref().as_str().into(), Attribute { pattern });
                Some(all)
            }
            _ => None,
        };
    }
    out
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
