//! One rule file's text and display path: turns byte offsets into the `FILE:LINE` of an
//! error, so nothing else has to know how lines are counted.

use std::ops::Range;

use crate::rules::RuleError;

/// A rule file as read: the path errors show, and its contents.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The path as errors display it (`rules/coupon_claim.toml`).
    pub file: &'a str,
    pub text: &'a str,
}

impl<'a> Source<'a> {
    /// A source for `text` shown as `file`.
    pub fn new(file: &'a str, text: &'a str) -> Self {
        Source { file, text }
    }

    /// The 1-based line holding byte `offset` (past the end: the last line).
    pub fn line_of(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        let before = self.text.as_bytes().get(..end).unwrap_or_default();
        1 + before.iter().filter(|&&b| b == b'\n').count()
    }

    /// An error at the start of `span`.
    pub fn error(&self, span: &Range<usize>, message: impl Into<String>) -> RuleError {
        RuleError {
            file: self.file.to_string(),
            line: self.line_of(span.start),
            message: message.into(),
        }
    }
}
