//! A throwaway Redis Cluster per test: three masters and three replicas on free ports
//! (`redis-server --cluster-enabled yes`, then `redis-cli --cluster create
//! --cluster-replicas 1`), `cluster-node-timeout` 1000 ms so a killed master's replica is
//! promoted within a few seconds; killed on drop. Tests never touch the machine's Redis.

use std::process::Command;
use std::time::{Duration, Instant};

use super::redis_server::RedisServer;

/// How long a node may go unreachable before its replica takes over (ms).
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// A local cluster owned by one test.
pub struct RedisCluster {
    /// Every node, masters and replicas; which is which changes with failovers (see
    /// [`RedisCluster::master_of`]).
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts 3 masters + 3 replicas and waits until every node reports `cluster_state:ok`,
    /// every slot assigned, and every replica in sync with its master. Panics with a clear
    /// message when `redis-server` or `redis-cli` is missing.
    pub fn start() -> RedisCluster {
        let timeout = NODE_TIMEOUT_MS.to_string();
        let nodes: Vec<RedisServer> = cluster_ports(6)
            .into_iter()
            .map(|port| {
                RedisServer::start_with(
                    port,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &timeout,
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run redis-cli ({e}): cluster tests need `redis-cli` on PATH \
                     (Debian: apt-get install redis-tools)"
                )
            });
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// The seed nodes as `VIGIA_REDIS_URL` takes them: `redis://127.0.0.1:P1,redis://…`.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.url())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Each node's URL, for a cluster client.
    pub fn url_list(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// A blocking cluster connection for assertions (follows MOVED/ASK).
    pub fn conn(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClient::new(self.url_list())
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`, asked of a running node).
    pub fn slot(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.any().conn())
            .expect("CLUSTER KEYSLOT")
    }

    /// The index in [`Self::nodes`] of the master serving `key`'s slot now.
    pub fn master_of(&self, key: &str) -> usize {
        let slot = self.slot(key);
        let port = self
            .slot_ranges()
            .into_iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, port)| port)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"));
        self.index_of(port)
    }

    /// The indices of the nodes that are masters now (`ROLE`), running ones only.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running() && self.role(i) == "master")
            .collect()
    }

    /// `master` or `slave`.
    pub fn role(&self, i: usize) -> String {
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query(&mut self.nodes[i].conn())
            .expect("ROLE");
        match role.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("ROLE answered {other:?}"),
        }
    }

    /// `CLUSTER FAILOVER` on replica `i`: it takes over from its master, in coordination
    /// with it (no write is lost). Waits until the cluster is healthy again.
    pub fn manual_failover(&self, replica: usize) {
        self.start_failover(replica);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.role(replica) != "master" {
            assert!(
                Instant::now() < deadline,
                "replica {replica} was not promoted within 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait_healthy(Duration::from_secs(30));
    }

    /// Sends `CLUSTER FAILOVER` to replica `i` and returns at once (the failover goes on
    /// in the cluster; [`Self::role`] tells when it is done).
    pub fn start_failover(&self, replica: usize) {
        let ok: String = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut self.nodes[replica].conn())
            .expect("CLUSTER FAILOVER");
        assert_eq!(ok, "OK");
    }

    /// A replica of the master at index `master`.
    pub fn replica_of(&self, master: usize) -> usize {
        let id = self.node_id(master);
        (0..self.nodes.len())
            .find(|&i| {
                i != master
                    && self.nodes[i].is_running()
                    && info_field(&self.nodes[i], "replication", "role").as_deref() == Some("slave")
                    && self.master_id_of(i).as_deref() == Some(id.as_str())
            })
            .unwrap_or_else(|| panic!("node {master} has no running replica"))
    }

    fn node_id(&self, i: usize) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.nodes[i].conn())
            .expect("CLUSTER MYID")
    }

    /// The id of the master replica `i` follows (`CLUSTER NODES`, its `myself` line).
    fn master_id_of(&self, i: usize) -> Option<String> {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut self.nodes[i].conn())
            .ok()?;
        let line = nodes.lines().find(|l| l.contains("myself"))?;
        // <id> <addr> <flags> <master-id> …
        let master = line.split(' ').nth(3)?;
        (master != "-").then(|| master.to_string())
    }

    /// Waits until every running node says `cluster_state:ok` with all 16384 slots
    /// assigned and the same view of who serves them, and every running replica's link
    /// to its master is up.
    pub fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            match self.unhealthy() {
                None => return,
                Some(why) => assert!(
                    Instant::now() < deadline,
                    "the cluster is not healthy after {within:?}: {why}"
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Why the cluster is not healthy yet, or `None`.
    fn unhealthy(&self) -> Option<String> {
        let mut views = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.is_running() {
                continue;
            }
            let state = info_cluster(node, "cluster_state");
            if state.as_deref() != Some("ok") {
                return Some(format!("node {i} cluster_state {state:?}"));
            }
            let assigned = info_cluster(node, "cluster_slots_assigned");
            if assigned.as_deref() != Some("16384") {
                return Some(format!("node {i} cluster_slots_assigned {assigned:?}"));
            }
            if info_field(node, "replication", "role").as_deref() == Some("slave") {
                let link = info_field(node, "replication", "master_link_status");
                if link.as_deref() != Some("up") {
                    return Some(format!("replica {i} master_link_status {link:?}"));
                }
            }
            views.push(node_slot_ranges(node));
        }
        if views.windows(2).any(|w| w[0] != w[1]) {
            return Some("the nodes disagree on who serves which slots".into());
        }
        None
    }

    /// `(first slot, last slot, master port)` per range, from a running node.
    fn slot_ranges(&self) -> Vec<(u16, u16, u16)> {
        node_slot_ranges(self.any())
    }

    fn any(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node")
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }
}

/// `CLUSTER SLOTS` as sorted `(first, last, master port)`; empty when the node cannot
/// answer.
fn node_slot_ranges(node: &RedisServer) -> Vec<(u16, u16, u16)> {
    let Ok(mut conn) = node.client().get_connection() else {
        return Vec::new();
    };
    let slots: Vec<(u16, u16, (String, u16))> = match redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query::<Vec<redis::Value>>(&mut conn)
    {
        Ok(ranges) => ranges
            .into_iter()
            .filter_map(|r| redis::from_redis_value(r).ok())
            .filter_map(|r: Vec<redis::Value>| {
                let mut it = r.into_iter();
                let lo: u16 = redis::from_redis_value(it.next()?).ok()?;
                let hi: u16 = redis::from_redis_value(it.next()?).ok()?;
                let master: Vec<redis::Value> = redis::from_redis_value(it.next()?).ok()?;
                let mut m = master.into_iter();
                let host: String = redis::from_redis_value(m.next()?).ok()?;
                let port: u16 = redis::from_redis_value(m.next()?).ok()?;
                Some((lo, hi, (host, port)))
            })
            .collect(),
        Err(_) => return Vec::new(),
    };
    let mut ranges: Vec<(u16, u16, u16)> = slots
        .into_iter()
        .map(|(lo, hi, (_, port))| (lo, hi, port))
        .collect();
    ranges.sort();
    ranges
}

fn info_cluster(node: &RedisServer, field: &str) -> Option<String> {
    let mut conn = node.client().get_connection().ok()?;
    let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut conn).ok()?;
    find_field(&info, field)
}

fn info_field(node: &RedisServer, section: &str, field: &str) -> Option<String> {
    let mut conn = node.client().get_connection().ok()?;
    let info: String = redis::cmd("INFO").arg(section).query(&mut conn).ok()?;
    find_field(&info, field)
}

fn find_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

/// `n` ports free now whose cluster bus ports (port + 10000) are free too.
fn cluster_ports(n: usize) -> Vec<u16> {
    // Held until all are chosen, so no port (or bus port) is picked twice.
    let mut held = Vec::with_capacity(2 * n);
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
        let port = l.local_addr().expect("local addr").port();
        if port > 55_000 {
            continue;
        }
        let Ok(bus) = std::net::TcpListener::bind(("127.0.0.1", port + 10_000)) else {
            continue;
        };
        held.push(l);
        held.push(bus);
        ports.push(port);
    }
    ports
}
