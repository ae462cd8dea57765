//! Store keys, in one place below everything that names them: the check path (`check`,
//! `decide`), refunds (`refund`) and the trust ledgers (`trust`) all build their keys here,
//! so none of them has to import another to agree on a name.
//!
//! `<prefix>:<scene>:<dim>:<value>[:<dim>:<value>…]` for sliding windows,
//! `<prefix>:<scene>:fw:<limit>:<dims…>` and `<prefix>:<scene>:tb:<limit>:<dims…>` for
//! fixed windows and token buckets; the request and idempotency records of a check's first
//! entity in `<prefix>:<scene>:rq:<dim>:<value>` (on Redis, a hash per generation), or
//! `<prefix>:<scene>:req:<dim>:<value>:<id>` and `<prefix>:<scene>:idem:<dim>:<value>:<key>`
//! (embedded).
//!
//! Values are percent-encoded: every byte outside `[A-Za-z0-9._@-]` becomes `%XX`, `%`
//! included. The encoding is injective, and an encoded value contains no `:`, `{`, `}`,
//! `*`, `?`, `[`, space or control byte, so no id can make another key's name, escape the
//! prefix, or widen a SCAN pattern. The segment after the scene is a dimension abbreviation
//! (`uid`, `did`, `ip`, `net`, `aid`, `at.NAME`) or one of `all`, `fw`, `tb`, `req`, `rq`,
//! `idem`, `sg`, `sa`, `sl` — disjoint sets — and limit, signal and attribute names are
//! `[A-Za-z0-9_]`, so the kinds of keys cannot collide either. Signals keep their sets in
//! `<prefix>:<scene>:sg:<signal>[:<dims>]` (and `sa`, `sl`); trust and sightings in
//! `<prefix>:trust-points:uid:<user>`, `<prefix>:user-seen:uid:<user>`,
//! `<prefix>:device-seen:did:<device>` (sightings kept [`SEEN_RETENTION_MS`]). A sliding
//! limit over no dimension (a scene-wide budget) counts in `<prefix>:<scene>:all`.
//!
//! On Redis Cluster ([`KeyPrefix::tagged`]) each key's first entity is a hash tag
//! (`lt:coupon_claim:{uid:10086}:aid:2026verano`, `lt:trust-points:{uid:10086}`), and a
//! key of no entity tags its scene (`lt:{coupon_claim}:all`): one entity's keys share a
//! slot, so a check touches one slot group per entity it names.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use crate::rules::{Algorithm, Dimension, IpGroup, Limit};

/// The dimension values of one check, already validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DimensionValues {
    pub user: Option<String>,
    pub device: Option<String>,
    /// The IP's `ip` under the rule set's `[network]` (`203.0.113.9`, `2001:db8:1:2::/64`).
    pub ip: Option<IpGroup>,
    /// The IP's network under the rule set's `[network]` (`203.0.113.0/24`).
    pub net: Option<String>,
    pub activity: Option<String>,
    /// The declared attributes the check carried.
    pub attrs: BTreeMap<Arc<str>, String>,
}

impl DimensionValues {
    pub fn get(&self, d: &Dimension) -> Option<&str> {
        match d {
            Dimension::User => self.user.as_deref(),
            Dimension::Device => self.device.as_deref(),
            Dimension::Ip => self.ip.as_ref().map(IpGroup::as_str),
            Dimension::Net => self.net.as_deref(),
            Dimension::Activity => self.activity.as_deref(),
            Dimension::Attr(name) => self.attrs.get(name).map(String::as_str),
        }
    }
}

/// Appends `value` percent-encoded.
pub fn encode_into(out: &mut String, value: &str) {
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-') {
            out.push(b as char);
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// Appends `:<abbrev>:<value>` per dimension, the first in a hash tag when `tagged`
/// (`:{uid:10086}:aid:2026verano`); `None` when a value is absent.
fn push_dimensions(
    k: &mut String,
    dims: &[Dimension],
    values: &DimensionValues,
    tagged: bool,
) -> Option<()> {
    for (i, d) in dims.iter().enumerate() {
        push_entity(k, d, values.get(d)?, tagged && i == 0);
    }
    Some(())
}

/// Appends `:<abbrev>:<value>`, or `:{<abbrev>:<value>}` as a hash tag. A tag holds a
/// `:` and an encoded value holds no `{` or `}`, so the tag is exactly the entity: every
/// key of one entity (any scene, any prefix) hashes to one cluster slot, and no tag of an
/// entity equals a scene's tag (`{coupon_claim}`, scene names hold no `:`).
fn push_entity(k: &mut String, d: &Dimension, value: &str, tag: bool) {
    k.push(':');
    if tag {
        k.push('{');
    }
    k.push_str(&d.key_abbrev());
    k.push(':');
    encode_into(k, value);
    if tag {
        k.push('}');
    }
}

/// `<prefix>:<scene>:req:<id>`: where both stores kept a request's record before 2026-12,
/// from the request's records key (`<prefix>:<scene>:rq:<dim>:<value>` or `…:rq:all`),
/// for a refund of a request counted before an upgrade. `None` for a key of another shape.
/// Encoded values hold no `:`, so the entity is the last two segments.
pub fn legacy_record_key(records_key: &str, request_id: &str) -> Option<String> {
    let base = match records_key.strip_suffix(":rq:all") {
        Some(base) => base,
        None => {
            let (rest, _value) = records_key.rsplit_once(':')?;
            let (rest, _abbrev) = rest.rsplit_once(':')?;
            rest.strip_suffix(":rq")?
        }
    };
    let mut k = String::with_capacity(base.len() + 5 + request_id.len());
    k.push_str(base);
    k.push_str(":req:");
    encode_into(&mut k, request_id);
    Some(k)
}

/// The check's first entity among the scene's `required` dimensions (user, device,
/// address, activity, then attributes in the order required), `None` when the scene
/// requires none: what a request's records are kept under. Only
/// a required dimension: a retry or a refund must find the record, and only the required
/// ones are sure to come back with them.
fn first_entity<'v>(
    values: &'v DimensionValues,
    required: &'v [Dimension],
) -> Option<(&'v Dimension, &'v str)> {
    let rank = |d: &Dimension| match d {
        Dimension::User => 0,
        Dimension::Device => 1,
        Dimension::Ip => 2,
        Dimension::Net => 3,
        Dimension::Activity => 4,
        Dimension::Attr(_) => 5,
    };
    // min_by_key keeps the first of equals: attributes in the order the scene lists them.
    required
        .iter()
        .filter_map(|d| values.get(d).map(|v| (d, v)))
        .min_by_key(|(d, _)| rank(d))
}

/// The three sets a signal may keep per entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalKey {
    /// What the signal counts, over the requests its filter lets through.
    Matching,
    /// The same count over every request (`min_share`).
    All,
    /// The last user seen (`user_switches`).
    Last,
}

impl SignalKey {
    fn segment(self) -> &'static str {
        match self {
            SignalKey::Matching => "sg",
            SignalKey::All => "sa",
            SignalKey::Last => "sl",
        }
    }
}

/// How long a first sighting (`user-seen`, `device-seen`) is kept after the entity was last
/// seen: the check plan hands it to the deciders, the ledgers keep sightings as long.
/// `new_account` only asks whether a user is younger than a few days, so a sighting must
/// outlive any sensible `younger_than`; a user absent for three months coming back as "new"
/// is acceptable, while keeping every user ever seen forever is not.
pub const SEEN_RETENTION_MS: u64 = 90 * 86_400_000;

/// The text every key starts with (`[store] key_prefix`), and whether keys are placed for
/// Redis Cluster: then the first entity of every key is a hash tag
/// (`lt:coupon_claim:{uid:10086}:aid:2026verano`, `lt:trust-points:{uid:10086}`), so one
/// entity's windows, records, signals and trust sit in one slot and a check's keys fall
/// into a few slot groups; a key of no entity tags its scene (`lt:{coupon_claim}:all`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPrefix {
    text: String,
    tagged: bool,
}

impl KeyPrefix {
    /// Keys for one Redis or the embedded store: no hash tags.
    pub fn plain(text: &str) -> KeyPrefix {
        KeyPrefix {
            text: text.to_string(),
            tagged: false,
        }
    }

    /// Keys for Redis Cluster: each key's first entity in a hash tag.
    pub fn tagged(text: &str) -> KeyPrefix {
        KeyPrefix {
            text: text.to_string(),
            tagged: true,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn is_tagged(&self) -> bool {
        self.tagged
    }

    /// The keys of one scene.
    pub fn scene<'a>(&'a self, scene: &'a str) -> KeySpace<'a> {
        KeySpace {
            prefix: &self.text,
            scene,
            tagged: self.tagged,
        }
    }

    /// `<prefix>:trust-points:uid:<user>`: the user's awards. The segment after the
    /// prefix holds a hyphen, which scene names cannot: no trust key collides with a
    /// scene's.
    pub fn trust_points_key(&self, user: &str) -> String {
        self.entity_key("trust-points", &Dimension::User, user)
    }

    /// `<prefix>:user-seen:uid:<user>`: the user's first sighting.
    pub fn user_seen_key(&self, user: &str) -> String {
        self.entity_key("user-seen", &Dimension::User, user)
    }

    /// `<prefix>:device-seen:did:<device>`: the device's first sighting.
    pub fn device_seen_key(&self, device: &str) -> String {
        self.entity_key("device-seen", &Dimension::Device, device)
    }

    fn entity_key(&self, kind: &str, d: &Dimension, id: &str) -> String {
        let mut k = String::with_capacity(self.text.len() + kind.len() + id.len() + 10);
        k.push_str(&self.text);
        k.push(':');
        k.push_str(kind);
        push_entity(&mut k, d, id, self.tagged);
        k
    }
}

/// The hash tag of `key` as Redis Cluster reads it: the text between the first `{` and the
/// next `}`, when not empty.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key without
/// one, modulo 16384 (as `CLUSTER KEYSLOT`).
pub fn slot(key: &str) -> u16 {
    slot_of(key.as_bytes())
}

/// [`slot`] of a key name that need not be UTF-8 (what `SCAN` returns).
pub fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let len = rest.iter().position(|&b| b == b'}')?;
        (len > 0).then(|| &rest[..len])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

/// On a cluster, where a slot group tagged `tag` keeps its reservations: the records key
/// of that entity beside `records_key` (the check's, tagged), `<prefix>:<scene>:rq:{tag}`,
/// or `<prefix>:{<scene>}:rq:all` for the scene's own tag. `None` for an untagged key.
pub fn group_records_key(records_key: &str, tag: &str) -> Option<String> {
    let (base, _) = records_key.split_once(":rq:")?;
    // `<prefix>:<scene>` or `<prefix>:{<scene>}`: prefixes and scenes hold no braces.
    let (prefix, scene) = base.split_once(':')?;
    let scene = scene.trim_start_matches('{').trim_end_matches('}');
    Some(if tag.contains(':') {
        format!("{prefix}:{scene}:rq:{{{tag}}}")
    } else {
        format!("{prefix}:{{{scene}}}:rq:all")
    })
}

/// Keys of one cluster slot among a check's (or a refund's), and where that group keeps
/// its records ([`slot_groups`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotGroup {
    pub slot: u16,
    /// The check's records key for the main group, else [`group_records_key`].
    pub records_key: String,
    /// The group of the records key's slot (the check's first entity).
    pub main: bool,
    /// Positions, in the keys given, of the keys in this slot.
    pub members: Vec<usize>,
}

/// `keys` grouped by cluster slot, the main group (`records_key`'s slot) first and always
/// present (it holds the request's record even when no key is in its slot). Errs with a
/// key that has no hash tag: a cluster's keys are placed by entity ([`KeyPrefix::tagged`]).
pub fn slot_groups<'k>(
    records_key: &str,
    keys: impl Iterator<Item = &'k str>,
) -> Result<Vec<SlotGroup>, String> {
    let mut groups = vec![SlotGroup {
        slot: slot(records_key),
        records_key: records_key.to_string(),
        main: true,
        members: Vec::new(),
    }];
    for (i, key) in keys.enumerate() {
        let s = slot(key);
        match groups.iter_mut().find(|g| g.slot == s) {
            Some(g) => g.members.push(i),
            None => groups.push(SlotGroup {
                slot: s,
                records_key: hash_tag(key)
                    .and_then(|tag| group_records_key(records_key, tag))
                    .ok_or_else(|| format!("{key} has no hash tag"))?,
                main: false,
                members: vec![i],
            }),
        }
    }
    Ok(groups)
}

/// The value `encode_into` made `segment` from (it is injective, so this inverts it).
/// `None` for text it could not have made.
pub fn decode_segment(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Builds the keys of one scene under one prefix ([`KeyPrefix::scene`]).
#[derive(Debug, Clone, Copy)]
pub struct KeySpace<'a> {
    pub prefix: &'a str,
    pub scene: &'a str,
    /// Placed for Redis Cluster ([`KeyPrefix`]).
    pub tagged: bool,
}

impl KeySpace<'_> {
    /// `<prefix>:<scene>`; `<prefix>:{<scene>}` for a tagged key of no entity, so a scene's
    /// entity-less keys (and the generations a script appends to them) share one slot.
    fn base(&self, has_entity: bool) -> String {
        let mut k = String::with_capacity(64);
        k.push_str(self.prefix);
        k.push(':');
        if self.tagged && !has_entity {
            k.push('{');
            k.push_str(self.scene);
            k.push('}');
        } else {
            k.push_str(self.scene);
        }
        k
    }

    /// `<base>:<kind>` then the first entity (`:all` for none), tagged as the space is.
    fn entity_record(
        &self,
        kind: &str,
        values: &DimensionValues,
        required: &[Dimension],
    ) -> String {
        let first = first_entity(values, required);
        let mut k = self.base(first.is_some());
        k.push(':');
        k.push_str(kind);
        match first {
            Some((d, value)) => push_entity(&mut k, d, value, self.tagged),
            None => k.push_str(":all"),
        }
        k
    }

    /// The key a limit counts in, or `None` when a dimension it needs is absent.
    pub fn limit_key(&self, limit: &Limit, values: &DimensionValues) -> Option<String> {
        let mut k = self.base(!limit.dimensions.is_empty());
        match limit.algorithm {
            // One ZSET per dimension list; a scene-wide one needs a segment of its own.
            Algorithm::SlidingWindow if limit.dimensions.is_empty() => k.push_str(":all"),
            Algorithm::SlidingWindow => {}
            Algorithm::FixedWindow => {
                k.push_str(":fw:");
                k.push_str(&limit.name);
            }
            Algorithm::TokenBucket => {
                k.push_str(":tb:");
                k.push_str(&limit.name);
            }
        }
        push_dimensions(&mut k, &limit.dimensions, values, self.tagged)?;
        Some(k)
    }

    /// A signal's set (`sg`: the requests its filter lets through; `sa`: all requests, for
    /// `min_share`; `sl`: the last user, for `user_switches`) for one entity:
    /// `<prefix>:<scene>:<kind>:<signal>[:<dim>:<value>…]`. `None` when a value is absent.
    pub fn signal_key(
        &self,
        kind: SignalKey,
        signal: &str,
        per: &[Dimension],
        values: &DimensionValues,
    ) -> Option<String> {
        let mut k = self.base(!per.is_empty());
        k.push(':');
        k.push_str(kind.segment());
        k.push(':');
        k.push_str(signal);
        push_dimensions(&mut k, per, values, self.tagged)?;
        Some(k)
    }

    /// Where Redis keeps the request records of the check's first required entity (user,
    /// else device, address, activity, attribute; the scene itself when it requires none):
    /// `<prefix>:<scene>:rq:<dim>:<value>`, one hash per generation of the record TTL (the
    /// scripts append `:<generation>`, lua/limits.lua). Kept with the entity rather than
    /// one key per request: a hash field costs Redis a fraction of a key (and an entity's
    /// keys are what a cluster's hash tags will keep together).
    pub fn records_key(&self, values: &DimensionValues, required: &[Dimension]) -> String {
        self.entity_record("rq", values, required)
    }

    /// The record of one counted request on the embedded store:
    /// `<prefix>:<scene>:req:<dim>:<value>:<id>`, under the same first entity as on Redis
    /// ([`KeySpace::records_key`]), so both stores answer a repeat alike: the same id is a
    /// repeat for the same entity only (another user's check cannot pass as one already
    /// counted by naming its id).
    pub fn record_key(
        &self,
        values: &DimensionValues,
        required: &[Dimension],
        request_id: &str,
    ) -> String {
        let mut k = self.entity_record("req", values, required);
        k.push(':');
        encode_into(&mut k, request_id);
        k
    }

    /// The record of one idempotency key on the embedded store, under the check's first
    /// entity as its request record: `<prefix>:<scene>:idem:<dim>:<value>:<key>`. On Redis
    /// it is a field of the entity's records hash named by the last segment
    /// (`store::redis::idempotency_field`).
    pub fn idempotency_key(
        &self,
        values: &DimensionValues,
        required: &[Dimension],
        key: &str,
    ) -> String {
        let mut k = self.entity_record("idem", values, required);
        k.push(':');
        encode_into(&mut k, key);
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Layer, Network};

    fn limit(name: &str, algorithm: Algorithm, dims: &[Dimension]) -> Limit {
        Limit {
            name: name.into(),
            dimensions: dims.to_vec(),
            algorithm,
            window_ms: 1000,
            max: 1,
            layer: Layer::Business,
            trust_bonus: false,
            filter: None,
        }
    }

    fn values(user: &str) -> DimensionValues {
        DimensionValues {
            user: Some(user.into()),
            device: Some("dev-12345678".into()),
            ip: Some(Network::default().ip_of("2001:db8::1".parse().unwrap())),
            net: Some("2001:db8::/48".into()),
            activity: Some("2026verano".into()),
            attrs: [("phone_range".into(), "612 34".to_string())].into(),
        }
    }

    const KS: KeySpace = KeySpace {
        prefix: "lt",
        scene: "coupon_claim",
        tagged: false,
    };

    #[test]
    fn keys_follow_the_contract() {
        let l = limit(
            "user_10s",
            Algorithm::SlidingWindow,
            &[Dimension::User, Dimension::Activity],
        );
        assert_eq!(
            KS.limit_key(&l, &values("10086")).unwrap(),
            "lt:coupon_claim:uid:10086:aid:2026verano"
        );
        let ip = limit("ip_1m", Algorithm::FixedWindow, &[Dimension::Ip]);
        assert_eq!(
            KS.limit_key(&ip, &values("1")).unwrap(),
            "lt:coupon_claim:fw:ip_1m:ip:2001%3Adb8%3A%3A%2F64"
        );
        let tb = limit("dev_tb", Algorithm::TokenBucket, &[Dimension::Device]);
        assert_eq!(
            KS.limit_key(&tb, &values("1")).unwrap(),
            "lt:coupon_claim:tb:dev_tb:did:dev-12345678"
        );
    }

    #[test]
    fn records_sit_with_the_first_entity_the_scene_requires() {
        use Dimension::*;
        let v = values("10086");
        let phone = Attr("phone_range".into());
        let all = [Activity, phone.clone(), Ip, Device, User];
        let key = |required: &[Dimension]| KS.records_key(&v, required);
        assert_eq!(key(&all), "lt:coupon_claim:rq:uid:10086");
        assert_eq!(key(&all[..4]), "lt:coupon_claim:rq:did:dev-12345678");
        assert_eq!(
            key(&all[..3]),
            "lt:coupon_claim:rq:ip:2001%3Adb8%3A%3A%2F64"
        );
        assert_eq!(key(&all[..2]), "lt:coupon_claim:rq:aid:2026verano");
        assert_eq!(
            key(&all[1..2]),
            "lt:coupon_claim:rq:at.phone_range:612%2034"
        );
        // A value the check carries but the scene does not require is not an entity a
        // retry or a refund is sure to name again.
        assert_eq!(key(&[]), "lt:coupon_claim:rq:all");
        let mut no_user = v.clone();
        no_user.user = None;
        assert_eq!(KS.records_key(&no_user, &[User]), "lt:coupon_claim:rq:all");
        assert_eq!(
            KS.record_key(&v, &[], "r:1"),
            "lt:coupon_claim:req:all:r%3A1"
        );
        assert_eq!(
            KS.record_key(&v, &all, "r1"),
            "lt:coupon_claim:req:uid:10086:r1"
        );
        assert_eq!(
            KS.idempotency_key(&v, &all, "k:1"),
            "lt:coupon_claim:idem:uid:10086:k%3A1"
        );
        // Where a record was before 2026-12, from either shape of records key.
        for required in [&all[..], &[]] {
            assert_eq!(
                legacy_record_key(&KS.records_key(&v, required), "r:1").as_deref(),
                Some("lt:coupon_claim:req:r%3A1")
            );
        }
        assert_eq!(legacy_record_key("lt:coupon_claim:uid:1", "r1"), None);
    }

    #[test]
    fn on_a_cluster_the_first_entity_is_the_hash_tag() {
        use Dimension::*;
        let prefix = KeyPrefix::tagged("lt");
        let ks = prefix.scene("coupon_claim");
        let v = values("10086");
        let key =
            |algorithm, dims: &[Dimension]| ks.limit_key(&limit("l", algorithm, dims), &v).unwrap();
        use Algorithm::*;
        assert_eq!(key(SlidingWindow, &[User]), "lt:coupon_claim:{uid:10086}");
        assert_eq!(
            key(SlidingWindow, &[User, Activity]),
            "lt:coupon_claim:{uid:10086}:aid:2026verano"
        );
        assert_eq!(
            key(FixedWindow, &[Ip]),
            "lt:coupon_claim:fw:l:{ip:2001%3Adb8%3A%3A%2F64}"
        );
        assert_eq!(
            key(TokenBucket, &[Device, User]),
            "lt:coupon_claim:tb:l:{did:dev-12345678}:uid:10086"
        );
        // A key of no entity tags its scene: its generations stay in its slot.
        assert_eq!(key(SlidingWindow, &[]), "lt:{coupon_claim}:all");
        assert_eq!(key(FixedWindow, &[]), "lt:{coupon_claim}:fw:l");
        assert_eq!(
            ks.signal_key(SignalKey::Matching, "s", &[Net], &v).unwrap(),
            "lt:coupon_claim:sg:s:{net:2001%3Adb8%3A%3A%2F48}"
        );
        assert_eq!(
            ks.signal_key(SignalKey::All, "s", &[], &v).unwrap(),
            "lt:{coupon_claim}:sa:s"
        );
        // Records and trust sit with the user.
        let all = [Activity, Device, User];
        assert_eq!(ks.records_key(&v, &all), "lt:coupon_claim:rq:{uid:10086}");
        assert_eq!(ks.records_key(&v, &[]), "lt:{coupon_claim}:rq:all");
        assert_eq!(
            ks.record_key(&v, &all, "r1"),
            "lt:coupon_claim:req:{uid:10086}:r1"
        );
        assert_eq!(
            ks.idempotency_key(&v, &all, "k"),
            "lt:coupon_claim:idem:{uid:10086}:k"
        );
        assert_eq!(
            prefix.trust_points_key("10086"),
            "lt:trust-points:{uid:10086}"
        );
        assert_eq!(prefix.user_seen_key("10086"), "lt:user-seen:{uid:10086}");
        assert_eq!(prefix.device_seen_key("d"), "lt:device-seen:{did:d}");
        // A hostile value cannot open or close a tag.
        assert_eq!(
            ks.limit_key(&limit("l", SlidingWindow, &[User]), &values("}{x"))
                .unwrap(),
            "lt:coupon_claim:{uid:%7D%7Bx}"
        );
        // Plain keys (one Redis, embedded) have no tags.
        let plain = KeyPrefix::plain("lt");
        assert_eq!(plain.trust_points_key("1"), "lt:trust-points:uid:1");
        assert_eq!(
            plain.scene("coupon_claim").records_key(&v, &[]),
            "lt:coupon_claim:rq:all"
        );
    }

    #[test]
    fn slots_and_group_records_follow_the_tags() {
        assert_eq!(hash_tag("lt:coupon_claim:{uid:1}:aid:x"), Some("uid:1"));
        assert_eq!(hash_tag("lt:{}:x"), None);
        assert_eq!(hash_tag("lt:coupon_claim:uid:1"), None);
        // CLUSTER KEYSLOT's own examples (the cluster spec).
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        // An empty tag hashes the whole key; only the first `{...}` counts; an unclosed
        // brace is no tag.
        assert_ne!(slot("a{}b"), slot(""));
        assert_eq!(slot("{a}{b}"), slot("a"));
        assert_ne!(slot("x{a"), slot("a"));
        // Key names need not be UTF-8.
        assert_eq!(slot_of(b"lt:\xff{t}"), slot("t"));
        assert_eq!(slot("123456789"), 0x31C3); // CRC16-XMODEM check value, below 16384
        let rq = "lt:coupon_claim:rq:{uid:10086}";
        assert_eq!(
            group_records_key(rq, "did:d1").as_deref(),
            Some("lt:coupon_claim:rq:{did:d1}")
        );
        assert_eq!(
            group_records_key(rq, "coupon_claim").as_deref(),
            Some("lt:{coupon_claim}:rq:all")
        );
        assert_eq!(
            group_records_key("lt:{coupon_claim}:rq:all", "uid:1").as_deref(),
            Some("lt:coupon_claim:rq:{uid:1}")
        );
    }

    #[test]
    fn hostile_values_cannot_forge_or_escape() {
        let l = limit("u", Algorithm::SlidingWindow, &[Dimension::User]);
        // "a:aid:b" as a user must not equal the user "a" combined with activity "b".
        let forged = KS.limit_key(&l, &values("a:aid:b")).unwrap();
        let two = limit(
            "ua",
            Algorithm::SlidingWindow,
            &[Dimension::User, Dimension::Activity],
        );
        let mut v = values("a");
        v.activity = Some("b".into());
        assert_ne!(forged, KS.limit_key(&two, &v).unwrap());
        for hostile in ["*", "{x}", "a b", "a\nb", "%3A", "../..", "ü"] {
            let k = KS.limit_key(&l, &values(hostile)).unwrap();
            let tail = k.strip_prefix("lt:coupon_claim:uid:").unwrap();
            assert!(
                tail.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._@-%".contains(&b)),
                "{k}"
            );
        }
        // Injective: the escape character itself is escaped.
        assert_ne!(
            KS.limit_key(&l, &values("%3A")).unwrap(),
            KS.limit_key(&l, &values(":")).unwrap()
        );
    }

    #[test]
    fn a_missing_dimension_makes_no_key() {
        let l = limit("d", Algorithm::SlidingWindow, &[Dimension::Device]);
        let mut v = values("u");
        v.device = None;
        assert_eq!(KS.limit_key(&l, &v), None);
    }
}
