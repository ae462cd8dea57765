//! One behaviour shard: the entities of one dimension whose hash routes to it.
//!
//! [`ShardState`] is the plain part (an LRU of entity states, a dirty set for snapshots),
//! testable without an actix System; [`Shard`] is the actor that owns one, answers
//! [`Observe`] and runs the periodic snapshot and sweep.
//!
//! # Bounds
//!
//! Caps and retention come with every observation ([`StateBounds`] of the current rule
//! set). They are applied lazily: to an entity whenever it is observed (before it is
//! trimmed and recorded on), and to every entity on the periodic sweep, which uses the
//! bounds the shard saw last. `set_bounds` is O(1) unless a cap shrank, so applying it on
//! each access costs nothing, while walking every entity on a rule change would stall the
//! request that brought the change. A shard that has never been observed has no bounds
//! and does not sweep (restored entities wait for the first observation).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use lru::LruCache;

use super::state::{DecodeError, DeviceState, IpState, Signals, StateBounds, UserState};
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::rules::Behaviour;

/// How often a shard trims every entity and drops the empty ones. Access trims the
/// entities that are seen; the sweep is for the ones that are not seen again.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What a shard needs from the state of its dimension (device, user or IP).
pub(crate) trait Entity: Clone + Send + Unpin + 'static {
    /// `device`, `user` or `ip`: the metric label, the sled tree and `Unanswered::dimension`.
    const DIMENSION: &'static str;
    fn empty(bounds: &StateBounds) -> Self;
    fn set_bounds(&mut self, bounds: &StateBounds);
    /// The longest window of this kind: older state answers no query.
    fn retain_ms(bounds: &StateBounds) -> u64;
    fn observe(&mut self, other: u64, now: u64);
    fn trim(&mut self, now: u64, retain_ms: u64);
    fn signals(&self, now: u64, behaviour: &Behaviour) -> Signals;
    fn is_empty(&self) -> bool;
    fn last_seen(&self) -> Option<u64>;
    fn to_bytes(&self) -> Vec<u8>;
    fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError>;
}

macro_rules! entity {
    ($ty:ty, $dimension:literal, $retain:ident) => {
        impl Entity for $ty {
            const DIMENSION: &'static str = $dimension;
            fn empty(bounds: &StateBounds) -> Self {
                <$ty>::new(bounds)
            }
            fn set_bounds(&mut self, bounds: &StateBounds) {
                <$ty>::set_bounds(self, bounds)
            }
            fn retain_ms(bounds: &StateBounds) -> u64 {
                bounds.$retain
            }
            fn observe(&mut self, other: u64, now: u64) {
                <$ty>::observe(self, other, now)
            }
            fn trim(&mut self, now: u64, retain_ms: u64) {
                <$ty>::trim(self, now, retain_ms)
            }
            fn signals(&self, now: u64, behaviour: &Behaviour) -> Signals {
                <$ty>::signals(self, now, behaviour)
            }
            fn is_empty(&self) -> bool {
                <$ty>::is_empty(self)
            }
            fn last_seen(&self) -> Option<u64> {
                <$ty>::last_seen(self)
            }
            fn to_bytes(&self) -> Vec<u8> {
                <$ty>::to_bytes(self)
            }
            fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
                <$ty>::from_bytes(bytes)
            }
        }
    };
}

entity!(DeviceState, "device", device_retain_ms);
entity!(UserState, "user", user_retain_ms);
entity!(IpState, "ip", ip_retain_ms);

/// The sled key of an entity: its hash, big-endian (so a tree iterates in hash order).
pub(crate) fn key_of(entity: u64) -> [u8; 8] {
    entity.to_be_bytes()
}

/// The entities of one shard, at most `cap` of them, least recently seen out first.
pub(crate) struct ShardState<E: Entity> {
    /// Unbounded as far as `lru` knows: `LruCache::new(cap)` would allocate the whole map
    /// up front (48 shards x a million-entity share), so the cap is enforced in `insert`.
    entities: LruCache<u64, E>,
    cap: usize,
    /// Entities whose sled record is stale: changed ones (written from `entities`) and
    /// evicted or dropped ones (no longer in `entities`, so removed).
    dirty: HashSet<u64>,
    bounds: Option<StateBounds>,
    metrics: Metrics,
}

/// The dirty entities as one sled batch, with their keys to mark dirty again if the batch
/// cannot be written.
pub(crate) struct PendingWrite {
    pub batch: sled::Batch,
    pub keys: HashSet<u64>,
}

impl<E: Entity> ShardState<E> {
    /// An empty shard holding at most `cap` entities (at least one).
    pub fn new(cap: usize, metrics: Metrics) -> Self {
        ShardState {
            entities: LruCache::unbounded(),
            cap: cap.max(1),
            dirty: HashSet::new(),
            bounds: None,
            metrics,
        }
    }

    /// Records `other` seen with `entity` at `now` (unless `dry_run`) and answers the
    /// scene's signals, the current request included. `dry_run` works on a copy and leaves
    /// the shard as it was: no entity created, none promoted, nothing dirty.
    pub fn observe(
        &mut self,
        entity: u64,
        other: u64,
        now: u64,
        behaviour: &Behaviour,
        bounds: &StateBounds,
        dry_run: bool,
    ) -> Signals {
        self.bounds = Some(*bounds);
        let retain = E::retain_ms(bounds);
        let record = |state: &mut E| {
            state.set_bounds(bounds);
            state.trim(now, retain);
            state.observe(other, now);
            state.signals(now, behaviour)
        };
        if dry_run {
            let mut copy = match self.entities.peek(&entity) {
                Some(state) => state.clone(),
                None => E::empty(bounds),
            };
            return record(&mut copy);
        }
        self.dirty.insert(entity);
        if let Some(state) = self.entities.get_mut(&entity) {
            return record(state);
        }
        let mut state = E::empty(bounds);
        let signals = record(&mut state);
        self.insert(entity, state);
        signals
    }

    /// Puts back an entity read from a snapshot. Restore in last-seen order, oldest first,
    /// so that when a snapshot holds more than the cap the most recent are the ones kept.
    pub fn restore(&mut self, entity: u64, state: E) {
        if !self.entities.contains(&entity) {
            self.insert(entity, state);
        }
    }

    fn insert(&mut self, entity: u64, state: E) {
        if self.entities.len() >= self.cap {
            if let Some((gone, _)) = self.entities.pop_lru() {
                self.dirty.insert(gone);
                self.metrics.behaviour_entities(E::DIMENSION, -1);
            }
        }
        self.entities.push(entity, state);
        self.metrics.behaviour_entities(E::DIMENSION, 1);
    }

    /// Applies the last seen bounds to every entity, trims it, and drops the empty ones.
    /// Returns how many were dropped. Trimmed entities are not marked dirty: their sled
    /// record only holds more of the past, which the next access trims away again.
    pub fn sweep(&mut self, now: u64) -> usize {
        let Some(bounds) = self.bounds else {
            return 0;
        };
        let retain = E::retain_ms(&bounds);
        let mut empty = Vec::new();
        for (&entity, state) in self.entities.iter_mut() {
            state.set_bounds(&bounds);
            state.trim(now, retain);
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
                .behaviour_entities(E::DIMENSION, -(empty.len() as i64));
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

    /// Marks entities dirty again (their batch could not be written).
    pub fn mark_dirty(&mut self, keys: HashSet<u64>) {
        self.dirty.extend(keys);
    }

    /// Entities held.
    pub fn len(&self) -> usize {
        self.entities.len()
    }

    /// Is the entity held? (Does not count as seeing it.)
    #[cfg(test)]
    pub fn contains(&self, entity: u64) -> bool {
        self.entities.contains(&entity)
    }
}

impl<E: Entity> Drop for ShardState<E> {
    /// The gauge counts what is held in memory: a stopped shard holds nothing.
    fn drop(&mut self) {
        if !self.entities.is_empty() {
            self.metrics
                .behaviour_entities(E::DIMENSION, -(self.entities.len() as i64));
        }
    }
}

/// Record a request and answer the scene's signals (see [`ShardState::observe`]).
#[derive(Debug, Message)]
#[rtype(result = "Signals")]
pub(crate) struct Observe {
    /// Hash of the entity this shard owns (device, user or IP).
    pub entity: u64,
    /// Hash of the entity seen with it (the user on a device or IP, the device of a user).
    pub other: u64,
    /// Taken once per check, so every dimension records the same instant.
    pub now: u64,
    pub behaviour: Behaviour,
    pub bounds: StateBounds,
    pub dry_run: bool,
    /// The check's place in the shard's mailbox, given back when this message is dropped:
    /// after it is handled, or skipped because the check gave up (see `pool`).
    pub _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Write the dirty entities to the shard's sled tree now.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), sled::Error>")]
pub(crate) struct Snapshot;

/// How many entities the shard holds.
#[derive(Debug, Message)]
#[rtype(result = "usize")]
pub(crate) struct Count;

/// Blocks the shard's thread, to test what a stalled shard costs a check.
#[cfg(test)]
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Stall(pub Duration);

/// The actor around a [`ShardState`], on one of the pool's threads.
pub(crate) struct Shard<E: Entity> {
    pub state: ShardState<E>,
    pub tree: sled::Tree,
    pub clock: Arc<dyn Clock>,
    pub mailbox: usize,
    pub snapshot_every: Duration,
}

impl<E: Entity> Shard<E> {
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

impl<E: Entity> Actor for Shard<E> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox);
        ctx.run_interval(self.snapshot_every, |shard, _| {
            if let Err(error) = shard.write_snapshot() {
                tracing::warn!(dimension = E::DIMENSION, %error, "behaviour snapshot failed; will retry");
            }
        });
        ctx.run_interval(SWEEP_EVERY, |shard, _| {
            shard.state.sweep(shard.clock.now_ms());
        });
    }
}

impl<E: Entity> Handler<Observe> for Shard<E> {
    type Result = MessageResult<Observe>;

    fn handle(&mut self, msg: Observe, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.state.observe(
            msg.entity,
            msg.other,
            msg.now,
            &msg.behaviour,
            &msg.bounds,
            msg.dry_run,
        ))
    }
}

impl<E: Entity> Handler<Snapshot> for Shard<E> {
    type Result = Result<(), sled::Error>;

    fn handle(&mut self, _: Snapshot, _: &mut Self::Context) -> Self::Result {
        self.write_snapshot()
    }
}

impl<E: Entity> Handler<Count> for Shard<E> {
    type Result = usize;

    fn handle(&mut self, _: Count, _: &mut Self::Context) -> usize {
        self.state.len()
    }
}

#[cfg(test)]
impl<E: Entity> Handler<Stall> for Shard<E> {
    type Result = ();

    fn handle(&mut self, msg: Stall, _: &mut Self::Context) {
        std::thread::sleep(msg.0);
    }
}

/// Counts heap bytes per thread, so a test can measure what its own thread allocated
/// while other tests of the binary run in parallel.
#[cfg(test)]
pub(crate) mod counting_alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    struct Counting;

    thread_local! {
        // const-initialised and without a destructor: usable from inside the allocator.
        static NET: Cell<isize> = const { Cell::new(0) };
    }

    fn add(bytes: isize) {
        let _ = NET.try_with(|n| n.set(n.get() + bytes));
    }

    /// Bytes allocated and not yet freed by this thread.
    pub fn net() -> isize {
        NET.try_with(Cell::get).unwrap_or(0)
    }

    // SAFETY: every call is forwarded unchanged to the system allocator; counting has no
    // effect on the memory returned.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                add(layout.size() as isize);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            let p = unsafe { System.alloc_zeroed(layout) };
            if !p.is_null() {
                add(layout.size() as isize);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) };
            add(-(layout.size() as isize));
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                add(new_size as isize - layout.size() as isize);
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
    use crate::behaviour::state::entity_hash;
    use crate::rules::SignalRule;

    const MIN: u64 = 60_000;

    fn behaviour() -> Behaviour {
        Behaviour {
            accounts_per_device: Some(SignalRule {
                window_ms: 10 * MIN,
                max: 5,
            }),
            account_switches: Some(SignalRule {
                window_ms: 10 * MIN,
                max: 3,
            }),
            devices_per_user: Some(SignalRule {
                window_ms: 10 * MIN,
                max: 3,
            }),
            accounts_per_ip: Some(SignalRule {
                window_ms: 10 * MIN,
                max: 50,
            }),
        }
    }

    fn bounds() -> StateBounds {
        StateBounds::from_behaviours([&behaviour()])
    }

    fn gauge(metrics: &Metrics, dimension: &str) -> i64 {
        let line = format!("vigia_behaviour_entities{{dimension=\"{dimension}\"}} ");
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&line).and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    }

    fn see(s: &mut ShardState<DeviceState>, device: &str, user: &str, now: u64) -> Signals {
        let (b, beh) = (bounds(), behaviour());
        s.observe(entity_hash(device), entity_hash(user), now, &beh, &b, false)
    }

    #[test]
    fn cap_evicts_least_recently_seen_and_gauge_follows() {
        let metrics = Metrics::new();
        let mut s = ShardState::<DeviceState>::new(2, metrics.clone());
        see(&mut s, "A", "u1", 1);
        see(&mut s, "B", "u1", 2);
        see(&mut s, "A", "u2", 3);
        assert_eq!(gauge(&metrics, "device"), 2);
        see(&mut s, "C", "u1", 4);
        assert!(s.contains(entity_hash("A")), "A was touched after B");
        assert!(
            !s.contains(entity_hash("B")),
            "B is the least recently seen"
        );
        assert!(s.contains(entity_hash("C")));
        assert_eq!(s.len(), 2);
        assert_eq!(gauge(&metrics, "device"), 2, "one in, one out");
        // A kept its history; B starts afresh.
        assert_eq!(see(&mut s, "A", "u3", 5).accounts_per_device, Some(3));
        drop(s);
        assert_eq!(
            gauge(&metrics, "device"),
            0,
            "a dropped shard holds nothing"
        );
    }

    #[test]
    fn dry_run_neither_creates_nor_changes_nor_promotes() {
        let metrics = Metrics::new();
        let mut s = ShardState::<DeviceState>::new(2, metrics.clone());
        let (b, beh) = (bounds(), behaviour());
        let dry = |s: &mut ShardState<DeviceState>, device: &str, user: &str| {
            s.observe(entity_hash(device), entity_hash(user), 10, &beh, &b, true)
        };
        assert_eq!(dry(&mut s, "A", "u1").accounts_per_device, Some(1));
        assert_eq!(s.len(), 0);
        assert!(s.take_dirty().is_none());
        see(&mut s, "A", "u1", 1);
        see(&mut s, "B", "u1", 2);
        s.take_dirty();
        assert_eq!(dry(&mut s, "A", "u2").accounts_per_device, Some(2));
        assert!(s.take_dirty().is_none(), "a dry run changes nothing");
        see(&mut s, "C", "u1", 3);
        assert!(
            !s.contains(entity_hash("A")),
            "the dry run did not count as seeing A"
        );
        assert_eq!(see(&mut s, "B", "u9", 4).accounts_per_device, Some(2));
        assert_eq!(gauge(&metrics, "device"), 2);
    }

    #[test]
    fn sweep_trims_and_drops_silent_entities() {
        let metrics = Metrics::new();
        let mut s = ShardState::<DeviceState>::new(10, metrics.clone());
        assert_eq!(s.sweep(0), 0, "no bounds seen yet: nothing to sweep by");
        see(&mut s, "old", "u1", 0);
        see(&mut s, "new", "u1", 5 * MIN);
        s.take_dirty();
        // The retain is 10 minutes: `old` (t=0) leaves exactly at now = 10m.
        assert_eq!(s.sweep(10 * MIN - 1), 0);
        assert_eq!(s.sweep(10 * MIN), 1);
        assert!(!s.contains(entity_hash("old")));
        assert!(s.contains(entity_hash("new")));
        assert_eq!(gauge(&metrics, "device"), 1);
        let pending = s.take_dirty().expect("the dropped entity is dirty");
        assert_eq!(pending.keys, HashSet::from([entity_hash("old")]));
    }

    #[test]
    fn snapshot_batch_writes_changed_and_removes_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::Config::new()
            .path(dir.path())
            .open()
            .expect("sled opens");
        let tree = db.open_tree("device").expect("tree");
        let mut s = ShardState::<DeviceState>::new(2, Metrics::new());
        see(&mut s, "A", "u1", 1);
        see(&mut s, "B", "u1", 2);
        tree.apply_batch(s.take_dirty().expect("dirty").batch)
            .expect("write");
        assert_eq!(tree.len(), 2);
        see(&mut s, "C", "u1", 3); // evicts A
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
        let c = DeviceState::from_bytes(&c).expect("decodes");
        assert_eq!(c.accounts(3, MIN), 1);
        assert!(s.take_dirty().is_none(), "written entities are clean");
    }

    #[test]
    fn restore_keeps_the_most_recent_when_over_the_cap() {
        let metrics = Metrics::new();
        let mut s = ShardState::<UserState>::new(2, metrics.clone());
        for (hash, at) in [(1u64, 10u64), (2, 20), (3, 30)] {
            let mut u = UserState::new(&bounds());
            u.observe(99, at);
            s.restore(hash, u);
        }
        assert!(!s.contains(1));
        assert!(s.contains(2) && s.contains(3));
        assert_eq!(gauge(&metrics, "user"), 2);
        let pending = s.take_dirty().expect("the evicted one is to be removed");
        assert_eq!(pending.keys, HashSet::from([1]));
    }

    #[test]
    fn smaller_caps_apply_on_access() {
        let mut s = ShardState::<IpState>::new(4, Metrics::new());
        let beh = behaviour();
        let wide = bounds();
        for u in 0..10 {
            s.observe(7, u, u, &beh, &wide, false);
        }
        let narrow = StateBounds {
            ip_users_cap: 3,
            ..wide
        };
        let got = s.observe(7, 100, 100, &beh, &narrow, false);
        assert_eq!(got.accounts_per_ip, Some(3), "saturates at the new cap");
    }

    /// A million devices with one user each, spread over 16 shards as in the default
    /// config: everything the shards allocate (LRU map and nodes, state vectors, the dirty
    /// set before the snapshot takes it) counted by the per-thread allocator.
    #[test]
    fn a_million_single_user_devices_stay_under_200_bytes_each() {
        const N: usize = 1_000_000;
        const SHARDS: usize = 16;
        const BOUND: isize = 200;
        let (b, beh) = (bounds(), behaviour());
        let metrics = Metrics::new();
        // The metric children are created before measuring: they are not per-entity.
        metrics.behaviour_entities("device", 0);
        let before = counting_alloc::net();
        let mut shards: Vec<ShardState<DeviceState>> = (0..SHARDS)
            .map(|_| ShardState::new(N.div_ceil(SHARDS), metrics.clone()))
            .collect();
        for i in 0..N as u64 {
            let device = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let shard = (device % SHARDS as u64) as usize;
            shards[shard].observe(device, i, 1_700_000_000_000 + i, &beh, &b, false);
        }
        let with_dirty = counting_alloc::net() - before;
        let held: usize = shards.iter().map(ShardState::len).sum();
        assert_eq!(held, N);
        for s in &mut shards {
            drop(s.take_dirty());
        }
        let clean = counting_alloc::net() - before;
        let (per_dirty, per_clean) = (with_dirty / N as isize, clean / N as isize);
        println!(
            "behaviour memory: {per_dirty} B/device before the snapshot, {per_clean} B/device after"
        );
        assert!(
            per_dirty < BOUND,
            "{per_dirty} B/device (dirty set included), bound {BOUND}"
        );
        assert!(
            per_clean < per_dirty,
            "the snapshot gives the dirty set back"
        );
        assert!(per_clean > 0, "the counting allocator is counting");
    }
}
