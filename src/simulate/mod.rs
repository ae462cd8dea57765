//! Backtesting: replay traffic against a rule set offline, and make traffic to replay.
//!
//! - [`traffic`] — the line format shared by `vigia scenario`, `[record]` and
//!   `vigia simulate`.
//! - [`scenario`] — synthetic traffic from a description of populations (honest users,
//!   shared NATs, attacker cohorts), seeded and reproducible.

pub mod scenario;
pub mod traffic;
