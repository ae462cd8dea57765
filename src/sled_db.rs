//! Opening a sled database (the behaviour actors' state, the trust event journal).
//!
//! sled lets go of a folder's lock from its background threads, a moment after the last
//! handle is dropped: a reopen right after a close in the same process (an in-process
//! restart, a test that reopens what it wrote) could otherwise find it still held.

use std::path::Path;
use std::time::{Duration, Instant};

/// How long [`open`] waits for the folder's lock.
const LOCK_GRACE: Duration = Duration::from_secs(2);

/// Opens the sled db at `dir` with a page cache of `cache_bytes`, waiting up to
/// [`LOCK_GRACE`] while its lock is held.
pub fn open(dir: &Path, cache_bytes: u64) -> Result<sled::Db, sled::Error> {
    let until = Instant::now() + LOCK_GRACE;
    loop {
        let opened = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open();
        match opened {
            // sled (pinned at 0.34.7) reports a held lock only in the message's text.
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock") && Instant::now() < until =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}
