//! Copies of one check on Redis Cluster: the same request id, or the same idempotency key,
//! sent again while the first attempt's reservations are not yet settled. One Redis decides
//! a check in one script, so a copy sees either nothing (the first was denied) or a counted
//! request (allowed). On a cluster the first attempt's groups reserve before the node
//! decides; a copy that finds such a reservation must neither pass as a repeat of an allow
//! (it may yet be denied) nor count as a new request: it is answered 429 `in_flight`, and
//! once the first attempt is settled (released, or committed) a copy is a new check or a
//! repeat of the allow, as on one Redis.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::{Node, LIMITS};
use crate::common::RedisCluster;

/// A claim on `device` by `user` under request id `id`.
fn claim(id: &str, user: &str, device: &str) -> Value {
    json!({
        "scene": "s", "request_id": id, "user_id": user, "device_id": device,
        "ip": "192.0.2.77",
    })
}

/// Sends `body` until it is no longer answered `in_flight` (its first attempt settled), at
/// most 10 s; the last answer.
async fn once_settled(node: &Node, body: &Value) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, answer) = node.check(body).await;
        if answer["reason"] != "in_flight" {
            return (status, answer);
        }
        assert!(
            Instant::now() < deadline,
            "still in flight 10 s on: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every answer is an allow that names `of` as its first, or a 429 `in_flight` with
/// `Retry-After`-worthy wait; how many of each.
fn repeats_and_held(answers: &[(u16, Value)], of: &str) -> (usize, usize) {
    let (mut repeats, mut held) = (0, 0);
    for (status, body) in answers {
        match (status, body["decision"].as_str(), body["reason"].as_str()) {
            (200, Some("allow"), _) if body["duplicate_of"] == of => repeats += 1,
            (429, Some("friendly_deny"), Some("in_flight")) => {
                assert_eq!(body["retry_after_ms"], 1000, "{body}");
                held += 1;
            }
            other => panic!("a copy answered {other:?}: {body}"),
        }
    }
    (repeats, held)
}

/// A device whose 10 are taken: 64 copies of one claim sent at once through three nodes
/// are never allowed — each is the device's silent deny or `in_flight` — and once the
/// first attempt is released, the claim sent again is a new check, denied again.
#[actix_web::test]
async fn copies_of_a_denied_check_are_never_allowed() {
    let cluster = RedisCluster::start();
    let nodes = Node::three(&cluster, LIMITS).await;
    let mut allowed = 0;
    for i in 0..12 {
        let (_, body) = nodes[0]
            .check(&claim(&format!("fill{i}"), &format!("f{}", i % 4), "full"))
            .await;
        allowed += usize::from(body["decision"] == "allow");
    }
    assert_eq!(allowed, 10, "the device's 10 are taken");

    let copy = claim("same", "fresh", "full");
    let answers = futures::future::join_all((0..64).map(|i| nodes[i % 3].check(&copy))).await;
    let mut denied = 0;
    for (status, body) in &answers {
        match (status, body["decision"].as_str(), body["reason"].as_str()) {
            (200, Some("silent_deny"), Some("device_1m")) => denied += 1,
            (429, Some("friendly_deny"), Some("in_flight")) => {}
            other => panic!("a copy of a denied check answered {other:?}: {body}"),
        }
    }
    assert!(denied >= 1, "the first attempt is the device's deny");

    let (_, again) = once_settled(&nodes[1], &copy).await;
    assert_eq!(again["decision"], "silent_deny", "{again}");
    assert_eq!(again["duplicate_of"], Value::Null, "{again}");
}

/// A device with room: 64 copies of one claim at once count it at most once; every copy is
/// the allow itself, a repeat of it, or `in_flight`; once settled, the claim is counted
/// exactly once (the device's window holds 1) and a copy is a repeat of the allow.
#[actix_web::test]
async fn copies_of_an_allowed_check_count_once_and_repeat_the_allow_once_committed() {
    let cluster = RedisCluster::start();
    let nodes = Node::three(&cluster, LIMITS).await;
    let copy = claim("first", "u1", "roomy");
    let answers = futures::future::join_all((0..64).map(|i| nodes[i % 3].check(&copy))).await;
    let fresh = answers
        .iter()
        .filter(|(s, b)| *s == 200 && b["decision"] == "allow" && b["duplicate_of"].is_null())
        .count();
    let rest: Vec<(u16, Value)> = answers
        .into_iter()
        .filter(|(s, b)| !(*s == 200 && b["decision"] == "allow" && b["duplicate_of"].is_null()))
        .collect();
    let (repeats, held) = repeats_and_held(&rest, "first");
    assert!(fresh <= 1, "{fresh} copies were counted as new allows");
    eprintln!("64 copies of an allow: {fresh} allowed, {repeats} repeats, {held} in flight");

    // Copies that each found another's reservation may all have been held: then none was
    // counted, and the claim sent again once they settled is new.
    let (_, again) = once_settled(&nodes[2], &copy).await;
    assert_eq!(again["decision"], "allow", "{again}");
    if fresh == 1 {
        assert_eq!(again["duplicate_of"], "first", "{again}");
    } else {
        assert!(again["duplicate_of"].is_null(), "{again}");
    }
    let (_, last) = once_settled(&nodes[0], &copy).await;
    assert_eq!(last["duplicate_of"], "first", "{last}");
    // Counted once: the device window holds one, and the user's window one.
    let mut conn = cluster.conn();
    let device: Option<u64> = redis::cmd("HGET")
        .arg("lt:s:fw:device_1m:{did:roomy}")
        .arg("c")
        .query(&mut conn)
        .expect("HGET the device window");
    assert_eq!(device, Some(1));
    let user: u64 = redis::cmd("ZCARD")
        .arg("lt:s:{uid:u1}")
        .query(&mut conn)
        .expect("ZCARD the user window");
    assert_eq!(user, 1);
}

/// Two checks under two request ids with one idempotency key, at once on two nodes, under
/// the shipped rules (five slot groups each): never each a repeat of the other, never two
/// new allows; once settled, the key names one counted request, or none.
#[actix_web::test]
async fn one_idempotency_key_sent_twice_at_once_is_counted_at_most_once() {
    let cluster = RedisCluster::start();
    let shipped = std::fs::read_to_string("rules/coupon_claim.toml").expect("shipped rule");
    let common = std::fs::read_to_string("rules/common.toml").expect("shipped rule");
    let rules = format!("{common}\n{shipped}");
    let nodes = [
        Node::start(&cluster, &rules).await.expect("vigia starts"),
        Node::start(&cluster, &rules).await.expect("vigia starts"),
    ];
    let (mut held_pairs, mut repeat_pairs) = (0, 0);
    for k in 0..100 {
        let body = |r: &str| {
            json!({
                "scene": "coupon_claim", "request_id": format!("{r}{k}"),
                "idempotency_key": format!("key{k}"), "user_id": format!("u{k}"),
                "device_id": format!("device-{k:06}"), "ip": format!("198.51.100.{}", k + 1),
                "user_created_at": "2020-01-01T00:00:00Z",
            })
        };
        let (x, y) = (body("x"), body("y"));
        let ((_, a), (_, b)) = futures::join!(nodes[0].check(&x), nodes[1].check(&y));
        let new_allow = |v: &Value| v["decision"] == "allow" && v["duplicate_of"].is_null();
        assert!(
            !(new_allow(&a) && new_allow(&b)),
            "both counted under one key: {a} / {b}"
        );
        assert!(
            !(a["duplicate_of"] == format!("y{k}") && b["duplicate_of"] == format!("x{k}")),
            "each a repeat of the other: {a} / {b}"
        );
        held_pairs += usize::from(a["reason"] == "in_flight" || b["reason"] == "in_flight");
        repeat_pairs += usize::from(!a["duplicate_of"].is_null() || !b["duplicate_of"].is_null());

        // Settled, a third copy under the key is a repeat of whichever was allowed, or (when
        // neither was) a new check.
        let (_, c) = once_settled(&nodes[0], &body("z")).await;
        let first = [(&a, "x"), (&b, "y")]
            .into_iter()
            .find(|(v, _)| new_allow(v))
            .map(|(_, r)| format!("{r}{k}"));
        match first {
            Some(of) => assert_eq!(c["duplicate_of"], of, "{a} / {b} / {c}"),
            None => assert!(c["duplicate_of"].is_null(), "{a} / {b} / {c}"),
        }
    }
    eprintln!(
        "100 pairs under one key: {held_pairs} with a copy in flight, {repeat_pairs} with a repeat"
    );
}
