//! One behaviour shard: the signal keys whose hash routes to it.
//!
//! [`ShardState`] is the plain part (an LRU of [`SignalState`]s, a dirty set for
//! snapshots, the sweep), testable without an actix System. [`Shard`] is the actor that
//! owns one, runs the periodic snapshot and sweep, and answers [`ObserveSignals`].
//!
//! A signal state carries its own window and is capped by each plan on write, so the
//! sweep needs no rules and runs from the start, restored keys included.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use lru::LruCache;

use super::signal::{SignalSpec, SignalState};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::signal::SignalValue;

/// How often a shard trims every key and drops the empty ones. Access trims the keys that
/// are seen; the sweep is for the ones that are not seen again.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The metric label, the sled tree and `Unanswered::dimension` of the signal shards.
pub(crate) const DIMENSION: &str = "signal";

/// The sled key of a signal key: its hash, big-endian (so a tree iterates in hash order).
pub(crate) fn key_of(entity: u64) -> [u8; 8] {
    entity.to_be_bytes()
}

/// The signal keys of one shard, at most `cap` of them, least recently seen out first.
pub(crate) struct ShardState {
    /// Unbounded as far as `lru` knows: `LruCache::new(cap)` would allocate the whole map
    /// up front (48 shards x a million-key share), so the cap is enforced in `insert`.
    entities: LruCache<u64, SignalState>,
    cap: usize,
    /// Keys whose sled record is stale: changed ones (written from `entities`) and
    /// evicted or dropped ones (no longer in `entities`, so removed).
    dirty: HashSet<u64>,
    metrics: Metrics,
}

/// The dirty keys as one sled batch, with the keys to mark dirty again if the batch
/// cannot be written.
pub(crate) struct PendingWrite {
    pub batch: sled::Batch,
    pub keys: HashSet<u64>,
}

/// One signal of a check, as its shard needs it: the hash of the plan's `key` (the
/// entity), the member (see [`super::signal::member_of`]), the filter's verdict, and the
/// plan's numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SignalAsk {
    pub key: u64,
    pub member: u64,
    pub applies: bool,
    pub spec: SignalSpec,
}

impl ShardState {
    /// An empty shard holding at most `cap` keys (at least one).
    pub fn new(cap: usize, metrics: Metrics) -> Self {
        ShardState {
            entities: LruCache::unbounded(),
            cap: cap.max(1),
            dirty: HashSet::new(),
            metrics,
        }
    }

    /// Puts back a key read from a snapshot. Restore in last-seen order, oldest first, so
    /// that when a snapshot holds more than the cap the most recent are the ones kept.
    pub fn restore(&mut self, entity: u64, state: SignalState) {
        if !self.entities.contains(&entity) {
            self.insert(entity, state);
        }
    }

    fn insert(&mut self, entity: u64, state: SignalState) {
        if self.entities.len() >= self.cap {
            if let Some((gone, _)) = self.entities.pop_lru() {
                self.dirty.insert(gone);
                self.metrics.behaviour_entities(DIMENSION, -1);
            }
        }
        self.entities.push(entity, state);
        self.metrics.behaviour_entities(DIMENSION, 1);
    }

    /// Forgets a key (it emptied): removed from sled at the next snapshot.
    fn remove(&mut self, entity: u64) {
        if self.entities.pop(&entity).is_some() {
            self.dirty.insert(entity);
            self.metrics.behaviour_entities(DIMENSION, -1);
        }
    }

    /// Trims every key by its own window and drops the empty ones. Returns how many were
    /// dropped. Trimmed keys are not marked dirty: their sled record only holds more of
    /// the past, which the next access trims away again.
    pub fn sweep(&mut self, now: u64) -> usize {
        let mut empty = Vec::new();
        for (&entity, state) in self.entities.iter_mut() {
            state.trim(now);
            if state.is_empty() {
                empty.push(entity);
            }
        }
        for entity in &empty {
            self.entities.pop(entity);
            self.dirty.insert(*entity);
        }
        if !empty.is_empty() {
            self.metrics
                .behaviour_entities(DIMENSION, -(empty.len() as i64));
        }
        empty.len()
    }

    /// Takes the dirty set as one batch (insert what is held, remove what is gone), or
    /// `None` when nothing changed. The set is replaced, not cleared, so its memory goes.
    pub fn take_dirty(&mut self) -> Option<PendingWrite> {
        if self.dirty.is_empty() {
            return None;
        }
        let keys = std::mem::take(&mut self.dirty);
        let mut batch = sled::Batch::default();
        for &entity in &keys {
            let key = key_of(entity);
            match self.entities.peek(&entity) {
                Some(state) => batch.insert(&key[..], state.to_bytes()),
                None => batch.remove(&key[..]),
            }
        }
        Some(PendingWrite { batch, keys })
    }

    /// Marks keys dirty again (their batch could not be written).
    pub fn mark_dirty(&mut self, keys: HashSet<u64>) {
        self.dirty.extend(keys);
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.entities.len()
    }

    /// Is the key held? (Does not count as seeing it.)
    #[cfg(test)]
    pub fn contains(&self, entity: u64) -> bool {
        self.entities.contains(&entity)
    }

    /// Observes a check's signals of this shard in order (unless `dry_run`) and answers
    /// their values, in the same order.
    pub fn observe_signals(
        &mut self,
        asks: &[SignalAsk],
        now: u64,
        dry_run: bool,
    ) -> Vec<SignalValue> {
        asks.iter()
            .map(|ask| self.observe_signal(ask, now, dry_run))
            .collect()
    }

    /// One signal. A dry run reads the key without promoting it, or an empty state
    /// without creating one. A recording promotes the key (trimmed by the plan's window on
    /// the way), creates it only if it then holds something, and drops it if it emptied.
    fn observe_signal(&mut self, ask: &SignalAsk, now: u64, dry_run: bool) -> SignalValue {
        let SignalAsk {
            key,
            member,
            applies,
            spec,
        } = *ask;
        if dry_run {
            return match self.entities.peek(&key) {
                Some(state) => state.peek(&spec, member, applies, now),
                None => SignalState::new().peek(&spec, member, applies, now),
            };
        }
        if let Some(state) = self.entities.get_mut(&key) {
            let value = state.observe(&spec, member, applies, now);
            if state.is_empty() {
                self.remove(key);
            } else {
                self.dirty.insert(key);
            }
            return value;
        }
        let mut state = SignalState::new();
        let value = state.observe(&spec, member, applies, now);
        if !state.is_empty() {
            self.dirty.insert(key);
            self.insert(key, state);
        }
        value
    }
}

impl Drop for ShardState {
    /// The gauge counts what is held in memory: a stopped shard holds nothing.
    fn drop(&mut self) {
        if !self.entities.is_empty() {
            self.metrics
                .behaviour_entities(DIMENSION, -(self.entities.len() as i64));
        }
    }
}

/// Observe a check's signals of one shard and answer their values, in order (see
/// [`ShardState::observe_signals`]).
#[derive(Debug, Message)]
#[rtype(result = "Vec<SignalValue>")]
pub(crate) struct ObserveSignals {
    pub asks: Vec<SignalAsk>,
    /// Taken once per check: every signal of it records the same instant.
    pub now: u64,
    pub dry_run: bool,
    /// The check's place in the shard's mailbox, given back when this message is dropped:
    /// after it is handled, or skipped because the check gave up (see `pool`).
    pub _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Write the dirty keys to the shard's sled tree now.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), sled::Error>")]
pub(crate) struct Snapshot;

/// How many keys the shard holds.
#[derive(Debug, Message)]
#[rtype(result = "usize")]
pub(crate) struct Count;

/// Blocks the shard's thread (fault injection: [`super::Behaviours::stall`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Stall(pub Duration);

/// The actor around a [`ShardState`], on one of the pool's threads (or the caller's
/// System, `start_local`).
pub(crate) struct Shard {
    pub state: ShardState,
    pub tree: sled::Tree,
    pub clock: Arc<dyn Clock>,
    pub mailbox: usize,
    pub snapshot_every: Duration,
}

impl Shard {
    fn write_snapshot(&mut self) -> Result<(), sled::Error> {
        let Some(pending) = self.state.take_dirty() else {
            return Ok(());
        };
        if let Err(e) = self.tree.apply_batch(pending.batch) {
            // Keep them dirty: the next snapshot retries rather than losing the changes.
            self.state.mark_dirty(pending.keys);
            return Err(e);
        }
        Ok(())
    }
}

impl Actor for Shard {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox);
        ctx.run_interval(self.snapshot_every, |shard, _| {
            if let Err(error) = shard.write_snapshot() {
                tracing::warn!(%error, "behaviour snapshot failed; will retry");
            }
        });
        ctx.run_interval(SWEEP_EVERY, |shard, _| {
            shard.state.sweep(shard.clock.now_ms());
        });
    }
}

impl Handler<ObserveSignals> for Shard {
    type Result = MessageResult<ObserveSignals>;

    fn handle(&mut self, msg: ObserveSignals, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.state.observe_signals(&msg.asks, msg.now, msg.dry_run))
    }
}

impl Handler<Snapshot> for Shard {
    type Result = Result<(), sled::Error>;

    fn handle(&mut self, _: Snapshot, _: &mut Self::Context) -> Self::Result {
        self.write_snapshot()
    }
}

impl Handler<Count> for Shard {
    type Result = usize;

    fn handle(&mut self, _: Count, _: &mut Self::Context) -> usize {
        self.state.len()
    }
}

impl Handler<Stall> for Shard {
    type Result = ();

    fn handle(&mut self, msg: Stall, _: &mut Self::Context) {
        std::thread::sleep(msg.0);
    }
}
/// Counts heap bytes per thread, so a test can measure what its own thread allocated
/// while other tests of the binary run in parallel: the bytes asked for ([`net`]) and,
/// on glibc, what the allocator really holds for them ([`chunks`]: its rounding and each
/// chunk's header included).
#[cfg(test)]
pub(crate) mod counting_alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    struct Counting;

    thread_local! {
        // const-initialised and without a destructor: usable from inside the allocator.
        static NET: Cell<isize> = const { Cell::new(0) };
        static CHUNKS: Cell<isize> = const { Cell::new(0) };
    }

    fn add(bytes: isize, chunk: isize) {
        let _ = NET.try_with(|n| n.set(n.get() + bytes));
        let _ = CHUNKS.try_with(|n| n.set(n.get() + chunk));
    }

    /// Bytes allocated and not yet freed by this thread, as asked for.
    pub fn net() -> isize {
        NET.try_with(Cell::get).unwrap_or(0)
    }

    /// The same in allocator chunks: what the heap really gives them.
    pub fn chunks() -> isize {
        CHUNKS.try_with(Cell::get).unwrap_or(0)
    }

    /// The chunk glibc holds for the live allocation at `ptr`: its usable size and the
    /// one-word header before it.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn chunk(ptr: *mut u8, _asked: usize) -> isize {
        extern "C" {
            fn malloc_usable_size(ptr: *mut std::ffi::c_void) -> usize;
        }
        // SAFETY: `ptr` is a live allocation of the system allocator, which is glibc's
        // malloc here; the call only reads its chunk header.
        let usable = unsafe { malloc_usable_size(ptr.cast()) };
        (usable + size_of::<usize>()) as isize
    }

    /// Elsewhere the chunk is not known: the size asked for.
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    fn chunk(_ptr: *mut u8, asked: usize) -> isize {
        asked as isize
    }

    // SAFETY: every call is forwarded unchanged to the system allocator; counting has no
    // effect on the memory returned.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                add(layout.size() as isize, chunk(p, layout.size()));
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            let p = unsafe { System.alloc_zeroed(layout) };
            if !p.is_null() {
                add(layout.size() as isize, chunk(p, layout.size()));
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            let held = chunk(ptr, layout.size());
            unsafe { System.dealloc(ptr, layout) };
            add(-(layout.size() as isize), -held);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let held = chunk(ptr, layout.size());
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                add(
                    new_size as isize - layout.size() as isize,
                    chunk(p, new_size) - held,
                );
            }
            p
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Count;
    use crate::signal::entity_hash;
    use crate::signal::member_of;
    use crate::signal::signal_cap;

    const MIN: u64 = 60_000;
    const T0: u64 = 1_700_000_000_000;

    fn gauge(metrics: &Metrics) -> i64 {
        let line = format!("vigia_behaviour_entities{{dimension=\"{DIMENSION}\"}} ");
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&line).and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    }

    fn spec(count: Count, window_ms: u64, max: u64) -> SignalSpec {
        SignalSpec {
            switches: count == Count::UserSwitches,
            shared: false,
            window_ms,
            max,
            min_share: None,
            cap: signal_cap(max, None) as u32,
        }
    }

    fn ask(key: &str, member: &str, spec: SignalSpec, applies: bool) -> SignalAsk {
        SignalAsk {
            key: entity_hash(key),
            member: member_of(member),
            applies,
            spec,
        }
    }

    fn users(key: &str, user: &str) -> SignalAsk {
        ask(key, user, spec(Count::Users, 10 * MIN, 5), true)
    }

    fn see(s: &mut ShardState, a: SignalAsk, now: u64) -> SignalValue {
        s.observe_signals(&[a], now, false)[0]
    }

    #[test]
    fn answers_in_ask_order_and_caps_entities() {
        let metrics = Metrics::new();
        let mut s = ShardState::new(2, metrics.clone());
        let got = s.observe_signals(
            &[users("A", "u1"), users("B", "u1"), users("A", "u2")],
            T0,
            false,
        );
        let values: Vec<u64> = got.iter().map(|v| v.value).collect();
        assert_eq!(values, [1, 1, 2]);
        see(&mut s, users("C", "u1"), T0 + 1);
        assert!(
            !s.contains(entity_hash("B")),
            "B is the least recently seen"
        );
        assert_eq!(gauge(&metrics), 2);
        drop(s);
        assert_eq!(gauge(&metrics), 0);
    }

    #[test]
    fn dry_run_neither_creates_nor_changes_nor_promotes() {
        let mut s = ShardState::new(2, Metrics::new());
        let dry = |s: &mut ShardState, a| s.observe_signals(&[a], T0, true)[0];
        assert_eq!(dry(&mut s, users("A", "u1")).value, 1);
        assert_eq!(s.len(), 0);
        assert!(s.take_dirty().is_none());
        see(&mut s, users("A", "u1"), T0);
        see(&mut s, users("B", "u1"), T0);
        s.take_dirty();
        assert_eq!(dry(&mut s, users("A", "u2")).value, 2);
        assert!(s.take_dirty().is_none(), "a dry run changes nothing");
        see(&mut s, users("C", "u1"), T0);
        assert!(
            !s.contains(entity_hash("A")),
            "the dry run did not promote A"
        );
    }

    #[test]
    fn nothing_to_hold_creates_nothing_and_an_emptied_key_goes() {
        let metrics = Metrics::new();
        let mut s = ShardState::new(4, metrics.clone());
        let sw = spec(Count::UserSwitches, MIN, 1);
        see(&mut s, ask("dev", "u1", sw, false), T0);
        see(
            &mut s,
            ask("ip", "u1", spec(Count::Users, MIN, 1), false),
            T0,
        );
        assert_eq!(s.len(), 0, "neither applied: nothing recorded");
        assert!(s.take_dirty().is_none());
        see(&mut s, users("A", "u1"), T0);
        s.take_dirty();
        // A (window 10 min) is recorded on by a plan of one minute that does not
        // apply: trimmed by that window, it holds nothing and is dropped.
        let short = ask("A", "u2", spec(Count::Users, MIN, 5), false);
        see(&mut s, short, T0 + MIN);
        assert_eq!(s.len(), 0);
        assert_eq!(gauge(&metrics), 0);
        let pending = s.take_dirty().expect("the dropped key is to be removed");
        assert_eq!(pending.keys, HashSet::from([entity_hash("A")]));
    }

    #[test]
    fn the_sweep_trims_each_key_by_its_own_window_from_the_start() {
        let metrics = Metrics::new();
        let mut s = ShardState::new(10, metrics.clone());
        see(
            &mut s,
            ask("short", "u1", spec(Count::Users, MIN, 5), true),
            T0,
        );
        see(
            &mut s,
            ask("long", "u1", spec(Count::Users, 10 * MIN, 5), true),
            T0,
        );
        let sw = spec(Count::UserSwitches, MIN, 5);
        see(&mut s, ask("sw", "u1", sw, true), T0);
        see(&mut s, ask("sw", "u2", sw, true), T0 + 30_000);
        s.take_dirty();
        assert_eq!(s.sweep(T0 + MIN - 1), 0);
        assert_eq!(s.sweep(T0 + MIN), 1, "short left");
        assert!(!s.contains(entity_hash("short")));
        assert_eq!(
            s.sweep(T0 + 30_000 + MIN),
            1,
            "the switch and the last user left"
        );
        assert!(s.contains(entity_hash("long")));
        assert_eq!(s.sweep(T0 + 10 * MIN), 1);
        assert_eq!(s.len(), 0);
        assert_eq!(gauge(&metrics), 0);
        let pending = s.take_dirty().expect("dropped keys are dirty");
        assert_eq!(pending.keys.len(), 3);
        // Restored keys are swept before any observation (they carry their window).
        let mut restored = ShardState::new(10, Metrics::new());
        let mut state = SignalState::new();
        state.observe(&spec(Count::Users, MIN, 5), 1, true, T0);
        restored.restore(7, state);
        assert_eq!(restored.sweep(T0 + MIN), 1);
    }

    #[test]
    fn snapshot_batch_writes_changed_and_removes_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::Config::new()
            .path(dir.path())
            .open()
            .expect("sled opens");
        let tree = db.open_tree(DIMENSION).expect("tree");
        let mut s = ShardState::new(2, Metrics::new());
        see(&mut s, users("A", "u1"), T0);
        see(&mut s, users("B", "u1"), T0 + 1);
        tree.apply_batch(s.take_dirty().expect("dirty").batch)
            .expect("write");
        assert_eq!(tree.len(), 2);
        see(&mut s, users("C", "u1"), T0 + 2); // evicts A
        let pending = s.take_dirty().expect("dirty");
        assert_eq!(
            pending.keys,
            HashSet::from([entity_hash("A"), entity_hash("C")])
        );
        tree.apply_batch(pending.batch).expect("write");
        assert!(tree.get(key_of(entity_hash("A"))).expect("read").is_none());
        let c = tree
            .get(key_of(entity_hash("C")))
            .expect("read")
            .expect("C is written");
        let c = SignalState::from_bytes(&c).expect("decodes");
        assert_eq!(c.len(), 1);
        assert!(s.take_dirty().is_none(), "written keys are clean");
    }

    #[test]
    fn restore_keeps_the_most_recent_when_over_the_cap() {
        let metrics = Metrics::new();
        let mut s = ShardState::new(2, metrics.clone());
        for (hash, at) in [(1u64, T0 + 10), (2, T0 + 20), (3, T0 + 30)] {
            let mut state = SignalState::new();
            state.observe(&spec(Count::Users, MIN, 5), 99, true, at);
            s.restore(hash, state);
        }
        assert!(!s.contains(1));
        assert!(s.contains(2) && s.contains(3));
        assert_eq!(gauge(&metrics), 2);
        let pending = s.take_dirty().expect("the evicted one is to be removed");
        assert_eq!(pending.keys, HashSet::from([1]));
    }

    /// A million signal keys with one member each (a million devices with one user),
    /// spread over 16 shards as in the default config: everything the shards allocate
    /// (LRU map and nodes, sets, the dirty set before the snapshot takes it) counted by
    /// the per-thread allocator.
    #[test]
    fn a_million_single_member_keys_stay_under_170_bytes_each() {
        const N: usize = 1_000_000;
        const SHARDS: usize = 16;
        const BOUND: isize = 170;
        let sp = spec(Count::Users, 24 * 60 * MIN, 3);
        let metrics = Metrics::new();
        metrics.behaviour_entities(DIMENSION, 0);
        let before = counting_alloc::net();
        let mut shards: Vec<ShardState> = (0..SHARDS)
            .map(|_| ShardState::new(N.div_ceil(SHARDS), metrics.clone()))
            .collect();
        for i in 0..N as u64 {
            let key = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let a = SignalAsk {
                key,
                member: i,
                applies: true,
                spec: sp,
            };
            shards[(key % SHARDS as u64) as usize].observe_signals(&[a], T0 + i, false);
        }
        let with_dirty = counting_alloc::net() - before;
        let held: usize = shards.iter().map(ShardState::len).sum();
        assert_eq!(held, N);
        for s in &mut shards {
            drop(s.take_dirty());
        }
        let clean = counting_alloc::net() - before;
        let (per_dirty, per_clean) = (with_dirty / N as isize, clean / N as isize);
        println!("signal memory: {per_dirty} B/key before the snapshot, {per_clean} B/key after");
        assert!(
            per_dirty < BOUND,
            "{per_dirty} B/key (dirty set included), bound {BOUND}"
        );
        assert!(
            per_clean < per_dirty,
            "the snapshot gives the dirty set back"
        );
        assert!(per_clean > 0, "the counting allocator is counting");
    }

    /// What one signal key costs a shard by its number of members — everything the shard
    /// allocates for it (the LRU node holding the key and the 56-byte state, its map slot,
    /// the set's buffer) — against [`SignalState::approx_bytes`], which counts the state
    /// only. The shard's own part is the same whatever the members, so the two differ by
    /// a constant. The figures in the `signal` module doc come from here:
    /// `cargo nextest run --lib bytes_per_signal_key --no-capture`.
    #[test]
    fn bytes_per_signal_key_by_members() {
        const KEYS: usize = 4_096;
        // A cap no count here reaches: the set grows as it would below any cap.
        let sp = spec(Count::Users, 24 * 60 * MIN, 2_047);
        let metrics = Metrics::new();
        metrics.behaviour_entities(DIMENSION, 0);
        let mut overheads = Vec::new();
        println!("members  approx B/key  asked B/key  chunks B/key");
        for members in [1u64, 2, 3, 4, 5, 8, 16, 64, 256] {
            let (asked, chunks) = (counting_alloc::net(), counting_alloc::chunks());
            let mut s = ShardState::new(KEYS, metrics.clone());
            for k in 0..KEYS as u64 {
                let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                for m in 0..members {
                    let a = SignalAsk {
                        key,
                        member: m,
                        applies: true,
                        spec: sp,
                    };
                    s.observe_signals(&[a], T0 + m, false);
                }
            }
            drop(s.take_dirty());
            let per_key = |bytes: isize| bytes as usize / KEYS;
            let asked = per_key(counting_alloc::net() - asked);
            let chunks = per_key(counting_alloc::chunks() - chunks);
            let approx = s
                .entities
                .iter()
                .map(|(_, st)| st.approx_bytes())
                .sum::<usize>()
                / KEYS;
            println!("{members:>7}  {approx:>12}  {asked:>11}  {chunks:>12}");
            assert_eq!(s.len(), KEYS);
            // A set of n members has room for the next power of two (one slot to start).
            let slots = members.next_power_of_two() as usize;
            assert_eq!(approx, size_of::<SignalState>() + 16 * slots);
            overheads.push(asked - approx);
        }
        assert!(
            overheads.iter().all(|&o| o == overheads[0]),
            "the shard's part per key does not depend on the members: {overheads:?}"
        );
        assert!(
            overheads[0] < 80,
            "{} B per key besides the state",
            overheads[0]
        );
    }
}
