//! The max of a limit before the user is known: a CIDR override for the request's IP
//! replaces the max of a limit counted per `ip` or `net` (the most specific range wins) —
//! a campus NAT gets room, nobody else does. A range matches the request's `ip` (an IPv6
//! /64 whole), so every address of one client gets the same max. What the user changes (a
//! new account's `max_factor`, trust's `trust_bonus`) is applied by the decider, on the
//! facts it reads (`decide::math::effective_max`).

use crate::rules::{Dimension, IpGroup, Limit, Scene};

/// The limit's max for a request from `ip`: the most specific CIDR override of it that
/// holds `ip`, or its own.
pub fn overridden_max(scene: &Scene, limit: &Limit, ip: Option<&IpGroup>) -> u64 {
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
        .filter(|o| o.limit == limit.name && ip.within(&o.cidr))
        .max_by_key(|o| o.cidr.prefix_len())
        .map_or(limit.max, |o| o.max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Algorithm, Layer, Network, Override, StoreErrorPolicy};

    fn limit(name: &str, dims: &[Dimension], max: u64) -> Limit {
        Limit {
            name: name.into(),
            dimensions: dims.to_vec(),
            algorithm: Algorithm::SlidingWindow,
            window_ms: 60_000,
            max,
            layer: Layer::Business,
            trust_bonus: false,
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
            challenge: None,
        }
    }

    fn group(s: &str) -> IpGroup {
        Network::default().ip_of(s.parse().unwrap())
    }

    #[test]
    fn the_most_specific_override_wins_for_ip_limits_only() {
        let ip_limit = limit("ip_1m", &[Dimension::Ip], 20);
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
        assert_eq!(overridden_max(&s, &ip_limit, Some(&group("10.8.1.1"))), 600);
        assert_eq!(overridden_max(&s, &ip_limit, Some(&group("10.9.1.1"))), 100);
        assert_eq!(overridden_max(&s, &ip_limit, Some(&group("192.0.2.1"))), 20);
        assert_eq!(overridden_max(&s, &ip_limit, None), 20);
        // A limit per network takes the range's max too.
        let net_limit = limit("ip_1m", &[Dimension::Net], 20);
        let s = scene(
            vec![net_limit.clone()],
            vec![Override {
                cidr: "10.8.0.0/16".parse().unwrap(),
                limit: "ip_1m".into(),
                max: 600,
            }],
        );
        assert_eq!(
            overridden_max(&s, &net_limit, Some(&group("10.8.1.1"))),
            600
        );
        assert_eq!(
            overridden_max(&s, &net_limit, Some(&group("192.0.2.1"))),
            20
        );
    }

    /// An override on an IPv6 range covers a client's whole /64: every rotated address
    /// gets the campus max, and a /64 outside it gets none.
    #[test]
    fn an_ipv6_override_covers_every_address_of_a_64() {
        let ip_limit = limit("ip_1m", &[Dimension::Ip], 20);
        let s = scene(
            vec![ip_limit.clone()],
            vec![Override {
                cidr: "2001:db8:8::/48".parse().unwrap(),
                limit: "ip_1m".into(),
                max: 600,
            }],
        );
        for addr in ["2001:db8:8:1::1", "2001:db8:8:1:ffff:1234:5678:9abc"] {
            assert_eq!(
                overridden_max(&s, &ip_limit, Some(&group(addr))),
                600,
                "{addr}"
            );
        }
        assert_eq!(
            overridden_max(&s, &ip_limit, Some(&group("2001:db8:9::1"))),
            20
        );
    }
}
