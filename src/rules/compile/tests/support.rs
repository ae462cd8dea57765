//! Helpers: a small valid scene to break one thing at a time, and error lookups.

use crate::rules::{compile_files, RuleError, RuleSet};

/// The display path the single-file helpers use.
pub const FILE: &str = "rules/t.toml";

/// A valid scene with two limits (user, ip); tests break one thing in it.
pub const BASE: &str = r#"[scene.s]
on_store_error = "fail_close"
required = ["user", "ip"]

[[scene.s.limits]]
name = "user_10s"
dimensions = ["user"]
algorithm = "sliding_window"
window = "10s"
max = 1

[[scene.s.limits]]
name = "ip_1m"
dimensions = ["ip"]
algorithm = "fixed_window"
window = "1m"
max = 100
"#;

/// `BASE` with the first `from` replaced by `to`; panics if `from` is not there, so a
/// test cannot silently stop breaking anything.
pub fn base_with(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "BASE has no {from:?}");
    BASE.replacen(from, to, 1)
}

/// Compiles one file that must be valid.
pub fn ok(text: &str) -> RuleSet {
    compile_files(&[(FILE.to_string(), text.to_string())])
        .unwrap_or_else(|e| panic!("expected valid rules, got:\n{e}"))
}

/// Compiles files that must be invalid; their errors.
pub fn errors(files: &[(&str, &str)]) -> Vec<RuleError> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect();
    match compile_files(&files) {
        Ok(_) => panic!("expected errors, the rules compiled"),
        Err(e) => e.0,
    }
}

/// Compiles one file that must have exactly one error; that error.
pub fn single(text: &str) -> RuleError {
    let mut errs = errors(&[(FILE, text)]);
    assert_eq!(errs.len(), 1, "expected one error, got {errs:#?}");
    errs.remove(0)
}

/// The 1-based line of the first occurrence of `needle` in `text`.
pub fn line_of(text: &str, needle: &str) -> usize {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in text"));
    text[..at].matches('\n').count() + 1
}

/// Asserts `err` is in `FILE` at the line of `needle`, and its message starts with
/// `field: ` and contains every piece of `says`.
pub fn assert_error(err: &RuleError, text: &str, needle: &str, field: &str, says: &[&str]) {
    assert_eq!(err.file, FILE, "{err}");
    assert_eq!(err.line, line_of(text, needle), "wrong line: {err}");
    assert!(
        err.message.starts_with(&format!("{field}: ")),
        "message does not name {field}: {err}"
    );
    for piece in says {
        assert!(
            err.message.contains(piece),
            "message lacks {piece:?}: {err}"
        );
    }
}

/// The last line of `to`: where an edit that adds lines puts the broken one.
pub fn last_line(to: &str) -> &str {
    to.lines().last().unwrap_or(to)
}

/// One file with one broken thing: `from` -> `to` in BASE must give exactly one error at
/// the line of `to` (its last line, when it adds lines), naming `field` and saying `says`.
pub fn breaks(from: &str, to: &str, field: &str, says: &[&str]) {
    let text = base_with(from, to);
    let err = single(&text);
    assert_error(&err, &text, last_line(to), field, says);
}
