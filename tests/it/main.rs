//! The integration suite: one binary (one link), one module per capability.

#[path = "../common/mod.rs"]
mod common;

mod store_redis;
mod sweep;
