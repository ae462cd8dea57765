//! A refund says which limits gave the request back. One naming a wrong device finds the
//! request's record (kept with the user) and gives back the user's and the address's limits,
//! not the device's, whose key the request never counted in: the answer lists the device's
//! limit as holding nothing, where it once said `refunded: true` and nothing else. The right
//! device then gives back what is left. On every store.

use serde_json::{json, Value};
use vigia::config::StoreBackend;

use crate::cluster::Node;
use crate::common::{limit, scene, RedisCluster, RedisServer};

fn rules() -> String {
    scene(&format!(
        "{}{}{}",
        limit(
            "user_10s",
            "\"user\"",
            "sliding_window",
            "10s",
            2,
            "business"
        ),
        limit(
            "device_1d",
            "\"device\"",
            "sliding_window",
            "1d",
            5,
            "security"
        ),
        limit("ip_1m", "\"ip\"", "fixed_window", "1m", 100, "business"),
    ))
}

fn check(request_id: &str) -> Value {
    json!({"scene": "s", "request_id": request_id, "user_id": "u",
           "device_id": "device-0001", "ip": "192.0.2.10"})
}

fn refund(device: &str) -> Value {
    json!({"scene": "s", "request_id": "r1", "user_id": "u",
           "device_id": device, "ip": "192.0.2.10"})
}

async fn a_refund_lists_what_it_gave_back(node: &Node) {
    let (status, b) = node.check(&check("r1")).await;
    assert_eq!((status, &b["decision"]), (200, &json!("allow")), "{b}");

    let (status, wrong) = node.post("/v1/refund", &refund("device-9999")).await;
    assert_eq!(status, 200, "{wrong}");
    assert_eq!(
        wrong,
        json!({"refunded": true, "given_back": ["user_10s", "ip_1m"], "held_nothing": ["device_1d"]})
    );

    let (status, right) = node.post("/v1/refund", &refund("device-0001")).await;
    assert_eq!(status, 200, "{right}");
    assert_eq!(
        right,
        json!({"refunded": true, "given_back": ["device_1d"], "held_nothing": ["user_10s", "ip_1m"]})
    );

    let (_, again) = node.post("/v1/refund", &refund("device-0001")).await;
    assert_eq!(
        again,
        json!({"refunded": false, "given_back": [], "held_nothing": ["user_10s", "device_1d", "ip_1m"]})
    );

    // r1 weighs on no limit any more: the next check is the only one counted.
    let (status, b) = node.check(&check("r2")).await;
    assert_eq!(status, 200, "{b}");
    let counts: Vec<&Value> = b["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .map(|l| &l["count"])
        .collect();
    assert_eq!(counts, [&json!(1), &json!(1), &json!(1)], "{b}");
}

#[actix_web::test]
async fn on_embedded_a_refund_naming_a_wrong_device_lists_the_device_limit_as_holding_nothing() {
    let node = Node::start_on(StoreBackend::Embedded, "", &rules(), 1_000)
        .await
        .expect("vigia starts");
    a_refund_lists_what_it_gave_back(&node).await;
}

#[actix_web::test]
async fn on_redis_a_refund_naming_a_wrong_device_lists_the_device_limit_as_holding_nothing() {
    let redis = RedisServer::start();
    let node = Node::start_on(StoreBackend::Redis, &redis.url(), &rules(), 1_000)
        .await
        .expect("vigia starts");
    a_refund_lists_what_it_gave_back(&node).await;
}

#[actix_web::test]
async fn on_a_cluster_a_refund_naming_a_wrong_device_lists_the_device_limit_as_holding_nothing() {
    let cluster = RedisCluster::start();
    let node = Node::start(&cluster, &rules())
        .await
        .expect("vigia starts on the cluster");
    a_refund_lists_what_it_gave_back(&node).await;
}
