//! What `GET /ops` shows: the counters of the metrics registry read as per-scene totals
//! ([`totals`]), and their last fifteen minutes sampled into a bounded ring ([`history`]).
//! The HTTP side (the page and its JSON) is `http::ops_page`.

pub mod history;
pub mod totals;

pub use history::{History, HistoryView, Sample};
pub use totals::{breaker_state, Decisions, SceneTotals, Totals};
