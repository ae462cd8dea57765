//! Where traffic comes from: residential /24s, addresses inside a CIDR, and the distinct
//! samples both need. Pure functions of the RNG they are given, so a seed fixes them.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use rand::Rng;

/// First octets of residential networks: public unicast /8s held by regional registries
/// and broadband carriers. Left out on purpose: 0, 10, 100 (100.64/10), 127, 169
/// (169.254/16), 172 (172.16/12), 192 (192.168/16, 192.0.2/24), 198 (198.18/15,
/// 198.51.100/24), 203 (203.0.113/24) and 224 and up — so no home address is private,
/// shared, loopback, link-local, a benchmark or documentation range (the examples put
/// proxies there) or multicast, and none lands in a rule file's special CIDR by chance.
const RESIDENTIAL_FIRST_OCTETS: [u8; 74] = [
    2, 5, 24, 31, 37, 46, 49, 58, 59, 60, 61, 62, 67, 68, 69, 70, 71, 73, 76, 77, 78, 79, 80, 81,
    82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 98, 99, 101, 109, 110, 111, 112, 113,
    114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 175, 176, 177, 178, 179, 180, 181,
    182, 183, 186, 187, 188, 189, 190, 191, 201,
];

/// How many distinct residential /24s there are to draw from.
pub const RESIDENTIAL_NETWORKS: u64 = RESIDENTIAL_FIRST_OCTETS.len() as u64 * 65_536;

/// `count` distinct residential /24s (at most [`RESIDENTIAL_NETWORKS`]), as their
/// network addresses, in ascending order.
pub fn residential_networks(rng: &mut impl Rng, count: u64) -> Vec<u32> {
    let count = count.min(RESIDENTIAL_NETWORKS);
    sample_distinct(rng, u128::from(RESIDENTIAL_NETWORKS), u128::from(count))
        .into_iter()
        .map(|i| {
            // Index i: the (i / 65536)-th /8 of the list, then its (i % 65536)-th /24.
            let octet =
                RESIDENTIAL_FIRST_OCTETS[(i >> 16) as usize % RESIDENTIAL_FIRST_OCTETS.len()];
            (u32::from(octet) << 24) | (((i & 0xffff) as u32) << 8)
        })
        .collect()
}

/// A home address in the /24 `network`: host 1 to 254, never the network or broadcast
/// address a real subscriber cannot hold.
pub fn home_address(rng: &mut impl Rng, network: u32) -> IpAddr {
    let host: u32 = rng.random_range(1..=254);
    IpAddr::V4(Ipv4Addr::from(network | host))
}

/// How many addresses `net` holds (an IPv6 /0 saturates at `u128::MAX`).
pub fn size(net: &IpNet) -> u128 {
    let bits = u32::from(net.max_prefix_len() - net.prefix_len());
    1u128.checked_shl(bits).unwrap_or(u128::MAX)
}

/// Whether `net` is written as its network address (no host bits set).
pub fn is_network(net: &IpNet) -> bool {
    net.trunc() == *net
}

/// The address `offset` places into `net` (`offset` below [`size`]).
pub fn nth(net: &IpNet, offset: u128) -> IpAddr {
    match net {
        IpNet::V4(v4) => {
            let base = u32::from(v4.network());
            // Truncation is the point: offset < size ≤ 2^32 for IPv4.
            IpAddr::V4(Ipv4Addr::from(
                base | (offset as u32 & u32::from(v4.hostmask())),
            ))
        }
        IpNet::V6(v6) => {
            let base = u128::from(v6.network());
            IpAddr::V6(Ipv6Addr::from(base | (offset & u128::from(v6.hostmask()))))
        }
    }
}

/// A uniformly random address in `net`.
pub fn random_in(rng: &mut impl Rng, net: &IpNet) -> IpAddr {
    nth(net, rng.random::<u128>())
}

/// `k` distinct numbers below `n` (`k ≤ n`), ascending.
///
/// Floyd's algorithm: exactly `k` draws and `O(k)` memory however large `n` is, so
/// picking 4 addresses of a /16 or 300 /24s out of millions costs the same as picking
/// them out of a handful.
pub fn sample_distinct(rng: &mut impl Rng, n: u128, k: u128) -> Vec<u128> {
    let k = k.min(n);
    let mut chosen = BTreeSet::new();
    for j in (n - k)..n {
        let t = rng.random_range(0..=j);
        if !chosen.insert(t) {
            chosen.insert(j);
        }
    }
    chosen.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn scenario_samples_are_distinct_and_in_range() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for (n, k) in [(10, 10), (10, 3), (1 << 40, 1000), (1, 0)] {
            let got = sample_distinct(&mut rng, n, k);
            assert_eq!(got.len() as u128, k);
            assert!(got.windows(2).all(|w| w[0] < w[1]));
            assert!(got.iter().all(|&x| x < n));
        }
    }

    #[test]
    fn scenario_residential_networks_avoid_special_ranges() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let nets = residential_networks(&mut rng, 5000);
        assert_eq!(nets.len(), 5000);
        for n in nets {
            let ip = Ipv4Addr::from(n);
            assert_eq!(n & 0xff, 0);
            assert!(
                !ip.is_private() && !ip.is_loopback() && !ip.is_link_local(),
                "{ip}"
            );
            assert!(!ip.is_documentation() && !ip.is_multicast(), "{ip}");
            let a = home_address(&mut rng, n);
            let IpAddr::V4(a) = a else { panic!("{a}") };
            assert!((1..=254).contains(&a.octets()[3]));
        }
    }

    #[test]
    fn scenario_addresses_stay_inside_their_cidr() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for cidr in [
            "10.8.0.0/16",
            "203.0.113.0/24",
            "198.51.100.7/32",
            "2001:db8::/48",
            "::/0",
        ] {
            let net: IpNet = cidr.parse().unwrap();
            for _ in 0..200 {
                assert!(net.contains(&random_in(&mut rng, &net)), "{cidr}");
            }
        }
        assert_eq!(size(&"10.8.0.0/16".parse().unwrap()), 65_536);
        assert_eq!(size(&"::/0".parse().unwrap()), u128::MAX);
        assert!(!is_network(&"10.8.0.1/16".parse().unwrap()));
    }
}
