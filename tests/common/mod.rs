//! Shared test helpers. Each integration test binary includes this with `mod common;`.
#![allow(dead_code, unused_imports)]

pub mod app;
pub mod chromium;
pub mod load;
pub mod proxy;
pub mod redis_cluster;
pub mod redis_server;
pub mod served;

pub use app::{body, limit, scene, spawn_app, spawn_app_configured, spawn_app_with, TestApp};
pub use load::{percentile, run_checks, timed_check, Sample};
pub use proxy::TcpProxy;
pub use redis_cluster::RedisCluster;
pub use redis_server::{free_port, DebugSleep, RedisServer};
