//! vigia on Redis Cluster: key placement, the local cluster harness, checks decided per
//! slot group by several nodes at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{RedisCluster, RedisServer};
use vigia::check::plan::plan;
use vigia::check::request::parse_check;
use vigia::clock::SystemClock;
use vigia::config::{Config, StoreBackend};
use vigia::keys::KeyPrefix;
use vigia::rules::load_dir;

pub(crate) const LIMITS: &str = include_str!("../fixtures/cluster/limits.toml");

/// One vigia node on a cluster.
pub(crate) struct Node {
    base: String,
    client: reqwest::Client,
    handle: actix_web::dev::ServerHandle,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Node {
    pub(crate) async fn start(cluster: &RedisCluster, rules: &str) -> Result<Node, String> {
        Self::start_with(cluster, rules, 1_000).await
    }

    /// Three nodes on `cluster` with `rules`.
    pub(crate) async fn three(cluster: &RedisCluster, rules: &str) -> Vec<Node> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(
                Node::start(cluster, rules)
                    .await
                    .expect("vigia starts on the cluster"),
            );
        }
        nodes
    }

    /// A node whose store calls time out after `timeout_ms`.
    async fn start_with(
        cluster: &RedisCluster,
        rules: &str,
        timeout_ms: u64,
    ) -> Result<Node, String> {
        Self::start_on(
            StoreBackend::RedisCluster,
            &cluster.urls(),
            rules,
            timeout_ms,
        )
        .await
    }

    /// A node on `backend` at `url` (one Redis, or a cluster's seed nodes; unused for the
    /// embedded store).
    pub(crate) async fn start_on(
        backend: StoreBackend,
        url: &str,
        rules: &str,
        timeout_ms: u64,
    ) -> Result<Node, String> {
        let rules_dir = tempfile::tempdir().expect("rules dir");
        std::fs::write(rules_dir.path().join("rules.toml"), rules).expect("rules file");
        let data_dir = tempfile::tempdir().expect("data dir");
        let mut config = Config {
            listen: "127.0.0.1:0".into(),
            rules_dir: rules_dir.path().to_path_buf(),
            data_dir: data_dir.path().to_path_buf(),
            ..Config::default()
        };
        config.store.backend = backend;
        config.store.redis_url = url.to_string();
        config.store.timeout_ms = timeout_ms;
        let running = vigia::app::start(&config, Some(2), Arc::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        let handle = running.handle.clone();
        actix_web::rt::spawn(running.server);
        Ok(Node {
            base: format!("http://{}", running.addr),
            // Idle connections are dropped before the server's keep-alive (5 s) could close
            // one under a request: the failover tests wait seconds between checks.
            client: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(1))
                .build()
                .expect("HTTP client"),
            handle,
            _dirs: (rules_dir, data_dir),
        })
    }

    pub(crate) async fn check(&self, body: &Value) -> (u16, Value) {
        self.post("/v1/check", body).await
    }

    /// POSTs `body` to `path`: (status, JSON answer).
    pub(crate) async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("request reaches vigia");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("JSON answer"))
    }
}

impl Node {
    /// The value of one counter series in `/metrics` (0 when absent).
    pub(crate) async fn counter(&self, series: &str) -> u64 {
        let text = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0)
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

/// 256 claims at once, spread over `nodes`: how many were allowed. Every answer is an
/// allow or a deny (the device limit is a security one: its denies are silent, 200).
async fn burst(nodes: &[Node]) -> u64 {
    let bodies: Vec<Value> = (0..256).map(claim).collect();
    let answers = futures::future::join_all(
        bodies
            .iter()
            .enumerate()
            .map(|(i, b)| nodes[i % nodes.len()].check(b)),
    )
    .await;
    let mut admitted = 0;
    for (status, body) in &answers {
        match (status, body["decision"].as_str()) {
            (200, Some("allow")) => admitted += 1,
            (200, Some("silent_deny")) | (429, Some("friendly_deny")) => {}
            other => panic!("a check answered {other:?}: {body}"),
        }
    }
    admitted
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
    burst_admits_exactly_the_limit(LIMITS).await;
}

/// The same with [trust], signals, a score and an address override in the scene:
/// decide.lua per slot group, the address's group in a second round (it needs the user's
/// points), its bucket held to the override's max.
#[actix_web::test]
async fn with_trust_and_signals_three_nodes_on_a_cluster_never_admit_past_a_limit() {
    burst_admits_exactly_the_limit(include_str!("../fixtures/cluster/judged.toml")).await;
}

async fn burst_admits_exactly_the_limit(rules: &str) {
    let cluster = RedisCluster::start();
    let nodes = Node::three(&cluster, rules).await;
    let admitted = burst(&nodes).await;
    assert!(admitted <= 10, "{admitted} admitted past the device's 10");

    // The denied checks' reservations go back off the answers' path: wait (bounded) until
    // the cluster holds what was admitted and nothing else, and every denied check's hold
    // has been given back (each held the address's bucket at least: it has room for all).
    let burst_done = Instant::now();
    let deadline = burst_done + Duration::from_secs(10);
    loop {
        let (device, users) = held(&cluster);
        let mut released = 0;
        for node in &nodes {
            released += node
                .counter("vigia_store_releases_total{result=\"released\"}")
                .await;
            assert_eq!(
                node.counter("vigia_store_releases_total{result=\"dropped\"}")
                    .await,
                0
            );
        }
        if device == admitted && users == admitted && released >= 256 - admitted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "10 s after the burst the cluster holds device {device}, users {users}, \
             {released} releases done; admitted {admitted}"
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

/// The shipped rules on three nodes sharing a cluster: a farm rotating accounts on one
/// device across the nodes is scored as one (the device's signals live in its slot, not
/// on a node); a payment posted to one node raises the user's limit on another; a refund
/// sent to a third gives back what the first counted.
#[actix_web::test]
async fn three_nodes_on_a_cluster_share_signals_trust_and_refunds_under_the_shipped_rules() {
    let cluster = RedisCluster::start();
    let shipped = std::fs::read_to_string("rules/coupon_claim.toml").expect("shipped rule");
    let common = std::fs::read_to_string("rules/common.toml").expect("shipped rule");
    let rules = format!("{common}\n{shipped}");
    let nodes = Node::three(&cluster, &rules).await;
    let old = "2020-01-01T00:00:00Z";

    // The farm: four accounts in turn on one device, each through another node.
    let mut decisions = Vec::new();
    for u in 0..4 {
        let (status, body) = nodes[u % 3]
            .check(&json!({
                "scene": "coupon_claim", "request_id": format!("farm-{u}"),
                "user_id": format!("farm-user-{u}"), "device_id": "farm-device-0001",
                "ip": format!("203.0.113.{}", 10 + u), "user_created_at": old,
            }))
            .await;
        assert_eq!(status, 200, "{body}");
        decisions.push((body["decision"].clone(), body["reason"].clone()));
        if u == 3 {
            let value = |name: &str| {
                body["signals"]
                    .as_array()
                    .and_then(|s| s.iter().find(|s| s["name"] == name))
                    .map(|s| s["value"].clone())
            };
            assert_eq!(value("accounts_per_device"), Some(json!(4)), "{body}");
            assert_eq!(value("account_switches"), Some(json!(3)), "{body}");
        }
    }
    assert_eq!(
        decisions,
        [
            (json!("allow"), Value::Null),
            (json!("allow"), Value::Null),
            (json!("allow"), Value::Null),
            (json!("silent_deny"), json!("score")),
        ]
    );

    // A payment on node 0 is a point on node 1: user_1d allows 3 + 1.
    let resp = nodes[0]
        .client
        .post(format!("{}/v1/events", nodes[0].base))
        .json(&json!({
            "event_id": "pay-1", "type": "payment_succeeded", "user_id": "payer",
            "occurred_at": "2026-12-01T10:00:00Z",
        }))
        .send()
        .await
        .expect("events");
    assert_eq!(resp.status().as_u16(), 202);
    let payer = json!({
        "scene": "coupon_claim", "request_id": "payer-1", "user_id": "payer",
        "device_id": "payer-phone-01", "ip": "198.51.100.7", "user_created_at": old,
    });
    let (status, body) = nodes[1].check(&payer).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["trust"]["points"], 1, "{body}");
    let user_1d = body["limits"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "user_1d"))
        .cloned()
        .unwrap_or_else(|| panic!("user_1d in {body}"));
    assert_eq!(
        (user_1d["max"].clone(), user_1d["count"].clone()),
        (json!(4), json!(1))
    );

    // The payer's next claim within 10 s is user_10s's; refunded on node 2, it is not.
    let again = json!({
        "scene": "coupon_claim", "request_id": "payer-2", "user_id": "payer",
        "device_id": "payer-phone-01", "ip": "198.51.100.7", "user_created_at": old,
    });
    let (status, body) = nodes[0].check(&again).await;
    assert_eq!(
        (status, body["reason"].clone()),
        (429, json!("user_10s")),
        "{body}"
    );
    let resp = nodes[2]
        .client
        .post(format!("{}/v1/refund", nodes[2].base))
        .json(&payer)
        .send()
        .await
        .expect("refund");
    assert_eq!(resp.status().as_u16(), 200);
    let refunded: Value = resp.json().await.expect("refund answer");
    assert_eq!(refunded["refunded"], true, "{refunded}");
    let (status, body) = nodes[0].check(&again).await;
    assert_eq!(
        (status, body["decision"].clone()),
        (200, json!("allow")),
        "{body}"
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

/// A claim of a fresh user (every one allowed while the store answers).
fn fresh(i: usize) -> Value {
    json!({
        "scene": "s", "request_id": format!("f{i}"), "user_id": format!("fresh{i}"),
        "device_id": format!("device-{:04}", i % 997), "ip": format!("198.51.100.{}", i % 250),
    })
}

/// Every master loses its scripts (`SCRIPT FLUSH`, as after a restart or a failover to a
/// replica that never loaded them): the next checks reload them and answer normally.
#[actix_web::test]
async fn a_master_that_lost_its_scripts_is_reloaded_without_an_error_answer() {
    let cluster = RedisCluster::start();
    let node = Node::start(&cluster, LIMITS).await.expect("vigia starts");
    let (_, first) = node.check(&fresh(0)).await;
    assert_eq!(first["decision"], "allow", "{first}");
    for &m in &cluster.masters() {
        cluster.nodes[m].command(&["SCRIPT", "FLUSH"]);
    }
    for i in 1..20 {
        let (status, body) = node.check(&fresh(i)).await;
        assert_eq!(
            (status, body["decision"].as_str()),
            (200, Some("allow")),
            "{body}"
        );
        assert_eq!(body["degraded"], false, "{body}");
    }
}

/// Checks keep flowing from three nodes while a replica takes over from its master on
/// demand (`CLUSTER FAILOVER`): no answer is an error or degraded, and the limits still
/// count exactly on the new master.
#[actix_web::test]
async fn a_manual_failover_under_load_answers_every_check_normally() {
    let cluster = RedisCluster::start();
    let nodes = Node::three(&cluster, LIMITS).await;
    let user_key = "lt:s:{uid:fresh7}";
    let master = cluster.master_of(user_key);
    let replica = cluster.replica_of(master);
    // Batches of 30 checks at once from the three nodes; the failover starts after the
    // third and the load goes on until the replica serves the slot and 200 more passed.
    let mut i = 0;
    let mut after = None;
    loop {
        let bodies: Vec<Value> = (i..i + 30).map(fresh).collect();
        let answers = futures::future::join_all(
            bodies
                .iter()
                .enumerate()
                .map(|(k, b)| nodes[k % 3].check(b)),
        )
        .await;
        for (status, body) in answers {
            assert_eq!(
                (
                    status,
                    body["decision"].as_str(),
                    body["degraded"].as_bool()
                ),
                (200, Some("allow"), Some(false)),
                "during the failover: {body}"
            );
        }
        i += 30;
        if i == 90 {
            cluster.start_failover(replica);
        }
        if after.is_none() && i > 90 && cluster.role(replica) == "master" {
            after = Some(i);
        }
        if after.is_some_and(|a| i >= a + 200) {
            break;
        }
        assert!(i < 30_000, "the replica was not promoted");
    }
    assert_eq!(cluster.master_of(user_key), replica);
    // The user's window moved with its slot: fresh7 already counted once.
    let mut allowed = 0;
    for k in 0..5 {
        let mut b = fresh(7);
        b["request_id"] = json!(format!("again{k}"));
        b["device_id"] = json!(format!("device-x{k:04}"));
        let (_, body) = nodes[k % 3].check(&b).await;
        if body["decision"] == "allow" {
            allowed += 1;
        }
    }
    assert_eq!(
        allowed, 2,
        "user_1m allows 3 a minute; one was counted before"
    );
}

/// A master is killed mid-load: checks on its slots answer by the scene's policy
/// (`fail_close`: 503, degraded) until its replica is promoted, then normally again —
/// within the cluster's failover plus one timeout and the breaker's interval — without
/// restarting vigia, and the limits count exactly afterwards.
#[actix_web::test]
async fn a_killed_master_costs_its_failover_and_then_everything_is_normal() {
    let mut cluster = RedisCluster::start();
    let node = Node::start(&cluster, LIMITS).await.expect("vigia starts");
    // Users whose keys live on the master that dies, and on the others.
    let victim_key = "lt:s:{uid:fresh1}";
    let victim = cluster.master_of(victim_key);
    let replica = cluster.replica_of(victim);
    let (_, body) = node.check(&fresh(1)).await;
    assert_eq!(body["decision"], "allow", "{body}");

    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let mut degraded = 0;
    let mut i = 1000;
    let deadline = killed + Duration::from_secs(30);
    // Checks of users on the dead master's slots until they are answered normally again.
    let recovered = loop {
        assert!(
            Instant::now() < deadline,
            "no normal answer 30 s after the kill"
        );
        let mut b = fresh(i);
        b["user_id"] = json!("fresh1");
        b["request_id"] = json!(format!("k{i}"));
        i += 1;
        let started = Instant::now();
        let (status, body) = node.check(&b).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1_000 + 1_500),
            "a check took {took:?}: one timeout (1 s) is the most a check may wait"
        );
        match (status, body["degraded"].as_bool()) {
            (503, Some(true)) => {
                assert_eq!(body["reason"], "store_unavailable", "{body}");
                degraded += 1;
            }
            (200, Some(false)) => break killed.elapsed(),
            other => panic!("after the kill a check answered {other:?}: {body}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let promoted = {
        // The replica is the master now (the harness waits for the cluster to agree).
        cluster.wait_healthy(Duration::from_secs(30));
        cluster.master_of(victim_key)
    };
    assert_eq!(promoted, replica);
    eprintln!(
        "killed master: {degraded} degraded answers, normal again {recovered:?} after the kill"
    );
    assert!(
        degraded > 0,
        "the kill was never seen: the test did not test a failover"
    );
    // Counts are exact afterwards: fresh1 had 1 counted before the kill and the answer
    // that came back normal was allowed (2): one more is allowed, then denies.
    let mut b = fresh(1);
    b["request_id"] = json!("after1");
    let (_, body) = node.check(&b).await;
    assert_eq!(body["decision"], "allow", "{body}");
    b["request_id"] = json!("after2");
    let (_, body) = node.check(&b).await;
    assert_eq!(body["decision"], "friendly_deny", "{body}");
    // The dead master comes back as a replica of the new one; nothing changes for checks.
    cluster.nodes[victim].restart();
    cluster.wait_healthy(Duration::from_secs(30));
    b["request_id"] = json!("after3");
    let (status, body) = node.check(&b).await;
    assert_eq!(status, 429, "{body}");
}

/// One slot group times out (its master hangs) while the others reserve: the check is
/// answered by the scene's policy, and what every group reserved goes back — the groups
/// that answered, and the one that ran its script late — so the limits count exactly.
#[actix_web::test]
async fn a_group_that_times_out_is_the_policys_and_gives_back_what_it_reserved() {
    let mut cluster = RedisCluster::start();
    let node = Node::start_with(&cluster, LIMITS, 200)
        .await
        .expect("vigia starts");
    // A user and a device on different masters.
    let user_key = "lt:s:{uid:slow}";
    let hung = cluster.master_of(user_key);
    let device = (0..)
        .map(|d| format!("device-{d:04}"))
        .find(|d| cluster.master_of(&format!("lt:s:fw:device_1m:{{did:{d}}}")) != hung)
        .expect("a device on another master");
    let device_key = format!("lt:s:fw:device_1m:{{did:{device}}}");
    let claim = |id: &str| {
        json!({"scene": "s", "request_id": id, "user_id": "slow", "device_id": device,
               "ip": "203.0.113.9"})
    };
    cluster.nodes[hung].pause();
    let (status, body) = node.check(&claim("t1")).await;
    // Less than cluster-node-timeout: the master is slow, not failed over.
    std::thread::sleep(Duration::from_millis(300));
    cluster.nodes[hung].resume();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["reason"], "store_unavailable", "{body}");
    assert_eq!(body["degraded"], true, "{body}");

    // The device's reservation, and the user's made late, are released.
    let mut conn = cluster.conn();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d: Option<u64> = redis::cmd("HGET")
            .arg(&device_key)
            .arg("c")
            .query(&mut conn)
            .expect("HGET");
        let u: u64 = redis::cmd("ZCARD")
            .arg(user_key)
            .query(&mut conn)
            .expect("ZCARD");
        if d.unwrap_or(0) == 0 && u == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "10 s after the timeout the cluster still holds device {d:?}, user {u}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The same request id is a new check (nothing of it was kept), and the user's 3 a
    // minute are whole.
    let mut allowed = 0;
    for id in ["t1", "t2", "t3", "t4"] {
        let (_, body) = node.check(&claim(id)).await;
        assert!(body["duplicate_of"].is_null(), "{body}");
        if body["decision"] == "allow" {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 3);
}

/// Three nodes on one plain Redis behave as one: the burst of 256 checks in flight admits
/// exactly the device's 10 (one atomic script per check: no reservation to give back), and
/// Redis holds exactly those.
#[actix_web::test]
async fn three_nodes_on_one_redis_admit_exactly_the_limit_under_a_burst() {
    let redis = RedisServer::start();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(
            Node::start_on(StoreBackend::Redis, &redis.url(), LIMITS, 1_000)
                .await
                .expect("vigia starts on Redis"),
        );
    }
    assert_eq!(burst(&nodes).await, 10);
    let mut conn = redis.conn();
    let device: u64 = redis::cmd("HGET")
        .arg("lt:s:fw:device_1m:did:device-0001")
        .arg("c")
        .query(&mut conn)
        .expect("HGET the device window");
    assert_eq!(device, 10);
}
