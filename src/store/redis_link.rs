//! The node's link to Redis: one multiplexed connection shared by the window store and the
//! trust ledger, the circuit breaker in front of it, and the per-call deadline.
//!
//! redis-rs's `ConnectionManager` reconnects when a connection *breaks*, but not when it
//! goes *silent*: a call that times out is simply abandoned, and a connection whose peer
//! vanished without a FIN or RST (a firewall or NAT dropping its state, a failover behind
//! one address) would time out forever. So after an outage the breaker's first probe runs
//! on a freshly built connection: recovery never depends on the old one coming back.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::RedisError;

use super::breaker::Breaker;
use super::redis::{bounded, map_redis_error};
use super::StoreError;

/// Reconnect attempts per connection loss. Each attempt is bounded by the connection
/// timeout; requests meanwhile fail on their own deadline.
const RECONNECT_RETRIES: usize = 3;

/// A shared, breaker-guarded, deadline-bounded Redis connection.
pub struct RedisLink {
    client: redis::Client,
    config: ConnectionManagerConfig,
    conn: ArcSwap<ConnectionManager>,
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
    /// Connects to `url` within `startup_ms`. `timeout_ms` bounds every later call and each
    /// connection attempt.
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
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(RECONNECT_RETRIES);
        let conn = tokio::time::timeout(
            Duration::from_millis(startup_ms),
            ConnectionManager::new_with_config(client.clone(), config.clone()),
        )
        .await
        .map_err(|_| StoreError::Timeout(startup_ms))?
        .map_err(|e| map_redis_error(e, timeout_ms))?;
        Ok(Arc::new(RedisLink {
            client,
            config,
            conn: ArcSwap::from_pointee(conn),
            breaker,
            timeout_ms,
            reconnecting: tokio::sync::Mutex::new(()),
        }))
    }

    /// The deadline of one call, ms.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// The breaker every call goes through.
    pub fn breaker(&self) -> &Arc<Breaker> {
        &self.breaker
    }

    /// The connection as it is, bypassing the breaker (start-up script loading).
    pub fn raw(&self) -> ConnectionManager {
        ConnectionManager::clone(&self.conn.load())
    }

    /// A connection for one call: refused at once while the breaker is open; the first
    /// probe after an outage builds a fresh connection first.
    pub async fn conn(&self) -> Result<ConnectionManager, StoreError> {
        self.breaker.permit()?;
        if self.breaker.take_probe() {
            let _one = self.reconnecting.lock().await;
            let fresh = bounded(
                self.timeout_ms,
                ConnectionManager::new_with_config(self.client.clone(), self.config.clone()),
            )
            .await;
            self.breaker.record(&fresh);
            self.conn.store(Arc::new(fresh?));
        }
        Ok(self.raw())
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
