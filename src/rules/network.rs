//! `[network]`: what a check's address is to every rule — its `ip` (one client) and its
//! `net` (one network). Keys, signals, CIDR overrides and lists all take an address
//! through here, so a limit, a signal's distinct `ips` and an override never disagree on
//! which addresses are one.
//!
//! **IPv6 `ip` is a prefix, not an address.** A subscriber is delegated at least a /64
//! (SLAAC needs one, RFC 4291), and privacy addresses (RFC 8981) rotate the low 64 bits at
//! will: keyed per /128, one phone has 2^64 fresh `ip`s. So an IPv6 address's `ip` is its
//! /64 (`ipv6_ip_prefix`), written `2001:db8:1:2::/64`; its `net` stays the /48.
//!
//! **IPv4 inside IPv6 is IPv4.** Forms that carry an IPv4 client's own address fold to it
//! before anything else looks ([`fold`]); see [`embedded_ipv4`] for which, and why the
//! others do not.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// `ipv6_ip_prefix` when `[network]` does not set it (and `ipv6_prefix` is no longer).
pub const DEFAULT_IPV6_IP_PREFIX: u8 = 64;

/// `[network]`: how an IP becomes its `net` (IPv4 /24 and IPv6 /48 unless set) and, for
/// IPv6, its `ip` (the /64 unless set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    /// 0..=32.
    pub ipv4_prefix: u8,
    /// 0..=128.
    pub ipv6_prefix: u8,
    /// `max(1, ipv6_prefix)..=128`: an address's `ip` lies within its `net`. 128 keys each
    /// IPv6 address alone.
    pub ipv6_ip_prefix: u8,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            ipv4_prefix: 24,
            ipv6_prefix: 48,
            ipv6_ip_prefix: DEFAULT_IPV6_IP_PREFIX,
        }
    }
}

/// The `ip` dimension's value of one address: the addresses that count as one client (an
/// IPv4 address, an IPv6 /64) and the text its keys and signal members use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpGroup {
    range: IpNet,
    text: String,
}

impl IpGroup {
    /// `203.0.113.9`, `2001:db8:1:2::/64` (the IPv6 network in `ipnet`'s canonical text,
    /// like a `net` value), or with `ipv6_ip_prefix = 128` the address alone
    /// (`2001:db8::1`, as before grouping existed). Keys percent-encode it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The addresses it stands for: an IPv4 /32, an IPv6 /`ipv6_ip_prefix`.
    pub fn range(&self) -> IpNet {
        self.range
    }

    /// Whether `range` (an override's or a list's, folded by [`Network::range`]) holds
    /// this client: all of its addresses or none, so every address of one /64 gets the
    /// same answer. The one test overrides and lists match by.
    pub fn within(&self, range: &IpNet) -> bool {
        range.contains(&self.range)
    }
}

/// Why a range cannot be matched against an `ip`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Narrower than one IPv6 `ip`: it would hold some addresses of a client and not
    /// others, which one key cannot tell apart.
    #[error(
        "{range} is narrower than one IPv6 `ip` (a /{ip_prefix}, [network] ipv6_ip_prefix): \
         every address of a /{ip_prefix} counts as one client, and no range can single out \
         part of one"
    )]
    NarrowerThanIp { range: IpNet, ip_prefix: u8 },
}

impl Network {
    /// The `ip` dimension's value of a check's address.
    pub fn ip_of(&self, ip: IpAddr) -> IpGroup {
        match fold(ip) {
            IpAddr::V4(v4) => {
                let mut text = String::with_capacity(15);
                push_ipv4(&mut text, v4);
                IpGroup {
                    range: IpNet::V4(Ipv4Net::from(v4)),
                    text,
                }
            }
            IpAddr::V6(v6) => {
                let prefix = self.ipv6_ip_prefix.min(128);
                let range = Ipv6Net::new(v6, prefix)
                    .map(|n| n.trunc())
                    .unwrap_or_else(|_| Ipv6Net::from(v6));
                // A /128 is the address: its text stays the address's, so keys made
                // before grouping existed still name it.
                let text = if range.prefix_len() == 128 {
                    v6.to_string()
                } else {
                    range.to_string()
                };
                IpGroup {
                    range: IpNet::V6(range),
                    text,
                }
            }
        }
    }

    /// The `net` dimension's value of a check's address, as text (`203.0.113.0/24`,
    /// `2001:db8:1::/48`).
    pub fn of(&self, ip: IpAddr) -> String {
        match fold(ip) {
            // Every check with an address pays for this: written digit by digit, not
            // through `Display` (the same text as `ipnet`'s, which IPv6 still uses).
            IpAddr::V4(v4) => {
                let prefix = self.ipv4_prefix.min(32);
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                let mut out = String::with_capacity(18);
                push_ipv4(&mut out, Ipv4Addr::from(u32::from(v4) & mask));
                out.push('/');
                out.push_str(itoa::Buffer::new().format(prefix));
                out
            }
            IpAddr::V6(v6) => Ipv6Net::new(v6, self.ipv6_prefix.min(128))
                .map(|n| IpNet::V6(n.trunc()))
                .unwrap_or_else(|_| IpNet::V6(Ipv6Net::from(v6)))
                .to_string(),
        }
    }

    /// A range as an override (or a list) must name it to match [`IpGroup::within`]:
    /// IPv4-embedded IPv6 ranges as their IPv4 range ([`fold_range`]), and an IPv6 range
    /// narrower than one `ip` refused.
    pub fn range(&self, range: IpNet) -> Result<IpNet, RangeError> {
        let range = fold_range(range.trunc());
        match range {
            IpNet::V6(v6) if v6.prefix_len() > self.ipv6_ip_prefix => {
                Err(RangeError::NarrowerThanIp {
                    range,
                    ip_prefix: self.ipv6_ip_prefix,
                })
            }
            _ => Ok(range),
        }
    }
}

/// `ip` as the rules see it: an IPv6 form carrying an IPv4 client's address is that IPv4
/// address (`::ffff:203.0.113.9` is `203.0.113.9`); anything else is itself.
pub fn fold(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_ipv4(v6).map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// A range as [`fold`] sees its addresses: an IPv6 range inside a folding /96 (written
/// `::ffff:10.8.0.0/112`) is the IPv4 range its addresses fold to (`10.8.0.0/16`), so an
/// override written either way matches the same clients. A wider range keeps its IPv6
/// form; the folded addresses it covers are IPv4 now and fall outside it.
pub fn fold_range(range: IpNet) -> IpNet {
    match range {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match embedded_ipv4(v6.network()) {
            Some(v4) => Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(range, IpNet::V4),
            None => range,
        },
        _ => range,
    }
}

/// The IPv4 client address inside `v6`, if it is one of the folding forms, each a /96
/// whose last 32 bits are the client's IPv4 address:
///
/// - `::ffff:0:0/96`, IPv4-mapped (RFC 4291): how a dual-stack socket reports an IPv4
///   peer.
/// - `64:ff9b::/96`, the NAT64/SIIT well-known prefix (RFC 6052): how a translator in
///   front of an IPv6-only backend presents its IPv4 clients. Not folded, every IPv4
///   client would share `64:ff9b::/64` — one `ip` for the whole IPv4 Internet.
///
/// Not folded (grouped at the prefix like any IPv6 address):
///
/// - `::a.b.c.d`, IPv4-compatible: deprecated (RFC 4291 §2.5.5.1), sent by no current
///   stack, and sharing its /96 with `::1` and `::`.
/// - 6to4 (`2002::/16`) and Teredo (`2001::/32`): the IPv4 inside is a tunnel's — a 6to4
///   router's for a whole site; for Teredo, the client's NAT's, obfuscated, beside its
///   server's — not an address the client connects from. A host on either also has the
///   IPv4 it tunnels over, which RFC 6724's default policy prefers for a dual-stack
///   service, so they are rare here; a 6to4 site's /48 is its `net` like a native one's.
/// - A NAT64 network-specific prefix (RFC 6052 §2.3, e.g. inside `64:ff9b:1::/48`): its
///   length and place are the operator's, unknown to the rules.
fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    const MAPPED: u128 = 0xffff;
    const NAT64_WELL_KNOWN: u128 = 0x0064_ff9b_0000_0000_0000_0000;
    let bits = u128::from(v6);
    // The low 32 bits always fit a u32.
    let low = Ipv4Addr::from((bits & u128::from(u32::MAX)) as u32);
    matches!(bits >> 32, MAPPED | NAT64_WELL_KNOWN).then_some(low)
}

/// Appends the dotted quad of `v4`, digit by digit.
fn push_ipv4(out: &mut String, v4: Ipv4Addr) {
    let mut digits = itoa::Buffer::new();
    for (i, octet) in v4.octets().iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(digits.format(*octet));
    }
}

#[cfg(test)]
mod tests;
