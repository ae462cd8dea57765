//! The embedded store's durable log: generations under `<data_dir>/windows/gen-<N>/`, each
//! a snapshot of the live state at its start (`snapshot.log`) and an append-only journal
//! of every change since (`journal.log`).
//!
//! Why a framed log and not a database: a check's changes are one record, read back only
//! at start. Appending it to a buffer costs a copy; a B-tree insert per check (what sled
//! did here) cost a third of the check and was made while holding the shard locks.
//!
//! Group commit: [`Journal::append`] copies a framed record into a shared buffer — under
//! the caller's shard locks, so records of one key are in the order they happened — and
//! returns. A writer thread hands the buffer to the kernel every [`WRITE_EVERY_MS`]
//! (a `kill -9` loses at most that: the page cache outlives the process) and `fdatasync`s
//! every [`SYNC_EVERY_MS`] (what a power loss can cost). [`Journal::flush`] does both at
//! once; a clean shutdown calls it and loses nothing.
//!
//! Frames: `len u32 LE, crc32 u32 LE, payload`. Recovery stops at the first frame whose
//! length runs past the file or whose checksum is wrong — the torn tail of a crash — and
//! says how many bytes it dropped.
//!
//! Failure: a write or sync that fails is retried on the next tick, from where the file
//! was good (the torn part truncated away); until one succeeds, `append` refuses, so the
//! scene's `on_store_error` decides instead of the store forgetting silently.
//!
//! Why generations: a log that only grew would keep every check ever made. A new
//! generation starts from a snapshot of what is live (small once a wave has expired) and
//! the old generation's folder is removed whole: the files follow the live windows.
//! A generation is trusted only once its snapshot is complete (the `complete` marker,
//! created after the snapshot is synced). Recovery reads the newest complete generation
//! (snapshot, then journal) and then the journals of any newer, incomplete ones — the
//! changes made while their snapshot was being written. Before a new generation's journal
//! takes its first byte the old one's is synced, so no crash leaves a hole between them.
//!
//! Folders written by earlier versions (a sled database per generation) are read once at
//! start, then replaced by a new generation like any other.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often buffered records are written to the journal file.
pub const WRITE_EVERY_MS: u64 = 20;
/// How often the journal file is synced to disk.
pub const SYNC_EVERY_MS: u64 = 200;
/// A buffer this large is written without waiting for the tick.
pub const WRITE_AT_BYTES: usize = 4 << 20;

const JOURNAL_FILE: &str = "journal.log";
const SNAPSHOT_FILE: &str = "snapshot.log";
const COMPLETE_FILE: &str = "complete";
const FRAME_HEADER: usize = 8;

/// A journal error, naming the file involved.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An earlier write or sync failed and has not been retried successfully yet.
    #[error("journal not writable: {0}")]
    Failing(String),
    #[error("{path}: legacy sled generation: {source}")]
    Legacy { path: PathBuf, source: sled::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Appends `payload` as one frame.
fn frame_into(out: &mut Vec<u8>, payload: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER]);
    payload(out);
    let len = (out.len() - start - FRAME_HEADER) as u32;
    let crc = crc32fast::hash(&out[start + FRAME_HEADER..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The payloads of every whole frame in `bytes`, and how many bytes followed the last
/// good one (a torn or damaged tail).
fn frames(bytes: &[u8]) -> (Vec<&[u8]>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + FRAME_HEADER) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let Some(payload) = bytes.get(at + FRAME_HEADER..at + FRAME_HEADER + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        out.push(payload);
        at += FRAME_HEADER + len;
    }
    (out, bytes.len() - at)
}

fn dir_of(root: &Path, number: u64) -> PathBuf {
    root.join(format!("gen-{number:020}"))
}

fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// The generation being appended to.
struct Writer {
    number: u64,
    dir: PathBuf,
    path: PathBuf,
    file: File,
    /// Bytes of the file known written whole: where a failed write is retried from.
    good_len: u64,
    /// Bytes taken from the buffer but not yet written whole (after a failure).
    unwritten: Vec<u8>,
    /// Written since the last sync.
    dirty: bool,
    last_sync: Instant,
}

impl Writer {
    fn create(root: &Path, number: u64) -> Result<Writer, JournalError> {
        let dir = dir_of(root, number);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let path = dir.join(JOURNAL_FILE);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let good_len = file.metadata().map_err(io(&path))?.len();
        sync_dir(root)?;
        Ok(Writer {
            number,
            dir,
            path,
            file,
            good_len,
            unwritten: Vec::new(),
            dirty: false,
            last_sync: Instant::now(),
        })
    }

    /// Writes `unwritten` whole, from the last good length.
    fn write_out(&mut self) -> Result<(), std::io::Error> {
        if self.unwritten.is_empty() {
            return Ok(());
        }
        // A failed write may have left part of a frame: cut it before writing again.
        if self.file.metadata()?.len() != self.good_len {
            self.file.set_len(self.good_len)?;
        }
        self.file.write_all(&self.unwritten)?;
        self.good_len += self.unwritten.len() as u64;
        self.unwritten.clear();
        self.dirty = true;
        Ok(())
    }

    fn sync(&mut self) -> Result<(), std::io::Error> {
        if self.dirty {
            self.file.sync_data()?;
            self.dirty = false;
        }
        self.last_sync = Instant::now();
        Ok(())
    }
}

/// When a write is followed by a sync.
#[derive(Clone, Copy)]
enum Sync {
    Now,
    WhenDue,
    Never,
}

/// Records taken but not yet handed to the writer.
struct Pending {
    buf: Vec<u8>,
    /// Records appended since the current generation started.
    records: u64,
    /// Why the last write or sync failed, while it keeps failing.
    failing: Option<String>,
}

/// The durable log of a store: the current generation and its buffer.
pub struct Journal {
    root: PathBuf,
    pending: Mutex<Pending>,
    writer: Mutex<Writer>,
}

/// What recovery found.
pub struct Recovered {
    /// Records to replay, in order.
    pub records: Vec<Vec<u8>>,
    /// Bytes dropped from torn or damaged tails, per file.
    pub dropped: Vec<(PathBuf, usize)>,
    /// The number the next generation takes.
    pub next: u64,
    /// Generation folders to remove once a new generation is complete.
    pub old: Vec<PathBuf>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The buffer and the writer stay whole across a panic elsewhere: keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Journal {
    /// Starts generation `number` under `root` (its snapshot not yet written).
    pub fn create(root: &Path, number: u64) -> Result<Journal, JournalError> {
        Ok(Journal {
            root: root.to_path_buf(),
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                records: 0,
                failing: None,
            }),
            writer: Mutex::new(Writer::create(root, number)?),
        })
    }

    /// The current generation's number.
    pub fn number(&self) -> u64 {
        lock(&self.writer).number
    }

    /// Records appended since the current generation started.
    pub fn records(&self) -> u64 {
        lock(&self.pending).records
    }

    /// Takes one record (encoded by `payload`). Callers hold the locks of every key it
    /// touches, so records of one key are taken in the order they happened. True when
    /// the buffer is big enough that the writer should not wait for its tick.
    pub fn append(&self, payload: impl FnOnce(&mut Vec<u8>)) -> Result<bool, JournalError> {
        let mut p = lock(&self.pending);
        if let Some(reason) = &p.failing {
            return Err(JournalError::Failing(reason.clone()));
        }
        frame_into(&mut p.buf, payload);
        p.records += 1;
        Ok(p.buf.len() >= WRITE_AT_BYTES)
    }

    /// Hands the buffer to the writer's file, then syncs as `sync` says. Records a
    /// failure (so `append` refuses) and clears it on success.
    fn write(&self, w: &mut Writer, sync: Sync) -> Result<(), JournalError> {
        {
            let mut p = lock(&self.pending);
            if w.unwritten.is_empty() {
                std::mem::swap(&mut w.unwritten, &mut p.buf);
            } else {
                w.unwritten.extend_from_slice(&p.buf);
                p.buf.clear();
            }
        }
        let due = match sync {
            Sync::Now => true,
            Sync::WhenDue => w.last_sync.elapsed() >= Duration::from_millis(SYNC_EVERY_MS),
            Sync::Never => false,
        };
        let result = w
            .write_out()
            .and_then(|()| if due { w.sync() } else { Ok(()) });
        let mut p = lock(&self.pending);
        match result {
            Ok(()) => {
                p.failing = None;
                Ok(())
            }
            Err(e) => {
                p.failing = Some(format!("{}: {e}", w.path.display()));
                Err(JournalError::Io {
                    path: w.path.clone(),
                    source: e,
                })
            }
        }
    }

    /// One writer tick: what the background thread runs every [`WRITE_EVERY_MS`].
    pub fn tick(&self) -> Result<(), JournalError> {
        let mut w = lock(&self.writer);
        self.write(&mut w, Sync::WhenDue)
    }

    /// Writes and syncs everything taken so far.
    pub fn flush(&self) -> Result<(), JournalError> {
        let mut w = lock(&self.writer);
        self.write(&mut w, Sync::Now)
    }

    /// Creates the folder and journal of the generation after the current one, for
    /// [`Journal::switch`].
    pub fn prepare(&self) -> Result<Next, JournalError> {
        let number = self.number() + 1;
        Writer::create(&self.root, number).map(Next)
    }

    /// Switches to the prepared generation: what was taken so far goes to the old
    /// generation's journal, everything after to the new one. Called while no record can
    /// be appended (every shard locked). The old journal must be synced before the new
    /// one is written (see the module comment): [`Switch::finish`] does that, once the
    /// caller has let go of its locks.
    pub fn switch(&self, next: Next) -> Result<Switch<'_>, JournalError> {
        let next = next.0;
        let mut w = lock(&self.writer);
        // Into the old file now, before any record of the new generation exists; its
        // sync (milliseconds) waits until the caller's locks are released.
        self.write(&mut w, Sync::Never)?;
        let old = std::mem::replace(&mut *w, next);
        lock(&self.pending).records = 0;
        Ok(Switch { writer: w, old })
    }

    /// Bytes of every file under the store's folder.
    pub fn disk_bytes(&self) -> u64 {
        disk_bytes(&self.root)
    }
}

/// A generation created, not yet switched to.
pub struct Next(Writer);

/// A generation switch in progress: the writer stays locked (nothing reaches the new
/// journal) until the old journal is synced.
pub struct Switch<'a> {
    writer: MutexGuard<'a, Writer>,
    old: Writer,
}

impl Switch<'_> {
    /// Syncs the old journal, lets the new one be written, and returns the folders of
    /// the old and new generations.
    pub fn finish(mut self) -> Result<(PathBuf, PathBuf), JournalError> {
        self.old.sync().map_err(io(&self.old.path))?;
        Ok((self.old.dir.clone(), self.writer.dir.clone()))
    }
}

/// Writes a generation's snapshot, syncs it, then marks the generation complete.
pub fn complete(
    dir: &Path,
    snapshot: impl IntoIterator<Item = Vec<u8>>,
) -> Result<(), JournalError> {
    let path = dir.join(SNAPSHOT_FILE);
    let mut buf = Vec::new();
    for record in snapshot {
        frame_into(&mut buf, |out| out.extend_from_slice(&record));
    }
    let mut file = File::create(&path).map_err(io(&path))?;
    file.write_all(&buf).map_err(io(&path))?;
    file.sync_data().map_err(io(&path))?;
    let marker = dir.join(COMPLETE_FILE);
    File::create(&marker)
        .and_then(|f| f.sync_all())
        .map_err(io(&marker))?;
    sync_dir(dir)
}

impl Journal {
    /// The current generation's folder.
    pub fn dir(&self) -> PathBuf {
        lock(&self.writer).dir.clone()
    }
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

/// A generation as found on disk.
enum Found {
    Log {
        complete: bool,
    },
    /// Written by a version that kept each generation in sled.
    Sled(sled::Db),
}

fn is_sled(dir: &Path) -> bool {
    dir.join("conf").exists() && !dir.join(JOURNAL_FILE).exists()
}

/// Reads back every generation under `root` (creating `root` if needed).
pub fn recover(root: &Path) -> Result<Recovered, JournalError> {
    std::fs::create_dir_all(root).map_err(io(root))?;
    let gens = generations(root).map_err(io(root))?;
    let mut found = Vec::with_capacity(gens.len());
    for (_, dir) in &gens {
        found.push(if is_sled(dir) {
            Found::Sled(legacy::open(dir)?)
        } else {
            Found::Log {
                complete: dir.join(COMPLETE_FILE).exists(),
            }
        });
    }
    let complete_at = found.iter().rposition(|f| match f {
        Found::Log { complete } => *complete,
        Found::Sled(db) => legacy::is_complete(db),
    });
    let mut recovered = Recovered {
        records: Vec::new(),
        dropped: Vec::new(),
        next: gens.last().map_or(1, |(n, _)| n + 1),
        old: Vec::new(),
    };
    let start = complete_at.unwrap_or(0);
    for (i, ((_, dir), f)) in gens.iter().zip(&found).enumerate().skip(start) {
        // The trusted generation replays its snapshot and journal; newer ones (whose
        // snapshot may be partial) only their journal.
        let with_snapshot = Some(i) == complete_at;
        match f {
            Found::Sled(db) => legacy::read(dir, db, with_snapshot, &mut recovered.records)?,
            Found::Log { .. } => {
                let files: &[&str] = if with_snapshot {
                    &[SNAPSHOT_FILE, JOURNAL_FILE]
                } else {
                    &[JOURNAL_FILE]
                };
                for name in files {
                    let path = dir.join(name);
                    let bytes = match std::fs::read(&path) {
                        Ok(b) => b,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(io(&path)(e)),
                    };
                    let (payloads, dropped) = frames(&bytes);
                    recovered
                        .records
                        .extend(payloads.into_iter().map(<[u8]>::to_vec));
                    if dropped > 0 {
                        recovered.dropped.push((path, dropped));
                    }
                }
            }
        }
    }
    drop(found);
    recovered.old = gens.into_iter().map(|(_, d)| d).collect();
    Ok(recovered)
}

/// Generations written by versions that kept them in sled: a `log` tree (snapshot
/// records under prefix 0, journal records under prefix 1) and a `meta` tree whose
/// `complete` key marks a finished snapshot.
mod legacy {
    use super::JournalError;
    use std::path::Path;

    const JOURNAL: u8 = 1;

    pub fn open(dir: &Path) -> Result<sled::Db, JournalError> {
        sled::Config::new()
            .path(dir)
            .cache_capacity(16 * 1024 * 1024)
            .open()
            .map_err(|source| JournalError::Legacy {
                path: dir.to_path_buf(),
                source,
            })
    }

    pub fn is_complete(db: &sled::Db) -> bool {
        db.open_tree("meta")
            .and_then(|m| m.contains_key(b"complete"))
            .unwrap_or(false)
    }

    pub fn read(
        dir: &Path,
        db: &sled::Db,
        with_snapshot: bool,
        out: &mut Vec<Vec<u8>>,
    ) -> Result<(), JournalError> {
        let err = |source| JournalError::Legacy {
            path: dir.to_path_buf(),
            source,
        };
        let log = db.open_tree("log").map_err(err)?;
        let from: &[u8] = if with_snapshot { &[0] } else { &[JOURNAL] };
        for item in log.range(from..) {
            let (_, v) = item.map_err(err)?;
            out.push(v.to_vec());
        }
        Ok(())
    }
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

    fn record(j: &Journal, bytes: &[u8]) {
        j.append(|out| out.extend_from_slice(bytes)).unwrap();
    }

    #[test]
    fn recovery_trusts_the_newest_complete_generation_and_newer_journals() {
        let root = tempfile::tempdir().unwrap();
        {
            let j = Journal::create(root.path(), 1).unwrap();
            complete(&j.dir(), [b"snap1".to_vec()]).unwrap();
            record(&j, b"j1a");
            record(&j, b"j1b");
            // A compaction that crashed halfway: the switch made, the snapshot partial.
            let next = j.prepare().unwrap();
            let (_, new_dir) = j.switch(next).unwrap().finish().unwrap();
            record(&j, b"j2a");
            std::fs::write(new_dir.join(SNAPSHOT_FILE), b"partial").unwrap();
            j.flush().unwrap();
        }
        let r = recover(root.path()).unwrap();
        assert_eq!(r.records, [&b"snap1"[..], b"j1a", b"j1b", b"j2a"]);
        assert_eq!(r.next, 3);
        assert_eq!(r.old.len(), 2);

        // Once generation 3 is complete, it alone is read.
        {
            let j = Journal::create(root.path(), 3).unwrap();
            complete(&j.dir(), [b"snap3".to_vec()]).unwrap();
        }
        let r = recover(root.path()).unwrap();
        assert_eq!(r.records, [b"snap3".to_vec()]);
    }

    #[test]
    fn a_torn_or_damaged_tail_is_dropped_and_reported() {
        let root = tempfile::tempdir().unwrap();
        let j = Journal::create(root.path(), 1).unwrap();
        complete(&j.dir(), []).unwrap();
        record(&j, b"first");
        record(&j, b"second");
        j.flush().unwrap();
        let path = j.dir().join(JOURNAL_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        // A crash in the middle of the second frame.
        bytes.truncate(bytes.len() - 3);
        std::fs::write(&path, &bytes).unwrap();
        let r = recover(root.path()).unwrap();
        assert_eq!(r.records, [b"first".to_vec()]);
        assert_eq!(r.dropped, [(path.clone(), FRAME_HEADER + 3)]);

        // A flipped bit in the first frame's payload: nothing after it is trusted.
        bytes[FRAME_HEADER] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let r = recover(root.path()).unwrap();
        assert!(r.records.is_empty());
        assert_eq!(r.dropped, [(path, bytes.len())]);
    }

    #[test]
    fn nothing_reaches_the_file_before_a_tick_and_everything_after_flush() {
        let root = tempfile::tempdir().unwrap();
        let j = Journal::create(root.path(), 1).unwrap();
        record(&j, b"a");
        let path = j.dir().join(JOURNAL_FILE);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        j.tick().unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            (FRAME_HEADER + 1) as u64
        );
        record(&j, b"bc");
        j.flush().unwrap();
        let (frames, dropped) = frames_of(&path);
        assert_eq!(frames, [b"a".to_vec(), b"bc".to_vec()]);
        assert_eq!(dropped, 0);
        assert_eq!(j.records(), 2);
    }

    fn frames_of(path: &Path) -> (Vec<Vec<u8>>, usize) {
        let bytes = std::fs::read(path).unwrap();
        let (f, d) = frames(&bytes);
        (f.into_iter().map(<[u8]>::to_vec).collect(), d)
    }

    #[test]
    fn a_legacy_sled_generation_is_read() {
        let root = tempfile::tempdir().unwrap();
        {
            let db = legacy::open(&dir_of(root.path(), 7)).unwrap();
            let log = db.open_tree("log").unwrap();
            log.insert([0u8, 0, 0, 0, 0, 0, 0, 0, 0], b"snap".as_slice())
                .unwrap();
            log.insert([1u8, 0, 0, 0, 0, 0, 0, 0, 0], b"j".as_slice())
                .unwrap();
            db.open_tree("meta")
                .unwrap()
                .insert(b"complete", b"1".as_slice())
                .unwrap();
            db.flush().unwrap();
        }
        let r = recover(root.path()).unwrap();
        assert_eq!(r.records, [b"snap".to_vec(), b"j".to_vec()]);
        assert_eq!(r.next, 8);
    }
}
