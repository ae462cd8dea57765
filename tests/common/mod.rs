//! Shared test helpers. Each integration test binary includes this with `mod common;`.
#![allow(dead_code, unused_imports)]

pub mod redis_server;

pub use redis_server::{free_port, RedisServer};
