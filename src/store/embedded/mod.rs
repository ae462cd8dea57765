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
//! Durability: the changes of a check are one framed record copied into the journal's
//! buffer (see `journal`) before the locks are released; memory changes only once the
//! journal took the record, and replaying the journal applies the very same ops (see
//! `ops`). A writer thread writes the buffer out every [`journal::WRITE_EVERY_MS`] and
//! syncs it every [`FLUSH_EVERY_MS`] — the file work is never done under a shard lock. A
//! `kill -9` loses at most the last write interval, a power loss the last sync interval;
//! a clean shutdown calls [`EmbeddedStore::flush`] and loses nothing.
//!
//! Reclaiming: an expired entry is absent to every reader (as in Redis) and is dropped
//! from memory by the next check that touches its key or by [`EmbeddedStore::reap`], which
//! a background thread runs every second. When the journal has grown well past the live
//! state, [`EmbeddedStore::compact`] starts a new generation from a snapshot and deletes
//! the old one: memory and disk follow the live windows, not history.
//!
//! Time: the injected [`Clock`] (the process clock in production; a manual one in tests).
//!
//! [`EmbeddedStore::in_memory`] is the same store without the journal: the same locks,
//! algorithms and answers, nothing on disk. `vigia simulate` counts in one — its state is
//! thrown away after the replay, and a journal write per check would be most of its cost.

mod entry;
mod journal;
mod ops;
mod shard;
pub mod window;

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    CheckOp, CheckOutcome, LimitOp, LimitState, RefundOp, Refunded, StoreError, WindowStore,
};
use crate::clock::Clock;
use crate::keys::legacy_record_key;
use crate::rules::Algorithm;
use entry::{Entry, KeyHash, Tag};
use journal::Journal;
use ops::Op;
use shard::{Hashed, Hasher, Shard};
use window::{Bucket, Fixed, LimitEval, Sliding};

/// Number of independently locked maps.
pub const SHARDS: usize = 64;
/// How often the journal is synced to disk: the most a power loss can cost. (A `kill -9`
/// costs at most [`journal::WRITE_EVERY_MS`], since written data outlives the process.)
pub const FLUSH_EVERY_MS: u64 = journal::SYNC_EVERY_MS;
/// How often the reaper thread reclaims expired entries.
pub const REAP_EVERY: Duration = Duration::from_secs(1);
/// A new generation starts once the journal holds this many records and more than twice
/// as many as there are live members: compaction costs about the live state.
pub const COMPACT_AFTER_RECORDS: u64 = 100_000;
/// Snapshot ops per snapshot record.
const SNAPSHOT_CHUNK: usize = 1024;

/// Sizes, for tests and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedStats {
    /// Keys held in memory (live or not yet reaped).
    pub keys: usize,
    /// Sliding members plus one per other key.
    pub weight: usize,
    /// Journal records since the current generation started.
    pub journal_records: u64,
    /// Bytes of every file under the store's folder.
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
    /// Every key's one hash: its shard, and its place in the shard's table.
    hasher: Hasher,
    /// The journal; `None` for a store kept in memory only.
    durable: Option<Durable>,
    clock: Arc<dyn Clock>,
    /// Dropping it stops the reaper thread.
    reaper_stop: Mutex<Option<mpsc::Sender<()>>>,
}

/// Where a durable store journals.
struct Durable {
    root: PathBuf,
    journal: Arc<Journal>,
    /// Wakes the writer thread before its tick (a full buffer); dropping it stops it.
    wake: mpsc::SyncSender<()>,
    /// One compaction at a time.
    compacting: Mutex<()>,
}

impl Durable {
    /// Starts the writer thread of `journal`: a tick every [`journal::WRITE_EVERY_MS`]
    /// or when woken, until the returned sender is dropped.
    fn start(root: &Path, journal: Journal) -> Result<Durable, StoreError> {
        let journal = Arc::new(journal);
        let (wake, woken) = mpsc::sync_channel::<()>(1);
        let writer = journal.clone();
        std::thread::Builder::new()
            .name("vigia-journal".into())
            .spawn(move || {
                let every = Duration::from_millis(journal::WRITE_EVERY_MS);
                let mut failing = false;
                loop {
                    let stop = matches!(
                        woken.recv_timeout(every),
                        Err(mpsc::RecvTimeoutError::Disconnected)
                    );
                    let result = if stop { writer.flush() } else { writer.tick() };
                    match result {
                        Err(e) if !failing => {
                            failing = true;
                            tracing::error!(error = %e, "embedded store: journal write failed; checks that count get on_store_error until it succeeds");
                        }
                        Ok(()) if failing => {
                            failing = false;
                            tracing::info!("embedded store: journal writes again");
                        }
                        _ => {}
                    }
                    if stop {
                        return;
                    }
                }
            })
            .map_err(|e| {
                StoreError::Unavailable(format!("embedded store: journal writer thread: {e}"))
            })?;
        Ok(Durable {
            root: root.to_path_buf(),
            journal,
            wake,
            compacting: Mutex::new(()),
        })
    }
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("EmbeddedStore");
        match &self.durable {
            Some(durable) => d
                .field("root", &durable.root)
                .field("generation", &durable.journal.number()),
            None => d.field("root", &"(in memory)"),
        };
        d.finish()
    }
}

fn journal_err(e: journal::JournalError) -> StoreError {
    StoreError::Unavailable(format!("embedded store journal: {e}"))
}

/// The shards one operation holds, locked in ascending order.
struct Locked<'a> {
    guards: Vec<(usize, MutexGuard<'a, Shard>)>,
    store: &'a EmbeddedStore,
}

impl Locked<'_> {
    fn shard(&mut self, hash: u64) -> &mut Shard {
        let i = shard::shard_of(hash, SHARDS);
        let pos = self.guards.iter().position(|(s, _)| *s == i).unwrap_or(0);
        &mut self.guards[pos].1
    }

    /// The live entry under `k`; an expired one is dropped (replay drops it too).
    fn live(&mut self, k: Hashed<'_>, now: u64) -> Option<&mut Entry> {
        self.shard(k.hash).live(k, now)
    }

    /// Journals `writes` in one record, then applies them to memory.
    fn commit(&mut self, now: u64, writes: Writes) -> Result<(), StoreError> {
        if writes.ops.is_empty() {
            return Ok(());
        }
        if let Some(durable) = &self.store.durable {
            let full = durable
                .journal
                .append(|out| ops::encode_into(now, &writes.ops, out))
                .map_err(journal_err)?;
            if full {
                // The writer may already be awake; one wake-up pending is enough.
                let _ = durable.wake.try_send(());
            }
        }
        for (op, hash) in writes.ops.into_iter().zip(writes.hashes) {
            ops::apply(self.shard(hash), hash, now, op);
        }
        Ok(())
    }
}

/// A check's keys, each hashed once.
struct Keys<'k> {
    record: Hashed<'k>,
    idempotency: Option<Hashed<'k>>,
    /// Parallel to the check's limits.
    limits: Vec<Hashed<'k>>,
}

/// What a check or refund writes: ops, each with its key's hash, so applying them hashes
/// nothing again.
#[derive(Default)]
struct Writes {
    ops: Vec<Op>,
    hashes: Vec<u64>,
}

impl Writes {
    fn with_capacity(n: usize) -> Self {
        Writes {
            ops: Vec::with_capacity(n),
            hashes: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, hash: u64, op: Op) {
        self.hashes.push(hash);
        self.ops.push(op);
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store under `dir`, replays what it held, and starts a fresh
    /// generation from it.
    pub fn open(dir: &Path, clock: Arc<dyn Clock>) -> Result<Arc<EmbeddedStore>, StoreError> {
        let unavailable = |what: String| {
            StoreError::Unavailable(format!("embedded store at {}: {what}", dir.display()))
        };
        let recovered = journal::recover(dir).map_err(|e| unavailable(e.to_string()))?;
        for (file, bytes) in &recovered.dropped {
            tracing::warn!(file = %file.display(), bytes, "embedded store: dropped the torn or damaged tail of a journal (a crash while writing it)");
        }
        let hasher = Hasher::default();
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::new(hasher.clone())).collect();
        let mut damaged = 0;
        for record in &recovered.records {
            match ops::decode(record) {
                Some((now, ops)) => {
                    for op in ops {
                        let k = Hashed::new(&hasher, op.key());
                        let (i, hash) = (k.shard(SHARDS), k.hash);
                        ops::apply(&mut shards[i], hash, now, op);
                    }
                }
                None => damaged += 1,
            }
        }
        if damaged > 0 {
            tracing::warn!(damaged, dir = %dir.display(), "embedded store: skipped damaged journal records");
        }
        let now = clock.now_ms();
        for shard in &mut shards {
            shard.retain(|e| e.is_live(now));
        }
        let journal =
            Journal::create(dir, recovered.next).map_err(|e| unavailable(e.to_string()))?;
        let generation_dir = journal.dir();
        let store = EmbeddedStore {
            shards: shards.into_iter().map(Mutex::new).collect(),
            hasher,
            durable: Some(Durable::start(dir, journal)?),
            clock,
            reaper_stop: Mutex::new(None),
        };
        let snapshot = store.snapshot_records(&store.shards.iter().map(lock).collect::<Vec<_>>());
        journal::complete(&generation_dir, snapshot).map_err(|e| unavailable(e.to_string()))?;
        for old in recovered.old {
            remove_generation(&old);
        }
        Ok(Arc::new(store))
    }

    /// An empty store that keeps nothing on disk: same answers, no journal, nothing
    /// survives the process. For state that is thrown away anyway (`vigia simulate`).
    pub fn in_memory(clock: Arc<dyn Clock>) -> Arc<EmbeddedStore> {
        let hasher = Hasher::default();
        Arc::new(EmbeddedStore {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::new(hasher.clone())))
                .collect(),
            hasher,
            durable: None,
            clock,
            reaper_stop: Mutex::new(None),
        })
    }

    /// Starts the background reaper (every [`REAP_EVERY`]; it also compacts when due). It
    /// stops when the store is dropped.
    pub fn start_reaper(self: &Arc<Self>) {
        let (tx, rx) = mpsc::channel::<()>();
        *lock(&self.reaper_stop) = Some(tx);
        let weak: Weak<EmbeddedStore> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("vigia-reaper".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(REAP_EVERY) {
                    let Some(store) = weak.upgrade() else { return };
                    if let Err(e) = store.maintain() {
                        tracing::warn!(error = %e, "embedded store: maintenance failed");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "embedded store: no reaper thread; expired keys are reclaimed on access only");
        }
    }

    /// Reaps, then compacts if the journal has outgrown the live state.
    pub fn maintain(&self) -> Result<(), StoreError> {
        // One walk of every shard a second, not two: the walk is cache misses over the
        // whole live state, and it holds each shard's lock against checks while it runs.
        let (_, weight) = self.reap_weighing();
        if self.journal_records() > COMPACT_AFTER_RECORDS.max(2 * weight as u64) {
            self.compact()?;
        }
        Ok(())
    }

    /// Journal records since the current generation started (0 in memory only).
    fn journal_records(&self) -> u64 {
        self.durable.as_ref().map_or(0, |d| d.journal.records())
    }

    fn hashed<'k>(&self, key: &'k str) -> Hashed<'k> {
        Hashed::new(&self.hasher, key)
    }

    fn lock_keys<'k>(&self, keys: impl Iterator<Item = Hashed<'k>>) -> Locked<'_> {
        let mut idx: Vec<usize> = keys.map(|k| k.shard(SHARDS)).collect();
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

    /// Drops every expired entry from memory; returns how many. (The journal needs no
    /// record of it: replay drops them by time as well.)
    pub fn reap(&self) -> usize {
        self.reap_weighing().0
    }

    /// [`Self::reap`], also weighing what stays (the [`EmbeddedStats::weight`] of the
    /// live entries) in the same walk.
    fn reap_weighing(&self) -> (usize, usize) {
        let now = self.clock.now_ms();
        let (mut reaped, mut weight) = (0, 0);
        for shard in self.shards.iter() {
            let mut map = lock(shard);
            let before = map.len();
            map.retain(|e| {
                let live = e.is_live(now);
                if live {
                    weight += e.weight();
                }
                live
            });
            reaped += before - map.len();
            if map.capacity() > 64 && map.len() < map.capacity() / 4 {
                map.shrink_to_fit();
            }
        }
        (reaped, weight)
    }

    /// Starts a new generation from a snapshot of the live state and removes the old one.
    /// Checks wait only while the live entries are copied (every shard is locked for
    /// that); the snapshot is written after they resume.
    pub fn compact(&self) -> Result<(), StoreError> {
        let Some(durable) = &self.durable else {
            return Ok(());
        };
        let _one = lock(&durable.compacting);
        let next = durable.journal.prepare().map_err(journal_err)?;
        let (snapshot, switch) = {
            let guards: Vec<_> = self.shards.iter().map(lock).collect();
            let snapshot = self.snapshot_records(&guards);
            // From here on every change goes to the new generation's journal.
            let switch = durable.journal.switch(next).map_err(journal_err)?;
            (snapshot, switch)
        };
        let (old_dir, new_dir) = switch.finish().map_err(journal_err)?;
        journal::complete(&new_dir, snapshot).map_err(journal_err)?;
        remove_generation(&old_dir);
        Ok(())
    }

    /// The live state as snapshot records (each a chunk of ops).
    fn snapshot_records(&self, guards: &[MutexGuard<'_, Shard>]) -> Vec<Vec<u8>> {
        let now = self.clock.now_ms();
        let mut records = Vec::new();
        let mut chunk = Vec::with_capacity(SNAPSHOT_CHUNK);
        for map in guards {
            for (key, entry) in map.iter().filter(|(_, e)| e.is_live(now)) {
                ops::recreate(key, entry, &mut chunk);
                if chunk.len() >= SNAPSHOT_CHUNK {
                    records.push(ops::encode(now, &chunk));
                    chunk.clear();
                }
            }
        }
        if !chunk.is_empty() {
            records.push(ops::encode(now, &chunk));
        }
        records
    }

    /// Writes everything to disk (clean shutdown).
    pub fn flush(&self) -> Result<(), StoreError> {
        match &self.durable {
            Some(durable) => durable.journal.flush().map_err(journal_err),
            None => Ok(()),
        }
    }

    /// One live key as it stands: members held (1 for non-sliding keys) and ms to expiry.
    pub fn inspect(&self, key: &str) -> Option<KeyInfo> {
        let now = self.clock.now_ms();
        let k = self.hashed(key);
        let map = lock(&self.shards[k.shard(SHARDS)]);
        map.get(k).filter(|e| e.is_live(now)).map(|e| KeyInfo {
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
                    .map(|(k, _)| k.to_string())
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
            weight += map.iter().map(|(_, e)| e.weight()).sum::<usize>();
        }
        EmbeddedStats {
            keys,
            weight,
            journal_records: self.journal_records(),
            disk_bytes: self.durable.as_ref().map_or(0, |d| d.journal.disk_bytes()),
        }
    }

    /// The request id already counted under `record_key` or `idempotency_key`, if any:
    /// the repeat test a decision makes before it reads or writes anything else. (The
    /// check itself tests again under its locks, so a race between two copies of one
    /// request still counts it once.)
    /// `record_key` is `None` for an id the service made: it cannot repeat, so only the
    /// idempotency key (if any) is looked for, as in the check itself.
    pub fn counted(
        &self,
        record_key: Option<&str>,
        idempotency_key: Option<&str>,
        request_id: &str,
    ) -> Option<String> {
        if record_key.is_none() && idempotency_key.is_none() {
            return None;
        }
        let now = self.clock.now_ms();
        let record_key = record_key.map(|k| self.hashed(k));
        let idempotency_key = idempotency_key.map(|k| self.hashed(k));
        let mut locked = self.lock_keys(record_key.into_iter().chain(idempotency_key));
        if record_key.is_some_and(|k| locked.live(k, now).is_some()) {
            return Some(request_id.to_string());
        }
        match idempotency_key.and_then(|k| locked.live(k, now)) {
            Some(Entry::Idem { request_id, .. }) => Some(request_id.clone()),
            _ => None,
        }
    }

    fn check_now(&self, op: &CheckOp) -> Result<CheckOutcome, StoreError> {
        let now = self.clock.now_ms();
        // Each key hashed once, here: its shard, then every lookup and write in it.
        let keys = Keys {
            record: self.hashed(&op.record_key),
            idempotency: op.idempotency_key.as_deref().map(|k| self.hashed(k)),
            limits: op.limits.iter().map(|l| self.hashed(&l.key)).collect(),
        };
        let mut locked = self.lock_keys(
            std::iter::once(keys.record)
                .chain(keys.idempotency)
                .chain(keys.limits.iter().copied()),
        );

        // The same request id twice counts once; the same idempotency key names the first.
        if op.id_given && locked.live(keys.record, now).is_some() {
            return Ok(CheckOutcome::Duplicate {
                of: op.request_id.clone(),
            });
        }
        if let Some(idem) = keys.idempotency {
            if let Some(Entry::Idem { request_id, .. }) = locked.live(idem, now) {
                return Ok(CheckOutcome::Duplicate {
                    of: request_id.clone(),
                });
            }
        }

        // Phase 1: trim and evaluate every limit; nothing that changes a count.
        let evals: Vec<LimitEval> = op
            .limits
            .iter()
            .zip(&keys.limits)
            .map(|(l, k)| evaluate(&mut locked, l, *k, now, op.dry_run))
            .collect();
        let states = |after: bool| -> Vec<LimitState> {
            evals
                .iter()
                .map(|e| LimitState {
                    count: if after { e.after } else { e.state.count },
                    ..e.state
                })
                .collect()
        };
        if evals.iter().any(|e| e.state.exceeded) {
            return Ok(CheckOutcome::Denied {
                limits: states(false),
            });
        }
        if op.dry_run {
            return Ok(CheckOutcome::Allowed {
                limits: states(true),
            });
        }

        // Phase 2: every write as an op, journaled, then applied.
        let writes = plan(&mut locked, op, &keys, now, &evals);
        locked.commit(now, writes)?;
        Ok(CheckOutcome::Allowed {
            limits: states(true),
        })
    }

    fn refund_now(&self, op: &RefundOp) -> Result<Refunded, StoreError> {
        let now = self.clock.now_ms();
        // Where a request counted before an upgrade has its record (keys::legacy_record_key).
        let legacy = legacy_record_key(&op.records_key, &op.request_id);
        let records: Vec<Hashed<'_>> = std::iter::once(op.record_key.as_str())
            .chain(legacy.as_deref())
            .map(|k| self.hashed(k))
            .collect();
        let targets: Vec<Hashed<'_>> = op.keys.iter().map(|k| self.hashed(k)).collect();
        let mut locked = self.lock_keys(records.iter().chain(&targets).copied());
        let mut record = None;
        for key in &records {
            if let Some(Entry::Record {
                keys: counted,
                expires_at,
            }) = locked.live(*key, now).cloned()
            {
                record = Some((*key, counted, expires_at));
                break;
            }
        }
        let mut given = Refunded {
            keys: vec![false; targets.len()],
        };
        let Some((record_key, counted, expires_at)) = record else {
            return Ok(given);
        };
        let mut remaining = counted.clone();
        let mut writes = Writes::default();
        for (&hashed, back) in targets.iter().zip(given.keys.iter_mut()) {
            let key = hashed.key;
            // How the record names the key (a fixed hash, not the table's).
            let named = KeyHash::of(key);
            let Some(pos) = remaining.iter().position(|(k, _)| *k == named) else {
                // Not named: a sliding window holds the request id if it counted there
                // (only this request added it), as refund.lua's ZREM.
                if let Some(Entry::Sliding { set, .. }) = locked.live(hashed, now) {
                    if set.members.iter().any(|(_, m)| **m == *op.request_id) {
                        writes.push(
                            hashed.hash,
                            Op::RemoveMember {
                                key: key.to_string(),
                                member: op.request_id.clone(),
                            },
                        );
                        *back = true;
                    }
                }
                continue;
            };
            let (_, tag) = remaining.remove(pos);
            // Named by the record: given back now, or already forgotten by a window that
            // rolled over (refund.lua answers the same).
            *back = true;
            match (tag, locked.live(hashed, now).cloned()) {
                // A window that has rolled over already forgot the request.
                (
                    Tag::Fixed { start },
                    Some(Entry::Fixed {
                        mut state,
                        expires_at,
                    }),
                ) if state.start == start && state.count > 0 => {
                    state.count -= 1;
                    writes.push(
                        hashed.hash,
                        Op::Put {
                            key: key.to_string(),
                            entry: Entry::Fixed { state, expires_at },
                        },
                    );
                }
                (
                    Tag::Bucket,
                    Some(Entry::Bucket {
                        mut state,
                        expires_at,
                    }),
                ) => {
                    state.tokens = (state.tokens + 1.0).min(state.cap as f64);
                    writes.push(
                        hashed.hash,
                        Op::Put {
                            key: key.to_string(),
                            entry: Entry::Bucket { state, expires_at },
                        },
                    );
                }
                _ => {}
            }
        }
        if !given.any() {
            return Ok(given);
        }
        // Undone keys leave the record; the record stays (its id is still a duplicate).
        if remaining.len() != counted.len() {
            writes.push(
                record_key.hash,
                Op::Put {
                    key: record_key.key.to_string(),
                    entry: Entry::Record {
                        keys: remaining,
                        expires_at,
                    },
                },
            );
        }
        locked.commit(now, writes)?;
        Ok(given)
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // A clean drop loses nothing, whoever forgot to flush.
        let _ = self.flush();
    }
}

fn remove_generation(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "embedded store: old generation not removed");
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding a shard; if something did, its data is still whole
    // (memory changes only after the journal took them), so keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Phase 1 for one limit: trims (unless dry run) and evaluates.
fn evaluate(
    locked: &mut Locked<'_>,
    l: &LimitOp,
    key: Hashed<'_>,
    now: u64,
    dry_run: bool,
) -> LimitEval {
    let window = l.window_ms.max(1);
    match l.algorithm {
        Algorithm::SlidingWindow => match locked.live(key, now) {
            Some(Entry::Sliding { set, .. }) => {
                if !dry_run {
                    // Trimmed members are outside every window sharing the key; replay
                    // needs no record of it (they count for nothing there either).
                    set.trim(now.saturating_sub(l.retain_ms.max(window)));
                }
                set.evaluate(now, window, l.max)
            }
            _ => Sliding::default().evaluate(now, window, l.max),
        },
        Algorithm::FixedWindow => {
            let stored = match locked.live(key, now) {
                Some(Entry::Fixed { state, .. }) => Some(*state),
                _ => None,
            };
            Fixed::evaluate(stored.as_ref(), now, window, l.max)
        }
        Algorithm::TokenBucket => {
            let stored = match locked.live(key, now) {
                Some(Entry::Bucket { state, .. }) => Some(*state),
                _ => None,
            };
            let tokens = Bucket::level(stored.as_ref(), now, window, l.max);
            Bucket::evaluate(tokens, window, l.max)
        }
    }
}

/// Phase 2's writes for an allowed check. A key named twice (sliding limits sharing a
/// ZSET) is written once, kept for the longest retain.
fn plan(
    locked: &mut Locked<'_>,
    op: &CheckOp,
    keys: &Keys<'_>,
    now: u64,
    evals: &[LimitEval],
) -> Writes {
    let mut writes = Writes::with_capacity(op.limits.len() + 2);
    let mut written: Vec<&str> = Vec::with_capacity(op.limits.len());
    // Sized to what it will hold: it lives on as the record for the whole horizon, and a
    // Vec grown by pushes keeps twice the room it needs (~50 B per record measured).
    let mut counted: Vec<(KeyHash, Tag)> = Vec::with_capacity(
        op.limits
            .iter()
            .filter(|l| l.algorithm != Algorithm::SlidingWindow)
            .count(),
    );
    for ((l, e), hashed) in op.limits.iter().zip(evals).zip(&keys.limits) {
        let hash = hashed.hash;
        if written.contains(&l.key.as_str()) {
            continue;
        }
        written.push(&l.key);
        let window = l.window_ms.max(1);
        let key = l.key.clone();
        match l.algorithm {
            Algorithm::SlidingWindow => {
                let retain = op
                    .limits
                    .iter()
                    .filter(|o| o.key == l.key && o.algorithm == Algorithm::SlidingWindow)
                    .map(|o| o.retain_ms.max(o.window_ms))
                    .max()
                    .unwrap_or(window);
                writes.push(
                    hash,
                    Op::AddMember {
                        key,
                        score: now,
                        member: op.request_id.clone(),
                        retain,
                    },
                );
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
                counted.push((KeyHash::of(&key), Tag::Fixed { start: state.start }));
                writes.push(hash, Op::Put { key, entry });
            }
            Algorithm::TokenBucket => {
                let stored = match locked.shard(hash).get(*hashed) {
                    Some(Entry::Bucket { state, .. }) => Some(*state),
                    _ => None,
                };
                let tokens = Bucket::level(stored.as_ref(), now, window, l.max);
                let (state, expires_at) = Bucket::spend(tokens, now, window, l.max);
                counted.push((KeyHash::of(&key), Tag::Bucket));
                writes.push(
                    hash,
                    Op::Put {
                        key,
                        entry: Entry::Bucket { state, expires_at },
                    },
                );
            }
        }
    }
    let expires_at = now + op.record_ttl_ms.max(1);
    writes.push(
        keys.record.hash,
        Op::Put {
            key: op.record_key.clone(),
            entry: Entry::Record {
                keys: counted,
                expires_at,
            },
        },
    );
    if let (Some(idem), Some(hashed)) = (&op.idempotency_key, keys.idempotency) {
        writes.push(
            hashed.hash,
            Op::Put {
                key: idem.clone(),
                entry: Entry::Idem {
                    request_id: op.request_id.clone(),
                    expires_at,
                },
            },
        );
    }
    writes
}

#[async_trait]
impl WindowStore for EmbeddedStore {
    async fn check(&self, op: &CheckOp) -> Result<CheckOutcome, StoreError> {
        // Microseconds of work under a few shard locks: no need to leave the worker.
        self.check_now(op)
    }

    async fn refund_keys(&self, op: &RefundOp) -> Result<Refunded, StoreError> {
        self.refund_now(op)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn sync(&self) -> Result<(), StoreError> {
        // An fsync takes milliseconds: off the async workers. A compaction switching
        // generations meanwhile syncs the old journal itself.
        let Some(durable) = &self.durable else {
            return Ok(());
        };
        let journal = durable.journal.clone();
        tokio::task::spawn_blocking(move || journal.flush())
            .await
            .map_err(|e| StoreError::Unavailable(format!("embedded store: flush task: {e}")))?
            .map_err(journal_err)
    }

    fn kind(&self) -> &'static str {
        "embedded"
    }
}
