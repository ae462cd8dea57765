//! `vigia keys sweep`: remove every key under a prefix, with SCAN + UNLINK, never KEYS.
//!
//! Multi-dimensional limiting leaves users × devices × scenes keys behind after a campaign;
//! this is the tool that cleans them up. It exists because of a lesson learned the hard way:
//! someone once ran `KEYS lt:*` in production and blocked an instance holding 20 million
//! keys for more than 10 seconds. `KEYS` walks the whole keyspace in one command, and Redis
//! runs commands one at a time, so every check stalls until it finishes. Likewise `DEL` of
//! a large ZSET or hash frees its memory inline.
//!
//! So the sweep:
//!
//! * walks the keyspace with `SCAN cursor MATCH pattern COUNT batch`, a bounded amount of
//!   work per round trip, letting other clients' commands run between batches;
//! * removes each batch of matches with one `UNLINK`, which unlinks the keys at once and
//!   frees their memory in a background thread;
//! * never sends `KEYS` (the integration tests check Redis' own `INFO commandstats`).
//!
//! # The prefix
//!
//! The prefix is a key prefix as written in the config (`lt`, or `lt:coupon_claim`); the
//! sweep removes the keys `PREFIX:*`, that is every key that starts with the prefix followed
//! by `:`. `lt` does not touch `ltx:y`, `LT:z`, nor the key `lt` itself.
//!
//! * One trailing `:` is stripped, so `lt:` and `lt` mean the same thing (`lt:*`).
//! * An empty prefix (or `:` alone) is refused with [`SweepError::EmptyPrefix`]: it would
//!   sweep the whole database.
//! * The prefix is literal. Redis glob metacharacters in it (`*`, `?`, `[`, `]`, `\`) are
//!   escaped with `\` before the `MATCH` pattern is built, so a prefix can never widen the
//!   match: prefix `lt*` removes `lt*:1` but not `ltx:1`.
//!
//! # What SCAN guarantees, and what it does not
//!
//! * A key present for the whole sweep is returned at least once, so it is removed.
//! * A key created (or recreated by live traffic) while the sweep runs may be missed. Sweep
//!   after the traffic that writes under the prefix has stopped, or run it again.
//! * SCAN may return the same key more than once (while Redis rehashes). Hence
//!   [`SweepReport::matched`] is the number of matches SCAN returned, duplicates included,
//!   an upper bound on the distinct keys found (in a dry run too), while
//!   [`SweepReport::removed`] is the sum of `UNLINK`'s replies: keys that really existed and
//!   were removed, never counted twice.
//!
//! Keys are handled as bytes (`Vec<u8>`): key names need not be UTF-8.
//!
//! One URL is one Redis node. For a Redis Cluster, run the sweep against each primary.
//!
//! # Throttling: `rate`
//!
//! [`SweepOptions::rate`] bounds the keys the sweep acts on: at most `rate` keys a second
//! go to `UNLINK` (in a dry run, are counted), so the removal load a production Redis
//! carries (unlinking, freeing memory, replicating the deletes to replicas and the AOF)
//! stays bounded. The cost of each `SCAN` round trip is already bounded by the batch, which
//! a rate lowers to `rate` when it is smaller, so no single `UNLINK` is more than one
//! second's budget. See [`Pacer`] for the schedule.
//!
//! # Where the Redis and the prefix come from
//!
//! [`target`] takes them from the command line, falling back on the service's own config
//! (`[store] redis_url` and `key_prefix`), so a sweep removes the keys the service writes.

use std::num::NonZeroU32;
use std::path::Path;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use crate::config::{Config, ConfigError};

/// The default `SCAN COUNT` and `UNLINK` batch size.
pub const DEFAULT_BATCH: usize = 500;

/// How long to wait for the TCP connection (and handshake) before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long to wait for any one reply. Generous: one batch is small by construction.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// What to sweep and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepOptions {
    /// Key prefix as in the config (`lt`, `lt:coupon_claim`); keys `PREFIX:*` are swept.
    pub prefix: String,
    /// Only count the matching keys; remove nothing.
    pub dry_run: bool,
    /// `SCAN COUNT` hint and maximum keys per `UNLINK`; at least 1. Default [`DEFAULT_BATCH`].
    /// A smaller [`rate`](Self::rate) lowers it to the rate.
    pub batch: usize,
    /// At most this many keys a second are unlinked (counted, in a dry run); `None`: as
    /// fast as Redis answers. See the module doc.
    pub rate: Option<NonZeroU32>,
}

impl SweepOptions {
    /// A real (not dry) sweep of `prefix` with the default batch size.
    pub fn new(prefix: impl Into<String>) -> SweepOptions {
        SweepOptions {
            prefix: prefix.into(),
            dry_run: false,
            batch: DEFAULT_BATCH,
            rate: None,
        }
    }

    /// The batch actually used: [`batch`](Self::batch), lowered to the rate if smaller.
    pub fn effective_batch(&self) -> usize {
        match self.rate {
            Some(rate) => self.batch.min(rate.get() as usize),
            None => self.batch,
        }
    }
}

/// Running totals, passed to the progress callback after every SCAN batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepProgress {
    /// SCAN round trips completed so far.
    pub batches: u64,
    /// Matches SCAN returned so far (duplicates possible, see the module doc).
    pub matched: u64,
    /// Keys removed so far, as counted by `UNLINK`'s replies; 0 in a dry run.
    pub removed: u64,
}

/// The outcome of a completed sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    /// Matches SCAN returned (duplicates possible, see the module doc).
    pub matched: u64,
    /// Keys removed, from `UNLINK`'s replies; 0 in a dry run.
    pub removed: u64,
    /// SCAN round trips made.
    pub batches: u64,
    pub dry_run: bool,
    /// From the connection to the last reply.
    pub elapsed: Duration,
    /// The part of `elapsed` spent waiting for the rate ([`SweepOptions::rate`]).
    pub throttled: Duration,
}

impl SweepReport {
    /// The one line the command prints at the end, e.g. `done: keys under lt: scanned 1200,
    /// removed 1200 in 0.4 s`; a dry run says `would remove`.
    pub fn summary(&self, prefix: &str) -> String {
        let (head, verb, acted) = if self.dry_run {
            ("dry run:", "would remove", self.matched)
        } else {
            ("done:", "removed", self.removed)
        };
        let mut line = format!(
            "{head} keys under {prefix}: scanned {}, {verb} {acted} in {:.1} s",
            self.matched,
            self.elapsed.as_secs_f64()
        );
        if !self.throttled.is_zero() {
            line += &format!(
                " ({:.1} s waiting for the rate)",
                self.throttled.as_secs_f64()
            );
        }
        line
    }
}

impl SweepProgress {
    /// A progress message after `elapsed`, e.g. `scanned 1200, removed 1100 (2400 keys/s)`;
    /// in a dry run `would remove`. The rate is of the keys removed (counted, in a dry run).
    pub fn message(&self, dry_run: bool, elapsed: Duration) -> String {
        let (verb, acted) = if dry_run {
            ("would remove", self.matched)
        } else {
            ("removed", self.removed)
        };
        let per_sec = acted as f64 / elapsed.as_secs_f64().max(1e-3);
        format!(
            "scanned {}, {verb} {acted} ({per_sec:.0} keys/s)",
            self.matched
        )
    }
}

/// Paces keys to a rate: [`reserve`](Pacer::reserve) says how long to wait before acting on
/// the next `n` keys. The clock is the caller's (`now`), so the schedule is testable.
///
/// Each reservation starts when the previous one's keys are paid for (`n / rate` seconds
/// after it started) or now, whichever is later: the average never exceeds the rate, the
/// sweep is never more than one reservation ahead of the schedule, and time lost to a slow
/// Redis is not banked as a burst afterwards.
#[derive(Debug, Clone)]
pub struct Pacer {
    rate: NonZeroU32,
    /// When the keys reserved so far are paid for; `None` before the first reservation.
    next_free: Option<Instant>,
}

impl Pacer {
    /// A pacer for `rate` keys a second.
    pub fn new(rate: NonZeroU32) -> Pacer {
        Pacer {
            rate,
            next_free: None,
        }
    }

    /// Reserves `keys` at `now`; returns how long to wait before acting on them (zero when
    /// they may go at once).
    pub fn reserve(&mut self, keys: u64, now: Instant) -> Duration {
        let start = match self.next_free {
            Some(free) if free > now => free,
            _ => now,
        };
        self.next_free = Some(start + self.cost(keys));
        start - now
    }

    /// `keys / rate` seconds, rounded up to the nanosecond so the rate is never exceeded.
    fn cost(&self, keys: u64) -> Duration {
        let rate = u128::from(self.rate.get());
        let nanos = (u128::from(keys) * 1_000_000_000).div_ceil(rate);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// Where to sweep: a Redis URL and a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub url: String,
    pub prefix: String,
}

/// The Redis and prefix to sweep: `redis` and `prefix` when given; what is not given comes
/// from the config at `config` (`[store] redis_url`, `key_prefix`), loaded as the service
/// loads it ([`Config::load`], `VIGIA_*` environment included). The config is not read
/// when both are given.
pub fn target(
    redis: Option<String>,
    prefix: Option<String>,
    config: &Path,
) -> Result<Target, SweepError> {
    if let (Some(url), Some(prefix)) = (&redis, &prefix) {
        return Ok(Target {
            url: url.clone(),
            prefix: prefix.clone(),
        });
    }
    let missing = match (&redis, &prefix) {
        (None, None) => "--redis and --prefix",
        (None, Some(_)) => "--redis",
        _ => "--prefix",
    };
    let loaded = Config::load(config).map_err(|source| SweepError::Config { missing, source })?;
    let url = redis.unwrap_or(loaded.store.redis_url);
    if url.trim().is_empty() {
        return Err(SweepError::NoRedisUrl {
            config: config.display().to_string(),
        });
    }
    Ok(Target {
        url,
        prefix: prefix.unwrap_or(loaded.store.key_prefix),
    })
}

/// Why a sweep did not start or did not finish. A sweep that fails midway has removed the
/// keys of the batches before the failure; running it again is safe.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("refusing to sweep an empty prefix: it would remove every key in the database")]
    EmptyPrefix,
    #[error("batch size must be at least 1")]
    ZeroBatch,
    /// A flag was missing and the config that would supply it cannot be used.
    #[error("{missing} not given, and the config cannot supply it: {source}")]
    Config {
        missing: &'static str,
        #[source]
        source: ConfigError,
    },
    #[error(
        "no Redis to sweep: give --redis URL, or set [store] redis_url in {config} \
         (or VIGIA_REDIS_URL)"
    )]
    NoRedisUrl { config: String },
    /// `url` has any password redacted.
    #[error("cannot connect to Redis at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("Redis error during the sweep: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Normalises a config prefix into the sweep's `MATCH` pattern (`PREFIX:*`, glob-escaped).
///
/// Strips one trailing `:`; refuses a prefix that is empty after that.
pub fn match_pattern(prefix: &str) -> Result<Vec<u8>, SweepError> {
    let prefix = prefix.strip_suffix(':').unwrap_or(prefix);
    if prefix.is_empty() {
        return Err(SweepError::EmptyPrefix);
    }
    let mut pattern = Vec::with_capacity(prefix.len() * 2 + 2);
    for &b in prefix.as_bytes() {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            pattern.push(b'\\');
        }
        pattern.push(b);
    }
    pattern.extend_from_slice(b":*");
    Ok(pattern)
}

/// Removes every key `PREFIX:*` on the Redis at `url` (see the module doc), calling
/// `progress` with running totals after every SCAN batch.
pub async fn sweep(
    url: &str,
    opts: &SweepOptions,
    mut progress: impl FnMut(&SweepProgress),
) -> Result<SweepReport, SweepError> {
    let pattern = match_pattern(&opts.prefix)?;
    if opts.batch == 0 {
        return Err(SweepError::ZeroBatch);
    }
    let batch = opts.effective_batch();
    let started = Instant::now();
    let mut conn = connect(url).await?;

    let mut pacer = opts.rate.map(Pacer::new);
    let mut throttled = Duration::ZERO;
    let mut totals = SweepProgress::default();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(batch)
            .query_async(&mut conn)
            .await?;
        totals.batches += 1;
        totals.matched += keys.len() as u64;
        if opts.dry_run {
            throttled += pace(&mut pacer, keys.len()).await;
        } else {
            // COUNT is a hint: one SCAN may return more than `batch` keys.
            for chunk in keys.chunks(batch) {
                throttled += pace(&mut pacer, chunk.len()).await;
                let removed: u64 = redis::cmd("UNLINK")
                    .arg(chunk)
                    .query_async(&mut conn)
                    .await?;
                totals.removed += removed;
            }
        }
        progress(&totals);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }

    Ok(SweepReport {
        matched: totals.matched,
        removed: totals.removed,
        batches: totals.batches,
        dry_run: opts.dry_run,
        elapsed: started.elapsed(),
        throttled,
    })
}

/// Waits until `pacer` lets `keys` go; returns the time waited.
async fn pace(pacer: &mut Option<Pacer>, keys: usize) -> Duration {
    let Some(pacer) = pacer else {
        return Duration::ZERO;
    };
    let wait = pacer.reserve(keys as u64, Instant::now());
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    wait
}

async fn connect(url: &str) -> Result<MultiplexedConnection, SweepError> {
    let connect_err = |source| SweepError::Connect {
        url: redact(url),
        source,
    };
    let client = redis::Client::open(url).map_err(connect_err)?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(connect_err)
}

/// The URL with any `user:password@` replaced by `***@`, fit for an error message.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let redacted = match rest[..authority_end].rfind('@') {
        Some(at) => format!("***{}", &rest[at..]),
        None => rest.to_string(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{redacted}"),
        None => redacted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_prefix_colon_star() {
        assert_eq!(match_pattern("lt").unwrap(), b"lt:*");
        assert_eq!(
            match_pattern("lt:coupon_claim").unwrap(),
            b"lt:coupon_claim:*"
        );
    }

    #[test]
    fn one_trailing_colon_is_stripped() {
        assert_eq!(match_pattern("lt:").unwrap(), b"lt:*");
        assert_eq!(match_pattern("lt::").unwrap(), b"lt::*");
    }

    #[test]
    fn empty_prefix_is_refused() {
        assert!(matches!(match_pattern(""), Err(SweepError::EmptyPrefix)));
        assert!(matches!(match_pattern(":"), Err(SweepError::EmptyPrefix)));
    }

    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(match_pattern("lt*").unwrap(), br"lt\*:*");
        assert_eq!(match_pattern("l?").unwrap(), br"l\?:*");
        assert_eq!(match_pattern("[a]").unwrap(), br"\[a\]:*");
        assert_eq!(match_pattern(r"a\b").unwrap(), br"a\\b:*");
    }

    fn rate(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).expect("non-zero")
    }

    #[test]
    fn the_first_keys_go_at_once_and_the_next_wait_for_their_cost() {
        let t0 = Instant::now();
        let mut pacer = Pacer::new(rate(100));
        assert_eq!(pacer.reserve(50, t0), Duration::ZERO);
        // 50 keys at 100/s are paid for half a second after they went.
        assert_eq!(pacer.reserve(50, t0), Duration::from_millis(500));
        // Asked at 0.5 s, the next keys wait for the previous 50 to be paid for: 1 s.
        assert_eq!(
            pacer.reserve(100, t0 + Duration::from_millis(500)),
            Duration::from_millis(500)
        );
        assert_eq!(
            pacer.reserve(1, t0 + Duration::from_secs(1)),
            Duration::from_secs(1)
        );
    }

    /// A whole sweep on a fake clock: Redis answers instantly, the sweep sleeps exactly as
    /// long as it is told.
    fn simulate(
        rate_per_sec: u32,
        total: u64,
        chunk: u64,
    ) -> (u64, Duration, Vec<(Duration, u64)>) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut pacer = Pacer::new(rate(rate_per_sec));
        let (mut waits, mut sent) = (0, 0);
        let mut sends = Vec::new();
        while sent < total {
            let n = chunk.min(total - sent);
            let wait = pacer.reserve(n, now);
            if !wait.is_zero() {
                waits += 1;
            }
            now += wait;
            sent += n;
            sends.push((now - t0, sent));
        }
        (waits, now - t0, sends)
    }

    #[test]
    fn a_throttled_sweep_never_runs_ahead_of_the_rate() {
        // 1000 keys at 100/s in chunks of 100: a wait before each chunk but the first, and
        // the last chunk goes at 9 s (it is paid for at 10 s).
        let (waits, took, sends) = simulate(100, 1_000, 100);
        assert_eq!(waits, 9);
        assert_eq!(took, Duration::from_secs(9));
        // By any send, at most one chunk more than the rate allows has gone.
        for (at, sent) in sends {
            assert!(
                sent as f64 <= 100.0 * at.as_secs_f64() + 100.0,
                "{sent} keys sent by {at:?}"
            );
        }
        // Smaller chunks, same schedule: 10 000 keys at 2 000/s in chunks of 500.
        let (waits, took, _) = simulate(2_000, 10_000, 500);
        assert_eq!(waits, 19);
        assert_eq!(took, Duration::from_millis(4_750));
    }

    #[test]
    fn time_lost_to_a_slow_redis_is_not_banked_as_a_burst() {
        let t0 = Instant::now();
        let mut pacer = Pacer::new(rate(100));
        assert_eq!(pacer.reserve(100, t0), Duration::ZERO);
        // Redis took 5 s to answer: the next chunk may go at once...
        let late = t0 + Duration::from_secs(5);
        assert_eq!(pacer.reserve(100, late), Duration::ZERO);
        // ...but the one after it still waits its full second.
        assert_eq!(pacer.reserve(100, late), Duration::from_secs(1));
    }

    #[test]
    fn the_cost_rounds_up_so_the_rate_is_never_exceeded() {
        let t0 = Instant::now();
        let mut pacer = Pacer::new(rate(3));
        pacer.reserve(1, t0);
        assert_eq!(pacer.reserve(1, t0), Duration::from_nanos(333_333_334));
    }

    #[test]
    fn a_rate_below_the_batch_lowers_the_batch() {
        let opts = |rate| SweepOptions {
            rate,
            ..SweepOptions::new("lt")
        };
        assert_eq!(opts(None).effective_batch(), DEFAULT_BATCH);
        assert_eq!(opts(Some(NonZeroU32::MIN)).effective_batch(), 1);
        assert_eq!(opts(Some(rate(10))).effective_batch(), 10);
        assert_eq!(opts(Some(rate(100_000))).effective_batch(), DEFAULT_BATCH);
    }

    #[test]
    fn the_summary_says_what_was_scanned_removed_and_how_long_it_took() {
        let report = SweepReport {
            matched: 1_201,
            removed: 1_200,
            batches: 3,
            dry_run: false,
            elapsed: Duration::from_millis(2_440),
            throttled: Duration::ZERO,
        };
        assert_eq!(
            report.summary("lt"),
            "done: keys under lt: scanned 1201, removed 1200 in 2.4 s"
        );
        let dry = SweepReport {
            dry_run: true,
            removed: 0,
            throttled: Duration::from_millis(1_960),
            ..report
        };
        assert_eq!(
            dry.summary("lt:x"),
            "dry run: keys under lt:x: scanned 1201, would remove 1201 in 2.4 s \
             (2.0 s waiting for the rate)"
        );
    }

    #[test]
    fn the_progress_message_counts_and_rates_the_keys_acted_on() {
        let p = SweepProgress {
            batches: 4,
            matched: 2_000,
            removed: 1_500,
        };
        assert_eq!(
            p.message(false, Duration::from_secs(2)),
            "scanned 2000, removed 1500 (750 keys/s)"
        );
        assert_eq!(
            p.message(true, Duration::from_secs(4)),
            "scanned 2000, would remove 2000 (500 keys/s)"
        );
    }

    #[test]
    fn flags_given_need_no_config() {
        let t = target(
            Some("redis://h:1".into()),
            Some("lt".into()),
            Path::new("/nonexistent/vigia.toml"),
        )
        .expect("no config read");
        assert_eq!(
            t,
            Target {
                url: "redis://h:1".into(),
                prefix: "lt".into()
            }
        );
    }

    #[test]
    fn a_missing_flag_with_an_unreadable_config_names_the_flag_and_the_file() {
        let err = target(
            Some("redis://h:1".into()),
            None,
            Path::new("/nonexistent/vigia.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("--prefix not given"), "{err}");
        assert!(err.contains("/nonexistent/vigia.toml"), "{err}");
        let err = target(None, None, Path::new("/nonexistent/vigia.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--redis and --prefix not given"), "{err}");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("redis://:s3cret@10.0.0.1:6400/0"),
            "redis://***@10.0.0.1:6400/0"
        );
        assert_eq!(
            redact("rediss://user:pw@host:6380"),
            "rediss://***@host:6380"
        );
        assert_eq!(redact("redis://127.0.0.1:6400"), "redis://127.0.0.1:6400");
        assert_eq!(redact("redis://h/0?x=a@b"), "redis://h/0?x=a@b");
    }
}
