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
//!
//! Challenges: a check answered `challenge` is unserved; when its sender passes, the
//! replay reports the pass (`challenges_passed`) and sends the check again — a retry,
//! counted as a check of its own (`retries`), which may then be served. A user who was
//! challenged and passed is unserved only if the retry was not served either.
//!
//! Cost: a label with a cohort line (see [`super::traffic`]) is priced — its accounts
//! (distinct users), the distinct addresses and devices its checks came from, and the
//! challenges it passed, each times its price — and the cost is divided by what it
//! obtained: units with a stock, else allowed checks that were not repeats. A group's
//! cost is its priced labels' costs added (an address two cohorts share is paid by each),
//! over what those labels obtained.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::check::decision::{CheckResponse, Reason, Verdict};
use crate::clock::rfc3339;
use crate::input::RequestError;

use super::traffic::{Cost, Recorded};

/// How many examples of each changed decision or rejection the report keeps.
const MAX_EXAMPLES: usize = 20;

/// Per-label counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LabelReport {
    /// Checks decided, retries included.
    pub checks: u64,
    pub allowed: u64,
    /// Answered challenge (the backend must verify the person first).
    pub challenged: u64,
    /// `challenge_passed` events sent for this label's challenged checks.
    pub challenges_passed: u64,
    /// Checks sent again after a passed challenge (also counted in `checks`).
    pub retries: u64,
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
    /// Users silently denied at least once.
    pub users_silently_denied: u64,
    /// With a stock: units this label got.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub units: Option<u64>,
    /// With a stock: checks allowed after it ran out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub too_late: Option<u64>,
    /// With a cost: what this label's senders spent (see the module doc).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attacker_cost: Option<f64>,
    /// With a cost: `attacker_cost` per unit obtained (per allowed check without a
    /// stock); `null` when nothing was obtained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_per_unit: Option<Option<f64>>,
    /// With a cost: what was counted to price it, and what it obtained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_basis: Option<CostBasis>,
}

/// What a priced label used — each multiplied by its price in the cohort line — and what
/// it obtained for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CostBasis {
    /// Distinct users.
    pub accounts: u64,
    /// Distinct `ip` values.
    pub proxy_addresses: u64,
    /// Distinct `device_id` values.
    pub devices: u64,
    /// Challenges passed.
    pub challenges_solved: u64,
    /// Units with a stock, else allowed checks that were not repeats.
    pub obtained: u64,
}

impl CostBasis {
    fn add(&mut self, o: &CostBasis) {
        self.accounts += o.accounts;
        self.proxy_addresses += o.proxy_addresses;
        self.devices += o.devices;
        self.challenges_solved += o.challenges_solved;
        self.obtained += o.obtained;
    }

    fn priced(&self, cost: &Cost) -> f64 {
        self.accounts as f64 * cost.account
            + self.proxy_addresses as f64 * cost.proxy_address
            + self.devices as f64 * cost.device
            + self.challenges_solved as f64 * cost.challenge_solved
    }
}

impl LabelReport {
    /// Adds `o`'s counts (not its cost: a group's is reckoned from its labels').
    fn add(&mut self, o: &LabelReport) {
        let opt = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            _ => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.checks += o.checks;
        self.allowed += o.allowed;
        self.challenged += o.challenged;
        self.challenges_passed += o.challenges_passed;
        self.retries += o.retries;
        self.friendly_deny += o.friendly_deny;
        self.silent_deny += o.silent_deny;
        self.rejected += o.rejected;
        self.duplicates += o.duplicates;
        self.unserved_checks += o.unserved_checks;
        self.users += o.users;
        self.users_unserved += o.users_unserved;
        self.users_silently_denied += o.users_silently_denied;
        self.units = opt(self.units, o.units);
        self.too_late = opt(self.too_late, o.too_late);
    }

    /// What the label obtained, for its cost per unit: units with a stock, else allowed
    /// checks that were not repeats.
    fn obtained(&self) -> u64 {
        self.units
            .unwrap_or_else(|| self.allowed.saturating_sub(self.duplicates))
    }

    /// Sets the cost fields: what `basis` used cost `cost`.
    fn set_cost(&mut self, basis: CostBasis, cost: f64) {
        self.attacker_cost = Some(cost);
        self.cost_per_unit = Some((basis.obtained > 0).then(|| cost / basis.obtained as f64));
        self.cost_basis = Some(basis);
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
    /// Check and event lines of the file.
    pub lines: u64,
    /// Checks decided: the file's, and retries after a passed challenge.
    pub checks: u64,
    /// Event lines of the file applied.
    pub events: u64,
    /// `challenge_passed` events the replay sent for senders who passed (not in `events`).
    pub challenges_passed: u64,
    /// Time of the first line, and of the last line or retry.
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

/// One check as it was sent, for the tally.
#[derive(Debug, Clone, Copy)]
pub struct Sent<'a> {
    /// The file line it came from (a retry: the line of the check it retries).
    pub line: usize,
    pub at_ms: u64,
    pub label: &'a str,
    pub user: Option<&'a str>,
    /// Its `device_id` and `ip`: counted for a priced label.
    pub device: Option<&'a str>,
    pub ip: Option<&'a str>,
    /// Sent again after a passed challenge.
    pub retry: bool,
}

/// What became of one user of a label.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    served: bool,
    silently_denied: bool,
}

/// What a priced label used, as it is seen.
struct Spend {
    cost: Cost,
    addresses: HashSet<String>,
    devices: HashSet<String>,
}

#[derive(Default)]
struct LabelTally {
    report: LabelReport,
    users: HashMap<String, Seen>,
    /// A label with a cohort line: its prices and what it used so far.
    spend: Option<Spend>,
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
    passes: u64,
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
            passes: 0,
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

    fn happened_at(&mut self, at_ms: u64) {
        self.from.get_or_insert(at_ms);
        self.to = Some(at_ms);
    }

    /// A cohort line: `label`'s checks cost their senders `cost`. Comes before any check.
    pub fn cohort(&mut self, label: &str, cost: Cost) {
        self.label(label).spend = Some(Spend {
            cost,
            addresses: HashSet::new(),
            devices: HashSet::new(),
        });
    }

    /// An event line was applied.
    pub fn event(&mut self, at_ms: u64) {
        self.lines += 1;
        self.happened_at(at_ms);
        self.events += 1;
    }

    /// A `challenge_passed` event was sent for a check of `label`.
    pub fn challenge_passed(&mut self, label: &str) {
        self.passes += 1;
        self.label(label).report.challenges_passed += 1;
    }

    /// One check and what the check path answered.
    pub fn check(
        &mut self,
        sent: Sent<'_>,
        answer: &Result<CheckResponse, RequestError>,
        recorded: Option<&Recorded>,
    ) -> Fate {
        let Sent {
            line,
            at_ms,
            label,
            user,
            ..
        } = sent;
        if !sent.retry {
            self.lines += 1;
        }
        self.happened_at(at_ms);
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
        let silent = matches!(answer, Ok(r) if r.decision.verdict() == Verdict::SilentDeny);
        let tally = self.label(label);
        tally.report.checks += 1;
        tally.report.retries += u64::from(sent.retry);
        if served == Some(false) {
            tally.report.unserved_checks += 1;
        }
        if let Some(user) = user {
            // Look up before inserting: one allocation per user, not per check.
            let seen = match tally.users.get_mut(user) {
                Some(seen) => seen,
                None => tally.users.entry(user.to_string()).or_default(),
            };
            seen.served |= served == Some(true);
            seen.silently_denied |= silent;
        }
        if let Some(spend) = &mut tally.spend {
            let note = |set: &mut HashSet<String>, value: Option<&str>| {
                if let Some(v) = value.filter(|v| !set.contains(*v)) {
                    set.insert(v.to_string());
                }
            };
            note(&mut spend.addresses, sent.ip);
            note(&mut spend.devices, sent.device);
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
        // Label -> (what it used, its cost), for the labels with a cohort line.
        let mut priced: HashMap<String, (CostBasis, f64)> = HashMap::new();
        for (name, t) in self.labels {
            let mut report = t.report;
            report.users = t.users.len() as u64;
            report.users_unserved = t.users.values().filter(|s| !s.served).count() as u64;
            report.users_silently_denied =
                t.users.values().filter(|s| s.silently_denied).count() as u64;
            if self.stock.is_some() {
                report.units.get_or_insert(0);
                report.too_late.get_or_insert(0);
            }
            if let Some(spend) = &t.spend {
                let inputs = CostBasis {
                    accounts: report.users,
                    proxy_addresses: spend.addresses.len() as u64,
                    devices: spend.devices.len() as u64,
                    challenges_solved: report.challenges_passed,
                    obtained: report.obtained(),
                };
                let cost = inputs.priced(&spend.cost);
                report.set_cost(inputs, cost);
                priced.insert(name.clone(), (inputs, cost));
            }
            labels.insert(name, report);
        }
        let mut groups: BTreeMap<String, LabelReport> = BTreeMap::new();
        // Group -> its priced labels' basis and cost.
        let mut group_cost: BTreeMap<String, (CostBasis, f64)> = BTreeMap::new();
        for (label, r) in &labels {
            if let Some((group, _)) = label.split_once('/') {
                groups.entry(group.to_string()).or_default().add(r);
                if let Some((inputs, cost)) = priced.get(label) {
                    let g = group_cost.entry(group.to_string()).or_default();
                    g.0.add(inputs);
                    g.1 += cost;
                }
            }
        }
        for (group, (basis, cost)) in group_cost {
            if let Some(g) = groups.get_mut(&group) {
                g.set_cost(basis, cost);
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
            challenges_passed: self.passes,
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
        let retries: u64 = self.labels.values().map(|r| r.retries).sum();
        if self.challenges_passed > 0 || retries > 0 {
            let _ = writeln!(
                out,
                "{} challenges passed and reported, {retries} checks sent again after one",
                self.challenges_passed
            );
        }
        out.push('\n');
        let mut rows = vec![[
            "label",
            "checks",
            "allowed",
            "challenged",
            "passed",
            "friendly",
            "silent",
            "rejected",
            "users",
            "users unserved",
            "users silently denied",
        ]
        .map(String::from)
        .to_vec()];
        for (label, r) in self.rows() {
            rows.push(vec![
                label,
                r.checks.to_string(),
                r.allowed.to_string(),
                r.challenged.to_string(),
                r.challenges_passed.to_string(),
                r.friendly_deny.to_string(),
                r.silent_deny.to_string(),
                r.rejected.to_string(),
                r.users.to_string(),
                format!("{} ({})", r.users_unserved, pct(r.users_unserved, r.users)),
                format!(
                    "{} ({})",
                    r.users_silently_denied,
                    pct(r.users_silently_denied, r.users)
                ),
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

        if self.rows().any(|(_, r)| r.attacker_cost.is_some()) {
            out.push('\n');
            let (obtained, per) = if self.stock.is_some() {
                ("units", "cost per unit")
            } else {
                ("allowed", "cost per allowed check")
            };
            let mut rows = vec![vec![
                "attacker cost".to_string(),
                "accounts".into(),
                "addresses".into(),
                "devices".into(),
                "challenges solved".into(),
                "cost".into(),
                obtained.into(),
                per.into(),
            ]];
            for (label, r) in self.rows() {
                let (Some(cost), Some(inputs)) = (r.attacker_cost, r.cost_basis) else {
                    continue;
                };
                rows.push(vec![
                    label,
                    inputs.accounts.to_string(),
                    inputs.proxy_addresses.to_string(),
                    inputs.devices.to_string(),
                    inputs.challenges_solved.to_string(),
                    format!("{cost:.2}"),
                    inputs.obtained.to_string(),
                    r.cost_per_unit
                        .flatten()
                        .map_or("-".into(), |c| format!("{c:.2}")),
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
    use crate::check::decision::{ChallengeAsk, Decision, FriendlyDeny, LimitReport, SignalReport};

    /// A check of the file (no retry), without a device or an address.
    fn sent<'a>(line: usize, at_ms: u64, label: &'a str, user: Option<&'a str>) -> Sent<'a> {
        Sent {
            line,
            at_ms,
            label,
            user,
            device: None,
            ip: None,
            retry: false,
        }
    }

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

    fn challenge() -> CheckResponse {
        deny(Decision::Challenge {
            reason: Reason::Score,
            ask: ChallengeAsk {
                kind: "captcha".into(),
                message: None,
            },
        })
    }

    /// A check sent from `device` and `ip`; a retry when `retry`.
    fn from<'a>(
        line: usize,
        label: &'a str,
        user: &'a str,
        device: &'a str,
        ip: &'a str,
        retry: bool,
    ) -> Sent<'a> {
        Sent {
            device: Some(device),
            ip: Some(ip),
            retry,
            ..sent(line, line as u64, label, Some(user))
        }
    }

    #[test]
    fn a_challenge_passed_and_retried_serves_the_user_and_one_given_up_does_not() {
        let mut t = Tally::new("v", None);
        t.check(sent(1, 1, "honest", Some("ana")), &Ok(challenge()), None);
        t.check(sent(2, 2, "honest", Some("ben")), &Ok(challenge()), None);
        t.challenge_passed("honest");
        let retry = Sent {
            retry: true,
            ..sent(1, 15, "honest", Some("ana"))
        };
        t.check(retry, &Ok(allow()), None);
        let r = t.finish();
        let h = &r.labels["honest"];
        assert_eq!(
            (
                h.checks,
                h.allowed,
                h.challenged,
                h.challenges_passed,
                h.retries
            ),
            (3, 1, 2, 1, 1)
        );
        assert_eq!((h.users, h.users_unserved, h.unserved_checks), (2, 1, 2));
        // Two lines of the file, three checks decided; the retry is the last thing that
        // happened.
        assert_eq!((r.lines, r.checks, r.challenges_passed), (2, 3, 1));
        assert_eq!(r.to.as_deref(), Some("1970-01-01T00:00:00.015Z"));
        assert!(h.attacker_cost.is_none() && h.cost_per_unit.is_none());
        let text = r.to_text();
        assert!(
            text.contains("1 challenges passed and reported, 1 checks sent again"),
            "{text}"
        );
        let header = text.lines().find(|l| l.starts_with("label")).unwrap();
        assert!(header.contains("challenged  passed"), "{header}");
        let row = text.lines().find(|l| l.starts_with("honest")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[..6], ["honest", "3", "1", "2", "1", "0"], "{row}");
    }

    #[test]
    fn users_silently_denied_count_each_user_once() {
        let mut t = Tally::new("v", None);
        t.check(sent(1, 1, "bot", Some("b1")), &Ok(score_deny()), None);
        t.check(sent(2, 2, "bot", Some("b1")), &Ok(score_deny()), None);
        // Served once, silently denied once: both.
        t.check(sent(3, 3, "bot", Some("b2")), &Ok(allow()), None);
        t.check(sent(4, 4, "bot", Some("b2")), &Ok(score_deny()), None);
        t.check(sent(5, 5, "bot", Some("b3")), &Ok(allow()), None);
        t.check(sent(6, 6, "honest", Some("h")), &Ok(challenge()), None);
        let r = t.finish();
        let bot = &r.labels["bot"];
        assert_eq!((bot.silent_deny, bot.users_silently_denied), (3, 2));
        assert_eq!(bot.users_unserved, 1);
        assert_eq!(
            r.labels["honest"].users_silently_denied, 0,
            "a challenge is not a deny"
        );
        let text = r.to_text();
        assert!(text.contains("users silently denied"), "{text}");
        let row = text.lines().find(|l| l.starts_with("bot")).unwrap();
        assert!(row.ends_with("2 (66.7%)"), "{row}");
    }

    #[test]
    fn a_priced_label_shows_what_each_unit_cost_it() {
        let mut t = Tally::new("v", Some(2));
        let farm = Cost {
            account: 1.0,
            proxy_address: 0.5,
            device: 2.0,
            challenge_solved: 0.25,
        };
        t.cohort("attacker/farm", farm);
        t.cohort(
            "attacker/spoofed",
            Cost {
                account: 1.0,
                ..Cost::default()
            },
        );
        let f = "attacker/farm";
        t.check(
            from(1, f, "f1", "d1", "203.0.113.1", false),
            &Ok(challenge()),
            None,
        );
        t.challenge_passed(f);
        t.check(
            from(1, f, "f1", "d1", "203.0.113.1", true),
            &Ok(allow()),
            None,
        );
        t.check(
            from(2, f, "f2", "d1", "203.0.113.2", false),
            &Ok(allow()),
            None,
        );
        // Too late for a unit, but its account, device and address were paid for.
        t.check(
            from(3, f, "f3", "d2", "203.0.113.2", false),
            &Ok(allow()),
            None,
        );
        let s = "attacker/spoofed";
        t.check(
            from(4, s, "s1", "x1", "203.0.113.9", false),
            &Ok(score_deny()),
            None,
        );
        t.check(
            from(5, "attacker/free", "u", "x2", "203.0.113.9", false),
            &Ok(allow()),
            None,
        );
        let r = t.finish();

        let farm = &r.labels["attacker/farm"];
        let basis = farm.cost_basis.unwrap();
        assert_eq!(
            (
                basis.accounts,
                basis.proxy_addresses,
                basis.devices,
                basis.challenges_solved,
                basis.obtained
            ),
            (3, 2, 2, 1, 2)
        );
        // 3 × 1 + 2 × 0.5 + 2 × 2 + 1 × 0.25, over the two units it got.
        assert_eq!(farm.attacker_cost, Some(8.25));
        assert_eq!(farm.cost_per_unit, Some(Some(4.125)));
        let spoofed = &r.labels["attacker/spoofed"];
        assert_eq!(spoofed.attacker_cost, Some(1.0));
        assert_eq!(spoofed.cost_per_unit, Some(None), "nothing obtained");
        assert!(r.labels["attacker/free"].attacker_cost.is_none());
        // The group: its priced labels' costs, over what they obtained.
        let group = &r.groups["attacker"];
        assert_eq!(group.attacker_cost, Some(9.25));
        assert_eq!(group.cost_per_unit, Some(Some(4.625)));
        assert_eq!(group.cost_basis.unwrap().accounts, 4);

        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["labels"]["attacker/farm"]["attacker_cost"], 8.25);
        assert!(json["labels"]["attacker/spoofed"]["cost_per_unit"].is_null());
        assert!(json["labels"]["attacker/spoofed"]
            .as_object()
            .unwrap()
            .contains_key("cost_per_unit"));
        let free = json["labels"]["attacker/free"].as_object().unwrap();
        assert!(!free.contains_key("attacker_cost") && !free.contains_key("cost_per_unit"));

        let text = r.to_text();
        assert!(text.contains("cost per unit"), "{text}");
        let row = |label: &str| {
            text.lines()
                .rfind(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("{label}: {text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            row("attacker/farm")[1..],
            ["3", "2", "2", "1", "8.25", "2", "4.12"]
        );
        assert_eq!(row("attacker/spoofed")[5..], ["1.00", "0", "-"]);

        // Without a stock, the cost is per allowed check.
        let mut t = Tally::new("v", None);
        t.cohort("attacker/farm", farm_cost());
        t.check(
            from(1, f, "f1", "d1", "203.0.113.1", false),
            &Ok(allow()),
            None,
        );
        t.check(
            from(2, f, "f2", "d1", "203.0.113.1", false),
            &Ok(allow()),
            None,
        );
        let r = t.finish();
        assert_eq!(r.labels[f].cost_per_unit, Some(Some(1.0 + 0.25)));
        assert!(r.to_text().contains("cost per allowed check"));
    }

    /// 1 per account, a quarter per address and per device.
    fn farm_cost() -> Cost {
        Cost {
            account: 1.0,
            proxy_address: 0.25,
            device: 0.25,
            challenge_solved: 0.0,
        }
    }

    #[test]
    fn stock_goes_first_come_first_served_and_late_users_are_unserved() {
        let mut t = Tally::new("v", Some(2));
        let a = Ok(allow());
        assert_eq!(
            t.check(sent(1, 1, "bot", Some("b1")), &a, None).granted,
            Some(true)
        );
        assert_eq!(
            t.check(sent(2, 2, "bot", Some("b2")), &a, None).granted,
            Some(true)
        );
        assert_eq!(
            t.check(sent(3, 3, "honest", Some("h1")), &a, None).granted,
            Some(false)
        );
        let mut dup = allow();
        dup.duplicate_of = Some("r".into());
        assert_eq!(
            t.check(sent(4, 4, "honest", Some("h1")), &Ok(dup), None)
                .granted,
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
        t.check(sent(1, 1, "honest", Some("u")), &Ok(allow()), None);
        t.check(sent(2, 2, "honest", Some("u")), &Ok(d), None);
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
        t.check(sent(3, 3, "bot", Some("b")), &Ok(s), None);
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
        t.check(sent(1, 1, "attacker/farm", Some("f1")), &Ok(allow()), None);
        t.check(
            sent(2, 2, "attacker/spoofed", Some("s1")),
            &Ok(allow()),
            None,
        );
        t.check(
            sent(3, 3, "attacker/spoofed", Some("s2")),
            &Ok(score_deny()),
            None,
        );
        t.check(sent(4, 4, "honest", Some("h1")), &Ok(allow()), None);
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
        t.check(sent(5, 1, "x", None), &missing, None);
        t.check(sent(9, 2, "x", None), &missing, None);
        let was_allow = Recorded {
            decision: "allow".into(),
            reason: None,
            request_id: None,
        };
        t.check(sent(10, 3, "x", None), &Ok(allow()), Some(&was_allow));
        t.check(sent(11, 4, "x", None), &Ok(score_deny()), Some(&was_allow));
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
