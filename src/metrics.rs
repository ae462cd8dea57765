//! Telemetry: an app-owned Prometheus registry and one method per named event.
//!
//! Labels stay bounded: scenes, limits and reasons come from the rule set (never from the
//! request), decisions and layers are fixed sets.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use prometheus::local::{LocalHistogramVec, LocalIntCounterVec};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// The service's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    decisions: IntCounterVec,
    blocks: IntCounterVec,
    signals_fired: IntCounterVec,
    http_answers: IntCounterVec,
    check_latency: HistogramVec,
    /// What the check path counts into instead of `decisions`, `http_answers`,
    /// `check_latency`, `blocks`, `signals_fired` and `over_limit_answers` (see [`Shards`]).
    shards: Arc<Shards>,
    store_errors: IntCounterVec,
    store_releases: IntCounterVec,
    store_releases_pending: IntGauge,
    degraded: IntCounterVec,
    over_limit_answers: IntCounterVec,
    rule_reloads: IntCounterVec,
    rules_loaded: IntGaugeVec,
    behaviour_unanswered: IntCounterVec,
    behaviour_entities: IntGaugeVec,
    events: IntCounterVec,
    challenge_passes: IntCounterVec,
    trust_errors: IntCounterVec,
    breaker_open: IntGaugeVec,
    breaker_transitions: IntCounterVec,
    record_lines: IntCounterVec,
    late_requests: IntCounter,
}

/// The metrics every check moves (its decision, its HTTP answer, its latency; a deny's
/// block, a fired signal, an answer from the over-limit cache), counted
/// without shared atomics: each thread counts into local copies of its own
/// (`prometheus::local`), which every read of the registry ([`Metrics::gather`],
/// [`Metrics::render`]) first flushes, so a scrape is as exact as before. Counting into the
/// shared vecs directly cost ~1–2 µs per check on 2 cores (`benches/ab.sh`, embedded store:
/// +4–8 % throughput without the latency histogram alone; one observe took 450 ns with two
/// threads at it against 29 ns for a local one): the vecs' locks, the handles' reference
/// counts and the counters bounce between the workers' caches on every check.
#[derive(Default)]
struct Shards {
    shards: Mutex<Vec<Arc<Mutex<Local>>>>,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("threads", &lock(&self.shards).len())
            .finish()
    }
}

/// One thread's counts, flushed into the registry's metrics at each read.
struct Local {
    decisions: LocalIntCounterVec,
    http_answers: LocalIntCounterVec,
    check_latency: LocalHistogramVec,
    // A deny's: under attack most checks are denies, and each counts a block (and, answered
    // from the over-limit cache, that too).
    blocks: LocalIntCounterVec,
    signals_fired: LocalIntCounterVec,
    over_limit_answers: LocalIntCounterVec,
}

impl Local {
    fn flush(&self) {
        self.decisions.flush();
        self.http_answers.flush();
        self.check_latency.flush();
        self.blocks.flush();
        self.signals_fired.flush();
        self.over_limit_answers.flush();
    }
}

/// A thread's [`Local`] of one registry: the Weak keeps a dropped registry's address from
/// being reused meanwhile.
type LocalOf = (Weak<Shards>, Arc<Mutex<Local>>);

thread_local! {
    /// This thread's [`Local`] of each live [`Metrics`] (tests run several apps per
    /// process).
    static LOCALS: RefCell<Vec<LocalOf>> = const { RefCell::new(Vec::new()) };
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Check latency buckets, seconds: sub-millisecond answers up to the store timeout and past.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Builds the registry. The names and label sets are constants, so registration
    /// cannot fail; a failure would be a programming error caught by every test.
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let decisions = counter(
            "vigia_decisions_total",
            "Check decisions by scene, decision, layer and reason.",
            &["scene", "decision", "layer", "reason"],
        );
        let blocks = counter(
            "vigia_blocks_total",
            "Limits exceeded, by scene, limit and dimension.",
            &["scene", "limit", "dimension"],
        );
        let signals_fired = counter(
            "vigia_signals_fired_total",
            "Checks on which a signal fired (past its max and its min_share), by scene and signal; new_account counts a young user.",
            &["scene", "signal"],
        );
        let http_answers = counter(
            "vigia_http_responses_total",
            "HTTP answers by route (its pattern; unmatched for an unknown path) and status.",
            &["route", "status"],
        );
        let store_errors = counter(
            "vigia_store_errors_total",
            "Store calls that failed, by store and kind.",
            &["store", "kind"],
        );
        let store_releases = counter(
            "vigia_store_releases_total",
            "Records on Redis settled after the answer, by result (released: what a failed call on one Redis, or a cluster check's denied or failed slot group, recorded is given back; committed: an allowed cluster check's reservation made final; none: nothing was recorded; dropped: queue full or every try failed — a release's unit held until its window passes, a commit's copies told in_flight until the record expires).",
            &["result"],
        );
        let degraded = counter(
            "vigia_degraded_decisions_total",
            "Decisions taken without the store, by scene and policy.",
            &["scene", "policy"],
        );
        let over_limit_answers = counter(
            "vigia_over_limit_cache_answers_total",
            "Checks denied from the node's over-limit cache (a key the store just found full), without a store call, by scene.",
            &["scene"],
        );
        let rule_reloads = counter(
            "vigia_rule_reloads_total",
            "Rule set loads by result.",
            &["result"],
        );
        let behaviour_unanswered = counter(
            "vigia_behaviour_unanswered_total",
            "Checks whose signals the behaviour shards did not answer (decided by on_store_error), by dimension (signal) and reason (timeout, mailbox).",
            &["dimension", "reason"],
        );
        let events = counter(
            "vigia_events_total",
            "Trust events by type and result (accepted, duplicate, invalid, applied, deferred, failed).",
            &["type", "result"],
        );
        let challenge_passes = counter(
            "vigia_challenge_passes_total",
            "Challenge passes reported (challenge_passed events accepted), by scene (\"all\" for a pass that names none: it lifts every scene's band). Challenges issued are vigia_decisions_total{decision=\"challenge\"}.",
            &["scene"],
        );
        let trust_errors = counter(
            "vigia_trust_errors_total",
            "Trust ledger reads or writes that failed, by operation.",
            &["operation"],
        );
        let breaker_transitions = counter(
            "vigia_store_breaker_transitions_total",
            "Store circuit breaker transitions, by store and new state (open, closed).",
            &["store", "to"],
        );
        let record_lines = counter(
            "vigia_record_lines_total",
            "Traffic lines handed to the recorder, by result (written, dropped_full, dropped_max_bytes, error).",
            &["result"],
        );
        let late_requests = IntCounter::new(
            "vigia_http_late_requests_total",
            "Connections closed because a request (head and body) did not arrive within [http] request_timeout_ms of its first byte.",
        )
        .expect("valid metric");
        registry
            .register(Box::new(late_requests.clone()))
            .expect("unique metric");
        let check_latency = HistogramVec::new(
            HistogramOpts::new("vigia_check_duration_seconds", "Check latency by scene.")
                .buckets(LATENCY_BUCKETS.to_vec()),
            &["scene"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(check_latency.clone()))
            .expect("unique metric");
        let rules_loaded = IntGaugeVec::new(
            Opts::new("vigia_rules_info", "The loaded rule set version (value 1)."),
            &["version"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(rules_loaded.clone()))
            .expect("unique metric");
        let behaviour_entities = IntGaugeVec::new(
            Opts::new(
                "vigia_behaviour_entities",
                "Signal keys held by the behaviour actors, by dimension (signal).",
            ),
            &["dimension"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(behaviour_entities.clone()))
            .expect("unique metric");
        let breaker_open = IntGaugeVec::new(
            Opts::new(
                "vigia_store_breaker_open",
                "1 while the store's circuit breaker is open, else 0.",
            ),
            &["store"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(breaker_open.clone()))
            .expect("unique metric");
        let store_releases_pending = IntGauge::new(
            "vigia_store_releases_pending",
            "Releases and commits queued or running (a failed call's waits for Redis's late reply first).",
        )
        .expect("valid metric");
        registry
            .register(Box::new(store_releases_pending.clone()))
            .expect("unique metric");
        Metrics {
            registry,
            breaker_open,
            breaker_transitions,
            behaviour_unanswered,
            behaviour_entities,
            events,
            challenge_passes,
            trust_errors,
            decisions,
            blocks,
            signals_fired,
            http_answers,
            check_latency,
            shards: Arc::default(),
            store_errors,
            store_releases,
            store_releases_pending,
            degraded,
            over_limit_answers,
            rule_reloads,
            rules_loaded,
            record_lines,
            late_requests,
        }
    }

    pub fn decision(&self, scene: &str, decision: &str, layer: &str, reason: &str) {
        self.local(|l| {
            l.decisions
                .with_label_values(&[scene, decision, layer, reason])
                .inc()
        });
    }

    pub fn block(&self, scene: &str, limit: &str, dimension: &str) {
        self.local(|l| l.blocks.with_label_values(&[scene, limit, dimension]).inc());
    }

    /// `signal` fired on one check of `scene`.
    pub fn signal_fired(&self, scene: &str, signal: &str) {
        self.local(|l| l.signals_fired.with_label_values(&[scene, signal]).inc());
    }

    /// One HTTP answer of `status` on `route` (a route pattern, or `unmatched`).
    pub fn http_answer(&self, route: &str, status: u16) {
        let mut code = itoa::Buffer::new();
        let code = code.format(status);
        self.local(|l| l.http_answers.with_label_values(&[route, code]).inc());
    }

    pub fn check_latency(&self, scene: &str, seconds: f64) {
        self.local(|l| l.check_latency.with_label_values(&[scene]).observe(seconds));
    }

    /// Runs `f` on this thread's local counts of this registry (made on first use).
    fn local(&self, f: impl FnOnce(&mut Local)) {
        let mine = Arc::as_ptr(&self.shards);
        LOCALS.with(|locals| {
            let mut locals = locals.borrow_mut();
            if let Some((_, local)) = locals.iter().find(|(of, _)| of.as_ptr() == mine) {
                return f(&mut lock(local));
            }
            // This thread's first count for this registry (and forget the registries
            // dropped since).
            locals.retain(|(of, _)| of.strong_count() > 0);
            let local = Arc::new(Mutex::new(Local {
                decisions: self.decisions.local(),
                http_answers: self.http_answers.local(),
                check_latency: self.check_latency.local(),
                blocks: self.blocks.local(),
                signals_fired: self.signals_fired.local(),
                over_limit_answers: self.over_limit_answers.local(),
            }));
            lock(&self.shards.shards).push(local.clone());
            f(&mut lock(&local));
            locals.push((Arc::downgrade(&self.shards), local));
        });
    }

    /// Moves every thread's local counts into the registry's metrics.
    fn flush_locals(&self) {
        for local in lock(&self.shards.shards).iter() {
            lock(local).flush();
        }
    }

    pub fn store_error(&self, store: &str, kind: &str) {
        self.store_errors.with_label_values(&[store, kind]).inc();
    }

    /// A release's result: `released`, `committed`, `none`, `dropped`.
    pub fn store_release(&self, result: &str) {
        self.store_releases.with_label_values(&[result]).inc();
    }

    /// Releases queued or running.
    pub fn store_releases_pending(&self, delta: i64) {
        self.store_releases_pending.add(delta);
    }

    pub fn degraded(&self, scene: &str, policy: &str) {
        self.degraded.with_label_values(&[scene, policy]).inc();
    }

    /// A check of `scene` denied from the over-limit cache.
    pub fn over_limit_answer(&self, scene: &str) {
        self.local(|l| l.over_limit_answers.with_label_values(&[scene]).inc());
    }

    pub fn rule_reload(&self, result: &str) {
        self.rule_reloads.with_label_values(&[result]).inc();
    }

    /// Marks `version` as the loaded rule set (and only it).
    pub fn rules_version(&self, version: &str) {
        self.rules_loaded.reset();
        self.rules_loaded.with_label_values(&[version]).set(1);
    }

    /// A behaviour shard did not answer a check in time (`reason`: timeout, mailbox).
    pub fn behaviour_unanswered(&self, dimension: &str, reason: &str) {
        self.behaviour_unanswered
            .with_label_values(&[dimension, reason])
            .inc();
    }

    /// Adds `delta` (may be negative) to the keys the behaviour shards hold. The
    /// `dimension` label (always `signal` now) is kept so dashboards keep their series.
    pub fn behaviour_entities(&self, dimension: &str, delta: i64) {
        self.behaviour_entities
            .with_label_values(&[dimension])
            .add(delta);
    }

    /// One trust event of `kind` ended as `result`.
    pub fn event(&self, kind: &str, result: &str) {
        self.events.with_label_values(&[kind, result]).inc();
    }

    /// A challenge pass for `scene` (or `all`) was accepted.
    pub fn challenge_pass(&self, scene: &str) {
        self.challenge_passes.with_label_values(&[scene]).inc();
    }

    /// A trust ledger `operation` (read, award) failed.
    pub fn trust_error(&self, operation: &str) {
        self.trust_errors.with_label_values(&[operation]).inc();
    }

    /// The store's circuit breaker is now open (or closed). A transition is counted only
    /// when the state changes; the initial closed state only sets the gauge.
    pub fn breaker(&self, store: &str, open: bool) {
        let gauge = self.breaker_open.with_label_values(&[store]);
        let was = gauge.get();
        gauge.set(i64::from(open));
        if was != i64::from(open) {
            self.breaker_transitions
                .with_label_values(&[store, if open { "open" } else { "closed" }])
                .inc();
        }
    }

    /// One traffic line handed to the recorder ended as `result`: `written` (in its file),
    /// `dropped_full` (the recorder's queue was full), `dropped_max_bytes` (no room under
    /// `max_bytes`) or `error` (lost to a file error, or to the writer thread being gone).
    pub fn record_line(&self, result: &str) {
        self.record_lines.with_label_values(&[result]).inc();
    }

    /// The count of connections closed for a late request: each connection holds its handle
    /// (see `http::deadline`).
    pub fn late_requests(&self) -> IntCounter {
        self.late_requests.clone()
    }

    /// Every metric as it stands now. The ops page reads its counts here, so it shows
    /// exactly what `/metrics` exports.
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.flush_locals();
        self.registry.gather()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec only fails on invalid metric data, which we never build.
        let _ = TextEncoder::new().encode(&self.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latency_count(m: &Metrics, scene: &str) -> Option<u64> {
        let line = format!("vigia_check_duration_seconds_count{{scene=\"{scene}\"}} ");
        m.render()
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .map(|n| n.parse().expect("a count"))
    }

    #[test]
    fn check_latency_from_every_thread_is_in_each_scrape_once() {
        let m = Metrics::new();
        m.check_latency("s", 0.001);
        let other = m.clone();
        std::thread::spawn(move || {
            other.check_latency("s", 0.002);
            other.check_latency("t", 0.003);
        })
        .join()
        .expect("thread");
        assert_eq!(latency_count(&m, "s"), Some(2));
        assert_eq!(latency_count(&m, "t"), Some(1));
        // A second scrape does not count the flushed observations again.
        assert_eq!(latency_count(&m, "s"), Some(2));
        m.check_latency("s", 0.004);
        assert_eq!(latency_count(&m, "s"), Some(3));
        // Another registry on the same thread keeps its own.
        let n = Metrics::new();
        n.check_latency("s", 0.001);
        assert_eq!(latency_count(&n, "s"), Some(1));
        assert_eq!(latency_count(&m, "s"), Some(3));
        assert!(m
            .render()
            .contains("vigia_check_duration_seconds_sum{scene=\"s\"} 0.007"));
    }

    #[test]
    fn decisions_and_answers_from_every_thread_are_in_each_scrape_once() {
        let m = Metrics::new();
        let count = |m: &Metrics, line: &str| {
            m.render()
                .lines()
                .find_map(|l| l.strip_prefix(line).map(str::to_owned))
                .unwrap_or_default()
        };
        let decision =
            r#"vigia_decisions_total{decision="allow",layer="none",reason="none",scene="s"} "#;
        let answer = r#"vigia_http_responses_total{route="/v1/check",status="200"} "#;
        let block = r#"vigia_blocks_total{dimension="user",limit="u",scene="s"} "#;
        let fired = r#"vigia_signals_fired_total{scene="s",signal="g"} "#;
        let cached = r#"vigia_over_limit_cache_answers_total{scene="s"} "#;
        let every = |m: &Metrics| {
            m.decision("s", "allow", "none", "none");
            m.http_answer("/v1/check", 200);
            m.block("s", "u", "user");
            m.signal_fired("s", "g");
            m.over_limit_answer("s");
        };
        let other = m.clone();
        std::thread::spawn(move || every(&other))
            .join()
            .expect("thread");
        every(&m);
        for line in [decision, answer, block, fired, cached] {
            assert_eq!(count(&m, line), "2", "{line}");
        }
        m.decision("s", "allow", "none", "none");
        m.block("s", "u", "user");
        assert_eq!(
            count(&m, decision),
            "3",
            "flushed counts are not counted again"
        );
        assert_eq!(
            count(&m, block),
            "3",
            "flushed counts are not counted again"
        );
    }
}
