//! The "one script call" floor of `benches/load.py`: a bare actix-web + serde server that
//! runs one EVALSHA of the script the service runs for the bench scene (the one
//! `vigia::store::limits_script` makes for its shape of limits, the service's own code)
//! per request, with the bench scene's four limits (`benches/rules/bench.toml`) and a
//! fresh request id each time, and answers 200 on allow, 429 on deny. No rules, no
//! breaker, no metrics: the least an HTTP service doing one script call per check can
//! cost.
//!
//! Each actix worker opens its own multiplexed connection on its first request, so the
//! connection's driver runs on the worker's runtime and a request never crosses threads.
//!
//! Usage: `cargo run --release --example floor_redis -- 127.0.0.1:PORT redis://127.0.0.1:6379`

use actix_web::{web, App, HttpResponse, HttpServer};
use redis::aio::MultiplexedConnection;
use redis::{Script, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;
use vigia::rules::Algorithm;
use vigia::store::limits_script::Shape;

/// The service's default `record_horizon_ms` (config.toml): the request record's TTL.
const RECORD_TTL_MS: u64 = 3_600_000;

/// The bench scene's limits (algorithm, window_ms, max, retain_ms), in the order of the
/// limit keys below.
const LIMITS: [(Algorithm, u64, u64, u64); 4] = [
    (Algorithm::SlidingWindow, 10_000, 3, 10_000), // user_10s
    (Algorithm::SlidingWindow, 86_400_000, 10, 86_400_000), // device_1d
    (Algorithm::FixedWindow, 60_000, 100, 60_000), // ip_60s
    (Algorithm::FixedWindow, 60_000, 100_000_000, 60_000), // activity_60s
];

/// The script the service makes for the bench scene's shape (no two limits share a key).
fn shaped_lua() -> String {
    let keys = ["u", "d", "i", "a"];
    let limits = LIMITS
        .iter()
        .zip(keys)
        .map(|(&(a, w, m, r), k)| (k, a, w, m, r));
    Shape::of(limits).expect("four limits fit a shape").lua()
}

#[derive(Deserialize)]
struct Check {
    scene: String,
    user_id: String,
    device_id: String,
    ip: String,
    activity_id: String,
}

#[derive(Serialize)]
struct Answer {
    decision: &'static str,
}

/// One per actix worker (the app factory runs on each worker's thread).
struct Worker {
    client: redis::Client,
    conn: OnceCell<MultiplexedConnection>,
    script: Script,
}

impl Worker {
    async fn conn(&self) -> redis::RedisResult<MultiplexedConnection> {
        self.conn
            .get_or_try_init(|| self.client.get_multiplexed_async_connection())
            .await
            .cloned()
    }
}

async fn check(worker: web::Data<Worker>, body: web::Json<Check>) -> HttpResponse {
    match run_check(&worker, &body).await {
        Ok(true) => HttpResponse::Ok().json(Answer { decision: "allow" }),
        Ok(false) => HttpResponse::TooManyRequests().json(Answer {
            decision: "friendly_deny",
        }),
        // A floor has no policy for a store error; 503 keeps it visible as non-2xx.
        Err(_) => HttpResponse::ServiceUnavailable().json(Answer { decision: "error" }),
    }
}

/// Whether check.lua allowed the request (a duplicate cannot happen: ids are fresh).
async fn run_check(worker: &Worker, body: &Check) -> redis::RedisResult<bool> {
    let scene = &body.scene;
    let request_id = ulid::Ulid::generate().to_string();
    let records_key = format!("lt:{scene}:rq:uid:{}", body.user_id);
    let ip_key = format!("lt:{scene}:fw:ip_60s:ip:{}", body.ip);
    let activity_key = format!("lt:{scene}:fw:activity_60s:aid:{}", body.activity_id);
    // The request record's entries: the two fixed windows, by tag (lua/limits.lua).
    let mut entries = Vec::with_capacity(14);
    for key in [&ip_key, &activity_key] {
        entries.push(b'f');
        entries.extend_from_slice(&vigia::store::redis::record_tag(key));
    }
    let mut inv = worker.script.prepare_invoke();
    // KEYS: the records key, the limits.
    inv.key(&records_key)
        .key(format!("lt:{scene}:uid:{}", body.user_id))
        .key(format!("lt:{scene}:did:{}", body.device_id))
        .key(&ip_key)
        .key(&activity_key);
    // ARGV: request id, not a dry run, no repeat to look for (the id is fresh), record
    // TTL, Redis TIME, no idempotency key, the record's entries, then each limit's max.
    inv.arg(&request_id)
        .arg("0")
        .arg("")
        .arg(RECORD_TTL_MS)
        .arg("")
        .arg("")
        .arg(entries);
    for (_, _, max, _) in LIMITS {
        inv.arg(max);
    }
    let mut conn = worker.conn().await?;
    // The shaped script's reply is one string: `allow|…`, `deny|…` or `dup|…`.
    let reply: Value = inv.invoke_async(&mut conn).await?;
    Ok(matches!(reply, Value::BulkString(text) if text.starts_with(b"allow")))
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let client = redis::Client::open(url).map_err(std::io::Error::other)?;
    let lua = shaped_lua();
    HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(Worker {
                client: client.clone(),
                conn: OnceCell::new(),
                script: Script::new(&lua),
            }))
            .route("/v1/check", web::post().to(check))
    })
    .bind(listen)?
    .run()
    .await
}
