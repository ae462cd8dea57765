//! The node's link to Redis: multiplexed connections shared by the window store and the
//! trust ledger, the circuit breaker in front of them, and the per-call deadline.
//!
//! Each thread that calls (each HTTP worker) gets a connection of its own, made on its
//! own runtime, so the task that drives it runs where the requests wait: a reply wakes
//! its caller without crossing threads, and one worker's requests are still pipelined on
//! one socket. (One connection driven from the main thread cost every check two
//! cross-thread wake-ups and capped the rate below what Redis could take.)
//!
//! redis-rs's `ConnectionManager` reconnects when a connection *breaks*, but not when it
//! goes *silent*: a call that times out is simply abandoned, and a connection whose peer
//! vanished without a FIN or RST (a firewall or NAT dropping its state, a failover behind
//! one address) would time out forever. So after an outage the breaker's first probe runs
//! on a freshly built connection: recovery never depends on the old one coming back.
//!
//! A Redis that is down at start-up is an outage like any other, not a reason not to
//! start: the link opens without a connection, every call tries to make one (through the
//! breaker, so an outage is not hammered), and the scripts load on their first call.
//!
//! On Redis Cluster ([`RedisLink::open_cluster`]) the link holds one redis-rs cluster
//! connection: it keeps a connection per master, routes each call by its first key (every
//! call's keys are in one slot: `crate::keys::KeyPrefix`), follows MOVED and ASK, and
//! refreshes the slot map after a failover. Its calls go through the same breaker and
//! deadline; NOSCRIPT from any master loads the script on every node and retries once.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Script, ServerErrorKind, Value};

use super::breaker::Breaker;
use super::redis::{bounded, map_redis_error};
use super::StoreError;

/// Reconnect attempts per connection loss. Each attempt is bounded by the connection
/// timeout; requests meanwhile fail on their own deadline.
const RECONNECT_RETRIES: usize = 3;

/// Tells links apart in [`LOCAL`] (an address could be reused after a drop).
static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's connection per link: `(link, epoch, connection)`.
    static LOCAL: RefCell<Vec<(u64, u64, Conn)>> = const { RefCell::new(Vec::new()) };
}

/// A connection of the link: to one Redis, or to a cluster (routing by key).
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// `cmd`, an EVALSHA of `script`, on `conn`; loads `script` and sends `cmd` once more
/// when Redis lost its scripts.
async fn eval_on(conn: &mut Conn, script: &Script, cmd: &Cmd) -> Result<Value, RedisError> {
    match cmd.query_async::<Value>(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// A call of [`RedisLink::eval_call`] that gave no answer.
#[derive(Debug)]
pub struct CallFailed {
    pub error: StoreError,
    /// What became of its command.
    pub sent: Sent,
}

impl CallFailed {
    /// A call that was answered with something unusable: it ran (a bug or a foreign key
    /// shape), nothing of it is still to come.
    pub fn ended(error: StoreError) -> CallFailed {
        CallFailed {
            error,
            sent: Sent::Ended,
        }
    }
}

/// Whether a failed call's command may still run on Redis.
#[derive(Debug)]
pub enum Sent {
    /// Never sent (the breaker open, no connection): nothing of it can run.
    No,
    /// Sent and ended: Redis answered an error, or the connection broke. It ran, in part
    /// (a script's error does not undo its writes), or it never will.
    Ended,
    /// Sent and not answered within the deadline: Redis may run it yet.
    Pending(LateReply),
}

/// The reply of a call that outlived its deadline: resolves once Redis has answered it
/// (its script has run) or its connection is gone.
pub struct LateReply(Pin<Box<dyn Future<Output = ()> + Send>>);

impl LateReply {
    /// Waits for the reply (its value is not needed: only that the call is over).
    pub async fn arrived(self) {
        self.0.await
    }
}

impl std::fmt::Debug for LateReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LateReply")
    }
}

/// Where the link connects.
enum Target {
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
    },
    Cluster(ClusterClient),
}

fn local_get(link: u64, epoch: u64) -> Option<Conn> {
    LOCAL.with_borrow(|l| {
        l.iter()
            .find(|(id, e, _)| *id == link && *e == epoch)
            .map(|(_, _, c)| c.clone())
    })
}

fn local_put(link: u64, epoch: u64, conn: Conn) {
    LOCAL.with_borrow_mut(|l| {
        l.retain(|(id, _, _)| *id != link);
        l.push((link, epoch, conn));
    });
}

/// A connection manager to one Redis (its driver on the calling thread's runtime) within
/// `within_ms`.
async fn manager(
    client: &redis::Client,
    config: &ConnectionManagerConfig,
    within_ms: u64,
) -> Result<Conn, StoreError> {
    bounded(
        within_ms,
        ConnectionManager::new_with_config(client.clone(), config.clone()),
    )
    .await
    .map(Conn::Single)
}

/// A shared, breaker-guarded, deadline-bounded Redis connection.
pub struct RedisLink {
    target: Target,
    /// `None` until a first connection is made (Redis was down at start-up).
    conn: ArcSwapOption<Conn>,
    /// This link in [`LOCAL`].
    id: u64,
    /// Bumped whenever a fresh connection replaces `conn` (a probe after an outage):
    /// every thread's own connection of an older epoch is replaced on its next call, so
    /// no thread keeps a connection that went silent.
    epoch: AtomicU64,
    breaker: Arc<Breaker>,
    timeout_ms: u64,
    /// One reconnect at a time: concurrent probes would each build a connection.
    reconnecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for RedisLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLink")
            .field("timeout_ms", &self.timeout_ms)
            .field("breaker", &self.breaker)
            .finish()
    }
}

impl RedisLink {
    /// Opens the link to `url`, trying to connect within `startup_ms`. A Redis that cannot
    /// be reached is logged (refused, timed out…) and counted by the breaker, and the link
    /// opens anyway: the calls connect once it is back. Only an unusable URL is an error.
    /// `timeout_ms` bounds every later call and each connection attempt.
    pub async fn open(
        url: &str,
        timeout_ms: u64,
        startup_ms: u64,
        breaker: Arc<Breaker>,
    ) -> Result<Arc<RedisLink>, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::Unavailable(format!("invalid redis url {url:?}: {e}")))?;
        let timeout_ms = timeout_ms.max(1);
        let timeout = Duration::from_millis(timeout_ms);
        // No response timeout of redis-rs's own: every call runs under `run`'s deadline
        // (which also tells the breaker), and a second timer per call cost ~1 % of a
        // check's CPU for nothing.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(None)
            .set_number_of_retries(RECONNECT_RETRIES);
        Self::open_target(
            Target::Single { client, config },
            url,
            timeout_ms,
            startup_ms,
            breaker,
        )
        .await
    }

    /// Opens a link to the Redis Cluster that `seeds` (node URLs) belong to; the rest of
    /// the cluster is discovered from them. As [`Self::open`], an unreachable cluster is an
    /// outage, not an error; only an unusable URL is.
    pub async fn open_cluster(
        seeds: &[String],
        timeout_ms: u64,
        startup_ms: u64,
        breaker: Arc<Breaker>,
    ) -> Result<Arc<RedisLink>, StoreError> {
        let timeout_ms = timeout_ms.max(1);
        // No response timeout of the client's own, as for one Redis: each call runs under
        // `run`'s deadline. Redirections and the slot refresh after a failover happen
        // inside that deadline; a call that does not make it is the scene's policy's.
        let client = ClusterClient::builder(seeds.iter().map(String::as_str))
            .connection_timeout(Duration::from_millis(timeout_ms))
            .build()
            .map_err(|e| {
                StoreError::Unavailable(format!("invalid redis cluster urls {seeds:?}: {e}"))
            })?;
        let shown = seeds.join(",");
        Self::open_target(
            Target::Cluster(client),
            &shown,
            timeout_ms,
            startup_ms,
            breaker,
        )
        .await
    }

    async fn open_target(
        target: Target,
        url: &str,
        timeout_ms: u64,
        startup_ms: u64,
        breaker: Arc<Breaker>,
    ) -> Result<Arc<RedisLink>, StoreError> {
        let link = RedisLink {
            target,
            conn: ArcSwapOption::empty(),
            id: NEXT_LINK.fetch_add(1, Ordering::Relaxed),
            epoch: AtomicU64::new(0),
            breaker,
            timeout_ms,
            reconnecting: tokio::sync::Mutex::new(()),
        };
        match link.connect(startup_ms).await {
            Ok(conn) => {
                link.conn.store(Some(Arc::new(conn)));
                link.epoch.store(1, Ordering::Release);
            }
            Err(e) => {
                tracing::warn!(
                    redis_url = url,
                    error = %e,
                    "redis cannot be reached at start-up; each scene's on_store_error answers until it is"
                );
                link.breaker.record(&Err::<(), _>(e));
            }
        }
        Ok(Arc::new(link))
    }

    /// A new connection within `within_ms`. One plain attempt first: it reports a refused
    /// connection as refused, where the manager's own retries would run into the deadline
    /// and report every outage as a timeout.
    async fn connect(&self, within_ms: u64) -> Result<Conn, StoreError> {
        match &self.target {
            Target::Single { client, config } => {
                bounded(within_ms, client.get_multiplexed_async_connection()).await?;
                manager(client, config, within_ms).await
            }
            Target::Cluster(client) => bounded(within_ms, client.get_async_connection())
                .await
                .map(Conn::Cluster),
        }
    }

    /// A connection for this thread (on one Redis, its driver on the calling thread's
    /// runtime) within `within_ms`. A cluster connection is shared by every thread: it
    /// holds a connection per master already.
    async fn own(&self, within_ms: u64) -> Result<Conn, StoreError> {
        match (&self.target, self.conn.load_full()) {
            (Target::Single { client, config }, _) => manager(client, config, within_ms).await,
            (Target::Cluster(_), Some(shared)) => Ok(Conn::clone(&shared)),
            (Target::Cluster(_), None) => self.connect(within_ms).await,
        }
    }

    /// Whether this link is to a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// Loads `scripts` at start-up, within `startup_ms`, so a Redis that cannot take them
    /// fails there rather than on the first call. Without a connection (Redis down at
    /// start-up) there is nothing to load into: a script loads on its first call.
    pub async fn load_scripts(
        &self,
        scripts: &[&Script],
        startup_ms: u64,
    ) -> Result<(), StoreError> {
        let Some(conn) = self.conn.load_full() else {
            return Ok(());
        };
        let mut conn = Conn::clone(&conn);
        tokio::time::timeout(Duration::from_millis(startup_ms), async {
            for script in scripts {
                script.load_async(&mut conn).await?;
            }
            Ok::<_, RedisError>(())
        })
        .await
        .map_err(|_| StoreError::Timeout(startup_ms))?
        .map_err(|e| map_redis_error(e, self.timeout_ms))
    }

    /// The deadline of one call, ms.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// The breaker every call goes through.
    pub fn breaker(&self) -> &Arc<Breaker> {
        &self.breaker
    }

    /// A connection for one call: refused at once while the breaker is open; the first
    /// probe after an outage, and any call while there is no connection yet, builds a
    /// fresh connection first.
    pub async fn conn(&self) -> Result<Conn, StoreError> {
        self.breaker.permit()?;
        let probe = self.breaker.take_probe();
        let epoch = self.epoch.load(Ordering::Acquire);
        if !probe && epoch > 0 {
            if let Some(conn) = local_get(self.id, epoch) {
                return Ok(conn);
            }
            // Redis is reachable (some thread is connected): this thread makes its own.
            let own = self.own(self.timeout_ms).await;
            self.breaker.record(&own);
            let own = own?;
            local_put(self.id, epoch, own.clone());
            return Ok(own);
        }
        let _one = self.reconnecting.lock().await;
        if !probe {
            // Another call connected while this one waited.
            if let Some(conn) = self.conn.load_full() {
                return Ok(Conn::clone(&conn));
            }
        }
        let fresh = self.connect(self.timeout_ms).await;
        self.breaker.record(&fresh);
        let fresh = fresh?;
        self.conn.store(Some(Arc::new(fresh.clone())));
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        local_put(self.id, epoch, fresh.clone());
        Ok(fresh)
    }

    /// Runs `cmd`, an EVALSHA of `script` packed by the caller, as one call: a Redis that
    /// lost its scripts (a restart, `SCRIPT FLUSH`, a failover to a replica that never
    /// loaded them) gets `script` loaded and `cmd` once more, within the same deadline.
    pub async fn eval(&self, script: &Script, cmd: &Cmd) -> Result<Value, StoreError> {
        let mut conn = self.conn().await?;
        self.run(eval_on(&mut conn, script, cmd)).await
    }

    /// [`RedisLink::eval`] for a call that writes: when it fails, the [`CallFailed`] says
    /// whether the command was sent, and, when its deadline passed first, holds its late
    /// reply, which resolves once Redis has run it (or the connection is gone). Until then
    /// what it may write cannot be given back: a release sent on another connection could
    /// reach Redis before it.
    pub async fn eval_call(&self, script: &Arc<Script>, cmd: Cmd) -> Result<Value, CallFailed> {
        let mut conn = self.conn().await.map_err(|error| CallFailed {
            error,
            sent: Sent::No,
        })?;
        let script = script.clone();
        let mut reply = Box::pin(async move { eval_on(&mut conn, &script, &cmd).await });
        let timeout = Duration::from_millis(self.timeout_ms);
        let result = match tokio::time::timeout(timeout, &mut reply).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(CallFailed {
                error: map_redis_error(e, self.timeout_ms),
                sent: Sent::Ended,
            }),
            Err(_) => Err(CallFailed {
                error: StoreError::Timeout(self.timeout_ms),
                sent: Sent::Pending(LateReply(Box::pin(async move {
                    let _ = reply.await;
                }))),
            }),
        };
        self.breaker
            .record(&result.as_ref().map_err(|f| f.error.clone()));
        result
    }

    /// Runs one call under the deadline and tells the breaker how it went.
    pub async fn run<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        let result = bounded(self.timeout_ms, fut).await;
        self.breaker.record(&result);
        result
    }
}
