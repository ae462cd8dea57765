//! The error collector of one file's compilation, and the value checks every part
//! shares (durations, integer ranges, fractions, names), so each message is worded once.
//!
//! Each check reports its own error and returns `None`; callers keep going, which is how
//! one run reports every problem.

use std::ops::Range;

use toml::Spanned;

use super::scene::SetFacts;
use crate::rules::raw::{Int, Source, Text};
use crate::rules::{parse_duration_ms, Dimension, Filter, RuleError};

/// Collects the errors of one source file.
pub struct Diag<'s, 'e> {
    pub src: Source<'s>,
    errors: &'e mut Vec<RuleError>,
}

impl<'s, 'e> Diag<'s, 'e> {
    /// Reports into `errors`, located in `src`.
    pub fn new(src: Source<'s>, errors: &'e mut Vec<RuleError>) -> Self {
        Diag { src, errors }
    }

    /// Reports `message` at the line of `span`.
    pub fn at(&mut self, span: &Range<usize>, message: String) {
        self.errors.push(self.src.error(span, message));
    }

    /// `FILE:LINE` of `span`, for messages that point at another place.
    pub fn place(&self, span: &Range<usize>) -> String {
        format!("{}:{}", self.src.file, self.src.line_of(span.start))
    }

    /// A duration > 0 in milliseconds.
    pub fn duration(&mut self, path: &str, value: &Text) -> Option<u64> {
        let ms = parse_duration_ms(value.get_ref());
        if ms.is_none() {
            self.at(
                &value.span(),
                format!(
                    "{path}: {:?} is not a duration > 0 (use ms, s, m, h, d)",
                    value.get_ref()
                ),
            );
        }
        ms
    }

    /// An integer >= `min`.
    pub fn at_least(&mut self, path: &str, value: &Int, min: u64) -> Option<u64> {
        let n = *value.get_ref();
        match u64::try_from(n) {
            Ok(n) if n >= min => Some(n),
            _ => {
                self.at(
                    &value.span(),
                    format!("{path}: {n} is not an integer >= {min}"),
                );
                None
            }
        }
    }

    /// An integer >= `min` that fits a `u32`.
    pub fn at_least_u32(&mut self, path: &str, value: &Int, min: u32) -> Option<u32> {
        let n = self.at_least(path, value, u64::from(min))?;
        let fits = u32::try_from(n).ok();
        if fits.is_none() {
            self.at(
                &value.span(),
                format!("{path}: {n} is too large (at most {})", u32::MAX),
            );
        }
        fits
    }

    /// A number in [0, 1], or in (0, 1] when `zero_ok` is false.
    pub fn fraction(&mut self, path: &str, value: &Spanned<f64>, zero_ok: bool) -> Option<f64> {
        let x = *value.get_ref();
        let low_ok = if zero_ok { x >= 0.0 } else { x > 0.0 };
        if low_ok && x <= 1.0 {
            return Some(x);
        }
        let range = if zero_ok { "[0, 1]" } else { "(0, 1]" };
        self.at(&value.span(), format!("{path}: {x} is not in {range}"));
        None
    }

    /// One of the named `choices`.
    pub fn choice<T: Copy>(
        &mut self,
        path: &str,
        value: &Text,
        choices: &[(&str, T)],
    ) -> Option<T> {
        let found = choices
            .iter()
            .find(|(name, _)| name == value.get_ref())
            .map(|&(_, v)| v);
        if found.is_none() {
            let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            self.at(
                &value.span(),
                format!(
                    "{path}: {:?} is not one of {}",
                    value.get_ref(),
                    names.join(", ")
                ),
            );
        }
        found
    }

    /// A dimension name.
    /// A dimension name; `attr.NAME` must be declared in `[attributes]` (unless a broken
    /// `[attributes]` hides what is declared).
    pub fn dimension(&mut self, path: &str, value: &Text, facts: &SetFacts) -> Option<Dimension> {
        let dim = Dimension::from_name(value.get_ref());
        match &dim {
            None => self.at(
                &value.span(),
                format!(
                    "{path}: {:?} is not a dimension (user, device, ip, net, activity, attr.NAME)",
                    value.get_ref()
                ),
            ),
            Some(Dimension::Attr(name)) => {
                let declared = facts.attributes.as_ref().map(|a| a.contains(&**name));
                if declared == Some(false) {
                    self.at(
                        &value.span(),
                        format!("{path}: attribute {name:?} is not declared in [attributes] (add {name} = {{ pattern = \"...\" }} there)"),
                    );
                    return None;
                }
                // A broken [attributes] hides what is declared: nothing to say, but no
                // dimension either.
                declared?;
            }
            Some(_) => {}
        }
        dim
    }

    /// A `where` filter the rule set can evaluate: `untrusted` needs `[trust]`,
    /// `new_account` and `new_device` their `[trust]` entries.
    pub fn filter(&mut self, path: &str, value: &Text, facts: &SetFacts) -> Option<Filter> {
        let choices = Filter::ALL.map(|f| (f.name(), f));
        let filter = self.choice(path, value, &choices)?;
        let shape = facts.trust?;
        let missing = match filter {
            Filter::Untrusted if !shape.present => "[trust] (trust points)",
            Filter::NewAccount if !shape.new_account => {
                "[trust].new_account = { younger_than, max_factor }"
            }
            Filter::NewDevice if !shape.new_device => "[trust].new_device = { younger_than }",
            _ => return Some(filter),
        };
        self.at(
            &value.span(),
            format!(
                "{path}: \"{}\" needs {missing} in the rule set",
                filter.name()
            ),
        );
        None
    }

    /// A name that can go into a store key: 1 to 64 of `[A-Za-z0-9_]`.
    pub fn key_name(&mut self, path: &str, what: &str, value: &Text) -> bool {
        let name = value.get_ref();
        let ok = (1..=64).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok {
            self.at(
                &value.span(),
                format!("{path}: {what} {name:?} must be 1 to 64 of A-Z a-z 0-9 _ (it goes into store keys)"),
            );
        }
        ok
    }
}
