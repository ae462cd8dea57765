//! Releases on Redis Cluster: what a slot group reserved for a check the node then denied
//! goes back, by request id, off the answer's path.
//!
//! A cluster check runs one script per slot group at once; each group reserves (records
//! the request) only when none of its own limits is full. When another group says no, or
//! fails, the reservations of the groups that said yes are released here: a bounded queue,
//! drained up to [`IN_FLIGHT`] releases at a time, each retried a few times with a growing
//! pause. A release
//! is idempotent (`lua/release.lua` finds the reservation's record or does nothing), so a
//! retry after a lost reply is harmless. A release that is dropped (the queue full, every
//! retry failed) leaves a unit held until its window passes: the limit admits less, never
//! more. Each drop is logged and counted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use tokio::sync::{mpsc, Notify, Semaphore};

use super::redis::tag_arg;
use super::redis_link::RedisLink;
use crate::metrics::Metrics;
use crate::rules::Algorithm;

/// Releases waiting at most; past it a release is dropped (under-admission only).
pub const QUEUE: usize = 16_384;
/// Releases running at once (each one EVALSHA on its group's master, pipelined on the
/// cluster connection).
pub const IN_FLIGHT: usize = 256;
/// Tries per release.
const TRIES: u32 = 5;
/// The pause after the first failed try; doubled after each.
const FIRST_PAUSE_MS: u64 = 20;

/// What one slot group gives back.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    /// The group's records key (the script appends the generation).
    pub records_key: String,
    /// The group's limit keys and their algorithms.
    pub keys: Vec<(String, Algorithm)>,
    pub request_id: String,
    pub record_ttl_ms: u64,
    /// The idempotency field the group wrote (`i:<key>`), if any.
    pub idempotency_field: Option<String>,
    /// `None` reads Redis `TIME`.
    pub now: Option<u64>,
    /// The reservation's stamp (`CheckCall::stamp`): only the record it ends is released.
    pub stamp: u64,
}

/// The queue; what becomes of each release is counted in
/// `vigia_cluster_releases_total{result}`.
#[derive(Debug)]
pub struct Releaser {
    tx: mpsc::Sender<Release>,
    metrics: Metrics,
    /// Releases queued or running, and a wake-up when that falls to zero.
    pending: Arc<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    count: AtomicUsize,
    idle: Notify,
}

impl Pending {
    fn done(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }
}

impl Releaser {
    /// Starts the task that runs releases of `script` (release.lua, loaded by the caller)
    /// on `link`, on the calling runtime.
    pub fn start(link: Arc<RedisLink>, script: Script, metrics: Metrics) -> Releaser {
        let (tx, mut rx) = mpsc::channel::<Release>(QUEUE);
        let task_metrics = metrics.clone();
        let script = Arc::new(script);
        let pending = Arc::new(Pending::default());
        let task_pending = pending.clone();
        tokio::spawn(async move {
            // Up to IN_FLIGHT releases at once: one at a time, a release per round trip,
            // fell behind a few thousand denies a second (benches/cluster.py).
            let slots = Arc::new(Semaphore::new(IN_FLIGHT));
            while let Some(release) = rx.recv().await {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    break;
                };
                let (link, script) = (link.clone(), script.clone());
                let metrics = task_metrics.clone();
                let pending = task_pending.clone();
                tokio::spawn(async move {
                    let result = run(&link, &script, &release).await;
                    metrics.cluster_release(match result {
                        Some(true) => "released",
                        Some(false) => "none",
                        None => "dropped",
                    });
                    drop(permit);
                    pending.done();
                });
            }
        });
        Releaser {
            tx,
            metrics,
            pending,
        }
    }

    /// Waits until every release queued before the call has run (or been dropped): a
    /// check that follows then sees none of the denied checks' reservations.
    pub async fn settled(&self) {
        loop {
            let idle = self.pending.idle.notified();
            tokio::pin!(idle);
            // Registered before the count is read: a release ending in between wakes it.
            idle.as_mut().enable();
            if self.pending.count.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Queues a release; drops it (logged, counted) when the queue is full.
    pub fn release(&self, release: Release) {
        self.pending.count.fetch_add(1, Ordering::AcqRel);
        if let Err(e) = self.tx.try_send(release) {
            self.pending.done();
            self.metrics.cluster_release("dropped");
            let request_id = match &e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => {
                    &r.request_id
                }
            };
            tracing::warn!(
                request_id = %request_id,
                "a cluster reservation could not be queued for release (queue full): it \
                 holds a unit until its window passes"
            );
        }
    }
}

/// Runs one release, retrying: whether it found the reservation, `None` when every try
/// failed.
async fn run(link: &RedisLink, script: &Script, r: &Release) -> Option<bool> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(1 + r.keys.len());
    cmd.arg(&r.records_key);
    for (key, _) in &r.keys {
        cmd.arg(key);
    }
    cmd.arg(&r.request_id).arg(r.record_ttl_ms);
    match r.now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(r.idempotency_field.as_deref().unwrap_or(""));
    cmd.arg(r.stamp);
    for (key, algorithm) in &r.keys {
        cmd.arg(&tag_arg(*algorithm, key)[..]);
    }
    let mut pause = Duration::from_millis(FIRST_PAUSE_MS);
    for attempt in 1..=TRIES {
        match link.eval(script, &cmd).await {
            Ok(reply) => return Some(reply == redis::Value::Int(1)),
            Err(e) if attempt == TRIES => {
                tracing::warn!(
                    request_id = %r.request_id,
                    records_key = %r.records_key,
                    error = %e,
                    "a cluster reservation was not released after {TRIES} tries: it holds a \
                     unit until its window passes"
                );
            }
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
    }
    None
}
