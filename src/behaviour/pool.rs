//! [`Behaviours`]: the handle a check holds to the behaviour actors.
//!
//! `cfg.shards` shards, each holding the signal keys whose `entity_hash(plan.key) %
//! shards` is its index. The shards are started round-robin on `cfg.threads` OS threads,
//! each running its own actix System, so the actors neither need nor disturb the caller's
//! runtime (actix-web's workers, a test's tokio runtime); `start_local` starts them on the
//! caller's System instead. They snapshot into the `signal` tree of one sled db and are
//! restored from it by hash at start, so the shard count may change between runs. The
//! trees of the retired per-device, per-user and per-IP state are dropped on open.
//!
//! # Deadlines and the mailbox bound
//!
//! A check sends one message to each shard holding some of its signals, all concurrently,
//! each bounded by `deadline_ms`. A late or gone shard costs the answer (`Err(Unanswered)`:
//! the caller treats it as the store failing, as it would a Redis that does not answer).
//!
//! actix's mailbox capacity does not bound `send`: when the queue is full, `Addr::send`
//! retries through a fresh clone of the sender, and every clone may queue one message
//! past the capacity. So each shard also has a semaphore of `mailbox` permits, and a
//! check's permit travels *inside* its message: it is released only when the shard has
//! handled the message, or skipped it because the check gave up (actix skips messages
//! whose requester is gone). At most `mailbox` check messages are queued per shard, a
//! stalled shard cannot pile up abandoned ones, and a check that finds the mailbox full
//! waits for a permit within the same deadline (then: `timeout`). The whole wait —
//! permit, queue, answer — is one `tokio::time::timeout`, the only deadline: actix's own
//! `Request::timeout` could not cover the wait for a permit.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use futures::channel::oneshot;
use futures::future::join_all;
use tokio::sync::Semaphore;

use super::shard::{Count, ObserveSignals, Shard, ShardState, SignalAsk, Snapshot, DIMENSION};
use super::signal::{SignalSpec, SignalState};
use crate::clock::Clock;
use crate::config::BehaviourConfig;
use crate::metrics::Metrics;
use crate::signal::entity_hash;
use crate::signal::member_of;
use crate::signal::{SignalPlan, SignalValue};

/// sled's default page cache is 1 GiB; the state lives in the shards' memory already.
const SLED_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// How long a snapshot or count may wait for a shard. Not on the request path: generous,
/// but a wedged shard must not hang shutdown forever.
const CONTROL_DEADLINE: Duration = Duration::from_secs(30);

/// Opens the sled db at `dir` ([`crate::sled_db::open`]: waits while a closed handle's
/// lock is let go).
fn open_db(dir: &Path) -> Result<sled::Db, crate::sled_db::OpenError> {
    crate::sled_db::open(dir, SLED_CACHE_BYTES)
}

/// The trees of the per-device, per-user and per-IP state the shards held before signals
/// replaced it. Nothing reads them any more: a data folder written by an older version
/// drops them on open rather than keep their bytes for ever.
const RETIRED_TREES: [&str; 3] = ["device", "user", "ip"];

/// Drops the [`RETIRED_TREES`] `db` holds, naming them in one log line. A tree that cannot
/// be dropped is left as it is: it costs disk, not correctness, so it does not keep the
/// service down (the next start tries again).
fn drop_retired_trees(db: &sled::Db, path: &Path) {
    let names = db.tree_names();
    let mut dropped = Vec::new();
    for tree in RETIRED_TREES {
        if !names.iter().any(|n| n.as_ref() == tree.as_bytes()) {
            continue;
        }
        match db.drop_tree(tree) {
            Ok(_) => dropped.push(tree),
            Err(error) => tracing::warn!(
                path = %path.display(),
                tree,
                %error,
                "cannot drop a retired behaviour snapshot tree; left as it is"
            ),
        }
    }
    if !dropped.is_empty() {
        tracing::info!(
            path = %path.display(),
            trees = ?dropped,
            "dropped retired behaviour snapshot trees (per-device, per-user and per-IP state, replaced by signals)"
        );
    }
}

/// A signal shard that gave no answer within the deadline (or is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unanswered {
    /// `signal`, the shards' family (the `dimension` label of
    /// `vigia_behaviour_unanswered_total`).
    pub dimension: &'static str,
    /// `timeout` (no answer within the deadline) or `mailbox` (the shard is gone).
    pub reason: &'static str,
}

impl Unanswered {
    fn because(reason: &'static str) -> Self {
        Unanswered {
            dimension: DIMENSION,
            reason,
        }
    }
}

/// What can go wrong starting, snapshotting or stopping the behaviour actors.
#[derive(Debug, thiserror::Error)]
pub enum BehaviourError {
    #[error("behaviour snapshots at {path}: cannot open: {source}")]
    Open {
        path: PathBuf,
        source: crate::sled_db::OpenError,
    },
    #[error("behaviour snapshots at {path}: cannot read tree {tree}: {source}")]
    Read {
        path: PathBuf,
        tree: &'static str,
        source: sled::Error,
    },
    #[error("behaviour snapshots at {path}: cannot write tree {tree}: {source}")]
    Write {
        path: PathBuf,
        tree: &'static str,
        source: sled::Error,
    },
    #[error("behaviour snapshots at {path}: cannot flush: {source}")]
    Flush { path: PathBuf, source: sled::Error },
    #[error("behaviour shard thread: cannot spawn: {0}")]
    Spawn(std::io::Error),
    #[error("behaviour shard thread {0} stopped before it ran")]
    ThreadStart(usize),
    #[error("behaviour shard {shard} gave no snapshot answer ({reason})")]
    Unanswered { shard: usize, reason: &'static str },
    #[error("behaviour actors are shut down")]
    Stopped,
    #[error("behaviour shards hosted locally need the caller to run inside an actix System")]
    NoSystem,
}

/// The behaviour actors: record a check's signals, answer their values.
///
/// Cheap to clone (one `Arc`); every clone drives the same shards. Call
/// [`Behaviours::shutdown`] to keep the last changes: dropping the last clone stops the
/// threads without a final snapshot.
#[derive(Clone)]
pub struct Behaviours {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Vec<Handle>,
    /// Taken at shutdown, so the directory can be opened again while clones live on.
    db: Mutex<Option<sled::Db>>,
    path: PathBuf,
    metrics: Metrics,
    deadline: Duration,
    /// Permits per shard (`cfg.mailbox`).
    mailbox: usize,
    stopped: AtomicBool,
    threads: Mutex<Vec<ShardThread>>,
}

/// One shard as the pool sees it: its address and the permits of its mailbox.
struct Handle {
    addr: Addr<Shard>,
    permits: Arc<Semaphore>,
}

/// One OS thread running an actix System that hosts some shards.
///
/// A System of its own rather than an [`Arbiter`] of the caller's: `Arbiter::new` needs
/// the calling thread to run an actix System, and `start` is called from plain tokio
/// runtimes too (tests, benches, tools). Either way it is one thread with one event loop;
/// the shards are started on it through its arbiter.
struct ShardThread {
    system: System,
    /// Where its shards are started.
    arbiter: ArbiterHandle,
    /// Completes (cancelled) once the thread's System has stopped and its actors, with
    /// their state, are dropped.
    done: oneshot::Receiver<()>,
    handle: JoinHandle<()>,
}

impl ShardThread {
    /// Starts thread `t` and waits until its System runs (with no shard yet).
    fn spawn(t: usize) -> Result<ShardThread, BehaviourError> {
        let (running_tx, running_rx) = std::sync::mpsc::channel();
        let (done_tx, done) = oneshot::channel::<()>();
        let handle = std::thread::Builder::new()
            .name(format!("vigia-behaviour-{t}"))
            .spawn(move || {
                // Declared first, dropped last: after the System and its actors are gone.
                let _done = done_tx;
                let runner = System::new();
                let system = System::current();
                let arbiter = system.arbiter().clone();
                if running_tx.send((system, arbiter)).is_err() {
                    return; // nobody is waiting for this thread any more
                }
                if let Err(error) = runner.run() {
                    tracing::warn!(thread = t, %error, "behaviour shard thread stopped with an error");
                }
            })
            .map_err(BehaviourError::Spawn)?;
        match running_rx.recv() {
            Ok((system, arbiter)) => Ok(ShardThread {
                system,
                arbiter,
                done,
                handle,
            }),
            Err(_) => {
                let _ = handle.join();
                Err(BehaviourError::ThreadStart(t))
            }
        }
    }

    fn stop_all(threads: &[ShardThread]) {
        for t in threads {
            t.system.stop();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        ShardThread::stop_all(&lock(&self.threads));
    }
}

/// A poisoned lock only means another caller panicked mid-way; the data (a list of
/// threads, a db handle) is still what it was.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl std::fmt::Debug for Behaviours {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Behaviours")
            .field("path", &self.inner.path)
            .field("shards", &self.inner.shards.len())
            .field("deadline", &self.inner.deadline)
            .field("mailbox", &self.inner.mailbox)
            .field("stopped", &self.inner.stopped.load(Ordering::Relaxed))
            .finish()
    }
}

fn mailbox_of(cfg: &BehaviourConfig) -> usize {
    cfg.mailbox.clamp(1, Semaphore::MAX_PERMITS)
}

/// `hash % shards`, the one routing rule (restore and ask must agree).
fn shard_of(hash: u64, shards: usize) -> usize {
    (hash % shards.max(1) as u64) as usize
}

/// Reads the signal tree into `shards` shard states. Corrupt entries are skipped (a bad
/// record must not keep the service down); a tree that cannot be read at all is an error.
fn restore(
    tree: &sled::Tree,
    path: &Path,
    shards: usize,
    cap: usize,
    metrics: &Metrics,
) -> Result<Vec<ShardState>, BehaviourError> {
    let mut found: Vec<Vec<(u64, SignalState)>> = (0..shards).map(|_| Vec::new()).collect();
    for item in tree.iter() {
        let (key, value) = item.map_err(|source| BehaviourError::Read {
            path: path.to_path_buf(),
            tree: DIMENSION,
            source,
        })?;
        let Ok(hash) = <[u8; 8]>::try_from(key.as_ref()).map(u64::from_be_bytes) else {
            tracing::warn!(tree = DIMENSION, key = ?key.as_ref(), "skipping behaviour snapshot entry: key is not 8 bytes");
            continue;
        };
        match SignalState::from_bytes(&value) {
            Ok(state) if !state.is_empty() => found[shard_of(hash, shards)].push((hash, state)),
            Ok(_) => {}
            Err(error) => tracing::warn!(
                tree = DIMENSION,
                key = %format_args!("{hash:016x}"),
                %error,
                "skipping corrupt behaviour snapshot entry"
            ),
        }
    }
    Ok(found
        .into_iter()
        .map(|mut entries| {
            entries.sort_by_key(|(_, s)| s.last_seen());
            let mut state = ShardState::new(cap, metrics.clone());
            for (hash, s) in entries {
                state.restore(hash, s);
            }
            state
        })
        .collect())
}

impl Behaviours {
    /// Opens (or creates) the sled db at `dir`, restores every snapshotted signal key into
    /// its shard (by hash, so a different shard count than the run that wrote them is
    /// fine), and starts the shard threads. Needs no runtime of the caller's: each thread
    /// runs its own actix System. Blocks until every thread runs; the shards start on
    /// them at once (a check sent before a shard has started waits in its mailbox).
    pub fn start(
        cfg: &BehaviourConfig,
        dir: &Path,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
    ) -> Result<Behaviours, BehaviourError> {
        let (shards, db) = Self::open(cfg, dir, &clock, &metrics)?;
        // A thread beyond one per shard would host nothing.
        let count = cfg.threads.clamp(1, shards.len().max(1));
        let mut threads: Vec<ShardThread> = Vec::with_capacity(count);
        for t in 0..count {
            match ShardThread::spawn(t) {
                Ok(thread) => threads.push(thread),
                Err(e) => {
                    ShardThread::stop_all(&threads);
                    return Err(e);
                }
            }
        }
        let hosts: Vec<ArbiterHandle> = threads.iter().map(|t| t.arbiter.clone()).collect();
        Ok(Self::assemble(
            cfg, dir, metrics, db, shards, &hosts, threads,
        ))
    }

    /// The same shards, restored the same way, hosted on the calling thread's actix System
    /// instead of threads of their own. For a single-threaded caller that drives every
    /// check itself (`vigia simulate`): a round trip is then a hand-off on one thread, not
    /// a wake-up across threads. The shards run only while the caller's System does.
    pub fn start_local(
        cfg: &BehaviourConfig,
        dir: &Path,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
    ) -> Result<Behaviours, BehaviourError> {
        if System::try_current().is_none() {
            return Err(BehaviourError::NoSystem);
        }
        let (shards, db) = Self::open(cfg, dir, &clock, &metrics)?;
        let here = [Arbiter::current()];
        Ok(Self::assemble(
            cfg,
            dir,
            metrics,
            db,
            shards,
            &here,
            Vec::new(),
        ))
    }

    /// Opens the db and restores every shard, in index order, not started yet.
    fn open(
        cfg: &BehaviourConfig,
        dir: &Path,
        clock: &Arc<dyn Clock>,
        metrics: &Metrics,
    ) -> Result<(Vec<Shard>, sled::Db), BehaviourError> {
        let path = dir.to_path_buf();
        let shards = cfg.shards.max(1);
        let cap = cfg.max_entities.div_ceil(shards).max(1);
        let db = open_db(dir).map_err(|source| BehaviourError::Open {
            path: path.clone(),
            source,
        })?;
        drop_retired_trees(&db, &path);
        let tree = db
            .open_tree(DIMENSION)
            .map_err(|source| BehaviourError::Open {
                path: path.clone(),
                source: source.into(),
            })?;
        let shards = restore(&tree, &path, shards, cap, metrics)?
            .into_iter()
            .map(|state| Shard {
                state,
                tree: tree.clone(),
                clock: clock.clone(),
                mailbox: mailbox_of(cfg),
                snapshot_every: Duration::from_millis(cfg.snapshot_every_ms.max(1)),
            })
            .collect();
        Ok((shards, db))
    }

    /// Starts the shards round-robin on `hosts` and wraps them in the handle.
    fn assemble(
        cfg: &BehaviourConfig,
        dir: &Path,
        metrics: Metrics,
        db: sled::Db,
        shards: Vec<Shard>,
        hosts: &[ArbiterHandle],
        threads: Vec<ShardThread>,
    ) -> Behaviours {
        let mailbox = mailbox_of(cfg);
        let shards = shards
            .into_iter()
            .zip(hosts.iter().cycle())
            .map(|(shard, host)| Handle {
                addr: Shard::start_in_arbiter(host, move |_| shard),
                permits: Arc::new(Semaphore::new(mailbox)),
            })
            .collect();
        Behaviours {
            inner: Arc::new(Inner {
                shards,
                db: Mutex::new(Some(db)),
                path: dir.to_path_buf(),
                metrics,
                deadline: Duration::from_millis(cfg.deadline_ms),
                mailbox,
                stopped: AtomicBool::new(false),
                threads: Mutex::new(threads),
            }),
        }
    }

    /// Observes a check's signals (unless `dry_run`) and answers their values, in plan
    /// order: the embedded side of the decision's signal step (see
    /// [`SignalState::observe`] for the semantics, the same as `lua/decide.lua`'s).
    ///
    /// `applies[i]` is the filter verdict for `plans[i]` (a missing verdict reads as not
    /// applying). Each signal is held by the shard its `key` hashes to; the check sends
    /// one message to each shard it needs, all concurrently, each within `deadline_ms`
    /// (permit, queue and answer together). Err when any shard does not answer within the
    /// deadline (`timeout`) or is gone (`mailbox`, at once after [`Behaviours::shutdown`]):
    /// the caller treats that as the store failing. Shards that did answer have recorded
    /// their signals. No plan, no message. Await it inside a tokio runtime.
    pub async fn signals(
        &self,
        plans: &[SignalPlan],
        applies: &[bool],
        now: u64,
        dry_run: bool,
    ) -> Result<Vec<SignalValue>, Unanswered> {
        debug_assert_eq!(plans.len(), applies.len(), "one verdict per plan");
        if plans.is_empty() {
            return Ok(Vec::new());
        }
        let answered = self.ask_signals(plans, applies, now, dry_run).await;
        if let Err(unanswered) = answered {
            self.inner
                .metrics
                .behaviour_unanswered(unanswered.dimension, unanswered.reason);
        }
        answered
    }

    async fn ask_signals(
        &self,
        plans: &[SignalPlan],
        applies: &[bool],
        now: u64,
        dry_run: bool,
    ) -> Result<Vec<SignalValue>, Unanswered> {
        let shards = &self.inner.shards;
        if self.inner.stopped.load(Ordering::Acquire) || shards.is_empty() {
            return Err(Unanswered::because("mailbox"));
        }
        // Per shard, in order of first use: the plan indexes and what to ask.
        let mut groups: Vec<(usize, Vec<usize>, Vec<SignalAsk>)> = Vec::new();
        for (i, plan) in plans.iter().enumerate() {
            let key = entity_hash(&plan.key);
            let shard = shard_of(key, shards.len());
            let ask = SignalAsk {
                key,
                member: member_of(&plan.member),
                applies: applies.get(i).copied().unwrap_or(false),
                spec: SignalSpec::of(plan),
            };
            match groups.iter_mut().find(|(s, ..)| *s == shard) {
                Some((_, indexes, asks)) => {
                    indexes.push(i);
                    asks.push(ask);
                }
                None => groups.push((shard, vec![i], vec![ask])),
            }
        }
        let deadline = self.inner.deadline;
        let (indexes, asked): (Vec<Vec<usize>>, Vec<_>) = groups
            .into_iter()
            .map(|(shard, indexes, asks)| {
                let handle = &shards[shard];
                (
                    indexes,
                    ask_signal_shard(handle, asks, now, dry_run, deadline),
                )
            })
            .unzip();
        // The first failure ends the wait: the answer is an error whatever the others say.
        let answers = futures::future::try_join_all(asked).await?;
        let mut out: Vec<Option<SignalValue>> = vec![None; plans.len()];
        for (indexes, values) in indexes.into_iter().zip(answers) {
            for (i, value) in indexes.into_iter().zip(values) {
                out[i] = Some(value);
            }
        }
        // A shard answers every ask of its message (`observe_signals` maps one to one),
        // so nothing is missing; were it, the answer would be incomplete: not an answer.
        out.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or(Unanswered::because("mailbox"))
    }

    /// Every shard writes its changed entities to sled (one batch per shard), then the db
    /// is flushed to disk. Returns once all of that is done.
    pub async fn snapshot(&self) -> Result<(), BehaviourError> {
        if self.inner.stopped.load(Ordering::Acquire) {
            return Err(BehaviourError::Stopped);
        }
        self.snapshot_all().await
    }

    async fn snapshot_all(&self) -> Result<(), BehaviourError> {
        self.snapshot_shards().await?;
        let db = lock(&self.inner.db).clone();
        let Some(db) = db else {
            return Err(BehaviourError::Stopped);
        };
        db.flush_async()
            .await
            .map_err(|source| BehaviourError::Flush {
                path: self.inner.path.clone(),
                source,
            })?;
        Ok(())
    }

    async fn snapshot_shards(&self) -> Result<(), BehaviourError> {
        let shards = &self.inner.shards;
        let answers = join_all(shards.iter().map(|s| control(&s.addr, Snapshot))).await;
        for (shard, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Ok(())) => {}
                Ok(Err(source)) => {
                    return Err(BehaviourError::Write {
                        path: self.inner.path.clone(),
                        tree: DIMENSION,
                        source,
                    })
                }
                Err(reason) => return Err(BehaviourError::Unanswered { shard, reason }),
            }
        }
        Ok(())
    }

    /// Takes a last snapshot, then stops the shard threads and waits for them. From here
    /// on [`Behaviours::signals`] answers `Err(Unanswered { reason: "mailbox" })`, at
    /// once. Calling it again does nothing.
    pub async fn shutdown(&self) -> Result<(), BehaviourError> {
        if self.inner.stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Checks are refused first, so nothing is recorded after the last snapshot; checks
        // already waiting for a permit are let go.
        self.inner.shards.iter().for_each(|s| s.permits.close());
        let snapshot = self.snapshot_all().await;
        let threads = std::mem::take(&mut *lock(&self.inner.threads));
        ShardThread::stop_all(&threads);
        for t in threads {
            // Cancelled is the signal: the thread dropped its sender on the way out.
            let _ = t.done.await;
            if t.handle.join().is_err() {
                tracing::warn!("a behaviour shard thread panicked while stopping");
            }
        }
        lock(&self.inner.db).take();
        snapshot
    }

    /// Signal keys currently held (each with what it counts). A shard that does not
    /// answer counts as holding none.
    pub async fn signal_entities(&self) -> usize {
        let shards = &self.inner.shards;
        join_all(shards.iter().map(|s| control(&s.addr, Count)))
            .await
            .into_iter()
            .filter_map(Result::ok)
            .sum()
    }

    /// Read-only inspection, for tests: every signal key's state as the last
    /// [`Behaviours::snapshot`] wrote it, by the [`entity_hash`] of the plan's `key`, in
    /// hash order. Entries a restart would skip (undecodable) are left out.
    pub fn snapshotted_signals(&self) -> Result<Vec<(u64, SignalState)>, BehaviourError> {
        let db = lock(&self.inner.db)
            .clone()
            .ok_or(BehaviourError::Stopped)?;
        let read = |source| BehaviourError::Read {
            path: self.inner.path.clone(),
            tree: DIMENSION,
            source,
        };
        let tree = db.open_tree(DIMENSION).map_err(read)?;
        let mut states = Vec::new();
        for item in tree.iter() {
            let (key, value) = item.map_err(read)?;
            let hash = <[u8; 8]>::try_from(key.as_ref()).map(u64::from_be_bytes);
            if let (Ok(hash), Ok(state)) = (hash, SignalState::from_bytes(&value)) {
                states.push((hash, state));
            }
        }
        Ok(states)
    }
}

/// One signal shard's part of a check. The permit travels in the message (see the module
/// doc); the one deadline is the tokio timeout around permit, queue and answer.
async fn ask_signal_shard(
    shard: &Handle,
    asks: Vec<SignalAsk>,
    now: u64,
    dry_run: bool,
    deadline: Duration,
) -> Result<Vec<SignalValue>, Unanswered> {
    let asked = async {
        // Closed only at shutdown.
        let permit =
            (shard.permits.clone().acquire_owned().await).map_err(|_| MailboxError::Closed)?;
        let msg = ObserveSignals {
            asks,
            now,
            dry_run,
            _permit: permit,
        };
        shard.addr.send(msg).await
    };
    match tokio::time::timeout(deadline, asked).await {
        Ok(Ok(values)) => Ok(values),
        Ok(Err(MailboxError::Closed)) => Err(Unanswered::because("mailbox")),
        // `send` has no timeout of its own: the one deadline is the one above.
        Ok(Err(MailboxError::Timeout)) | Err(_) => Err(Unanswered::because("timeout")),
    }
}

/// Sends a control message (not a check). It needs no permit: control messages are few
/// (one per shard per snapshot or count), and a snapshot must not wait behind checks.
async fn control<A, M>(addr: &Addr<A>, msg: M) -> Result<M::Result, &'static str>
where
    A: Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    match tokio::time::timeout(CONTROL_DEADLINE, addr.send(msg)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(MailboxError::Closed)) => Err("mailbox"),
        Ok(Err(MailboxError::Timeout)) | Err(_) => Err("timeout"),
    }
}

impl Behaviours {
    /// Fault injection, for tests and drills: blocks the thread of every shard for `d`,
    /// without waiting. Checks meanwhile miss their deadline and are decided by their
    /// scene's `on_store_error`, as with a store that does not answer.
    pub fn stall(&self, d: Duration) {
        use super::shard::Stall;
        for s in &self.inner.shards {
            let _ = s.addr.clone().try_send(Stall(d));
        }
    }
}

#[cfg(test)]
impl Behaviours {
    /// Check messages queued in the shards (permits taken).
    pub(crate) fn messages_queued(&self) -> usize {
        (self.inner.shards.iter())
            .map(|s| self.inner.mailbox - s.permits.available_permits())
            .sum()
    }

    /// Waits until every shard has worked through its queue.
    pub(crate) async fn drain(&self) {
        for s in &self.inner.shards {
            let _ = control(&s.addr, Count).await;
        }
    }

    /// Stops the threads as a crash would: no snapshot, no `stopped` flag.
    pub(crate) async fn kill_threads(&self) {
        let threads = std::mem::take(&mut *lock(&self.inner.threads));
        ShardThread::stop_all(&threads);
        for t in threads {
            let _ = t.done.await;
        }
    }

    pub(crate) fn db(&self) -> Option<sled::Db> {
        lock(&self.inner.db).clone()
    }
}

#[cfg(test)]
mod tests;
