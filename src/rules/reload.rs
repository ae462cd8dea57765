//! Hot reload: the one place a new rule set replaces the current one.
//!
//! Every trigger — the folder watch ([`super::watch`]), SIGHUP, `POST /v1/admin/reload` —
//! calls [`Reloader::reload`], which reads and fully validates the folder on the calling
//! (blocking) thread, never on a request path, and then swaps the whole set atomically.
//! A check in flight keeps the `Arc<RuleSet>` it started with and finishes on that version.
//!
//! An invalid set never replaces a valid one: the old one keeps serving and the first
//! error (file, line, message, at) is kept for `GET /v1/rules`; the next successful load
//! clears it. Reloads are serialised, so the last one to finish has read the folder last:
//! a slow load of an older content can never overwrite a newer one.
//!
//! State across versions. Gateway buckets of unchanged scenes carry over (the checker's
//! hook, `Checker::sync_rules`, runs after each swap); behaviour state is per entity and
//! shared by scenes, so it carries over by construction. Store keys do not depend on the
//! version, so windows carry over too — and when a limit's `max` or `window` changes,
//! the counts already in the store apply against the new values at once:
//! - a lowered `max` can deny on the very next check (the count is already over it);
//! - a longer sliding window counts only the members the ZSET still holds: they were
//!   trimmed to the old (longest) window, so it under-counts until the new window fills;
//!   a shorter one counts only the members inside it;
//! - a fixed window stores its aligned start; a new length aligns differently, so the
//!   count restarts at the next check (unless the old start happens to be aligned too);
//! - a token bucket keeps its tokens left, refilled at the new rate, capped at the new
//!   capacity.
//!
//! This is deliberate: no reload ever resets a quota wholesale (an abuser cannot get a
//! fresh allowance by waiting for an operator's edit), and none needs a store migration.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use serde::Serialize;
use utoipa::ToSchema;

use super::{load_dir, RuleError, RuleErrors, RuleSet, RulesHandle};
use crate::metrics::Metrics;

/// The last rule load that failed (shown by `GET /v1/rules` until a load succeeds): its
/// first error, and every error it found. The first stays where clients read it before
/// `errors` was added.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RulesError {
    /// The first error's file.
    pub file: String,
    pub line: usize,
    pub message: String,
    /// RFC 3339, UTC.
    pub at: String,
    /// Every error of that load, in file then line order (the first is the one above): an
    /// operator fixes them all at once, not one per reload.
    pub errors: Vec<RuleError>,
}

impl RulesError {
    /// The report of a load that failed at `at` (RFC 3339) with `errors`, in `dir`.
    fn of(dir: &Path, errors: &RuleErrors, at: String) -> RulesError {
        let first = errors.0.first();
        RulesError {
            file: first.map_or_else(|| dir.display().to_string(), |e| e.file.clone()),
            line: first.map_or(0, |e| e.line),
            message: first.map_or_else(|| errors.to_string(), |e| e.message.clone()),
            at,
            errors: errors.0.clone(),
        }
    }
}

/// What asked for a reload (logged with each attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The folder watch saw a change.
    Watch,
    /// SIGHUP.
    Signal,
    /// `POST /v1/admin/reload`.
    Admin,
}

impl Trigger {
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Watch => "watch",
            Trigger::Signal => "sighup",
            Trigger::Admin => "admin",
        }
    }
}

/// The outcome of a successful reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// The version now serving.
    pub version: String,
    /// False when the folder held the version already serving (nothing was swapped).
    pub changed: bool,
}

/// Called with each new rule set right after it is swapped in (the checker's
/// `sync_rules`: gateway buckets per scene).
pub type SwapHook = Box<dyn Fn(&RuleSet) + Send + Sync>;

/// Loads, validates and swaps rule sets; shared by every trigger.
pub struct Reloader {
    dir: PathBuf,
    rules: Arc<RulesHandle>,
    on_swap: SwapHook,
    metrics: Metrics,
    last_error: Arc<ArcSwapOption<RulesError>>,
    /// One reload at a time, load and swap together.
    serial: Mutex<()>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    pub fn new(
        dir: &Path,
        rules: Arc<RulesHandle>,
        on_swap: SwapHook,
        metrics: Metrics,
        last_error: Arc<ArcSwapOption<RulesError>>,
    ) -> Self {
        Reloader {
            dir: dir.to_path_buf(),
            rules,
            on_swap,
            metrics,
            last_error,
            serial: Mutex::new(()),
        }
    }

    /// The folder this reloader reads.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last failed load, if no load succeeded since.
    pub fn last_error(&self) -> Option<RulesError> {
        self.last_error.load_full().map(|e| (*e).clone())
    }

    /// Reads and validates the folder and, when it is valid and differs from the set in
    /// force, swaps it in. Blocking (file reads, compile): call it from a blocking thread.
    /// One log line per attempt.
    pub fn reload(&self, trigger: Trigger) -> Result<Reloaded, RuleErrors> {
        // A panic while holding the lock cannot leave half a swap behind: take it anyway.
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.rules.current();
        match load_dir(&self.dir) {
            Ok(new) if new.version == current.version => {
                self.last_error.store(None);
                self.metrics.rule_reload("ok");
                tracing::info!(
                    trigger = trigger.name(),
                    version = %new.version,
                    "rules reload: unchanged"
                );
                Ok(Reloaded {
                    version: new.version,
                    changed: false,
                })
            }
            Ok(new) => {
                let version = new.version.clone();
                let scenes = new.scenes.len();
                self.rules.swap(new);
                (self.on_swap)(&self.rules.current());
                self.last_error.store(None);
                self.metrics.rule_reload("ok");
                self.metrics.rules_version(&version);
                tracing::info!(
                    trigger = trigger.name(),
                    from = %current.version,
                    version = %version,
                    scenes,
                    "rules reloaded"
                );
                Ok(Reloaded {
                    version,
                    changed: true,
                })
            }
            Err(errors) => {
                let at = crate::clock::rfc3339(self.rules.clock().now_ms());
                self.last_error
                    .store(Some(Arc::new(RulesError::of(&self.dir, &errors, at))));
                self.metrics.rule_reload("error");
                tracing::warn!(
                    trigger = trigger.name(),
                    version = %current.version,
                    errors = %errors,
                    "rules reload failed; the previous rules keep serving"
                );
                Err(errors)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const VALID: &str = r#"
[scene.s]
on_store_error = "fail_open"
required = ["user"]

[[scene.s.limits]]
name = "u"
dimensions = ["user"]
algorithm = "sliding_window"
window = "10s"
max = 1
layer = "business"
"#;

    fn setup(dir: &Path) -> (Reloader, Arc<AtomicUsize>, Arc<RulesHandle>) {
        std::fs::write(dir.join("s.toml"), VALID).unwrap();
        let rules = Arc::new(RulesHandle::new(
            load_dir(dir).unwrap(),
            Arc::new(crate::clock::SystemClock),
        ));
        let synced = Arc::new(AtomicUsize::new(0));
        let s = synced.clone();
        let reloader = Reloader::new(
            dir,
            rules.clone(),
            Box::new(move |_| {
                s.fetch_add(1, Ordering::SeqCst);
            }),
            Metrics::new(),
            Arc::new(ArcSwapOption::empty()),
        );
        (reloader, synced, rules)
    }

    #[test]
    fn unchanged_folders_swap_nothing_and_valid_changes_swap_and_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (reloader, synced, rules) = setup(dir.path());
        let v0 = rules.current().version.clone();
        let r = reloader.reload(Trigger::Admin).unwrap();
        assert_eq!((r.version.as_str(), r.changed), (v0.as_str(), false));
        assert_eq!(synced.load(Ordering::SeqCst), 0);

        std::fs::write(
            dir.path().join("s.toml"),
            VALID.replace("max = 1", "max = 2"),
        )
        .unwrap();
        let r = reloader.reload(Trigger::Watch).unwrap();
        assert!(r.changed);
        assert_ne!(r.version, v0);
        assert_eq!(rules.current().version, r.version);
        assert_eq!(synced.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_invalid_set_keeps_the_old_one_and_is_reported_until_a_valid_load() {
        let dir = tempfile::tempdir().unwrap();
        let (reloader, synced, rules) = setup(dir.path());
        let v0 = rules.current().version.clone();
        std::fs::write(
            dir.path().join("s.toml"),
            VALID.replace("sliding_window", "leaky"),
        )
        .unwrap();
        let errors = reloader.reload(Trigger::Signal).unwrap_err();
        assert!(!errors.0.is_empty());
        assert_eq!(rules.current().version, v0);
        assert_eq!(synced.load(Ordering::SeqCst), 0);
        let e = reloader.last_error().expect("error kept");
        assert!(e.file.ends_with("s.toml"), "{e:?}");
        assert!(e.line > 0, "{e:?}");
        assert_eq!(e.errors, errors.0, "every error, the first one first");

        std::fs::write(dir.path().join("s.toml"), VALID).unwrap();
        let r = reloader.reload(Trigger::Admin).unwrap();
        assert_eq!(r.version, v0);
        assert!(reloader.last_error().is_none());
    }
}
