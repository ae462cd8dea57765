//! The trust ledger in Redis, so every node sharing the Redis sees the same points.
//!
//! Per user, two keys (the segment after the prefix holds a hyphen, which scene names
//! cannot, so they never collide with a scene's keys; the user is percent-encoded like
//! every key segment):
//!
//! - `<prefix>:trust-points:uid:<user>`: a ZSET of awards, member
//!   `<points>:<type>:<event_id>`, score = expiry in unix ms. Expired members are trimmed
//!   on every read and award, and the key expires (PEXPIREAT) with its newest award: no
//!   key outlives its awards.
//! - `<prefix>:user-seen:uid:<user>`: the first sighting, unix ms, kept [`SEEN_RETENTION_MS`]
//!   past the last sighting.
//!
//! Each call is one EVALSHA of a `lua/trust_*.lua` script (loaded at construction; a
//! NOSCRIPT reply reloads and retries once) under our own deadline. Time is Redis `TIME`
//! unless a test injects a clock ([`RedisLedger::with_clock`]), as in the window store.

use std::sync::Arc;

use async_trait::async_trait;
use redis::{Script, Value};

use super::ledger::{Award, AwardKind, TrustLedger, TrustRead};
use crate::clock::Clock;
use crate::keys::{KeyPrefix, SEEN_RETENTION_MS};
use crate::store::redis::STARTUP_MIN_MS;
use crate::store::redis_link::RedisLink;
use crate::store::StoreError;

const READ_LUA: &str = include_str!("../../lua/trust_read.lua");
const AWARD_LUA: &str = include_str!("../../lua/trust_award.lua");
const AWARDS_LUA: &str = include_str!("../../lua/trust_awards.lua");

/// A [`TrustLedger`] on the node's Redis connection.
pub struct RedisLedger {
    /// The window store's link: one connection and one breaker for both.
    link: Arc<RedisLink>,
    prefix: KeyPrefix,
    read_script: Script,
    award_script: Script,
    awards_script: Script,
    /// `Some` replaces Redis `TIME` with this clock (a service built on any clock but the
    /// wall clock: tests, simulations).
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for RedisLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger")
            .field("prefix", &self.prefix)
            .field("link", &self.link)
            .field("injected_clock", &self.clock.is_some())
            .finish()
    }
}

impl RedisLedger {
    /// Builds the ledger on an existing connection (the window store's, see
    /// `RedisStore::link`) and loads its scripts, so a Redis that cannot take them
    /// fails at start-up rather than on the first event. `timeout_ms` bounds every later
    /// call; loading gets at least 1 s.
    pub async fn new(link: Arc<RedisLink>, prefix: &KeyPrefix) -> Result<RedisLedger, StoreError> {
        let timeout_ms = link.timeout_ms();
        let ledger = RedisLedger {
            link,
            prefix: prefix.clone(),
            read_script: Script::new(READ_LUA),
            award_script: Script::new(AWARD_LUA),
            awards_script: Script::new(AWARDS_LUA),
            clock: None,
        };
        let startup_ms = timeout_ms.max(STARTUP_MIN_MS);
        ledger
            .link
            .load_scripts(
                &[
                    &ledger.read_script,
                    &ledger.award_script,
                    &ledger.awards_script,
                ],
                startup_ms,
            )
            .await?;
        Ok(ledger)
    }

    /// Takes "now" from `clock` instead of Redis `TIME` (as the window store does; see
    /// [`crate::store::redis::RedisStore::with_clock`]). Key expiries still run on Redis's
    /// own clock, so keep such a clock near the real time.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// `<prefix>:trust-points:uid:<user>`.
    pub fn points_key(&self, user_id: &str) -> String {
        self.prefix.trust_points_key(user_id)
    }

    /// `<prefix>:user-seen:uid:<user>`.
    pub fn seen_key(&self, user_id: &str) -> String {
        self.prefix.user_seen_key(user_id)
    }

    /// The scripts' `now` argument: empty means "read Redis TIME".
    fn now_arg(&self) -> String {
        self.clock
            .as_ref()
            .map(|c| c.now_ms().to_string())
            .unwrap_or_default()
    }
}

/// The ZSET member of an award: `<points>:<type>:<event_id>`. The type is in the member so
/// `GET /v1/trust` can name it on any node, without the journal of the node that took it.
pub fn member(award: &Award) -> String {
    format!("{}:{}:{}", award.points, award.kind.name(), award.event_id)
}

/// Splits a member back into (points, kind, event id).
fn parse_member(m: &str) -> Option<(u32, AwardKind, &str)> {
    let (points, rest) = m.split_once(':')?;
    let (kind, event_id) = rest.split_once(':')?;
    let kind = AwardKind::from_name(kind)?;
    Some((points.parse().ok()?, kind, event_id))
}

fn protocol(script: &str, why: String) -> StoreError {
    StoreError::Protocol(format!("{script} reply: {why}"))
}

fn int(script: &str, v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(protocol(
            script,
            format!("expected an integer, got {other:?}"),
        )),
    }
}

#[async_trait]
impl TrustLedger for RedisLedger {
    async fn read(&self, user_id: &str, mark_seen: bool) -> Result<TrustRead, StoreError> {
        let mut inv = self.read_script.prepare_invoke();
        inv.key(self.points_key(user_id))
            .key(self.seen_key(user_id))
            .arg(self.now_arg())
            .arg(if mark_seen { "1" } else { "0" })
            .arg(SEEN_RETENTION_MS);
        let mut conn = self.link.conn().await?;
        let reply: Value = self.link.run(inv.invoke_async(&mut conn)).await?;
        let script = "trust_read.lua";
        let Value::Array(items) = reply else {
            return Err(protocol(
                script,
                format!("expected an array, got {reply:?}"),
            ));
        };
        let [points, first_seen] = items.as_slice() else {
            return Err(protocol(
                script,
                format!("{} values, expected 2", items.len()),
            ));
        };
        let points = u32::try_from(int(script, points)?)
            .map_err(|_| protocol(script, "points out of range".into()))?;
        let first_seen = int(script, first_seen)?;
        Ok(TrustRead {
            points,
            first_seen_ms: u64::try_from(first_seen).ok(),
        })
    }

    async fn award(&self, award: &Award) -> Result<(), StoreError> {
        let mut inv = self.award_script.prepare_invoke();
        inv.key(self.points_key(&award.user_id))
            .arg(member(award))
            .arg(&award.event_id)
            .arg(award.expires_at_ms)
            .arg(self.now_arg());
        let mut conn = self.link.conn().await?;
        let reply: Value = self.link.run(inv.invoke_async(&mut conn)).await?;
        // 0 (already awarded, or already expired) is as good as 1: the award stands.
        int("trust_award.lua", &reply).map(|_| ())
    }

    async fn awards(&self, user_id: &str) -> Result<Vec<Award>, StoreError> {
        let mut inv = self.awards_script.prepare_invoke();
        inv.key(self.points_key(user_id)).arg(self.now_arg());
        let mut conn = self.link.conn().await?;
        let reply: Value = self.link.run(inv.invoke_async(&mut conn)).await?;
        let script = "trust_awards.lua";
        let Value::Array(items) = reply else {
            return Err(protocol(
                script,
                format!("expected an array, got {reply:?}"),
            ));
        };
        if items.len() % 2 != 0 {
            return Err(protocol(
                script,
                format!("{} values, expected pairs", items.len()),
            ));
        }
        let mut awards = Vec::with_capacity(items.len() / 2);
        for pair in items.chunks_exact(2) {
            let m = match &pair[0] {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                other => return Err(protocol(script, format!("member {other:?}"))),
            };
            let Some((points, kind, event_id)) = parse_member(&m) else {
                // A member this code did not write: skip it rather than fail the read.
                tracing::warn!(key = %self.points_key(user_id), member = %m, "trust ledger: unreadable award member skipped");
                continue;
            };
            let expires_at = u64::try_from(int(script, &pair[1])?)
                .map_err(|_| protocol(script, "negative expiry".into()))?;
            awards.push(Award {
                event_id: event_id.to_string(),
                user_id: user_id.to_string(),
                kind,
                points,
                expires_at_ms: expires_at,
            });
        }
        Ok(awards)
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip_even_with_colons_in_the_event_id() {
        let award = Award {
            event_id: "pay:42:x".into(),
            user_id: "u".into(),
            kind: AwardKind::IdentityVerified,
            points: 2,
            expires_at_ms: 1,
        };
        let m = member(&award);
        assert_eq!(m, "2:identity_verified:pay:42:x");
        assert_eq!(
            parse_member(&m),
            Some((2, AwardKind::IdentityVerified, "pay:42:x"))
        );
        assert_eq!(parse_member("x:payment_succeeded:e"), None);
        assert_eq!(parse_member("1:other:e"), None);
    }
}
