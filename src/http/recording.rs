//! What the service keeps of its traffic when `[record]` is set: each check it answered
//! (the body as received, when, and the decision) and each event it accepted, as traffic
//! lines `vigia simulate` replays. The lines go to the [`Recorder`], which never makes a
//! request wait (a full queue drops the line and counts it).
//!
//! Not recorded: requests refused as invalid (they were never decided), and dry runs
//! (`dry_run` promises to record nothing).

use std::sync::Arc;

use serde_json::Value;

use crate::check::decision::CheckResponse;
use crate::clock::Clock;
use crate::record::Recorder;
use crate::simulate::traffic::{Line, Recorded};

/// The recorder and the service clock that dates each line.
#[derive(Clone)]
pub struct Recording {
    recorder: Recorder,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recording")
            .field("recorder", &self.recorder)
            .finish()
    }
}

impl Recording {
    pub fn new(recorder: Recorder, clock: Arc<dyn Clock>) -> Self {
        Recording { recorder, clock }
    }

    /// A decided check.
    pub fn check(&self, body: &Value, resp: &CheckResponse) {
        if body.get("dry_run") == Some(&Value::Bool(true)) {
            return;
        }
        self.recorder.record(Line::Check {
            at_ms: self.clock.now_ms(),
            label: None,
            check: body.clone(),
            decision: Some(Recorded {
                decision: resp.decision.verdict().name().to_string(),
                reason: resp.decision.reason().map(|r| r.name().to_string()),
                request_id: Some(resp.request_id.clone()),
            }),
        });
    }

    /// An accepted `/v1/events` body: one line per event, duplicates included (a replay
    /// counts them as duplicates again).
    pub fn events(&self, body: &Value) {
        let at_ms = self.clock.now_ms();
        let events = match body.get("events") {
            Some(Value::Array(events)) => events.iter().collect(),
            _ => vec![body],
        };
        for event in events {
            self.recorder.record(Line::Event {
                at_ms,
                event: event.clone(),
            });
        }
    }

    /// Waits until every line handed over so far is written (at shutdown, in tests).
    pub fn flush(&self) {
        self.recorder.flush();
    }
}
