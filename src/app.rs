//! The composition root: config in, a running server out. Everything the service holds
//! (rules, store, checker, metrics) is built here, once, and handed to the HTTP layer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::web;
use arc_swap::ArcSwapOption;

use crate::behaviour::{BehaviourError, Behaviours};
use crate::check::over_limit::OverLimit;
use crate::check::Checker;
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, StoreBackend};
use crate::dashboard::History;
use crate::decide::cluster::ClusterDecider;
use crate::decide::embedded::EmbeddedDecider;
use crate::decide::redis::RedisDecider;
use crate::decide::Decider;
use crate::decision_log::DecisionLog;
use crate::http::recording::Recording;
use crate::http::{self, AppState};
use crate::invalidating::{AwardsInvalidate, RefundsInvalidate};
use crate::keys::KeyPrefix;
use crate::metrics::Metrics;
use crate::open_files;
use crate::record::{RecordError, Recorder};
use crate::refund::Refunds;
use crate::rules::{self, watch, Reloader, RuleErrors, RuleSet, RulesHandle, Trigger};
use crate::store::breaker::Breaker;
use crate::store::embedded::EmbeddedStore;
use crate::store::redis::RedisStore;
use crate::store::{StoreError, WindowStore};
use crate::trust::{journal, Events, EventsError, RedisLedger, SledLedger, TrustLedger};

/// Why the service could not start. Each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("rules in {dir}:\n{errors}")]
    Rules { dir: String, errors: RuleErrors },
    #[error("store ({backend}) at {url}: {source}")]
    Store {
        backend: &'static str,
        url: String,
        source: StoreError,
    },
    #[error("listen {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("server: {0}")]
    Server(std::io::Error),
    #[error("behaviour state: {0}")]
    Behaviour(#[from] BehaviourError),
    /// The events journal (its error names the folder).
    #[error("trust events: {0}")]
    Events(EventsError),
    /// `[record]` cannot start (its error names the folder).
    #[error("record: {0}")]
    Record(#[from] RecordError),
    /// `[http] max_connections_per_worker` past what the open-file limit leaves room for.
    #[error(transparent)]
    Connections(#[from] open_files::TooManyConnections),
}

/// A built service, not yet listening.
pub struct Service {
    pub state: web::Data<AppState>,
    /// Embedded stores to flush at shutdown.
    pub embedded: Vec<Arc<EmbeddedStore>>,
    /// The behaviour actors, to snapshot and stop at shutdown.
    pub behaviours: Behaviours,
    /// The trust ledger (for the check path).
    pub ledger: Arc<dyn TrustLedger>,
}

/// What the deciding parts are built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The service: behaviour shards on threads of their own, windows journaled to disk.
    Serve,
    /// `vigia simulate`: one thread drives every check, so the shards run on it
    /// ([`Behaviours::start_local`]); the state is thrown away after, so windows stay in memory.
    Replay,
}

/// Opens an embedded store under `data_dir/name` with its reaper running (in memory only
/// for a replay).
fn open_embedded(
    config: &Config,
    name: &str,
    clock: &Arc<dyn Clock>,
    purpose: Purpose,
) -> Result<Arc<EmbeddedStore>, StartError> {
    if purpose == Purpose::Replay {
        let store = EmbeddedStore::in_memory(clock.clone());
        store.start_reaper();
        return Ok(store);
    }
    let dir = config.data_dir.join(name);
    let store = EmbeddedStore::open(&dir, clock.clone()).map_err(|source| StartError::Store {
        backend: "embedded",
        url: dir.display().to_string(),
        source,
    })?;
    store.start_reaper();
    Ok(store)
}

/// The clock Redis scripts take "now" from: none (Redis `TIME`, so nodes agree) with the
/// wall clock; the service's own otherwise (a test's or a simulation's).
fn redis_clock(clock: &Arc<dyn Clock>) -> Option<Arc<dyn Clock>> {
    (!clock.is_wall()).then(|| clock.clone())
}

/// The parts that decide: the checker over its stores, refunds on the same windows, the
/// behaviour actors, the trust ledger and the events service. What `serve` adds around them (rules handle, reload,
/// HTTP) is in [`build`]; `vigia simulate` drives these directly.
pub struct Core {
    pub checker: Arc<Checker>,
    pub refunds: Arc<Refunds>,
    pub events: Arc<Events>,
    pub behaviours: Behaviours,
    pub ledger: Arc<dyn TrustLedger>,
    /// Embedded stores to flush at shutdown.
    pub embedded: Vec<Arc<EmbeddedStore>>,
    pub metrics: Metrics,
}

/// Where a node decides and keeps its trust.
struct Stores {
    /// The decision's one step.
    decider: Arc<dyn Decider>,
    /// The same store's windows, for refunds.
    store: Arc<dyn WindowStore>,
    /// The node's own decider for scenes whose policy is `local`.
    local: Option<Arc<dyn Decider>>,
    /// Where events award trust.
    ledger: Arc<dyn TrustLedger>,
    /// Embedded stores to flush at shutdown.
    embedded: Vec<Arc<EmbeddedStore>>,
}

/// The decider and the windows it refunds on, the trust ledger events award to, and the
/// node's own decider for scenes whose policy is `local`: embedded, all on this node (the
/// embedded decider already is the node's own); on Redis, one script there, the ledger
/// there, and a local decider on this node's embedded store and actors.
async fn open_stores(
    config: &Config,
    purpose: Purpose,
    clock: &Arc<dyn Clock>,
    metrics: &Metrics,
    behaviours: &Behaviours,
    events_db: &sled::Db,
    events_dir: &std::path::Path,
) -> Result<Stores, StartError> {
    Ok(match config.store.backend {
        StoreBackend::Embedded => {
            let windows = open_embedded(config, "windows", clock, purpose)?;
            let ledger = Arc::new(SledLedger::open(events_db, clock.clone()).map_err(
                |source| StartError::Store {
                    backend: "sled",
                    url: events_dir.display().to_string(),
                    source,
                },
            )?);
            let decider = EmbeddedDecider::new(
                windows.clone(),
                behaviours.clone(),
                Some(ledger.clone()),
                clock.clone(),
            );
            Stores {
                decider: Arc::new(decider),
                store: windows.clone(),
                local: None,
                ledger,
                embedded: vec![windows],
            }
        }
        StoreBackend::Redis | StoreBackend::RedisCluster => {
            let cluster = config.store.backend == StoreBackend::RedisCluster;
            let redis_err = |source| StartError::Store {
                backend: config.store.backend.name(),
                url: config.store.redis_url.clone(),
                source,
            };
            let breaker = Arc::new(Breaker::new(
                "redis",
                config.store.breaker(),
                Some(metrics.clone()),
            ));
            let redis = if cluster {
                // Seed nodes, comma-separated: the rest of the cluster is discovered.
                let seeds: Vec<String> = config
                    .store
                    .redis_url
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                RedisStore::connect_cluster_with(&seeds, config.store.timeout_ms, breaker).await
            } else {
                RedisStore::connect_with(&config.store.redis_url, config.store.timeout_ms, breaker)
                    .await
            }
            .map_err(redis_err)?;
            let redis = match redis_clock(clock) {
                Some(clock) => redis.with_clock(clock),
                None => redis,
            };
            let link = redis.link();
            let decider: Arc<dyn Decider> = if cluster {
                Arc::new(
                    ClusterDecider::new(link.clone(), redis_clock(clock), metrics.clone())
                        .await
                        .map_err(redis_err)?,
                )
            } else {
                Arc::new(
                    RedisDecider::new(link.clone(), redis_clock(clock), metrics.clone())
                        .await
                        .map_err(redis_err)?,
                )
            };
            // Trust keys are one user's (on a cluster, one slot): the same scripts serve.
            let ledger = RedisLedger::new(link, &key_prefix(config))
                .await
                .map_err(redis_err)?;
            let ledger = match redis_clock(clock) {
                Some(clock) => ledger.with_clock(clock),
                None => ledger,
            };
            let local = open_embedded(config, "local", clock, purpose)?;
            // Trust lives in Redis: deciding alone, the node knows no points or ages.
            let local_decider =
                EmbeddedDecider::new(local.clone(), behaviours.clone(), None, clock.clone());
            Stores {
                decider,
                store: Arc::new(redis),
                local: Some(Arc::new(local_decider)),
                ledger: Arc::new(ledger),
                embedded: vec![local],
            }
        }
    })
}

/// The keys' prefix, hash-tagged when the store is a cluster.
fn key_prefix(config: &Config) -> KeyPrefix {
    match config.store.backend {
        StoreBackend::RedisCluster => KeyPrefix::tagged(&config.store.key_prefix),
        StoreBackend::Embedded | StoreBackend::Redis => KeyPrefix::plain(&config.store.key_prefix),
    }
}

/// Builds the deciding parts for `ruleset` on `clock`. Starts no background task that
/// needs a runtime (the events replayer is the caller's to spawn).
pub async fn build_core(
    config: &Config,
    ruleset: &RuleSet,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    purpose: Purpose,
) -> Result<Core, StartError> {
    let start = match purpose {
        Purpose::Serve => Behaviours::start,
        Purpose::Replay => Behaviours::start_local,
    };
    let behaviours = start(
        &config.behaviour,
        &config.data_dir.join("behaviour"),
        clock.clone(),
        metrics.clone(),
    )?;
    let events_dir = config.data_dir.join("events");
    let events_db = journal::open_db(&events_dir).map_err(|e| StartError::Events(e.into()))?;
    let Stores {
        decider,
        store,
        local,
        ledger,
        embedded,
    } = open_stores(
        config,
        purpose,
        &clock,
        &metrics,
        &behaviours,
        &events_db,
        &events_dir,
    )
    .await?;
    // Quota that comes back (a refund, a trust award) invalidates the over-limit cache:
    // refunds and awards go through wrappers that tell it.
    let over_limit = (config.over_limit.max_keys > 0).then(|| {
        Arc::new(OverLimit::new(
            config.over_limit.max_keys,
            config.over_limit.hold_ms,
        ))
    });
    let (refund_store, ledger): (Arc<dyn WindowStore>, Arc<dyn TrustLedger>) = match &over_limit {
        Some(cache) => (
            Arc::new(RefundsInvalidate {
                store: store.clone(),
                cache: cache.clone(),
            }),
            Arc::new(AwardsInvalidate {
                ledger,
                cache: cache.clone(),
            }),
        ),
        None => (store.clone(), ledger),
    };
    let refunds = Arc::new(
        Refunds::new(refund_store, metrics.clone(), &key_prefix(config))
            .with_record_horizon(config.store.record_horizon_ms),
    );
    let mut checker = Checker::new(
        decider,
        store,
        local,
        metrics.clone(),
        &key_prefix(config),
        clock.clone(),
    )
    .with_record_horizon(config.store.record_horizon_ms);
    if let Some(cache) = over_limit {
        checker = checker.with_over_limit(cache);
    }
    checker.sync_rules(ruleset);
    let checker = Arc::new(checker);
    // Events award to the ledger the checks read, and refund (a rollback) on the windows
    // they count in.
    let events = Events::open_in(
        events_db,
        &events_dir,
        ledger.clone(),
        refunds.clone(),
        metrics.clone(),
        clock,
    )
    .map_err(StartError::Events)?;
    Ok(Core {
        checker,
        refunds,
        events,
        behaviours,
        ledger,
        embedded,
        metrics,
    })
}

/// Builds the service's parts from a validated config, every one of them on `clock`
/// (production: [`crate::clock::SystemClock`]).
pub async fn build(config: &Config, clock: Arc<dyn Clock>) -> Result<Service, StartError> {
    let metrics = Metrics::new();
    let ruleset = rules::load_dir(&config.rules_dir).map_err(|errors| StartError::Rules {
        dir: config.rules_dir.display().to_string(),
        errors,
    })?;
    metrics.rule_reload("ok");
    metrics.rules_version(&ruleset.version);
    let core = build_core(
        config,
        &ruleset,
        clock.clone(),
        metrics.clone(),
        Purpose::Serve,
    )
    .await?;
    // The replayer applies whatever a store outage left pending.
    core.events.spawn_replayer();
    tracing::info!(version = %ruleset.version, scenes = ruleset.scenes.len(), "rules loaded");
    let rules = Arc::new(RulesHandle::new(ruleset, clock.clone()));
    let last_rules_error = Arc::new(ArcSwapOption::empty());
    let sync = core.checker.clone();
    let reloader = Arc::new(Reloader::new(
        &config.rules_dir,
        rules.clone(),
        // Gateway buckets of unchanged scenes carry over; added scenes get one, removed
        // scenes lose theirs.
        Box::new(move |new| sync.sync_rules(new)),
        metrics.clone(),
        last_rules_error.clone(),
    ));
    let rules_watcher = match watch::watch(reloader.clone()) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::error!(
                dir = %config.rules_dir.display(),
                error = %e,
                "rules watch: cannot start; reload with SIGHUP or POST /v1/admin/reload"
            );
            None
        }
    };
    let recording = match &config.record {
        Some(r) => Some(Recording::new(
            Recorder::start(&r.path, r.max_bytes, metrics.clone())?,
            clock.clone(),
        )),
        None => None,
    };
    // The ops page's history samples the counters; its task ends with the state.
    let ops = Arc::new(History::new(
        metrics.clone(),
        rules.clone(),
        config.ops.sample_every_ms,
    ));
    ops.spawn_sampler();
    let state = web::Data::new(AppState {
        rules,
        checker: core.checker,
        refunds: core.refunds,
        metrics,
        last_rules_error,
        reloader,
        rules_watcher,
        auth: config.auth.clone(),
        events: core.events,
        recording,
        decision_log: DecisionLog::new(config.decision_log),
        ops,
        // Every folder start-up made is there by now.
        state_folders: crate::data_dir::StateFolders::of(&config.data_dir),
    });
    Ok(Service {
        state,
        embedded: core.embedded,
        behaviours: core.behaviours,
        ledger: core.ledger,
    })
}

/// A service listening on a socket.
pub struct Running {
    pub addr: SocketAddr,
    pub handle: ServerHandle,
    pub server: actix_web::dev::Server,
    pub state: web::Data<AppState>,
    pub embedded: Vec<Arc<EmbeddedStore>>,
    pub behaviours: Behaviours,
    pub ledger: Arc<dyn TrustLedger>,
    /// HTTP workers, and the connections each holds at most.
    pub workers: usize,
    pub connections_per_worker: usize,
}

/// Builds and binds the service (`listen` may use port 0) on `clock` with `workers` HTTP
/// workers (by default one per CPU); the caller awaits `server`.
pub async fn start(
    config: &Config,
    workers: Option<usize>,
    clock: Arc<dyn Clock>,
) -> Result<Running, StartError> {
    let workers = workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    // Without a readable limit (none on this system) the cap is actix's own.
    let soft = open_files::current().map_or(u64::MAX, |l| l.soft);
    let connections_per_worker =
        open_files::cap(config.http.max_connections_per_worker, workers, soft)?;
    let bind_err = |source| StartError::Bind {
        addr: config.listen.clone(),
        source,
    };
    let addr = config
        .listen_addr()
        .map_err(|e| bind_err(std::io::Error::other(e)))?;
    let service = build(config, clock).await?;
    let listener = http::server::listen(addr).map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    let state = service.state.clone();
    let bounds = http::server::Bounds {
        request_timeout: Duration::from_millis(config.http.request_timeout_ms),
        keep_alive: Duration::from_millis(config.http.keep_alive_ms),
        per_worker: connections_per_worker,
    };
    let server = http::server::serve(listener, workers, bounds, service.state)
        .map_err(StartError::Server)?;
    Ok(Running {
        addr,
        handle: server.handle(),
        server,
        state,
        embedded: service.embedded,
        behaviours: service.behaviours,
        ledger: service.ledger,
        workers,
        connections_per_worker,
    })
}

/// Reloads the rules on every SIGHUP, on a blocking thread (the reloader logs each try).
fn spawn_sighup_reload(reloader: Arc<Reloader>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: cannot listen; rules reload on SIGHUP is off");
            return;
        }
    };
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let reloader = reloader.clone();
            let _ = tokio::task::spawn_blocking(move || reloader.reload(Trigger::Signal)).await;
        }
    });
}

/// Raises the soft open-file limit to the hard one, and logs both: connections are capped
/// under it (see [`open_files`]).
fn raise_open_files() {
    match open_files::raise() {
        Ok((before, after)) => tracing::info!(
            soft = after.soft,
            hard = after.hard,
            soft_before = before.soft,
            "open-file limit"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            "open-file limit: cannot raise the soft limit to the hard one; connections are capped under the soft limit"
        ),
    }
}

/// Runs the service until SIGINT or SIGTERM (graceful: in-flight checks finish).
pub async fn serve(config: &Config) -> Result<(), StartError> {
    raise_open_files();
    let running = start(config, Some(config.worker_threads()), Arc::new(SystemClock)).await?;
    let store_at = match config.store.backend {
        StoreBackend::Embedded => config.data_dir.display().to_string(),
        _ => crate::sweep::redact(&config.store.redis_url),
    };
    let rules_version = running.state.rules.current().version.clone();
    // One line says what this process serves from: the store and where, the rules.
    tracing::info!(
        addr = %running.addr,
        store = config.store.backend.name(),
        store_at = %store_at,
        rules_version = %rules_version,
        workers = running.workers,
        connections_per_worker = running.connections_per_worker,
        request_timeout_ms = config.http.request_timeout_ms,
        "vigia listening"
    );
    if http::auth::check_open_to_network(&running.addr, &config.auth.check_token) {
        tracing::warn!(
            addr = %running.addr,
            "/v1/check is open to anyone who reaches this address: it listens beyond loopback \
             and auth.check_token (VIGIA_CHECK_TOKEN) is empty; set a token, or listen on \
             127.0.0.1 behind your backend"
        );
    }
    spawn_sighup_reload(running.state.reloader.clone());
    let result = running.server.await.map_err(StartError::Server);
    // SIGTERM/SIGINT: the server drained; make every window and every entity's behaviour
    // durable before exiting.
    if let Err(e) = running.behaviours.shutdown().await {
        tracing::error!(error = %e, "behaviour: snapshot at shutdown failed");
    }
    if let Some(recording) = &running.state.recording {
        recording.flush();
    }
    if let Err(e) = running.state.events.flush() {
        tracing::error!(error = %e, "events journal: flush at shutdown failed");
    }
    for store in &running.embedded {
        if let Err(e) = store.flush() {
            tracing::error!(error = %e, "embedded store: flush at shutdown failed");
        }
    }
    tracing::info!("vigia stopped");
    result
}
