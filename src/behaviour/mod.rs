//! Behaviour signals on the embedded store: rolling per-key state that rate limits cannot
//! see.
//!
//! A sliding limit counts *requests* of one key; abuse scripts stay under it by spreading
//! over many accounts, devices and addresses. A signal counts *relations* instead — users
//! per device, user switches on a device, new accounts per network — in one grammar
//! (`count × per × where × window`, `[[scene.X.signals]]` and the `[behaviour]`
//! shorthands in API.md), planned by the check path as `decide::SignalPlan`s. On Redis
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

use std::hash::Hasher;

pub use pool::{BehaviourError, Behaviours, Unanswered};

/// Stable 64-bit hash of an id: a signal key (which shard holds it, and its sled key), a
/// member that is not already a hash, a counted value as the check path plans it.
///
/// `DefaultHasher::new()` is SipHash-1-3 with fixed keys, so the same id hashes alike in
/// every process: snapshots written to sled before a restart must still find their keys
/// afterwards, and every node maps an id to the same shard. std does not promise the
/// algorithm across Rust releases; the `entity_hash_is_pinned` test fails if a toolchain
/// upgrade changes it (snapshots would then need a new [`signal::FORMAT_VERSION`]). The
/// keys are public, so colliding ids can be searched for (~2^32 work per pair); a
/// collision makes two accounts count as one, which costs an attacker more than it gains.
pub fn entity_hash(s: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(s.as_bytes());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::entity_hash;

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
}
