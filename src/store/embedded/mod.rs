//! The embedded window store: one node, no Redis. The same algorithms as the Lua scripts
//! (see `window`), in memory, mirrored to sled under `data_dir` so a restart keeps every
//! window.
//!
//! Concurrency: keys are spread over [`SHARDS`] mutex-guarded maps. A check locks the
//! shards of all its keys (request record, idempotency key, every limit) in ascending
//! order — no global lock, no deadlock — and evaluates and records them while holding
//! them, so a check is atomic against every other op on the same keys, as one EVALSHA is
//! on Redis. Checks on unrelated entities rarely share a shard and run in parallel.
//!
//! Durability: every change goes into one sled batch applied before the locks are
//! released; memory is changed only once the batch is accepted. sled writes its log to
//! disk every [`FLUSH_EVERY_MS`], so a `kill -9` loses at most that much; a clean shutdown
//! calls [`EmbeddedStore::flush`] and loses nothing.
//!
//! Reclaiming: an expired entry is absent to every reader (as in Redis) and is removed
//! from memory and sled by the next check that touches its key or by [`EmbeddedStore::reap`],
//! which a background thread runs every second. Memory and disk follow the live windows.
//!
//! Time: the injected [`Clock`] (the process clock in production; a manual one in tests).

mod entry;
mod persist;
pub mod window;

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    CheckOp, CheckOutcome, LimitOp, LimitState, RefundOp, StoreError, WindowStore, EXPIRY_MARGIN_MS,
};
use crate::clock::Clock;
use crate::rules::Algorithm;
use entry::{Entry, Tag};
use window::{Bucket, Fixed, LimitEval, Sliding};

/// Number of independently locked maps.
pub const SHARDS: usize = 64;
/// sled's background flush interval: the most a `kill -9` can lose.
pub const FLUSH_EVERY_MS: u64 = 200;
/// How often the reaper thread reclaims expired entries.
pub const REAP_EVERY: Duration = Duration::from_secs(1);

type Shard = HashMap<String, Entry>;

/// Sizes, for tests and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedStats {
    /// Keys held in memory (live or not yet reaped).
    pub keys: usize,
    /// Sliding members plus one per other key.
    pub weight: usize,
    /// Entries in sled.
    pub persisted: usize,
    /// sled's own figure for its files.
    pub disk_bytes: u64,
}

/// One key, for inspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyInfo {
    /// Sliding members, or 1.
    pub weight: usize,
    pub ttl_ms: u64,
}

/// The embedded [`WindowStore`].
pub struct EmbeddedStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    db: sled::Db,
    tree: sled::Tree,
    clock: Arc<dyn Clock>,
    /// Dropping it stops the reaper thread.
    reaper_stop: Mutex<Option<mpsc::Sender<()>>>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("shards", &self.shards.len())
            .finish()
    }
}

fn sled_err(e: sled::Error) -> StoreError {
    StoreError::Unavailable(format!("embedded store (sled): {e}"))
}

/// The shards one operation holds, locked in ascending order.
struct Locked<'a> {
    guards: Vec<(usize, MutexGuard<'a, Shard>)>,
    store: &'a EmbeddedStore,
}

impl Locked<'_> {
    fn shard(&mut self, key: &str) -> &mut Shard {
        let i = self.store.shard_of(key);
        let pos = self.guards.iter().position(|(s, _)| *s == i).unwrap_or(0);
        &mut self.guards[pos].1
    }

    /// The live entry under `key`; an expired one is removed (and unpersisted in `batch`).
    fn live(&mut self, key: &str, now: u64, batch: &mut sled::Batch) -> Option<&mut Entry> {
        let shard = self.shard(key);
        if shard.get(key).is_some_and(|e| !e.is_live(now)) {
            if let Some(old) = shard.remove(key) {
                persist::delete(batch, key, &old);
            }
        }
        shard.get_mut(key)
    }
}

/// One write decided in phase 1, made in memory once sled accepted it.
enum Write {
    Member { key: String, retain: u64 },
    Put { key: String, entry: Entry },
}

impl EmbeddedStore {
    /// Opens (or creates) the store under `dir` and reads every live window back.
    pub fn open(dir: &Path, clock: Arc<dyn Clock>) -> Result<Arc<EmbeddedStore>, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Unavailable(format!("embedded store: create {}: {e}", dir.display()))
        })?;
        let db = sled::Config::new()
            .path(dir)
            // sled's default cache is 1 GiB; windows are held in memory already.
            .cache_capacity(32 * 1024 * 1024)
            .flush_every_ms(Some(FLUSH_EVERY_MS))
            .open()
            .map_err(|e| {
                StoreError::Unavailable(format!("embedded store: open {}: {e}", dir.display()))
            })?;
        let tree = db.open_tree("windows").map_err(sled_err)?;
        let loaded = persist::load(&tree, clock.now_ms()).map_err(sled_err)?;
        let mut stale = sled::Batch::default();
        for k in loaded.stale {
            stale.remove(k);
        }
        tree.apply_batch(stale).map_err(sled_err)?;
        let store = EmbeddedStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            db,
            tree,
            clock,
            reaper_stop: Mutex::new(None),
        };
        for (key, entry) in loaded.entries {
            let i = store.shard_of(&key);
            lock(&store.shards[i]).insert(key, entry);
        }
        Ok(Arc::new(store))
    }

    /// Starts the background reaper (every [`REAP_EVERY`]); it stops when the store is
    /// dropped.
    pub fn start_reaper(self: &Arc<Self>) {
        let (tx, rx) = mpsc::channel::<()>();
        *lock(&self.reaper_stop) = Some(tx);
        let weak: Weak<EmbeddedStore> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("vigia-reaper".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(REAP_EVERY) {
                    let Some(store) = weak.upgrade() else { return };
                    if let Err(e) = store.reap() {
                        tracing::warn!(error = %e, "embedded store: reaping failed");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "embedded store: no reaper thread; expired keys are reclaimed on access only");
        }
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) % SHARDS as u64) as usize
    }

    fn lock_keys<'a>(&'a self, keys: &[&str]) -> Locked<'a> {
        let mut idx: Vec<usize> = keys.iter().map(|k| self.shard_of(k)).collect();
        idx.sort_unstable();
        idx.dedup();
        Locked {
            guards: idx
                .into_iter()
                .map(|i| (i, lock(&self.shards[i])))
                .collect(),
            store: self,
        }
    }

    /// Removes every expired entry from memory and sled; returns how many.
    pub fn reap(&self) -> Result<usize, StoreError> {
        let now = self.clock.now_ms();
        let mut reaped = 0;
        for shard in self.shards.iter() {
            let mut map = lock(shard);
            let expired: Vec<String> = map
                .iter()
                .filter(|(_, e)| !e.is_live(now))
                .map(|(k, _)| k.clone())
                .collect();
            if expired.is_empty() {
                continue;
            }
            let mut batch = sled::Batch::default();
            for k in &expired {
                if let Some(e) = map.get(k) {
                    persist::delete(&mut batch, k, e);
                }
            }
            // Memory follows sled: drop only what sled dropped.
            self.tree.apply_batch(batch).map_err(sled_err)?;
            for k in &expired {
                map.remove(k);
            }
            reaped += expired.len();
            if map.capacity() > 64 && map.len() < map.capacity() / 4 {
                map.shrink_to_fit();
            }
        }
        Ok(reaped)
    }

    /// Writes everything to disk (clean shutdown).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(sled_err)
    }

    /// One live key as it stands: members held (1 for non-sliding keys) and ms to expiry.
    pub fn inspect(&self, key: &str) -> Option<KeyInfo> {
        let now = self.clock.now_ms();
        let map = lock(&self.shards[self.shard_of(key)]);
        map.get(key).filter(|e| e.is_live(now)).map(|e| KeyInfo {
            weight: e.weight(),
            ttl_ms: e.expires_at() - now,
        })
    }

    /// Every live key, sorted.
    pub fn keys(&self) -> Vec<String> {
        let now = self.clock.now_ms();
        let mut keys: Vec<String> = self
            .shards
            .iter()
            .flat_map(|s| {
                lock(s)
                    .iter()
                    .filter(|(_, e)| e.is_live(now))
                    .map(|(k, _)| k.clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        keys.sort();
        keys
    }

    /// Current sizes.
    pub fn stats(&self) -> EmbeddedStats {
        let (mut keys, mut weight) = (0, 0);
        for shard in self.shards.iter() {
            let map = lock(shard);
            keys += map.len();
            weight += map.values().map(Entry::weight).sum::<usize>();
        }
        EmbeddedStats {
            keys,
            weight,
            persisted: self.tree.len(),
            disk_bytes: self.db.size_on_disk().unwrap_or(0),
        }
    }

    fn check_now(&self, op: &CheckOp) -> Result<CheckOutcome, StoreError> {
        let now = self.clock.now_ms();
        let mut keys: Vec<&str> = vec![&op.record_key];
        keys.extend(op.idempotency_key.as_deref());
        keys.extend(op.limits.iter().map(|l| l.key.as_str()));
        let mut locked = self.lock_keys(&keys);
        let mut batch = sled::Batch::default();

        // The same request id twice counts once; the same idempotency key names the first.
        if locked.live(&op.record_key, now, &mut batch).is_some() {
            self.apply(batch)?;
            return Ok(CheckOutcome::Duplicate {
                of: op.request_id.clone(),
            });
        }
        if let Some(idem) = &op.idempotency_key {
            if let Some(Entry::Idem { request_id, .. }) = locked.live(idem, now, &mut batch) {
                let of = request_id.clone();
                self.apply(batch)?;
                return Ok(CheckOutcome::Duplicate { of });
            }
        }

        // Phase 1: trim and evaluate every limit; nothing that changes a count.
        let mut evals = Vec::with_capacity(op.limits.len());
        for l in &op.limits {
            evals.push(evaluate(&mut locked, l, now, op.dry_run, &mut batch));
        }
        let states = |after: bool| -> Vec<LimitState> {
            evals
                .iter()
                .map(|e| {
                    let mut s = e.state;
                    if after {
                        s.count = e.after;
                    }
                    s
                })
                .collect()
        };
        if evals.iter().any(|e| e.state.exceeded) {
            self.apply(batch)?;
            return Ok(CheckOutcome::Denied {
                limits: states(false),
            });
        }
        if op.dry_run {
            return Ok(CheckOutcome::Allowed {
                limits: states(true),
            });
        }

        // Phase 2: decide every write, persist them, then make them in memory.
        let writes = plan(&mut locked, op, now, &evals, &mut batch);
        self.apply(batch)?;
        for w in writes {
            match w {
                Write::Member { key, retain } => {
                    let shard = locked.shard(&key);
                    let e = shard.entry(key).or_insert_with(|| Entry::Sliding {
                        set: Sliding::default(),
                        retain,
                        expires_at: 0,
                    });
                    if let Entry::Sliding {
                        set,
                        retain: r,
                        expires_at,
                    } = e
                    {
                        set.members
                            .insert((now, op.request_id.clone().into_boxed_str()));
                        *r = retain;
                        // The newest member decides how long the key lives.
                        *expires_at = now + retain + EXPIRY_MARGIN_MS;
                    }
                }
                Write::Put { key, entry } => {
                    locked.shard(&key).insert(key, entry);
                }
            }
        }
        Ok(CheckOutcome::Allowed {
            limits: states(true),
        })
    }

    fn refund_now(&self, op: &RefundOp) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        let mut keys: Vec<&str> = vec![&op.record_key];
        keys.extend(op.keys.iter().map(String::as_str));
        let mut locked = self.lock_keys(&keys);
        let mut batch = sled::Batch::default();
        let Some(Entry::Record { keys: counted, .. }) =
            locked.live(&op.record_key, now, &mut batch).cloned()
        else {
            self.apply(batch)?;
            return Ok(false);
        };
        let mut remaining = counted.clone();
        let mut undo: Vec<(String, Entry)> = Vec::new();
        for key in &op.keys {
            let Some(pos) = remaining.iter().position(|(k, _)| k == key) else {
                continue;
            };
            let (_, tag) = remaining.remove(pos);
            let Some(entry) = locked.live(key, now, &mut batch).cloned() else {
                continue;
            };
            match (tag, entry) {
                (
                    Tag::Sliding,
                    Entry::Sliding {
                        mut set,
                        retain,
                        expires_at,
                    },
                ) => {
                    if set.remove(&op.request_id) {
                        batch.remove(persist::member_key(key, &op.request_id));
                        undo.push((
                            key.clone(),
                            Entry::Sliding {
                                set,
                                retain,
                                expires_at,
                            },
                        ));
                    }
                }
                (
                    Tag::Fixed { start },
                    Entry::Fixed {
                        mut state,
                        expires_at,
                    },
                ) if state.start == start && state.count > 0 => {
                    state.count -= 1;
                    let e = Entry::Fixed { state, expires_at };
                    persist::put(&mut batch, key, &e);
                    undo.push((key.clone(), e));
                }
                (
                    Tag::Bucket,
                    Entry::Bucket {
                        mut state,
                        expires_at,
                    },
                ) => {
                    state.tokens = (state.tokens + 1.0).min(state.cap as f64);
                    let e = Entry::Bucket { state, expires_at };
                    persist::put(&mut batch, key, &e);
                    undo.push((key.clone(), e));
                }
                _ => {}
            }
        }
        if remaining.len() == counted.len() {
            self.apply(batch)?;
            return Ok(false);
        }
        // Undone keys leave the record; the record stays (its id is still a duplicate).
        let expires_at = locked
            .live(&op.record_key, now, &mut batch)
            .map_or(now, |e| e.expires_at());
        let record = Entry::Record {
            keys: remaining,
            expires_at,
        };
        persist::put(&mut batch, &op.record_key, &record);
        self.apply(batch)?;
        locked
            .shard(&op.record_key)
            .insert(op.record_key.clone(), record);
        for (key, e) in undo {
            locked.shard(&key).insert(key, e);
        }
        Ok(true)
    }

    fn apply(&self, batch: sled::Batch) -> Result<(), StoreError> {
        self.tree.apply_batch(batch).map_err(sled_err)
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // A clean drop loses nothing, whoever forgot to flush.
        let _ = self.db.flush();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding a shard; if something did, its data is still whole
    // (memory changes only after sled accepted them), so keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Phase 1 for one limit: trims (unless dry run) and evaluates.
fn evaluate(
    locked: &mut Locked<'_>,
    l: &LimitOp,
    now: u64,
    dry_run: bool,
    batch: &mut sled::Batch,
) -> LimitEval {
    let window = l.window_ms.max(1);
    match l.algorithm {
        Algorithm::SlidingWindow => match locked.live(&l.key, now, batch) {
            Some(Entry::Sliding { set, .. }) => {
                if !dry_run {
                    let retain = l.retain_ms.max(window);
                    for (_, m) in set.trim(now.saturating_sub(retain)) {
                        batch.remove(persist::member_key(&l.key, &m));
                    }
                }
                set.evaluate(now, window, l.max)
            }
            _ => Sliding::default().evaluate(now, window, l.max),
        },
        Algorithm::FixedWindow => {
            let stored = match locked.live(&l.key, now, batch) {
                Some(Entry::Fixed { state, .. }) => Some(*state),
                _ => None,
            };
            Fixed::evaluate(stored.as_ref(), now, window, l.max)
        }
        Algorithm::TokenBucket => {
            let stored = match locked.live(&l.key, now, batch) {
                Some(Entry::Bucket { state, .. }) => Some(*state),
                _ => None,
            };
            let tokens = Bucket::level(stored.as_ref(), now, window, l.max);
            Bucket::evaluate(tokens, window, l.max)
        }
    }
}

/// Phase 2's writes for an allowed check, each also put in `batch`. A key named twice
/// (sliding limits sharing a ZSET) is written once, kept for the longest retain.
fn plan(
    locked: &mut Locked<'_>,
    op: &CheckOp,
    now: u64,
    evals: &[LimitEval],
    batch: &mut sled::Batch,
) -> Vec<Write> {
    let mut writes = Vec::with_capacity(op.limits.len() + 2);
    let mut counted: Vec<(String, Tag)> = Vec::with_capacity(op.limits.len());
    for (l, e) in op.limits.iter().zip(evals) {
        if counted.iter().any(|(k, _)| *k == l.key) {
            continue;
        }
        let window = l.window_ms.max(1);
        match l.algorithm {
            Algorithm::SlidingWindow => {
                let retain = op
                    .limits
                    .iter()
                    .filter(|o| o.key == l.key && o.algorithm == Algorithm::SlidingWindow)
                    .map(|o| o.retain_ms.max(o.window_ms))
                    .max()
                    .unwrap_or(window);
                persist::put_member(batch, &l.key, now, &op.request_id, retain);
                writes.push(Write::Member {
                    key: l.key.clone(),
                    retain,
                });
                counted.push((l.key.clone(), Tag::Sliding));
            }
            Algorithm::FixedWindow => {
                let state = Fixed {
                    start: Fixed::window_start(now, window),
                    count: e.state.count + 1,
                };
                let entry = Entry::Fixed {
                    expires_at: state.expires_at(window),
                    state,
                };
                persist::put(batch, &l.key, &entry);
                writes.push(Write::Put {
                    key: l.key.clone(),
                    entry,
                });
                counted.push((l.key.clone(), Tag::Fixed { start: state.start }));
            }
            Algorithm::TokenBucket => {
                let stored = match locked.shard(&l.key).get(&l.key) {
                    Some(Entry::Bucket { state, .. }) => Some(*state),
                    _ => None,
                };
                let tokens = Bucket::level(stored.as_ref(), now, window, l.max);
                let (state, expires_at) = Bucket::spend(tokens, now, window, l.max);
                let entry = Entry::Bucket { state, expires_at };
                persist::put(batch, &l.key, &entry);
                writes.push(Write::Put {
                    key: l.key.clone(),
                    entry,
                });
                counted.push((l.key.clone(), Tag::Bucket));
            }
        }
    }
    let expires_at = now + op.record_ttl_ms.max(1);
    let record = Entry::Record {
        keys: counted,
        expires_at,
    };
    persist::put(batch, &op.record_key, &record);
    writes.push(Write::Put {
        key: op.record_key.clone(),
        entry: record,
    });
    if let Some(idem) = &op.idempotency_key {
        let entry = Entry::Idem {
            request_id: op.request_id.clone(),
            expires_at,
        };
        persist::put(batch, idem, &entry);
        writes.push(Write::Put {
            key: idem.clone(),
            entry,
        });
    }
    writes
}

#[async_trait]
impl WindowStore for EmbeddedStore {
    async fn check(&self, op: &CheckOp) -> Result<CheckOutcome, StoreError> {
        // Microseconds of work under a few shard locks: no need to leave the worker.
        self.check_now(op)
    }

    async fn refund(&self, op: &RefundOp) -> Result<bool, StoreError> {
        self.refund_now(op)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "embedded"
    }
}
