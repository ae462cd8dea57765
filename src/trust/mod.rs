//! Trust: points earned from payment and identity events, and when a user was first seen.
//!
//! Events arrive on `POST /v1/events` ([`event`] parses them), are journaled in sled and
//! flushed before they are acknowledged ([`journal`]), then applied to the [`TrustLedger`]
//! (Redis in Redis mode, so every node sees the same points: [`redis_ledger`]; sled in
//! embedded mode: [`sled_ledger`]) by the [`Events`] service, which replays whatever the
//! store could not take yet. A check reads the ledger to raise `trust_bonus` limits,
//! discount the score and tell new accounts from old ones.

pub mod event;
pub mod events;
pub mod journal;
pub mod ledger;
pub mod redis_ledger;
pub mod sled_ledger;

pub use events::{Events, EventsError, IngestError, IngestReport, TrustView};
pub use ledger::{Award, AwardKind, TrustLedger, TrustRead};
pub use redis_ledger::RedisLedger;
pub use sled_ledger::SledLedger;
