//! The Redis window store: every limit of a check in one EVALSHA of `lua/check.lua`.
//!
//! The scripts are embedded at compile time and loaded with SCRIPT LOAD at start-up, so a
//! Redis that is missing at start is an error then, not on the first request. A check is
//! one EVALSHA, nothing else; when Redis answers NOSCRIPT (restarted, failed over, SCRIPT
//! FLUSH), [`redis::ScriptInvocation::invoke_async`] loads the script and retries once.
//!
//! Time is Redis `TIME`, read inside the script, so nodes with skewed clocks agree; a test
//! may inject a [`Clock`] with [`RedisStore::with_clock`] instead.
//!
//! Every call runs under our own deadline (`tokio::time::timeout`): the client's response
//! timeout counts time queued in its multiplexer and does not bound a reconnect. A call that
//! timed out may still have run on Redis; its request id is known, so a caller can refund it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::breaker::{Breaker, BreakerSettings};
use super::limits_script::LimitScripts;
use super::redis_link::RedisLink;
use super::{CheckOp, CheckOutcome, LimitState, RefundOp, Refunded, StoreError, WindowStore};
use crate::clock::Clock;
use crate::keys::legacy_record_key;
use crate::rules::Algorithm;

/// The check script: `lua/limits.lua` (the limits' arithmetic and recording, shared with
/// `lua/decide.lua`), then `lua/check.lua`, whose header documents KEYS, ARGV and the reply.
/// Redis loads and hashes the composed text.
pub const CHECK_LUA: &str = concat!(
    include_str!("../../lua/limits.lua"),
    include_str!("../../lua/check.lua")
);
/// One call of [`CHECK_LUA`], in the layout of check.lua's header: the window store's
/// checks, and the Redis decider's checks with limits only. The limits come separately
/// ([`CheckCall::command`], walked twice: keys, then arguments) so that neither caller copies
/// them into a list first.
pub struct CheckCall<'a> {
    /// Where the request's record goes: `CheckOp::records_key` (the script appends the
    /// generation).
    pub records_key: &'a str,
    /// The idempotency record's name on the embedded store (`CheckOp::idempotency_key`):
    /// on Redis, a field of the records hash ([`idempotency_field`]).
    pub idempotency_key: Option<&'a str>,
    pub request_id: &'a str,
    pub dry_run: bool,
    /// The caller named the request id (it may repeat an earlier check).
    pub id_given: bool,
    pub record_ttl_ms: u64,
    /// `None` reads Redis `TIME`.
    pub now: Option<u64>,
    /// What ends this attempt's record ([`Stamp`]); `None` for a store's own checks.
    pub stamp: Option<Stamp>,
}

/// What ends the request record of one attempt at a check, so that a release
/// (`store::release`, `lua/release.lua`) takes that attempt's record and no other's: a
/// retry under the same request id, admitted meanwhile, has a stamp of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// Redis Cluster, `.<digits>`: the record is a reservation until the node commits it
    /// (a copy meanwhile is answered "held", limits.lua) or releases it.
    Reservation(u64),
    /// One Redis, `~<digits>`: the record counts at once and is never committed; the stamp
    /// only lets the release of a call that failed (its script may run after the node
    /// gave up on it) find this attempt's record. 32 bits tell apart the few attempts
    /// sharing one request id, in fewer bytes per record.
    Attempt(u32),
}

impl Stamp {
    /// A fresh reservation's stamp.
    pub fn reservation() -> Stamp {
        Stamp::Reservation(rand::random())
    }

    /// A fresh attempt's stamp.
    pub fn attempt() -> Stamp {
        Stamp::Attempt(rand::random())
    }
}

/// The text that ends the record: `.<digits>` or `~<digits>`.
impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stamp::Reservation(n) => write!(f, ".{n}"),
            Stamp::Attempt(n) => write!(f, "~{n}"),
        }
    }
}

/// One limit of a [`CheckCall`]: key, algorithm, window, max, retain (all ms but max).
pub type CheckLimit<'a> = (&'a str, Algorithm, u64, u64, u64);

impl CheckCall<'_> {
    /// What check.lua and the scripts made per shape (`store::limits_script`) share: the
    /// EVALSHA of `sha` with every key and the six fixed arguments, with room for
    /// `args_after` arguments after them.
    pub fn head<'l>(
        &self,
        sha: &str,
        limits: impl ExactSizeIterator<Item = CheckLimit<'l>>,
        args_after: usize,
    ) -> Cmd {
        let n_keys = 1 + limits.len();
        let mut cmd = Cmd::with_capacity(3 + n_keys + 6 + args_after, 64 * (n_keys + 6));
        cmd.arg("EVALSHA").arg(sha).arg(n_keys);
        cmd.arg(self.records_key);
        for (key, ..) in limits {
            cmd.arg(key);
        }
        cmd.arg(self.request_id);
        match (self.dry_run, self.stamp) {
            (true, _) => cmd.arg("1"),
            (false, None) => cmd.arg("0"),
            (false, Some(stamp)) => cmd.arg(format!("0{stamp}")),
        };
        cmd.arg(repeats(self.id_given, self.idempotency_key.is_some()))
            .arg(self.record_ttl_ms.max(1));
        match self.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        // ARGV[6] stays positional: "" without an idempotency key (ARGV[3] says so).
        match self.idempotency_key {
            Some(key) => cmd.arg(idempotency_field(key)),
            None => cmd.arg(""),
        };
        cmd
    }

    /// The EVALSHA of `sha` (check.lua), packed into one command.
    pub fn command<'l>(
        &self,
        sha: &str,
        limits: impl ExactSizeIterator<Item = CheckLimit<'l>> + Clone,
    ) -> Cmd {
        let mut cmd = self.head(sha, limits.clone(), 5 * limits.len());
        for (key, algorithm, window_ms, max, retain_ms) in limits {
            // A zero window would divide by zero in the script; the rule compiler rejects
            // it, this only keeps a bad op from turning into a script error.
            let window_ms = window_ms.max(1);
            cmd.arg(algo_code(algorithm))
                .arg(window_ms)
                .arg(max)
                .arg(retain_ms.max(window_ms))
                .arg(&tag_arg(algorithm, key)[..]);
        }
        cmd
    }
}

/// How a request record names a fixed window or a token bucket it counted in (what a refund
/// may undo there; lua/limits.lua): 36 bits of the key's FNV-1a hash as 6 base64url
/// characters. A record of a four-limit check costs Redis tens of bytes instead of the
/// keys' names; a refund sends the tags of its candidate keys. Two keys of one refund
/// sharing a tag is a 2^-36 chance.
pub fn record_tag(key: &str) -> [u8; 6] {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut h = fnv::FnvHasher::default();
    std::hash::Hasher::write(&mut h, key.as_bytes());
    let bits = std::hash::Hasher::finish(&h);
    std::array::from_fn(|i| ALPHABET[((bits >> (6 * i)) & 63) as usize])
}

/// A limit's tag argument: its key's [`record_tag`] for a fixed window or a bucket, nothing
/// for a sliding window (its ZSET holds the request id itself).
pub(crate) fn tag_arg(algorithm: Algorithm, key: &str) -> SmallTag {
    match algorithm {
        Algorithm::SlidingWindow => SmallTag::new(),
        _ => SmallTag::from_buf(record_tag(key)),
    }
}

/// A tag argument: 6 bytes or none, on the stack.
pub(crate) type SmallTag = smallvec::SmallVec<[u8; 6]>;

/// The record entries of a check's fixed windows and buckets, in limit order, each key
/// once (`f` or `t`, then its [`record_tag`]): what a script that sends no tag per limit
/// (the shaped scripts) appends to the record, as limits.lua builds it from the tags.
pub fn record_entries<'l>(limits: impl Iterator<Item = CheckLimit<'l>> + Clone) -> String {
    let mut out = String::with_capacity(16);
    for (i, (key, algorithm, ..)) in limits.clone().enumerate() {
        let kind = match algorithm {
            Algorithm::SlidingWindow => continue,
            Algorithm::FixedWindow => 'f',
            Algorithm::TokenBucket => 't',
        };
        if limits.clone().take(i).any(|(k, ..)| k == key) {
            continue;
        }
        out.push(kind);
        out.extend(record_tag(key).iter().map(|&b| b as char));
    }
    out
}

/// The field of a check's idempotency record in its records hash (lua/limits.lua):
/// `i:<key>`, the key's encoded value being the last segment of its embedded-store name
/// (`keys::KeySpace::idempotency_key`). Request ids hold no `:`, so the two kinds of field
/// cannot meet.
pub fn idempotency_field(idempotency_key: &str) -> String {
    let key = idempotency_key
        .rsplit(':')
        .next()
        .unwrap_or(idempotency_key);
    let mut field = String::with_capacity(2 + key.len());
    field.push_str("i:");
    field.push_str(key);
    field
}

/// Which earlier checks a check may repeat, as both scripts' ARGV[3] names them: "r" the
/// request id the caller named (an id the service made cannot repeat: no lookup), "i" the
/// idempotency key.
pub fn repeats(id_given: bool, has_idempotency_key: bool) -> &'static str {
    match (id_given, has_idempotency_key) {
        (true, true) => "ri",
        (true, false) => "r",
        (false, true) => "i",
        (false, false) => "",
    }
}

/// The refund script, after `lua/limits.lua` (its clock and the records' hash names);
/// refund.lua's header documents KEYS, ARGV and the reply.
const REFUND_LUA: &str = concat!(
    include_str!("../../lua/limits.lua"),
    include_str!("../../lua/undo.lua"),
    include_str!("../../lua/refund.lua")
);

/// The release script (`lua/release.lua`, after limits.lua and undo.lua): gives back what
/// one attempt at a check recorded (a cluster slot group's reservation, or a call that
/// failed on one Redis) and forgets its record; commits a cluster reservation.
pub const RELEASE_LUA: &str = concat!(
    include_str!("../../lua/limits.lua"),
    include_str!("../../lua/undo.lua"),
    include_str!("../../lua/release.lua")
);

/// Start-up (connect + SCRIPT LOAD) gets at least this long, whatever the per-call
/// timeout: a 50 ms request budget is too tight for a TCP connect plus two loads.
pub(crate) const STARTUP_MIN_MS: u64 = 1000;

/// A [`WindowStore`] on one Redis (standalone or a failover pair behind one address).
pub struct RedisStore {
    /// Shared with the trust ledger: one connection, one breaker.
    link: Arc<RedisLink>,
    /// Scripts made for each shape of limits (check.lua for a shape too big for one).
    shaped: LimitScripts,
    refund_script: Script,
    /// `Some` replaces Redis `TIME` with this clock (a service built on any clock but the
    /// wall clock: tests, simulations).
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("link", &self.link)
            .field("injected_clock", &self.clock.is_some())
            .finish()
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://host:port[/db]`) and loads both scripts.
    ///
    /// `timeout_ms` bounds every later store call and each connection attempt; start-up
    /// itself gets `max(timeout_ms, 1 s)`. A Redis that cannot be reached is not an error
    /// here (the store answers its errors until it is back); one that refuses the scripts is.
    pub async fn connect(url: &str, timeout_ms: u64) -> Result<RedisStore, StoreError> {
        let breaker = Breaker::new("redis", BreakerSettings::default(), None);
        Self::connect_with(url, timeout_ms, Arc::new(breaker)).await
    }

    /// [`RedisStore::connect`] with a given circuit breaker (the app's reports metrics).
    pub async fn connect_with(
        url: &str,
        timeout_ms: u64,
        breaker: Arc<Breaker>,
    ) -> Result<RedisStore, StoreError> {
        let timeout_ms = timeout_ms.max(1);
        let startup_ms = timeout_ms.max(STARTUP_MIN_MS);
        let link = RedisLink::open(url, timeout_ms, startup_ms, breaker).await?;
        let shaped = LimitScripts::default();
        let refund_script = Script::new(REFUND_LUA);
        link.load_scripts(&[shaped.check_lua(), &refund_script], startup_ms)
            .await?;

        Ok(RedisStore {
            link,
            shaped,
            refund_script,
            clock: None,
        })
    }

    /// Connects to the Redis Cluster `seeds` belong to (node URLs) and loads the scripts on
    /// every node. Checks on a cluster are the cluster decider's
    /// (`crate::decide::cluster`); this store refunds (per slot group) and answers
    /// readiness.
    pub async fn connect_cluster_with(
        seeds: &[String],
        timeout_ms: u64,
        breaker: Arc<Breaker>,
    ) -> Result<RedisStore, StoreError> {
        let timeout_ms = timeout_ms.max(1);
        let startup_ms = timeout_ms.max(STARTUP_MIN_MS);
        let link = RedisLink::open_cluster(seeds, timeout_ms, startup_ms, breaker).await?;
        let shaped = LimitScripts::default();
        let refund_script = Script::new(REFUND_LUA);
        link.load_scripts(&[&refund_script], startup_ms).await?;
        Ok(RedisStore {
            link,
            shaped,
            refund_script,
            clock: None,
        })
    }

    /// Takes "now" from `clock` instead of Redis `TIME`, so a test can cross window edges
    /// without sleeping; `app::build` does this for any clock but the wall clock. Expiries
    /// still run on Redis's own clock, so keep such a clock near the real time.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The store's link to Redis, for the node's other Redis user (the trust ledger): one
    /// multiplexed connection and one breaker per node, not one per component.
    pub fn link(&self) -> Arc<RedisLink> {
        self.link.clone()
    }

    /// The deadline of one store call, ms.
    pub fn timeout_ms(&self) -> u64 {
        self.link.timeout_ms()
    }

    /// The `now` argument of the scripts: `None` reads Redis TIME.
    fn now_arg(&self) -> Option<u64> {
        self.clock.as_ref().map(|c| c.now_ms())
    }
}

impl RedisStore {
    /// A refund on a cluster: one refund.lua per slot group of the candidate keys, each
    /// with the records key its group reserved under (`crate::decide::cluster`). No
    /// record there predates 2026-12: the legacy key is one of the group's slot that
    /// holds nothing. Each group answers for its own keys.
    async fn refund_groups(&self, op: &RefundOp) -> Result<Refunded, StoreError> {
        let groups = crate::keys::slot_groups(&op.records_key, op.keys.iter().map(String::as_str))
            .map_err(|why| StoreError::Protocol(format!("refund of {}: {why}", op.request_id)))?;
        // The main group is there even with no candidate key: nothing to refund in it.
        let groups: Vec<_> = groups.iter().filter(|g| !g.members.is_empty()).collect();
        let calls = groups.iter().map(|g| {
            let records_key = &g.records_key;
            let keys: Vec<&str> = g.members.iter().map(|&i| op.keys[i].as_str()).collect();
            let mut inv = self.refund_script.prepare_invoke();
            inv.key(records_key);
            inv.key(format!("{records_key}:none"));
            for key in &keys {
                inv.key(*key);
            }
            inv.arg(&op.request_id).arg(op.record_ttl_ms.max(1));
            match self.now_arg() {
                Some(now) => inv.arg(now),
                None => inv.arg(""),
            };
            for key in &keys {
                inv.arg(&record_tag(key)[..]);
            }
            let n = keys.len();
            async move {
                let mut conn = self.link.conn().await?;
                refunded(self.link.run(inv.invoke_async(&mut conn)).await?, n)
            }
        });
        let mut all = Refunded {
            keys: vec![false; op.keys.len()],
        };
        let answers = futures::future::join_all(calls).await;
        for (g, answer) in groups.iter().zip(answers) {
            for (&i, back) in g.members.iter().zip(answer?.keys) {
                all.keys[i] = back;
            }
        }
        Ok(all)
    }
}

/// refund.lua's reply for `n` candidate keys: 0 (the request is unknown), or a `0`/`1`
/// per key.
fn refunded(reply: Value, n: usize) -> Result<Refunded, StoreError> {
    let flags = match reply {
        Value::Int(0) => {
            return Ok(Refunded {
                keys: vec![false; n],
            })
        }
        Value::BulkString(flags) if flags.len() == n => flags,
        Value::SimpleString(flags) if flags.len() == n => flags.into_bytes(),
        other => {
            return Err(StoreError::Protocol(format!(
                "refund.lua replied {other:?}, expected 0 or a 0/1 flag for each of {n} keys"
            )))
        }
    };
    flags
        .iter()
        .map(|f| match f {
            b'1' => Ok(true),
            b'0' => Ok(false),
            _ => Err(StoreError::Protocol(format!(
                "refund.lua replied {:?}, expected 0/1 flags",
                String::from_utf8_lossy(&flags)
            ))),
        })
        .collect::<Result<Vec<bool>, _>>()
        .map(|keys| Refunded { keys })
}

#[async_trait]
impl WindowStore for RedisStore {
    async fn check(&self, op: &CheckOp) -> Result<CheckOutcome, StoreError> {
        if self.link.is_cluster() {
            // One script cannot span slots: a cluster's checks are decided per slot group.
            return Err(StoreError::Unavailable(
                "a check on redis_cluster goes through the cluster decider".into(),
            ));
        }
        let call = CheckCall {
            records_key: &op.records_key,
            idempotency_key: op.idempotency_key.as_deref(),
            request_id: &op.request_id,
            dry_run: op.dry_run,
            id_given: op.id_given,
            record_ttl_ms: op.record_ttl_ms,
            now: self.now_arg(),
            stamp: None,
        };
        let limits = op
            .limits
            .iter()
            .map(|l| (l.key.as_str(), l.algorithm, l.window_ms, l.max, l.retain_ms));
        let (script, cmd) = self.shaped.command(&call, limits);
        let reply = self.link.eval(&script, &cmd).await?;
        parse_check_reply(reply, op.limits.len())
    }

    async fn refund_keys(&self, op: &RefundOp) -> Result<Refunded, StoreError> {
        if self.link.is_cluster() {
            return self.refund_groups(op).await;
        }
        // refund.lua's layout (its header). A refund journaled before 2026-12 has no
        // records key, and its record key is the record's own: the script reads only that.
        // A newer refund also looks where a request counted before an upgrade has its
        // record.
        let records = !op.records_key.is_empty() && op.record_ttl_ms > 0;
        let legacy = if records {
            legacy_record_key(&op.records_key, &op.request_id)
        } else {
            None
        };
        let mut inv = self.refund_script.prepare_invoke();
        inv.key(if records {
            &op.records_key
        } else {
            &op.record_key
        });
        inv.key(legacy.as_deref().unwrap_or(&op.record_key));
        for key in &op.keys {
            inv.key(key);
        }
        inv.arg(&op.request_id)
            .arg(if records { op.record_ttl_ms } else { 0 });
        match self.now_arg() {
            Some(now) => inv.arg(now),
            None => inv.arg(""),
        };
        for key in &op.keys {
            inv.arg(&record_tag(key)[..]);
        }

        let mut conn = self.link.conn().await?;
        let reply: Value = self.link.run(inv.invoke_async(&mut conn)).await?;
        refunded(reply, op.keys.len())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.link.conn().await?;
        let reply: Value = self
            .link
            .run(redis::cmd("PING").query_async(&mut conn))
            .await?;
        match reply {
            Value::SimpleString(s) if s == "PONG" => Ok(()),
            Value::BulkString(b) if b == b"PONG" => Ok(()),
            other => Err(StoreError::Protocol(format!("PING replied {other:?}"))),
        }
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}

/// Runs `fut` under a `timeout_ms` deadline, mapping both failure layers to [`StoreError`]:
/// the client's own timeouts do not bound a reconnect, ours does.
pub(crate) async fn bounded<T>(
    timeout_ms: u64,
    fut: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(Duration::from_millis(timeout_ms), fut).await {
        Ok(result) => result.map_err(|e| map_redis_error(e, timeout_ms)),
        Err(_) => Err(StoreError::Timeout(timeout_ms)),
    }
}

/// The one-letter algorithm code `lua/limits.lua` reads (in check.lua and decide.lua).
pub(crate) fn algo_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::SlidingWindow => "s",
        Algorithm::FixedWindow => "f",
        Algorithm::TokenBucket => "t",
    }
}

/// Which [`StoreError`] a client error is: the store not answering (retry later, apply the
/// scene's policy) versus a reply we cannot use (a bug or a foreign key shape).
///
/// The client's own timeouts (response, connection) count as [`StoreError::Timeout`] like
/// ours; `BUSY` (another script running too long) is the store not answering, too.
pub(crate) fn map_redis_error(e: RedisError, timeout_ms: u64) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(timeout_ms);
    }
    if e.code() == Some("BUSY") {
        return StoreError::Unavailable(e.to_string());
    }
    match e.kind() {
        ErrorKind::Io
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::NoScript,
        ) => StoreError::Unavailable(e.to_string()),
        _ if e.is_connection_dropped() || e.is_connection_refusal() => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Protocol(e.to_string()),
    }
}

/// Turns a check script's reply into a [`CheckOutcome`]: check.lua's flat array (see the
/// script header) or a shaped script's one string (`store::limits_script`).
pub fn parse_check_reply(reply: Value, n_limits: usize) -> Result<CheckOutcome, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("check.lua reply: {why}"));
    let items = match reply {
        Value::Array(items) => items,
        Value::BulkString(text) => return parse_compact_reply(&text, n_limits),
        other => return Err(bad(&format!("expected an array, got {other:?}"))),
    };
    let mut it = items.into_iter();
    let kind = it.next().map(as_text).transpose()?.unwrap_or_default();
    let dup_of = it.next().map(as_text).transpose()?.unwrap_or_default();
    let n = it.next().map(as_int).transpose()?.unwrap_or(-1);

    if kind == "dup" || kind == "held" {
        if dup_of.is_empty() {
            return Err(bad("duplicate without the counted request id"));
        }
        return Ok(repeat(&kind, dup_of));
    }
    if usize::try_from(n).ok() != Some(n_limits) {
        return Err(bad(&format!("{n} limit states for {n_limits} limits")));
    }
    let rest: Vec<Value> = it.collect();
    if rest.len() != 3 * n_limits {
        return Err(bad(&format!(
            "{} values for {n_limits} limit states",
            rest.len()
        )));
    }
    let limits = rest
        .chunks_exact(3)
        .map(|c| {
            let count = as_int(c[0].clone())?;
            let exceeded = as_int(c[1].clone())?;
            let retry = as_int(c[2].clone())?;
            Ok(LimitState {
                count: u64::try_from(count).map_err(|_| bad("negative count"))?,
                exceeded: exceeded != 0,
                retry_after_ms: u64::try_from(retry).map_err(|_| bad("negative retry"))?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;

    match kind.as_str() {
        "allow" => Ok(CheckOutcome::Allowed { limits }),
        "deny" => Ok(CheckOutcome::Denied { limits }),
        other => Err(bad(&format!("unknown decision {other:?}"))),
    }
}

/// A "dup" (a repeat of a counted request) or "held" (of a reservation not yet settled).
fn repeat(kind: &str, of: String) -> CheckOutcome {
    if kind == "held" {
        CheckOutcome::Held { of }
    } else {
        CheckOutcome::Duplicate { of }
    }
}

/// A shaped script's reply: `allow|c|x|r|…`, `deny|…` or `dup|<request id>`.
fn parse_compact_reply(text: &[u8], n_limits: usize) -> Result<CheckOutcome, StoreError> {
    let bad = |why: &str| StoreError::Protocol(format!("check script reply: {why}"));
    let text = std::str::from_utf8(text).map_err(|_| bad("non-UTF-8 text"))?;
    let (kind, rest) = match text.split_once('|') {
        Some((kind, rest)) => (kind, Some(rest)),
        None => (text, None),
    };
    if kind == "dup" || kind == "held" {
        return match rest {
            Some(id) if !id.is_empty() => Ok(repeat(kind, id.into())),
            _ => Err(bad("duplicate without the counted request id")),
        };
    }
    let number = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| bad(&format!("{v:?} in {text:?} is not a count")))
    };
    // No fields at all only for a check without limits.
    let mut values = rest.into_iter().flat_map(|r| r.split('|'));
    let mut limits = Vec::with_capacity(n_limits);
    while let Some(count) = values.next() {
        let (Some(exceeded), Some(retry)) = (values.next(), values.next()) else {
            return Err(bad(&format!(
                "{text:?} does not hold three values per limit"
            )));
        };
        limits.push(LimitState {
            count: number(count)?,
            exceeded: number(exceeded)? != 0,
            retry_after_ms: number(retry)?,
        });
    }
    if limits.len() != n_limits {
        return Err(bad(&format!(
            "{} limit states for {n_limits} limits",
            limits.len()
        )));
    }
    match kind {
        "allow" => Ok(CheckOutcome::Allowed { limits }),
        "deny" => Ok(CheckOutcome::Denied { limits }),
        other => Err(bad(&format!("unknown decision {other:?}"))),
    }
}

fn as_text(v: Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b)
            .map_err(|_| StoreError::Protocol("check.lua reply: non-UTF-8 text".into())),
        Value::SimpleString(s) => Ok(s),
        other => Err(StoreError::Protocol(format!(
            "check.lua reply: expected text, got {other:?}"
        ))),
    }
}

fn as_int(v: Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(i),
        other => Err(StoreError::Protocol(format!(
            "check.lua reply: expected an integer, got {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_record_names_each_fixed_window_and_bucket_once_by_a_short_tag() {
        let tag = |k: &str| String::from_utf8(record_tag(k).to_vec()).expect("ASCII");
        // Six base64url characters, a pure function of the key.
        assert!(tag("lt:s:fw:ip_60s:ip:10.0.0.1")
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(
            tag("lt:s:fw:ip_60s:ip:10.0.0.1"),
            tag("lt:s:fw:ip_60s:ip:10.0.0.1")
        );
        assert_ne!(
            tag("lt:s:fw:ip_60s:ip:10.0.0.1"),
            tag("lt:s:fw:ip_60s:ip:10.0.0.2")
        );
        let limits = [
            ("lt:s:uid:u", Algorithm::SlidingWindow, 1000, 1, 1000),
            ("lt:s:fw:a:uid:u", Algorithm::FixedWindow, 1000, 1, 1000),
            ("lt:s:tb:b:uid:u", Algorithm::TokenBucket, 1000, 1, 1000),
            // A key named twice is written, and recorded, once.
            ("lt:s:fw:a:uid:u", Algorithm::FixedWindow, 1000, 1, 1000),
        ];
        assert_eq!(
            record_entries(limits.into_iter()),
            format!("f{}t{}", tag("lt:s:fw:a:uid:u"), tag("lt:s:tb:b:uid:u"))
        );
        assert_eq!(record_entries(limits[..1].iter().copied()), "");
    }

    #[test]
    fn an_idempotency_record_is_a_field_named_by_its_key() {
        assert_eq!(idempotency_field("lt:s:idem:uid:u:k%3A1"), "i:k%3A1");
        assert_eq!(idempotency_field("k"), "i:k");
    }

    #[test]
    fn parses_allow_deny_and_dup() {
        let allow = Value::Array(vec![
            bulk("allow"),
            bulk(""),
            Value::Int(1),
            Value::Int(2),
            Value::Int(0),
            Value::Int(0),
        ]);
        assert_eq!(
            parse_check_reply(allow, 1).unwrap(),
            CheckOutcome::Allowed {
                limits: vec![LimitState {
                    count: 2,
                    exceeded: false,
                    retry_after_ms: 0
                }]
            }
        );
        let dup = Value::Array(vec![bulk("dup"), bulk("r1"), Value::Int(0)]);
        assert_eq!(
            parse_check_reply(dup, 3).unwrap(),
            CheckOutcome::Duplicate { of: "r1".into() }
        );
    }

    #[test]
    fn rejects_malformed_replies() {
        assert!(matches!(
            parse_check_reply(Value::Int(1), 0),
            Err(StoreError::Protocol(_))
        ));
        let short = Value::Array(vec![bulk("deny"), bulk(""), Value::Int(2), Value::Int(1)]);
        assert!(matches!(
            parse_check_reply(short, 2),
            Err(StoreError::Protocol(_))
        ));
        let odd = Value::Array(vec![bulk("maybe"), bulk(""), Value::Int(0)]);
        assert!(matches!(
            parse_check_reply(odd, 0),
            Err(StoreError::Protocol(_))
        ));
        for (text, n) in [
            ("deny|2|1", 1),
            ("deny|2|1|0|3", 1),
            ("allow|1|0|0", 2),
            ("allow|-1|0|0", 1),
            ("allow|1.5|0|0", 1),
            ("allow|", 0),
            ("maybe", 0),
            ("dup|", 0),
            ("dup", 0),
        ] {
            assert!(
                matches!(
                    parse_check_reply(bulk(text), n),
                    Err(StoreError::Protocol(_))
                ),
                "{text}"
            );
        }
    }

    /// A shaped script's one-string reply reads as check.lua's array does.
    #[test]
    fn parses_the_compact_reply() {
        let state = |count, exceeded, retry_after_ms| LimitState {
            count,
            exceeded,
            retry_after_ms,
        };
        assert_eq!(
            parse_check_reply(bulk("allow|2|0|0|7|0|0"), 2).unwrap(),
            CheckOutcome::Allowed {
                limits: vec![state(2, false, 0), state(7, false, 0)]
            }
        );
        assert_eq!(
            parse_check_reply(bulk("deny|3|1|86399000"), 1).unwrap(),
            CheckOutcome::Denied {
                limits: vec![state(3, true, 86_399_000)]
            }
        );
        assert_eq!(
            parse_check_reply(bulk("allow"), 0).unwrap(),
            CheckOutcome::Allowed { limits: vec![] }
        );
        assert_eq!(
            parse_check_reply(bulk("dup|01J-x_1"), 3).unwrap(),
            CheckOutcome::Duplicate {
                of: "01J-x_1".into()
            }
        );
    }
}
