//! Scenarios: synthetic traffic from a description of who arrives, for `vigia simulate`
//! to replay against a rule set before the real drop does.
//!
//! A scenario is a TOML file naming populations — honest users at home, users behind a
//! shared NAT (a campus, an office), attacker cohorts (a device farm, spoofed
//! fingerprints, behind proxies) — when they arrive (over the span, or a share of real
//! users in a rush at the opening), how often each passes a challenge (`challenge_pass`),
//! and what an attacker's accounts, proxy addresses, devices and solved challenges cost
//! it (`cost`). Generating it writes a traffic file (see [`super::traffic`]): a cohort
//! line per priced label, payment events, then every claim in time order, each saying
//! whether its sender would pass a challenge.
//!
//! This module owns the file format and its validation ([`Scenario::load`],
//! [`Scenario::parse`]) and the generation ([`write`]). Generation is seeded and
//! reproducible — the same file and seed give the same bytes — because a rule change is
//! judged by replaying the *same* traffic before and after it.
//!
//! - `raw` — the on-disk model (serde, spans for line numbers).
//! - `spec` — validation into [`Scenario`].
//! - `net` — residential networks, addresses in a CIDR, distinct samples.
//! - `generate` — populations to sorted lines.

mod generate;
mod net;
mod raw;
mod spec;

pub use generate::{write, Summary};
pub use spec::{
    Attacker, Devices, Habits, Honest, Nat, Proxies, Rush, Scenario, MAX_CHECKS, MAX_COUNT,
    PEOPLE_PASS,
};

/// Why a scenario file was refused. Each names the file; most name the line and field.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The text is not TOML.
    #[error("{file}:{line}: invalid TOML: {message}")]
    Syntax {
        file: String,
        line: usize,
        message: String,
    },
    /// A field is missing, unknown, of the wrong type or out of range.
    #[error("{file}:{line}: {field}: {message}")]
    Invalid {
        file: String,
        line: usize,
        /// The field's path: `seed`, `honest.users`, `nat[0].addresses`.
        field: String,
        message: String,
    },
    /// Nothing to generate.
    #[error("{file}: no population: add [honest], [[nat]] or [[attacker]]")]
    Empty { file: String },
    /// More checks than can be sorted in memory.
    #[error("{file}: the scenario makes {checks} checks; at most {max} (every line is sorted in memory)", max = MAX_CHECKS)]
    TooBig { file: String, checks: u64 },
}

#[cfg(test)]
mod tests;
