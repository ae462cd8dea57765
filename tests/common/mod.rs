//! Shared test helpers. Each integration test binary includes this with `mod common;`.
#![allow(dead_code, unused_imports)]

pub mod app;
pub mod redis_server;

pub use app::{body, limit, scene, spawn_app, spawn_app_configured, spawn_app_with, TestApp};
pub use redis_server::{free_port, RedisServer};
