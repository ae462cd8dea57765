//! The window store: where the counted limits of a check are evaluated, atomically.
//!
//! One check is one [`CheckOp`]: every limit of the scene, each with its store key and its
//! effective max. The store evaluates all of them in one atomic step (one EVALSHA on Redis)
//! and either records the request in every key or in none: a denied request consumes
//! nothing in any dimension. Whose clock counts: the store's (Redis `TIME`), unless a test
//! injects one. A deny is a value ([`CheckOutcome::Denied`]), not an error; only a store
//! that cannot answer is an error ([`StoreError`]).

pub mod breaker;
pub mod embedded;
pub mod limits_script;
pub mod redis;
pub mod redis_link;
pub mod release;

use async_trait::async_trait;

use crate::rules::Algorithm;

/// The margin an expiry gets past the end of the window it protects. Keeps the promise of
/// API.md: a key lives as long as it holds a member inside its window and about a second
/// more, never less.
pub const EXPIRY_MARGIN_MS: u64 = 1000;

/// One limit of a check as the store sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitOp {
    /// Key in the store, already encoded (see [`crate::keys`]).
    pub key: String,
    pub algorithm: Algorithm,
    pub window_ms: u64,
    /// Effective max (overrides, trust and new-account factors applied); >= 1.
    pub max: u64,
    /// Sliding windows only: the longest window of any sliding limit sharing `key`; the
    /// ZSET is trimmed to it and its expiry follows it. Equal to `window_ms` otherwise.
    pub retain_ms: u64,
}

/// Everything one check asks of the store.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOp {
    /// Key of the request record on the embedded store
    /// (`<prefix>:<scene>:req:<dim>:<value>:<request_id>`).
    pub record_key: String,
    /// Where Redis keeps the request and idempotency records of the check's first
    /// required entity (`<prefix>:<scene>:rq:<dim>:<value>`,
    /// [`crate::keys::KeySpace::records_key`]).
    pub records_key: String,
    /// Key of the idempotency record, when the check carries an idempotency key (on Redis,
    /// a field of the records hash named by its last segment).
    pub idempotency_key: Option<String>,
    pub request_id: String,
    /// The caller named `request_id`, so it may repeat an earlier check. An id the service
    /// made cannot: its record is not looked for (one lookup fewer per check, and on the
    /// embedded store a miss in its largest map).
    pub id_given: bool,
    /// How long the request and idempotency records live (the longest window, at least 1 s).
    pub record_ttl_ms: u64,
    /// Decide, but write nothing.
    pub dry_run: bool,
    pub limits: Vec<LimitOp>,
}

/// How one limit stood when the check was evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// Requests counted in the window, this one included when it was allowed. For token
    /// buckets: tokens spent (capacity minus tokens left, rounded up).
    pub count: u64,
    /// Whether this limit alone would have denied the request.
    pub exceeded: bool,
    /// When exceeded: ms until this limit would admit one more request.
    pub retry_after_ms: u64,
}

/// The store's answer to a [`CheckOp`]. `limits` is parallel to `CheckOp::limits`.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckOutcome {
    /// Recorded in every key (or would have been, on a dry run).
    Allowed { limits: Vec<LimitState> },
    /// At least one limit exceeded; nothing was written anywhere.
    Denied { limits: Vec<LimitState> },
    /// The request id, or the idempotency key, was already counted: nothing was written.
    /// `of` is the request id that was counted.
    Duplicate { of: String },
    /// Redis Cluster: the request id, or the idempotency key, names a reservation another
    /// attempt made and its node has not yet settled (allowed and committed, or denied and
    /// released): nothing was written. `of` is that attempt's request id.
    Held { of: String },
}

/// Everything one refund asks of the store. Serialisable: a `benefit_rolled_back` event
/// journals it so a replay refunds exactly the keys computed when the event was accepted.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RefundOp {
    /// The request's record on the embedded store; on Redis, a record written before
    /// 2026-12 (one key per request).
    pub record_key: String,
    /// Where Redis keeps the request's record (`CheckOp::records_key`). Empty in a refund
    /// journaled before 2026-12: only `record_key` is looked at.
    #[serde(default)]
    pub records_key: String,
    /// The scene's record TTL (`Scene::record_ttl_ms`): on Redis, the length of a
    /// generation of the records hash. 0 in a refund journaled before 2026-12.
    #[serde(default)]
    pub record_ttl_ms: u64,
    pub request_id: String,
    /// The keys the request may have counted in; only those the record names are touched.
    pub keys: Vec<String>,
}

/// What one refund gave back: for each of [`RefundOp::keys`], in order, whether that key
/// gave the request back (true too when the request's record named a fixed window that has
/// since rolled over: it holds nothing of the request any more). False for a key that held
/// nothing of it: one the check never counted in (a dimension value it did not carry, a
/// `where` it did not match), a sliding window that has moved past it, or a key refunded
/// before. Every key is false when the store does not know the request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refunded {
    pub keys: Vec<bool>,
}

impl Refunded {
    /// Whether any key gave something back (the API's `refunded`).
    pub fn any(&self) -> bool {
        self.keys.iter().any(|&k| k)
    }
}

/// A store that could not answer. Mapped to the scene's `on_store_error` by the check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store timed out after {0} ms")]
    Timeout(u64),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store replied with something unexpected: {0}")]
    Protocol(String),
    /// The circuit breaker is open: the store failed repeatedly and was not asked.
    #[error("store circuit breaker is open (the store failed repeatedly; not asked)")]
    CircuitOpen,
}

impl StoreError {
    /// Its name in the store-errors metric: `timeout`, `unavailable`, `protocol`,
    /// `circuit_open`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Protocol(_) => "protocol",
            StoreError::CircuitOpen => "circuit_open",
        }
    }
}

/// The atomic window store. Implementations must evaluate a whole [`CheckOp`] atomically
/// with respect to every other op on the same keys.
#[async_trait]
pub trait WindowStore: Send + Sync + 'static {
    /// Evaluates and (unless denied, duplicate or dry run) records one check.
    async fn check(&self, op: &CheckOp) -> Result<CheckOutcome, StoreError>;

    /// Gives back the quota a request consumed in every key it counted in, and says which
    /// of the op's keys gave something back.
    async fn refund_keys(&self, op: &RefundOp) -> Result<Refunded, StoreError>;

    /// [`WindowStore::refund_keys`], for a caller that needs only whether anything came
    /// back: `Ok(false)` when the request is unknown (never counted, expired, or already
    /// refunded).
    async fn refund(&self, op: &RefundOp) -> Result<bool, StoreError> {
        Ok(self.refund_keys(op).await?.any())
    }

    /// Whether the store answers now (for `/readyz`).
    async fn ping(&self) -> Result<(), StoreError>;

    /// Makes every write this store has acknowledged durable. The event journal calls it
    /// before it forgets an applied refund, so a crash cannot lose the refund while the
    /// journal no longer holds it. Redis keeps its own durability policy: nothing to do.
    async fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// A short name for logs and metrics (`redis`, `embedded`).
    fn kind(&self) -> &'static str;
}
