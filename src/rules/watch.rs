//! The rules folder watch: `notify` events, debounced, each burst one
//! [`Reloader::reload`](super::reload::Reloader::reload) on the debouncer's own thread.
//!
//! The folder is watched, not the files: editors save by writing a temporary file and
//! renaming it over the old one, which a watch on the file itself would lose. Events are
//! debounced ([`DEBOUNCE`]) so a save-and-rename, or a file written in several chunks,
//! is read once, complete. A half-written file that slips through anyway fails to
//! validate and leaves the old rules serving; the write's last event triggers the next,
//! complete read.
//!
//! Any event in the folder but a read triggers a reload, not only those naming a
//! `*.toml`: a Kubernetes ConfigMap updates by renaming a hidden `..data` folder the rule
//! files link through. A reload that finds the version already serving swaps nothing.
//! Only the folder's own entries are watched: a change to the target of a symbolic link
//! that points outside it is not seen (SIGHUP or `POST /v1/admin/reload` picks it up).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::RecursiveMode;
use notify_debouncer_full::{new_debouncer, DebounceEventResult, Debouncer, RecommendedCache};

use super::reload::{Reloader, Trigger};

/// Quiet time after the last event of a burst before the folder is read.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// A running watch; dropping it stops it.
pub struct RulesWatcher {
    _debouncer: Mutex<Debouncer<notify::RecommendedWatcher, RecommendedCache>>,
}

impl std::fmt::Debug for RulesWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RulesWatcher").finish_non_exhaustive()
    }
}

/// True for events that may change what the folder holds (reads do not).
fn may_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// Watches `reloader`'s folder and reloads after each burst of changes.
pub fn watch(reloader: Arc<Reloader>) -> Result<RulesWatcher, notify::Error> {
    let dir = reloader.dir().to_path_buf();
    let handler = move |result: DebounceEventResult| match result {
        Ok(events) => {
            if events.iter().any(|e| may_change(&e.kind)) {
                // Errors are kept and logged by the reloader.
                let _ = reloader.reload(Trigger::Watch);
            }
        }
        Err(errors) => {
            for e in errors {
                tracing::warn!(error = %e, "rules watch: error");
            }
        }
    };
    let mut debouncer = new_debouncer(DEBOUNCE, None, handler)?;
    debouncer.watch(Path::new(&dir), RecursiveMode::NonRecursive)?;
    tracing::info!(dir = %dir.display(), "rules watch started");
    Ok(RulesWatcher {
        _debouncer: Mutex::new(debouncer),
    })
}
