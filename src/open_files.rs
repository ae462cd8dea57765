//! The process's open-file limit, and the connections each HTTP worker holds under it.
//!
//! Every connection holds a file descriptor. A process at its limit can accept nothing more,
//! nor open a store file or a Redis connection (`EMFILE`): every check fails, not only the
//! ones on the connections that used the files up. So the soft limit is raised to the hard
//! one at start ([`raise`]), and each worker holds at most its share of the limit less what
//! the rest of the process needs ([`connections_per_worker`]); connections past it wait in
//! the listen backlog until one closes (the request deadline, `http::deadline`, sees that
//! they do).

use std::io;

use rlimit::Resource;

/// The soft and hard `RLIMIT_NOFILE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub soft: u64,
    pub hard: u64,
}

/// The limits in force.
pub fn current() -> io::Result<Limits> {
    let (soft, hard) = Resource::NOFILE.get()?;
    Ok(Limits { soft, hard })
}

/// Raises the soft limit to the hard one (as far as the system allows); the limits
/// before and after.
pub fn raise() -> io::Result<(Limits, Limits)> {
    let before = current()?;
    rlimit::increase_nofile_limit(u64::MAX)?;
    Ok((before, current()?))
}

/// Descriptors kept for everything but client connections (the embedded store's and the
/// journals' files, Redis connections, the rules watch, the runtimes' own, the listening
/// socket): at least this many.
pub const RESERVED_MIN: u64 = 256;

/// The most connections a worker holds however high the limit: actix's own default, which
/// bounded the memory connections take before the limit was looked at.
pub const MAX_PER_WORKER: usize = 25_600;

/// Descriptors kept for the rest of the process under a soft limit of `soft`: a tenth of
/// it, at least [`RESERVED_MIN`].
pub fn reserved(soft: u64) -> u64 {
    (soft / 10).max(RESERVED_MIN)
}

/// The connections each of `workers` holds under a soft limit of `soft`: an equal share of
/// what [`reserved`] leaves, at least one, at most [`MAX_PER_WORKER`].
pub fn connections_per_worker(soft: u64, workers: usize) -> usize {
    let workers = workers.max(1) as u64;
    let share = soft.saturating_sub(reserved(soft)) / workers;
    usize::try_from(share)
        .unwrap_or(usize::MAX)
        .clamp(1, MAX_PER_WORKER)
}

/// `[http] max_connections_per_worker` asks for more connections than the open-file
/// limit leaves room for.
#[derive(Debug, thiserror::Error)]
#[error(
    "http.max_connections_per_worker: {asked} on each of {workers} workers is more than the \
     open-file limit {soft} leaves room for ({allowed} each, {reserved} files kept for the \
     store and the rest); lower it, or raise the limit (ulimit -n, systemd LimitNOFILE=)"
)]
pub struct TooManyConnections {
    pub asked: usize,
    pub workers: usize,
    pub soft: u64,
    pub allowed: usize,
    pub reserved: u64,
}

/// The connections each of `workers` holds: `configured` when the limit `soft` has room
/// for it, else an error naming both; by default [`connections_per_worker`].
pub fn cap(
    configured: Option<usize>,
    workers: usize,
    soft: u64,
) -> Result<usize, TooManyConnections> {
    let reserved = reserved(soft);
    let room = soft.saturating_sub(reserved) / workers.max(1) as u64;
    match configured {
        None => Ok(connections_per_worker(soft, workers)),
        Some(asked) if asked as u64 <= room => Ok(asked),
        Some(asked) => Err(TooManyConnections {
            asked,
            workers,
            soft,
            allowed: connections_per_worker(soft, workers),
            reserved,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_together_stays_under_the_limit_with_room_for_the_rest() {
        for soft in [1_024, 4_096, 20_000, 65_536, 1_048_576] {
            for workers in [1, 2, 4, 16] {
                let each = connections_per_worker(soft, workers) as u64;
                assert!(
                    each * workers as u64 + RESERVED_MIN <= soft,
                    "{soft} {workers}: {each} each"
                );
            }
        }
        assert_eq!(connections_per_worker(20_000, 2), 9_000);
        assert_eq!(connections_per_worker(1_024, 2), 384);
        // A limit too small for any room still lets each worker serve.
        assert_eq!(connections_per_worker(100, 2), 1);
        // A huge limit does not lift actix's own bound.
        assert_eq!(connections_per_worker(u64::MAX, 1), MAX_PER_WORKER);
    }

    #[test]
    fn a_configured_cap_is_kept_when_the_limit_has_room_and_refused_naming_it_otherwise() {
        assert_eq!(cap(None, 2, 20_000).unwrap(), 9_000);
        assert_eq!(cap(Some(50), 2, 20_000).unwrap(), 50);
        assert_eq!(cap(Some(9_000), 2, 20_000).unwrap(), 9_000);
        let err = cap(Some(9_001), 2, 20_000).unwrap_err().to_string();
        assert!(
            err.starts_with("http.max_connections_per_worker: 9001"),
            "{err}"
        );
        assert!(err.contains("20000") && err.contains("9000 each"), "{err}");
    }
}
