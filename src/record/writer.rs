//! The writer thread: takes lines off the recorder's queue and appends them to the day's
//! file, keeping the three promises of the recorded files:
//!
//! - **time order**: `at` never goes back within what is written (see [`Writer::in_order`]);
//! - **`max_bytes`**: our files in the directory never total more (see [`Writer::make_room`]);
//! - **whole lines**: a failed write is cut back to the last whole line, so a disk that
//!   fills and empties again leaves no torn line behind (see [`Writer::flush`]).
//!
//! It takes no clock: the day a line belongs to is the UTC date of its (ordered) `at`, so
//! a replayed or simulated clock rotates files exactly as the wall clock would. Only the
//! flush interval is measured, on the monotonic clock, because it is about getting bytes
//! to the disk in real time, not about the traffic's time.

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use chrono::NaiveDate;

use super::files::{self, day_of, path_of};
use super::{FileOp, RecordError};
use crate::metrics::Metrics;
use crate::simulate::traffic::Line;

/// Buffered bytes that trigger a write. Big enough that a busy recorder makes a few
/// system calls per second, small enough that a failed write loses few lines.
const BUF_BYTES: usize = 64 * 1024;

/// The longest buffered lines wait for the file while the queue never runs empty.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// What the recorder hands the writer.
pub(super) enum Msg {
    Line(Line),
    /// Write and flush everything before this, then answer.
    Flush(SyncSender<()>),
}

/// Runs the writer until every sender is gone, then flushes what is left.
///
/// Flushes whenever the queue is momentarily empty (so an idle service's file is current,
/// and the blocking `recv` that follows never sits on unwritten lines) and at least every
/// [`FLUSH_EVERY`] under sustained load.
pub(super) fn run(mut writer: Writer, rx: Receiver<Msg>) {
    let mut flushed_at = Instant::now();
    loop {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(TryRecvError::Empty) => {
                writer.flush();
                flushed_at = Instant::now();
                match rx.recv() {
                    Ok(msg) => msg,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match msg {
            Msg::Line(line) => writer.write(line),
            Msg::Flush(reply) => {
                writer.flush();
                flushed_at = Instant::now();
                // The asker may have given up waiting; nothing to do then.
                let _ = reply.send(());
            }
        }
        if flushed_at.elapsed() >= FLUSH_EVERY {
            writer.flush();
            flushed_at = Instant::now();
        }
    }
    writer.flush();
}

/// The file being appended to.
struct Open {
    day: NaiveDate,
    path: PathBuf,
    file: File,
    /// The file's length after the last successful write: where a failed one is cut back to.
    durable: u64,
    /// Lines not yet written, whole lines only.
    buf: Vec<u8>,
    /// How many lines `buf` holds (counted `written` or `error` when it is written).
    pending: u64,
    /// A failed write could not be cut back yet: nothing is appended until it is, as it
    /// would follow a torn line.
    torn: bool,
}

/// The writer's state. Owned by the writer thread alone.
pub(super) struct Writer {
    dir: PathBuf,
    max_bytes: u64,
    metrics: Metrics,
    /// Our files' sizes by day, oldest first. The open day's includes its buffered bytes:
    /// they are promised to the disk, so the budget counts them.
    sizes: BTreeMap<NaiveDate, u64>,
    /// The sum of `sizes`.
    total: u64,
    open: Option<Open>,
    /// The `at` of the last line taken; later lines are never written earlier than it.
    last_at: Option<u64>,
    /// The day whose file alone reached `max_bytes`: its further lines are dropped.
    full_day: Option<NaiveDate>,
    /// File errors already logged, by operation and kind: each is logged once, then only
    /// counted, until that operation succeeds again (so a full disk logs once per outage,
    /// not once per line).
    logged: HashSet<(FileOp, io::ErrorKind)>,
}

impl Writer {
    /// Measures our files in `dir` (which exists) and reads the newest one's last line, so
    /// appending after a restart stays in time order.
    pub(super) fn open(dir: &Path, max_bytes: u64, metrics: Metrics) -> Result<Self, RecordError> {
        let mut sizes = files::scan(dir).map_err(|source| RecordError::ReadDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut last_at = None;
        if let Some((&day, size)) = sizes.iter_mut().next_back() {
            let path = path_of(dir, day);
            let tail = files::inspect_tail(&path).map_err(|source| RecordError::File {
                op: FileOp::Open,
                path,
                source,
            })?;
            *size = tail.len;
            last_at = tail.last_at;
        }
        Ok(Writer {
            dir: dir.to_path_buf(),
            max_bytes,
            metrics,
            total: sizes.values().sum(),
            sizes,
            open: None,
            last_at,
            full_day: None,
            logged: HashSet::new(),
        })
    }

    /// Takes one line: orders it, finds its day's file and room for it, and buffers it.
    pub(super) fn write(&mut self, line: Line) {
        let line = self.in_order(line);
        let day = day_of(line.at_ms());
        if self.full_day == Some(day) {
            self.metrics.record_line("dropped_max_bytes");
            return;
        }
        if !self.open_day(day) {
            self.metrics.record_line("error");
            return;
        }
        let mut text = line.to_json();
        text.push('\n');
        let n = text.len() as u64;
        if !self.make_room(day, n) {
            self.metrics.record_line("dropped_max_bytes");
            return;
        }
        let Some(open) = self.open.as_mut() else {
            // open_day just opened it; kept for the type system.
            self.metrics.record_line("error");
            return;
        };
        open.buf.extend_from_slice(text.as_bytes());
        open.pending += 1;
        *self.sizes.entry(day).or_insert(0) += n;
        self.total += n;
        if open.buf.len() >= BUF_BYTES {
            self.flush();
        }
    }

    /// Gives `line` the last line's time if it is earlier.
    ///
    /// Checks answered concurrently reach the queue in roughly, not exactly, the order of
    /// their `at` (each worker stamps its line, then hands it over). `vigia simulate`
    /// refuses a file that goes back in time, and sorting would need a window of held-back
    /// lines; the differences are a few milliseconds between concurrent requests, far below
    /// any rule's window, so moving the late line forward to its predecessor's time keeps
    /// the file replayable at no cost that matters. The same holds across a restart (the
    /// newest file's last line is read at start) and if the clock steps back, with one
    /// caveat: after a large step back, lines share the last time until the clock catches
    /// up (still replayable, but their spacing is lost).
    fn in_order(&mut self, mut line: Line) -> Line {
        let at = match self.last_at {
            Some(last) => line.at_ms().max(last),
            None => line.at_ms(),
        };
        match &mut line {
            Line::Check { at_ms, .. } | Line::Event { at_ms, .. } => *at_ms = at,
        }
        self.last_at = Some(at);
        line
    }

    /// Makes `day`'s file the open one, writing out and closing the previous day's.
    /// False if it cannot be opened (logged; the line is lost, the next one tries again).
    fn open_day(&mut self, day: NaiveDate) -> bool {
        if self.open.as_ref().is_some_and(|o| o.day == day) {
            return true;
        }
        self.flush();
        self.open = None;
        let path = path_of(&self.dir, day);
        let opened = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|file| Ok((file.metadata()?.len(), file)));
        match opened {
            Ok((len, file)) => {
                self.succeeded(FileOp::Open);
                // Measure again: the file may have changed since start (or be new).
                let before = self.sizes.insert(day, len).unwrap_or(0);
                self.total = self.total.saturating_sub(before) + len;
                self.open = Some(Open {
                    day,
                    path,
                    file,
                    durable: len,
                    buf: Vec::with_capacity(BUF_BYTES),
                    pending: 0,
                    torn: false,
                });
                true
            }
            Err(source) => {
                self.failed(FileOp::Open, path, source);
                false
            }
        }
    }

    /// Makes room for `n` more bytes in `day`'s file: removes the oldest other files while
    /// the total would exceed `max_bytes`. When `day`'s file alone leaves no room, nothing
    /// more is written to it: the day is marked full until the next day's file starts.
    fn make_room(&mut self, day: NaiveDate, n: u64) -> bool {
        if self.total + n <= self.max_bytes {
            return true;
        }
        let others: Vec<NaiveDate> = self.sizes.keys().copied().filter(|d| *d != day).collect();
        for other in others {
            if self.total + n <= self.max_bytes {
                break;
            }
            let path = path_of(&self.dir, other);
            match fs::remove_file(&path) {
                // Gone already (an operator archived it): it no longer counts either.
                Ok(()) => self.succeeded(FileOp::Remove),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    // Still on disk, still counted; try the next one.
                    self.failed(FileOp::Remove, path, source);
                    continue;
                }
            }
            tracing::info!(path = %path.display(), "traffic recorder: removed the oldest traffic file to stay under max_bytes");
            let size = self.sizes.remove(&other).unwrap_or(0);
            self.total = self.total.saturating_sub(size);
        }
        if self.total + n <= self.max_bytes {
            return true;
        }
        let own = self.sizes.get(&day).copied().unwrap_or(0);
        if own + n > self.max_bytes {
            self.full_day = Some(day);
            tracing::warn!(
                day = %day,
                max_bytes = self.max_bytes,
                "traffic recorder: the day's traffic file alone reached max_bytes; dropping its further lines until the next day"
            );
        }
        false
    }

    /// Writes the buffered lines to the open file and counts them. On failure they are
    /// lost (counted `error`) and the file is cut back to its last whole line.
    pub(super) fn flush(&mut self) {
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if open.buf.is_empty() {
            return;
        }
        let outcome = if open.torn {
            // Retry the cut first: appending after a torn fragment would spoil a line.
            files::cut_to(&open.file, open.durable).map_err(|e| (FileOp::Truncate, e))
        } else {
            Ok(())
        }
        .and_then(|()| {
            open.torn = false;
            open.file
                .write_all(&open.buf)
                .map_err(|e| (FileOp::Write, e))
        });
        let bytes = open.buf.len() as u64;
        let lines = open.pending;
        open.buf.clear();
        open.pending = 0;
        match outcome {
            Ok(()) => {
                open.durable += bytes;
                for _ in 0..lines {
                    self.metrics.record_line("written");
                }
                self.succeeded(FileOp::Truncate);
                self.succeeded(FileOp::Write);
            }
            Err((op, source)) => {
                let path = open.path.clone();
                let day = open.day;
                // Cut back so the next write starts on a line boundary; if even that
                // fails, remember to retry before appending again.
                if op == FileOp::Write && files::cut_to(&open.file, open.durable).is_err() {
                    open.torn = true;
                }
                if op == FileOp::Truncate {
                    open.torn = true;
                }
                if let Some(size) = self.sizes.get_mut(&day) {
                    *size = size.saturating_sub(bytes);
                }
                self.total = self.total.saturating_sub(bytes);
                for _ in 0..lines {
                    self.metrics.record_line("error");
                }
                self.failed(op, path, source);
            }
        }
    }

    /// Logs a file error the first time its operation fails with its kind.
    fn failed(&mut self, op: FileOp, path: PathBuf, source: io::Error) {
        if self.logged.insert((op, source.kind())) {
            let error = RecordError::File { op, path, source };
            tracing::warn!(%error, "traffic recorder: lines are lost while this lasts; further errors of this kind are only counted (vigia_record_lines_total{{result=\"error\"}})");
        }
    }

    /// `op` works (again): its next failure is logged anew.
    fn succeeded(&mut self, op: FileOp) {
        let before = self.logged.len();
        self.logged.retain(|(o, _)| *o != op);
        if self.logged.len() < before {
            tracing::info!(op = %op, "traffic recorder: file operation works again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::traffic::Reader;
    use serde_json::json;
    use std::io::BufReader;

    /// 2026-12-24T10:00:00Z.
    const T0: u64 = 1_798_106_400_000;

    fn check(at_ms: u64) -> Line {
        Line::Check {
            at_ms,
            label: None,
            check: json!({"scene": "s", "user_id": "u"}),
            decision: None,
        }
    }

    #[test]
    fn a_failed_write_is_counted_cut_back_and_the_next_line_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let mut w = Writer::open(dir.path(), 1 << 30, metrics.clone()).unwrap();
        w.write(check(T0));
        w.flush();

        // A read-only handle fails every write (and the cut back), as a full disk would.
        let path = path_of(dir.path(), day_of(T0));
        let open = w.open.as_mut().unwrap();
        let good = std::mem::replace(&mut open.file, File::open(&path).unwrap());
        w.write(check(T0 + 1));
        w.flush();
        w.write(check(T0 + 2));
        w.flush();
        assert!(w.open.as_ref().unwrap().torn);

        // The disk recovers: the next line is written after the last whole one.
        w.open.as_mut().unwrap().file = good;
        w.write(check(T0 + 3));
        w.flush();
        let file = BufReader::new(File::open(&path).unwrap());
        let back: Vec<Line> = Reader::new(file).map(|r| r.unwrap().1).collect();
        assert_eq!(back, [check(T0), check(T0 + 3)]);
        assert_eq!(w.total, std::fs::metadata(&path).unwrap().len());

        let text = metrics.render();
        assert!(
            text.contains("vigia_record_lines_total{result=\"written\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("vigia_record_lines_total{result=\"error\"} 2"),
            "{text}"
        );
    }
}
