//! What the embedded store keeps under one key, and how each kind expires.

use super::window::{Bucket, Fixed, Sliding};

/// How refund undoes a request in one key (the record's `"z" | "f:<start>" | "t"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    Sliding,
    Fixed { start: u64 },
    Bucket,
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
    /// A counted request: where it counted, for refunds; its presence dedupes its id.
    Record {
        keys: Vec<(String, Tag)>,
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
