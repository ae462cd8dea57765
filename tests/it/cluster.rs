//! vigia on Redis Cluster: key placement, the local cluster harness.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::RedisCluster;
use vigia::check::plan::plan;
use vigia::check::request::parse_check;
use vigia::keys::KeyPrefix;
use vigia::rules::load_dir;

/// Every key a check of the shipped `coupon_claim` scene touches, on a cluster, lands in
/// the slot of its first entity: the user's windows, records and trust in one slot, the
/// device's in another… so a check's keys fall into one group per entity.
#[test]
fn a_checks_keys_sit_in_one_slot_per_entity() {
    let cluster = RedisCluster::start();
    let rules = load_dir(Path::new("rules")).expect("the shipped rules load");
    let body = serde_json::json!({
        "scene": "coupon_claim", "request_id": "r1", "user_id": "10086",
        "device_id": "dev-12345678", "ip": "203.0.113.7", "activity_id": "2026verano",
        "idempotency_key": "k1",
    });
    let req = parse_check(&rules, &body, 1_700_000_000_000).expect("a valid check");
    let (plan, _) = plan(&KeyPrefix::tagged("lt"), &rules, &req, 86_400_000);

    let mut keys: Vec<String> = vec![plan.records_key.clone()];
    keys.extend(plan.limits.iter().map(|l| l.key.clone()));
    for s in &plan.signals {
        keys.push(s.key.clone());
        keys.extend(s.all_key.clone());
        keys.extend(s.last_key.clone());
    }
    let trust = plan.trust.as_ref().expect("the shipped rules have [trust]");
    keys.extend(trust.points_key.clone());
    keys.extend(trust.user_seen_key.clone());
    keys.extend(trust.device_seen_key.clone());

    // The tag of each key, and the slot Redis gives the key.
    let mut slots_of_tag: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    for key in &keys {
        let open = key
            .find('{')
            .unwrap_or_else(|| panic!("{key} has no hash tag"));
        let close = key[open..].find('}').expect("a closed tag") + open;
        let tag = key[open + 1..close].to_string();
        slots_of_tag
            .entry(tag)
            .or_default()
            .insert(cluster.slot(key));
    }
    // One slot per tag, and the tag is the entity (the same slot as the bare `{tag}`).
    for (tag, slots) in &slots_of_tag {
        assert_eq!(slots.len(), 1, "{{{tag}}}'s keys span slots {slots:?}");
        assert_eq!(slots.first(), Some(&cluster.slot(&format!("{{{tag}}}"))));
    }
    let tags: Vec<&str> = slots_of_tag.keys().map(String::as_str).collect();
    assert_eq!(
        tags,
        [
            "coupon_claim",
            "did:dev-12345678",
            "ip:203.0.113.7",
            "net:203.0.113.0%2F24",
            "uid:10086",
        ],
        "keys: {keys:#?}"
    );
    // The records and the user's trust sit with the user's windows.
    let user = cluster.slot("lt:coupon_claim:{uid:10086}");
    assert_eq!(cluster.slot(&plan.records_key), user);
    assert_eq!(cluster.slot(trust.points_key.as_deref().unwrap()), user);
    // Records of the whole scene (a scene requiring no entity) keep their generations
    // in one slot.
    assert_eq!(
        cluster.slot("lt:{coupon_claim}:rq:all"),
        cluster.slot("lt:{coupon_claim}:rq:all:1234")
    );
}

/// The harness itself: three masters, each with a replica; a manual failover promotes the
/// replica and the cluster is whole again.
#[test]
fn the_local_cluster_has_three_masters_and_fails_over_on_demand() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.masters().len(), 3);
    let mut conn = cluster.conn();
    let _: () = redis::cmd("SET")
        .arg("{uid:1}:x")
        .arg("1")
        .query(&mut conn)
        .expect("SET on the cluster");
    let master = cluster.master_of("{uid:1}:x");
    let replica = cluster.replica_of(master);
    cluster.manual_failover(replica);
    assert_eq!(cluster.master_of("{uid:1}:x"), replica);
    assert_eq!(cluster.masters().len(), 3);
    let v: String = redis::cmd("GET")
        .arg("{uid:1}:x")
        .query(&mut cluster.conn())
        .expect("GET after the failover");
    assert_eq!(v, "1");
}
