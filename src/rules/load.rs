//! in progress
use super::RuleSet;
use std::path::Path;

/// One problem in a rule file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct RuleError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// Every problem found in a rule folder, in file then line order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct RuleErrors(pub Vec<RuleError>);

/// Reads every `*.toml` in `dir` into one rule set.
pub fn load_dir(_dir: &Path) -> Result<RuleSet, RuleErrors> {
    Err(RuleErrors(vec![]))
}
