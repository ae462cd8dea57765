//! The decision log (`decision_log = "hashed" | "clear"`): one log line per answered
//! check, so that a silent deny — which the caller cannot tell from an allow — can be
//! audited afterwards: which request, which scene, what was decided and why, the score,
//! and whose request it was.
//!
//! The line is a `tracing` event with target `vigia::decision`, written by the service's
//! one log subscriber in its `log_format` (JSON or text) like every other line, so it goes
//! where the logs go and `RUST_LOG=vigia::decision=off` silences it without a restart of
//! anything else. `hashed` shows each dimension as the first 16 hex digits of the SHA-256
//! of its value: an auditor looking for user `10086` hashes `10086` and searches for that,
//! while a log reader does not see the ids. It is pseudonymous, not anonymous: short ids
//! (numbers, phone numbers) can be found by hashing every candidate; where that matters,
//! keep the log off or its readers few.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::check::decision::CheckResponse;
use crate::config::DecisionLogMode;

/// The `tracing` target of every decision line.
pub const TARGET: &str = "vigia::decision";

/// The body fields that name who or what a check is about, in the order logged.
const DIMENSIONS: [&str; 4] = ["user_id", "device_id", "ip", "activity_id"];

/// Writes one line per check; exists only when the log is on.
#[derive(Debug, Clone, Copy)]
pub struct DecisionLog {
    clear: bool,
}

impl DecisionLog {
    /// `None` for `off`: the check path then pays nothing.
    pub fn new(mode: DecisionLogMode) -> Option<DecisionLog> {
        match mode {
            DecisionLogMode::Off => None,
            DecisionLogMode::Hashed => Some(DecisionLog { clear: false }),
            DecisionLogMode::Clear => Some(DecisionLog { clear: true }),
        }
    }

    /// Logs `resp`, the answer to the check `body`.
    pub fn write(&self, body: &Value, resp: &CheckResponse) {
        let [user_id, device_id, ip, activity_id] = DIMENSIONS.map(|field| {
            body.get(field)
                .and_then(Value::as_str)
                .map(|v| self.show(v))
        });
        let attrs = body.get("attrs").and_then(Value::as_object).map(|attrs| {
            attrs
                .iter()
                .map(|(name, v)| format!("{name}={}", self.show(v.as_str().unwrap_or_default())))
                .collect::<Vec<_>>()
                .join(",")
        });
        let dry_run = body
            .get("dry_run")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let decision = &resp.decision;
        tracing::info!(
            target: TARGET,
            request_id = %resp.request_id,
            scene = %resp.scene,
            decision = decision.verdict().name(),
            layer = decision.layer().map(|l| l.name()),
            reason = decision.reason().map(|r| r.name()),
            score = resp.score,
            degraded = resp.degraded,
            duplicate_of = resp.duplicate_of.as_deref(),
            dry_run,
            rules_version = %resp.rules_version,
            user_id,
            device_id,
            ip,
            activity_id,
            attrs,
            "decision"
        );
    }

    fn show(&self, value: &str) -> String {
        if self.clear {
            value.to_string()
        } else {
            hashed(value)
        }
    }
}

/// The first 16 hex digits of the SHA-256 of `value`: what `hashed` logs, and what
/// `printf %s VALUE | sha256sum | cut -c1-16` prints.
pub fn hashed(value: &str) -> String {
    let digest = Sha256::digest(value.as_bytes());
    hex::encode(&digest[..8])
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use serde_json::json;

    use super::*;
    use crate::check::decision::{ChallengeAsk, Decision, Reason};

    /// A `MakeWriter` that keeps what was written.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The JSON lines `write` logs for `resp`.
    fn lines(mode: DecisionLogMode, body: &Value, resp: &CheckResponse) -> Vec<Value> {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            if let Some(log) = DecisionLog::new(mode) {
                log.write(body, resp);
            }
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn silent_deny() -> CheckResponse {
        let mut resp = CheckResponse::allow("coupon_claim", "01KREQ", "v7");
        resp.decision = Decision::silent(Reason::Score);
        resp.score = 0.85;
        resp
    }

    fn body() -> Value {
        json!({"scene": "coupon_claim", "user_id": "10086", "device_id": "a1b2c3d4e5",
               "ip": "203.0.113.7", "attrs": {"channel": "app"}})
    }

    #[test]
    fn a_silent_deny_is_one_line_with_its_reason_score_and_hashed_dimensions() {
        let lines = lines(DecisionLogMode::Hashed, &body(), &silent_deny());
        assert_eq!(lines.len(), 1);
        let line = &lines[0];
        assert_eq!(line["target"], TARGET);
        let f = &line["fields"];
        assert_eq!(f["request_id"], "01KREQ");
        assert_eq!(f["scene"], "coupon_claim");
        assert_eq!(f["decision"], "silent_deny");
        assert_eq!(f["layer"], "security");
        assert_eq!(f["reason"], "score");
        assert_eq!(f["score"], 0.85);
        assert_eq!(f["rules_version"], "v7");
        // No dimension is logged as sent.
        assert_eq!(f["user_id"], "9646f275f10ae73f");
        assert_eq!(f["user_id"].as_str().map(str::len), Some(16));
        assert_eq!(f["attrs"], format!("channel={}", hashed("app")));
        let text = line.to_string();
        for clear in ["10086", "a1b2c3d4e5", "203.0.113.7", "\"app\""] {
            assert!(!text.contains(clear), "{clear} in {text}");
        }
        // Absent dimensions are absent, not empty.
        assert!(f.get("activity_id").is_none(), "{text}");
    }

    #[test]
    fn a_challenge_is_its_own_decision_from_the_security_layer_for_its_score() {
        let mut resp = CheckResponse::allow("coupon_claim", "01KCHL", "v7");
        resp.decision = Decision::Challenge {
            reason: Reason::Score,
            ask: ChallengeAsk {
                kind: "captcha".into(),
                message: Some("Confirma que eres tú".into()),
            },
        };
        resp.score = 0.5;
        let lines = lines(DecisionLogMode::Hashed, &body(), &resp);
        assert_eq!(lines.len(), 1);
        let f = &lines[0]["fields"];
        assert_eq!(f["request_id"], "01KCHL");
        // Not an allow and not a deny: an auditor counting denies must not count it.
        assert_eq!(f["decision"], "challenge");
        assert_eq!(f["layer"], "security");
        assert_eq!(f["reason"], "score");
        assert_eq!(f["score"], 0.5);
        assert_eq!(f["user_id"], hashed("10086"));
    }

    #[test]
    fn clear_logs_the_dimensions_as_sent_and_off_logs_nothing() {
        let lines_clear = lines(DecisionLogMode::Clear, &body(), &silent_deny());
        let f = &lines_clear[0]["fields"];
        assert_eq!(f["user_id"], "10086");
        assert_eq!(f["ip"], "203.0.113.7");
        assert_eq!(f["attrs"], "channel=app");
        assert!(lines(DecisionLogMode::Off, &body(), &silent_deny()).is_empty());
    }

    #[test]
    fn the_hash_is_sha256_cut_to_16_hex_digits() {
        // printf %s 10086 | sha256sum | cut -c1-16
        assert_eq!(hashed("10086"), "9646f275f10ae73f");
        assert_ne!(hashed("10086"), hashed("10087"));
    }
}
