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

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

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
    pub batch: usize,
}

impl SweepOptions {
    /// A real (not dry) sweep of `prefix` with the default batch size.
    pub fn new(prefix: impl Into<String>) -> SweepOptions {
        SweepOptions {
            prefix: prefix.into(),
            dry_run: false,
            batch: DEFAULT_BATCH,
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
}

/// Why a sweep did not start or did not finish. A sweep that fails midway has removed the
/// keys of the batches before the failure; running it again is safe.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("refusing to sweep an empty prefix: it would remove every key in the database")]
    EmptyPrefix,
    #[error("batch size must be at least 1")]
    ZeroBatch,
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
    let mut conn = connect(url).await?;

    let mut totals = SweepProgress::default();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(opts.batch)
            .query_async(&mut conn)
            .await?;
        totals.batches += 1;
        totals.matched += keys.len() as u64;
        if !opts.dry_run {
            // COUNT is a hint: one SCAN may return more than `batch` keys.
            for chunk in keys.chunks(opts.batch) {
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
    })
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
fn redact(url: &str) -> String {
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
