//! `vigia simulate`: every line of a traffic file through the real check path.
//!
//! The replay builds the same deciding parts the service builds ([`app::build_core`]: the
//! `Checker` with its gateway buckets, the scorer, the behaviour actors, the trust ledger
//! and events journal, the embedded window store — kept in memory, since it is thrown
//! away after) on a private temporary folder, with a
//! [`ManualClock`] set to each line's `at` before the line runs. Nothing sleeps: a day-long
//! window is crossed by setting the clock a day on. Event lines go through the real
//! events path (journal, then ledger), so trust earned before a drop counts in it.
//!
//! Challenges: a check answered `challenge` whose line says its sender passes
//! (`"on_challenge": {"pass": true, "solve_ms": N}`) is followed up as a backend would:
//! `solve_ms` later, a `challenge_passed` event for the check's user, device and scene
//! (event id `pass-<request id>`) goes through the same events path as event lines, and the
//! same check is sent again at that time — its idempotency key kept, a new request id.
//! A retry answered `challenge` again follows the line's `on_challenge` again, at most
//! [`MAX_RETRIES`] times in all. A sender who gives up, or a line without
//! `on_challenge` (recorded traffic), ends at the challenge. Retries wait in a queue keyed
//! by simulated time and run between the file's lines in time order: one due at the same
//! millisecond as a file line runs after it, and retries due together run in the order
//! they were scheduled.
//!
//! Determinism: the same file and rules give the same decisions, run after run. Lines run
//! one at a time, in file order, on one thread (the behaviour shards are hosted on it too,
//! [`Purpose::Replay`]), and the actors' deadline is lifted: a replay has nobody waiting,
//! so a signal is never dropped for lateness as a loaded service may drop it. A check
//! without a `request_id` gets one made from its time and line number, and a retry one
//! made from its time, line number and attempt, so `--out` is reproducible too.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};

use super::report::{Fate, Report, Sent, Tally};
use super::traffic::{
    Cohort, Entry, Line, OnChallenge, Reader, Recorded, TrafficError, UNLABELLED,
};
use crate::app::{self, Purpose, StartError};
use crate::check::decision::{CheckResponse, Verdict};
use crate::clock::{rfc3339, ManualClock};
use crate::config::{Config, StoreBackend};
use crate::input::RequestError;
use crate::metrics::Metrics;
use crate::rules::{self, RuleErrors, RuleSet};
use crate::trust::{event, EventsError};

/// Events handed to the events path at once, as one `POST /v1/events` batch would be.
const EVENT_BATCH: usize = 1000;

/// How often (in lines) the progress callback hears about the replay.
const PROGRESS_EVERY: u64 = 4096;

/// Most times one line's check is sent again after a passed challenge. A pass lifts the
/// score band, so a retry is rarely challenged again; when something else challenges it
/// (or the pass has lapsed), the sender would otherwise solve challenges forever.
pub const MAX_RETRIES: u32 = 3;

/// What to replay.
#[derive(Debug, Clone)]
pub struct Options {
    pub rules_dir: PathBuf,
    pub traffic: PathBuf,
    /// Units granted first come, first served to allowed checks.
    pub stock: Option<u64>,
    /// Where each check's decision is written as a line of JSON.
    pub out: Option<PathBuf>,
}

/// Why a replay could not run. Each names the file (and line) to look at.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("rules in {dir}:\n{errors}")]
    Rules { dir: String, errors: RuleErrors },
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Traffic { path: String, source: TrafficError },
    #[error("{path}: line {line}: cohort: {message}")]
    Cohort {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: line {line}: event: {message}")]
    Event {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: cannot write: {source}")]
    Out {
        path: String,
        source: std::io::Error,
    },
    #[error("private store: {0}")]
    Start(#[from] StartError),
    #[error("private store folder: {0}")]
    Temp(std::io::Error),
}

/// Where a replay stands, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub bytes: u64,
    pub total_bytes: u64,
    pub checks: u64,
}

/// The private service's settings: the embedded store in a folder of its own, and actors
/// that never give up on a signal (see the module doc).
fn private_config(data_dir: &Path) -> Config {
    let mut config = Config {
        data_dir: data_dir.to_path_buf(),
        ..Config::default()
    };
    config.store.backend = StoreBackend::Embedded;
    config.behaviour.deadline_ms = 3_600_000;
    // The folder is thrown away: snapshots would only cost time.
    config.behaviour.snapshot_every_ms = 86_400_000;
    config
}

/// Replays `opts.traffic` against the rules in `opts.rules_dir`. Call it inside an actix
/// System (the behaviour shards run on the calling thread); `progress` hears about every
/// few thousand lines.
pub async fn run(
    opts: &Options,
    progress: &mut dyn FnMut(Progress),
) -> Result<Report, SimulateError> {
    let rules = rules::load_dir(&opts.rules_dir).map_err(|errors| SimulateError::Rules {
        dir: opts.rules_dir.display().to_string(),
        errors,
    })?;
    let path = opts.traffic.display().to_string();
    let read_err = |source| SimulateError::Read {
        path: path.clone(),
        source,
    };
    let file = File::open(&opts.traffic).map_err(read_err)?;
    let total_bytes = file.metadata().map_err(read_err)?.len();
    let reader = Reader::new(BufReader::with_capacity(1 << 20, file));
    let out = match &opts.out {
        Some(p) => Some((
            BufWriter::new(File::create(p).map_err(|source| SimulateError::Out {
                path: p.display().to_string(),
                source,
            })?),
            p.display().to_string(),
        )),
        None => None,
    };
    let mut replay = Replay {
        rules: Arc::new(rules),
        path,
        stock: opts.stock,
        out,
        total_bytes,
        cohorts: HashMap::new(),
        queue: BTreeMap::new(),
        scheduled: 0,
    };
    replay.run(reader, progress).await
}

struct Replay {
    rules: Arc<RuleSet>,
    path: String,
    stock: Option<u64>,
    out: Option<(BufWriter<File>, String)>,
    total_bytes: u64,
    /// Label -> the line of its cohort line.
    cohorts: HashMap<String, usize>,
    /// Retries waiting for their time, keyed by (time, order scheduled): the first key is
    /// the next due, and ties keep the order they were scheduled in.
    queue: BTreeMap<(u64, u64), Retry>,
    /// Retries scheduled so far (the second half of the queue's key).
    scheduled: u64,
}

/// A challenged check whose sender passes: at its time, the pass is reported and the check
/// sent again.
struct Retry {
    /// The file line the check came from.
    line: usize,
    label: String,
    /// The body as last sent (its request id is replaced when it is sent again).
    check: Value,
    /// The request id of the challenged attempt.
    of: String,
    /// This retry's number, from 1.
    attempt: u32,
    on_challenge: OnChallenge,
    /// The `challenge_passed` event to ingest first.
    pass: Value,
}

/// One check about to be sent: a file line's, or a retry.
struct Sending {
    line: usize,
    at_ms: u64,
    label: String,
    /// The body, with its request id.
    check: Value,
    recorded: Option<Recorded>,
    on_challenge: Option<OnChallenge>,
    /// 0 for the file line's own check.
    attempt: u32,
    /// A retry: the request id of the check it retries.
    retry_of: Option<String>,
}

/// Event lines waiting to go to the events path as one batch: all share one `at`.
struct Batch {
    at_ms: u64,
    events: Vec<(usize, Value)>,
}

impl Replay {
    async fn run<R: BufRead>(
        &mut self,
        mut reader: Reader<R>,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Report, SimulateError> {
        let mut tally = Tally::new(&self.rules.version, self.stock);
        // Cohort lines come first; the first line that happens sets the clock.
        let first = loop {
            match reader.next_entry() {
                None => return Ok(tally.finish()),
                Some(Err(e)) => return Err(self.traffic_err(e)),
                Some(Ok((line, Entry::Cohort(c)))) => self.cohort(line, c, &mut tally)?,
                Some(Ok((
                    line,
                    Entry::Happens {
                        line: l,
                        on_challenge,
                    },
                ))) => break (line, l, on_challenge),
            }
        };
        // The private service starts at the first line's time, as if it had been started
        // just then: nothing it builds sees a time before it.
        let clock = ManualClock::new(first.1.at_ms());
        let dir = tempfile::Builder::new()
            .prefix("vigia-simulate-")
            .tempdir()
            .map_err(SimulateError::Temp)?;
        let core = app::build_core(
            &private_config(dir.path()),
            &self.rules,
            Arc::new(clock.clone()),
            Metrics::new(),
            Purpose::Replay,
        )
        .await?;

        let mut batch: Option<Batch> = None;
        let mut next = Some(Ok((
            first.0,
            Entry::Happens {
                line: first.1,
                on_challenge: first.2,
            },
        )));
        let mut lines = 0u64;
        loop {
            let item = next
                .map(|r| r.map_err(|e| self.traffic_err(e)))
                .transpose()?;
            // Retries due before this line (all of them at the end) run first; each may
            // schedule another, so the queue is looked at again after each.
            let before = match &item {
                Some((_, Entry::Happens { line, .. })) => Some(line.at_ms()),
                Some((_, Entry::Cohort(_))) | None => None,
            };
            while let Some(((at_ms, _), retry)) = self.pop_due(before, item.is_none()) {
                if let Some(b) = batch.take() {
                    self.ingest(&core, &clock, b, &mut tally).await?;
                }
                self.retry(&core, &clock, &mut tally, at_ms, retry).await?;
            }
            let Some((line, entry)) = item else {
                break;
            };
            match entry {
                // The reader refuses a cohort line after the first line that happens.
                Entry::Cohort(c) => self.cohort(line, c, &mut tally)?,
                Entry::Happens {
                    line: Line::Event { at_ms, event },
                    ..
                } => {
                    self.validate_event(line, &event)?;
                    if let Some(b) =
                        batch.take_if(|b| b.at_ms != at_ms || b.events.len() >= EVENT_BATCH)
                    {
                        self.ingest(&core, &clock, b, &mut tally).await?;
                    }
                    batch
                        .get_or_insert_with(|| Batch {
                            at_ms,
                            events: Vec::new(),
                        })
                        .events
                        .push((line, event));
                }
                Entry::Happens {
                    line:
                        Line::Check {
                            at_ms,
                            label,
                            check,
                            decision,
                        },
                    on_challenge,
                } => {
                    // Events before a check are in force for it.
                    if let Some(b) = batch.take() {
                        self.ingest(&core, &clock, b, &mut tally).await?;
                    }
                    let sending = Sending {
                        line,
                        at_ms,
                        label: label.unwrap_or_else(|| UNLABELLED.to_string()),
                        check: with_request_id(check, at_ms, line),
                        recorded: decision,
                        on_challenge,
                        attempt: 0,
                        retry_of: None,
                    };
                    self.send(&core, &clock, &mut tally, sending).await?;
                }
            }
            lines += 1;
            if lines % PROGRESS_EVERY == 0 {
                progress(Progress {
                    bytes: reader.bytes_read(),
                    total_bytes: self.total_bytes,
                    checks: tally.checks(),
                });
            }
            next = reader.next_entry();
        }
        if let Some(b) = batch.take() {
            self.ingest(&core, &clock, b, &mut tally).await?;
        }
        if let Some((out, path)) = &mut self.out {
            out.flush().map_err(|source| SimulateError::Out {
                path: path.clone(),
                source,
            })?;
        }
        progress(Progress {
            bytes: reader.bytes_read(),
            total_bytes: self.total_bytes,
            checks: tally.checks(),
        });
        // Nothing of the private service is kept: no shutdown snapshot, and the folder goes
        // with `dir`. Freeing a million windows takes a good part of a second that nobody
        // needs to wait for: a thread of its own does it.
        let freed = std::thread::Builder::new()
            .name("vigia-simulate-free".into())
            .spawn(move || drop(core));
        if let Err(e) = freed {
            tracing::debug!(error = %e, "simulate: freeing the private store on this thread");
        }
        Ok(tally.finish())
    }

    /// A cohort line: prices for its label, once per label.
    fn cohort(&mut self, line: usize, c: Cohort, tally: &mut Tally) -> Result<(), SimulateError> {
        if let Some(first) = self.cohorts.get(&c.label) {
            return Err(SimulateError::Cohort {
                path: self.path.clone(),
                line,
                message: format!(
                    "label {:?} already has its cohort line, line {first}",
                    c.label
                ),
            });
        }
        tally.cohort(&c.label, c.cost);
        self.cohorts.insert(c.label, line);
        Ok(())
    }

    /// The next retry due before `before` (every retry when `all`).
    fn pop_due(&mut self, before: Option<u64>, all: bool) -> Option<((u64, u64), Retry)> {
        let (&(at_ms, _), _) = self.queue.first_key_value()?;
        if all || before.is_some_and(|b| at_ms < b) {
            self.queue.pop_first()
        } else {
            None
        }
    }

    /// Sends one check, counts and writes its answer, and when it is challenged and its
    /// sender passes, schedules the retry.
    async fn send(
        &mut self,
        core: &app::Core,
        clock: &ManualClock,
        tally: &mut Tally,
        s: Sending,
    ) -> Result<(), SimulateError> {
        clock.set(s.at_ms);
        let answer = core.checker.check(&self.rules, &s.check).await;
        let user = s.check.get("user_id").and_then(id_text);
        let device = s.check.get("device_id").and_then(id_text);
        let sent = Sent {
            line: s.line,
            at_ms: s.at_ms,
            label: &s.label,
            user: user.as_deref(),
            device: device.as_deref(),
            ip: s.check.get("ip").and_then(Value::as_str),
            retry: s.attempt > 0,
        };
        let fate = tally.check(sent, &answer, s.recorded.as_ref());
        self.write_out(
            s.line,
            s.at_ms,
            &s.label,
            &answer,
            fate,
            s.retry_of.as_deref(),
        )?;
        let Ok(resp) = &answer else {
            return Ok(());
        };
        let Some(OnChallenge::Pass { solve_ms }) = s.on_challenge else {
            return Ok(());
        };
        // No user, no pass to report: the event names the user it lifts.
        let Some(user) = user else {
            return Ok(());
        };
        if resp.decision.verdict() != Verdict::Challenge || s.attempt >= MAX_RETRIES {
            return Ok(());
        }
        let due = s.at_ms.saturating_add(solve_ms);
        let mut pass = json!({
            "event_id": format!("pass-{}", resp.request_id),
            "type": "challenge_passed",
            "user_id": user,
            "scene": resp.scene,
            "occurred_at": rfc3339(due),
        });
        if let Some(device) = device {
            pass["device_id"] = Value::String(device);
        }
        let retry = Retry {
            line: s.line,
            label: s.label,
            check: s.check,
            of: resp.request_id.clone(),
            attempt: s.attempt + 1,
            on_challenge: OnChallenge::Pass { solve_ms },
            pass,
        };
        self.queue.insert((due, self.scheduled), retry);
        self.scheduled += 1;
        Ok(())
    }

    /// A retry's time has come: the pass goes through the events path, then the check is
    /// sent again under a new request id.
    async fn retry(
        &mut self,
        core: &app::Core,
        clock: &ManualClock,
        tally: &mut Tally,
        at_ms: u64,
        r: Retry,
    ) -> Result<(), SimulateError> {
        clock.set(at_ms);
        let body = json!({"events": [r.pass]});
        core.events
            .ingest(&self.rules, &body)
            .await
            .map_err(|e| SimulateError::Event {
                path: self.path.clone(),
                line: r.line,
                message: format!("the challenge_passed reported for this line's check: {e}"),
            })?;
        tally.challenge_passed(&r.label);
        let mut check = r.check;
        if let Some(obj) = check.as_object_mut() {
            let id = retry_request_id(at_ms, r.line, r.attempt);
            obj.insert("request_id".into(), Value::String(id));
        }
        let sending = Sending {
            line: r.line,
            at_ms,
            label: r.label,
            check,
            recorded: None,
            on_challenge: Some(r.on_challenge),
            attempt: r.attempt,
            retry_of: Some(r.of),
        };
        self.send(core, clock, tally, sending).await
    }

    /// One `--out` line, when asked for.
    fn write_out(
        &mut self,
        line: usize,
        at_ms: u64,
        label: &str,
        answer: &Result<CheckResponse, RequestError>,
        fate: Fate,
        retry_of: Option<&str>,
    ) -> Result<(), SimulateError> {
        let Some((out, path)) = &mut self.out else {
            return Ok(());
        };
        let record = OutLine {
            line,
            at: rfc3339(at_ms),
            label,
            retry_of,
            decision: answer.as_ref().ok(),
            error: answer.as_ref().err().map(|e| OutError {
                code: e.code(),
                message: e.to_string(),
                field: e.field(),
            }),
            granted: fate.granted,
        };
        serde_json::to_writer(&mut *out, &record)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|source| SimulateError::Out {
                path: path.clone(),
                source,
            })
    }

    fn traffic_err(&self, source: TrafficError) -> SimulateError {
        SimulateError::Traffic {
            path: self.path.clone(),
            source,
        }
    }

    /// An event line the events path would refuse is an error here, named by its line:
    /// events are the operator's own data, not traffic to judge.
    fn validate_event(&self, line: usize, ev: &Value) -> Result<(), SimulateError> {
        event::parse_body(ev)
            .map(|_| ())
            .map_err(|e| SimulateError::Event {
                path: self.path.clone(),
                line,
                message: format!("{}{}", e.at, e.error),
            })
    }

    async fn ingest(
        &self,
        core: &app::Core,
        clock: &ManualClock,
        batch: Batch,
        tally: &mut Tally,
    ) -> Result<(), SimulateError> {
        clock.set(batch.at_ms);
        let body = json!({"events": batch.events.iter().map(|(_, e)| e).collect::<Vec<_>>()});
        match core.events.ingest(&self.rules, &body).await {
            Ok(_) => {
                for _ in &batch.events {
                    tally.event(batch.at_ms);
                }
                Ok(())
            }
            Err(e) => {
                let line = match &e {
                    EventsError::Invalid { at, .. } => batch_index(at)
                        .and_then(|i| batch.events.get(i))
                        .map(|(line, _)| *line),
                    EventsError::Journal(_) => None,
                }
                .unwrap_or(batch.events.first().map_or(0, |(l, _)| *l));
                Err(SimulateError::Event {
                    path: self.path.clone(),
                    line,
                    message: e.to_string(),
                })
            }
        }
    }
}

/// One line of `--out`: the check's line and time, and its decision (or the 400 the
/// service would have answered), and with a stock whether it got a unit. A retry after a
/// passed challenge names the request id of the check it retries (`retry_of`); its `line`
/// is that check's line.
#[derive(Serialize)]
struct OutLine<'a> {
    line: usize,
    at: String,
    label: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_of: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decision: Option<&'a CheckResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<OutError<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    granted: Option<bool>,
}

#[derive(Serialize)]
struct OutError<'a> {
    code: &'static str,
    message: String,
    field: Option<&'a str>,
}

/// The index `i` of an `events[i].` error prefix.
fn batch_index(at: &str) -> Option<usize> {
    at.strip_prefix("events[")?.split(']').next()?.parse().ok()
}

/// An id as the check path reads it: a string, or an integer's digits.
fn id_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The check with a `request_id`: its own, or a ULID of its time and line number (the
/// service would make a random one; this one is the same on every run).
fn with_request_id(mut check: Value, at_ms: u64, line: usize) -> Value {
    if let Some(obj) = check.as_object_mut() {
        if obj.get("request_id").is_none_or(Value::is_null) {
            let id = ulid::Ulid::from_parts(at_ms, line as u128).to_string();
            obj.insert("request_id".into(), Value::String(id));
        }
    }
    check
}

/// A retry's request id: a ULID of its time, with the line number and the attempt in its
/// random part, so it differs from every line's own made id and from other retries.
fn retry_request_id(at_ms: u64, line: usize, attempt: u32) -> String {
    ulid::Ulid::from_parts(at_ms, (u128::from(attempt) << 64) | line as u128).to_string()
}
