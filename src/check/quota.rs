//! The effective max of a limit for one request: the max the store compares against.
//!
//! Three things move it, applied in this order:
//! 1. a CIDR override for the request's IP replaces the max of a limit counted per `ip` or
//!    `net` (the most specific range wins) — a campus NAT gets room, nobody else does;
//! 2. a new account (`[trust].new_account`) scales the max of limits counted *per user*
//!    by `max_factor`, rounded down and never below 1 — a young account gets less, but
//!    limits shared with other people (an IP, an activity) are not cut for them;
//! 3. trust points add `points * bonus_per_point` to `trust_bonus` limits — a paying,
//!    verified customer gets more, whatever the limit counts.

use std::net::IpAddr;

use crate::rules::{Dimension, Limit, Scene};

/// What this request's user changes about the max.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MaxAdjust {
    /// `Some(factor)` when the user is a new account.
    pub new_account_factor: Option<f64>,
    /// `points * bonus_per_point` (points already capped), for `trust_bonus` limits.
    pub trust_bonus: u64,
}

/// The max `limit` has for a request from `ip` by a user described by `adjust`.
pub fn effective_max(scene: &Scene, limit: &Limit, ip: Option<IpAddr>, adjust: &MaxAdjust) -> u64 {
    let mut max = overridden_max(scene, limit, ip);
    if let Some(factor) = adjust.new_account_factor {
        if limit.dimensions.contains(&Dimension::User) {
            // Float math on counts up to 2^53 is exact enough; `as` saturates.
            max = ((max as f64 * factor).floor() as u64).max(1);
        }
    }
    if limit.trust_bonus {
        max = max.saturating_add(adjust.trust_bonus);
    }
    max
}

/// The limit's max for a request from `ip`: the most specific CIDR override of it that
/// contains `ip`, or its own.
pub fn overridden_max(scene: &Scene, limit: &Limit, ip: Option<IpAddr>) -> u64 {
    let on_address = limit
        .dimensions
        .iter()
        .any(|d| matches!(d, Dimension::Ip | Dimension::Net));
    let Some(ip) = ip.filter(|_| on_address) else {
        return limit.max;
    };
    scene
        .overrides
        .iter()
        .filter(|o| o.limit == limit.name && o.cidr.contains(&ip))
        .max_by_key(|o| o.cidr.prefix_len())
        .map_or(limit.max, |o| o.max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Algorithm, Layer, Override, StoreErrorPolicy};

    fn limit(name: &str, dims: &[Dimension], max: u64, trust_bonus: bool) -> Limit {
        Limit {
            name: name.into(),
            dimensions: dims.to_vec(),
            algorithm: Algorithm::SlidingWindow,
            window_ms: 60_000,
            max,
            layer: Layer::Business,
            trust_bonus,
            filter: None,
        }
    }

    fn scene(limits: Vec<Limit>, overrides: Vec<Override>) -> Scene {
        Scene {
            name: "s".into(),
            on_store_error: StoreErrorPolicy::FailClose,
            deny_message: None,
            required: vec![],
            gateway: None,
            limits,
            overrides,
            signals: vec![],
            score: None,
        }
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn the_most_specific_override_wins_for_ip_limits_only() {
        let ip_limit = limit("ip_1m", &[Dimension::Ip], 20, false);
        let s = scene(
            vec![ip_limit.clone()],
            vec![
                Override {
                    cidr: "10.0.0.0/8".parse().unwrap(),
                    limit: "ip_1m".into(),
                    max: 100,
                },
                Override {
                    cidr: "10.8.0.0/16".parse().unwrap(),
                    limit: "ip_1m".into(),
                    max: 600,
                },
            ],
        );
        let none = MaxAdjust::default();
        assert_eq!(effective_max(&s, &ip_limit, ip("10.8.1.1"), &none), 600);
        assert_eq!(effective_max(&s, &ip_limit, ip("10.9.1.1"), &none), 100);
        assert_eq!(effective_max(&s, &ip_limit, ip("192.0.2.1"), &none), 20);
        assert_eq!(effective_max(&s, &ip_limit, None, &none), 20);
        // A limit per network takes the range's max too.
        let net_limit = limit("ip_1m", &[Dimension::Net], 20, false);
        let s = scene(
            vec![net_limit.clone()],
            vec![Override {
                cidr: "10.8.0.0/16".parse().unwrap(),
                limit: "ip_1m".into(),
                max: 600,
            }],
        );
        assert_eq!(effective_max(&s, &net_limit, ip("10.8.1.1"), &none), 600);
        assert_eq!(effective_max(&s, &net_limit, ip("192.0.2.1"), &none), 20);
    }

    #[test]
    fn a_new_account_scales_user_limits_rounding_down_never_below_one() {
        let user = limit("user_1d", &[Dimension::User], 5, false);
        let one = limit(
            "user_once",
            &[Dimension::User, Dimension::Activity],
            1,
            false,
        );
        let shared = limit("ip_1m", &[Dimension::Ip], 20, false);
        let s = scene(vec![user.clone(), one.clone(), shared.clone()], vec![]);
        let young = MaxAdjust {
            new_account_factor: Some(0.5),
            trust_bonus: 0,
        };
        assert_eq!(
            effective_max(&s, &user, None, &young),
            2,
            "5 * 0.5 rounds down"
        );
        assert_eq!(effective_max(&s, &one, None, &young), 1, "never below 1");
        assert_eq!(
            effective_max(&s, &shared, ip("192.0.2.1"), &young),
            20,
            "not per user"
        );
    }

    #[test]
    fn trust_raises_only_trust_bonus_limits_after_the_new_account_factor() {
        let bonus = limit("user_1d", &[Dimension::User], 4, true);
        let plain = limit("user_10s", &[Dimension::User], 4, false);
        let s = scene(vec![bonus.clone(), plain.clone()], vec![]);
        let trusted = MaxAdjust {
            new_account_factor: None,
            trust_bonus: 3,
        };
        assert_eq!(effective_max(&s, &bonus, None, &trusted), 7);
        assert_eq!(effective_max(&s, &plain, None, &trusted), 4);
        let both = MaxAdjust {
            new_account_factor: Some(0.5),
            trust_bonus: 3,
        };
        assert_eq!(effective_max(&s, &bonus, None, &both), 5, "4 * 0.5 + 3");
    }
}
