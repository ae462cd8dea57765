//! Trust: points earned from payment and identity events, and when a user was first seen.
//!
//! Events arrive on `POST /v1/events` ([`event`] parses them), are journaled in sled and
//! flushed before they are acknowledged ([`journal`]), then applied to the [`TrustLedger`]
//! (Redis in Redis mode, so every node sees the same points: [`redis_ledger`]; sled in
//! embedded mode: [`sled_ledger`]) by the [`Events`] service, which replays whatever the
//! store could not take yet. A check reads the ledger (through its decider) to raise
//! `trust_bonus` limits, discount the score and tell new accounts from old ones.
//!
//! A `benefit_rolled_back` event is a refund: [`Events`] computes its op with
//! [`crate::refund`] when it accepts the event and applies it like an award. Keys come from
//! [`crate::keys`] and validation errors from [`crate::input`]: trust imports nothing of
//! the check path.

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
