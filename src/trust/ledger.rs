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
    /// A reported challenge pass: its ledger id is scoped ([`pass_scope`]).
    ChallengePassed,
}

impl AwardKind {
    /// The event type name (`payment_succeeded`, `identity_verified`, `challenge_passed`).
    pub fn name(self) -> &'static str {
        match self {
            AwardKind::PaymentSucceeded => "payment_succeeded",
            AwardKind::IdentityVerified => "identity_verified",
            AwardKind::ChallengePassed => "challenge_passed",
        }
    }

    /// The kind of a type name.
    pub fn from_name(name: &str) -> Option<AwardKind> {
        [
            AwardKind::PaymentSucceeded,
            AwardKind::IdentityVerified,
            AwardKind::ChallengePassed,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }
}

/// The scope of a challenge pass in the ledger: the scene (a pass on any device) or the
/// scene and a hash of the device. Scene names are `[A-Za-z0-9_]`, so a scope never holds
/// the `/` that ends it in a ledger id, and no scope is [`POINTS_ONLY`].
pub fn pass_scope(scene: &str, device: Option<&str>) -> String {
    match device {
        None => scene.to_string(),
        Some(d) => format!("{scene}.{:016x}", crate::signal::entity_hash(d)),
    }
}

/// The scope of the points a pass earns (`[trust].challenge_passed`): no scene's, so they
/// lift no band.
pub const POINTS_ONLY: &str = "*";

/// A challenge pass's ledger id: `<scope>/<event_id>`, so one event may leave a pass per
/// scene, and its points, each recorded once.
pub fn pass_id(scope: &str, event_id: &str) -> String {
    format!("{scope}/{event_id}")
}

/// Points one event gave one user, until `expires_at_ms` (unix ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Award {
    /// The event's id: an award is recorded at most once per event id. A challenge pass's
    /// is scoped ([`pass_id`]).
    pub event_id: String,
    pub user_id: String,
    pub kind: AwardKind,
    pub points: u32,
    pub expires_at_ms: u64,
}

impl Award {
    /// A challenge pass's scope (a scene, a scene and device, or [`POINTS_ONLY`]); `None`
    /// for any other award.
    pub fn pass_scope(&self) -> Option<&str> {
        scope_of(self.kind, &self.event_id)
    }

    /// The event id as sent, and the scene a pass lifts (`None` for any other award, and
    /// for the points a pass earned).
    pub fn sent_id_and_scene(&self) -> (&str, Option<&str>) {
        match (self.pass_scope(), self.event_id.split_once('/')) {
            (Some(scope), Some((_, sent))) => {
                let scene = scope.split('.').next().filter(|s| *s != POINTS_ONLY);
                (sent, scene)
            }
            _ => (&self.event_id, None),
        }
    }
}

/// The scope of an award recorded under `event_id` (see [`Award::pass_scope`]).
pub fn scope_of(kind: AwardKind, event_id: &str) -> Option<&str> {
    (kind == AwardKind::ChallengePassed)
        .then(|| event_id.split_once('/').map(|(scope, _)| scope))
        .flatten()
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
