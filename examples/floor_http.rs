//! The HTTP floor of `benches/load.sh`: a bare actix-web server that parses the bench
//! scene's check body into a struct with serde and answers a small JSON, with no store and
//! no rules. Whatever vigia spends above this per request is its own work plus the store's.
//!
//! Usage: `cargo run --release --example floor_http -- 127.0.0.1:PORT`
//! (POST /v1/check with the body of `benches/wrk/check.lua`.)

use actix_web::{web, App, HttpResponse, HttpServer};
use serde::{Deserialize, Serialize};

/// The body `benches/wrk/check.lua` sends; every field is read, as a check would.
#[derive(Deserialize)]
struct Check {
    scene: String,
    user_id: String,
    device_id: String,
    ip: String,
    activity_id: String,
}

#[derive(Serialize)]
struct Answer<'a> {
    decision: &'static str,
    scene: &'a str,
    /// Total length of the identifiers: keeps the parse from being optimised away.
    seen: usize,
}

async fn check(body: web::Json<Check>) -> HttpResponse {
    let seen = body.user_id.len() + body.device_id.len() + body.ip.len() + body.activity_id.len();
    HttpResponse::Ok().json(Answer {
        decision: "allow",
        scene: &body.scene,
        seen,
    })
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    HttpServer::new(|| App::new().route("/v1/check", web::post().to(check)))
        .bind(listen)?
        .run()
        .await
}
