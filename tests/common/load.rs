//! Timed checks: send many with bounded concurrency and keep every answer with its latency,
//! for tests that assert on latency percentiles and on what each answer was.

use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use serde_json::Value;

use super::app::TestApp;

/// No single check may take longer than this; past it the sample records "no answer"
/// instead of hanging the test.
pub const CHECK_CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// One `/v1/check` as the client saw it.
#[derive(Debug, Clone)]
pub struct Sample {
    /// HTTP status; 0 when no answer arrived (connection error or client timeout).
    pub status: u16,
    /// The JSON body (`Value::String` holding the raw text when it was not JSON, or the
    /// error when there was no answer).
    pub body: Value,
    /// The `Retry-After` header, if any.
    pub retry_after: Option<String>,
    /// From just before sending to the whole body read.
    pub latency: Duration,
    /// When the answer was complete.
    pub done: Instant,
}

impl Sample {
    /// `degraded: true` in the body.
    pub fn degraded(&self) -> bool {
        self.body["degraded"] == Value::Bool(true)
    }

    /// A normal, store-backed allow: 200, `allow`, `degraded: false`.
    pub fn is_normal_allow(&self) -> bool {
        self.status == 200
            && self.body["decision"] == "allow"
            && self.body["degraded"] == Value::Bool(false)
    }

    /// Short text for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "status {} retry-after {:?} after {} ms: {}",
            self.status,
            self.retry_after,
            self.latency.as_millis(),
            self.body
        )
    }
}

/// POSTs one check, never panicking: whatever happens is in the sample.
pub async fn timed_check(app: &TestApp, body: &Value) -> Sample {
    let started = Instant::now();
    let sent = app
        .client
        .post(format!("{}/v1/check", app.base))
        .timeout(CHECK_CLIENT_TIMEOUT)
        .json(body)
        .send()
        .await;
    let (status, retry_after, body) = match sent {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap_or("<not text>").to_string());
            let body = match resp.text().await {
                Ok(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
                Err(e) => Value::String(format!("body not read: {e}")),
            };
            (status, retry_after, body)
        }
        Err(e) => (0, None, Value::String(format!("no answer: {e}"))),
    };
    Sample {
        status,
        body,
        retry_after,
        latency: started.elapsed(),
        done: Instant::now(),
    }
}

/// Sends `n` checks made by `body(i)`, at most `concurrency` at a time; samples in
/// completion order.
pub async fn run_checks(
    app: &TestApp,
    n: usize,
    concurrency: usize,
    body: impl Fn(usize) -> Value,
) -> Vec<Sample> {
    let body = &body;
    stream::iter(0..n)
        .map(|i| async move { timed_check(app, &body(i)).await })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// Nearest-rank percentile (`p` in 0..=1) of the samples' latencies; zero when empty.
pub fn percentile(samples: &[Sample], p: f64) -> Duration {
    let mut l: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    if l.is_empty() {
        return Duration::ZERO;
    }
    l.sort();
    let rank = ((p * l.len() as f64).ceil() as usize).clamp(1, l.len());
    l[rank - 1]
}
