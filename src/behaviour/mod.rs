//! Behaviour signals on the embedded store: rolling per-key state that rate limits cannot
//! see.
//!
//! A sliding limit counts *requests* of one key; abuse scripts stay under it by spreading
//! over many accounts, devices and addresses. A signal counts *relations* instead — users
//! per device, user switches on a device, new accounts per network — in one grammar
//! (`count × per × where × window`, `[[scene.X.signals]]` and the `[behaviour]`
//! shorthands in API.md), planned by the check path as [`crate::signal::SignalPlan`]s. On Redis
//! `lua/decide.lua` keeps them in ZSETs; here they live in actors, with the same answers.
//!
//! [`signal`] is the state of one signal key ([`signal::SignalState`]) and the math on
//! it: plain data and functions, testable without an actix System, with memory accounting
//! and a compact snapshot encoding. `shard` wraps the keys of one shard in an actix actor
//! (capping their number, least recently seen out; trimming on access and on a timer;
//! snapshotting to sled so a restart does not hand attackers a clean slate). `pool` is
//! [`Behaviours`], the handle that starts, routes to, snapshots and stops the shards: a
//! check asks it through [`Behaviours::signals`] and gets every value back within the
//! configured deadline, or [`Unanswered`] — which the embedded decider treats as the
//! store failing (the scene's `on_store_error`), never as an allow.

mod pool;
mod shard;
pub mod signal;

pub use pool::{BehaviourError, Behaviours, Unanswered};
