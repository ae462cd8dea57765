//! The event journal: every accepted event, durable before it is acknowledged, and the
//! queue of those not yet applied.
//!
//! One sled database (`data_dir/events`) with three trees:
//!
//! - `events`: seq (u64, big-endian, so keys sort in acceptance order) -> [`Entry`] (JSON);
//! - `pending`: seq -> nothing, for entries whose effect is not applied yet;
//! - `seen`: event id -> seq, so an event id is accepted once.
//!
//! A batch is one serialisable sled transaction over the three trees: either every new
//! event of it is journaled, pending and seen, or none is, and two requests carrying the
//! same event id cannot both insert it. The caller flushes (fsync) before answering.
//!
//! Applied entries older than [`RETENTION_MS`] are pruned, ids included: the journal
//! follows recent traffic, not history. Forgetting an old id is safe because application
//! is idempotent anyway (see `events`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

use super::event::EventKind;
use super::ledger::Award;
use crate::store::RefundOp;

/// How long an applied entry (and its event id) is kept. A sender's retries come within
/// minutes or hours; a week is far past that, and an award re-sent after it is still
/// recorded once (the ledger keys awards by event id while they live, and a re-sent
/// award of an expired one is expired too).
pub const RETENTION_MS: u64 = 7 * 86_400_000;

/// sled's page cache for the journal (its default is 1 GiB). Entries are written once and
/// read once or twice; nothing here benefits from a large cache.
const CACHE_BYTES: u64 = 8 * 1024 * 1024;

/// What applying an entry does, decided once when the event was accepted, from the rules
/// then in force, so a replay after a reload or a restart does exactly the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Nothing (no `[trust]` for the type, or the award had already expired).
    None,
    Award(Award),
    /// A challenge pass: one award per scene it lifts (and its points, when the rules
    /// give some), each recorded once.
    Awards(Vec<Award>),
    Refund(RefundOp),
}

/// One journaled event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub event_id: String,
    pub kind: EventKind,
    pub user_id: Option<String>,
    pub occurred_at_ms: u64,
    pub accepted_at_ms: u64,
    pub effect: Effect,
    /// A challenge pass's scene, when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scene: Option<String>,
}

/// The journal could not read or write its database. Names the folder.
#[derive(Debug, thiserror::Error)]
#[error("event journal at {}: {message}", path.display())]
pub struct JournalError {
    pub path: PathBuf,
    pub message: String,
}

/// The journal over its sled database.
pub struct Journal {
    db: sled::Db,
    path: PathBuf,
    events: sled::Tree,
    pending: sled::Tree,
    seen: sled::Tree,
    /// The next seq. Held through a batch's transaction, so seqs follow commit order.
    next_seq: Mutex<u64>,
    /// `pending` holds this many entries (sled's `len` walks the whole tree).
    pending_count: AtomicUsize,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .field("pending", &self.pending_count.load(Ordering::Relaxed))
            .finish()
    }
}

fn seq_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

fn seq_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

/// Opens (or creates) the journal's sled database under `dir`. The trust ledger of the
/// embedded mode lives in it too: one process may open a sled folder only once.
pub fn open_db(dir: &Path) -> Result<sled::Db, JournalError> {
    crate::sled_db::open(dir, CACHE_BYTES).map_err(|e| JournalError {
        path: dir.to_path_buf(),
        message: format!("cannot open: {e}"),
    })
}

impl Journal {
    /// The journal in `db` (opened at `path`, which errors name).
    pub fn new(db: sled::Db, path: &Path) -> Result<Journal, JournalError> {
        let err = |e: sled::Error| JournalError {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let events = db.open_tree("events").map_err(err)?;
        let pending = db.open_tree("pending").map_err(err)?;
        let seen = db.open_tree("seen").map_err(err)?;
        let next = match events.last().map_err(err)? {
            Some((k, _)) => seq_of(&k).map_or(0, |s| s + 1),
            None => 0,
        };
        let pending_count = pending.len();
        Ok(Journal {
            db,
            path: path.to_path_buf(),
            events,
            pending,
            seen,
            next_seq: Mutex::new(next),
            pending_count: AtomicUsize::new(pending_count),
        })
    }

    /// The folder the journal lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, message: impl std::fmt::Display) -> JournalError {
        JournalError {
            path: self.path.clone(),
            message: message.to_string(),
        }
    }

    /// Journals a batch in one transaction. Per entry, in order: `Some(seq)` when it was
    /// inserted (and is pending), `None` when its event id was seen before or earlier in
    /// the batch. Not yet durable: call [`Journal::flush`].
    pub fn append(&self, entries: &[Entry]) -> Result<Vec<Option<u64>>, JournalError> {
        let encoded: Vec<Vec<u8>> = entries
            .iter()
            .map(serde_json::to_vec)
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(format!("cannot encode an entry: {e}")))?;
        // Seqs follow commit order; a panic elsewhere leaves the counter valid.
        let mut next = self.next_seq.lock().unwrap_or_else(|p| p.into_inner());
        let start = *next;
        let placed = (&self.events, &self.pending, &self.seen)
            .transaction(|(events, pending, seen)| {
                let mut seq = start;
                let mut in_batch = HashSet::with_capacity(entries.len());
                let mut placed = Vec::with_capacity(entries.len());
                for (entry, bytes) in entries.iter().zip(&encoded) {
                    let id = entry.event_id.as_bytes();
                    if !in_batch.insert(id) || seen.get(id)?.is_some() {
                        placed.push(None);
                        continue;
                    }
                    events.insert(&seq_key(seq), bytes.as_slice())?;
                    pending.insert(&seq_key(seq), &[][..])?;
                    seen.insert(id, &seq_key(seq))?;
                    placed.push(Some(seq));
                    seq += 1;
                }
                Ok::<_, ConflictableTransactionError<()>>(placed)
            })
            .map_err(|e| match e {
                TransactionError::Storage(e) => self.err(e),
                TransactionError::Abort(()) => self.err("transaction aborted"),
            })?;
        let inserted = placed.iter().flatten().count();
        *next = start + inserted as u64;
        self.pending_count.fetch_add(inserted, Ordering::Relaxed);
        Ok(placed)
    }

    /// Makes everything journaled so far durable (fsync).
    pub async fn flush(&self) -> Result<(), JournalError> {
        self.db
            .flush_async()
            .await
            .map(|_| ())
            .map_err(|e| self.err(format!("flush: {e}")))
    }

    /// The same, blocking (for shutdown).
    pub fn flush_blocking(&self) -> Result<(), JournalError> {
        self.db
            .flush()
            .map(|_| ())
            .map_err(|e| self.err(format!("flush: {e}")))
    }

    /// Up to `limit` pending seqs after `after` (all when `None`), in order.
    pub fn pending_after(
        &self,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<u64>, JournalError> {
        let iter = match after {
            Some(s) => self.pending.range(seq_key(s.saturating_add(1))..),
            None => self.pending.iter(),
        };
        let mut out = Vec::with_capacity(limit.min(1024));
        for item in iter.take(limit) {
            let (k, _) = item.map_err(|e| self.err(e))?;
            if let Some(seq) = seq_of(&k) {
                out.push(seq);
            }
        }
        Ok(out)
    }

    /// Whether `seq` still waits to be applied.
    pub fn is_pending(&self, seq: u64) -> Result<bool, JournalError> {
        self.pending
            .contains_key(seq_key(seq))
            .map_err(|e| self.err(e))
    }

    /// The entry at `seq`. `Ok(None)` when there is none; an error when it is unreadable.
    pub fn get(&self, seq: u64) -> Result<Option<Entry>, JournalError> {
        let Some(bytes) = self.events.get(seq_key(seq)).map_err(|e| self.err(e))? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| self.err(format!("entry {seq} is unreadable: {e}")))
    }

    /// Marks entries applied. Needs no flush: an un-pend lost to a crash only applies the
    /// entry once more, which changes nothing.
    pub fn unpend(&self, seqs: &[u64]) -> Result<(), JournalError> {
        for &seq in seqs {
            if self
                .pending
                .remove(seq_key(seq))
                .map_err(|e| self.err(e))?
                .is_some()
            {
                self.pending_count.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Entries waiting to be applied.
    pub fn pending_len(&self) -> usize {
        self.pending_count.load(Ordering::Relaxed)
    }

    /// Entries held (applied or not).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the journal holds no entry.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Removes up to `limit` applied entries accepted before `cutoff_ms`, with their ids;
    /// returns how many. Pending entries stay whatever their age.
    pub fn prune(&self, cutoff_ms: u64, limit: usize) -> Result<usize, JournalError> {
        let mut pruned = 0;
        for item in self.events.iter() {
            if pruned >= limit {
                break;
            }
            let (k, v) = item.map_err(|e| self.err(e))?;
            let Some(seq) = seq_of(&k) else { continue };
            if self.is_pending(seq)? {
                continue;
            }
            // An unreadable applied entry has nothing left to give: prune it by age of
            // its neighbours (it sorts among them), i.e. as if it were old.
            let entry: Option<Entry> = serde_json::from_slice(&v).ok();
            if entry
                .as_ref()
                .is_some_and(|e| e.accepted_at_ms >= cutoff_ms)
            {
                // Seqs follow acceptance time: everything after this is younger.
                break;
            }
            if let Some(e) = &entry {
                let id = e.event_id.as_bytes();
                // Only the id's own mapping: never one a later entry re-took. A failed
                // removal only keeps the id (a duplicate) a while longer.
                let _ = self
                    .seen
                    .compare_and_swap(id, Some(&seq_key(seq)[..]), None::<&[u8]>);
            }
            self.events.remove(&k).map_err(|e| self.err(e))?;
            pruned += 1;
        }
        Ok(pruned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, accepted_at_ms: u64) -> Entry {
        Entry {
            event_id: id.into(),
            kind: EventKind::PaymentSucceeded,
            user_id: Some("u".into()),
            occurred_at_ms: accepted_at_ms,
            accepted_at_ms,
            effect: Effect::None,
            scene: None,
        }
    }

    fn journal(dir: &Path) -> Journal {
        Journal::new(open_db(dir).unwrap(), dir).unwrap()
    }

    #[test]
    fn a_batch_is_placed_once_per_event_id_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let j = journal(dir.path());
            let placed = j
                .append(&[entry("a", 1), entry("b", 1), entry("a", 1)])
                .unwrap();
            assert_eq!(placed, [Some(0), Some(1), None]);
            let placed = j.append(&[entry("b", 2), entry("c", 2)]).unwrap();
            assert_eq!(placed, [None, Some(2)]);
            assert_eq!(j.pending_len(), 3);
            j.unpend(&[1]).unwrap();
            j.flush_blocking().unwrap();
        }
        let j = journal(dir.path());
        assert_eq!(j.pending_len(), 2);
        assert_eq!(j.pending_after(None, 10).unwrap(), [0, 2]);
        assert_eq!(j.pending_after(Some(0), 10).unwrap(), [2]);
        assert_eq!(j.get(2).unwrap().unwrap().event_id, "c");
        // The seq counter continues after the last entry, and ids stay seen.
        assert_eq!(
            j.append(&[entry("c", 3), entry("d", 3)]).unwrap(),
            [None, Some(3)]
        );
    }

    #[test]
    fn pruning_keeps_pending_and_young_entries() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path());
        j.append(&[
            entry("old-applied", 10),
            entry("old-pending", 10),
            entry("young", 100),
        ])
        .unwrap();
        j.unpend(&[0, 2]).unwrap();
        assert_eq!(j.prune(50, 100).unwrap(), 1);
        assert_eq!(j.len(), 2);
        assert!(j.get(0).unwrap().is_none());
        // Its id may be taken again; the others stay duplicates.
        assert_eq!(
            j.append(&[
                entry("old-applied", 200),
                entry("young", 200),
                entry("old-pending", 200)
            ])
            .unwrap(),
            [Some(3), None, None]
        );
    }
}
