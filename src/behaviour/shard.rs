//! One behaviour shard: the entities of one family (device, user, ip — or signal keys)
//! whose hash routes to it.
//!
//! [`ShardState`] is the plain part (an LRU of entity states, a dirty set for snapshots,
//! the sweep), testable without an actix System and the same for every family: it only
//! needs what [`Stored`] gives. [`Shard`] is the actor that owns one, runs the periodic
//! snapshot and sweep, and answers the family's question: [`Observe`] for the legacy
//! dimensions ([`Entity`]: device, user, ip), [`ObserveSignals`] for signal keys
//! ([`SignalState`]).
//!
//! # Bounds (legacy dimensions)
//!
//! Caps and retention come with every observation ([`StateBounds`] of the current rule
//! set). They are applied lazily: to an entity whenever it is observed (before it is
//! trimmed and recorded on), and to every entity on the periodic sweep, which uses the
//! bounds the shard saw last. `set_bounds` is O(1) unless a cap shrank, so applying it on
//! each access costs nothing, while walking every entity on a rule change would stall the
//! request that brought the change. A shard that has never been observed has no bounds
//! and does not sweep (restored entities wait for the first observation).
//!
//! Signal states carry their own window and are capped by each plan on write, so their
//! shards sweep from the start.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use lru::LruCache;

use super::signal::{SignalSpec, SignalState};
use super::state::{DecodeError, DeviceState, IpState, Signals, StateBounds, UserState};
use crate::clock::Clock;
use crate::decide::SignalValue;
use crate::metrics::Metrics;
use crate::rules::Behaviour;

/// How often a shard trims every entity and drops the empty ones. Access trims the
/// entities that are seen; the sweep is for the ones that are not seen again.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What a shard needs from the state of its family to hold, sweep and snapshot it.
pub(crate) trait Stored: Clone + Send + Unpin + 'static {
    /// `device`, `user`, `ip` or `signal`: the metric label, the sled tree and
    /// `Unanswered::dimension`.
    const DIMENSION: &'static str;
    /// What the sweep needs besides the time: the legacy dimensions trim by the last
    /// bounds observed; a signal state by its own window (`()`).
    type Bounds: Copy + Send + Unpin + 'static;
    /// The bounds a shard sweeps by before its first observation: none for the legacy
    /// dimensions (they wait for one), `Some(())` for signals.
    const INITIAL_BOUNDS: Option<Self::Bounds>;
    /// Trims what no query can count any more (the sweep drops the entity if it is then
    /// empty).
    fn sweep(&mut self, now: u64, bounds: &Self::Bounds);
    fn is_empty(&self) -> bool;
    fn last_seen(&self) -> Option<u64>;
    fn to_bytes(&self) -> Vec<u8>;
    fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError>;
}

/// The legacy dimensions (device, user, ip): state asked through [`Observe`].
pub(crate) trait Entity: Stored<Bounds = StateBounds> {
    fn empty(bounds: &StateBounds) -> Self;
    fn set_bounds(&mut self, bounds: &StateBounds);
    /// The longest window of this kind: older state answers no query.
    fn retain_ms(bounds: &StateBounds) -> u64;
    fn observe(&mut self, other: u64, now: u64);
    fn trim(&mut self, now: u64, retain_ms: u64);
    fn signals(&self, now: u64, behaviour: &Behaviour) -> Signals;
}

macro_rules! entity {
    ($ty:ty, $dimension:literal, $retain:ident) => {
        impl Stored for $ty {
            const DIMENSION: &'static str = $dimension;
            type Bounds = StateBounds;
            const INITIAL_BOUNDS: Option<StateBounds> = None;
            fn sweep(&mut self, now: u64, bounds: &StateBounds) {
                <$ty>::set_bounds(self, bounds);
                <$ty>::trim(self, now, bounds.$retain);
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

        impl Entity for $ty {
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
        }
    };
}

entity!(DeviceState, "device", device_retain_ms);
entity!(UserState, "user", user_retain_ms);
entity!(IpState, "ip", ip_retain_ms);

impl Stored for SignalState {
    const DIMENSION: &'static str = "signal";
    type Bounds = ();
    const INITIAL_BOUNDS: Option<()> = Some(());
    fn sweep(&mut self, now: u64, _: &()) {
        self.trim(now);
    }
    fn is_empty(&self) -> bool {
        SignalState::is_empty(self)
    }
    fn last_seen(&self) -> Option<u64> {
        SignalState::last_seen(self)
    }
    fn to_bytes(&self) -> Vec<u8> {
        SignalState::to_bytes(self)
    }
    fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        SignalState::from_bytes(bytes)
    }
}

/// The sled key of an entity: its hash, big-endian (so a tree iterates in hash order).
pub(crate) fn key_of(entity: u64) -> [u8; 8] {
    entity.to_be_bytes()
}

/// The entities of one shard, at most `cap` of them, least recently seen out first.
pub(crate) struct ShardState<E: Stored> {
    /// Unbounded as far as `lru` knows: `LruCache::new(cap)` would allocate the whole map
    /// up front (48 shards x a million-entity share), so the cap is enforced in `insert`.
    entities: LruCache<u64, E>,
    cap: usize,
    /// Entities whose sled record is stale: changed ones (written from `entities`) and
    /// evicted or dropped ones (no longer in `entities`, so removed).
    dirty: HashSet<u64>,
    /// What the sweep trims by (see [`Stored::Bounds`]); `None`: no sweep yet.
    bounds: Option<E::Bounds>,
    metrics: Metrics,
}

/// The dirty entities as one sled batch, with their keys to mark dirty again if the batch
/// cannot be written.
pub(crate) struct PendingWrite {
    pub batch: sled::Batch,
    pub keys: HashSet<u64>,
}

impl<E: Stored> ShardState<E> {
    /// An empty shard holding at most `cap` entities (at least one).
    pub fn new(cap: usize, metrics: Metrics) -> Self {
        ShardState {
            entities: LruCache::unbounded(),
            cap: cap.max(1),
            dirty: HashSet::new(),
            bounds: E::INITIAL_BOUNDS,
            metrics,
        }
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

    /// Forgets an entity (it emptied): removed from sled at the next snapshot.
    fn remove(&mut self, entity: u64) {
        if self.entities.pop(&entity).is_some() {
            self.dirty.insert(entity);
            self.metrics.behaviour_entities(E::DIMENSION, -1);
        }
    }

    /// Trims every entity (legacy dimensions: by the last seen bounds, applied first;
    /// signals: each by its own window) and drops the empty ones. Returns how many were
    /// dropped. Trimmed entities are not marked dirty: their sled record only holds more
    /// of the past, which the next access trims away again.
    pub fn sweep(&mut self, now: u64) -> usize {
        let Some(bounds) = self.bounds else {
            return 0;
        };
        let mut empty = Vec::new();
        for (&entity, state) in self.entities.iter_mut() {
            state.sweep(now, &bounds);
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

impl<E: Entity> ShardState<E> {
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

impl ShardState<SignalState> {
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

    /// One signal. A dry run reads the entity without promoting it, or an empty state
    /// without creating one. A recording promotes the entity (trimmed by the plan's
    /// window on the way), creates it only if it then holds something, and drops it if it
    /// emptied.
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

impl<E: Stored> Drop for ShardState<E> {
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

/// Observe a check's signals of one shard and answer their values, in order (see
/// [`ShardState::observe_signals`]).
#[derive(Debug, Message)]
#[rtype(result = "Vec<SignalValue>")]
pub(crate) struct ObserveSignals {
    pub asks: Vec<SignalAsk>,
    /// Taken once per check: every signal of it records the same instant.
    pub now: u64,
    pub dry_run: bool,
    /// As [`Observe::_permit`].
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

/// The actor around a [`ShardState`], on one of the pool's threads (or the caller's
/// System, `start_local`).
pub(crate) struct Shard<E: Stored> {
    pub state: ShardState<E>,
    pub tree: sled::Tree,
    pub clock: Arc<dyn Clock>,
    pub mailbox: usize,
    pub snapshot_every: Duration,
}

impl<E: Stored> Shard<E> {
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

impl<E: Stored> Actor for Shard<E> {
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

impl Handler<ObserveSignals> for Shard<SignalState> {
    type Result = MessageResult<ObserveSignals>;

    fn handle(&mut self, msg: ObserveSignals, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.state.observe_signals(&msg.asks, msg.now, msg.dry_run))
    }
}

impl<E: Stored> Handler<Snapshot> for Shard<E> {
    type Result = Result<(), sled::Error>;

    fn handle(&mut self, _: Snapshot, _: &mut Self::Context) -> Self::Result {
        self.write_snapshot()
    }
}

impl<E: Stored> Handler<Count> for Shard<E> {
    type Result = usize;

    fn handle(&mut self, _: Count, _: &mut Self::Context) -> usize {
        self.state.len()
    }
}

#[cfg(test)]
impl<E: Stored> Handler<Stall> for Shard<E> {
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

    mod signals {
        use super::*;
        use crate::behaviour::signal::member_of;
        use crate::decide::math;
        use crate::rules::Count;

        const T0: u64 = 1_700_000_000_000;

        fn spec(count: Count, window_ms: u64, max: u64) -> SignalSpec {
            SignalSpec {
                switches: count == Count::UserSwitches,
                shared: false,
                window_ms,
                max,
                min_share: None,
                cap: math::signal_cap(max, None) as u32,
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

        fn see(s: &mut ShardState<SignalState>, a: SignalAsk, now: u64) -> SignalValue {
            s.observe_signals(&[a], now, false)[0]
        }

        #[test]
        fn answers_in_ask_order_and_caps_entities() {
            let metrics = Metrics::new();
            let mut s = ShardState::<SignalState>::new(2, metrics.clone());
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
            assert_eq!(gauge(&metrics, "signal"), 2);
            drop(s);
            assert_eq!(gauge(&metrics, "signal"), 0);
        }

        #[test]
        fn dry_run_neither_creates_nor_changes_nor_promotes() {
            let mut s = ShardState::<SignalState>::new(2, Metrics::new());
            let dry = |s: &mut ShardState<SignalState>, a| s.observe_signals(&[a], T0, true)[0];
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
            let mut s = ShardState::<SignalState>::new(4, metrics.clone());
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
            assert_eq!(gauge(&metrics, "signal"), 0);
            let pending = s.take_dirty().expect("the dropped key is to be removed");
            assert_eq!(pending.keys, HashSet::from([entity_hash("A")]));
        }

        #[test]
        fn the_sweep_trims_each_key_by_its_own_window_from_the_start() {
            let metrics = Metrics::new();
            let mut s = ShardState::<SignalState>::new(10, metrics.clone());
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
            assert_eq!(gauge(&metrics, "signal"), 0);
            let pending = s.take_dirty().expect("dropped keys are dirty");
            assert_eq!(pending.keys.len(), 3);
            // Restored keys are swept before any observation (they carry their window).
            let mut restored = ShardState::<SignalState>::new(10, Metrics::new());
            let mut state = SignalState::new();
            state.observe(&spec(Count::Users, MIN, 5), 1, true, T0);
            restored.restore(7, state);
            assert_eq!(restored.sweep(T0 + MIN), 1);
        }

        /// A million signal keys with one member each (a million devices with one user),
        /// spread over 16 shards as in the default config: everything the shards allocate
        /// (LRU map and nodes, sets, the dirty set before the snapshot takes it) counted by
        /// the per-thread allocator. The legacy device state measures ~166 B the same way.
        #[test]
        fn a_million_single_member_keys_stay_under_170_bytes_each() {
            const N: usize = 1_000_000;
            const SHARDS: usize = 16;
            const BOUND: isize = 170;
            let sp = spec(Count::Users, 24 * 60 * MIN, 3);
            let metrics = Metrics::new();
            metrics.behaviour_entities("signal", 0);
            let before = counting_alloc::net();
            let mut shards: Vec<ShardState<SignalState>> = (0..SHARDS)
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
            println!(
                "signal memory: {per_dirty} B/key before the snapshot, {per_clean} B/key after"
            );
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
    }
}
