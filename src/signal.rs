//! What a signal is in a check, in one place: its plan (resolved from the rules by the
//! check path), its answer, the arithmetic that makes the answer, and the hashing of what
//! it counts. The check path plans with it, both deciders and the behaviour actors answer
//! with it; it imports none of them, so none of them imports its caller to share it.
//!
//! The rule-file side of a signal (its grammar, the `[behaviour]` shorthands) is
//! [`crate::rules::Signal`]; `lua/decide.lua` mirrors the arithmetic here step for step.

use std::hash::Hasher;

use crate::rules::{Count, Filter};

/// One signal of the scene, resolved for this request.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalPlan {
    /// The signal's name (for reports).
    pub name: String,
    /// `<prefix>:<scene>:sg:<signal>[:<dims>]`: the set of what is counted, for the
    /// requests the filter lets through.
    pub key: String,
    /// `<prefix>:<scene>:sa:<signal>[:<dims>]`, with `min_share`: the same count over
    /// every request, matching or not.
    pub all_key: Option<String>,
    /// `<prefix>:<scene>:sl:<signal>[:<dims>]`, for `user_switches`: the last user seen.
    pub last_key: Option<String>,
    pub count: Count,
    /// What this request adds to the set: the hash of the counted value (users, devices,
    /// ips, nets; `user_switches`: the user) as 16 hex digits, or the request id
    /// (`requests`). Both deciders hash a request id alike
    /// ([`member_of`]), so members seen in one millisecond leave
    /// a full set in the same order on both.
    pub member: String,
    pub filter: Option<Filter>,
    pub window_ms: u64,
    pub max: u64,
    pub min_share: Option<f64>,
    /// The most members a set keeps (see [`signal_cap`]).
    pub cap: u64,
}

/// One signal's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignalValue {
    /// The request matched the signal's filter (always, without one): the signal observed
    /// it and applies to it. A signal that does not apply has no value and cannot fire.
    pub applies: bool,
    /// Distinct members (or switches, or requests) in the window, this request included;
    /// exact up to the set's cap, the cap past it.
    pub value: u64,
    /// With `min_share`: `value` over the same count of every request.
    pub share: Option<f64>,
    /// `applies`, `value > max`, and the share at least `min_share`.
    pub fired: bool,
}

/// Scores are compared after rounding to this many decimal places, so weights written as
/// decimals add up as they read (0.6 + 0.1 reaches a threshold of 0.7).
pub const SCORE_DECIMALS: f64 = 1e9;

/// The most members any signal set keeps, whatever its max and share ask: memory per
/// entity stays bounded even for an absurd rule.
pub const MAX_CAP: u64 = 10_000;

/// How many members a signal's set keeps. A value only has to be exact up to `max + 1`
/// (past it, the signal fires whatever the true count). With `min_share`, the share is
/// taken over the most recently seen members of both sets, so enough of them are kept
/// that a share at the line can still exceed `max`: twice `(max + 1) / min_share`.
pub fn signal_cap(max: u64, min_share: Option<f64>) -> u64 {
    let plain = max.saturating_add(1);
    let cap = match min_share {
        Some(share) if share > 0.0 => {
            let wanted = (2.0 * plain as f64 / share).ceil();
            if wanted >= MAX_CAP as f64 {
                MAX_CAP
            } else {
                (wanted as u64).max(plain)
            }
        }
        _ => plain,
    };
    cap.clamp(1, MAX_CAP)
}

/// Whether a signal fires: it applies, its value exceeds `max`, and (with `min_share`)
/// the matching ones are at least that share of all.
pub fn fires(
    applies: bool,
    value: u64,
    max: u64,
    share: Option<f64>,
    min_share: Option<f64>,
) -> bool {
    applies
        && value > max
        && match min_share {
            Some(min) => share.is_some_and(|s| s >= min),
            None => true,
        }
}

/// The share of `matching` in `all`, rounded to 1e-9 like the score (0 of nothing).
pub fn share(matching: u64, all: u64) -> f64 {
    if all == 0 {
        return 0.0;
    }
    round(matching as f64 / all as f64)
}

/// `x` rounded to 1e-9, and never negative zero: a score or share of zero is `0.0` in
/// every answer (adding `+0.0` turns `-0.0` into `0.0` and changes nothing else).
pub(crate) fn round(x: f64) -> f64 {
    (x * SCORE_DECIMALS).round() / SCORE_DECIMALS + 0.0
}

/// The `u64` a plan's member stands for: 16 lowercase hex digits are parsed (they are a
/// hash already, and parsing keeps the ZSET's tie order, see the module doc); anything
/// else, such as the request id counted by `requests`, is hashed with [`entity_hash`].
pub fn member_of(member: &str) -> u64 {
    let canonical = member.len() == 16
        && member
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    match canonical.then(|| u64::from_str_radix(member, 16)) {
        Some(Ok(hash)) => hash,
        _ => entity_hash(member),
    }
}

/// Stable 64-bit hash of an id: a signal key (which shard holds it, and its sled key), a
/// member that is not already a hash, a counted value as the check path plans it.
///
/// `DefaultHasher::new()` is SipHash-1-3 with fixed keys, so the same id hashes alike in
/// every process: snapshots written to sled before a restart must still find their keys
/// afterwards, and every node maps an id to the same shard. std does not promise the
/// algorithm across Rust releases; the `entity_hash_is_pinned` test fails if a toolchain
/// upgrade changes it (snapshots would then need a new [`FORMAT_VERSION`](crate::behaviour::signal::FORMAT_VERSION)). The
/// keys are public, so colliding ids can be searched for (~2^32 work per pair); a
/// collision makes two accounts count as one, which costs an attacker more than it gains.
pub fn entity_hash(s: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(s.as_bytes());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::{entity_hash, fires, member_of, share, signal_cap, MAX_CAP};

    #[test]
    fn entity_hash_is_pinned() {
        // Snapshots store these hashes: a change here orphans every snapshot.
        assert_eq!(entity_hash("10086"), entity_hash("10086"));
        assert_ne!(entity_hash("10086"), entity_hash("10087"));
        assert_eq!(
            entity_hash("10086"),
            PINNED_10086,
            "std changed DefaultHasher"
        );
    }

    const PINNED_10086: u64 = 9_653_547_755_553_248_206;

    #[test]
    fn member_hex_is_parsed_anything_else_hashed() {
        assert_eq!(member_of("00000000000000aa"), 0xaa);
        assert_eq!(member_of("ffffffffffffffff"), u64::MAX);
        assert_eq!(member_of("req-1"), entity_hash("req-1"));
        // Not the canonical form: hashed (its Redis tie order is not the number's).
        assert_eq!(
            member_of("00000000000000AA"),
            entity_hash("00000000000000AA")
        );
        assert_eq!(member_of("aa"), entity_hash("aa"));
        assert_eq!(
            member_of("+000000000000aa0"),
            entity_hash("+000000000000aa0")
        );
    }

    #[test]
    fn caps_keep_verdicts_exact_and_stay_bounded() {
        assert_eq!(signal_cap(3, None), 4);
        assert_eq!(signal_cap(0, None), 1);
        assert_eq!(signal_cap(5, Some(0.5)), 24);
        assert_eq!(signal_cap(5, Some(1.0)), 12);
        assert_eq!(signal_cap(1_000_000, None), MAX_CAP);
        assert_eq!(signal_cap(50, Some(0.001)), MAX_CAP);
    }

    #[test]
    fn a_signal_fires_past_its_max_and_at_its_share() {
        assert!(!fires(true, 3, 3, None, None));
        assert!(fires(true, 4, 3, None, None));
        assert!(!fires(false, 9, 3, None, None));
        assert!(fires(true, 6, 5, Some(0.5), Some(0.5)));
        assert!(!fires(true, 6, 5, Some(0.49), Some(0.5)));
        assert_eq!(share(1, 3), 0.333333333);
        assert_eq!(share(0, 0), 0.0);
    }
}
