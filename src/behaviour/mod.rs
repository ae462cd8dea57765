//! Behaviour signals: rolling per-entity state that rate limits cannot see.
//!
//! A sliding limit counts *requests* of one key; abuse scripts stay under it by spreading
//! over many accounts, devices and addresses. The behaviour layer counts *relations*
//! instead: distinct accounts per device, account switches on a device, devices per user,
//! accounts per IP (`[scene.X.behaviour]` in API.md). Their values feed the scorer.
//!
//! [`Behaviours`] is the handle to the behaviour actors: one set of shards per dimension
//! (device, user, ip), each shard an actix actor owning the entities whose
//! [`state::entity_hash`] routes to it, capping their number (least recently seen out),
//! trimming on access and on a timer, and snapshotting to sled so a restart does not hand
//! attackers a clean slate. A check asks them with an [`Observation`] and gets
//! [`Observed`] back within the configured deadline, whatever state the shards are in.
//!
//! [`state`] is the math those actors run: plain data and functions, testable without an
//! actix System, with memory accounting and a compact snapshot encoding. `shard` wraps it
//! in the actor; `pool` starts, routes, snapshots and stops the shards.
//!
//! Signals are being generalised into one grammar (`count × per × where × window`,
//! `decide::SignalPlan`): [`signal`] is the state of one signal key, the same semantics
//! as `lua/decide.lua`'s, held by a fourth family of shards routed by the hash of the
//! plan's key and asked through [`Behaviours::signals`]. The four hand-coded kinds above
//! ([`Observation`], [`state`]'s entity types) stay until the check path has switched.

pub mod observe;
mod pool;
mod shard;
pub mod signal;
pub mod state;

pub use observe::{Observation, Observed, Unanswered};
pub use pool::{BehaviourError, Behaviours};
