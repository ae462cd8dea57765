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
//! Determinism: the same file and rules give the same decisions, run after run. Lines run
//! one at a time, in file order, on one thread (the behaviour shards are hosted on it too,
//! [`Purpose::Replay`]), and the actors' deadline is lifted: a replay has nobody waiting,
//! so a signal is never dropped for lateness as a loaded service may drop it. A check
//! without a `request_id` gets one made from its time and line number, so `--out` is
//! reproducible too.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};

use super::report::{Fate, Report, Tally};
use super::traffic::{Line, Reader, TrafficError, UNLABELLED};
use crate::app::{self, Purpose, StartError};
use crate::check::decision::CheckResponse;
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
    };
    replay.run(reader, progress).await
}

struct Replay {
    rules: Arc<RuleSet>,
    path: String,
    stock: Option<u64>,
    out: Option<(BufWriter<File>, String)>,
    total_bytes: u64,
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
        let Some(first) = reader.next_line() else {
            return Ok(tally.finish());
        };
        let first = first.map_err(|e| self.traffic_err(e))?;
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
        let mut next = Some(Ok(first));
        let mut lines = 0u64;
        while let Some(item) = next {
            let (line, parsed) = item.map_err(|e| self.traffic_err(e))?;
            match parsed {
                Line::Event { at_ms, event } => {
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
                Line::Check {
                    at_ms,
                    label,
                    check,
                    decision,
                } => {
                    // Events before a check are in force for it.
                    if let Some(b) = batch.take() {
                        self.ingest(&core, &clock, b, &mut tally).await?;
                    }
                    clock.set(at_ms);
                    let check = with_request_id(check, at_ms, line);
                    let answer = core.checker.check(&self.rules, &check).await;
                    let label = label.as_deref().unwrap_or(UNLABELLED);
                    let user = check.get("user_id").and_then(user_id);
                    let fate = tally.check(
                        line,
                        at_ms,
                        label,
                        user.as_deref(),
                        &answer,
                        decision.as_ref(),
                    );
                    self.write_out(line, at_ms, label, &answer, fate)?;
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
            next = reader.next_line();
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

    /// One `--out` line, when asked for.
    fn write_out(
        &mut self,
        line: usize,
        at_ms: u64,
        label: &str,
        answer: &Result<CheckResponse, RequestError>,
        fate: Fate,
    ) -> Result<(), SimulateError> {
        let Some((out, path)) = &mut self.out else {
            return Ok(());
        };
        let record = OutLine {
            line,
            at: rfc3339(at_ms),
            label,
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
/// service would have answered), and with a stock whether it got a unit.
#[derive(Serialize)]
struct OutLine<'a> {
    line: usize,
    at: String,
    label: &'a str,
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

/// A user id as the check path reads it: a string, or an integer's digits.
fn user_id(v: &Value) -> Option<String> {
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
