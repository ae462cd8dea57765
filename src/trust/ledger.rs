//! The trust ledger: per user, the unexpired awards and the first sighting.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::store::StoreError;

/// Which event earned an award.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AwardKind {
    PaymentSucceeded,
    IdentityVerified,
}

impl AwardKind {
    /// The event type name (`payment_succeeded`, `identity_verified`).
    pub fn name(self) -> &'static str {
        match self {
            AwardKind::PaymentSucceeded => "payment_succeeded",
            AwardKind::IdentityVerified => "identity_verified",
        }
    }
}

/// Points one event gave one user, until `expires_at_ms` (unix ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Award {
    /// The event's id: an award is recorded at most once per event id.
    pub event_id: String,
    pub user_id: String,
    pub kind: AwardKind,
    pub points: u32,
    pub expires_at_ms: u64,
}

/// What a check needs from the ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrustRead {
    /// Sum of the user's unexpired awards, *uncapped* (the caller applies
    /// `[trust].max_points` from the rule set it holds).
    pub points: u32,
    /// When the service first saw the user (unix ms), if it has.
    pub first_seen_ms: Option<u64>,
}

/// Per-user trust, shared by every node that shares the ledger.
#[async_trait]
pub trait TrustLedger: Send + Sync + 'static {
    /// The user's unexpired points and first sighting. With `mark_seen`, a user never seen
    /// before is recorded as first seen now (and `first_seen_ms` is now), and an existing
    /// sighting's retention is refreshed.
    async fn read(&self, user_id: &str, mark_seen: bool) -> Result<TrustRead, StoreError>;

    /// Records an award; applying the same `event_id` again changes nothing.
    async fn award(&self, award: &Award) -> Result<(), StoreError>;

    /// The user's unexpired awards, oldest expiry first (for `GET /v1/trust/{user_id}`).
    async fn awards(&self, user_id: &str) -> Result<Vec<Award>, StoreError>;

    /// A short name for logs and metrics (`redis`, `sled`).
    fn kind(&self) -> &'static str;

    /// Makes every award recorded so far durable. The event journal calls it before it
    /// forgets applied awards, so a crash cannot lose an award the journal no longer holds.
    /// Redis keeps its own durability policy: nothing to do there.
    async fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
