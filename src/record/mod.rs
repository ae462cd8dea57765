//! The traffic recorder (`[record]`): writes each check the service answers, and each
//! event it accepts, as a traffic line ([`crate::simulate::traffic`]), so a day's real
//! traffic can be replayed with `vigia simulate` against other rules.
//!
//! It owns the directory's `traffic-YYYY-MM-DD.jsonl` files (one per UTC day of the lines'
//! `at`) and one writer thread, `vigia-recorder`, the only code that touches them.
//!
//! Invariants, and why:
//!
//! - **It never blocks or slows a check.** [`Recorder::record`] moves the line into a
//!   bounded queue with `try_send` and returns; serialising and writing happen on the
//!   writer thread. When the queue is full the line is dropped and counted
//!   (`vigia_record_lines_total{result="dropped_full"}`): a recording with a gap is
//!   better than a slower service, and the counter says the gap is there.
//! - **Bounded memory**: at most [`CHANNEL_CAPACITY`] lines queued, plus the writer's
//!   64 KiB buffer.
//! - **Bounded disk**: our files never total more than `max_bytes`. The oldest days are
//!   removed to make room; when today's file alone is full, today's further lines are
//!   dropped (`result="dropped_max_bytes"`) until tomorrow's file starts.
//! - **Replayable files**: lines are whole (a failed or torn write is cut back) and in
//!   time order (a line a few milliseconds late is written at its predecessor's time).
//! - **File errors never stop recording**: each is logged once per kind, every lost line
//!   is counted (`result="error"`), and the next line tries again, so a disk that fills
//!   up and is freed resumes by itself.
//!
//! Layout: `files` (names, sizes, the newest file's tail), `writer` (the thread and
//! the promises above).

mod files;
mod writer;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::metrics::Metrics;
use crate::simulate::traffic::Line;
use writer::{Msg, Writer};

/// Lines the queue holds before [`Recorder::record`] starts dropping them. At a few
/// hundred bytes a line that is a few MiB at most; at 10 000 checks a second, over a
/// second and a half of writer stall (a slow disk, a large `write`) absorbed without loss.
pub const CHANNEL_CAPACITY: usize = 16_384;

/// The writer thread's name (as seen in `top -H`, debuggers and panics).
const THREAD_NAME: &str = "vigia-recorder";

/// A file operation of the recorder, as named in its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileOp {
    Open,
    Write,
    /// Cutting a failed write back to the last whole line.
    Truncate,
    /// Removing an old day's file to stay under `max_bytes`.
    Remove,
}

impl fmt::Display for FileOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileOp::Open => "open",
            FileOp::Write => "write to",
            FileOp::Truncate => "cut back",
            FileOp::Remove => "remove",
        })
    }
}

/// What can go wrong starting the recorder, or (logged by the writer thread, never
/// returned) writing its files.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("traffic recording: cannot create the directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("traffic recording: cannot list the directory {path}: {source}")]
    ReadDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("traffic recording: cannot {op} the traffic file {path}: {source}")]
    File {
        op: FileOp,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("traffic recording to {path}: cannot start the writer thread: {source}")]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A handle on the recorder. Cheap to clone (one `Arc`): give one to each part that
/// records. The writer stops when the last clone is dropped, after writing every line
/// handed over; that drop waits for it (see [`Recorder::flush`] to wait without dropping).
#[derive(Clone)]
pub struct Recorder {
    shared: Arc<Shared>,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

/// What the clones share. Fields drop in declaration order, and the order matters: the
/// queue's sender goes first, which lets the writer drain and finish, and only then is the
/// thread joined.
struct Shared {
    tx: SyncSender<Msg>,
    metrics: Metrics,
    path: PathBuf,
    /// Set once the writer is found gone, so that is logged once.
    gone_logged: AtomicBool,
    /// Held only to be dropped (joined) last.
    _writer: WriterThread,
}

/// Joins the writer thread when dropped.
struct WriterThread(Option<JoinHandle<()>>);

impl Drop for WriterThread {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            if handle.join().is_err() {
                tracing::warn!("traffic recorder: the writer thread panicked");
            }
        }
    }
}

impl Recorder {
    /// Starts recording into `path` (created if missing), keeping our files there under
    /// `max_bytes` in total. Measures the files already there and reads the newest one's
    /// last line, so a restart appends to today's file in time order.
    pub fn start(path: &Path, max_bytes: u64, metrics: Metrics) -> Result<Recorder, RecordError> {
        Self::spawn(path, max_bytes, metrics, CHANNEL_CAPACITY, None)
    }

    /// `start`, with the queue's capacity and, for tests, a latch the writer waits on
    /// before taking its first line.
    fn spawn(
        path: &Path,
        max_bytes: u64,
        metrics: Metrics,
        capacity: usize,
        latch: Option<Receiver<()>>,
    ) -> Result<Recorder, RecordError> {
        std::fs::create_dir_all(path).map_err(|source| RecordError::CreateDir {
            path: path.to_path_buf(),
            source,
        })?;
        let writer = Writer::open(path, max_bytes, metrics.clone())?;
        let (tx, rx) = mpsc::sync_channel(capacity);
        let handle = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                if let Some(latch) = latch {
                    // Released by a send or by the sender's drop, whichever comes first.
                    let _ = latch.recv();
                }
                writer::run(writer, rx);
            })
            .map_err(|source| RecordError::Spawn {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Recorder {
            shared: Arc::new(Shared {
                tx,
                metrics,
                path: path.to_path_buf(),
                gone_logged: AtomicBool::new(false),
                _writer: WriterThread(Some(handle)),
            }),
        })
    }

    /// Hands `line` to the writer. Never waits: if the queue is full the line is dropped
    /// and counted (`dropped_full`). Called on the request path.
    pub fn record(&self, line: Line) {
        match self.shared.tx.try_send(Msg::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.shared.metrics.record_line("dropped_full"),
            Err(TrySendError::Disconnected(_)) => {
                self.shared.metrics.record_line("error");
                self.writer_gone();
            }
        }
    }

    /// Blocks until every line handed over before the call is written to its file and
    /// flushed to the operating system (not fsynced: what the OS holds survives the
    /// process, which is what a SIGTERM needs). For shutdown and tests, never the request
    /// path: it waits for the queue ahead of it.
    pub fn flush(&self) {
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        // The marker queues behind every line sent before it; its answer comes after they
        // are written. Either step fails only if the writer thread is gone.
        let answered = self.shared.tx.send(Msg::Flush(reply_tx)).is_ok() && reply_rx.recv().is_ok();
        if !answered {
            self.writer_gone();
        }
    }

    /// The directory recorded into.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The writer thread is gone (it can only have panicked): lines are lost until restart.
    fn writer_gone(&self) {
        if !self.shared.gone_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(path = %self.shared.path.display(), "traffic recorder: the writer thread is gone; recorded lines are lost until restart");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::traffic::{Reader, Recorded};
    use serde_json::json;
    use std::io::BufReader;

    /// 2026-12-24T10:00:00Z.
    const T0: u64 = 1_798_106_400_000;
    /// 2026-12-25T00:00:00Z.
    const MIDNIGHT: u64 = 1_798_156_800_000;
    const DAY: u64 = 86_400_000;

    fn check(at_ms: u64, user: &str) -> Line {
        Line::Check {
            at_ms,
            label: None,
            check: json!({"scene": "coupon_claim", "user_id": user}),
            decision: Some(Recorded {
                decision: "allow".into(),
                reason: None,
                request_id: Some(format!("r-{user}")),
            }),
        }
    }

    fn read(dir: &Path, day: &str) -> Vec<Line> {
        let file = std::fs::File::open(dir.join(format!("traffic-{day}.jsonl"))).unwrap();
        Reader::new(BufReader::new(file))
            .map(|r| r.unwrap().1)
            .collect()
    }

    fn traffic_files(dir: &Path) -> Vec<(String, u64)> {
        let mut found: Vec<(String, u64)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().into_string().unwrap();
                (name, e.metadata().unwrap().len())
            })
            .collect();
        found.sort();
        found
    }

    fn names(dir: &Path) -> Vec<String> {
        traffic_files(dir).into_iter().map(|f| f.0).collect()
    }

    fn count(metrics: &Metrics, result: &str) -> u64 {
        let want = format!("vigia_record_lines_total{{result=\"{result}\"}} ");
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&want).map(|v| v.parse().unwrap()))
            .unwrap_or(0)
    }

    #[test]
    fn recorded_lines_read_back_identical_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let rec = Recorder::start(dir.path(), 1 << 30, metrics.clone()).unwrap();
        let lines = vec![
            check(T0, "u1"),
            Line::Event {
                at_ms: T0 + 5,
                event: json!({"event_id": "e1", "type": "payment_succeeded", "user_id": "u1", "occurred_at": "2026-12-24T09:59:00Z"}),
            },
            Line::Check {
                at_ms: T0 + 5,
                label: Some("honest".into()),
                check: json!({"scene": "signup", "device_id": "d"}),
                decision: None,
            },
            check(T0 + 1_000, "u2"),
        ];
        for line in &lines {
            rec.record(line.clone());
        }
        rec.flush();
        assert_eq!(read(dir.path(), "2026-12-24"), lines);
        assert_eq!(count(&metrics, "written"), 4);
    }

    #[test]
    fn lines_across_midnight_land_in_two_files_named_by_date() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recorder::start(dir.path(), 1 << 30, Metrics::new()).unwrap();
        let before = [check(MIDNIGHT - 1, "a"), check(MIDNIGHT - 1, "b")];
        let after = [check(MIDNIGHT, "c"), check(MIDNIGHT + 1, "d")];
        for line in before.iter().chain(&after) {
            rec.record(line.clone());
        }
        rec.flush();
        assert_eq!(read(dir.path(), "2026-12-24"), before);
        assert_eq!(read(dir.path(), "2026-12-25"), after);
        assert_eq!(
            names(dir.path()),
            ["traffic-2026-12-24.jsonl", "traffic-2026-12-25.jsonl"]
        );
    }

    #[test]
    fn a_late_line_takes_the_previous_lines_time() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recorder::start(dir.path(), 1 << 30, Metrics::new()).unwrap();
        rec.record(check(T0 + 1_000, "first"));
        rec.record(check(T0 + 500, "late"));
        rec.record(check(T0 + 2_000, "next"));
        rec.flush();
        let back = read(dir.path(), "2026-12-24"); // the Reader refuses disorder
        let at: Vec<u64> = back.iter().map(Line::at_ms).collect();
        assert_eq!(at, [T0 + 1_000, T0 + 1_000, T0 + 2_000]);
        assert_eq!(back[1], check(T0 + 1_000, "late"));
    }

    #[test]
    fn max_bytes_removes_old_days_then_drops_when_today_alone_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        // Every line has the same length (fixed-width time, same-length users).
        let size = check(T0, "u0").to_json().len() as u64 + 1;
        let max = 3 * size + size / 2;
        let rec = Recorder::start(dir.path(), max, metrics.clone()).unwrap();
        let days = [T0, T0 + DAY, T0 + 2 * DAY];
        for i in 0..2 {
            rec.record(check(days[0] + i, "u0"));
        }
        // Day 2: the first line fits beside day 1's two; the second needs day 1 removed;
        // the fourth does not fit even alone: it and the fifth are dropped.
        for i in 0..5 {
            rec.record(check(days[1] + i, "u1"));
        }
        rec.flush();
        assert_eq!(names(dir.path()), ["traffic-2026-12-25.jsonl"]);
        assert_eq!(read(dir.path(), "2026-12-25").len(), 3);
        assert_eq!(count(&metrics, "dropped_max_bytes"), 2);
        let total: u64 = traffic_files(dir.path()).iter().map(|f| f.1).sum();
        assert!(total <= max, "{total} > {max}");

        // Day 3 starts a file again, and day 2's (full) file makes room for it.
        rec.record(check(days[2], "u2"));
        rec.flush();
        assert_eq!(names(dir.path()), ["traffic-2026-12-26.jsonl"]);
        assert_eq!(read(dir.path(), "2026-12-26"), [check(days[2], "u2")]);
        let total: u64 = traffic_files(dir.path()).iter().map(|f| f.1).sum();
        assert!(total <= max, "{total} > {max}");
        assert_eq!(count(&metrics, "written"), 6);
        assert_eq!(count(&metrics, "dropped_max_bytes"), 2);
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let (release, latch) = mpsc::channel();
        let rec = Recorder::spawn(dir.path(), 1 << 30, metrics.clone(), 2, Some(latch)).unwrap();
        // Rebound after `rec` so it drops first if an assertion fails: the writer then
        // leaves the latch and `rec`'s drop can join it instead of waiting forever.
        let release = release;
        // The writer waits on the latch: two lines fill the queue, the rest must be
        // dropped at once. Were `record` to wait, this test would never finish.
        for i in 0..1_000 {
            rec.record(check(T0 + i, "u"));
        }
        assert_eq!(count(&metrics, "dropped_full"), 998);
        release.send(()).unwrap();
        rec.flush();
        assert_eq!(
            read(dir.path(), "2026-12-24"),
            [check(T0, "u"), check(T0 + 1, "u")]
        );
        assert_eq!(count(&metrics, "written"), 2);
    }

    #[test]
    fn a_restart_appends_to_the_days_file_in_time_order() {
        let dir = tempfile::tempdir().unwrap();
        let first = Recorder::start(dir.path(), 1 << 30, Metrics::new()).unwrap();
        first.record(check(T0, "a"));
        first.record(check(T0 + 2_000, "b"));
        drop(first); // drains and joins the writer

        let second = Recorder::start(dir.path(), 1 << 30, Metrics::new()).unwrap();
        second.record(check(T0 + 3_000, "c"));
        // Earlier than the file's last line (a clock stepped back over the restart).
        second.record(check(T0 + 1_000, "d"));
        second.flush();
        assert_eq!(
            read(dir.path(), "2026-12-24"),
            [
                check(T0, "a"),
                check(T0 + 2_000, "b"),
                check(T0 + 3_000, "c"),
                check(T0 + 3_000, "d"),
            ]
        );
    }

    #[test]
    fn an_uncreatable_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").unwrap();
        let path = blocker.join("traffic");
        let err = Recorder::start(&path, 1 << 30, Metrics::new()).unwrap_err();
        assert!(matches!(err, RecordError::CreateDir { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn other_files_in_the_directory_are_left_alone_and_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "x".repeat(10_000)).unwrap();
        let size = check(T0, "u").to_json().len() as u64 + 1;
        let rec = Recorder::start(dir.path(), size, Metrics::new()).unwrap();
        rec.record(check(T0, "u"));
        rec.flush();
        assert_eq!(read(dir.path(), "2026-12-24").len(), 1);
        assert!(dir.path().join("notes.txt").exists());
    }
}
