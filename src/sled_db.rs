//! Opening a sled database (the behaviour actors' state, the trust event journal).
//!
//! sled lets go of a folder's lock from its background threads, a moment after the last
//! handle is dropped: a reopen right after a close in the same process (an in-process
//! restart, a test that reopens what it wrote) could otherwise find it still held.
//!
//! A lock still held after that grace belongs to another process — in practice a second
//! vigia started on the same `data_dir` — and is said so, naming the folder, rather than
//! as sled's "could not acquire lock" and an errno.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long [`open`] waits for the folder's lock.
const LOCK_GRACE: Duration = Duration::from_secs(2);

/// Why a sled folder did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process holds the folder's lock.
    #[error(
        "{} is locked by another process — another vigia running on the same data_dir? Stop \
         it, or give this one its own data_dir (VIGIA_DATA_DIR): two processes on one \
         folder would overwrite each other's state",
        dir.display()
    )]
    HeldByAnother { dir: PathBuf },
    #[error(transparent)]
    Sled(#[from] sled::Error),
}

/// Opens the sled db at `dir` with a page cache of `cache_bytes`, waiting up to
/// [`LOCK_GRACE`] while its lock is held.
pub fn open(dir: &Path, cache_bytes: u64) -> Result<sled::Db, OpenError> {
    let until = Instant::now() + LOCK_GRACE;
    loop {
        let opened = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open();
        match opened {
            // sled (pinned at 0.34.7) reports a held lock only in the message's text.
            Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                if Instant::now() >= until {
                    return Err(OpenError::HeldByAnother {
                        dir: dir.to_path_buf(),
                    });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other.map_err(OpenError::Sled),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder another handle holds past the grace is named as held, not as sled's
    /// lock error.
    #[test]
    fn a_folder_held_elsewhere_is_named_as_held() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _held = open(dir.path(), 1 << 20).expect("first open");
        let e = open(dir.path(), 1 << 20).expect_err("second open");
        assert!(matches!(e, OpenError::HeldByAnother { .. }), "{e:?}");
        let message = e.to_string();
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        assert!(message.contains("another vigia"), "{message}");
    }
}
