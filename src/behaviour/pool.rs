//! [`Behaviours`]: the handle a check holds to the behaviour actors.
//!
//! Four families of shards, `cfg.shards` each: the legacy dimensions (device, user, ip),
//! each entity routed by `entity_hash(id) % shards`, and the signal keys
//! ([`Behaviours::signals`]), each routed by `entity_hash(plan.key) % shards`. The shards
//! are spread round-robin over `cfg.threads` OS threads, each running its own actix
//! System, so the actors neither need nor disturb the caller's runtime (actix-web's
//! workers, a test's tokio runtime). Every family snapshots into its own tree of one sled
//! db (`device`, `user`, `ip`, `signal`) and is restored from it by hash at start, so the
//! shard count may change between runs.
//!
//! # Deadlines and the mailbox bound
//!
//! A check asks its shards concurrently, each bounded by `deadline_ms`. On the legacy
//! path a late or gone shard costs the check that signal, never the answer; on the signal
//! path it costs the answer (`Err(Unanswered)`: the caller treats it as the store failing,
//! as it would a Redis that does not answer). A check sends one message per signal shard
//! it needs, however many of its signals that shard holds.
//!
//! actix's mailbox capacity does not bound `send`: when the queue is full, `Addr::send`
//! retries through a fresh clone of the sender, and every clone may queue one message
//! past the capacity. So each shard also has a semaphore of `mailbox` permits, and a
//! check's permit travels *inside* its message: it is released only when the shard has
//! handled the message, or skipped it because the check gave up (actix skips messages
//! whose requester is gone). At most `mailbox` check messages are queued per shard, a
//! stalled shard cannot pile up abandoned ones, and a check that finds the mailbox full
//! waits for a permit within the same deadline (then: `timeout`). The whole wait —
//! permit, queue, answer — is one `tokio::time::timeout`, the only deadline of the signal
//! path. (The legacy path still wraps actix's own `Request::timeout` inside it, a second
//! deadline that never decides.)

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::dev::ToEnvelope;
use actix::prelude::*;
use futures::channel::oneshot;
use futures::future::join_all;
use tokio::sync::Semaphore;

use super::observe::{Observation, Observed, Unanswered};
use super::shard::{
    Count, Entity, Observe, ObserveSignals, Shard, ShardState, SignalAsk, Snapshot, Stored,
};
use super::signal::{member_of, SignalSpec, SignalState};
use super::state::{entity_hash, DeviceState, IpState, Signals, StateBounds, UserState};
use crate::clock::Clock;
use crate::config::BehaviourConfig;
use crate::decide::{SignalPlan, SignalValue};
use crate::metrics::Metrics;
use crate::rules::Behaviour;

/// sled's default page cache is 1 GiB; the state lives in the shards' memory already.
const SLED_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// How long a snapshot or count may wait for a shard. Not on the request path: generous,
/// but a wedged shard must not hang shutdown forever.
const CONTROL_DEADLINE: Duration = Duration::from_secs(30);

/// How long `start` waits for the directory's lock. sled lets go of it from its background
/// threads, a moment after the last handle is dropped: a start right after a
/// [`Behaviours::shutdown`] in the same process (a restart test, an in-process restart)
/// could otherwise find it still held.
const LOCK_GRACE: Duration = Duration::from_secs(2);

/// Opens the sled db at `dir`, waiting up to [`LOCK_GRACE`] while its lock is held.
fn open_db(dir: &Path) -> Result<sled::Db, sled::Error> {
    let until = Instant::now() + LOCK_GRACE;
    loop {
        let opened = sled::Config::new()
            .path(dir)
            .cache_capacity(SLED_CACHE_BYTES)
            .open();
        match opened {
            // sled (pinned at 0.34.7) reports a held lock only in the message's text.
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock") && Instant::now() < until =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// What can go wrong starting, snapshotting or stopping the behaviour actors.
#[derive(Debug, thiserror::Error)]
pub enum BehaviourError {
    #[error("behaviour snapshots at {path}: cannot open: {source}")]
    Open { path: PathBuf, source: sled::Error },
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
    #[error("behaviour shard thread {0} stopped before its shards started")]
    ThreadStart(usize),
    #[error("behaviour {dimension} shard {shard} gave no snapshot answer ({reason})")]
    Unanswered {
        dimension: &'static str,
        shard: usize,
        reason: &'static str,
    },
    #[error("behaviour actors are shut down")]
    Stopped,
    #[error("behaviour shards hosted locally need the caller to run inside an actix System")]
    NoSystem,
}

/// The behaviour actors: record a check's relations, answer its behaviour signals.
///
/// Cheap to clone (one `Arc`); every clone drives the same shards. Call
/// [`Behaviours::shutdown`] to keep the last changes: dropping the last clone stops the
/// threads without a final snapshot.
#[derive(Clone)]
pub struct Behaviours {
    inner: Arc<Inner>,
}

struct Inner {
    devices: Vec<Handle<DeviceState>>,
    users: Vec<Handle<UserState>>,
    ips: Vec<Handle<IpState>>,
    signals: Vec<Handle<SignalState>>,
    /// Taken at shutdown, so the directory can be opened again while clones live on.
    db: Mutex<Option<sled::Db>>,
    path: PathBuf,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    deadline: Duration,
    /// Permits per shard (`cfg.mailbox`).
    mailbox: usize,
    stopped: AtomicBool,
    threads: Mutex<Vec<ShardThread>>,
}

/// One shard as the pool sees it: its address and the permits of its mailbox.
struct Handle<E: Stored> {
    addr: Addr<Shard<E>>,
    permits: Arc<Semaphore>,
}

fn handles<E: Stored>(addrs: Vec<Addr<Shard<E>>>, mailbox: usize) -> Vec<Handle<E>> {
    addrs
        .into_iter()
        .map(|addr| Handle {
            addr,
            permits: Arc::new(Semaphore::new(mailbox)),
        })
        .collect()
}

/// What one check asks of every shard it needs.
struct Query<'a> {
    now: u64,
    behaviour: &'a Behaviour,
    bounds: StateBounds,
    dry_run: bool,
}

/// One OS thread running an actix System that hosts some shards.
struct ShardThread {
    system: System,
    /// Completes (cancelled) once the thread's System has stopped and its actors, with
    /// their state, are dropped.
    done: oneshot::Receiver<()>,
    handle: JoinHandle<()>,
}

impl ShardThread {
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
            .field("shards", &self.inner.devices.len())
            .field("deadline", &self.inner.deadline)
            .field("mailbox", &self.inner.mailbox)
            .field("stopped", &self.inner.stopped.load(Ordering::Relaxed))
            .finish()
    }
}

fn mailbox_of(cfg: &BehaviourConfig) -> usize {
    cfg.mailbox.clamp(1, Semaphore::MAX_PERMITS)
}

/// `hash % shards`, the one routing rule (restore and observe must agree).
fn shard_of(hash: u64, shards: usize) -> usize {
    (hash % shards.max(1) as u64) as usize
}

/// The shards one thread hosts, by their index in their family.
#[derive(Default)]
struct ThreadShards {
    devices: Vec<(usize, Shard<DeviceState>)>,
    users: Vec<(usize, Shard<UserState>)>,
    ips: Vec<(usize, Shard<IpState>)>,
    signals: Vec<(usize, Shard<SignalState>)>,
}

impl ThreadShards {
    /// Starts them on the current actix System.
    fn start(self) -> Started {
        Started {
            devices: start_all(self.devices),
            users: start_all(self.users),
            ips: start_all(self.ips),
            signals: start_all(self.signals),
        }
    }
}

/// The addresses of one host's shards, by their index in their family.
struct Started {
    devices: Vec<(usize, Addr<Shard<DeviceState>>)>,
    users: Vec<(usize, Addr<Shard<UserState>>)>,
    ips: Vec<(usize, Addr<Shard<IpState>>)>,
    signals: Vec<(usize, Addr<Shard<SignalState>>)>,
}

/// Every shard's address, in index order, as hosts report them.
struct Slots {
    devices: Vec<Option<Addr<Shard<DeviceState>>>>,
    users: Vec<Option<Addr<Shard<UserState>>>>,
    ips: Vec<Option<Addr<Shard<IpState>>>>,
    signals: Vec<Option<Addr<Shard<SignalState>>>>,
}

/// Every shard's address, in index order.
struct Addrs {
    devices: Vec<Addr<Shard<DeviceState>>>,
    users: Vec<Addr<Shard<UserState>>>,
    ips: Vec<Addr<Shard<IpState>>>,
    signals: Vec<Addr<Shard<SignalState>>>,
}

impl Slots {
    fn new(shards: usize) -> Self {
        Slots {
            devices: vec![None; shards],
            users: vec![None; shards],
            ips: vec![None; shards],
            signals: vec![None; shards],
        }
    }

    fn place(&mut self, started: Started) {
        place(&mut self.devices, started.devices);
        place(&mut self.users, started.users);
        place(&mut self.ips, started.ips);
        place(&mut self.signals, started.signals);
    }

    /// `None` if some index was not reported.
    fn complete(self) -> Option<Addrs> {
        Some(Addrs {
            devices: all(self.devices)?,
            users: all(self.users)?,
            ips: all(self.ips)?,
            signals: all(self.signals)?,
        })
    }
}

fn start_all<E: Stored>(shards: Vec<(usize, Shard<E>)>) -> Vec<(usize, Addr<Shard<E>>)> {
    shards.into_iter().map(|(i, s)| (i, s.start())).collect()
}

/// Reads a dimension's tree into `shards` shard states. Corrupt entries are skipped (a
/// bad record must not keep the service down); a tree that cannot be read at all is an
/// error.
fn restore<E: Stored>(
    tree: &sled::Tree,
    path: &Path,
    shards: usize,
    cap: usize,
    metrics: &Metrics,
) -> Result<Vec<ShardState<E>>, BehaviourError> {
    let mut found: Vec<Vec<(u64, E)>> = (0..shards).map(|_| Vec::new()).collect();
    for item in tree.iter() {
        let (key, value) = item.map_err(|source| BehaviourError::Read {
            path: path.to_path_buf(),
            tree: E::DIMENSION,
            source,
        })?;
        let Ok(hash) = <[u8; 8]>::try_from(key.as_ref()).map(u64::from_be_bytes) else {
            tracing::warn!(tree = E::DIMENSION, key = ?key.as_ref(), "skipping behaviour snapshot entry: key is not 8 bytes");
            continue;
        };
        match E::from_bytes(&value) {
            Ok(state) if !state.is_empty() => found[shard_of(hash, shards)].push((hash, state)),
            Ok(_) => {}
            Err(error) => tracing::warn!(
                tree = E::DIMENSION,
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

/// What every shard of a pool shares.
struct Settings {
    clock: Arc<dyn Clock>,
    mailbox: usize,
    snapshot_every: Duration,
}

impl Settings {
    fn shard<E: Stored>(&self, state: ShardState<E>, tree: &sled::Tree) -> Shard<E> {
        Shard {
            state,
            tree: tree.clone(),
            clock: self.clock.clone(),
            mailbox: self.mailbox,
            snapshot_every: self.snapshot_every,
        }
    }
}

fn all<T>(slots: Vec<Option<T>>) -> Option<Vec<T>> {
    slots.into_iter().collect()
}

fn place<E: Stored>(slots: &mut [Option<Addr<Shard<E>>>], started: Vec<(usize, Addr<Shard<E>>)>) {
    for (i, addr) in started {
        if let Some(slot) = slots.get_mut(i) {
            *slot = Some(addr);
        }
    }
}

impl Behaviours {
    /// Opens (or creates) the sled db at `dir`, restores every snapshotted entity into its
    /// shard (by hash, so a different shard count than the run that wrote them is fine),
    /// and starts the shard threads. Needs no runtime of the caller's: each thread runs
    /// its own actix System. Blocks until every shard has started.
    pub fn start(
        cfg: &BehaviourConfig,
        dir: &Path,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
    ) -> Result<Behaviours, BehaviourError> {
        let shards = cfg.shards.max(1);
        // A thread beyond one per shard would host nothing.
        let threads = cfg.threads.clamp(1, FAMILIES * shards);
        let (plan, db) = Self::plan(cfg, dir, threads, &clock, &metrics)?;
        let mut running: Vec<ShardThread> = Vec::with_capacity(threads);
        let mut slots = Slots::new(shards);
        for (t, hosted) in plan.into_iter().enumerate() {
            match spawn_thread(t, hosted) {
                Ok((thread, started)) => {
                    running.push(thread);
                    slots.place(started);
                }
                Err(e) => {
                    ShardThread::stop_all(&running);
                    return Err(e);
                }
            }
        }
        let Some(addrs) = slots.complete() else {
            // Every index was planned on some thread that reported back; unreachable
            // unless the plan is wrong, and then refusing to start is the honest answer.
            ShardThread::stop_all(&running);
            return Err(BehaviourError::ThreadStart(threads));
        };
        Ok(Self::assemble(cfg, dir, clock, metrics, db, addrs, running))
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
        let (plan, db) = Self::plan(cfg, dir, 1, &clock, &metrics)?;
        let mut slots = Slots::new(cfg.shards.max(1));
        for hosted in plan {
            slots.place(hosted.start());
        }
        let Some(addrs) = slots.complete() else {
            return Err(BehaviourError::ThreadStart(0));
        };
        Ok(Self::assemble(
            cfg,
            dir,
            clock,
            metrics,
            db,
            addrs,
            Vec::new(),
        ))
    }

    /// Opens the db and restores every shard's state, spread over `threads` hosts.
    fn plan(
        cfg: &BehaviourConfig,
        dir: &Path,
        threads: usize,
        clock: &Arc<dyn Clock>,
        metrics: &Metrics,
    ) -> Result<(Vec<ThreadShards>, sled::Db), BehaviourError> {
        let path = dir.to_path_buf();
        let shards = cfg.shards.max(1);
        let cap = cfg.max_entities.div_ceil(shards).max(1);
        let db = open_db(dir).map_err(|source| BehaviourError::Open {
            path: path.clone(),
            source,
        })?;
        let open = |name: &'static str| {
            db.open_tree(name).map_err(|source| BehaviourError::Open {
                path: path.clone(),
                source,
            })
        };
        let trees = (
            open(DeviceState::DIMENSION)?,
            open(UserState::DIMENSION)?,
            open(IpState::DIMENSION)?,
            open(SignalState::DIMENSION)?,
        );
        let settings = Settings {
            clock: clock.clone(),
            mailbox: mailbox_of(cfg),
            snapshot_every: Duration::from_millis(cfg.snapshot_every_ms.max(1)),
        };
        let mut plan: Vec<ThreadShards> = (0..threads).map(|_| ThreadShards::default()).collect();
        let mut next = 0usize;
        let mut thread_of = || {
            let t = next % threads;
            next += 1;
            t
        };
        let restored = restore::<DeviceState>(&trees.0, &path, shards, cap, metrics)?;
        for (i, state) in restored.into_iter().enumerate() {
            plan[thread_of()]
                .devices
                .push((i, settings.shard(state, &trees.0)));
        }
        let restored = restore::<UserState>(&trees.1, &path, shards, cap, metrics)?;
        for (i, state) in restored.into_iter().enumerate() {
            plan[thread_of()]
                .users
                .push((i, settings.shard(state, &trees.1)));
        }
        let restored = restore::<IpState>(&trees.2, &path, shards, cap, metrics)?;
        for (i, state) in restored.into_iter().enumerate() {
            plan[thread_of()]
                .ips
                .push((i, settings.shard(state, &trees.2)));
        }
        let restored = restore::<SignalState>(&trees.3, &path, shards, cap, metrics)?;
        for (i, state) in restored.into_iter().enumerate() {
            plan[thread_of()]
                .signals
                .push((i, settings.shard(state, &trees.3)));
        }
        Ok((plan, db))
    }

    fn assemble(
        cfg: &BehaviourConfig,
        dir: &Path,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        db: sled::Db,
        addrs: Addrs,
        threads: Vec<ShardThread>,
    ) -> Behaviours {
        let mailbox = mailbox_of(cfg);
        Behaviours {
            inner: Arc::new(Inner {
                devices: handles(addrs.devices, mailbox),
                users: handles(addrs.users, mailbox),
                ips: handles(addrs.ips, mailbox),
                signals: handles(addrs.signals, mailbox),
                db: Mutex::new(Some(db)),
                path: dir.to_path_buf(),
                clock,
                metrics,
                deadline: Duration::from_millis(cfg.deadline_ms),
                mailbox,
                stopped: AtomicBool::new(false),
                threads: Mutex::new(threads),
            }),
        }
    }

    /// Records the observation in the shards it concerns (unless `dry_run`) and answers
    /// the scene's signals, the current request included. Shards are asked concurrently,
    /// each within `deadline_ms`; a shard that does not answer in time leaves its signals
    /// `None` and is listed in `unanswered`. A scene without `[behaviour]` signals, or a
    /// check without the ids they need, sends no message at all. Await it inside a tokio
    /// runtime (actix-web's is one): the deadline is a tokio timer.
    pub async fn observe(&self, obs: Observation<'_>) -> Observed {
        let b = obs.behaviour;
        let user = obs.user.map(entity_hash);
        let device = obs.device.map(entity_hash);
        let ip = obs.ip.map(entity_hash);
        let pair = |entity: Option<u64>, other: Option<u64>, wanted: bool| match (entity, other) {
            (Some(e), Some(o)) if wanted => Some((e, o)),
            _ => None,
        };
        // The device shard records the user on the device; the user shard the device on
        // the user; the ip shard the user behind the ip.
        let ask_device = pair(
            device,
            user,
            b.accounts_per_device.is_some() || b.account_switches.is_some(),
        );
        let ask_user = pair(user, device, b.devices_per_user.is_some());
        let ask_ip = pair(ip, user, b.accounts_per_ip.is_some());
        if ask_device.is_none() && ask_user.is_none() && ask_ip.is_none() {
            return Observed::default();
        }
        let query = Query {
            now: self.inner.clock.now_ms(),
            behaviour: b,
            bounds: obs.bounds,
            dry_run: obs.dry_run,
        };
        let (d, u, i) = futures::join!(
            self.ask(&self.inner.devices, ask_device, &query),
            self.ask(&self.inner.users, ask_user, &query),
            self.ask(&self.inner.ips, ask_ip, &query),
        );
        let mut out = Observed::default();
        for answer in [d, u, i].into_iter().flatten() {
            match answer {
                Ok(signals) => out.signals = out.signals.merge(signals),
                Err(unanswered) => {
                    self.inner
                        .metrics
                        .behaviour_unanswered(unanswered.dimension, unanswered.reason);
                    out.unanswered.push(unanswered);
                }
            }
        }
        out
    }

    async fn ask<E: Entity>(
        &self,
        shards: &[Handle<E>],
        pair: Option<(u64, u64)>,
        query: &Query<'_>,
    ) -> Option<Result<Signals, Unanswered>> {
        let (entity, other) = pair?;
        let unanswered = |reason| Unanswered {
            dimension: E::DIMENSION,
            reason,
        };
        if self.inner.stopped.load(Ordering::Acquire) {
            return Some(Err(unanswered("mailbox")));
        }
        let Some(shard) = shards.get(shard_of(entity, shards.len())) else {
            return Some(Err(unanswered("mailbox")));
        };
        let deadline = self.inner.deadline;
        let asked = async {
            // Closed only at shutdown.
            let permit =
                (shard.permits.clone().acquire_owned().await).map_err(|_| MailboxError::Closed)?;
            let msg = Observe {
                entity,
                other,
                now: query.now,
                behaviour: query.behaviour.clone(),
                bounds: query.bounds,
                dry_run: query.dry_run,
                _permit: permit,
            };
            shard.addr.send(msg).timeout(deadline).await
        };
        Some(match tokio::time::timeout(deadline, asked).await {
            Ok(Ok(signals)) => Ok(signals),
            Ok(Err(MailboxError::Closed)) => Err(unanswered("mailbox")),
            Ok(Err(MailboxError::Timeout)) | Err(_) => Err(unanswered("timeout")),
        })
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
        let shards = &self.inner.signals;
        if self.inner.stopped.load(Ordering::Acquire) || shards.is_empty() {
            return Err(signal_unanswered("mailbox"));
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
            .ok_or(signal_unanswered("mailbox"))
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
        let (d, u, i, s) = futures::join!(
            self.snapshot_shards(&self.inner.devices),
            self.snapshot_shards(&self.inner.users),
            self.snapshot_shards(&self.inner.ips),
            self.snapshot_shards(&self.inner.signals),
        );
        d.and(u).and(i).and(s)?;
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

    async fn snapshot_shards<E: Stored>(&self, shards: &[Handle<E>]) -> Result<(), BehaviourError> {
        let answers = join_all(shards.iter().map(|s| control(&s.addr, Snapshot))).await;
        for (shard, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Ok(())) => {}
                Ok(Err(source)) => {
                    return Err(BehaviourError::Write {
                        path: self.inner.path.clone(),
                        tree: E::DIMENSION,
                        source,
                    })
                }
                Err(reason) => {
                    return Err(BehaviourError::Unanswered {
                        dimension: E::DIMENSION,
                        shard,
                        reason,
                    })
                }
            }
        }
        Ok(())
    }

    /// Takes a last snapshot, then stops the shard threads and waits for them. Checks
    /// observed from here on answer every dimension they need as
    /// `Unanswered { reason: "mailbox" }`, at once, and [`Behaviours::signals`] answers
    /// `Err` with it. Calling it again does nothing.
    pub async fn shutdown(&self) -> Result<(), BehaviourError> {
        if self.inner.stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Checks are refused first, so nothing is recorded after the last snapshot; checks
        // already waiting for a permit are let go.
        let inner = &self.inner;
        let permits = (inner.devices.iter().map(|s| &s.permits))
            .chain(inner.users.iter().map(|s| &s.permits))
            .chain(inner.ips.iter().map(|s| &s.permits))
            .chain(inner.signals.iter().map(|s| &s.permits));
        permits.for_each(|p| p.close());
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

    /// Entities currently held per dimension: (device, user, ip). A shard that does not
    /// answer counts as holding none.
    pub async fn entity_counts(&self) -> (usize, usize, usize) {
        futures::join!(
            count(&self.inner.devices),
            count(&self.inner.users),
            count(&self.inner.ips),
        )
    }

    /// Signal keys currently held (each with what it counts). A shard that does not
    /// answer counts as holding none.
    pub async fn signal_entities(&self) -> usize {
        count(&self.inner.signals).await
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
            tree: SignalState::DIMENSION,
            source,
        };
        let tree = db.open_tree(SignalState::DIMENSION).map_err(read)?;
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

/// Entities held by a family's shards; one that does not answer counts as none.
async fn count<E: Stored>(shards: &[Handle<E>]) -> usize {
    join_all(shards.iter().map(|s| control(&s.addr, Count)))
        .await
        .into_iter()
        .filter_map(Result::ok)
        .sum()
}

/// The shard families: device, user, ip, signal.
const FAMILIES: usize = 4;

fn signal_unanswered(reason: &'static str) -> Unanswered {
    Unanswered {
        dimension: SignalState::DIMENSION,
        reason,
    }
}

/// One signal shard's part of a check. The permit travels in the message (see the module
/// doc); the one deadline is the tokio timeout around permit, queue and answer.
async fn ask_signal_shard(
    shard: &Handle<SignalState>,
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
        Ok(Err(MailboxError::Closed)) => Err(signal_unanswered("mailbox")),
        Ok(Err(MailboxError::Timeout)) | Err(_) => Err(signal_unanswered("timeout")),
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

/// Starts one thread with its own actix System hosting `hosted`, and waits for the
/// shards' addresses.
fn spawn_thread(t: usize, hosted: ThreadShards) -> Result<(ShardThread, Started), BehaviourError> {
    let (addrs_tx, addrs_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let handle = std::thread::Builder::new()
        .name(format!("vigia-behaviour-{t}"))
        .spawn(move || {
            // Declared first, dropped last: after the System and its actors are gone.
            let _done = done_tx;
            let runner = System::new();
            let started = runner.block_on(async move { hosted.start() });
            if addrs_tx.send((System::current(), started)).is_err() {
                return; // start() gave up on this thread
            }
            if let Err(error) = runner.run() {
                tracing::warn!(thread = t, %error, "behaviour shard thread stopped with an error");
            }
        })
        .map_err(BehaviourError::Spawn)?;
    match addrs_rx.recv() {
        Ok((system, started)) => Ok((
            ShardThread {
                system,
                done: done_rx,
                handle,
            },
            started,
        )),
        Err(_) => {
            let _ = handle.join();
            Err(BehaviourError::ThreadStart(t))
        }
    }
}

#[cfg(test)]
impl Behaviours {
    /// Blocks the thread of every shard of `dimension` for `d`, without waiting.
    pub(crate) fn stall(&self, dimension: &str, d: Duration) {
        use super::shard::Stall;
        match dimension {
            "signal" => self.inner.signals.iter().for_each(|s| {
                let _ = s.addr.clone().try_send(Stall(d));
            }),
            "device" => self.inner.devices.iter().for_each(|s| {
                let _ = s.addr.clone().try_send(Stall(d));
            }),
            "user" => self.inner.users.iter().for_each(|s| {
                let _ = s.addr.clone().try_send(Stall(d));
            }),
            _ => self.inner.ips.iter().for_each(|s| {
                let _ = s.addr.clone().try_send(Stall(d));
            }),
        }
    }

    /// Check messages queued in the device shards (permits taken).
    pub(crate) fn device_messages_queued(&self) -> usize {
        (self.inner.devices.iter())
            .map(|s| self.inner.mailbox - s.permits.available_permits())
            .sum()
    }

    /// Check messages queued in the signal shards (permits taken).
    pub(crate) fn signal_messages_queued(&self) -> usize {
        (self.inner.signals.iter())
            .map(|s| self.inner.mailbox - s.permits.available_permits())
            .sum()
    }

    /// Waits until every signal shard has worked through its queue.
    pub(crate) async fn drain_signals(&self) {
        for s in &self.inner.signals {
            let _ = control(&s.addr, Count).await;
        }
    }

    /// Waits until every device shard has worked through its queue.
    pub(crate) async fn drain_devices(&self) {
        for s in &self.inner.devices {
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

#[cfg(test)]
mod signal_tests;
