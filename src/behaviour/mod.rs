//! Behaviour signals: rolling per-entity state that rate limits cannot see.
//!
//! A sliding limit counts *requests* of one key; abuse scripts stay under it by spreading
//! over many accounts, devices and addresses. The behaviour layer counts *relations*
//! instead: distinct accounts per device, account switches on a device, devices per user,
//! accounts per IP (`[scene.X.behaviour]` in API.md). Their values feed the scorer.
//!
//! The module will own the behaviour actors: one set of shards per dimension (device,
//! user, ip), each shard an actix actor keyed by [`state::entity_hash`] of the entity id,
//! owning its entities' state, capping the number of entities (least recently seen out),
//! trimming on a timer and snapshotting to sled so a restart does not hand attackers a
//! clean slate.
//!
//! [`state`] is the math those actors run: plain data and functions, testable without an
//! actix System, with memory accounting and a compact snapshot encoding.

pub mod observe;
pub mod state;

pub use observe::{Observation, Observed, Unanswered};
