//! Releases: what one attempt at a check recorded on Redis goes back, by request id, off
//! the answer's path — on one Redis and on a cluster alike.
//!
//! On one Redis, a check whose call failed or timed out was answered without the store
//! (`on_store_error`): its script, already sent, may still run once Redis answers (a stall,
//! a slow log, a fork), and would count a request the caller was told was refused — or,
//! under `local`, one the node's own store already counted. Such an attempt is released
//! once Redis has answered it (its late reply), so the release cannot reach Redis first.
//!
//! A cluster check runs one script per slot group at once; each group reserves (records
//! the request) only when none of its own limits is full. When another group says no, or
//! fails, the reservations of the groups that said yes (or may yet) are released here.
//!
//! Releases wait in a bounded set ([`QUEUE`]), run up to [`IN_FLIGHT`] at a time, each
//! retried a few times with a growing pause. A release is idempotent (`lua/release.lua`
//! finds the attempt's record by its [`Stamp`] or does nothing), so a retry after a lost
//! reply is harmless. A release that is dropped (the queue full, every retry failed)
//! leaves a unit held until its window passes: the limit admits less, never more. Each
//! drop is logged and counted.
//!
//! An allowed cluster check's record in the main group is committed the same way
//! ([`Settle`]): until then a copy of the request is answered "held" (come back shortly),
//! because the reservation it finds may yet be released. A dropped commit leaves copies
//! held until the record expires: never a second grant, but a retry of that allow is not
//! recognised.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use tokio::sync::{mpsc, Notify, Semaphore};

use super::redis::{tag_arg, Stamp};
use super::redis_link::{LateReply, RedisLink};
use super::StoreError;
use crate::metrics::Metrics;
use crate::rules::Algorithm;

/// Releases waiting at most (for a late reply, a permit or a try); past it a release is
/// dropped (under-admission only).
pub const QUEUE: usize = 16_384;
/// Releases running at once (each one EVALSHA on its group's master, pipelined on the
/// cluster connection).
pub const IN_FLIGHT: usize = 256;
/// Tries per release that reach Redis and fail (a timeout, a lost connection).
const TRIES: u32 = 5;
/// The pause after the first failed try; doubled after each, up to [`MAX_PAUSE_MS`].
const FIRST_PAUSE_MS: u64 = 20;
const MAX_PAUSE_MS: u64 = 1_000;
/// How long a release may wait, in all, for the node's breaker to close. An open breaker
/// refuses a call without trying it: counting that as a try dropped most releases of an
/// overloaded run (benches/cluster.py, 6 masters on 2 cores: 0.8 dropped per check), and
/// each drop holds a unit until its window passes, up to a day.
const BREAKER_WAIT_MS: u64 = 30_000;
/// How long a release waits for its attempt's late reply. Past it the call is taken for
/// lost (its connection silent, not closed) and released anyway: should Redis run it
/// later still, it counts one request that was refused.
const LATE_REPLY_MS: u64 = 30_000;

/// What becomes of a reservation once its node has decided the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Denied: give back what the group reserved, forget the record.
    Release,
    /// Allowed: the record stops being a reservation (the main group's only), so a copy
    /// sent later is a repeat of the allow rather than held.
    Commit,
}

impl Settle {
    fn arg(self) -> &'static str {
        match self {
            Settle::Release => "release",
            Settle::Commit => "commit",
        }
    }
}

/// What one attempt (on a cluster, one slot group's part of it) gives back, or commits.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    pub settle: Settle,
    /// The records key (the script appends the generation).
    pub records_key: String,
    /// The limit keys the attempt was sent, and their algorithms.
    pub keys: Vec<(String, Algorithm)>,
    pub request_id: String,
    pub record_ttl_ms: u64,
    /// The idempotency field the attempt wrote (`i:<key>`), if any.
    pub idempotency_field: Option<String>,
    /// `None` reads Redis `TIME`.
    pub now: Option<u64>,
    /// The attempt's stamp (`CheckCall::stamp`): only the record it ends is released.
    pub stamp: Stamp,
}

/// A release, and the late reply of its attempt's call to wait for first, if any.
struct Queued {
    release: Release,
    after: Option<LateReply>,
}

/// The queue; what becomes of each release is counted in
/// `vigia_store_releases_total{result}`.
#[derive(Debug)]
pub struct Releaser {
    tx: mpsc::UnboundedSender<Queued>,
    metrics: Metrics,
    /// Releases queued or running, and a wake-up when that falls to zero.
    pending: Arc<Pending>,
}

#[derive(Debug)]
struct Pending {
    count: AtomicUsize,
    idle: Notify,
    /// `vigia_store_releases_pending` follows `count`.
    metrics: Metrics,
}

impl Pending {
    fn add(&self) -> usize {
        self.metrics.store_releases_pending(1);
        self.count.fetch_add(1, Ordering::AcqRel)
    }

    fn done(&self) {
        self.metrics.store_releases_pending(-1);
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }
}

impl Releaser {
    /// Starts the task that runs releases of `script` (release.lua, loaded by the caller)
    /// on `link`, on the calling runtime.
    pub fn start(link: Arc<RedisLink>, script: Script, metrics: Metrics) -> Releaser {
        // Unbounded as a channel, bounded by `pending` (QUEUE) when a release is queued.
        let (tx, mut rx) = mpsc::unbounded_channel::<Queued>();
        let task_metrics = metrics.clone();
        let script = Arc::new(script);
        let pending = Arc::new(Pending {
            count: AtomicUsize::new(0),
            idle: Notify::new(),
            metrics: metrics.clone(),
        });
        let task_pending = pending.clone();
        tokio::spawn(async move {
            // Up to IN_FLIGHT releases at once: one at a time, a release per round trip,
            // fell behind a few thousand denies a second (benches/cluster.py).
            let slots = Arc::new(Semaphore::new(IN_FLIGHT));
            while let Some(Queued { release, after }) = rx.recv().await {
                let (link, script) = (link.clone(), script.clone());
                let metrics = task_metrics.clone();
                let pending = task_pending.clone();
                let slots = slots.clone();
                tokio::spawn(async move {
                    // The attempt's script may still be on its way to Redis: released
                    // before it ran, it would find nothing and then count.
                    if let Some(late) = after {
                        let waited = tokio::time::timeout(
                            Duration::from_millis(LATE_REPLY_MS),
                            late.arrived(),
                        );
                        if waited.await.is_err() {
                            tracing::warn!(
                                request_id = %release.request_id,
                                "no reply from Redis to a failed check's call after \
                                 {LATE_REPLY_MS} ms: released anyway; should the call still \
                                 run, it counts a refused request"
                            );
                        }
                    }
                    let Ok(permit) = slots.acquire_owned().await else {
                        pending.done();
                        return;
                    };
                    let result = run(&link, &script, &release).await;
                    metrics.store_release(match (result, release.settle) {
                        (Some(true), Settle::Release) => "released",
                        (Some(true), Settle::Commit) => "committed",
                        (Some(false), _) => "none",
                        (None, _) => "dropped",
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
        self.queue(release, None);
    }

    /// Queues the release of an attempt whose call failed: once its late reply has come
    /// (when the call timed out), so that whatever its script recorded is there to find.
    pub fn release_after(&self, late: Option<LateReply>, release: Release) {
        self.queue(release, late);
    }

    fn queue(&self, release: Release, after: Option<LateReply>) {
        let queued = self.pending.add();
        let queued = if queued >= QUEUE {
            Err(("queue full", release))
        } else {
            self.tx
                .send(Queued { release, after })
                .map_err(|e| ("releaser stopped", e.0.release))
        };
        if let Err((why, release)) = queued {
            self.pending.done();
            self.metrics.store_release("dropped");
            tracing::warn!(
                request_id = %release.request_id,
                "a check's record could not be queued for release ({why}): it holds a unit \
                 until its window passes"
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
    cmd.arg(r.stamp.to_string()).arg(r.settle.arg());
    for (key, algorithm) in &r.keys {
        cmd.arg(&tag_arg(*algorithm, key)[..]);
    }
    let mut retry = Retry::default();
    loop {
        match link.eval(script, &cmd).await {
            Ok(reply) => return Some(reply == redis::Value::Int(1)),
            Err(e) => match retry.after(&e) {
                Some(pause) => tokio::time::sleep(pause).await,
                None => {
                    tracing::warn!(
                        request_id = %r.request_id,
                        records_key = %r.records_key,
                        error = %e,
                        "a check's record was not released after {TRIES} tries or \
                         {BREAKER_WAIT_MS} ms: it holds a unit until its window passes"
                    );
                    return None;
                }
            },
        }
    }
}

/// When to try a release again: after a failed try, a pause that doubles; after an open
/// breaker (no try was made), the same pause without using up a try, within
/// [`BREAKER_WAIT_MS`] in all. `None`: give up.
#[derive(Debug)]
struct Retry {
    failed: u32,
    waited_ms: u64,
    pause_ms: u64,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            failed: 0,
            waited_ms: 0,
            pause_ms: FIRST_PAUSE_MS,
        }
    }
}

impl Retry {
    fn after(&mut self, error: &StoreError) -> Option<Duration> {
        if matches!(error, StoreError::CircuitOpen) {
            if self.waited_ms >= BREAKER_WAIT_MS {
                return None;
            }
        } else {
            self.failed += 1;
            if self.failed >= TRIES {
                return None;
            }
        }
        let pause = self.pause_ms;
        self.waited_ms += pause;
        self.pause_ms = (pause * 2).min(MAX_PAUSE_MS);
        Some(Duration::from_millis(pause))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pauses(errors: &[StoreError]) -> Vec<Option<u64>> {
        let mut retry = Retry::default();
        errors
            .iter()
            .map(|e| retry.after(e).map(|d| d.as_millis() as u64))
            .collect()
    }

    #[test]
    fn failed_tries_give_up_after_five_with_doubling_pauses() {
        let timeouts = vec![StoreError::Timeout(50); 5];
        assert_eq!(
            pauses(&timeouts),
            [Some(20), Some(40), Some(80), Some(160), None]
        );
    }

    #[test]
    fn an_open_breaker_is_waited_out_without_using_up_tries() {
        let mut errors = vec![StoreError::CircuitOpen; 10];
        errors.extend(vec![StoreError::Timeout(50); 5]);
        let got = pauses(&errors);
        // Ten refusals: paused through, the pause capped at a second.
        assert!(got[..10].iter().all(Option::is_some), "{got:?}");
        assert_eq!(got[9], Some(MAX_PAUSE_MS));
        // The five real tries still come after them.
        assert_eq!(&got[10..14], &[Some(1000); 4]);
        assert_eq!(got[14], None);
    }

    #[test]
    fn a_breaker_that_stays_open_is_given_up_on_after_the_wait() {
        let mut retry = Retry::default();
        let mut waited = 0;
        while let Some(pause) = retry.after(&StoreError::CircuitOpen) {
            waited += pause.as_millis() as u64;
        }
        assert!(
            (BREAKER_WAIT_MS..BREAKER_WAIT_MS + MAX_PAUSE_MS).contains(&waited),
            "{waited}"
        );
    }
}
