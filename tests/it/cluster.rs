//! vigia on Redis Cluster: key placement, the local cluster harness, checks decided per
//! slot group by several nodes at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::RedisCluster;
use vigia::check::plan::plan;
use vigia::check::request::parse_check;
use vigia::clock::SystemClock;
use vigia::config::{Config, StoreBackend};
use vigia::keys::KeyPrefix;
use vigia::rules::load_dir;

const LIMITS: &str = include_str!("../fixtures/cluster/limits.toml");

/// One vigia node on a cluster.
struct Node {
    base: String,
    client: reqwest::Client,
    handle: actix_web::dev::ServerHandle,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Node {
    async fn start(cluster: &RedisCluster, rules: &str) -> Result<Node, String> {
        let rules_dir = tempfile::tempdir().expect("rules dir");
        std::fs::write(rules_dir.path().join("rules.toml"), rules).expect("rules file");
        let data_dir = tempfile::tempdir().expect("data dir");
        let mut config = Config {
            listen: "127.0.0.1:0".into(),
            rules_dir: rules_dir.path().to_path_buf(),
            data_dir: data_dir.path().to_path_buf(),
            ..Config::default()
        };
        config.store.backend = StoreBackend::RedisCluster;
        config.store.redis_url = cluster.urls();
        config.store.timeout_ms = 1_000;
        let running = vigia::app::start(&config, Some(2), Arc::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        let handle = running.handle.clone();
        actix_web::rt::spawn(running.server);
        Ok(Node {
            base: format!("http://{}", running.addr),
            client: reqwest::Client::new(),
            handle,
            _dirs: (rules_dir, data_dir),
        })
    }

    async fn check(&self, body: &Value) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}/v1/check", self.base))
            .json(body)
            .send()
            .await
            .expect("request reaches vigia");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("JSON answer"))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

fn claim(i: usize) -> Value {
    json!({
        "scene": "s", "request_id": format!("r{i}"), "user_id": format!("u{}", i % 8),
        "device_id": "device-0001", "ip": "192.0.2.10",
    })
}

/// What the cluster holds of the burst: the device window's count and the members of
/// every user's window.
fn held(cluster: &RedisCluster) -> (u64, u64) {
    let mut conn = cluster.conn();
    let device: Option<u64> = redis::cmd("HGET")
        .arg("lt:s:fw:device_1m:{did:device-0001}")
        .arg("c")
        .query(&mut conn)
        .expect("HGET the device window");
    let users: u64 = (0..8)
        .map(|u| {
            redis::cmd("ZCARD")
                .arg(format!("lt:s:{{uid:u{u}}}"))
                .query::<u64>(&mut conn)
                .expect("ZCARD a user window")
        })
        .sum();
    (device.unwrap_or(0), users)
}

/// Three nodes, 256 checks in flight against limits of 3 per user and 10 per device: never
/// more than 10 admitted; once the denied checks' reservations are released, the cluster
/// holds exactly what was admitted, and checks sent one by one then admit the rest of the
/// device's 10 — what a serial run admits in all.
#[actix_web::test]
async fn three_nodes_on_a_cluster_never_admit_past_a_limit_and_give_back_what_denied_checks_held() {
    let cluster = RedisCluster::start();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(
            Node::start(&cluster, LIMITS)
                .await
                .expect("vigia starts on the cluster"),
        );
    }
    let bodies: Vec<Value> = (0..256).map(claim).collect();
    let answers = futures::future::join_all(
        bodies
            .iter()
            .enumerate()
            .map(|(i, b)| nodes[i % 3].check(b)),
    )
    .await;
    // The device limit is a security one: its denies are silent (200, nothing granted).
    let mut admitted = 0;
    for (status, body) in &answers {
        match (status, body["decision"].as_str()) {
            (200, Some("allow")) => admitted += 1,
            (200, Some("silent_deny")) | (429, Some("friendly_deny")) => {}
            other => panic!("a check answered {other:?}: {body}"),
        }
    }
    assert!(admitted <= 10, "{admitted} admitted past the device's 10");

    // The denied checks' reservations go back off the answers' path: wait (bounded) until
    // the cluster holds what was admitted and nothing else.
    let burst_done = Instant::now();
    let deadline = burst_done + Duration::from_secs(10);
    loop {
        let (device, users) = held(&cluster);
        if device == admitted && users == admitted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "10 s after the burst the cluster holds device {device}, users {users}; admitted {admitted}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    eprintln!(
        "burst: {admitted} of 256 admitted; all released {:?} after the last answer",
        burst_done.elapsed()
    );
    // One by one, the same traffic admits exactly the rest.
    let mut more = 0;
    for i in 256..320 {
        let (_, body) = nodes[i % 3].check(&claim(i)).await;
        if body["decision"] == "allow" {
            more += 1;
        }
    }
    assert_eq!(admitted + more, 10, "burst {admitted} + serial {more}");
    assert_eq!(held(&cluster), (10, 10));
}

/// The shipped rules use signals, a score and [trust], which a cluster does not decide
/// yet: vigia refuses to start rather than answer every check with its store policy.
#[actix_web::test]
async fn rules_a_cluster_cannot_decide_yet_are_refused_at_start_naming_what() {
    let cluster = RedisCluster::start();
    let shipped = std::fs::read_to_string("rules/coupon_claim.toml").expect("shipped rule");
    let common = std::fs::read_to_string("rules/common.toml").expect("shipped rule");
    let err = Node::start(&cluster, &format!("{common}\n{shipped}"))
        .await
        .err()
        .expect("vigia refuses the rules");
    assert!(
        err.contains("redis_cluster") && err.contains("[trust]"),
        "{err}"
    );
}

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
