//! The recorder's files on disk: one `traffic-YYYY-MM-DD.jsonl` per UTC day, what a
//! directory of them holds, and the last line of the newest one.
//!
//! Files in the directory whose names are not exactly that pattern (a dated name that is
//! not a real date, `traffic-old.jsonl`, anything else) are not ours: they are neither
//! counted against `max_bytes` nor ever removed.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use chrono::{DateTime, NaiveDate};

use crate::simulate::traffic::parse_line;

const PREFIX: &str = "traffic-";
const SUFFIX: &str = ".jsonl";

/// How much of the newest file's end is read at start to find its last line. Recorded
/// lines are a check body plus a decision, well under this; a longer last line only
/// means its time is not known (see [`inspect_tail`]).
const TAIL_WINDOW: u64 = 64 * 1024;

/// The UTC day of `at_ms`. Out-of-range times fall back to 1970-01-01, as
/// [`crate::clock::rfc3339`] writes them.
pub(super) fn day_of(at_ms: u64) -> NaiveDate {
    i64::try_from(at_ms)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .unwrap_or_default()
        .date_naive()
}

/// `dir/traffic-YYYY-MM-DD.jsonl`.
pub(super) fn path_of(dir: &Path, day: NaiveDate) -> PathBuf {
    dir.join(format!("{PREFIX}{}{SUFFIX}", day.format("%Y-%m-%d")))
}

/// The day a file name stands for, if it is exactly one of ours.
pub(super) fn day_of_name(name: &str) -> Option<NaiveDate> {
    let date = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let day: NaiveDate = date.parse().ok()?;
    // `parse` tolerates spaces and signs; only the canonical spelling is ours.
    (day.format("%Y-%m-%d").to_string() == date).then_some(day)
}

/// The size of each of our files in `dir`, by day (oldest first).
pub(super) fn scan(dir: &Path) -> io::Result<BTreeMap<NaiveDate, u64>> {
    let mut sizes = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Some(day) = entry.file_name().to_str().and_then(day_of_name) else {
            continue;
        };
        let meta = entry.metadata()?;
        if meta.is_file() {
            sizes.insert(day, meta.len());
        }
    }
    Ok(sizes)
}

/// What [`inspect_tail`] found at the end of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tail {
    /// The file's length after any repair.
    pub len: u64,
    /// The `at` of its last complete line, if that line parses.
    pub last_at: Option<u64>,
}

/// Reads the end of the file at `path`: the time of its last line (so a restarted
/// recorder keeps the file in time order) and, if the file ends in a torn line (a crash
/// or power loss in the middle of a write), cuts that fragment off, so the next line
/// appended is not glued onto it. A fragment longer than [`TAIL_WINDOW`] with no line
/// end in sight is left alone: `vigia simulate` will name that one line.
pub(super) fn inspect_tail(path: &Path) -> io::Result<Tail> {
    let mut file = OpenOptions::new().read(true).write(true).open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(TAIL_WINDOW);
    let mut window = Vec::new();
    file.seek(SeekFrom::Start(start))?;
    (&mut file).take(TAIL_WINDOW).read_to_end(&mut window)?;

    let mut kept = window.len();
    if window.last().is_some_and(|&b| b != b'\n') {
        match window.iter().rposition(|&b| b == b'\n') {
            Some(i) => kept = i + 1,
            None if start == 0 => kept = 0,
            None => {}
        }
        if kept < window.len() {
            let cut = start + kept as u64;
            cut_to(&file, cut)?;
            tracing::warn!(
                path = %path.display(),
                dropped_bytes = len - cut,
                "traffic recorder: cut a torn last line off the traffic file"
            );
        }
    }
    let last_at = last_line(&window[..kept])
        .and_then(|text| parse_line(text, 0).ok().map(|line| line.at_ms()));
    Ok(Tail {
        len: start + kept as u64,
        last_at,
    })
}

/// Truncates `file` to `len` bytes (where a failed or torn write is cut back to).
pub(super) fn cut_to(file: &File, len: u64) -> io::Result<()> {
    file.set_len(len)
}

/// The last non-blank complete line of `bytes`, if it is UTF-8.
fn last_line(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.lines().map(str::trim).rfind(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn names_round_trip_and_only_canonical_dates_are_ours() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 24).unwrap();
        let path = path_of(Path::new("d"), day);
        assert_eq!(path, Path::new("d/traffic-2026-12-24.jsonl"));
        assert_eq!(day_of_name("traffic-2026-12-24.jsonl"), Some(day));
        for not_ours in [
            "traffic-2026-12-32.jsonl",
            "traffic-2026-1-24.jsonl",
            "traffic- 2026-12-24.jsonl",
            "traffic-2026-12-24.jsonl.gz",
            "traffic-old.jsonl",
            "other-2026-12-24.jsonl",
        ] {
            assert_eq!(day_of_name(not_ours), None, "{not_ours}");
        }
    }

    #[test]
    fn day_of_is_the_utc_date() {
        // 2026-12-24T23:59:59.999Z and a millisecond later.
        assert_eq!(day_of(1_798_156_799_999).to_string(), "2026-12-24");
        assert_eq!(day_of(1_798_156_800_000).to_string(), "2026-12-25");
    }

    #[test]
    fn a_torn_last_line_is_cut_and_the_last_whole_line_gives_the_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("traffic-2026-12-24.jsonl");
        let whole = "{\"at\":\"2026-12-24T10:00:00.120Z\",\"check\":{}}\n";
        let mut f = File::create(&path).unwrap();
        write!(f, "{whole}{whole}{{\"at\":\"2026-12-24T10:0").unwrap();
        drop(f);

        let tail = inspect_tail(&path).unwrap();
        assert_eq!(tail.len, 2 * whole.len() as u64);
        assert_eq!(tail.last_at, Some(1_798_106_400_120));
        assert_eq!(fs::read_to_string(&path).unwrap(), whole.repeat(2));
    }

    #[test]
    fn an_empty_or_fragment_only_file_has_no_last_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("traffic-2026-12-24.jsonl");
        fs::write(&path, "").unwrap();
        assert_eq!(
            inspect_tail(&path).unwrap(),
            Tail {
                len: 0,
                last_at: None
            }
        );
        fs::write(&path, "{\"at\":").unwrap();
        assert_eq!(
            inspect_tail(&path).unwrap(),
            Tail {
                len: 0,
                last_at: None
            }
        );
        assert_eq!(fs::metadata(&path).unwrap().len(), 0);
    }
}
