//! The integration suite: one binary (one link), one module per capability.

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod challenge;
mod client_example;
mod clock;
mod cluster;
mod cluster_copies;
mod cluster_parity;
mod connections;
mod data_dir;
mod decide_suite;
mod dimensions;
mod dry_run;
mod durability;
mod events;
mod faults;
mod http_check;
mod http_errors;
mod ip_prefix;
mod limits_script;
mod logging;
mod openapi;
mod ops;
mod ops_data;
mod ops_page;
mod over_limit;
mod records;
mod refund_given_back;
mod reload;
mod reload_errors;
mod scoring;
mod signals_shared;
mod simulate;
mod stall;
mod store_down_at_start;
mod store_embedded;
mod store_redis;
mod store_suite;
mod strict_bodies;
mod sweep;
