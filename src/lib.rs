//! vigia: multi-dimensional rate limiting and risk scoring for marketing APIs.
//!
//! The check path, stage by stage: `http` (actix-web) -> `check` (validate, gateway,
//! keys, decision, response) -> `store` (one atomic round trip). `rules` holds the
//! operators' rule set; `config` the service's own settings; `sweep` the maintenance tool.

pub mod app;
pub mod behaviour;
pub mod check;
pub mod cli;
pub mod clock;
pub mod config;
pub mod decide;
pub mod http;
pub mod input;
pub mod keys;
pub mod metrics;
pub mod record;
pub mod refund;
pub mod rules;
pub mod simulate;
pub mod store;
pub mod sweep;
pub mod trust;
