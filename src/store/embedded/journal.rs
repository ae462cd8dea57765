//! The embedded store's durable log: generations of sled databases under
//! `<data_dir>/windows/gen-<N>/`, each holding a snapshot of the live state at its start
//! and a journal of every change since.
//!
//! Why generations: sled reuses the space of deleted entries but never gives it back, so
//! a log that only appended and deleted would keep the size of the busiest hour forever.
//! Instead a new generation starts from a snapshot of what is live (small once a wave of
//! traffic has expired) and the old generation's folder is removed whole: the files follow
//! the live windows, not history.
//!
//! Crash safety: a generation is trusted only once its snapshot is complete (a marker in
//! its `meta` tree, written after the snapshot is flushed). Recovery reads the newest
//! complete generation (snapshot, then journal) and then the journals of any newer,
//! incomplete ones — the changes made while their snapshot was being written.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Key prefixes in a generation's `log` tree: snapshot records sort before the journal.
const SNAPSHOT: u8 = 0;
const JOURNAL: u8 = 1;
const COMPLETE: &[u8] = b"complete";

/// One generation: a sled database with a `log` tree and a `meta` tree.
pub struct Generation {
    pub number: u64,
    dir: PathBuf,
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    seq: AtomicU64,
    /// Journal records appended since this generation started.
    pub appended: AtomicU64,
}

fn dir_of(root: &Path, number: u64) -> PathBuf {
    root.join(format!("gen-{number:020}"))
}

fn open_db(dir: &Path, flush_every_ms: u64) -> Result<sled::Db, sled::Error> {
    sled::Config::new()
        .path(dir)
        // sled's default cache is 1 GiB; the state itself is held in memory already.
        .cache_capacity(16 * 1024 * 1024)
        .flush_every_ms(Some(flush_every_ms))
        .open()
}

fn key(prefix: u8, seq: u64) -> [u8; 9] {
    let mut k = [prefix; 9];
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

impl Generation {
    /// Creates generation `number` under `root` (its snapshot not yet written).
    pub fn create(
        root: &Path,
        number: u64,
        flush_every_ms: u64,
    ) -> Result<Generation, sled::Error> {
        let dir = dir_of(root, number);
        let db = open_db(&dir, flush_every_ms)?;
        Ok(Generation {
            number,
            log: db.open_tree("log")?,
            meta: db.open_tree("meta")?,
            db,
            dir,
            seq: AtomicU64::new(0),
            appended: AtomicU64::new(0),
        })
    }

    /// Appends one journal record. The caller holds the locks of every key it touches,
    /// so records of one key are appended in the order they happened.
    pub fn append(&self, record: &[u8]) -> Result<(), sled::Error> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.log.insert(key(JOURNAL, seq), record)?;
        self.appended.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the snapshot records, then marks the generation complete, durably.
    pub fn complete(&self, snapshot: impl IntoIterator<Item = Vec<u8>>) -> Result<(), sled::Error> {
        for (i, record) in snapshot.into_iter().enumerate() {
            self.log.insert(key(SNAPSHOT, i as u64), record)?;
        }
        self.db.flush()?;
        self.meta.insert(COMPLETE, b"1")?;
        self.db.flush()?;
        Ok(())
    }

    pub fn flush(&self) -> Result<(), sled::Error> {
        self.db.flush().map(|_| ())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// What recovery found.
pub struct Recovered {
    /// Records to replay, in order.
    pub records: Vec<sled::IVec>,
    /// The number the next generation takes.
    pub next: u64,
    /// Generation folders to remove once a new generation is complete.
    pub old: Vec<PathBuf>,
}

fn generations(root: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_prefix("gen-"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            found.push((n, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Reads back every generation under `root` (creating `root` if needed).
pub fn recover(root: &Path, flush_every_ms: u64) -> Result<Recovered, String> {
    std::fs::create_dir_all(root).map_err(|e| format!("create {}: {e}", root.display()))?;
    let gens = generations(root).map_err(|e| format!("read {}: {e}", root.display()))?;
    let mut complete_at = None;
    let mut opened = Vec::new();
    for (n, dir) in &gens {
        let db =
            open_db(dir, flush_every_ms).map_err(|e| format!("open {}: {e}", dir.display()))?;
        let meta = db.open_tree("meta").map_err(|e| e.to_string())?;
        if meta.contains_key(COMPLETE).map_err(|e| e.to_string())? {
            complete_at = Some(opened.len());
        }
        opened.push((*n, db));
    }
    let mut records = Vec::new();
    let start = complete_at.unwrap_or(0);
    for (i, (_, db)) in opened.iter().enumerate().skip(start) {
        let log = db.open_tree("log").map_err(|e| e.to_string())?;
        // The trusted generation replays its snapshot and journal; newer ones (whose
        // snapshot may be partial) only their journal.
        let from: &[u8] = if Some(i) == complete_at {
            &[SNAPSHOT]
        } else {
            &[JOURNAL]
        };
        for item in log.range(from..) {
            let (_, v) = item.map_err(|e| e.to_string())?;
            records.push(v);
        }
    }
    Ok(Recovered {
        records,
        next: gens.last().map_or(1, |(n, _)| n + 1),
        old: gens.into_iter().map(|(_, d)| d).collect(),
    })
}

/// Bytes of every file under `dir`.
pub fn disk_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(r: &Recovered) -> Vec<Vec<u8>> {
        r.records.iter().map(|v| v.to_vec()).collect()
    }

    #[test]
    fn recovery_trusts_the_newest_complete_generation_and_newer_journals() {
        let root = tempfile::tempdir().unwrap();
        {
            let g1 = Generation::create(root.path(), 1, 200).unwrap();
            g1.complete([b"snap1".to_vec()]).unwrap();
            g1.append(b"j1a").unwrap();
            g1.append(b"j1b").unwrap();
            // A compaction that crashed halfway: journal written, snapshot partial.
            let g2 = Generation::create(root.path(), 2, 200).unwrap();
            g2.append(b"j2a").unwrap();
            g2.log
                .insert(key(SNAPSHOT, 0), b"partial".as_slice())
                .unwrap();
            g1.flush().unwrap();
            g2.flush().unwrap();
        }
        let r = recover(root.path(), 200).unwrap();
        assert_eq!(
            values(&r),
            [
                b"snap1".to_vec(),
                b"j1a".to_vec(),
                b"j1b".to_vec(),
                b"j2a".to_vec()
            ]
        );
        assert_eq!(r.next, 3);
        assert_eq!(r.old.len(), 2);

        // Once generation 3 is complete, it alone is read.
        {
            let g3 = Generation::create(root.path(), 3, 200).unwrap();
            g3.complete([b"snap3".to_vec()]).unwrap();
        }
        let r = recover(root.path(), 200).unwrap();
        assert_eq!(values(&r), [b"snap3".to_vec()]);
    }
}
