//! `vigia keys sweep`: remove every key under a prefix, with SCAN + UNLINK, never KEYS.
//!
//! Multi-dimensional limiting leaves users × devices × scenes keys behind after a campaign;
//! this is the tool that cleans them up. It exists because of a lesson learned the hard way:
//! someone once ran `KEYS lt:*` in production and blocked an instance holding 20 million
//! keys for more than 10 seconds. `KEYS` walks the whole keyspace in one command, and Redis
//! runs commands one at a time, so every check stalls until it finishes. Likewise `DEL` of
//! a large ZSET or hash frees its memory inline.
//!
//! So the sweep:
//!
//! * walks the keyspace with `SCAN cursor MATCH pattern COUNT batch`, a bounded amount of
//!   work per round trip, letting other clients' commands run between batches;
//! * removes each batch of matches with one `UNLINK`, which unlinks the keys at once and
//!   frees their memory in a background thread;
//! * never sends `KEYS` (the integration tests check Redis' own `INFO commandstats`).
//!
//! # The prefix
//!
//! The prefix is a key prefix as written in the config (`lt`, or `lt:coupon_claim`); the
//! sweep removes the keys `PREFIX:*`, that is every key that starts with the prefix followed
//! by `:`. `lt` does not touch `ltx:y`, `LT:z`, nor the key `lt` itself.
//!
//! * One trailing `:` is stripped, so `lt:` and `lt` mean the same thing (`lt:*`).
//! * An empty prefix (or `:` alone) is refused with [`SweepError::EmptyPrefix`]: it would
//!   sweep the whole database.
//! * The prefix is literal. Redis glob metacharacters in it (`*`, `?`, `[`, `]`, `\`) are
//!   escaped with `\` before the `MATCH` pattern is built, so a prefix can never widen the
//!   match: prefix `lt*` removes `lt*:1` but not `ltx:1`.
//!
//! # What SCAN guarantees, and what it does not
//!
//! * A key present for the whole sweep is returned at least once, so it is removed.
//! * A key created (or recreated by live traffic) while the sweep runs may be missed. Sweep
//!   after the traffic that writes under the prefix has stopped, or run it again.
//! * SCAN may return the same key more than once (while Redis rehashes). Hence
//!   [`SweepReport::matched`] is the number of matches SCAN returned, duplicates included,
//!   an upper bound on the distinct keys found (in a dry run too), while
//!   [`SweepReport::removed`] is the sum of `UNLINK`'s replies: keys that really existed and
//!   were removed, never counted twice.
//!
//! Keys are handled as bytes (`Vec<u8>`): key names need not be UTF-8.
//!
//! # Redis Cluster
//!
//! The URL is one Redis node's, or a Redis Cluster's seed nodes separated by commas (the
//! `[store] redis_url` of `backend = "redis_cluster"`). The sweep connects to the first
//! seed that answers and asks it `CLUSTER SLOTS`:
//!
//! * a node with cluster support disabled is one Redis, swept as above;
//! * a cluster node names the masters serving the slots, and the sweep walks each master in
//!   turn with a plain connection to it (`SCAN` only sees the node it is sent to), so a
//!   seed may be any node, replicas included. Every key a master's `SCAN` returns lives on
//!   that master, so it is unlinked there; as a multi-key command must stay within one
//!   slot, each batch is grouped by slot (the hash tag rule of `CLUSTER KEYSLOT`) and sent
//!   as one `UNLINK` per slot, all of a batch's in one pipeline. Replicas are not scanned:
//!   they drop the keys as their master's unlinks replicate.
//! * When `CLUSTER SLOTS` is refused for another reason (an ACL without `CLUSTER`, a
//!   renamed command), `INFO cluster` (`cluster_enabled`) decides; if that is refused too,
//!   a single URL is swept as one node, as before cluster support.
//!
//! Several URLs that do not lead to a cluster are an error, not a sweep of one of them. A
//! failover or a resharding during the sweep fails it (`MOVED`, `READONLY`) with an error
//! naming the node; the keys unlinked until then stay unlinked, and running it again is
//! safe. Progress and the report count across the masters, and the rate below is one
//! budget for the whole cluster, not per master.
//!
//! # Throttling: `rate`
//!
//! [`SweepOptions::rate`] bounds the keys the sweep acts on: at most `rate` keys a second
//! go to `UNLINK` (in a dry run, are counted), so the removal load a production Redis
//! carries (unlinking, freeing memory, replicating the deletes to replicas and the AOF)
//! stays bounded. The cost of each `SCAN` round trip is already bounded by the batch, which
//! a rate lowers to `rate` when it is smaller, so no single `UNLINK` is more than one
//! second's budget. See [`Pacer`] for the schedule.
//!
//! # Where the Redis and the prefix come from
//!
//! [`target`] takes them from the command line, falling back on the service's own config
//! (`[store] redis_url` and `key_prefix`), so a sweep removes the keys the service writes.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

use crate::config::{Config, ConfigError};

/// The default `SCAN COUNT` and `UNLINK` batch size.
pub const DEFAULT_BATCH: usize = 500;

/// How long to wait for the TCP connection (and handshake) before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long to wait for any one reply. Generous: one batch is small by construction.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// What to sweep and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepOptions {
    /// Key prefix as in the config (`lt`, `lt:coupon_claim`); keys `PREFIX:*` are swept.
    pub prefix: String,
    /// Only count the matching keys; remove nothing.
    pub dry_run: bool,
    /// `SCAN COUNT` hint and maximum keys per `UNLINK`; at least 1. Default [`DEFAULT_BATCH`].
    /// A smaller [`rate`](Self::rate) lowers it to the rate.
    pub batch: usize,
    /// At most this many keys a second are unlinked (counted, in a dry run); `None`: as
    /// fast as Redis answers. See the module doc.
    pub rate: Option<NonZeroU32>,
}

impl SweepOptions {
    /// A real (not dry) sweep of `prefix` with the default batch size.
    pub fn new(prefix: impl Into<String>) -> SweepOptions {
        SweepOptions {
            prefix: prefix.into(),
            dry_run: false,
            batch: DEFAULT_BATCH,
            rate: None,
        }
    }

    /// The batch actually used: [`batch`](Self::batch), lowered to the rate if smaller.
    pub fn effective_batch(&self) -> usize {
        match self.rate {
            Some(rate) => self.batch.min(rate.get() as usize),
            None => self.batch,
        }
    }
}

/// Running totals, passed to the progress callback after every SCAN batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepProgress {
    /// SCAN round trips completed so far.
    pub batches: u64,
    /// Matches SCAN returned so far (duplicates possible, see the module doc).
    pub matched: u64,
    /// Keys removed so far, as counted by `UNLINK`'s replies; 0 in a dry run.
    pub removed: u64,
    /// The node being swept, from 1: on a cluster, the master's rank in the order swept;
    /// 1 for a single Redis.
    pub node: usize,
    /// The nodes the sweep walks: the cluster's masters, or 1 for a single Redis.
    pub nodes: usize,
}

/// The outcome of a completed sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    /// Matches SCAN returned (duplicates possible, see the module doc).
    pub matched: u64,
    /// Keys removed, from `UNLINK`'s replies; 0 in a dry run.
    pub removed: u64,
    /// SCAN round trips made.
    pub batches: u64,
    pub dry_run: bool,
    /// The nodes swept: the cluster's masters, or 1 for a single Redis.
    pub nodes: usize,
    /// Whether the URL led to a Redis Cluster.
    pub cluster: bool,
    /// From the connection to the last reply.
    pub elapsed: Duration,
    /// The part of `elapsed` spent waiting for the rate ([`SweepOptions::rate`]).
    pub throttled: Duration,
}

impl SweepReport {
    /// The one line the command prints at the end, e.g. `done: keys under lt: scanned 1200,
    /// removed 1200 in 0.4 s`; a dry run says `would remove`, a cluster's sweep adds `on 3
    /// cluster masters`.
    pub fn summary(&self, prefix: &str) -> String {
        let (head, verb, acted) = if self.dry_run {
            ("dry run:", "would remove", self.matched)
        } else {
            ("done:", "removed", self.removed)
        };
        let mut line = format!(
            "{head} keys under {prefix}: scanned {}, {verb} {acted} in {:.1} s",
            self.matched,
            self.elapsed.as_secs_f64()
        );
        if self.cluster {
            let s = if self.nodes == 1 { "" } else { "s" };
            line += &format!(" on {} cluster master{s}", self.nodes);
        }
        if !self.throttled.is_zero() {
            line += &format!(
                " ({:.1} s waiting for the rate)",
                self.throttled.as_secs_f64()
            );
        }
        line
    }
}

impl SweepProgress {
    /// A progress message after `elapsed`, e.g. `scanned 1200, removed 1100 (2400 keys/s)`;
    /// in a dry run `would remove`. The rate is of the keys removed (counted, in a dry run).
    /// Sweeping several masters, it ends with the one being swept: `, master 2 of 3`.
    pub fn message(&self, dry_run: bool, elapsed: Duration) -> String {
        let (verb, acted) = if dry_run {
            ("would remove", self.matched)
        } else {
            ("removed", self.removed)
        };
        let per_sec = acted as f64 / elapsed.as_secs_f64().max(1e-3);
        let mut line = format!(
            "scanned {}, {verb} {acted} ({per_sec:.0} keys/s)",
            self.matched
        );
        if self.nodes > 1 {
            line += &format!(", master {} of {}", self.node, self.nodes);
        }
        line
    }
}

/// Paces keys to a rate: [`reserve`](Pacer::reserve) says how long to wait before acting on
/// the next `n` keys. The clock is the caller's (`now`), so the schedule is testable.
///
/// Each reservation starts when the previous one's keys are paid for (`n / rate` seconds
/// after it started) or now, whichever is later: the average never exceeds the rate, the
/// sweep is never more than one reservation ahead of the schedule, and time lost to a slow
/// Redis is not banked as a burst afterwards.
#[derive(Debug, Clone)]
pub struct Pacer {
    rate: NonZeroU32,
    /// When the keys reserved so far are paid for; `None` before the first reservation.
    next_free: Option<Instant>,
}

impl Pacer {
    /// A pacer for `rate` keys a second.
    pub fn new(rate: NonZeroU32) -> Pacer {
        Pacer {
            rate,
            next_free: None,
        }
    }

    /// Reserves `keys` at `now`; returns how long to wait before acting on them (zero when
    /// they may go at once).
    pub fn reserve(&mut self, keys: u64, now: Instant) -> Duration {
        let start = match self.next_free {
            Some(free) if free > now => free,
            _ => now,
        };
        self.next_free = Some(start + self.cost(keys));
        start - now
    }

    /// `keys / rate` seconds, rounded up to the nanosecond so the rate is never exceeded.
    fn cost(&self, keys: u64) -> Duration {
        let rate = u128::from(self.rate.get());
        let nanos = (u128::from(keys) * 1_000_000_000).div_ceil(rate);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// Where to sweep: a Redis URL and a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// One Redis node's URL, or a Redis Cluster's seed node URLs separated by commas.
    pub url: String,
    pub prefix: String,
}

/// The Redis and prefix to sweep: `redis` and `prefix` when given; what is not given comes
/// from the config at `config` (`[store] redis_url`, `key_prefix`), loaded as the service
/// loads it ([`Config::load`], `VIGIA_*` environment included). The config is not read
/// when both are given.
pub fn target(
    redis: Option<String>,
    prefix: Option<String>,
    config: &Path,
) -> Result<Target, SweepError> {
    if let (Some(url), Some(prefix)) = (&redis, &prefix) {
        return Ok(Target {
            url: url.clone(),
            prefix: prefix.clone(),
        });
    }
    let missing = match (&redis, &prefix) {
        (None, None) => "--redis and --prefix",
        (None, Some(_)) => "--redis",
        _ => "--prefix",
    };
    let loaded = Config::load(config).map_err(|source| SweepError::Config { missing, source })?;
    let url = redis.unwrap_or(loaded.store.redis_url);
    if url.trim().is_empty() {
        return Err(SweepError::NoRedisUrl {
            config: config.display().to_string(),
        });
    }
    Ok(Target {
        url,
        prefix: prefix.unwrap_or(loaded.store.key_prefix),
    })
}

/// Why a sweep did not start or did not finish. A sweep that fails midway has removed the
/// keys of the batches before the failure; running it again is safe.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("refusing to sweep an empty prefix: it would remove every key in the database")]
    EmptyPrefix,
    #[error("batch size must be at least 1")]
    ZeroBatch,
    /// A flag was missing and the config that would supply it cannot be used.
    #[error("{missing} not given, and the config cannot supply it: {source}")]
    Config {
        missing: &'static str,
        #[source]
        source: ConfigError,
    },
    #[error(
        "no Redis to sweep: give --redis URL, or set [store] redis_url in {config} \
         (or VIGIA_REDIS_URL)"
    )]
    NoRedisUrl { config: String },
    /// `url` has any password redacted.
    #[error("cannot connect to Redis at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("Redis error during the sweep: {0}")]
    Redis(#[from] redis::RedisError),
    /// Several URLs were given, so the sweep expects a cluster, but the node that answered
    /// is a single Redis.
    #[error(
        "{seeds} Redis URLs given, but {node} is not in cluster mode: give one URL to sweep \
         a single Redis, or the seed nodes of a Redis Cluster"
    )]
    NotACluster { node: String, seeds: usize },
    /// The seed is (or may be) a cluster node, but the masters could not be learned from it.
    #[error("cannot learn the cluster's masters from {node} (CLUSTER SLOTS): {source}")]
    Discover {
        node: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("{node} is in cluster mode, but no master serves any slot (CLUSTER SLOTS is empty)")]
    NoMasters { node: String },
    /// A cluster master (`host:port`, as `CLUSTER SLOTS` names it) did not accept the
    /// connection.
    #[error("cannot connect to cluster master {node}: {source}")]
    ConnectNode {
        node: String,
        #[source]
        source: redis::RedisError,
    },
    /// A cluster master (`host:port`) answered a `SCAN` or an `UNLINK` with an error.
    #[error("Redis error on cluster master {node} during the sweep: {source}")]
    Node {
        node: String,
        #[source]
        source: redis::RedisError,
    },
}

/// Normalises a config prefix into the sweep's `MATCH` pattern (`PREFIX:*`, glob-escaped).
///
/// Strips one trailing `:`; refuses a prefix that is empty after that.
pub fn match_pattern(prefix: &str) -> Result<Vec<u8>, SweepError> {
    let prefix = prefix.strip_suffix(':').unwrap_or(prefix);
    if prefix.is_empty() {
        return Err(SweepError::EmptyPrefix);
    }
    let mut pattern = Vec::with_capacity(prefix.len() * 2 + 2);
    for &b in prefix.as_bytes() {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            pattern.push(b'\\');
        }
        pattern.push(b);
    }
    pattern.extend_from_slice(b":*");
    Ok(pattern)
}

/// Removes every key `PREFIX:*` on the Redis at `url` (one node's URL, or a cluster's
/// seed URLs separated by commas: every master is swept; see the module doc), calling
/// `progress` with running totals after every SCAN batch.
pub async fn sweep(
    url: &str,
    opts: &SweepOptions,
    mut progress: impl FnMut(&SweepProgress),
) -> Result<SweepReport, SweepError> {
    let pattern = match_pattern(&opts.prefix)?;
    if opts.batch == 0 {
        return Err(SweepError::ZeroBatch);
    }
    let started = Instant::now();
    let seeds = seed_urls(url);
    let (seed, mut conn) = connect_first(url, &seeds).await?;

    let mut walk = Walk {
        pattern,
        batch: opts.effective_batch(),
        dry_run: opts.dry_run,
        pacer: opts.rate.map(Pacer::new),
        throttled: Duration::ZERO,
        totals: SweepProgress {
            node: 1,
            nodes: 1,
            ..SweepProgress::default()
        },
    };
    let cluster = match topology(&mut conn, &seed, seeds.len()).await? {
        Topology::Single => {
            walk.node(&mut conn, false, &mut progress).await?;
            false
        }
        Topology::Cluster(masters) => {
            drop(conn);
            walk.totals.nodes = masters.len();
            for (i, master) in masters.iter().enumerate() {
                walk.totals.node = i + 1;
                let node = master.to_string();
                let mut conn =
                    connect_info(master.connection_info(&seed))
                        .await
                        .map_err(|source| SweepError::ConnectNode {
                            node: node.clone(),
                            source,
                        })?;
                walk.node(&mut conn, true, &mut progress)
                    .await
                    .map_err(|source| SweepError::Node { node, source })?;
            }
            true
        }
    };

    Ok(SweepReport {
        matched: walk.totals.matched,
        removed: walk.totals.removed,
        batches: walk.totals.batches,
        dry_run: opts.dry_run,
        nodes: walk.totals.nodes,
        cluster,
        elapsed: started.elapsed(),
        throttled: walk.throttled,
    })
}

/// One sweep's state across the nodes it walks: one pacer (the rate is global) and the
/// running totals.
struct Walk {
    pattern: Vec<u8>,
    batch: usize,
    dry_run: bool,
    pacer: Option<Pacer>,
    throttled: Duration,
    totals: SweepProgress,
}

impl Walk {
    /// SCANs one node to the end, unlinking (or counting) its matches on that node;
    /// `by_slot`: one `UNLINK` per slot (a cluster node refuses a cross-slot one).
    async fn node(
        &mut self,
        conn: &mut MultiplexedConnection,
        by_slot: bool,
        progress: &mut impl FnMut(&SweepProgress),
    ) -> Result<(), redis::RedisError> {
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&self.pattern)
                .arg("COUNT")
                .arg(self.batch)
                .query_async(conn)
                .await?;
            self.totals.batches += 1;
            self.totals.matched += keys.len() as u64;
            if self.dry_run {
                self.throttled += pace(&mut self.pacer, keys.len()).await;
            } else {
                // COUNT is a hint: one SCAN may return more than `batch` keys.
                for chunk in keys.chunks(self.batch) {
                    self.throttled += pace(&mut self.pacer, chunk.len()).await;
                    self.totals.removed += if by_slot {
                        unlink_by_slot(conn, chunk).await?
                    } else {
                        redis::cmd("UNLINK").arg(chunk).query_async(conn).await?
                    };
                }
            }
            progress(&self.totals);
            cursor = next;
            if cursor == 0 {
                return Ok(());
            }
        }
    }
}

/// `UNLINK`s `keys`, all on the node behind `conn`, one command per slot, all in one
/// pipeline; returns the keys removed.
async fn unlink_by_slot(
    conn: &mut MultiplexedConnection,
    keys: &[Vec<u8>],
) -> Result<u64, redis::RedisError> {
    let mut groups: BTreeMap<u16, Vec<&Vec<u8>>> = BTreeMap::new();
    for key in keys {
        groups
            .entry(crate::keys::slot_of(key))
            .or_default()
            .push(key);
    }
    let mut pipe = redis::pipe();
    for group in groups.values() {
        pipe.cmd("UNLINK").arg(group);
    }
    let removed: Vec<u64> = pipe.query_async(conn).await?;
    Ok(removed.iter().sum())
}

/// The URLs in `url`: comma-separated, trimmed, empty ones dropped.
fn seed_urls(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The seed that answered: its connection settings and `host:port`.
struct Seed {
    info: ConnectionInfo,
    node: String,
}

/// Connects to the first of `seeds` that answers. When none does, the error names `url`
/// (redacted) and carries the first seed's error.
async fn connect_first(
    url: &str,
    seeds: &[&str],
) -> Result<(Seed, MultiplexedConnection), SweepError> {
    let mut first_err = None;
    // No seed at all (`url` blank or commas only): let the client say what is wrong.
    let tried = if seeds.is_empty() { &[url][..] } else { seeds };
    for seed in tried {
        let attempt = match seed.into_connection_info() {
            Ok(info) => connect_info(info.clone()).await.map(|conn| (info, conn)),
            Err(e) => Err(e),
        };
        match attempt {
            Ok((info, conn)) => {
                let node = info.addr().to_string();
                return Ok((Seed { info, node }, conn));
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(SweepError::Connect {
        url: redact(url),
        source: first_err.expect("at least one seed was tried"),
    })
}

async fn connect_info(info: ConnectionInfo) -> Result<MultiplexedConnection, redis::RedisError> {
    let client = redis::Client::open(info)?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// What the seed leads to.
#[derive(Debug, PartialEq, Eq)]
enum Topology {
    /// One Redis.
    Single,
    /// A cluster's masters, in the order of the first slot each serves.
    Cluster(Vec<Master>),
}

/// A cluster master, as `CLUSTER SLOTS` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Master {
    host: String,
    port: u16,
}

impl std::fmt::Display for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl Master {
    /// The seed's settings (credentials, TLS, timeouts) with this master's address.
    fn connection_info(&self, seed: &Seed) -> ConnectionInfo {
        let addr = match seed.info.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: self.host.clone(),
                port: self.port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(self.host.clone(), self.port),
        };
        seed.info.clone().set_addr(addr)
    }
}

/// Asks the seed whether it is a cluster node (see the module doc); `seeds`: how many URLs
/// were given (several must lead to a cluster).
async fn topology(
    conn: &mut MultiplexedConnection,
    seed: &Seed,
    seeds: usize,
) -> Result<Topology, SweepError> {
    let discover_err = |source| SweepError::Discover {
        node: seed.node.clone(),
        source,
    };
    let slots: Result<Value, redis::RedisError> =
        redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await;
    match slots {
        Ok(reply) => {
            let masters = masters_from_slots(reply, seed_host(&seed.info)).map_err(discover_err)?;
            if masters.is_empty() {
                return Err(SweepError::NoMasters {
                    node: seed.node.clone(),
                });
            }
            return Ok(Topology::Cluster(masters));
        }
        Err(e) if e.to_string().contains("cluster support disabled") => {}
        Err(e) if e.is_io_error() || e.is_timeout() => return Err(discover_err(e)),
        // Refused for another reason (ACL, renamed command): ask INFO.
        Err(e) => {
            let info: Result<String, redis::RedisError> =
                redis::cmd("INFO").arg("cluster").query_async(conn).await;
            match info {
                Ok(info) if info_says_cluster(&info) => return Err(discover_err(e)),
                Ok(_) => {}
                Err(_) if seeds > 1 => return Err(discover_err(e)),
                // Nothing tells: one URL is one node, as before cluster support.
                Err(_) => {}
            }
        }
    }
    if seeds > 1 {
        return Err(SweepError::NotACluster {
            node: seed.node.clone(),
            seeds,
        });
    }
    Ok(Topology::Single)
}

/// `cluster_enabled:1` in an `INFO cluster` reply.
fn info_says_cluster(info: &str) -> bool {
    info.lines().any(|line| line.trim() == "cluster_enabled:1")
}

/// The host `CLUSTER SLOTS` means by an empty or `?` endpoint: the seed's own.
fn seed_host(info: &ConnectionInfo) -> &str {
    match info.addr() {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host,
        _ => "127.0.0.1",
    }
}

/// The masters in a `CLUSTER SLOTS` reply (`[[first, last, [host, port, …], replicas…],
/// …]`), each once, in the order of the first slot it serves. An empty or `?` host (the
/// node does not know its own endpoint) means `seed_host`.
fn masters_from_slots(reply: Value, seed_host: &str) -> Result<Vec<Master>, redis::RedisError> {
    let malformed = |what: &str| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected CLUSTER SLOTS reply",
            what.to_string(),
        ))
    };
    let Value::Array(ranges) = reply else {
        return Err(malformed("not an array"));
    };
    let mut served: Vec<(i64, Master)> = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(malformed("a range is not an array"));
        };
        let (Some(Value::Int(first)), Some(Value::Array(master))) = (fields.first(), fields.get(2))
        else {
            return Err(malformed("a range lacks its first slot or its master"));
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(malformed("a master lacks its host")),
        };
        let port = match master.get(1) {
            Some(Value::Int(p)) => {
                u16::try_from(*p).map_err(|_| malformed("a port is out of range"))?
            }
            _ => return Err(malformed("a master lacks its port")),
        };
        let host = if host.is_empty() || host == "?" {
            seed_host.to_string()
        } else {
            host
        };
        served.push((*first, Master { host, port }));
    }
    served.sort_by_key(|(first, _)| *first);
    let mut masters: Vec<Master> = Vec::new();
    for (_, master) in served {
        if !masters.contains(&master) {
            masters.push(master);
        }
    }
    Ok(masters)
}

/// Waits until `pacer` lets `keys` go; returns the time waited.
async fn pace(pacer: &mut Option<Pacer>, keys: usize) -> Duration {
    let Some(pacer) = pacer else {
        return Duration::ZERO;
    };
    let wait = pacer.reserve(keys as u64, Instant::now());
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    wait
}

/// The URL with any `user:password@` replaced by `***@`, fit for an error message; each
/// URL of a comma-separated list (a cluster's seeds) is redacted.
pub(crate) fn redact(url: &str) -> String {
    url.split(',').map(redact_one).collect::<Vec<_>>().join(",")
}

fn redact_one(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let redacted = match rest[..authority_end].rfind('@') {
        Some(at) => format!("***{}", &rest[at..]),
        None => rest.to_string(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{redacted}"),
        None => redacted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_prefix_colon_star() {
        assert_eq!(match_pattern("lt").unwrap(), b"lt:*");
        assert_eq!(
            match_pattern("lt:coupon_claim").unwrap(),
            b"lt:coupon_claim:*"
        );
    }

    #[test]
    fn one_trailing_colon_is_stripped() {
        assert_eq!(match_pattern("lt:").unwrap(), b"lt:*");
        assert_eq!(match_pattern("lt::").unwrap(), b"lt::*");
    }

    #[test]
    fn empty_prefix_is_refused() {
        assert!(matches!(match_pattern(""), Err(SweepError::EmptyPrefix)));
        assert!(matches!(match_pattern(":"), Err(SweepError::EmptyPrefix)));
    }

    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(match_pattern("lt*").unwrap(), br"lt\*:*");
        assert_eq!(match_pattern("l?").unwrap(), br"l\?:*");
        assert_eq!(match_pattern("[a]").unwrap(), br"\[a\]:*");
        assert_eq!(match_pattern(r"a\b").unwrap(), br"a\\b:*");
    }

    fn rate(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).expect("non-zero")
    }

    #[test]
    fn the_first_keys_go_at_once_and_the_next_wait_for_their_cost() {
        let t0 = Instant::now();
        let mut pacer = Pacer::new(rate(100));
        assert_eq!(pacer.reserve(50, t0), Duration::ZERO);
        // 50 keys at 100/s are paid for half a second after they went.
        assert_eq!(pacer.reserve(50, t0), Duration::from_millis(500));
        // Asked at 0.5 s, the next keys wait for the previous 50 to be paid for: 1 s.
        assert_eq!(
            pacer.reserve(100, t0 + Duration::from_millis(500)),
            Duration::from_millis(500)
        );
        assert_eq!(
            pacer.reserve(1, t0 + Duration::from_secs(1)),
            Duration::from_secs(1)
        );
    }

    /// A whole sweep on a fake clock: Redis answers instantly, the sweep sleeps exactly as
    /// long as it is told.
    fn simulate(
        rate_per_sec: u32,
        total: u64,
        chunk: u64,
    ) -> (u64, Duration, Vec<(Duration, u64)>) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut pacer = Pacer::new(rate(rate_per_sec));
        let (mut waits, mut sent) = (0, 0);
        let mut sends = Vec::new();
        while sent < total {
            let n = chunk.min(total - sent);
            let wait = pacer.reserve(n, now);
            if !wait.is_zero() {
                waits += 1;
            }
            now += wait;
            sent += n;
            sends.push((now - t0, sent));
        }
        (waits, now - t0, sends)
    }

    #[test]
    fn a_throttled_sweep_never_runs_ahead_of_the_rate() {
        // 1000 keys at 100/s in chunks of 100: a wait before each chunk but the first, and
        // the last chunk goes at 9 s (it is paid for at 10 s).
        let (waits, took, sends) = simulate(100, 1_000, 100);
        assert_eq!(waits, 9);
        assert_eq!(took, Duration::from_secs(9));
        // By any send, at most one chunk more than the rate allows has gone.
        for (at, sent) in sends {
            assert!(
                sent as f64 <= 100.0 * at.as_secs_f64() + 100.0,
                "{sent} keys sent by {at:?}"
            );
        }
        // Smaller chunks, same schedule: 10 000 keys at 2 000/s in chunks of 500.
        let (waits, took, _) = simulate(2_000, 10_000, 500);
        assert_eq!(waits, 19);
        assert_eq!(took, Duration::from_millis(4_750));
    }

    #[test]
    fn time_lost_to_a_slow_redis_is_not_banked_as_a_burst() {
        let t0 = Instant::now();
        let mut pacer = Pacer::new(rate(100));
        assert_eq!(pacer.reserve(100, t0), Duration::ZERO);
        // Redis took 5 s to answer: the next chunk may go at once...
        let late = t0 + Duration::from_secs(5);
        assert_eq!(pacer.reserve(100, late), Duration::ZERO);
        // ...but the one after it still waits its full second.
        assert_eq!(pacer.reserve(100, late), Duration::from_secs(1));
    }

    #[test]
    fn the_cost_rounds_up_so_the_rate_is_never_exceeded() {
        let t0 = Instant::now();
        let mut pacer = Pacer::new(rate(3));
        pacer.reserve(1, t0);
        assert_eq!(pacer.reserve(1, t0), Duration::from_nanos(333_333_334));
    }

    #[test]
    fn a_rate_below_the_batch_lowers_the_batch() {
        let opts = |rate| SweepOptions {
            rate,
            ..SweepOptions::new("lt")
        };
        assert_eq!(opts(None).effective_batch(), DEFAULT_BATCH);
        assert_eq!(opts(Some(NonZeroU32::MIN)).effective_batch(), 1);
        assert_eq!(opts(Some(rate(10))).effective_batch(), 10);
        assert_eq!(opts(Some(rate(100_000))).effective_batch(), DEFAULT_BATCH);
    }

    #[test]
    fn the_summary_says_what_was_scanned_removed_and_how_long_it_took() {
        let report = SweepReport {
            matched: 1_201,
            removed: 1_200,
            batches: 3,
            dry_run: false,
            nodes: 1,
            cluster: false,
            elapsed: Duration::from_millis(2_440),
            throttled: Duration::ZERO,
        };
        assert_eq!(
            report.summary("lt"),
            "done: keys under lt: scanned 1201, removed 1200 in 2.4 s"
        );
        let dry = SweepReport {
            dry_run: true,
            removed: 0,
            throttled: Duration::from_millis(1_960),
            ..report
        };
        assert_eq!(
            dry.summary("lt:x"),
            "dry run: keys under lt:x: scanned 1201, would remove 1201 in 2.4 s \
             (2.0 s waiting for the rate)"
        );
        let cluster = SweepReport {
            nodes: 3,
            cluster: true,
            ..dry
        };
        assert_eq!(
            cluster.summary("lt"),
            "dry run: keys under lt: scanned 1201, would remove 1201 in 2.4 s \
             on 3 cluster masters (2.0 s waiting for the rate)"
        );
        let one = SweepReport {
            nodes: 1,
            throttled: Duration::ZERO,
            ..cluster
        };
        assert!(one.summary("lt").ends_with(" on 1 cluster master"));
    }

    #[test]
    fn the_progress_message_counts_and_rates_the_keys_acted_on() {
        let p = SweepProgress {
            batches: 4,
            matched: 2_000,
            removed: 1_500,
            node: 1,
            nodes: 1,
        };
        assert_eq!(
            p.message(false, Duration::from_secs(2)),
            "scanned 2000, removed 1500 (750 keys/s)"
        );
        assert_eq!(
            p.message(true, Duration::from_secs(4)),
            "scanned 2000, would remove 2000 (500 keys/s)"
        );
        let p = SweepProgress {
            node: 2,
            nodes: 3,
            ..p
        };
        assert_eq!(
            p.message(false, Duration::from_secs(2)),
            "scanned 2000, removed 1500 (750 keys/s), master 2 of 3"
        );
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(first: i64, last: i64, host: &str, port: i64, replica_port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
            Value::Array(vec![bulk(host), Value::Int(replica_port), bulk("id2")]),
        ])
    }

    #[test]
    fn cluster_slots_name_each_master_once_in_slot_order() {
        let reply = Value::Array(vec![
            range(10_923, 16_383, "10.0.0.3", 7003, 7006),
            range(0, 5_460, "10.0.0.1", 7001, 7004),
            range(5_461, 10_922, "", 7002, 7005),
            // A master serving two ranges.
            range(5_000, 5_000, "10.0.0.1", 7001, 7004),
        ]);
        let masters = masters_from_slots(reply, "seed.example").expect("parsed");
        let names: Vec<String> = masters.iter().map(Master::to_string).collect();
        assert_eq!(
            names,
            ["10.0.0.1:7001", "seed.example:7002", "10.0.0.3:7003"]
        );
        assert_eq!(
            masters_from_slots(Value::Array(vec![]), "h").expect("empty"),
            []
        );
        assert!(masters_from_slots(Value::Int(1), "h").is_err());
        assert!(masters_from_slots(Value::Array(vec![Value::Array(vec![])]), "h").is_err());
    }

    #[test]
    fn a_master_keeps_the_seed_credentials() {
        let info = "redis://sweeper:pw@seed:7000/"
            .into_connection_info()
            .expect("url");
        let seed = Seed {
            node: info.addr().to_string(),
            info,
        };
        let master = Master {
            host: "10.0.0.2".into(),
            port: 7002,
        };
        let info = master.connection_info(&seed);
        assert!(matches!(info.addr(), ConnectionAddr::Tcp(_, 7002)));
        assert_eq!(info.addr().to_string(), "10.0.0.2:7002");
        assert_eq!(info.redis_settings().username(), Some("sweeper"));
        assert_eq!(info.redis_settings().password(), Some("pw"));
    }

    #[test]
    fn seeds_are_split_on_commas_and_trimmed() {
        assert_eq!(seed_urls("redis://a:1"), ["redis://a:1"]);
        assert_eq!(
            seed_urls(" redis://a:1, redis://b:2 ,,"),
            ["redis://a:1", "redis://b:2"]
        );
        assert!(seed_urls(" , ").is_empty());
    }

    #[test]
    fn info_cluster_says_whether_cluster_mode_is_on() {
        assert!(info_says_cluster("# Cluster\r\ncluster_enabled:1\r\n"));
        assert!(!info_says_cluster("# Cluster\r\ncluster_enabled:0\r\n"));
        assert!(!info_says_cluster(""));
    }

    #[test]
    fn flags_given_need_no_config() {
        let t = target(
            Some("redis://h:1".into()),
            Some("lt".into()),
            Path::new("/nonexistent/vigia.toml"),
        )
        .expect("no config read");
        assert_eq!(
            t,
            Target {
                url: "redis://h:1".into(),
                prefix: "lt".into()
            }
        );
    }

    #[test]
    fn a_missing_flag_with_an_unreadable_config_names_the_flag_and_the_file() {
        let err = target(
            Some("redis://h:1".into()),
            None,
            Path::new("/nonexistent/vigia.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("--prefix not given"), "{err}");
        assert!(err.contains("/nonexistent/vigia.toml"), "{err}");
        let err = target(None, None, Path::new("/nonexistent/vigia.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--redis and --prefix not given"), "{err}");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("redis://:s3cret@10.0.0.1:6400/0"),
            "redis://***@10.0.0.1:6400/0"
        );
        assert_eq!(
            redact("rediss://user:pw@host:6380"),
            "rediss://***@host:6380"
        );
        assert_eq!(redact("redis://127.0.0.1:6400"), "redis://127.0.0.1:6400");
        assert_eq!(redact("redis://h/0?x=a@b"), "redis://h/0?x=a@b");
        // A cluster's seed list: every URL's password.
        assert_eq!(
            redact("redis://:a@h1:7001,redis://u:b@h2:7002,redis://h3:7003"),
            "redis://***@h1:7001,redis://***@h2:7002,redis://h3:7003"
        );
    }
}
