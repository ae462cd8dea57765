//! Trust: points earned from payment and identity events, and when a user was first seen.
//!
//! Events arrive on `POST /v1/events`, are journaled in sled and flushed before they are
//! acknowledged, then applied to the [`TrustLedger`] (Redis in Redis mode, so every node
//! sees the same points; sled in embedded mode). A check reads the ledger to raise
//! `trust_bonus` limits, discount the score and tell new accounts from old ones.

pub mod ledger;

pub use ledger::{Award, AwardKind, TrustLedger, TrustRead};
