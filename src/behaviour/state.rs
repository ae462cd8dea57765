//! The rolling-state math of the behaviour actors, as plain data and functions.
//!
//! # Shape
//!
//! State belongs to an *entity* (one device, one user, one IP) and is shared by every
//! scene: a device has one history, whichever promotion it claims. Scenes differ only in
//! the window they ask about, so the state keeps *timestamps* and every query takes
//! `(now_ms, window_ms)`. State older than the longest window any scene needs
//! ([`StateBounds`]) is dropped by `trim`; an entity left empty can be dropped whole.
//!
//! An entry at `t` counts while `t > now - window` (the window store's rule too), and the
//! actor calls `observe` *before* querying, so the current request is always included.
//!
//! # Bounds
//!
//! Every set has a cap: a device or IP seen with millions of users (a NAT, a farm) keeps
//! only the `cap` most recently seen, evicting the least recently seen. A count then
//! *saturates* at `cap`, which is harmless as long as `cap > max` for every configured
//! `max` — a saturated count is still over the line. [`safe_cap`] / [`StateBounds`]
//! compute such caps from the rule set; with them every count is exactly
//! `min(true count, cap)`.
//!
//! # Layout
//!
//! An entry is a 64-bit hash of the other entity and its last-seen time as absolute `u64`
//! milliseconds: 16 bytes. A per-entity base with `u32` offsets would make entries 12
//! bytes, but the base costs 8 bytes inline in every set, a `u32` of ms spans only 49
//! days (rebasing, a window ceiling), and the typical entity holds *one* entry — so the
//! offset layout only wins past two entries and is bigger where the memory actually is
//! (a million devices with one user each). Milliseconds match the rules' window unit, so
//! window edges are exact. Sets are `Vec`s kept sorted by last-seen: membership is a
//! linear scan from the newest end (repeat visitors are found first), counting and
//! trimming are a binary search, eviction takes the front. Sets are small; the cap
//! bounds the large ones. `Vec`s grow one step at a time (no 4-slot first allocation).
//!
//! # Snapshots
//!
//! `to_bytes` / `from_bytes` are a hand-written big-endian encoding headed by a format
//! version byte and a kind byte, checked strictly on the way in (a corrupt snapshot must
//! fail to load, never allocate without bound or break the sort invariant).

use std::hash::Hasher;
use std::mem::size_of;

use crate::rules::{Behaviour, SignalRule};

/// The snapshot format version, the first byte of every encoded state.
pub const FORMAT_VERSION: u8 = 1;

const KIND_DEVICE: u8 = b'D';
const KIND_USER: u8 = b'U';
const KIND_IP: u8 = b'I';

/// Stable 64-bit hash of an entity id (a user id, a device id, an IP's text form).
///
/// `DefaultHasher::new()` is SipHash-1-3 with fixed keys, so the same id hashes alike in
/// every process: snapshots written to sled before a restart must still find their
/// entities afterwards, and every node maps an id to the same shard. std does not promise
/// the algorithm across Rust releases; the `entity_hash_is_pinned` test fails if a
/// toolchain upgrade changes it (snapshots would then need a new [`FORMAT_VERSION`]).
/// The keys are public, so colliding ids can be searched for (~2^32 work per pair);
/// a collision makes two accounts count as one, which costs an attacker more than it
/// gains.
pub fn entity_hash(s: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(s.as_bytes());
    h.finish()
}

/// The smallest cap that keeps every given rule's verdict exact: `max + 1` of the largest
/// `max` (a value must be able to *exceed* its max), at least 1, at most `u32::MAX`.
pub fn safe_cap<'a>(rules: impl IntoIterator<Item = &'a SignalRule>) -> u32 {
    let max = rules.into_iter().map(|r| r.max).max().unwrap_or(0);
    u32::try_from(max.saturating_add(1)).unwrap_or(u32::MAX)
}

/// The longest window among the given rules (0 if none): state older than this answers
/// no query and may be trimmed.
pub fn retain_ms<'a>(rules: impl IntoIterator<Item = &'a SignalRule>) -> u64 {
    rules.into_iter().map(|r| r.window_ms).max().unwrap_or(0)
}

/// Caps and retention for every state kind, from all scenes' `[behaviour]` at once (state
/// is shared by scenes, so it must serve the largest `max` and the longest window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBounds {
    /// Cap of a device's distinct users (`accounts_per_device`).
    pub device_users_cap: u32,
    /// Cap of a device's remembered switches (`account_switches`).
    pub device_switches_cap: u32,
    /// Cap of a user's distinct devices (`devices_per_user`).
    pub user_devices_cap: u32,
    /// Cap of an IP's distinct users (`accounts_per_ip`).
    pub ip_users_cap: u32,
    /// Longest device window (`accounts_per_device`, `account_switches`).
    pub device_retain_ms: u64,
    /// Longest user window (`devices_per_user`).
    pub user_retain_ms: u64,
    /// Longest IP window (`accounts_per_ip`).
    pub ip_retain_ms: u64,
}

impl StateBounds {
    /// Bounds that keep every scene's signals exact.
    pub fn from_behaviours<'a>(behaviours: impl IntoIterator<Item = &'a Behaviour>) -> Self {
        let all: Vec<&Behaviour> = behaviours.into_iter().collect();
        let apd = || all.iter().filter_map(|b| b.accounts_per_device.as_ref());
        let sw = || all.iter().filter_map(|b| b.account_switches.as_ref());
        let dpu = || all.iter().filter_map(|b| b.devices_per_user.as_ref());
        let api = || all.iter().filter_map(|b| b.accounts_per_ip.as_ref());
        StateBounds {
            device_users_cap: safe_cap(apd()),
            device_switches_cap: safe_cap(sw()),
            user_devices_cap: safe_cap(dpu()),
            ip_users_cap: safe_cap(api()),
            device_retain_ms: retain_ms(apd()).max(retain_ms(sw())),
            user_retain_ms: retain_ms(dpu()),
            ip_retain_ms: retain_ms(api()),
        }
    }
}

/// Signal values (the current request included) for the signals a scene configures;
/// `None` where the scene does not ask or the state kind does not answer. Each state kind
/// fills its own fields; [`Signals::merge`] combines the device, user and IP answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    /// Distinct users on the device within the window.
    pub accounts_per_device: Option<u64>,
    /// User changes on the device within the window.
    pub account_switches: Option<u64>,
    /// Distinct devices of the user within the window.
    pub devices_per_user: Option<u64>,
    /// Distinct users behind the IP within the window.
    pub accounts_per_ip: Option<u64>,
}

impl Signals {
    /// Field-wise `self.or(other)`.
    pub fn merge(self, other: Signals) -> Signals {
        Signals {
            accounts_per_device: self.accounts_per_device.or(other.accounts_per_device),
            account_switches: self.account_switches.or(other.account_switches),
            devices_per_user: self.devices_per_user.or(other.devices_per_user),
            accounts_per_ip: self.accounts_per_ip.or(other.accounts_per_ip),
        }
    }
}

/// Why a snapshot failed to decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("snapshot is truncated")]
    Truncated,
    #[error("snapshot has {0} unexpected trailing bytes")]
    TrailingBytes(usize),
    #[error("unknown snapshot format version {0}")]
    UnknownVersion(u8),
    #[error("snapshot kind {found:#04x}, expected {expected:#04x}")]
    WrongKind { expected: u8, found: u8 },
    #[error("corrupt snapshot: {0}")]
    Corrupt(&'static str),
}

/// Is `at` inside `(now - window, ..]`? Written without underflow: while `now < window`
/// every time counts.
fn in_window(at: u64, now: u64, window: u64) -> bool {
    match now.checked_sub(window) {
        Some(lower) => at > lower,
        None => true,
    }
}

/// How many of the ascending `times` lie in the window.
fn count_sorted(times: impl Fn(usize) -> u64, len: usize, now: u64, window: u64) -> usize {
    // partition_point over an index range: the first index inside the window.
    let (mut lo, mut hi) = (0, len);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if in_window(times(mid), now, window) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    len - lo
}

/// Grows `v` by one slot when full: doubling, but never past `cap` and never starting at
/// four slots (`Vec`'s default for small types), because most sets hold one entry.
fn reserve_one<T>(v: &mut Vec<T>, cap: usize) {
    if v.len() == v.capacity() {
        let extra = v.len().max(1).min(cap.saturating_sub(v.len()).max(1));
        v.reserve_exact(extra);
    }
}

/// Gives memory back after a trim left a set mostly empty.
fn shrink_after_trim<T>(v: &mut Vec<T>) {
    if v.len() <= v.capacity() / 2 {
        v.shrink_to_fit();
    }
}

/// One remembered other entity: its hash and when it was last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    hash: u64,
    at: u64,
}

/// A bounded set of other entities by hash, each with its last-seen time: "distinct X
/// seen with this entity within a window".
///
/// Sorted by last-seen; holds at most `cap` entries, evicting the least recently seen, so
/// counts saturate at `cap` (see the module doc: keep `cap > max`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistinctRecent {
    entries: Vec<Entry>,
    cap: u32,
}

impl DistinctRecent {
    /// An empty set holding at most `cap` entries (at least 1).
    pub fn new(cap: u32) -> Self {
        DistinctRecent {
            entries: Vec::new(),
            cap: cap.max(1),
        }
    }

    /// The cap this set was built with.
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// Changes the cap (rules changed); shrinking evicts the least recently seen.
    pub fn set_cap(&mut self, cap: u32) {
        self.cap = cap.max(1);
        let over = self.entries.len().saturating_sub(self.cap as usize);
        if over > 0 {
            self.entries.drain(..over);
            self.entries.shrink_to_fit();
        }
    }

    /// Records `hash` seen at `now`: refreshes its last-seen (never moving it back), or
    /// inserts it, evicting the least recently seen entry when full.
    pub fn observe(&mut self, hash: u64, now: u64) {
        let at = match self.entries.iter().rposition(|e| e.hash == hash) {
            Some(i) => {
                let old = self.entries.remove(i);
                old.at.max(now)
            }
            None => {
                if self.entries.len() >= self.cap as usize {
                    self.entries.remove(0);
                }
                now
            }
        };
        reserve_one(&mut self.entries, self.cap as usize);
        let pos = self.entries.partition_point(|e| e.at <= at);
        self.entries.insert(pos, Entry { hash, at });
    }

    /// Distinct entities seen within `(now - window_ms, ..]`, at most `cap`.
    pub fn count_within(&self, now: u64, window_ms: u64) -> u64 {
        count_sorted(|i| self.entries[i].at, self.entries.len(), now, window_ms) as u64
    }

    /// Drops entries that no window up to `retain_ms` can count.
    pub fn trim(&mut self, now: u64, retain_ms: u64) {
        let keep_from = self
            .entries
            .partition_point(|e| !in_window(e.at, now, retain_ms));
        if keep_from > 0 {
            self.entries.drain(..keep_from);
            shrink_after_trim(&mut self.entries);
        }
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// When the most recently seen entry was seen.
    pub fn last_seen(&self) -> Option<u64> {
        self.entries.last().map(|e| e.at)
    }

    /// Heap bytes (allocated capacity); add `size_of::<Self>()` for the inline part.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * size_of::<Entry>()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.cap.to_be_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_be_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.hash.to_be_bytes());
            out.extend_from_slice(&e.at.to_be_bytes());
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let cap = r.u32()?;
        let len = r.u32()? as usize;
        if cap == 0 || len > cap as usize {
            return Err(DecodeError::Corrupt("set larger than its cap"));
        }
        // Check the bytes exist before allocating for them.
        r.need(len.saturating_mul(16))?;
        let mut entries = Vec::with_capacity(len);
        for _ in 0..len {
            entries.push(Entry {
                hash: r.u64()?,
                at: r.u64()?,
            });
        }
        if entries.windows(2).any(|w| w[0].at > w[1].at) {
            return Err(DecodeError::Corrupt("set not sorted by last seen"));
        }
        Ok(DistinctRecent { entries, cap })
    }
}

/// Account switches on one device: the last user, and when the user changed.
///
/// A,A,B,A is two switches. Switch times are sorted and capped like [`DistinctRecent`]
/// (oldest out, counts saturate at `cap`). The last user is not timed here: the owner
/// forgets it ([`Switches::forget_last`]) when the device itself is forgotten, so the
/// first user after a long silence is not a switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switches {
    times: Vec<u64>,
    last_user: u64,
    cap: u32,
    has_last: bool,
}

impl Switches {
    /// No last user, no switches; at most `cap` switch times (at least 1).
    pub fn new(cap: u32) -> Self {
        Switches {
            times: Vec::new(),
            last_user: 0,
            cap: cap.max(1),
            has_last: false,
        }
    }

    /// The cap this record was built with.
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// Changes the cap; shrinking drops the oldest switches.
    pub fn set_cap(&mut self, cap: u32) {
        self.cap = cap.max(1);
        let over = self.times.len().saturating_sub(self.cap as usize);
        if over > 0 {
            self.times.drain(..over);
            self.times.shrink_to_fit();
        }
    }

    /// Records `user` on the device at `now`; a user other than the last is a switch.
    pub fn observe(&mut self, user: u64, now: u64) {
        if self.has_last && self.last_user != user {
            if self.times.len() >= self.cap as usize {
                self.times.remove(0);
            }
            reserve_one(&mut self.times, self.cap as usize);
            let pos = self.times.partition_point(|&t| t <= now);
            self.times.insert(pos, now);
        }
        self.last_user = user;
        self.has_last = true;
    }

    /// Switches within `(now - window_ms, ..]`, at most `cap`.
    pub fn count_within(&self, now: u64, window_ms: u64) -> u64 {
        count_sorted(|i| self.times[i], self.times.len(), now, window_ms) as u64
    }

    /// Drops switches that no window up to `retain_ms` can count (keeps the last user).
    pub fn trim(&mut self, now: u64, retain_ms: u64) {
        let keep_from = self
            .times
            .partition_point(|&t| !in_window(t, now, retain_ms));
        if keep_from > 0 {
            self.times.drain(..keep_from);
            shrink_after_trim(&mut self.times);
        }
    }

    /// Forgets the last user: the next user starts afresh, not as a switch.
    pub fn forget_last(&mut self) {
        self.has_last = false;
        self.last_user = 0;
    }

    /// The last user's hash, if any is remembered.
    pub fn last_user(&self) -> Option<u64> {
        self.has_last.then_some(self.last_user)
    }

    /// No switch times and no last user.
    pub fn is_empty(&self) -> bool {
        self.times.is_empty() && !self.has_last
    }

    /// Heap bytes (allocated capacity).
    pub fn heap_bytes(&self) -> usize {
        self.times.capacity() * size_of::<u64>()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.cap.to_be_bytes());
        out.push(u8::from(self.has_last));
        out.extend_from_slice(&self.last_user.to_be_bytes());
        out.extend_from_slice(&(self.times.len() as u32).to_be_bytes());
        for t in &self.times {
            out.extend_from_slice(&t.to_be_bytes());
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let cap = r.u32()?;
        let has_last = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(DecodeError::Corrupt("bad last-user flag")),
        };
        let last_user = r.u64()?;
        let len = r.u32()? as usize;
        if cap == 0 || len > cap as usize {
            return Err(DecodeError::Corrupt("switches larger than their cap"));
        }
        r.need(len.saturating_mul(8))?;
        let mut times = Vec::with_capacity(len);
        for _ in 0..len {
            times.push(r.u64()?);
        }
        if times.windows(2).any(|w| w[0] > w[1]) {
            return Err(DecodeError::Corrupt("switches not sorted"));
        }
        Ok(Switches {
            times,
            last_user: if has_last { last_user } else { 0 },
            cap,
            has_last,
        })
    }
}

/// A device's state: its distinct users and its account switches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    /// Distinct users (`accounts_per_device`).
    pub users: DistinctRecent,
    /// User changes (`account_switches`).
    pub switches: Switches,
}

impl DeviceState {
    /// Empty state with the device caps of `bounds`.
    pub fn new(bounds: &StateBounds) -> Self {
        DeviceState {
            users: DistinctRecent::new(bounds.device_users_cap),
            switches: Switches::new(bounds.device_switches_cap),
        }
    }

    /// Applies new caps (the rules changed).
    pub fn set_bounds(&mut self, bounds: &StateBounds) {
        self.users.set_cap(bounds.device_users_cap);
        self.switches.set_cap(bounds.device_switches_cap);
    }

    /// Records a request of `user` (an [`entity_hash`]) from this device at `now`.
    pub fn observe(&mut self, user: u64, now: u64) {
        self.users.observe(user, now);
        self.switches.observe(user, now);
    }

    /// Distinct users within the window.
    pub fn accounts(&self, now: u64, window_ms: u64) -> u64 {
        self.users.count_within(now, window_ms)
    }

    /// User changes within the window.
    pub fn switches(&self, now: u64, window_ms: u64) -> u64 {
        self.switches.count_within(now, window_ms)
    }

    /// `accounts_per_device` and `account_switches`, where the scene configures them.
    pub fn signals(&self, now: u64, behaviour: &Behaviour) -> Signals {
        Signals {
            accounts_per_device: behaviour
                .accounts_per_device
                .map(|r| self.accounts(now, r.window_ms)),
            account_switches: behaviour
                .account_switches
                .map(|r| self.switches(now, r.window_ms)),
            ..Signals::default()
        }
    }

    /// Drops what no window up to `retain_ms` can count. Once no user is remembered the
    /// last user is forgotten too (the users set always keeps the most recent one, so it
    /// empties only when the whole device has been silent for `retain_ms`).
    pub fn trim(&mut self, now: u64, retain_ms: u64) {
        self.users.trim(now, retain_ms);
        self.switches.trim(now, retain_ms);
        if self.users.is_empty() {
            self.switches.forget_last();
        }
    }

    /// Nothing left: the actor may drop the device.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty() && self.switches.is_empty()
    }

    /// When the device was last seen (for the actor's least-recently-seen entity cap).
    pub fn last_seen(&self) -> Option<u64> {
        self.users.last_seen()
    }

    /// Inline plus heap bytes, allocator overhead not included.
    pub fn approx_bytes(&self) -> usize {
        size_of::<Self>() + self.users.heap_bytes() + self.switches.heap_bytes()
    }

    /// The snapshot encoding: version, kind, users, switches.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = header(KIND_DEVICE);
        self.users.encode(&mut out);
        self.switches.encode(&mut out);
        out
    }

    /// Decodes [`DeviceState::to_bytes`]; the caps are the snapshot's (apply the current
    /// rules' with [`DeviceState::set_bounds`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::open(bytes, KIND_DEVICE)?;
        let state = DeviceState {
            users: DistinctRecent::decode(&mut r)?,
            switches: Switches::decode(&mut r)?,
        };
        r.finish()?;
        Ok(state)
    }
}

/// A user's state: its distinct devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserState {
    /// Distinct devices (`devices_per_user`).
    pub devices: DistinctRecent,
}

impl UserState {
    /// Empty state with the user cap of `bounds`.
    pub fn new(bounds: &StateBounds) -> Self {
        UserState {
            devices: DistinctRecent::new(bounds.user_devices_cap),
        }
    }

    /// Applies new caps (the rules changed).
    pub fn set_bounds(&mut self, bounds: &StateBounds) {
        self.devices.set_cap(bounds.user_devices_cap);
    }

    /// Records a request of this user from `device` (an [`entity_hash`]) at `now`.
    pub fn observe(&mut self, device: u64, now: u64) {
        self.devices.observe(device, now);
    }

    /// Distinct devices within the window.
    pub fn devices(&self, now: u64, window_ms: u64) -> u64 {
        self.devices.count_within(now, window_ms)
    }

    /// `devices_per_user`, where the scene configures it.
    pub fn signals(&self, now: u64, behaviour: &Behaviour) -> Signals {
        Signals {
            devices_per_user: behaviour
                .devices_per_user
                .map(|r| self.devices(now, r.window_ms)),
            ..Signals::default()
        }
    }

    /// Drops what no window up to `retain_ms` can count.
    pub fn trim(&mut self, now: u64, retain_ms: u64) {
        self.devices.trim(now, retain_ms);
    }

    /// Nothing left: the actor may drop the user.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// When the user was last seen.
    pub fn last_seen(&self) -> Option<u64> {
        self.devices.last_seen()
    }

    /// Inline plus heap bytes, allocator overhead not included.
    pub fn approx_bytes(&self) -> usize {
        size_of::<Self>() + self.devices.heap_bytes()
    }

    /// The snapshot encoding: version, kind, devices.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = header(KIND_USER);
        self.devices.encode(&mut out);
        out
    }

    /// Decodes [`UserState::to_bytes`]; the cap is the snapshot's.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::open(bytes, KIND_USER)?;
        let state = UserState {
            devices: DistinctRecent::decode(&mut r)?,
        };
        r.finish()?;
        Ok(state)
    }
}

/// An IP's state: its distinct users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpState {
    /// Distinct users (`accounts_per_ip`).
    pub users: DistinctRecent,
}

impl IpState {
    /// Empty state with the IP cap of `bounds`.
    pub fn new(bounds: &StateBounds) -> Self {
        IpState {
            users: DistinctRecent::new(bounds.ip_users_cap),
        }
    }

    /// Applies new caps (the rules changed).
    pub fn set_bounds(&mut self, bounds: &StateBounds) {
        self.users.set_cap(bounds.ip_users_cap);
    }

    /// Records a request of `user` (an [`entity_hash`]) behind this IP at `now`.
    pub fn observe(&mut self, user: u64, now: u64) {
        self.users.observe(user, now);
    }

    /// Distinct users within the window.
    pub fn accounts(&self, now: u64, window_ms: u64) -> u64 {
        self.users.count_within(now, window_ms)
    }

    /// `accounts_per_ip`, where the scene configures it.
    pub fn signals(&self, now: u64, behaviour: &Behaviour) -> Signals {
        Signals {
            accounts_per_ip: behaviour
                .accounts_per_ip
                .map(|r| self.accounts(now, r.window_ms)),
            ..Signals::default()
        }
    }

    /// Drops what no window up to `retain_ms` can count.
    pub fn trim(&mut self, now: u64, retain_ms: u64) {
        self.users.trim(now, retain_ms);
    }

    /// Nothing left: the actor may drop the IP.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// When the IP was last seen.
    pub fn last_seen(&self) -> Option<u64> {
        self.users.last_seen()
    }

    /// Inline plus heap bytes, allocator overhead not included.
    pub fn approx_bytes(&self) -> usize {
        size_of::<Self>() + self.users.heap_bytes()
    }

    /// The snapshot encoding: version, kind, users.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = header(KIND_IP);
        self.users.encode(&mut out);
        out
    }

    /// Decodes [`IpState::to_bytes`]; the cap is the snapshot's.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::open(bytes, KIND_IP)?;
        let state = IpState {
            users: DistinctRecent::decode(&mut r)?,
        };
        r.finish()?;
        Ok(state)
    }
}

fn header(kind: u8) -> Vec<u8> {
    vec![FORMAT_VERSION, kind]
}

/// A cursor over snapshot bytes; every read checks the length.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Checks the version and kind bytes.
    fn open(bytes: &'a [u8], kind: u8) -> Result<Self, DecodeError> {
        let mut r = Reader { rest: bytes };
        let version = r.u8()?;
        if version != FORMAT_VERSION {
            return Err(DecodeError::UnknownVersion(version));
        }
        let found = r.u8()?;
        if found != kind {
            return Err(DecodeError::WrongKind {
                expected: kind,
                found,
            });
        }
        Ok(r)
    }

    fn need(&self, n: usize) -> Result<(), DecodeError> {
        if self.rest.len() < n {
            Err(DecodeError::Truncated)
        } else {
            Ok(())
        }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self
            .rest
            .split_first_chunk::<N>()
            .ok_or(DecodeError::Truncated)?;
        self.rest = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    fn finish(self) -> Result<(), DecodeError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}
