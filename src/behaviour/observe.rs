//! What a check asks the behaviour actors, and what it gets back (the legacy
//! [`Observation`]; the signal path takes `decide::SignalPlan`s), and what a shard that
//! does not answer costs: [`Unanswered`].

use super::state::{Signals, StateBounds};
use crate::rules::Behaviour;

/// One check's question to the behaviour actors: record this request (unless `dry_run`)
/// and give the scene's signals, the current request included.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    pub user: Option<&'a str>,
    pub device: Option<&'a str>,
    /// Canonical text form of the IP.
    pub ip: Option<&'a str>,
    /// The scene's `[behaviour]`: which signals to compute, over which windows.
    pub behaviour: &'a Behaviour,
    /// Caps and retention from the whole rule set (state is shared by every scene).
    pub bounds: StateBounds,
    /// Compute the signals as if the request were recorded, but record nothing.
    pub dry_run: bool,
}

/// A shard that gave no answer within the deadline (or is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unanswered {
    /// `device`, `user` or `ip`; `signal` for [`super::Behaviours::signals`].
    pub dimension: &'static str,
    /// `timeout` (no answer within the deadline) or `mailbox` (the shard is gone).
    pub reason: &'static str,
}

/// The answer: signals where a shard answered in time, `None` elsewhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub signals: Signals,
    pub unanswered: Vec<Unanswered>,
}
