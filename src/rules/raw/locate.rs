//! Finds which field a deserialization error is about.
//!
//! The toml crate reports a serde error with a byte span but keeps the key path private.
//! Operators need the field named (`scene.x.gateway.burst: invalid type ...`), so this
//! walks the parsed value to the deepest key or element the span points into.

use std::ops::Range;

use toml::de::DeValue;
use toml::Spanned;

/// The path, relative to `root`, of the deepest key or element that `span` points into:
/// `.gateway.burst`, `[2]`, or empty when the span is `root` itself.
pub fn path_to(root: &Spanned<DeValue<'_>>, span: &Range<usize>) -> String {
    let mut segments = Vec::new();
    descend(root.get_ref(), span, &mut segments);
    segments.concat()
}

/// Pushes the segments leading to `target` under `value`; false when none matches.
///
/// Every child is searched, not only those whose span covers the target: a table made
/// implicitly by a header such as `[[scene.x.limits]]` may not carry a covering span.
fn descend(value: &DeValue<'_>, target: &Range<usize>, out: &mut Vec<String>) -> bool {
    match value {
        DeValue::Table(table) => table.iter().any(|(key, child)| {
            out.push(key_segment(key.get_ref()));
            let found = covers(&key.span(), target) || descend(child.get_ref(), target, out) || {
                covers(&child.span(), target)
            };
            if !found {
                out.pop();
            }
            found
        }),
        DeValue::Array(array) => array.iter().enumerate().any(|(i, child)| {
            out.push(format!("[{i}]"));
            let found = descend(child.get_ref(), target, out) || covers(&child.span(), target);
            if !found {
                out.pop();
            }
            found
        }),
        _ => false,
    }
}

fn covers(span: &Range<usize>, target: &Range<usize>) -> bool {
    span == target
        || (span.start < span.end && span.start <= target.start && target.end <= span.end)
}

/// `.key`, or `."odd key"` when the key is not a bare TOML key.
pub fn key_segment(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        format!(".{key}")
    } else {
        format!(".{key:?}")
    }
}
