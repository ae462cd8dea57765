//! What a replay found, per label: the [`Tally`] that counts each check as it is decided,
//! and the [`Report`] it becomes — printed as tables or as JSON.
//!
//! The numbers answer an operator's questions about a rule set before a campaign: how
//! much of each population was allowed, friendly- and silent-denied; which limit or
//! signal denied whom; and, with a stock of N units granted first come first served (as a
//! backend handing out coupons would), who got them and who went without. A user who
//! loses to an empty stock is never *denied*, so the stock section is where the harm to
//! late honest users shows.
//!
//! Labels may name a group before a slash (`attacker/farm`, `attacker/spoofed`): the report
//! then also sums the group (`attacker/*`), so cohorts read one by one and together.
//!
//! Served and unserved: a check is served when it is allowed (and, with a stock, gets a
//! unit); a repeat of a counted request (`duplicate_of`) is neither. A user is unserved
//! when none of their checks was served.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

use crate::check::decision::{CheckResponse, Reason, Verdict};
use crate::clock::rfc3339;
use crate::input::RequestError;

use super::traffic::Recorded;

/// How many examples of each changed decision or rejection the report keeps.
const MAX_EXAMPLES: usize = 20;

/// Per-label counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LabelReport {
    pub checks: u64,
    pub allowed: u64,
    /// Answered challenge (the backend must verify the person first).
    pub challenged: u64,
    pub friendly_deny: u64,
    pub silent_deny: u64,
    /// Refused as invalid by this rule set (the 400 the service would answer).
    pub rejected: u64,
    /// Allowed as a repeat of a request already counted (`duplicate_of`): nothing granted.
    pub duplicates: u64,
    /// Checks that were not served: denied, rejected, or (with a stock) allowed too late.
    pub unserved_checks: u64,
    /// Distinct `user_id`s among the checks.
    pub users: u64,
    /// Users none of whose checks was served.
    pub users_unserved: u64,
    /// With a stock: units this label got.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub units: Option<u64>,
    /// With a stock: checks allowed after it ran out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub too_late: Option<u64>,
}

impl LabelReport {
    fn add(&mut self, o: &LabelReport) {
        let opt = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            _ => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.checks += o.checks;
        self.allowed += o.allowed;
        self.challenged += o.challenged;
        self.friendly_deny += o.friendly_deny;
        self.silent_deny += o.silent_deny;
        self.rejected += o.rejected;
        self.duplicates += o.duplicates;
        self.unserved_checks += o.unserved_checks;
        self.users += o.users;
        self.users_unserved += o.users_unserved;
        self.units = opt(self.units, o.units);
        self.too_late = opt(self.too_late, o.too_late);
    }
}

/// Denied checks per label that one limit or signal had a part in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeniedBy {
    pub scene: String,
    /// `limit` (it was exceeded on a denied check) or `signal` (it contributed to a score
    /// deny).
    pub kind: &'static str,
    pub name: String,
    pub by_label: BTreeMap<String, u64>,
}

/// Checks per label that ended with one decision and reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonCount {
    pub decision: String,
    pub reason: String,
    pub by_label: BTreeMap<String, u64>,
}

/// Checks refused as invalid, grouped by error code and field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    pub code: String,
    pub field: Option<String>,
    /// The first such check's message and line.
    pub message: String,
    pub first_line: usize,
    pub count: u64,
}

/// The stock granted first come, first served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StockReport {
    pub units: u64,
    pub granted: u64,
    /// When the last unit went, and on which line; `None` if some are left.
    pub ran_out_at: Option<String>,
    pub ran_out_line: Option<usize>,
    /// Units per label.
    pub by_label: BTreeMap<String, u64>,
}

/// Recorded decisions that this rule set decides differently.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Changes {
    /// Check lines that carried a recorded decision.
    pub compared: u64,
    pub same: u64,
    pub changed: u64,
    /// `from -> to` (each `decision` or `decision/reason`), most frequent first.
    pub transitions: Vec<Transition>,
}

/// One kind of changed decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transition {
    pub from: String,
    pub to: String,
    pub count: u64,
    /// Up to a few lines where it happened.
    pub lines: Vec<usize>,
}

/// A replay's findings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub rules_version: String,
    pub lines: u64,
    pub checks: u64,
    pub events: u64,
    /// Time of the first and the last line.
    pub from: Option<String>,
    pub to: Option<String>,
    pub labels: BTreeMap<String, LabelReport>,
    /// Sums of the labels that share a group (`attacker` for `attacker/farm` and
    /// `attacker/spoofed`); users add up as if no user were in two labels.
    pub groups: BTreeMap<String, LabelReport>,
    pub reasons: Vec<ReasonCount>,
    pub denied_by: Vec<DeniedBy>,
    pub rejected: Vec<Rejection>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stock: Option<StockReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<Changes>,
}

/// What became of one check, for `--out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fate {
    /// With a stock: whether this check got a unit.
    pub granted: Option<bool>,
}

#[derive(Default)]
struct LabelTally {
    report: LabelReport,
    /// user id -> served at least once.
    users: HashMap<String, bool>,
}

/// Counts checks as they are decided; [`Tally::finish`] makes the [`Report`].
pub struct Tally {
    rules_version: String,
    stock: Option<u64>,
    granted: u64,
    ran_out: Option<(u64, usize)>,
    lines: u64,
    checks: u64,
    events: u64,
    from: Option<u64>,
    to: Option<u64>,
    labels: BTreeMap<String, LabelTally>,
    reasons: BTreeMap<(String, String), BTreeMap<String, u64>>,
    denied_by: BTreeMap<(String, &'static str, String), BTreeMap<String, u64>>,
    rejected: BTreeMap<(String, Option<String>), Rejection>,
    changes: Option<Changes>,
    transitions: HashMap<(String, String), Transition>,
}

fn bump(map: &mut BTreeMap<String, u64>, label: &str) {
    match map.get_mut(label) {
        Some(n) => *n += 1,
        None => {
            map.insert(label.to_string(), 1);
        }
    }
}

/// `decision` or `decision/reason`, as transitions name them.
fn outcome(decision: &str, reason: Option<&str>) -> String {
    match reason {
        Some(r) => format!("{decision}/{r}"),
        None => decision.to_string(),
    }
}

impl Tally {
    /// A tally for a replay on `rules_version`, granting `stock` units when given.
    pub fn new(rules_version: &str, stock: Option<u64>) -> Self {
        Tally {
            rules_version: rules_version.to_string(),
            stock,
            granted: 0,
            ran_out: None,
            lines: 0,
            checks: 0,
            events: 0,
            from: None,
            to: None,
            labels: BTreeMap::new(),
            reasons: BTreeMap::new(),
            denied_by: BTreeMap::new(),
            rejected: BTreeMap::new(),
            changes: None,
            transitions: HashMap::new(),
        }
    }

    /// Checks counted so far.
    pub fn checks(&self) -> u64 {
        self.checks
    }

    fn line_at(&mut self, at_ms: u64) {
        self.lines += 1;
        self.from.get_or_insert(at_ms);
        self.to = Some(at_ms);
    }

    /// An event line was applied.
    pub fn event(&mut self, at_ms: u64) {
        self.line_at(at_ms);
        self.events += 1;
    }

    /// One check and what the check path answered.
    pub fn check(
        &mut self,
        line: usize,
        at_ms: u64,
        label: &str,
        user: Option<&str>,
        answer: &Result<CheckResponse, RequestError>,
        recorded: Option<&Recorded>,
    ) -> Fate {
        self.line_at(at_ms);
        self.checks += 1;
        let mut fate = Fate { granted: None };
        let served = match answer {
            Ok(resp) => self.decided(line, at_ms, label, resp, &mut fate),
            Err(e) => {
                self.reject(line, e);
                self.label(label).report.rejected += 1;
                Some(false)
            }
        };
        let tally = self.label(label);
        tally.report.checks += 1;
        if served == Some(false) {
            tally.report.unserved_checks += 1;
        }
        if let Some(user) = user {
            let seen = match tally.users.get_mut(user) {
                Some(seen) => seen,
                None => tally.users.entry(user.to_string()).or_insert(false),
            };
            *seen |= served == Some(true);
        }
        if let Some(recorded) = recorded {
            self.compare(line, recorded, answer);
        }
        fate
    }

    fn label(&mut self, label: &str) -> &mut LabelTally {
        self.labels.entry(label.to_string()).or_default()
    }

    /// Counts a decided check; `Some(served)`, or `None` for a duplicate.
    fn decided(
        &mut self,
        line: usize,
        at_ms: u64,
        label: &str,
        resp: &CheckResponse,
        fate: &mut Fate,
    ) -> Option<bool> {
        let report = &mut self.label(label).report;
        match resp.decision.verdict() {
            Verdict::Allow => report.allowed += 1,
            Verdict::Challenge => report.challenged += 1,
            Verdict::FriendlyDeny => report.friendly_deny += 1,
            Verdict::SilentDeny => report.silent_deny += 1,
        }
        if let Some(reason) = resp.decision.reason() {
            // Grouped by their wire names: the report prints them, and compares them with
            // recorded lines, which only have names.
            let key = (
                resp.decision.verdict().name().to_string(),
                reason.name().to_string(),
            );
            bump(self.reasons.entry(key).or_default(), label);
            for l in resp.limits.iter().filter(|l| l.exceeded) {
                let key = (resp.scene.clone(), "limit", l.name.clone());
                bump(self.denied_by.entry(key).or_default(), label);
            }
            if *reason == Reason::Score {
                for s in resp.signals.iter().filter(|s| s.contribution > 0.0) {
                    let key = (resp.scene.clone(), "signal", s.name.clone());
                    bump(self.denied_by.entry(key).or_default(), label);
                }
            }
            return Some(false);
        }
        if resp.duplicate_of.is_some() {
            self.label(label).report.duplicates += 1;
            return None;
        }
        let Some(stock) = self.stock else {
            return Some(true);
        };
        let granted = self.granted < stock;
        fate.granted = Some(granted);
        let report = &mut self.label(label).report;
        if granted {
            *report.units.get_or_insert(0) += 1;
            self.granted += 1;
            if self.granted == stock {
                self.ran_out = Some((at_ms, line));
            }
        } else {
            *report.too_late.get_or_insert(0) += 1;
        }
        Some(granted)
    }

    fn reject(&mut self, line: usize, e: &RequestError) {
        let key = (e.code().to_string(), e.field().map(str::to_string));
        self.rejected
            .entry(key)
            .or_insert_with(|| Rejection {
                code: e.code().to_string(),
                field: e.field().map(str::to_string),
                message: e.to_string(),
                first_line: line,
                count: 0,
            })
            .count += 1;
    }

    fn compare(
        &mut self,
        line: usize,
        recorded: &Recorded,
        answer: &Result<CheckResponse, RequestError>,
    ) {
        let changes = self.changes.get_or_insert_with(Changes::default);
        changes.compared += 1;
        let was = outcome(&recorded.decision, recorded.reason.as_deref());
        let now = match answer {
            Ok(resp) => outcome(
                resp.decision.verdict().name(),
                resp.decision.reason().map(Reason::name),
            ),
            Err(e) => format!("rejected/{}", e.code()),
        };
        if was == now {
            changes.same += 1;
            return;
        }
        changes.changed += 1;
        let t = self
            .transitions
            .entry((was.clone(), now.clone()))
            .or_insert_with(|| Transition {
                from: was,
                to: now,
                count: 0,
                lines: Vec::new(),
            });
        t.count += 1;
        if t.lines.len() < MAX_EXAMPLES {
            t.lines.push(line);
        }
    }

    /// The report.
    pub fn finish(self) -> Report {
        let mut labels = BTreeMap::new();
        for (name, t) in self.labels {
            let mut report = t.report;
            report.users = t.users.len() as u64;
            report.users_unserved = t.users.values().filter(|served| !**served).count() as u64;
            if self.stock.is_some() {
                report.units.get_or_insert(0);
                report.too_late.get_or_insert(0);
            }
            labels.insert(name, report);
        }
        let mut groups: BTreeMap<String, LabelReport> = BTreeMap::new();
        for (label, r) in &labels {
            if let Some((group, _)) = label.split_once('/') {
                groups.entry(group.to_string()).or_default().add(r);
            }
        }
        let mut reasons: Vec<ReasonCount> = self
            .reasons
            .into_iter()
            .map(|((decision, reason), by_label)| ReasonCount {
                decision,
                reason,
                by_label,
            })
            .collect();
        reasons.sort_by_key(|r| std::cmp::Reverse(r.by_label.values().sum::<u64>()));
        let denied_by = self
            .denied_by
            .into_iter()
            .map(|((scene, kind, name), by_label)| DeniedBy {
                scene,
                kind,
                name,
                by_label,
            })
            .collect();
        let mut rejected: Vec<Rejection> = self.rejected.into_values().collect();
        rejected.sort_by_key(|r| r.first_line);
        let stock = self.stock.map(|units| StockReport {
            units,
            granted: self.granted,
            ran_out_at: self.ran_out.map(|(at, _)| rfc3339(at)),
            ran_out_line: self.ran_out.map(|(_, line)| line),
            by_label: labels
                .iter()
                .map(|(l, r)| (l.clone(), r.units.unwrap_or(0)))
                .collect(),
        });
        let recorded = self.changes.map(|mut c| {
            let mut transitions: Vec<Transition> = self.transitions.into_values().collect();
            transitions.sort_by(|a, b| b.count.cmp(&a.count).then(a.from.cmp(&b.from)));
            c.transitions = transitions;
            c
        });
        Report {
            rules_version: self.rules_version,
            lines: self.lines,
            checks: self.checks,
            events: self.events,
            from: self.from.map(rfc3339),
            to: self.to.map(rfc3339),
            labels,
            groups,
            reasons,
            denied_by,
            rejected,
            stock,
            recorded,
        }
    }
}

/// A share as a percentage with one decimal (`0.0%` of nothing).
fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// Right-aligned columns after a left-aligned first one.
fn table(out: &mut String, rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c].saturating_sub(cell.chars().count());
            if c == 0 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

impl Report {
    /// Every label, then every group (as `group/*`).
    fn rows(&self) -> impl Iterator<Item = (String, &LabelReport)> {
        let labels = self.labels.iter().map(|(l, r)| (l.clone(), r));
        let groups = self.groups.iter().map(|(g, r)| (format!("{g}/*"), r));
        labels.chain(groups)
    }

    /// The report as tables for a terminal.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let short = self.rules_version.get(..12).unwrap_or(&self.rules_version);
        let _ = writeln!(
            out,
            "{} checks and {} events from {} to {}, rules {short}",
            self.checks,
            self.events,
            self.from.as_deref().unwrap_or("-"),
            self.to.as_deref().unwrap_or("-"),
        );
        out.push('\n');
        let mut rows = vec![[
            "label",
            "checks",
            "allowed",
            "friendly",
            "silent",
            "rejected",
            "users",
            "users unserved",
        ]
        .map(String::from)
        .to_vec()];
        for (label, r) in self.rows() {
            rows.push(vec![
                label,
                r.checks.to_string(),
                r.allowed.to_string(),
                r.friendly_deny.to_string(),
                r.silent_deny.to_string(),
                r.rejected.to_string(),
                r.users.to_string(),
                format!("{} ({})", r.users_unserved, pct(r.users_unserved, r.users)),
            ]);
        }
        table(&mut out, &rows);

        if let Some(stock) = &self.stock {
            out.push('\n');
            match (&stock.ran_out_at, stock.ran_out_line) {
                (Some(at), Some(line)) => {
                    let _ = writeln!(
                        out,
                        "stock {}: all granted, the last at {at} (line {line})",
                        stock.units
                    );
                }
                _ => {
                    let _ = writeln!(
                        out,
                        "stock {}: {} granted, {} left",
                        stock.units,
                        stock.granted,
                        stock.units - stock.granted
                    );
                }
            }
            let mut rows = vec![[
                "label",
                "units",
                "share",
                "too late",
                "unserved checks",
                "users unserved",
            ]
            .map(String::from)
            .to_vec()];
            for (label, r) in self.rows() {
                let units = r.units.unwrap_or(0);
                rows.push(vec![
                    label,
                    units.to_string(),
                    pct(units, stock.units),
                    r.too_late.unwrap_or(0).to_string(),
                    format!(
                        "{} ({})",
                        r.unserved_checks,
                        pct(r.unserved_checks, r.checks)
                    ),
                    format!("{} ({})", r.users_unserved, pct(r.users_unserved, r.users)),
                ]);
            }
            table(&mut out, &rows);
        }

        let labels: Vec<&String> = self.labels.keys().collect();
        let by_label = |m: &BTreeMap<String, u64>| {
            labels
                .iter()
                .map(|l| m.get(*l).copied().unwrap_or(0).to_string())
                .collect::<Vec<_>>()
        };
        let header = |first: &str| {
            let mut h = vec![first.to_string()];
            h.extend(labels.iter().map(|l| l.to_string()));
            h
        };
        if !self.reasons.is_empty() {
            out.push('\n');
            let mut rows = vec![header("denied checks, by decision and reason")];
            for r in &self.reasons {
                let mut row = vec![format!("{} {}", r.decision, r.reason)];
                row.extend(by_label(&r.by_label));
                rows.push(row);
            }
            table(&mut out, &rows);
        }
        if !self.denied_by.is_empty() {
            out.push('\n');
            let mut rows = vec![header("denied checks each limit or signal had a part in")];
            for d in &self.denied_by {
                let mut row = vec![format!("{} {} {}", d.scene, d.kind, d.name)];
                row.extend(by_label(&d.by_label));
                rows.push(row);
            }
            table(&mut out, &rows);
        }
        if !self.rejected.is_empty() {
            out.push('\n');
            let _ = writeln!(out, "rejected as invalid by these rules:");
            for r in &self.rejected {
                let _ = writeln!(
                    out,
                    "  {} x {} (first: line {}: {})",
                    r.count, r.code, r.first_line, r.message
                );
            }
        }
        if let Some(c) = &self.recorded {
            out.push('\n');
            let _ = writeln!(
                out,
                "against the recorded decisions: {} compared, {} the same, {} changed",
                c.compared, c.same, c.changed
            );
            for t in &c.transitions {
                let lines: Vec<String> = t.lines.iter().take(5).map(usize::to_string).collect();
                let _ = writeln!(
                    out,
                    "  {} x {} -> {} (lines {}{})",
                    t.count,
                    t.from,
                    t.to,
                    lines.join(", "),
                    if t.count as usize > lines.len() {
                        ", …"
                    } else {
                        ""
                    }
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::decision::{Decision, FriendlyDeny, LimitReport, SignalReport};

    fn allow() -> CheckResponse {
        CheckResponse::allow("s", "r", "v")
    }

    fn deny(decision: Decision) -> CheckResponse {
        let mut r = allow();
        r.decision = decision;
        r
    }

    fn score_deny() -> CheckResponse {
        deny(Decision::silent(Reason::Score))
    }

    #[test]
    fn stock_goes_first_come_first_served_and_late_users_are_unserved() {
        let mut t = Tally::new("v", Some(2));
        let a = Ok(allow());
        assert_eq!(
            t.check(1, 1, "bot", Some("b1"), &a, None).granted,
            Some(true)
        );
        assert_eq!(
            t.check(2, 2, "bot", Some("b2"), &a, None).granted,
            Some(true)
        );
        assert_eq!(
            t.check(3, 3, "honest", Some("h1"), &a, None).granted,
            Some(false)
        );
        let mut dup = allow();
        dup.duplicate_of = Some("r".into());
        assert_eq!(
            t.check(4, 4, "honest", Some("h1"), &Ok(dup), None).granted,
            None
        );
        let r = t.finish();
        let stock = r.stock.unwrap();
        assert_eq!(stock.granted, 2);
        assert_eq!(stock.ran_out_line, Some(2));
        assert_eq!(stock.by_label["bot"], 2);
        let honest = &r.labels["honest"];
        assert_eq!(
            (
                honest.allowed,
                honest.too_late,
                honest.duplicates,
                honest.unserved_checks
            ),
            (2, Some(1), 1, 1)
        );
        assert_eq!((honest.users, honest.users_unserved), (1, 1));
    }

    #[test]
    fn a_user_served_once_is_served_and_denials_name_their_limits_and_signals() {
        let mut t = Tally::new("v", None);
        let mut d = deny(Decision::FriendlyDeny(FriendlyDeny {
            reason: Reason::Limit("user_10s".into()),
            message: None,
            retry_after_ms: 10_000,
            rate_limit: None,
        }));
        d.limits.push(LimitReport {
            name: "user_10s".into(),
            key: "k".into(),
            count: 1,
            max: 1,
            remaining: 0,
            window_ms: 10_000,
            exceeded: true,
        });
        t.check(1, 1, "honest", Some("u"), &Ok(allow()), None);
        t.check(2, 2, "honest", Some("u"), &Ok(d), None);
        let mut s = score_deny();
        s.signals.push(SignalReport {
            name: "accounts_per_device".into(),
            value: 4,
            max: 3,
            contribution: 0.6,
            fired: true,
        });
        s.signals.push(SignalReport {
            name: "accounts_per_ip".into(),
            value: 1,
            max: 50,
            contribution: 0.0,
            fired: false,
        });
        t.check(3, 3, "bot", Some("b"), &Ok(s), None);
        let r = t.finish();
        assert_eq!(r.labels["honest"].users_unserved, 0);
        assert_eq!(r.labels["honest"].unserved_checks, 1);
        assert_eq!(r.labels["bot"].users_unserved, 1);
        let names: Vec<(&str, &str)> = r
            .denied_by
            .iter()
            .map(|d| (d.kind, d.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [("limit", "user_10s"), ("signal", "accounts_per_device")]
        );
        assert!(r.stock.is_none());
        let text = r.to_text();
        assert!(text.contains("friendly_deny user_10s"), "{text}");
    }

    #[test]
    fn labels_with_a_group_are_also_summed_as_the_group() {
        let mut t = Tally::new("v", Some(10));
        t.check(1, 1, "attacker/farm", Some("f1"), &Ok(allow()), None);
        t.check(2, 2, "attacker/spoofed", Some("s1"), &Ok(allow()), None);
        t.check(
            3,
            3,
            "attacker/spoofed",
            Some("s2"),
            &Ok(score_deny()),
            None,
        );
        t.check(4, 4, "honest", Some("h1"), &Ok(allow()), None);
        let r = t.finish();
        assert_eq!(r.groups.keys().collect::<Vec<_>>(), ["attacker"]);
        let g = &r.groups["attacker"];
        assert_eq!((g.checks, g.allowed, g.silent_deny), (3, 2, 1));
        assert_eq!((g.users, g.users_unserved, g.units), (3, 1, Some(2)));
        let text = r.to_text();
        assert!(
            text.lines()
                .any(|l| l.starts_with("attacker/*") && l.contains("20.0%")),
            "the group's share of the stock: {text}"
        );
    }

    #[test]
    fn rejections_group_by_code_and_field_and_recorded_changes_are_listed() {
        let mut t = Tally::new("v", None);
        let missing = Err(RequestError::MissingDimension {
            field: "device_id".into(),
            scene: "s".into(),
        });
        t.check(5, 1, "x", None, &missing, None);
        t.check(9, 2, "x", None, &missing, None);
        let was_allow = Recorded {
            decision: "allow".into(),
            reason: None,
            request_id: None,
        };
        t.check(10, 3, "x", None, &Ok(allow()), Some(&was_allow));
        t.check(11, 4, "x", None, &Ok(score_deny()), Some(&was_allow));
        let r = t.finish();
        assert_eq!(r.rejected.len(), 1);
        assert_eq!((r.rejected[0].count, r.rejected[0].first_line), (2, 5));
        let c = r.recorded.unwrap();
        assert_eq!((c.compared, c.same, c.changed), (2, 1, 1));
        assert_eq!(c.transitions[0].from, "allow");
        assert_eq!(c.transitions[0].to, "silent_deny/score");
        assert_eq!(c.transitions[0].lines, [11]);
    }
}
