//! The trust ledger in sled, for the embedded (one node, no Redis) mode.
//!
//! Two trees in the event journal's own sled database (one process per directory, so the
//! ledger shares the journal's `Db` rather than opening its own):
//!
//! - `trust`: user id -> the user's unexpired awards (JSON), oldest expiry first;
//! - `user_seen`: user id -> first sighting and last refresh (two big-endian u64 ms);
//! - `device_seen`: device id -> the same, for `[trust].new_device`.
//!
//! The same rules as the Redis ledger: an award is recorded at most once per event id,
//! expired awards count for nothing and are trimmed when the user's record is next
//! written, a sighting is forgotten [`SEEN_RETENTION_MS`] after the user was last seen.
//! Writes are read-modify-write under sled's compare-and-swap, so concurrent awards to one
//! user never lose each other. Time comes from the injected [`Clock`].

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::ledger::{scope_of, Award, AwardKind, TrustLedger, TrustRead};
use crate::clock::Clock;
use crate::keys::SEEN_RETENTION_MS;
use crate::store::StoreError;

/// A sighting's retention is refreshed at most this often: a check marks the user seen,
/// and rewriting the record on every check would cost a sled write per request for no
/// gain over a 90-day retention.
const SEEN_REFRESH_EVERY_MS: u64 = 86_400_000;

/// One award as stored under its user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stored {
    event_id: String,
    kind: AwardKind,
    points: u32,
    expires_at_ms: u64,
}

/// A [`TrustLedger`] in the journal's sled database.
pub struct SledLedger {
    db: sled::Db,
    trust: sled::Tree,
    seen: sled::Tree,
    device_seen: sled::Tree,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for SledLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No counts: sled's `len` walks the whole tree.
        f.debug_struct("SledLedger").finish_non_exhaustive()
    }
}

fn sled_err(what: &str, e: sled::Error) -> StoreError {
    StoreError::Unavailable(format!("trust ledger (sled tree {what}): {e}"))
}

fn decode(user_id: &str, bytes: &[u8]) -> Result<Vec<Stored>, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| {
        StoreError::Protocol(format!(
            "trust ledger (sled tree trust): unreadable awards of user {user_id:?}: {e}"
        ))
    })
}

fn encode(awards: &[Stored]) -> Vec<u8> {
    // Serialising plain structs of strings and integers cannot fail.
    serde_json::to_vec(awards).unwrap_or_default()
}

/// (first seen, last refreshed), or `None` for a missing or malformed record.
fn decode_seen(bytes: &[u8]) -> Option<(u64, u64)> {
    let first: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    let refreshed: [u8; 8] = bytes.get(8..16)?.try_into().ok()?;
    Some((u64::from_be_bytes(first), u64::from_be_bytes(refreshed)))
}

fn encode_seen(first: u64, refreshed: u64) -> [u8; 16] {
    let mut out = [0; 16];
    out[..8].copy_from_slice(&first.to_be_bytes());
    out[8..].copy_from_slice(&refreshed.to_be_bytes());
    out
}

impl SledLedger {
    /// Opens the ledger's trees in `db` (the event journal's database).
    pub fn open(db: &sled::Db, clock: Arc<dyn Clock>) -> Result<SledLedger, StoreError> {
        Ok(SledLedger {
            trust: db.open_tree("trust").map_err(|e| sled_err("trust", e))?,
            seen: db
                .open_tree("user_seen")
                .map_err(|e| sled_err("user_seen", e))?,
            device_seen: db
                .open_tree("device_seen")
                .map_err(|e| sled_err("device_seen", e))?,
            db: db.clone(),
            clock,
        })
    }

    /// The user's unexpired awards at `now`, oldest expiry first.
    fn live(&self, user_id: &str, now: u64) -> Result<Vec<Stored>, StoreError> {
        let Some(bytes) = self
            .trust
            .get(user_id.as_bytes())
            .map_err(|e| sled_err("trust", e))?
        else {
            return Ok(Vec::new());
        };
        let mut awards = decode(user_id, &bytes)?;
        awards.retain(|a| a.expires_at_ms > now);
        Ok(awards)
    }

    /// The user's unexpired points at `now`, uncapped.
    pub fn points(&self, user_id: &str, now: u64) -> Result<u32, StoreError> {
        Ok(self.points_and_pass(user_id, &[], now)?.0)
    }

    /// The user's unexpired points at `now`, uncapped, and whether an unexpired challenge
    /// pass has one of `scopes` ([`super::ledger::pass_scope`]): one read for a check.
    pub fn points_and_pass(
        &self,
        user_id: &str,
        scopes: &[&str],
        now: u64,
    ) -> Result<(u32, bool), StoreError> {
        let live = self.live(user_id, now)?;
        let points = live
            .iter()
            .fold(0u32, |sum, a| sum.saturating_add(a.points));
        let passed = live
            .iter()
            .any(|a| scope_of(a.kind, &a.event_id).is_some_and(|s| scopes.contains(&s)));
        Ok((points, passed))
    }

    /// The user's first sighting, marking the user seen when asked.
    pub fn user_seen(
        &self,
        user_id: &str,
        mark: bool,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        Self::sighting_in(&self.seen, "user_seen", user_id, mark, now)
    }

    /// The device's first sighting, marking the device seen when asked.
    pub fn device_seen(
        &self,
        device_id: &str,
        mark: bool,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        Self::sighting_in(&self.device_seen, "device_seen", device_id, mark, now)
    }

    fn sighting(&self, user_id: &str, mark: bool, now: u64) -> Result<Option<u64>, StoreError> {
        self.user_seen(user_id, mark, now)
    }

    /// A first sighting in `tree`, marking `id` seen when asked.
    fn sighting_in(
        tree: &sled::Tree,
        name: &str,
        id: &str,
        mark: bool,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        let key = id.as_bytes();
        let err = |e| sled_err(name, e);
        loop {
            let current = tree.get(key).map_err(err)?;
            let live = current
                .as_deref()
                .and_then(decode_seen)
                .filter(|(_, refreshed)| refreshed.saturating_add(SEEN_RETENTION_MS) > now);
            let next = match live {
                Some((first, refreshed)) if !mark || now < refreshed + SEEN_REFRESH_EVERY_MS => {
                    return Ok(Some(first))
                }
                Some((first, _)) => (first, encode_seen(first, now)),
                None if !mark => return Ok(None),
                None => (now, encode_seen(now, now)),
            };
            // Lost a race with another writer: read again and decide again.
            if tree
                .compare_and_swap(key, current, Some(&next.1[..]))
                .map_err(err)?
                .is_ok()
            {
                return Ok(Some(next.0));
            }
        }
    }
}

#[async_trait]
impl TrustLedger for SledLedger {
    async fn read(&self, user_id: &str, mark_seen: bool) -> Result<TrustRead, StoreError> {
        let now = self.clock.now_ms();
        let points = self
            .live(user_id, now)?
            .iter()
            .fold(0u32, |sum, a| sum.saturating_add(a.points));
        let first_seen_ms = self.sighting(user_id, mark_seen, now)?;
        Ok(TrustRead {
            points,
            first_seen_ms,
        })
    }

    async fn award(&self, award: &Award) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        if award.expires_at_ms <= now {
            return Ok(());
        }
        let key = award.user_id.as_bytes();
        let err = |e| sled_err("trust", e);
        loop {
            let current = self.trust.get(key).map_err(err)?;
            let mut awards = match &current {
                Some(bytes) => decode(&award.user_id, bytes)?,
                None => Vec::new(),
            };
            if awards.iter().any(|a| a.event_id == award.event_id) {
                return Ok(());
            }
            // Trim on write: a user's record holds only what still counts.
            awards.retain(|a| a.expires_at_ms > now);
            awards.push(Stored {
                event_id: award.event_id.clone(),
                kind: award.kind,
                points: award.points,
                expires_at_ms: award.expires_at_ms,
            });
            awards.sort_by(|a, b| {
                (a.expires_at_ms, &a.event_id).cmp(&(b.expires_at_ms, &b.event_id))
            });
            if self
                .trust
                .compare_and_swap(key, current, Some(encode(&awards)))
                .map_err(err)?
                .is_ok()
            {
                return Ok(());
            }
        }
    }

    async fn awards(&self, user_id: &str) -> Result<Vec<Award>, StoreError> {
        let now = self.clock.now_ms();
        Ok(self
            .live(user_id, now)?
            .into_iter()
            .map(|a| Award {
                event_id: a.event_id,
                user_id: user_id.to_string(),
                kind: a.kind,
                points: a.points,
                expires_at_ms: a.expires_at_ms,
            })
            .collect())
    }

    fn kind(&self) -> &'static str {
        "sled"
    }

    async fn sync(&self) -> Result<(), StoreError> {
        self.db
            .flush_async()
            .await
            .map(|_| ())
            .map_err(|e| sled_err("trust", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const T0: u64 = 1_700_000_000_000;
    const DAY: u64 = 86_400_000;

    fn ledger() -> (SledLedger, ManualClock, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let clock = ManualClock::new(T0);
        (
            SledLedger::open(&db, Arc::new(clock.clone())).unwrap(),
            clock,
            dir,
        )
    }

    fn award(event_id: &str, points: u32, expires_at_ms: u64) -> Award {
        Award {
            event_id: event_id.into(),
            user_id: "u".into(),
            kind: AwardKind::PaymentSucceeded,
            points,
            expires_at_ms,
        }
    }

    #[tokio::test]
    async fn awards_count_once_per_event_until_they_expire() {
        let (l, clock, _dir) = ledger();
        l.award(&award("e1", 1, T0 + DAY)).await.unwrap();
        l.award(&award("e1", 1, T0 + DAY)).await.unwrap();
        l.award(&award("e2", 2, T0 + 2 * DAY)).await.unwrap();
        // Already expired: nothing recorded.
        l.award(&award("e3", 5, T0)).await.unwrap();
        assert_eq!(l.read("u", false).await.unwrap().points, 3);
        let ids: Vec<String> = l
            .awards("u")
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.event_id)
            .collect();
        assert_eq!(ids, ["e1", "e2"]);
        clock.set(T0 + DAY);
        assert_eq!(l.read("u", false).await.unwrap().points, 2);
        clock.set(T0 + 2 * DAY);
        assert_eq!(l.read("u", false).await.unwrap().points, 0);
        assert!(l.awards("u").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_first_sighting_sticks_and_expires_after_retention() {
        let (l, clock, _dir) = ledger();
        assert_eq!(l.read("u", false).await.unwrap().first_seen_ms, None);
        assert_eq!(l.read("u", true).await.unwrap().first_seen_ms, Some(T0));
        clock.advance(DAY);
        assert_eq!(l.read("u", true).await.unwrap().first_seen_ms, Some(T0));
        // Refreshed at T0 + DAY: alive until then + retention.
        clock.set(T0 + DAY + SEEN_RETENTION_MS - 1);
        assert_eq!(l.read("u", false).await.unwrap().first_seen_ms, Some(T0));
        clock.set(T0 + DAY + SEEN_RETENTION_MS);
        assert_eq!(l.read("u", false).await.unwrap().first_seen_ms, None);
        let now = clock.now_ms();
        assert_eq!(l.read("u", true).await.unwrap().first_seen_ms, Some(now));
    }
}
