//! Backtesting: replay traffic against a rule set offline, and make traffic to replay.
//!
//! - [`traffic`] — the line format shared by `vigia scenario`, `[record]` and
//!   `vigia simulate`.
//! - [`replay`] — `vigia simulate`: each line through the real check path on a private
//!   store and a simulated clock; [`report`] — what it found, per label.
//! - [`scenario`] — synthetic traffic from a description of populations (honest users,
//!   shared NATs, attacker cohorts), seeded and reproducible.

pub mod replay;
pub mod report;
pub mod scenario;
pub mod traffic;

pub use replay::{run, Options, Progress, SimulateError};
pub use report::Report;
