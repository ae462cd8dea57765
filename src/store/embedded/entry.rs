//! What the embedded store keeps under one key, and how each kind expires.

use super::window::{Bucket, Fixed, Sliding};

/// How refund undoes a request in a fixed window or a bucket (the Redis record's
/// `"f:<start>" | "t"`). A sliding window needs no note: refund removes the request id,
/// which only this request added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    Fixed { start: u64 },
    Bucket,
}

/// A key as a record names it: 8 bytes instead of the key's text (a record outlives the
/// check by the record horizon, and most of a check's memory was its record). Refund
/// recomputes the candidate keys and matches them by this hash. FNV-1a, a fixed algorithm:
/// journaled records must match after a restart and an upgrade. Two of one refund's
/// candidate keys colliding in 64 bits is not a practical concern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash(pub u64);

impl KeyHash {
    pub fn of(key: &str) -> KeyHash {
        use std::hash::Hasher as _;
        let mut h = fnv::FnvHasher::default();
        h.write(key.as_bytes());
        KeyHash(h.finish())
    }
}

/// One key's state. Every entry expires: an expired entry is absent (as in Redis), and
/// the reaper reclaims it.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Sliding {
        set: Sliding,
        /// The longest window sharing the key (what it is trimmed to).
        retain: u64,
        expires_at: u64,
    },
    Fixed {
        state: Fixed,
        expires_at: u64,
    },
    Bucket {
        state: Bucket,
        expires_at: u64,
    },
    /// A counted request: the fixed windows and buckets it counted in, for refunds; its
    /// presence dedupes its id.
    Record {
        keys: Vec<(KeyHash, Tag)>,
        expires_at: u64,
    },
    /// An idempotency key: the request id that was counted.
    Idem {
        request_id: String,
        expires_at: u64,
    },
}

impl Entry {
    pub fn expires_at(&self) -> u64 {
        match self {
            Entry::Sliding { expires_at, .. }
            | Entry::Fixed { expires_at, .. }
            | Entry::Bucket { expires_at, .. }
            | Entry::Record { expires_at, .. }
            | Entry::Idem { expires_at, .. } => *expires_at,
        }
    }

    pub fn is_live(&self, now: u64) -> bool {
        self.expires_at() > now
    }

    /// Members held (1 for non-sliding entries): the unit memory is bounded by.
    pub fn weight(&self) -> usize {
        match self {
            Entry::Sliding { set, .. } => set.members.len(),
            _ => 1,
        }
    }
}
