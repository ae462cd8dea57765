//! The service's own settings: `config.toml`, then the `VIGIA_*` environment on top.
//!
//! Read strictly (unknown keys are errors) and validated whole before anything starts, so
//! a typo in a deploy is one clear message naming the file, line and field — never a
//! service that quietly runs with a default the operator did not mean.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::store::breaker::BreakerSettings;

/// Which window store the service uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreBackend {
    Embedded,
    Redis,
    RedisCluster,
}

impl StoreBackend {
    /// The name config files and `VIGIA_STORE` use.
    pub fn name(self) -> &'static str {
        match self {
            StoreBackend::Embedded => "embedded",
            StoreBackend::Redis => "redis",
            StoreBackend::RedisCluster => "redis_cluster",
        }
    }

    fn parse(s: &str) -> Option<StoreBackend> {
        [
            StoreBackend::Embedded,
            StoreBackend::Redis,
            StoreBackend::RedisCluster,
        ]
        .into_iter()
        .find(|b| b.name() == s)
    }
}

/// An hour: retries and refunds come within minutes of a check; a day-long window does
/// not need its checks' records for a day.
pub const DEFAULT_RECORD_HORIZON_MS: u64 = 3_600_000;

/// `[store]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub backend: StoreBackend,
    pub redis_url: String,
    /// Bound on one store round trip, ms.
    pub timeout_ms: u64,
    /// First segment of every key; `[A-Za-z0-9_]+`.
    pub key_prefix: String,
    /// Consecutive store failures (timeouts, lost connections) that open the breaker.
    pub breaker_failures: u32,
    /// Longest time the open breaker refuses calls before a probe, ms (the first interval
    /// is a tenth of it); recovery after an outage takes at most about this long.
    pub breaker_open_ms: u64,
    /// How long a check's request and idempotency records live, ms (capped by the scene's
    /// longest window): a repeated request id or idempotency key is recognised, and a
    /// refund accepted, within this long of the check.
    pub record_horizon_ms: u64,
}

impl StoreConfig {
    /// The circuit breaker settings these values make.
    pub fn breaker(&self) -> BreakerSettings {
        BreakerSettings {
            failures: self.breaker_failures,
            open_min_ms: (self.breaker_open_ms / 10).max(1),
            open_max_ms: self.breaker_open_ms,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: StoreBackend::Embedded,
            // No built-in address: a Redis backend must name its Redis (config.toml or
            // VIGIA_REDIS_URL), so vigia never counts in some other service's Redis by default.
            redis_url: String::new(),
            timeout_ms: 50,
            key_prefix: "lt".into(),
            breaker_failures: BreakerSettings::default().failures,
            breaker_open_ms: BreakerSettings::default().open_max_ms,
            record_horizon_ms: DEFAULT_RECORD_HORIZON_MS,
        }
    }
}

/// `log_format`: how every log line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One JSON object per line, for a log pipeline.
    #[default]
    Json,
    /// Human-readable lines, for a terminal.
    Text,
}

impl LogFormat {
    fn parse(s: &str) -> Option<LogFormat> {
        match s {
            "json" => Some(LogFormat::Json),
            "text" => Some(LogFormat::Text),
            _ => None,
        }
    }
}

/// `decision_log`: whether each check's decision is logged, and how its dimensions show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionLogMode {
    /// No line per check.
    #[default]
    Off,
    /// One line per check; user, device, IP, activity and attribute values as the first
    /// 16 hex digits of their SHA-256 (an auditor hashes the id they look for).
    Hashed,
    /// One line per check with the dimensions as sent.
    Clear,
}

impl DecisionLogMode {
    fn parse(s: &str) -> Option<DecisionLogMode> {
        match s {
            "off" => Some(DecisionLogMode::Off),
            "hashed" => Some(DecisionLogMode::Hashed),
            "clear" => Some(DecisionLogMode::Clear),
            _ => None,
        }
    }
}

/// `[auth]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Empty: admin and event endpoints answer loopback peers only.
    pub admin_token: String,
    /// Empty: `/v1/check` needs no token.
    pub check_token: String,
}

/// `[behaviour]`: the behaviour actors. Every field has a default; the section may be absent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BehaviourConfig {
    /// Actor shards holding the signal keys; a key is routed by its hash.
    pub shards: usize,
    /// OS threads hosting the shards (each runs its own actix System).
    pub threads: usize,
    /// Bounded mailbox of each shard; a full mailbox makes a check wait at most `deadline_ms`.
    pub mailbox: usize,
    /// How long a check waits for the shards' answers, ms: a check they do not answer in
    /// time is decided by its scene's `on_store_error`.
    pub deadline_ms: u64,
    /// Signal keys kept (split evenly over the shards); the least recently seen is
    /// evicted past it.
    pub max_entities: usize,
    /// How often each shard writes changed keys to sled, ms (and always at shutdown).
    pub snapshot_every_ms: u64,
}

impl Default for BehaviourConfig {
    fn default() -> Self {
        BehaviourConfig {
            shards: 16,
            threads: 2,
            mailbox: 1024,
            deadline_ms: 5,
            max_entities: 1_000_000,
            snapshot_every_ms: 5_000,
        }
    }
}

/// `[record]`: keep every answered check (and accepted event) as a traffic line, so
/// yesterday's campaign can be replayed with `vigia simulate` against tomorrow's rules.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordConfig {
    /// The folder of `traffic-<date>.jsonl` files.
    pub path: PathBuf,
    /// Total size of those files; the oldest are removed past it.
    #[serde(default = "RecordConfig::default_max_bytes")]
    pub max_bytes: u64,
}

impl RecordConfig {
    /// 1 GiB.
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
    /// Less than this could not hold a day of even a quiet scene.
    pub const MIN_MAX_BYTES: u64 = 1 << 20;

    fn default_max_bytes() -> u64 {
        Self::DEFAULT_MAX_BYTES
    }
}

/// `[ops]`: the ops page's history.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OpsConfig {
    /// How often the counters are sampled for the page's 15-minute charts, ms.
    pub sample_every_ms: u64,
}

impl Default for OpsConfig {
    fn default() -> Self {
        OpsConfig {
            sample_every_ms: 10_000,
        }
    }
}

/// `[over_limit]`: the node's cache of keys the store just found full (see
/// `check::over_limit`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OverLimitConfig {
    /// Keys held at most (least recently used evicted first); 0 turns the cache off.
    pub max_keys: usize,
    /// Longest a key is answered from the cache, ms, even when the store said to wait
    /// longer: how long a refund or award on another node may go unseen here.
    pub hold_ms: u64,
}

impl Default for OverLimitConfig {
    fn default() -> Self {
        OverLimitConfig {
            max_keys: 100_000,
            hold_ms: 1_000,
        }
    }
}

/// `[http]`: how long a client may take, and how many connections a worker holds. Every
/// field has a default; the section may be absent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// A request (its head and its body) must arrive within this long of its first byte,
    /// ms, or its connection is closed; a connection that sends nothing is answered 408
    /// and closed after as long.
    pub request_timeout_ms: u64,
    /// How long an idle keep-alive connection is kept, ms; 0: one request per connection.
    pub keep_alive_ms: u64,
    /// Connections one worker holds at most (more wait in the listen backlog); absent: as
    /// many as the open-file limit allows (see `open_files`).
    pub max_connections_per_worker: Option<usize>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            request_timeout_ms: 5_000,
            keep_alive_ms: 5_000,
            max_connections_per_worker: None,
        }
    }
}

/// Most HTTP workers a config may ask for: more only costs memory and context switches.
const MAX_WORKERS: usize = 1024;

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: String,
    /// HTTP worker threads; 0: as many as [`Config::worker_threads`] says.
    pub workers: usize,
    pub rules_dir: PathBuf,
    pub data_dir: PathBuf,
    pub store: StoreConfig,
    pub auth: AuthConfig,
    pub behaviour: BehaviourConfig,
    /// Off unless the section is present.
    pub record: Option<RecordConfig>,
    pub log_format: LogFormat,
    pub decision_log: DecisionLogMode,
    pub ops: OpsConfig,
    pub over_limit: OverLimitConfig,
    pub http: HttpConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".into(),
            workers: 0,
            rules_dir: "rules".into(),
            data_dir: "data".into(),
            store: StoreConfig::default(),
            auth: AuthConfig::default(),
            behaviour: BehaviourConfig::default(),
            record: None,
            log_format: LogFormat::Json,
            decision_log: DecisionLogMode::Off,
            ops: OpsConfig::default(),
            over_limit: OverLimitConfig::default(),
            http: HttpConfig::default(),
        }
    }
}

/// A configuration that cannot be used. Each names where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}:{line}: {message}")]
    Invalid {
        file: String,
        line: usize,
        message: String,
    },
    #[error("environment {var}: {message}")]
    Env { var: &'static str, message: String },
}

/// Sets one field from an environment variable's value; `Err` says why the value is
/// unusable.
type EnvSetter = fn(&mut Config, String) -> Result<(), String>;

/// Every `VIGIA_*` variable API.md names: (variable, the field it sets, how). The one
/// place the environment meets the config: [`Config::apply_env`] reads it, and
/// [`Config::validated`] names the variable of a field it finds unusable.
pub const ENV: &[(&str, &str, EnvSetter)] = &[
    ("VIGIA_LISTEN", "listen", |c, v| {
        c.listen = v;
        Ok(())
    }),
    ("VIGIA_WORKERS", "workers", |c, v| {
        c.workers = v.trim().parse().map_err(|_| {
            format!("{v:?} is not a number of threads (0: by the store and the CPUs)")
        })?;
        Ok(())
    }),
    ("VIGIA_RULES_DIR", "rules_dir", |c, v| {
        c.rules_dir = v.into();
        Ok(())
    }),
    ("VIGIA_DATA_DIR", "data_dir", |c, v| {
        c.data_dir = v.into();
        Ok(())
    }),
    ("VIGIA_STORE", "store.backend", |c, v| {
        c.store.backend = StoreBackend::parse(&v)
            .ok_or_else(|| format!("{v:?} is not one of embedded, redis, redis_cluster"))?;
        Ok(())
    }),
    ("VIGIA_REDIS_URL", "store.redis_url", |c, v| {
        c.store.redis_url = v;
        Ok(())
    }),
    ("VIGIA_KEY_PREFIX", "store.key_prefix", |c, v| {
        c.store.key_prefix = v;
        Ok(())
    }),
    ("VIGIA_ADMIN_TOKEN", "auth.admin_token", |c, v| {
        c.auth.admin_token = v;
        Ok(())
    }),
    ("VIGIA_CHECK_TOKEN", "auth.check_token", |c, v| {
        c.auth.check_token = v;
        Ok(())
    }),
    ("VIGIA_LOG_FORMAT", "log_format", |c, v| {
        c.log_format =
            LogFormat::parse(&v).ok_or_else(|| format!("{v:?} is not one of json, text"))?;
        Ok(())
    }),
    ("VIGIA_DECISION_LOG", "decision_log", |c, v| {
        c.decision_log = DecisionLogMode::parse(&v)
            .ok_or_else(|| format!("{v:?} is not one of off, hashed, clear"))?;
        Ok(())
    }),
];

impl Config {
    /// Reads `path`, applies the process environment, validates. Relative paths in the
    /// file (`rules_dir`, `data_dir`, `[record] path`) are taken relative to the file's
    /// folder; paths from the environment relative to the working directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let mut config = Config::from_toml(&file, &text)?;
        config.relative_to(path.parent().unwrap_or(Path::new("")));
        config.apply_env(std::env::vars())?;
        config.validated()
    }

    /// Takes every relative path of the config (`rules_dir`, `data_dir`, `[record] path`)
    /// relative to `dir`: the folder of the file they were read from.
    pub fn relative_to(&mut self, dir: &Path) {
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        };
        resolve(&mut self.rules_dir);
        resolve(&mut self.data_dir);
        if let Some(r) = &mut self.record {
            resolve(&mut r.path);
        }
    }

    /// Parses and validates the file's text; `file` names it in errors.
    pub fn from_toml(file: &str, text: &str) -> Result<Config, ConfigError> {
        let config = toml::from_str::<Config>(text).map_err(|e| ConfigError::Invalid {
            file: file.to_string(),
            line: e.span().map(|s| line_of(text, s.start)).unwrap_or(0),
            message: e.message().trim().to_string(),
        })?;
        match config.problems().into_iter().next() {
            None => Ok(config),
            Some((field, message)) => Err(ConfigError::Invalid {
                file: file.to_string(),
                line: line_of_key(text, field),
                message: format!("{field}: {message}"),
            }),
        }
    }

    /// Applies the `VIGIA_*` variables of [`ENV`] found in `env` (other variables are
    /// ignored). A value that cannot be parsed is an error naming its variable.
    pub fn apply_env(
        &mut self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        for (key, value) in env {
            if let Some((var, _, set)) = ENV.iter().find(|(var, ..)| *var == key) {
                set(self, value).map_err(|message| ConfigError::Env { var, message })?;
            }
        }
        Ok(())
    }

    /// Checks the values serde cannot, after the environment applied: a problem here came
    /// from a `VIGIA_*` variable (the file was checked when it was read).
    pub fn validated(self) -> Result<Config, ConfigError> {
        match self.problems().into_iter().next() {
            None => Ok(self),
            Some((field, message)) => Err(ConfigError::Env {
                // A field no variable sets was checked with the file; what is left is
                // the Redis URL a backend switched by VIGIA_STORE lacks.
                var: ENV
                    .iter()
                    .find(|(_, f, _)| *f == field)
                    .map_or("VIGIA_STORE", |(var, ..)| var),
                message: format!("{field}: {message}"),
            }),
        }
    }

    /// Every value that is well-typed but unusable, as (field, message).
    fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Err(m) = self.listen_addr() {
            out.push(("listen", m));
        }
        if self.workers > MAX_WORKERS {
            out.push((
                "workers",
                format!(
                    "{} is not within 0..={MAX_WORKERS} (0: by the store and the CPUs)",
                    self.workers
                ),
            ));
        }
        if self.store.timeout_ms == 0 || self.store.timeout_ms > 60_000 {
            out.push((
                "store.timeout_ms",
                format!("{} is not within 1..=60000", self.store.timeout_ms),
            ));
        }
        let b = &self.behaviour;
        for (field, value, range) in [
            (
                "store.breaker_failures",
                u64::from(self.store.breaker_failures),
                1..=1000,
            ),
            (
                "store.breaker_open_ms",
                self.store.breaker_open_ms,
                10..=60_000,
            ),
            (
                "store.record_horizon_ms",
                self.store.record_horizon_ms,
                1_000..=31_536_000_000,
            ),
            ("behaviour.shards", b.shards as u64, 1..=1024),
            ("behaviour.threads", b.threads as u64, 1..=64),
            ("behaviour.mailbox", b.mailbox as u64, 1..=1_000_000),
            ("behaviour.deadline_ms", b.deadline_ms, 1..=10_000),
            (
                "behaviour.max_entities",
                b.max_entities as u64,
                1..=1_000_000_000,
            ),
            (
                "behaviour.snapshot_every_ms",
                b.snapshot_every_ms,
                100..=3_600_000,
            ),
            (
                "ops.sample_every_ms",
                self.ops.sample_every_ms,
                100..=3_600_000,
            ),
            (
                "over_limit.max_keys",
                self.over_limit.max_keys as u64,
                0..=100_000_000,
            ),
            ("over_limit.hold_ms", self.over_limit.hold_ms, 1..=60_000),
            (
                "http.request_timeout_ms",
                self.http.request_timeout_ms,
                100..=600_000,
            ),
            ("http.keep_alive_ms", self.http.keep_alive_ms, 0..=3_600_000),
            (
                "http.max_connections_per_worker",
                self.http.max_connections_per_worker.map_or(1, |n| n as u64),
                1..=1_000_000,
            ),
        ] {
            if !range.contains(&value) {
                out.push((
                    field,
                    format!("{value} is not within {}..={}", range.start(), range.end()),
                ));
            }
        }
        let prefix = &self.store.key_prefix;
        let prefix_ok = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !prefix_ok {
            out.push((
                "store.key_prefix",
                format!("{prefix:?} must be 1-64 characters of [A-Za-z0-9_]"),
            ));
        }
        if let Some(r) = &self.record {
            if r.path.as_os_str().is_empty() {
                out.push(("record.path", "must name a folder".into()));
            }
            if r.max_bytes < RecordConfig::MIN_MAX_BYTES {
                out.push((
                    "record.max_bytes",
                    format!(
                        "{} is less than {} (1 MiB)",
                        r.max_bytes,
                        RecordConfig::MIN_MAX_BYTES
                    ),
                ));
            }
        }
        if self.store.backend != StoreBackend::Embedded && self.store.redis_url.trim().is_empty() {
            out.push((
                "store.redis_url",
                "empty while the backend is Redis; set it in config.toml or VIGIA_REDIS_URL".into(),
            ));
        }
        out
    }

    /// How many HTTP workers serve checks: `workers`, or by default one per CPU on the
    /// embedded store and two per CPU on Redis. A check on Redis waits for a round trip,
    /// and on a machine whose cores are shared with Redis (and here a load generator), one
    /// worker per core left a core idle while both waited: on 2 cores, 4 workers answered
    /// ~10 % more checks per second than 2 with a lower p99 (eight alternating `wrk` runs).
    /// An embedded check never waits, and more workers than cores only made its p99 worse
    /// (~10 ms against ~5 ms) at the same rate.
    pub fn worker_threads(&self) -> usize {
        if self.workers > 0 {
            return self.workers;
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        match self.store.backend {
            StoreBackend::Embedded => cpus,
            StoreBackend::Redis | StoreBackend::RedisCluster => 2 * cpus,
        }
    }

    /// The socket address to listen on.
    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.listen.parse().map_err(|e| {
            format!(
                "{:?} is not an address like 127.0.0.1:8080 ({e})",
                self.listen
            )
        })
    }
}

/// The line where `field`'s last segment is assigned, or 0 when it is not in the text
/// (a default).
fn line_of_key(text: &str, field: &str) -> usize {
    let leaf = field.rsplit('.').next().unwrap_or(field);
    text.lines()
        .position(|l| {
            l.trim_start()
                .strip_prefix(leaf)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(0, |i| i + 1)
}

/// 1-based line of a byte offset.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_shape_parses() {
        let c = Config::from_toml(
            "config.toml",
            r#"
listen = "127.0.0.1:9000"
rules_dir = "rules"
data_dir = "data"
[store]
backend = "redis"
redis_url = "redis://127.0.0.1:6380"
timeout_ms = 50
key_prefix = "lt"
[auth]
admin_token = ""
check_token = ""
"#,
        )
        .unwrap();
        assert_eq!(c.store.backend, StoreBackend::Redis);
        assert_eq!(c.listen_addr().unwrap().port(), 9000);
    }

    #[test]
    fn logging_is_json_and_no_decision_lines_unless_asked() {
        let c = Config::from_toml("c.toml", "").unwrap();
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.decision_log, DecisionLogMode::Off);
        let c = Config::from_toml(
            "c.toml",
            "log_format = \"text\"\ndecision_log = \"clear\"\n",
        )
        .unwrap();
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.decision_log, DecisionLogMode::Clear);
        let err = Config::from_toml(
            "c.toml",
            "listen = \"127.0.0.1:1\"\ndecision_log = \"all\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("c.toml:2:"), "{err}");
        assert!(err.contains("off") && err.contains("hashed"), "{err}");
    }

    #[test]
    fn unknown_field_names_file_and_line() {
        let err = Config::from_toml("c.toml", "listen = \"127.0.0.1:1\"\n[store]\ntimeout = 5\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("c.toml:3:"), "{err}");
        assert!(err.contains("timeout"), "{err}");
    }

    #[test]
    fn bad_backend_names_line() {
        let err = Config::from_toml("c.toml", "[store]\nbackend = \"memcached\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("c.toml:2:"), "{err}");
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_variable_of_the_table_overrides_its_field() {
        let mut c = Config::default();
        c.apply_env(env(&[
            ("VIGIA_LISTEN", "127.0.0.1:7000"),
            ("VIGIA_WORKERS", "6"),
            ("VIGIA_RULES_DIR", "/etc/vigia/rules"),
            ("VIGIA_DATA_DIR", "/var/lib/vigia"),
            ("VIGIA_STORE", "redis_cluster"),
            ("VIGIA_REDIS_URL", "redis://a:7001,redis://b:7001"),
            ("VIGIA_KEY_PREFIX", "campaign2"),
            ("VIGIA_ADMIN_TOKEN", "adm"),
            ("VIGIA_CHECK_TOKEN", "chk"),
            ("VIGIA_LOG_FORMAT", "text"),
            ("VIGIA_DECISION_LOG", "hashed"),
            ("PATH", "/usr/bin"),
        ]))
        .unwrap();
        let c = c.validated().unwrap();
        assert_eq!(c.listen, "127.0.0.1:7000");
        assert_eq!((c.workers, c.worker_threads()), (6, 6));
        assert_eq!(c.rules_dir, Path::new("/etc/vigia/rules"));
        assert_eq!(c.data_dir, Path::new("/var/lib/vigia"));
        assert_eq!(c.store.backend, StoreBackend::RedisCluster);
        assert_eq!(c.store.redis_url, "redis://a:7001,redis://b:7001");
        assert_eq!(c.store.key_prefix, "campaign2");
        assert_eq!(c.auth.admin_token, "adm");
        assert_eq!(c.auth.check_token, "chk");
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.decision_log, DecisionLogMode::Hashed);
        // The table is API.md's list (and the worker count and the two logging switches),
        // each variable once.
        let vars: Vec<&str> = ENV.iter().map(|(v, ..)| *v).collect();
        assert_eq!(
            vars,
            [
                "VIGIA_LISTEN",
                "VIGIA_WORKERS",
                "VIGIA_RULES_DIR",
                "VIGIA_DATA_DIR",
                "VIGIA_STORE",
                "VIGIA_REDIS_URL",
                "VIGIA_KEY_PREFIX",
                "VIGIA_ADMIN_TOKEN",
                "VIGIA_CHECK_TOKEN",
                "VIGIA_LOG_FORMAT",
                "VIGIA_DECISION_LOG"
            ]
        );
    }

    #[test]
    fn workers_default_to_the_cpus_twice_on_redis_and_are_bounded() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut c = Config::default();
        assert_eq!(c.worker_threads(), cpus);
        c.store.backend = StoreBackend::Redis;
        assert_eq!(c.worker_threads(), 2 * cpus);
        let c = Config::from_toml("c.toml", "listen = \"127.0.0.1:1\"\nworkers = 3\n").unwrap();
        assert_eq!(c.worker_threads(), 3);
        let err = Config::from_toml("c.toml", "listen = \"127.0.0.1:1\"\nworkers = 5000\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("c.toml:2: workers: 5000"), "{err}");
        let err = Config::default()
            .apply_env(env(&[("VIGIA_WORKERS", "many")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("VIGIA_WORKERS") && err.contains("many"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_variable_is_an_error_naming_it() {
        let err = Config::default()
            .apply_env(env(&[("VIGIA_STORE", "foo")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("VIGIA_STORE") && err.contains("foo"), "{err}");
        let err = Config::default()
            .apply_env(env(&[("VIGIA_LOG_FORMAT", "xml")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("VIGIA_LOG_FORMAT") && err.contains("json, text"),
            "{err}"
        );
        let err = Config::default()
            .apply_env(env(&[("VIGIA_DECISION_LOG", "yes")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("VIGIA_DECISION_LOG") && err.contains("off, hashed, clear"),
            "{err}"
        );
        let mut c = Config::default();
        c.apply_env(env(&[("VIGIA_KEY_PREFIX", "lt:x")])).unwrap();
        let err = c.validated().unwrap_err().to_string();
        assert!(err.contains("VIGIA_KEY_PREFIX"), "{err}");
        let mut c = Config::default();
        c.apply_env(env(&[("VIGIA_STORE", "redis")])).unwrap();
        let err = c.validated().unwrap_err().to_string();
        assert!(
            err.contains("VIGIA_REDIS_URL") && err.contains("store.redis_url"),
            "{err}"
        );
    }

    #[test]
    fn relative_paths_of_a_file_are_taken_from_its_folder() {
        let mut c = Config::from_toml(
            "/etc/vigia/config.toml",
            "rules_dir = \"rules\"\ndata_dir = \"/var/lib/vigia\"\n[record]\npath = \"traffic\"\n",
        )
        .unwrap();
        c.relative_to(Path::new("/etc/vigia"));
        assert_eq!(c.rules_dir, Path::new("/etc/vigia/rules"));
        assert_eq!(c.data_dir, Path::new("/var/lib/vigia"));
        assert_eq!(
            c.record.map(|r| r.path),
            Some(PathBuf::from("/etc/vigia/traffic"))
        );
        // The environment's paths are the operator's, from the working directory.
        let mut c = Config::default();
        c.relative_to(Path::new("/etc/vigia"));
        c.apply_env(env(&[("VIGIA_RULES_DIR", "my-rules")]))
            .unwrap();
        assert_eq!(c.rules_dir, Path::new("my-rules"));
        assert_eq!(c.data_dir, Path::new("/etc/vigia/data"));
    }

    #[test]
    fn invalid_values_name_file_line_and_field() {
        let err = Config::from_toml(
            "c.toml",
            "listen = \"127.0.0.1:1\"\n[store]\ntimeout_ms = 0\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("c.toml:3: store.timeout_ms"), "{err}");
        let err = Config::from_toml("c.toml", "[store]\nkey_prefix = \"lt:x\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("c.toml:2: store.key_prefix"), "{err}");
        let err = Config::from_toml("c.toml", "listen = \"nowhere\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("c.toml:1: listen"), "{err}");
    }

    #[test]
    fn record_is_off_unless_its_section_is_there_and_is_checked_when_it_is() {
        assert_eq!(Config::from_toml("c.toml", "").unwrap().record, None);
        let c = Config::from_toml("c.toml", "[record]\npath = \"data/traffic\"\n").unwrap();
        assert_eq!(
            c.record,
            Some(RecordConfig {
                path: "data/traffic".into(),
                max_bytes: RecordConfig::DEFAULT_MAX_BYTES,
            })
        );
        let err = Config::from_toml("c.toml", "[record]\npath = \"t\"\nmax_bytes = 10\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("c.toml:3: record.max_bytes"), "{err}");
        let err = Config::from_toml("c.toml", "[record]\nmax_bytes = 2000000\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("path"), "{err}");
    }

    #[test]
    fn http_bounds_have_defaults_and_bad_ones_name_their_field() {
        let c = Config::from_toml("c.toml", "").unwrap();
        assert_eq!(
            (
                c.http.request_timeout_ms,
                c.http.keep_alive_ms,
                c.http.max_connections_per_worker
            ),
            (5_000, 5_000, None)
        );
        let c = Config::from_toml(
            "c.toml",
            "[http]\nrequest_timeout_ms = 1000\nkeep_alive_ms = 0\nmax_connections_per_worker = 64\n",
        )
        .unwrap();
        assert_eq!(
            (
                c.http.request_timeout_ms,
                c.http.keep_alive_ms,
                c.http.max_connections_per_worker
            ),
            (1_000, 0, Some(64))
        );
        for (text, field) in [
            (
                "[http]\nrequest_timeout_ms = 0\n",
                "c.toml:2: http.request_timeout_ms: 0",
            ),
            (
                "[http]\nkeep_alive_ms = 5000\nmax_connections_per_worker = 0\n",
                "c.toml:3: http.max_connections_per_worker: 0",
            ),
        ] {
            let err = Config::from_toml("c.toml", text).unwrap_err().to_string();
            assert!(err.starts_with(field), "{err}");
        }
    }

    #[test]
    fn invalid_environment_names_the_variable() {
        let mut c = Config::default();
        c.apply_env(env(&[("VIGIA_LISTEN", "nowhere")])).unwrap();
        let err = c.validated().unwrap_err().to_string();
        assert!(err.contains("VIGIA_LISTEN"), "{err}");
    }
}
