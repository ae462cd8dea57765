//! The traffic file: one JSON object per line, in time order. `vigia scenario` writes it,
//! the service's `[record]` writes it, `vigia simulate` reads it — this module is the one
//! definition of the format for all three.
//!
//! ```json
//! {"at": "2026-12-24T10:00:00.120Z", "label": "honest", "check": {"scene": "coupon_claim", "user_id": "…"}}
//! {"at": "2026-12-24T09:00:00Z", "event": {"event_id": "…", "type": "payment_succeeded", "user_id": "…", "occurred_at": "…"}}
//! ```
//!
//! A check line may carry the `decision` the service gave when it was recorded (its
//! `decision` and `reason`), so a replay can say which answers a rule change would change.
//! Unknown keys are errors: a misspelt `lable` must not quietly become an unlabelled line.

use std::io::BufRead;

use chrono::DateTime;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::rfc3339;

/// The label of a check line that carries none (recorded traffic).
pub const UNLABELLED: &str = "unlabelled";

/// A decision as recorded beside a check: enough to compare with a replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// `allow`, `friendly_deny` or `silent_deny`.
    pub decision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The request id the service answered with (made by it when the body had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// One line of a traffic file.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// A `/v1/check` body, sent at `at_ms`.
    Check {
        at_ms: u64,
        label: Option<String>,
        /// A JSON object: the body exactly as a backend would send it.
        check: Value,
        decision: Option<Recorded>,
    },
    /// One `/v1/events` event, delivered at `at_ms`.
    Event { at_ms: u64, event: Value },
}

impl Line {
    /// When the line happens, ms since the epoch.
    pub fn at_ms(&self) -> u64 {
        match self {
            Line::Check { at_ms, .. } | Line::Event { at_ms, .. } => *at_ms,
        }
    }

    /// The line as JSON text (no newline).
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Out<'a> {
            at: String,
            #[serde(skip_serializing_if = "Option::is_none")]
            label: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            check: Option<&'a Value>,
            #[serde(skip_serializing_if = "Option::is_none")]
            event: Option<&'a Value>,
            #[serde(skip_serializing_if = "Option::is_none")]
            decision: Option<&'a Recorded>,
        }
        let out = match self {
            Line::Check {
                at_ms,
                label,
                check,
                decision,
            } => Out {
                at: rfc3339(*at_ms),
                label: label.as_deref(),
                check: Some(check),
                event: None,
                decision: decision.as_ref(),
            },
            Line::Event { at_ms, event } => Out {
                at: rfc3339(*at_ms),
                label: None,
                check: None,
                event: Some(event),
                decision: None,
            },
        };
        // Serialising strings and JSON values cannot fail.
        serde_json::to_string(&out).unwrap_or_default()
    }
}

/// A line that is not a traffic line, or out of order. `line` is 1-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TrafficError {
    pub line: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine {
    at: String,
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    check: Option<Value>,
    #[serde(default)]
    event: Option<Value>,
    #[serde(default)]
    decision: Option<Recorded>,
}

/// Parses one line's text. `line` only names it in errors.
pub fn parse_line(text: &str, line: usize) -> Result<Line, TrafficError> {
    let err = |message: String| TrafficError { line, message };
    let raw: RawLine = serde_json::from_str(text).map_err(|e| {
        err(format!(
            "not a traffic line: {e} (expected {{\"at\", \"label\", \"check\"}} or {{\"at\", \"event\"}})"
        ))
    })?;
    let at_ms = DateTime::parse_from_rfc3339(&raw.at)
        .map_err(|e| err(format!("at: {:?} is not RFC 3339: {e}", raw.at)))
        .and_then(|t| {
            u64::try_from(t.timestamp_millis())
                .map_err(|_| err(format!("at: {:?} is before 1970", raw.at)))
        })?;
    match (raw.check, raw.event) {
        (Some(check), None) => {
            if !check.is_object() {
                return Err(err("check: must be a JSON object (a /v1/check body)".into()));
            }
            if raw.label.as_deref() == Some("") {
                return Err(err("label: must not be empty".into()));
            }
            Ok(Line::Check {
                at_ms,
                label: raw.label,
                check,
                decision: raw.decision,
            })
        }
        (None, Some(event)) => {
            if !event.is_object() {
                return Err(err(
                    "event: must be a JSON object (one /v1/events event)".into()
                ));
            }
            if raw.label.is_some() || raw.decision.is_some() {
                return Err(err("an event line has no label or decision".into()));
            }
            Ok(Line::Event { at_ms, event })
        }
        (Some(_), Some(_)) => Err(err("a line has either check or event, not both".into())),
        (None, None) => Err(err("a line needs check or event".into())),
    }
}

/// Reads a traffic file line by line: skips blank lines, numbers the rest from 1, and
/// refuses a line that goes back in time.
pub struct Reader<R> {
    input: R,
    line: usize,
    bytes: u64,
    last: Option<(u64, usize)>,
    buf: String,
}

impl<R: BufRead> Reader<R> {
    pub fn new(input: R) -> Self {
        Reader {
            input,
            line: 0,
            bytes: 0,
            last: None,
            buf: String::new(),
        }
    }

    /// Bytes read so far (for progress).
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    /// The next line and its number, `None` at the end.
    pub fn next_line(&mut self) -> Option<Result<(usize, Line), TrafficError>> {
        loop {
            self.buf.clear();
            self.line += 1;
            let n = match self.input.read_line(&mut self.buf) {
                Ok(0) => return None,
                Ok(n) => n,
                Err(e) => {
                    return Some(Err(TrafficError {
                        line: self.line,
                        message: format!("cannot read: {e}"),
                    }))
                }
            };
            self.bytes += n as u64;
            let text = self.buf.trim();
            if text.is_empty() {
                continue;
            }
            let parsed = parse_line(text, self.line).and_then(|l| self.in_order(l));
            return Some(parsed.map(|l| (self.line, l)));
        }
    }

    fn in_order(&mut self, l: Line) -> Result<Line, TrafficError> {
        let at = l.at_ms();
        if let Some((prev, prev_line)) = self.last {
            if at < prev {
                return Err(TrafficError {
                    line: self.line,
                    message: format!(
                        "at {} is before line {prev_line}'s {}: lines must be in time order",
                        rfc3339(at),
                        rfc3339(prev)
                    ),
                });
            }
        }
        self.last = Some((at, self.line));
        Ok(l)
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = Result<(usize, Line), TrafficError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_line()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(text: &str) -> Vec<Result<(usize, Line), TrafficError>> {
        Reader::new(text.as_bytes()).collect()
    }

    #[test]
    fn a_check_and_an_event_line_round_trip() {
        let lines = [
            Line::Event {
                at_ms: 1_798_102_800_000,
                event: json!({"event_id": "e1", "type": "payment_succeeded", "user_id": "u", "occurred_at": "2026-12-20T00:00:00Z"}),
            },
            Line::Check {
                at_ms: 1_798_106_400_120,
                label: Some("honest".into()),
                check: json!({"scene": "coupon_claim", "user_id": "u"}),
                decision: Some(Recorded {
                    decision: "allow".into(),
                    reason: None,
                    request_id: Some("r1".into()),
                }),
            },
        ];
        let text: String = lines.iter().map(|l| l.to_json() + "\n").collect();
        assert!(text.starts_with(r#"{"at":"2026-12-24T09:00:00.000Z","event":"#));
        let back: Vec<Line> = read(&text).into_iter().map(|r| r.unwrap().1).collect();
        assert_eq!(back, lines);
    }

    #[test]
    fn blank_lines_are_skipped_but_counted() {
        let text = "\n{\"at\":\"2026-12-24T10:00:00Z\",\"check\":{\"scene\":\"s\"}}\n\n";
        let got = read(text);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap().0, 2);
    }

    #[test]
    fn malformed_lines_name_their_number_and_what_is_wrong() {
        let cases = [
            ("not json", "not a traffic line"),
            (r#"{"check":{"scene":"s"}}"#, "missing field `at`"),
            (
                r#"{"at":"yesterday","check":{}}"#,
                "at: \"yesterday\" is not RFC 3339",
            ),
            (r#"{"at":"2026-12-24T10:00:00Z"}"#, "needs check or event"),
            (
                r#"{"at":"2026-12-24T10:00:00Z","check":{},"event":{}}"#,
                "not both",
            ),
            (
                r#"{"at":"2026-12-24T10:00:00Z","check":[1]}"#,
                "check: must be a JSON object",
            ),
            (
                r#"{"at":"2026-12-24T10:00:00Z","lable":"x","check":{}}"#,
                "unknown field `lable`",
            ),
            (
                r#"{"at":"2026-12-24T10:00:00Z","label":"x","event":{}}"#,
                "no label",
            ),
        ];
        for (text, want) in cases {
            let input = format!("{{\"at\":\"2026-12-24T09:00:00Z\",\"check\":{{}}}}\n{text}\n");
            let got = read(&input);
            let err = got[1].as_ref().expect_err(text);
            assert_eq!(err.line, 2, "{text}");
            assert!(err.to_string().starts_with("line 2: "), "{err}");
            assert!(err.message.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn a_line_back_in_time_is_an_error_naming_both_lines() {
        let text = concat!(
            "{\"at\":\"2026-12-24T10:00:01Z\",\"check\":{}}\n",
            "{\"at\":\"2026-12-24T10:00:01Z\",\"check\":{}}\n",
            "{\"at\":\"2026-12-24T10:00:00.999Z\",\"check\":{}}\n",
        );
        let got = read(text);
        assert!(got[0].is_ok() && got[1].is_ok(), "equal times are in order");
        let err = got[2].as_ref().unwrap_err();
        assert_eq!(err.line, 3);
        assert!(
            err.message
                .contains("before line 2's 2026-12-24T10:00:01.000Z"),
            "{err}"
        );
    }
}
