//! vigia: multi-dimensional rate limiting and risk scoring for marketing APIs.
//!
//! The check path, stage by stage: `http` (actix-web) -> `check` (validate, gateway, plan)
//! -> `decide` (trust, signals, score and limits in one step on the `store`) -> back in
//! `check`, one [`Decision`](check::decision::Decision) value, which `http` turns into the
//! response in one place. `refund` gives a request's quota back (`/v1/refund`, and the
//! rollback events of `trust`, which turns payment and identity events into points).
//! `rules` holds the operators' rule set; `config` the service's own settings; `sweep` the
//! maintenance tool; `app` builds and wires them all.
//!
//! Imports go down, never back to a caller: `keys` (every store key's name) and `input`
//! (the validation error and the field readers) sit below `check`, `refund`, `trust` and
//! `decide`, so `check` and `trust` never import each other and `decide` never imports
//! `check`. Likewise `signal` (a signal's plan, answer, arithmetic and hashing) sits below
//! `check`, `decide` and `behaviour`: the embedded decider calls the behaviour actors, and
//! the actors share the signal's definition without importing the decider.

pub mod app;
pub mod behaviour;
pub mod check;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod data_dir;
pub mod decide;
pub mod decision_log;
pub mod http;
pub mod input;
pub mod invalidating;
pub mod keys;
pub mod metrics;
pub mod open_files;
pub mod record;
pub mod refund;
pub mod rules;
pub mod signal;
pub mod simulate;
pub mod sled_db;
pub mod store;
pub mod strict_json;
pub mod sweep;
pub mod trust;
