//! Reads a rules folder and names its content: which files make the rule set, what an
//! error in them looks like (`FILE:LINE: message`), and the version hash that tells
//! two rule sets apart.

use std::fs;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{compile_files, RuleSet};

/// One problem in a rule file. `line` is 1-based; 0 for a problem with the folder or
/// the file as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, utoipa::ToSchema)]
#[error("{file}:{line}: {message}")]
pub struct RuleError {
    /// The path as it was shown to the loader (`rules/coupon_claim.toml`).
    pub file: String,
    pub line: usize,
    /// Names the field: `scene.x.limits[1].window: "0s" is not a duration > 0 ...`.
    pub message: String,
}

/// Every problem found in a rule folder, in file then line order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct RuleErrors(pub Vec<RuleError>);

/// Reads every `*.toml` in `dir` into one rule set.
///
/// Only the folder itself is read (not sub-folders); hidden files (`.x.toml`, editors'
/// swap files) and other extensions are ignored. A folder without rule files is an
/// error, and so are rule files that define no scene: serving with no scenes would deny
/// or fail every check.
pub fn load_dir(dir: &Path) -> Result<RuleSet, RuleErrors> {
    let folder_error = |message: String| {
        RuleErrors(vec![RuleError {
            file: dir.display().to_string(),
            line: 0,
            message,
        }])
    };
    let entries = fs::read_dir(dir)
        .map_err(|e| folder_error(format!("cannot read the rules folder: {e}")))?;

    let mut files = Vec::new();
    let mut errors = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| folder_error(format!("cannot list the rules folder: {e}")))?;
        let name = entry.file_name();
        let path = dir.join(&name);
        let is_rule_file = !name.to_string_lossy().starts_with('.')
            && path.extension().is_some_and(|ext| ext == "toml")
            && path.is_file();
        if !is_rule_file {
            continue;
        }
        let shown = path.display().to_string();
        match fs::read_to_string(&path) {
            Ok(text) => files.push((shown, text)),
            Err(e) => errors.push(RuleError {
                file: shown,
                line: 0,
                message: format!("cannot read: {e}"),
            }),
        }
    }
    if files.is_empty() && errors.is_empty() {
        return Err(folder_error(format!(
            "no rule files (*.toml) in {}",
            dir.display()
        )));
    }
    match compile_files(&files) {
        // Files that define no scene at all (an emptied file, or one caught half-written
        // by a reload) would refuse every check: keep whatever serves instead.
        Ok(rules) if errors.is_empty() && rules.scenes.is_empty() => Err(folder_error(format!(
            "no scene in the rule files in {}",
            dir.display()
        ))),
        Ok(rules) if errors.is_empty() => Ok(rules),
        Ok(_) => Err(sorted(errors)),
        Err(RuleErrors(more)) => {
            errors.extend(more);
            Err(sorted(errors))
        }
    }
}

/// `errors` in file, then line order (stable: one line's errors keep their order).
pub(super) fn sorted(mut errors: Vec<RuleError>) -> RuleErrors {
    errors.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    RuleErrors(errors)
}

/// Lowercase hex SHA-256 over `(file name, contents)` pairs, sorted by name.
///
/// Each name and content is length-prefixed, so no two different sets of files hash the
/// same input (`a` + `bc` is not `ab` + `c`).
pub fn version_of<'a>(files: impl IntoIterator<Item = (String, &'a str)>) -> String {
    let mut files: Vec<(String, &str)> = files.into_iter().collect();
    files.sort();
    let mut hasher = Sha256::new();
    for (name, text) in files {
        for part in [name.as_bytes(), text.as_bytes()] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
    }
    hex::encode(hasher.finalize())
}
