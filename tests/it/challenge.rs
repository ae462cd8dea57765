//! The grey zone end to end over HTTP: a claim whose score is in the challenge band is
//! answered 403 `challenge` and consumes nothing; the backend reports `challenge_passed`
//! on one node and the claim, sent again to another, is allowed; strong evidence (a score
//! at the line, a forged device id) silently denies whatever was passed. The same on two
//! nodes over one Redis, two nodes over a Redis Cluster, and one node on the embedded store.
//! Bad pass events are refused naming the field.

use chrono::{Duration as Age, Utc};
use serde_json::{json, Value};
use vigia::config::StoreBackend;

use crate::cluster::Node;
use crate::common::{spawn_app_configured, RedisCluster, RedisServer};

const RULES: &str = include_str!("../fixtures/challenge/rules.toml");

/// A claim of `user`, created `age_days` ago, on `device`, under `key`.
fn claim(user: &str, age_days: i64, device: &str, key: &str) -> Value {
    json!({"scene": "claim", "user_id": user, "device_id": device, "ip": "198.51.100.7",
           "idempotency_key": key,
           "user_created_at": (Utc::now() - Age::days(age_days)).to_rfc3339()})
}

fn pass(event_id: &str, user: &str, device: Option<&str>) -> Value {
    let mut e = json!({"event_id": event_id, "type": "challenge_passed", "user_id": user,
                       "scene": "claim", "occurred_at": Utc::now().to_rfc3339()});
    if let Some(d) = device {
        e["device_id"] = json!(d);
    }
    e
}

/// What the grey zone looks like through two nodes (`a` and `b` may be one node).
async fn challenge_then_pass_then_allow(a: &Node, b: &Node) {
    // A brand-new account: the grey zone.
    let (status, body) = a.check(&claim("newbie", 0, "phone-0001", "k1")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["decision"], "challenge", "{body}");
    assert_eq!(body["layer"], "security");
    assert_eq!(body["reason"], "score");
    assert_eq!(body["score"], 0.5);
    assert_eq!(
        body["challenge"],
        json!({"kind": "captcha", "message": "Confirma que eres tú"})
    );
    assert_eq!(body["limits"][0]["count"], 0, "nothing consumed: {body}");
    // Sent again under the same key, on the other node: decided anew, not a repeat.
    let (status, again) = b.check(&claim("newbie", 0, "phone-0001", "k1")).await;
    assert_eq!(
        (status, &again["duplicate_of"]),
        (403, &Value::Null),
        "{again}"
    );

    // The backend verified the person and reports it to the other node.
    let (status, taken) = b
        .post("/v1/events", &pass("pass-1", "newbie", Some("phone-0001")))
        .await;
    assert_eq!((status, &taken["accepted"]), (202, &json!(1)), "{taken}");
    // Sent twice (each node journals its own; the ledger records a pass once).
    let (_, twice) = b
        .post("/v1/events", &pass("pass-1", "newbie", Some("phone-0001")))
        .await;
    assert_eq!(twice["duplicates"], 1, "{twice}");

    let (status, allowed) = a.check(&claim("newbie", 0, "phone-0001", "k1")).await;
    assert_eq!(status, 200, "{allowed}");
    assert_eq!(allowed["decision"], "allow", "{allowed}");
    assert_eq!(
        allowed["score"], 0.5,
        "the score is what it was; the pass lifts the band"
    );
    assert_eq!(allowed["limits"][0]["count"], 1, "{allowed}");
    let (_, repeat) = b.check(&claim("newbie", 0, "phone-0001", "k1")).await;
    assert_eq!(repeat["duplicate_of"], allowed["request_id"], "{repeat}");

    // A pass for one phone: on another device the same user is asked again.
    let (status, _) = a
        .post("/v1/events", &pass("pass-m", "mover", Some("phone-0003")))
        .await;
    assert_eq!(status, 202);
    let (status, elsewhere) = b.check(&claim("mover", 0, "laptop-0001", "m1")).await;
    assert_eq!(status, 403, "{elsewhere}");

    // A second claim (a new key) sent while still challenged is what a script does: a
    // backend waits for its user's pass. Strong evidence: silently denied.
    let (status, _) = a.check(&claim("scripty", 0, "phone-0004", "s1")).await;
    assert_eq!(status, 403);
    let (status, scripted) = b.check(&claim("scripty", 0, "phone-0004", "s2")).await;
    assert_eq!(status, 200, "{scripted}");
    assert_eq!(
        (&scripted["decision"], &scripted["score"]),
        (&json!("silent_deny"), &json!(0.8)),
        "{scripted}"
    );

    // Strong evidence: two established accounts on a shared phone, then a third account,
    // new, that passed a challenge for it: 0.5 + 0.3 reaches the line, a silent deny.
    for (i, node) in [a, b].into_iter().enumerate() {
        let (status, ok) = node
            .check(&claim(
                &format!("old{i}"),
                400,
                "shared-0001",
                &format!("o{i}"),
            ))
            .await;
        assert_eq!((status, &ok["decision"]), (200, &json!("allow")), "{ok}");
    }
    let (status, _) = a
        .post("/v1/events", &pass("pass-2", "third", Some("shared-0001")))
        .await;
    assert_eq!(status, 202);
    let (status, strong) = b.check(&claim("third", 0, "shared-0001", "t1")).await;
    assert_eq!(status, 200, "looks like success: {strong}");
    assert_eq!(
        (&strong["decision"], &strong["reason"], &strong["score"]),
        (&json!("silent_deny"), &json!("score"), &json!(0.8)),
        "{strong}"
    );
    // A forged device id is a silent deny whatever the user passed (on any device).
    let (status, _) = b.post("/v1/events", &pass("pass-3", "newbie", None)).await;
    assert_eq!(status, 202);
    let (status, forged) = a.check(&claim("newbie", 0, "bad id!", "f1")).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&forged["decision"], &forged["reason"]),
        (&json!("silent_deny"), &json!("invalid_device_id")),
        "{forged}"
    );
}

#[actix_web::test]
async fn a_pass_reported_to_one_node_lets_the_claim_through_another_on_one_redis() {
    let redis = RedisServer::start();
    let a = Node::start_on(StoreBackend::Redis, &redis.url(), RULES, 1_000)
        .await
        .expect("node a");
    let b = Node::start_on(StoreBackend::Redis, &redis.url(), RULES, 1_000)
        .await
        .expect("node b");
    challenge_then_pass_then_allow(&a, &b).await;
}

#[actix_web::test]
async fn a_pass_reported_to_one_node_lets_the_claim_through_another_on_a_cluster() {
    let cluster = RedisCluster::start();
    let a = Node::start_on(StoreBackend::RedisCluster, &cluster.urls(), RULES, 1_000)
        .await
        .expect("node a");
    let b = Node::start_on(StoreBackend::RedisCluster, &cluster.urls(), RULES, 1_000)
        .await
        .expect("node b");
    challenge_then_pass_then_allow(&a, &b).await;
}

#[actix_web::test]
async fn a_pass_lets_the_claim_through_on_the_embedded_store() {
    let node = Node::start_on(StoreBackend::Embedded, "", RULES, 1_000)
        .await
        .expect("node");
    challenge_then_pass_then_allow(&node, &node).await;
    // Seen: challenges issued by scene and reason, passes reported by scene (a duplicate
    // event is not a second pass).
    let issued = r#"vigia_decisions_total{decision="challenge",layer="security",reason="score",scene="claim"}"#;
    assert_eq!(node.counter(issued).await, 4);
    assert_eq!(
        node.counter(r#"vigia_challenge_passes_total{scene="claim"}"#)
            .await,
        4
    );
}

#[actix_web::test]
async fn a_pass_older_than_its_ttl_lifts_nothing() {
    let node = Node::start_on(StoreBackend::Embedded, "", RULES, 1_000)
        .await
        .expect("node");
    let mut stale = pass("old-pass", "late", Some("phone-0002"));
    stale["occurred_at"] = json!((Utc::now() - Age::minutes(31)).to_rfc3339());
    let (status, taken) = node.post("/v1/events", &stale).await;
    assert_eq!((status, &taken["accepted"]), (202, &json!(1)), "{taken}");
    let (status, body) = node.check(&claim("late", 0, "phone-0002", "l1")).await;
    assert_eq!(status, 403, "a pass past pass_ttl (30m): {body}");
    let mut fresh = pass("new-pass", "late", Some("phone-0002"));
    fresh["occurred_at"] = json!((Utc::now() - Age::minutes(29)).to_rfc3339());
    node.post("/v1/events", &fresh).await;
    let (status, body) = node.check(&claim("late", 0, "phone-0002", "l1")).await;
    assert_eq!(status, 200, "a pass within pass_ttl: {body}");
}

#[actix_web::test]
async fn a_bad_pass_is_refused_naming_the_field_and_needs_the_admin_token() {
    let app = spawn_app_configured(RedisServer::start(), &[("c.toml", RULES)], |c| {
        c.store.backend = StoreBackend::Embedded;
        c.auth.admin_token = "admin-secret".into();
    })
    .await;
    let send = |body: Value, token: Option<&'static str>| {
        let mut req = app
            .client
            .post(format!("{}/v1/events", app.base))
            .json(&body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let resp = req.send().await.expect("request reaches vigia");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.expect("JSON answer"))
        }
    };
    let token = Some("admin-secret");
    let (status, _) = send(pass("p0", "u1", None), None).await;
    assert_eq!(status, 401, "no admin token");

    let mut cases: Vec<(Value, &str)> = Vec::new();
    let mut no_user = pass("p1", "u1", None);
    no_user.as_object_mut().expect("object").remove("user_id");
    cases.push((no_user, "user_id"));
    let mut unknown = pass("p2", "u1", None);
    unknown["scene"] = json!("lottery");
    cases.push((unknown, "scene"));
    let mut never = pass("p3", "u1", None);
    never["scene"] = json!("plain");
    cases.push((never, "scene"));
    cases.push((pass("p4", "u1", Some("bad id!")), "device_id"));
    let mut batch = json!({"events": [pass("p5", "u1", None), pass("p6", "u1", Some("x"))]});
    batch["events"][1]["device_id"] = json!("no");
    cases.push((batch, "events[1].device_id"));
    for (body, field) in cases {
        let (status, answer) = send(body.clone(), token).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    // Nothing of the refused batch was taken: p5 is new.
    let (status, taken) = send(pass("p5", "u1", None), token).await;
    assert_eq!((status, &taken["accepted"]), (202, &json!(1)), "{taken}");
    // The pass shows in the user's trust, named by its scene.
    let trust: Value = app
        .client
        .get(format!("{}/v1/trust/u1", app.base))
        .bearer_auth("admin-secret")
        .send()
        .await
        .expect("trust")
        .json()
        .await
        .expect("JSON");
    assert_eq!(trust["awards"][0]["type"], "challenge_passed", "{trust}");
    assert_eq!(trust["awards"][0]["event_id"], "p5", "{trust}");
    assert_eq!(trust["awards"][0]["scene"], "claim", "{trust}");
    assert_eq!(
        trust["points"], 0,
        "a pass earns no points unless [trust] says so"
    );
}
