use super::*;

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

fn range(text: &str) -> IpNet {
    text.parse().expect("a range")
}

fn with_ip_prefix(ipv6_ip_prefix: u8) -> Network {
    Network {
        ipv6_ip_prefix,
        ..Network::default()
    }
}

/// One subscriber's /64 is one `ip`, whatever its low 64 bits: a client rotating privacy
/// addresses stays one client; the next /64 is another.
#[test]
fn rotating_the_low_64_bits_keeps_the_ip() {
    let net = Network::default();
    for addr in [
        "2001:db8:1:2::1",
        "2001:db8:1:2:ffff:ffff:ffff:ffff",
        "2001:db8:1:2:a:b:c:d",
        "2001:DB8:1:2:0:0:0:9",
    ] {
        assert_eq!(net.ip_of(ip(addr)).as_str(), "2001:db8:1:2::/64", "{addr}");
        // The /64 lies within the address's net.
        assert_eq!(net.of(ip(addr)), "2001:db8:1::/48", "{addr}");
    }
    assert_eq!(
        net.ip_of(ip("2001:db8:1:3::1")).as_str(),
        "2001:db8:1:3::/64"
    );
    assert_ne!(
        net.ip_of(ip("2001:db8:1:2::1")),
        net.ip_of(ip("2001:db8:1:3::1"))
    );
}

/// `ipv6_ip_prefix` sets the group; 128 keys every address alone, in the address's own
/// text (the key it had before grouping existed).
#[test]
fn the_ip_prefix_is_configurable_and_128_is_the_address() {
    assert_eq!(
        with_ip_prefix(56).ip_of(ip("2001:db8:1:2::1")).as_str(),
        "2001:db8:1::/56"
    );
    assert_eq!(
        with_ip_prefix(60).ip_of(ip("2001:db8:1:1f::1")).as_str(),
        "2001:db8:1:10::/60"
    );
    let exact = with_ip_prefix(128);
    assert_eq!(exact.ip_of(ip("2001:DB8::1")).as_str(), "2001:db8::1");
    assert_ne!(
        exact.ip_of(ip("2001:db8::1")),
        exact.ip_of(ip("2001:db8::2"))
    );
    assert_eq!(
        exact.ip_of(ip("2001:db8::1")).range(),
        range("2001:db8::1/128")
    );
}

/// IPv4 is untouched: an address is its own `ip`, whatever the IPv6 prefix.
#[test]
fn an_ipv4_address_is_its_own_ip() {
    for net in [Network::default(), with_ip_prefix(128), with_ip_prefix(1)] {
        let group = net.ip_of(ip("203.0.113.9"));
        assert_eq!(group.as_str(), "203.0.113.9");
        assert_eq!(group.range(), range("203.0.113.9/32"));
        assert_ne!(group, net.ip_of(ip("203.0.113.10")));
    }
}

/// An IPv6 form carrying an IPv4 client's address is that address, for `ip` and `net`
/// alike: mapped (a dual-stack socket) and NAT64's well-known prefix (a translator in front
/// of an IPv6-only backend — unfolded, every IPv4 client would be one /64).
#[test]
fn ipv4_carried_in_ipv6_is_ipv4() {
    let net = Network::default();
    for form in [
        "::ffff:203.0.113.9",
        "::FFFF:cb00:7109",
        "64:ff9b::203.0.113.9",
    ] {
        assert_eq!(net.ip_of(ip(form)).as_str(), "203.0.113.9", "{form}");
        assert_eq!(net.of(ip(form)), "203.0.113.0/24", "{form}");
        assert_eq!(fold(ip(form)), ip("203.0.113.9"), "{form}");
    }
    // Two IPv4 clients behind one translator stay two clients.
    assert_ne!(
        net.ip_of(ip("64:ff9b::198.51.100.1")),
        net.ip_of(ip("64:ff9b::198.51.100.2"))
    );
}

/// The forms not folded are IPv6 like any other, grouped at the prefix: IPv4-compatible
/// (deprecated, and `::1` shares its /96), 6to4, Teredo, a network-specific NAT64 prefix.
#[test]
fn tunnels_and_deprecated_forms_stay_ipv6() {
    let net = Network::default();
    for (form, group) in [
        ("::203.0.113.9", "::/64"),
        ("::1", "::/64"),
        ("2002:cb00:7109::1", "2002:cb00:7109::/64"),
        (
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:0:4136:e378::/64",
        ),
        ("64:ff9b:1::cb00:7109", "64:ff9b:1::/64"),
    ] {
        assert_eq!(fold(ip(form)), ip(form), "{form}");
        assert_eq!(net.ip_of(ip(form)).as_str(), group, "{form}");
    }
}

/// A range holds a client whole or not at all: an override on a /48 or the /64 itself
/// covers every address of the /64; one on another /64, or of the other family, none.
#[test]
fn a_range_holds_all_of_a_client_or_none() {
    let net = Network::default();
    let client = net.ip_of(ip("2001:db8:1:2::1"));
    let rotated = net.ip_of(ip("2001:db8:1:2:dead:beef:0:1"));
    for (cidr, holds) in [
        ("2001:db8:1::/48", true),
        ("2001:db8:1:2::/64", true),
        ("::/0", true),
        ("2001:db8:1:3::/64", false),
        ("0.0.0.0/0", false),
    ] {
        let cidr = range(cidr);
        assert_eq!(client.within(&cidr), holds, "{cidr}");
        assert_eq!(rotated.within(&cidr), holds, "{cidr}");
    }
    let v4 = net.ip_of(ip("::ffff:10.8.3.4"));
    assert!(v4.within(&range("10.8.0.0/16")));
    assert!(!v4.within(&range("::ffff:0:0/96")));
}

/// A range is taken as addresses are: an IPv4-embedded range is its IPv4 range, so an
/// override written either way matches the same clients; an IPv6 range narrower than one
/// `ip` is refused, naming the prefix.
#[test]
fn ranges_fold_and_may_not_split_an_ip() {
    let net = Network::default();
    for (given, taken) in [
        ("::ffff:10.8.0.0/112", "10.8.0.0/16"),
        ("64:ff9b::10.8.0.0/112", "10.8.0.0/16"),
        ("::ffff:203.0.113.9/128", "203.0.113.9/32"),
        ("10.8.0.0/16", "10.8.0.0/16"),
        ("203.0.113.9/32", "203.0.113.9/32"),
        ("2001:db8::/64", "2001:db8::/64"),
        ("2001:db8::/32", "2001:db8::/32"),
    ] {
        assert_eq!(net.range(range(given)), Ok(range(taken)), "{given}");
    }
    let err = net.range(range("2001:db8::1/128")).unwrap_err();
    assert_eq!(
        err,
        RangeError::NarrowerThanIp {
            range: range("2001:db8::1/128"),
            ip_prefix: 64
        }
    );
    assert!(err.to_string().contains("ipv6_ip_prefix"), "{err}");
    assert!(net.range(range("2001:db8::/65")).is_err());
    let exact = with_ip_prefix(128);
    assert_eq!(
        exact.range(range("2001:db8::1/128")),
        Ok(range("2001:db8::1/128"))
    );
    // Wider than the folding /96, a range stays IPv6 (host bits dropped).
    assert_eq!(
        exact.range(range("::ffff:0:0/95")),
        Ok(range("::fffe:0:0/95"))
    );
}

/// The IPv4 network written digit by digit is `ipnet`'s text, for every prefix.
#[test]
fn an_ipv4_network_is_ipnets_text() {
    let addresses = [
        "203.0.113.9",
        "0.0.0.0",
        "255.255.255.255",
        "10.1.2.3",
        "1.0.0.1",
    ];
    for text in addresses {
        let v4: Ipv4Addr = text.parse().expect("an address");
        for prefix in 0..=32u8 {
            let net = Network {
                ipv4_prefix: prefix,
                ..Network::default()
            };
            let expected = Ipv4Net::new(v4, prefix)
                .expect("a prefix")
                .trunc()
                .to_string();
            assert_eq!(net.of(IpAddr::V4(v4)), expected, "{text}/{prefix}");
        }
    }
    // A prefix past 32 (refused by the rules compiler) stays the address itself.
    let wide = Network {
        ipv4_prefix: 40,
        ..Network::default()
    };
    assert_eq!(wide.of(ip("10.1.2.3")), "10.1.2.3/32");
}
