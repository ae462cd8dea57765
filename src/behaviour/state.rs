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
//! bounds the large ones. `Vec`s start at one slot (not `Vec`'s four) and double up to the cap.
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
pub(super) fn in_window(at: u64, now: u64, window: u64) -> bool {
    match now.checked_sub(window) {
        Some(lower) => at > lower,
        None => true,
    }
}

/// Index of the first of the ascending-by-time `items` inside the window: everything
/// before it is out, everything from it on is in.
pub(super) fn first_in_window<T>(
    items: &[T],
    at: impl Fn(&T) -> u64,
    now: u64,
    window: u64,
) -> usize {
    items.partition_point(|x| !in_window(at(x), now, window))
}

/// Grows `v` by one slot when full: doubling, but never past `cap` and never starting at
/// four slots (`Vec`'s default for small types), because most sets hold one entry.
pub(super) fn reserve_one<T>(v: &mut Vec<T>, cap: usize) {
    if v.len() == v.capacity() {
        let extra = v.len().max(1).min(cap.saturating_sub(v.len()).max(1));
        v.reserve_exact(extra);
    }
}

/// Gives memory back after a trim left a set mostly empty.
pub(super) fn shrink_after_trim<T>(v: &mut Vec<T>) {
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
        (self.entries.len() - first_in_window(&self.entries, |e| e.at, now, window_ms)) as u64
    }

    /// Drops entries that no window up to `retain_ms` can count.
    pub fn trim(&mut self, now: u64, retain_ms: u64) {
        let keep_from = first_in_window(&self.entries, |e| e.at, now, retain_ms);
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
        (self.times.len() - first_in_window(&self.times, |&t| t, now, window_ms)) as u64
    }

    /// Drops switches that no window up to `retain_ms` can count (keeps the last user).
    pub fn trim(&mut self, now: u64, retain_ms: u64) {
        let keep_from = first_in_window(&self.times, |&t| t, now, retain_ms);
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

/// A cursor over snapshot bytes; every read checks the length. Shared with the signal
/// state's encoding (`signal`), which reads its own header.
pub(super) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `bytes`, checking nothing yet.
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    /// Checks the version and kind bytes.
    fn open(bytes: &'a [u8], kind: u8) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
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

    pub(super) fn need(&self, n: usize) -> Result<(), DecodeError> {
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

    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }

    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    pub(super) fn finish(self) -> Result<(), DecodeError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 0xA;
    const B: u64 = 0xB;
    const C: u64 = 0xC;

    fn rule(window_ms: u64, max: u64) -> Option<SignalRule> {
        Some(SignalRule { window_ms, max })
    }

    fn bounds() -> StateBounds {
        StateBounds::from_behaviours([&Behaviour {
            accounts_per_device: rule(1_000, 3),
            account_switches: rule(500, 2),
            devices_per_user: rule(1_000, 5),
            accounts_per_ip: rule(1_000, 50),
        }])
    }

    #[test]
    fn entity_hash_is_pinned() {
        // Snapshots store these hashes: a change here orphans every snapshot.
        assert_eq!(entity_hash("10086"), entity_hash("10086"));
        assert_ne!(entity_hash("10086"), entity_hash("10087"));
        assert_eq!(
            entity_hash("10086"),
            PINNED_10086,
            "std changed DefaultHasher"
        );
    }

    const PINNED_10086: u64 = 9_653_547_755_553_248_206;

    #[test]
    fn distinct_window_edge_is_exclusive_of_now_minus_window() {
        let mut s = DistinctRecent::new(8);
        s.observe(A, 1_000);
        // Counts while 1_000 > now - 100, i.e. up to now = 1_099.
        assert_eq!(s.count_within(1_099, 100), 1);
        assert_eq!(s.count_within(1_100, 100), 0);
        // A window reaching before time 0 counts everything.
        assert_eq!(s.count_within(50, 100), 1);
    }

    #[test]
    fn accounts_per_device_counts_distinct_users_current_included() {
        let b = bounds();
        let mut d = DeviceState::new(&b);
        d.observe(A, 100);
        assert_eq!(d.accounts(100, 1_000), 1, "the current request counts");
        d.observe(A, 200);
        d.observe(B, 300);
        assert_eq!(d.accounts(300, 1_000), 2);
        d.observe(C, 1_199);
        // At 1_199 the 1s window is (199, 1_199]: A (last seen 200) is still in.
        assert_eq!(d.accounts(1_199, 1_000), 3);
        // At 1_200 it is (200, 1_200]: A has left; B (300) and C remain.
        assert_eq!(d.accounts(1_200, 1_000), 2);
        // A repeat refreshes last-seen rather than adding.
        d.observe(B, 1_200);
        assert_eq!(d.users.len(), 3);
        assert_eq!(d.accounts(1_250, 1_000), 2);
    }

    #[test]
    fn account_switches_aaba_is_two() {
        let b = bounds();
        let mut d = DeviceState::new(&b);
        for (i, u) in [A, A, B, A].into_iter().enumerate() {
            d.observe(u, 100 + i as u64);
        }
        assert_eq!(d.switches(103, 500), 2);
        assert_eq!(d.switches.last_user(), Some(A));
        // Window edge: the B->A switch at 103 counts up to now = 602.
        assert_eq!(d.switches(602, 500), 1);
        assert_eq!(d.switches(603, 500), 0);
    }

    #[test]
    fn switch_of_current_request_is_included() {
        let b = bounds();
        let mut d = DeviceState::new(&b);
        d.observe(A, 10);
        assert_eq!(d.switches(10, 500), 0, "first user is no switch");
        d.observe(B, 20);
        assert_eq!(d.switches(20, 500), 1);
    }

    #[test]
    fn devices_per_user_and_accounts_per_ip() {
        let b = bounds();
        let mut u = UserState::new(&b);
        u.observe(A, 0);
        u.observe(B, 10);
        u.observe(A, 20);
        assert_eq!(u.devices(20, 1_000), 2);
        let mut ip = IpState::new(&b);
        for (i, user) in [A, B, C, B].into_iter().enumerate() {
            ip.observe(user, i as u64 * 400);
        }
        // At 1_200: A (0) is out of the 1s window; C (800) and B (1_200) count, B once.
        assert_eq!(ip.accounts(1_200, 1_000), 2);
        assert_eq!(ip.accounts(1_200, 1_300), 3);
    }

    #[test]
    fn window_smaller_than_retain_answers_each_scene() {
        let behaviours = [
            Behaviour {
                accounts_per_device: rule(10_000, 3),
                ..Behaviour::default()
            },
            Behaviour {
                accounts_per_device: rule(1_000, 1),
                account_switches: rule(2_000, 0),
                ..Behaviour::default()
            },
        ];
        let b = StateBounds::from_behaviours(&behaviours);
        assert_eq!(b.device_retain_ms, 10_000);
        assert_eq!(b.device_users_cap, 4);
        assert_eq!(b.device_switches_cap, 1);
        let mut d = DeviceState::new(&b);
        d.observe(A, 0);
        d.observe(B, 5_000);
        d.trim(5_000, b.device_retain_ms);
        let long = d.signals(5_000, &behaviours[0]);
        let short = d.signals(5_000, &behaviours[1]);
        assert_eq!(long.accounts_per_device, Some(2));
        assert_eq!(long.account_switches, None);
        assert_eq!(short.accounts_per_device, Some(1));
        assert_eq!(short.account_switches, Some(1));
        assert_eq!(short.devices_per_user, None);
    }

    #[test]
    fn signals_merge_across_kinds() {
        let beh = Behaviour {
            accounts_per_device: rule(1_000, 3),
            devices_per_user: rule(1_000, 5),
            accounts_per_ip: rule(1_000, 50),
            ..Behaviour::default()
        };
        let b = StateBounds::from_behaviours([&beh]);
        let (mut d, mut u, mut ip) = (DeviceState::new(&b), UserState::new(&b), IpState::new(&b));
        d.observe(A, 1);
        u.observe(B, 1);
        ip.observe(A, 1);
        let s = d
            .signals(1, &beh)
            .merge(u.signals(1, &beh))
            .merge(ip.signals(1, &beh));
        assert_eq!(
            s,
            Signals {
                accounts_per_device: Some(1),
                account_switches: None,
                devices_per_user: Some(1),
                accounts_per_ip: Some(1),
            }
        );
    }

    #[test]
    fn trim_drops_old_state_and_empties() {
        let b = bounds();
        let mut d = DeviceState::new(&b);
        d.observe(A, 0);
        d.observe(B, 400);
        d.trim(1_000, 1_000);
        assert!(!d.is_empty(), "B at 400 is still inside 1s");
        assert_eq!(d.last_seen(), Some(400));
        assert_eq!(d.users.len(), 1);
        d.trim(1_400, 1_000);
        assert!(
            d.is_empty(),
            "device silent for retain_ms is forgotten whole"
        );
        assert_eq!(d.last_seen(), None);
        assert_eq!(d.switches.last_user(), None);
        // The first user after the silence is not a switch.
        d.observe(C, 5_000);
        assert_eq!(d.switches(5_000, 500), 0);

        let mut u = UserState::new(&b);
        u.observe(A, 0);
        u.trim(999, 1_000);
        assert!(!u.is_empty());
        u.trim(1_000, 1_000);
        assert!(u.is_empty());
        let mut ip = IpState::new(&b);
        ip.observe(A, 0);
        ip.trim(1_000, 1_000);
        assert!(ip.is_empty());
    }

    #[test]
    fn cap_evicts_least_recently_seen_and_count_saturates() {
        let mut s = DistinctRecent::new(3);
        s.observe(1, 10);
        s.observe(2, 20);
        s.observe(3, 30);
        s.observe(1, 40); // 1 is now the most recent; 2 the least.
        s.observe(4, 50); // evicts 2
        assert_eq!(s.len(), 3);
        assert_eq!(s.count_within(50, 1_000), 3);
        s.observe(2, 60); // 2 is new again; evicts 3
        s.observe(3, 70); // evicts 1
        assert_eq!(s.count_within(70, 25), 3, "4, 2, 3 are held");
        for h in 100..10_000 {
            s.observe(h, 100 + h);
        }
        assert_eq!(s.count_within(20_000, 100_000), 3, "saturates at the cap");
        assert_eq!(s.len(), 3);
        assert!(
            s.heap_bytes() <= 3 * 16,
            "capacity never grows past the cap"
        );
        s.set_cap(2);
        assert_eq!(s.len(), 2);
        assert_eq!(s.last_seen(), Some(100 + 9_999));
    }

    #[test]
    fn switches_cap_drops_oldest_and_saturates() {
        let mut sw = Switches::new(2);
        for i in 0..10u64 {
            sw.observe(i % 2, i * 10);
        }
        assert_eq!(sw.count_within(90, 1_000), 2);
        assert_eq!(sw.count_within(90, 10), 1, "the newest (90) is kept");
        assert_eq!(
            sw.count_within(90, 11),
            2,
            "80 too; 70 and older were dropped"
        );
    }

    #[test]
    fn saturated_count_still_exceeds_max_with_safe_cap() {
        let r = SignalRule {
            window_ms: 1_000,
            max: 3,
        };
        let cap = safe_cap([&r]);
        assert_eq!(cap, 4);
        let mut s = DistinctRecent::new(cap);
        for h in 0..1_000 {
            s.observe(h, 500);
        }
        assert!(s.count_within(500, r.window_ms) > r.max);
        assert_eq!(safe_cap([]), 1);
        assert_eq!(retain_ms([]), 0);
        let huge = SignalRule {
            window_ms: 1,
            max: u64::MAX,
        };
        assert_eq!(safe_cap([&huge]), u32::MAX);
    }

    #[test]
    fn last_seen_never_moves_back() {
        let mut s = DistinctRecent::new(4);
        s.observe(A, 100);
        s.observe(B, 50); // a late request from a skewed clock
        s.observe(A, 40);
        assert_eq!(s.last_seen(), Some(100));
        assert_eq!(s.count_within(100, 50), 1, "B at 50 sorted before A at 100");
        assert_eq!(s.count_within(100, 51), 2);
    }

    fn sample_device() -> DeviceState {
        let b = bounds();
        let mut d = DeviceState::new(&b);
        for (i, u) in [A, B, A, C].into_iter().enumerate() {
            d.observe(u, 1_700_000_000_000 + i as u64 * 7);
        }
        d
    }

    #[test]
    fn snapshot_round_trips() {
        let d = sample_device();
        let bytes = d.to_bytes();
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(DeviceState::from_bytes(&bytes), Ok(d.clone()));
        let empty = DeviceState::new(&bounds());
        assert_eq!(DeviceState::from_bytes(&empty.to_bytes()), Ok(empty));

        let mut u = UserState::new(&bounds());
        u.observe(A, 5);
        u.observe(B, 6);
        assert_eq!(UserState::from_bytes(&u.to_bytes()), Ok(u));
        let mut ip = IpState::new(&bounds());
        ip.observe(C, u64::MAX);
        assert_eq!(IpState::from_bytes(&ip.to_bytes()), Ok(ip));
    }

    #[test]
    fn snapshot_rejects_truncated_and_foreign_bytes() {
        let bytes = sample_device().to_bytes();
        for n in 0..bytes.len() {
            assert_eq!(
                DeviceState::from_bytes(&bytes[..n]),
                Err(DecodeError::Truncated),
                "prefix of {n} bytes"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            DeviceState::from_bytes(&long),
            Err(DecodeError::TrailingBytes(1))
        );
        let mut v2 = bytes.clone();
        v2[0] = 2;
        assert_eq!(
            DeviceState::from_bytes(&v2),
            Err(DecodeError::UnknownVersion(2))
        );
        assert!(matches!(
            UserState::from_bytes(&bytes),
            Err(DecodeError::WrongKind { .. })
        ));
        // A length beyond the cap is refused before any allocation.
        let mut huge = IpState::new(&bounds()).to_bytes();
        huge[6..10].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            IpState::from_bytes(&huge),
            Err(DecodeError::Corrupt(_))
        ));
    }

    #[test]
    fn snapshot_rejects_unsorted_entries() {
        let mut ip = IpState::new(&bounds());
        ip.observe(A, 1);
        ip.observe(B, 2);
        let mut bytes = ip.to_bytes();
        // Entries start after version, kind, cap, len (10 bytes); swap their times.
        let (first_at, second_at) = (10 + 8..10 + 16, 10 + 24..10 + 32);
        let t1: [u8; 8] = bytes[first_at.clone()].try_into().expect("8 bytes");
        let t2: [u8; 8] = bytes[second_at.clone()].try_into().expect("8 bytes");
        bytes[first_at].copy_from_slice(&t2);
        bytes[second_at].copy_from_slice(&t1);
        assert_eq!(
            IpState::from_bytes(&bytes),
            Err(DecodeError::Corrupt("set not sorted by last seen"))
        );
    }

    #[test]
    fn one_million_single_user_devices_under_96_bytes_each() {
        const N: u64 = 1_000_000;
        const BOUND_PER_DEVICE: usize = 96;
        let b = bounds();
        let mut devices = Vec::with_capacity(N as usize);
        for i in 0..N {
            let mut d = DeviceState::new(&b);
            d.observe(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), 1_700_000_000_000 + i);
            devices.push(d);
        }
        let total: usize = devices.iter().map(DeviceState::approx_bytes).sum();
        let per = total / N as usize;
        assert!(
            total < BOUND_PER_DEVICE * N as usize,
            "{per} bytes per device, bound < {BOUND_PER_DEVICE}"
        );
        // The typical user and IP (one device, one user) are smaller still.
        let mut u = UserState::new(&b);
        u.observe(A, 1);
        assert!(u.approx_bytes() < 64, "user: {} bytes", u.approx_bytes());
        let mut ip = IpState::new(&b);
        ip.observe(A, 1);
        assert!(ip.approx_bytes() < 64, "ip: {} bytes", ip.approx_bytes());
    }

    #[test]
    fn layout_sizes_are_as_documented() {
        assert_eq!(size_of::<Entry>(), 16);
        assert_eq!(size_of::<DistinctRecent>(), 32);
        assert_eq!(size_of::<Switches>(), 40);
        // Users grow 1, 2, 4 slots; switches (A,B,A,C: three) 1, 2, then up to their cap 3.
        assert_eq!(sample_device().approx_bytes(), 72 + 4 * 16 + 3 * 8);
    }
}
