//! The real binary on one Redis that stalls (SIGSTOP) under load: a check answered without
//! the store (503 under `fail_close`, decided by the node under `local`) is never counted
//! on Redis afterwards. Its script, sent before the node gave up on it, runs when Redis
//! wakes; what it recorded is given back by request id once Redis has answered it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{free_port, RedisServer};
use crate::durability::Vigia;

const SCENES: [&str; 3] = ["quick", "judged", "local"];
/// Concurrent clients: enough that several calls are in flight when Redis stops.
const CLIENTS: usize = 8;

/// One answered check.
#[derive(Debug)]
struct Answer {
    scene: &'static str,
    request_id: String,
    status: u16,
    body: Value,
}

impl Answer {
    fn degraded(&self) -> bool {
        self.body["degraded"] == json!(true)
    }

    /// Allowed by Redis (not by the node's own store).
    fn counted(&self) -> bool {
        self.status == 200 && !self.degraded() && self.body["decision"] == "allow"
    }
}

/// Checks from `CLIENTS` clients, each its own users and device, round the three scenes,
/// until `stop`; every answer kept.
async fn load(base: String, stop: Arc<AtomicBool>, answered: Arc<AtomicUsize>) -> Vec<Answer> {
    let clients = (0..CLIENTS).map(|c| {
        let (base, stop, answered) = (base.clone(), stop.clone(), answered.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut answers = Vec::new();
            let mut n = 0usize;
            while !stop.load(Ordering::Acquire) {
                let scene = SCENES[n % SCENES.len()];
                let request_id = format!("{scene}-{c}-{n}");
                let body = json!({
                    "scene": scene, "request_id": request_id,
                    "user_id": format!("user-{c}-{}", n % 7), "device_id": format!("device-{c}"),
                });
                let r = http
                    .post(format!("{base}/v1/check"))
                    .json(&body)
                    .send()
                    .await
                    .expect("check sent");
                let status = r.status().as_u16();
                let body: Value = r.json().await.expect("check answer is JSON");
                answers.push(Answer {
                    scene,
                    request_id,
                    status,
                    body,
                });
                answered.fetch_add(1, Ordering::AcqRel);
                n += 1;
            }
            answers
        })
    });
    let mut all = Vec::new();
    for client in clients.collect::<Vec<_>>() {
        all.extend(client.await.expect("client task"));
    }
    all
}

/// Waits until `answered` has grown by `more` (the load runs on meanwhile).
async fn until_answered(answered: &AtomicUsize, more: usize) {
    let target = answered.load(Ordering::Acquire) + more;
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.load(Ordering::Acquire) < target {
        assert!(Instant::now() < deadline, "the load stopped being answered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One metric's value in /metrics (0 when absent).
async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Every sorted-set member and every hash field on the Redis: the request ids in windows
/// and in request records, and each fixed window's count by key.
struct Held {
    ids: BTreeSet<String>,
    /// Each fixed window's (start ms, count) by key.
    fixed: BTreeMap<String, (u64, i64)>,
}

fn held(redis: &RedisServer) -> Held {
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
    let mut held = Held {
        ids: BTreeSet::new(),
        fixed: BTreeMap::new(),
    };
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).expect("TYPE");
        match kind.as_str() {
            "zset" => {
                let members: Vec<String> = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query(&mut conn)
                    .expect("ZRANGE");
                held.ids.extend(members);
            }
            "hash" => {
                let fields: BTreeMap<String, String> = redis::cmd("HGETALL")
                    .arg(&key)
                    .query(&mut conn)
                    .expect("HGETALL");
                if let (Some(s), Some(c)) = (fields.get("s"), fields.get("c")) {
                    let window = (
                        s.parse().expect("a fixed window's start"),
                        c.parse().expect("a fixed window's count"),
                    );
                    held.fixed.insert(key.clone(), window);
                } else {
                    held.ids.extend(fields.into_keys());
                }
            }
            _ => {}
        }
    }
    held
}

/// Redis's clock, ms (the scripts count on it).
fn redis_now_ms(redis: &RedisServer) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut redis.conn()).expect("TIME");
    s * 1000 + us / 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_check_refused_while_redis_stalls_is_never_counted() {
    let redis = &mut RedisServer::start();
    let data = tempfile::tempdir().expect("data dir");
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stall");
    let url = redis.url();
    let vigia = Vigia::start_with_env(
        free_port(),
        data.path(),
        Some(std::path::Path::new(rules)),
        &[("VIGIA_STORE", "redis"), ("VIGIA_REDIS_URL", &url)],
    )
    .await;

    let started_ms = redis_now_ms(redis);
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let running = tokio::spawn(load(vigia.base.clone(), stop.clone(), answered.clone()));
    until_answered(&answered, 300).await;
    // Calls in flight when Redis stops time out (50 ms, the shipped config) and are
    // answered without it; Redis runs them when it goes on.
    redis.pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.resume();
    until_answered(&answered, 300).await;
    stop.store(true, Ordering::Release);
    let answers = running.await.expect("load");

    // Every answer is out, so every release is queued: wait until they have run.
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&vigia.base, "vigia_store_releases_pending").await > 0.0 {
        assert!(
            Instant::now() < deadline,
            "releases still pending after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let held = held(redis);
    for scene in SCENES {
        let of_scene: Vec<&Answer> = answers.iter().filter(|a| a.scene == scene).collect();
        let refused: Vec<&Answer> = of_scene.iter().copied().filter(|a| a.degraded()).collect();
        assert!(
            !refused.is_empty(),
            "{scene}: no check was answered without Redis; the stall proved nothing"
        );
        if scene != "local" {
            assert!(
                refused.iter().all(|a| a.status == 503),
                "{scene}: fail_close answers 503 without Redis"
            );
        }
        let counted_late: Vec<&str> = refused
            .iter()
            .map(|a| a.request_id.as_str())
            .filter(|id| held.ids.contains(*id))
            .collect();
        assert!(
            counted_late.is_empty(),
            "{scene}: {} of {} checks answered without Redis are counted on it: {counted_late:?}",
            counted_late.len(),
            refused.len()
        );
        // What Redis allowed is all it holds: each allowed id in the windows, and the
        // scene's fixed window counts exactly those.
        let allowed: Vec<&Answer> = of_scene.iter().copied().filter(|a| a.counted()).collect();
        assert!(!allowed.is_empty(), "{scene}: nothing was allowed by Redis");
        for a in &allowed {
            assert!(
                held.ids.contains(&a.request_id),
                "{scene}: allowed {} is missing from the windows",
                a.request_id
            );
        }
        let fixed_key = allowed[0].body["limits"]
            .as_array()
            .and_then(|ls| ls.iter().find(|l| l["name"] == "all_1h"))
            .and_then(|l| l["key"].as_str())
            .expect("an allow names its fixed window's key")
            .to_string();
        let (start, count) = held.fixed[&fixed_key];
        // (A window that began during the run holds only its tail: at most what was allowed.)
        if start <= started_ms {
            assert_eq!(
                count,
                allowed.len() as i64,
                "{scene}: the scene's fixed window counts what was allowed, no more"
            );
        } else {
            assert!(count <= allowed.len() as i64, "{scene}: {count} counted");
        }
    }
    assert!(
        metric(
            &vigia.base,
            "vigia_store_releases_total{result=\"released\"}"
        )
        .await
            > 0.0,
        "no late call was released: the stall proved nothing"
    );
}
