//! The traffic file: one JSON object per line, in time order. `vigia scenario` writes it,
//! the service's `[record]` writes it, `vigia simulate` reads it — this module is the one
//! definition of the format for all three.
//!
//! ```json
//! {"cohort": {"label": "attacker/farm", "cost": {"account": 0.3, "proxy_address": 0.05, "device": 25, "challenge_solved": 0.003}}}
//! {"at": "2026-12-24T09:00:00Z", "event": {"event_id": "…", "type": "payment_succeeded", "user_id": "…", "occurred_at": "…"}}
//! {"at": "2026-12-24T10:00:00.120Z", "label": "honest", "check": {"scene": "coupon_claim", "user_id": "…"}, "on_challenge": {"pass": true, "solve_ms": 18000}}
//! ```
//!
//! - A **check line** is a `/v1/check` body sent at `at`, with an optional `label`. It may
//!   carry the `decision` the service gave when it was recorded (its `decision` and
//!   `reason`), so a replay can say which answers a rule change would change. A generated
//!   check line also says what its sender does when the check is answered `challenge`:
//!   `"on_challenge": {"pass": true, "solve_ms": 18000}` (they pass it, 18 s later, and
//!   send the claim again) or `{"pass": false}` (they give up). A line without it — all
//!   recorded traffic — is a sender who never passes.
//! - An **event line** is one `/v1/events` event delivered at `at`.
//! - A **cohort line** has no time: it describes a label rather than something that
//!   happens. `cost` prices what that label's senders spend — per account, per distinct
//!   proxy address, per distinct device, per challenge solved (non-negative, in any one
//!   currency; a price left out is 0) — so the report can say what the units they got
//!   cost them. Cohort lines come first, before every check and event line, one per
//!   label.
//!
//! Unknown keys are errors: a misspelt `lable` must not quietly become an unlabelled line.
//! Files written before `on_challenge` and cohort lines existed read as they always did.

use std::io::BufRead;

use chrono::DateTime;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::rfc3339;

/// The label of a check line that carries none (recorded traffic).
pub const UNLABELLED: &str = "unlabelled";

/// Longest `solve_ms` a line may give: a day. Nobody solves a challenge for longer, and
/// the resent check's time must stay far from overflowing.
pub const MAX_SOLVE_MS: u64 = 86_400_000;

/// A decision as recorded beside a check: enough to compare with a replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// `allow`, `challenge`, `friendly_deny` or `silent_deny`.
    pub decision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The request id the service answered with (made by it when the body had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// One line of a traffic file that happens at a time: a check or an event.
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

/// What the sender of a check does when it is answered `challenge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnChallenge {
    /// They give up: the check ends there, unserved.
    GiveUp,
    /// They pass it `solve_ms` after the answer; the backend then reports the pass and
    /// sends the claim again.
    Pass { solve_ms: u64 },
}

/// `on_challenge` as written: `{"pass": true, "solve_ms": N}` or `{"pass": false}`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOnChallenge {
    pass: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    solve_ms: Option<u64>,
}

impl From<OnChallenge> for RawOnChallenge {
    fn from(o: OnChallenge) -> Self {
        match o {
            OnChallenge::GiveUp => RawOnChallenge {
                pass: false,
                solve_ms: None,
            },
            OnChallenge::Pass { solve_ms } => RawOnChallenge {
                pass: true,
                solve_ms: Some(solve_ms),
            },
        }
    }
}

impl RawOnChallenge {
    fn check(self) -> Result<OnChallenge, String> {
        match (self.pass, self.solve_ms) {
            (false, None) => Ok(OnChallenge::GiveUp),
            (false, Some(_)) => Err("on_challenge: solve_ms goes with \"pass\": true only".into()),
            (true, None) => Err("on_challenge: \"pass\": true needs solve_ms".into()),
            (true, Some(ms)) if ms > MAX_SOLVE_MS => Err(format!(
                "on_challenge: solve_ms {ms} is more than a day ({MAX_SOLVE_MS})"
            )),
            (true, Some(solve_ms)) => Ok(OnChallenge::Pass { solve_ms }),
        }
    }
}

/// What a cohort's senders pay for what they use, in one currency-free unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// Per account (distinct `user_id`).
    #[serde(default)]
    pub account: f64,
    /// Per distinct address its checks came from.
    #[serde(default)]
    pub proxy_address: f64,
    /// Per distinct `device_id`.
    #[serde(default)]
    pub device: f64,
    /// Per challenge passed (a solver's fee, or the time of a person paid to solve).
    #[serde(default)]
    pub challenge_solved: f64,
}

impl Cost {
    /// The first price that is negative or not a number, as `(name, value)`.
    pub fn invalid_price(&self) -> Option<(&'static str, f64)> {
        [
            ("account", self.account),
            ("proxy_address", self.proxy_address),
            ("device", self.device),
            ("challenge_solved", self.challenge_solved),
        ]
        .into_iter()
        .find(|(_, p)| !p.is_finite() || *p < 0.0)
    }
}

/// A cohort line: what the checks of one label cost their senders.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cohort {
    pub label: String,
    pub cost: Cost,
}

/// One line of a traffic file, every kind of it.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A check or an event; for a check, what its sender does when challenged (`None`:
    /// recorded traffic, a sender who never passes).
    Happens {
        line: Line,
        on_challenge: Option<OnChallenge>,
    },
    /// A cohort line (no time).
    Cohort(Cohort),
}

/// Every key any line may have, for writing: each kind of line sets its own.
#[derive(Serialize, Default)]
struct Out<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    cohort: Option<&'a Cohort>,
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    check: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    event: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decision: Option<&'a Recorded>,
    #[serde(skip_serializing_if = "Option::is_none")]
    on_challenge: Option<RawOnChallenge>,
}

impl Out<'_> {
    fn json(&self) -> String {
        // Serialising strings, finite numbers and JSON values cannot fail (prices are
        // checked finite before they are written).
        serde_json::to_string(self).unwrap_or_default()
    }
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
        self.out().json()
    }

    fn out(&self) -> Out<'_> {
        match self {
            Line::Check {
                at_ms,
                label,
                check,
                decision,
            } => Out {
                at: Some(rfc3339(*at_ms)),
                label: label.as_deref(),
                check: Some(check),
                decision: decision.as_ref(),
                ..Out::default()
            },
            Line::Event { at_ms, event } => Out {
                at: Some(rfc3339(*at_ms)),
                event: Some(event),
                ..Out::default()
            },
        }
    }
}

impl Entry {
    /// The line as JSON text (no newline).
    pub fn to_json(&self) -> String {
        match self {
            Entry::Happens { line, on_challenge } => Out {
                on_challenge: on_challenge.map(RawOnChallenge::from),
                ..line.out()
            }
            .json(),
            Entry::Cohort(cohort) => Out {
                cohort: Some(cohort),
                ..Out::default()
            }
            .json(),
        }
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
    #[serde(default)]
    at: Option<String>,
    #[serde(default)]
    label: Option<String>,
    #[serde(default)]
    check: Option<Value>,
    #[serde(default)]
    event: Option<Value>,
    #[serde(default)]
    decision: Option<Recorded>,
    #[serde(default)]
    on_challenge: Option<RawOnChallenge>,
    #[serde(default)]
    cohort: Option<Cohort>,
}

const EXPECTED: &str =
    "expected {\"at\", \"label\", \"check\"}, {\"at\", \"event\"} or {\"cohort\"}";

/// Parses one line's text: a check or an event line (a cohort line is an error here: it
/// happens at no time). `line` only names it in errors.
pub fn parse_line(text: &str, line: usize) -> Result<Line, TrafficError> {
    match parse_entry(text, line)? {
        Entry::Happens { line, .. } => Ok(line),
        Entry::Cohort(_) => Err(TrafficError {
            line,
            message: "a cohort line has no time".into(),
        }),
    }
}

/// Parses one line's text, whatever its kind. `line` only names it in errors.
pub fn parse_entry(text: &str, line: usize) -> Result<Entry, TrafficError> {
    let err = |message: String| TrafficError { line, message };
    let raw: RawLine = serde_json::from_str(text)
        .map_err(|e| err(format!("not a traffic line: {e} ({EXPECTED})")))?;
    if let Some(cohort) = raw.cohort {
        let others = [
            raw.at.is_some(),
            raw.label.is_some(),
            raw.check.is_some(),
            raw.event.is_some(),
            raw.decision.is_some(),
            raw.on_challenge.is_some(),
        ];
        if others.into_iter().any(|x| x) {
            return Err(err("a cohort line holds cohort only".into()));
        }
        if cohort.label.is_empty() {
            return Err(err("cohort.label: must not be empty".into()));
        }
        if let Some((name, value)) = cohort.cost.invalid_price() {
            return Err(err(format!(
                "cohort.cost.{name}: {value} is not a price (a number, 0 or more)"
            )));
        }
        return Ok(Entry::Cohort(cohort));
    }
    let Some(at) = raw.at else {
        return Err(err(format!(
            "not a traffic line: missing field `at` ({EXPECTED})"
        )));
    };
    let at_ms = DateTime::parse_from_rfc3339(&at)
        .map_err(|e| err(format!("at: {at:?} is not RFC 3339: {e}")))
        .and_then(|t| {
            u64::try_from(t.timestamp_millis())
                .map_err(|_| err(format!("at: {at:?} is before 1970")))
        })?;
    match (raw.check, raw.event) {
        (Some(check), None) => {
            if !check.is_object() {
                return Err(err("check: must be a JSON object (a /v1/check body)".into()));
            }
            if raw.label.as_deref() == Some("") {
                return Err(err("label: must not be empty".into()));
            }
            let on_challenge = raw.on_challenge.map(RawOnChallenge::check).transpose();
            Ok(Entry::Happens {
                line: Line::Check {
                    at_ms,
                    label: raw.label,
                    check,
                    decision: raw.decision,
                },
                on_challenge: on_challenge.map_err(err)?,
            })
        }
        (None, Some(event)) => {
            if !event.is_object() {
                return Err(err(
                    "event: must be a JSON object (one /v1/events event)".into()
                ));
            }
            if raw.label.is_some() || raw.decision.is_some() || raw.on_challenge.is_some() {
                return Err(err(
                    "an event line has no label, decision or on_challenge".into()
                ));
            }
            Ok(Entry::Happens {
                line: Line::Event { at_ms, event },
                on_challenge: None,
            })
        }
        (Some(_), Some(_)) => Err(err("a line has either check or event, not both".into())),
        (None, None) => Err(err("a line needs check or event".into())),
    }
}

/// Reads a traffic file line by line: skips blank lines, numbers the rest from 1, and
/// refuses a line that goes back in time or a cohort line after the first line that
/// happens.
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

    /// The next line of any kind and its number, `None` at the end.
    pub fn next_entry(&mut self) -> Option<Result<(usize, Entry), TrafficError>> {
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
            let parsed = parse_entry(text, self.line).and_then(|e| self.in_order(e));
            return Some(parsed.map(|e| (self.line, e)));
        }
    }

    /// The next check or event line and its number, `None` at the end: cohort lines are
    /// skipped, and what a sender does when challenged is left out (see
    /// [`Reader::next_entry`] for both).
    pub fn next_line(&mut self) -> Option<Result<(usize, Line), TrafficError>> {
        loop {
            match self.next_entry()? {
                Ok((n, Entry::Happens { line, .. })) => return Some(Ok((n, line))),
                Ok((_, Entry::Cohort(_))) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    fn in_order(&mut self, e: Entry) -> Result<Entry, TrafficError> {
        let at = match &e {
            Entry::Happens { line, .. } => line.at_ms(),
            Entry::Cohort(_) => {
                if let Some((_, seen)) = self.last {
                    return Err(TrafficError {
                        line: self.line,
                        message: format!(
                            "a cohort line comes before every check and event line (line {seen} is one)"
                        ),
                    });
                }
                return Ok(e);
            }
        };
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
        Ok(e)
    }
}

/// The check and event lines, as [`Reader::next_line`] gives them.
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
    fn answers_to_a_challenge_and_cohort_lines_round_trip() {
        let check = |at_ms, user: &str| Line::Check {
            at_ms,
            label: Some("attacker/farm".into()),
            check: json!({"scene": "coupon_claim", "user_id": user}),
            decision: None,
        };
        let entries = [
            Entry::Cohort(Cohort {
                label: "attacker/farm".into(),
                cost: Cost {
                    account: 0.3,
                    device: 8.0,
                    ..Cost::default()
                },
            }),
            Entry::Happens {
                line: check(1_798_106_400_000, "a"),
                on_challenge: Some(OnChallenge::Pass { solve_ms: 18_000 }),
            },
            Entry::Happens {
                line: check(1_798_106_400_001, "b"),
                on_challenge: Some(OnChallenge::GiveUp),
            },
            Entry::Happens {
                line: check(1_798_106_400_002, "c"),
                on_challenge: None,
            },
        ];
        let text: String = entries.iter().map(|e| e.to_json() + "\n").collect();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            r#"{"cohort":{"label":"attacker/farm","cost":{"account":0.3,"proxy_address":0.0,"device":8.0,"challenge_solved":0.0}}}"#
        );
        assert!(
            lines[1].ends_with(r#","on_challenge":{"pass":true,"solve_ms":18000}}"#),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].ends_with(r#","on_challenge":{"pass":false}}"#),
            "{}",
            lines[2]
        );
        // A line without it is written as it always was: recorded traffic.
        assert!(!lines[3].contains("on_challenge"), "{}", lines[3]);
        let mut reader = Reader::new(text.as_bytes());
        let back: Vec<Entry> = std::iter::from_fn(|| reader.next_entry())
            .map(|r| r.unwrap().1)
            .collect();
        assert_eq!(back, entries);
        // Reading lines only: the cohort line is skipped, the answers left out, and the
        // numbers are the file's.
        let lines: Vec<(usize, Line)> = read(&text).into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].0, 2);
        assert_eq!(lines[2].1, check(1_798_106_400_002, "c"));
        // The record's tail reader wants a time: a cohort line has none.
        let e = parse_line(&entries[0].to_json(), 4).unwrap_err();
        assert_eq!(e.to_string(), "line 4: a cohort line has no time");
    }

    #[test]
    fn a_cohort_line_after_a_line_that_happens_is_an_error() {
        let text = concat!(
            "{\"cohort\":{\"label\":\"a\",\"cost\":{\"account\":1}}}\n",
            "{\"at\":\"2026-12-24T10:00:00Z\",\"check\":{}}\n",
            "{\"cohort\":{\"label\":\"b\",\"cost\":{\"account\":1}}}\n",
        );
        let mut reader = Reader::new(text.as_bytes());
        let got: Vec<_> = std::iter::from_fn(|| reader.next_entry()).collect();
        assert!(got[0].is_ok() && got[1].is_ok());
        let err = got[2].as_ref().unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 3: a cohort line comes before every check and event line (line 2 is one)"
        );
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
            (
                r#"{"at":"2026-12-24T10:00:00Z","check":{},"on_challenge":{"pass":true}}"#,
                "on_challenge: \"pass\": true needs solve_ms",
            ),
            (
                r#"{"at":"2026-12-24T10:00:00Z","check":{},"on_challenge":{"pass":false,"solve_ms":3}}"#,
                "on_challenge: solve_ms goes with \"pass\": true only",
            ),
            (
                r#"{"at":"2026-12-24T10:00:00Z","check":{},"on_challenge":{"pass":true,"solve_ms":86400001}}"#,
                "solve_ms 86400001 is more than a day",
            ),
            (
                r#"{"at":"2026-12-24T10:00:00Z","check":{},"on_challenge":{"pass":"yes"}}"#,
                "not a traffic line: invalid type: string \"yes\", expected a boolean",
            ),
            (
                r#"{"at":"2026-12-24T10:00:00Z","check":{},"on_challenge":{"pass":true,"solve_ms":5,"retry":1}}"#,
                "unknown field `retry`",
            ),
            (
                r#"{"at":"2026-12-24T10:00:00Z","event":{},"on_challenge":{"pass":false}}"#,
                "an event line has no label, decision or on_challenge",
            ),
            (
                r#"{"at":"2026-12-24T10:00:00Z","cohort":{"label":"x","cost":{}}}"#,
                "a cohort line holds cohort only",
            ),
            (
                r#"{"cohort":{"label":"x","cost":{"account":-1}}}"#,
                "cohort.cost.account: -1 is not a price",
            ),
            (
                r#"{"cohort":{"label":"","cost":{}}}"#,
                "cohort.label: must not be empty",
            ),
            (r#"{"cohort":{"label":"x"}}"#, "missing field `cost`"),
            (
                r#"{"cohort":{"label":"x","cost":{"acount":1}}}"#,
                "unknown field `acount`",
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
