//! What the ops page counts, read from the Prometheus registry: the counters `/metrics`
//! exports are the one source of truth, so the page and a Prometheus dashboard can never
//! disagree, and the check path pays nothing for the page.

use std::collections::BTreeMap;

use prometheus::proto::{MetricFamily, MetricType};
use serde::Serialize;
use utoipa::ToSchema;

use crate::rules::RuleSet;

/// Decisions of one scene by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Decisions {
    pub allow: u64,
    /// Challenges issued (403 `challenge`): the backend was asked to verify the person.
    pub challenge: u64,
    pub friendly_deny: u64,
    pub silent_deny: u64,
}

impl Decisions {
    /// Every check decided (a challenged claim sent again after its pass counts twice:
    /// once challenged, once as decided then).
    pub fn checks(&self) -> u64 {
        self.allow + self.challenge + self.friendly_deny + self.silent_deny
    }
}

/// One scene's counts (totals since start, or one interval's deltas).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct SceneTotals {
    pub decisions: Decisions,
    /// Decisions taken without the store (its `on_store_error` answered).
    pub degraded: u64,
    /// Blocks (the limit was exceeded) by limit name.
    pub limits: BTreeMap<String, u64>,
    /// Blocks by dimension: the blocks of the limits counted on it (a limit on several
    /// dimensions counts under their joined name, `user+device`, as in `/metrics`).
    pub dimensions: BTreeMap<String, u64>,
    /// Checks on which the signal fired, by signal name.
    pub signals: BTreeMap<String, u64>,
    /// Challenge passes the backend reported for this scene (`challenge_passed` events
    /// naming it); with `decisions.challenge`, the scene's pass rate.
    pub challenge_passes: u64,
}

/// Every count the ops page shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Totals {
    pub scenes: BTreeMap<String, SceneTotals>,
    /// Store calls that failed, every store and kind.
    pub store_errors: u64,
    /// Rule set loads by result (`ok`, `error`).
    pub rule_reloads: BTreeMap<String, u64>,
    /// Challenge passes reported without a scene (they lift every scene's band, so
    /// they are in no one scene's pass rate).
    pub challenge_passes_unscoped: u64,
}

impl Totals {
    /// Reads the counters from `families` (a registry's `gather`). The scenes, limits,
    /// dimensions and signals of `rules` are listed even before they count anything, so
    /// the page shows a campaign's every limit from its first second.
    pub fn read(families: &[MetricFamily], rules: &RuleSet) -> Totals {
        let mut totals = Totals::default();
        for (name, scene) in &rules.scenes {
            let s = totals.scenes.entry(name.clone()).or_default();
            for limit in &scene.limits {
                s.limits.entry(limit.name.clone()).or_default();
                let dims: Vec<_> = limit.dimensions.iter().map(|d| d.name()).collect();
                s.dimensions.entry(dims.join("+")).or_default();
            }
            for signal in &scene.signals {
                s.signals.entry(signal.name.clone()).or_default();
            }
        }
        for family in families {
            if family.get_field_type() != MetricType::COUNTER {
                continue;
            }
            for metric in family.get_metric() {
                let label = |name: &str| {
                    metric
                        .get_label()
                        .iter()
                        .find(|l| l.name() == name)
                        .map_or("", |l| l.value())
                };
                // Counters are integers held in an f64.
                let value = metric.get_counter().get_value() as u64;
                let scene = label("scene");
                match family.name() {
                    "vigia_decisions_total" => {
                        let d = &mut scene_in(&mut totals.scenes, scene).decisions;
                        match label("decision") {
                            "allow" => d.allow += value,
                            "challenge" => d.challenge += value,
                            "friendly_deny" => d.friendly_deny += value,
                            "silent_deny" => d.silent_deny += value,
                            _ => {}
                        }
                    }
                    "vigia_blocks_total" => {
                        let s = scene_in(&mut totals.scenes, scene);
                        *s.limits.entry(label("limit").to_string()).or_default() += value;
                        *s.dimensions
                            .entry(label("dimension").to_string())
                            .or_default() += value;
                    }
                    "vigia_signals_fired_total" => {
                        *scene_in(&mut totals.scenes, scene)
                            .signals
                            .entry(label("signal").to_string())
                            .or_default() += value;
                    }
                    // `all`: the pass named no scene (see `Metrics::challenge_pass`);
                    // kept apart so it never shows up as a scene of its own.
                    "vigia_challenge_passes_total" => match scene {
                        "all" => totals.challenge_passes_unscoped += value,
                        _ => scene_in(&mut totals.scenes, scene).challenge_passes += value,
                    },
                    "vigia_degraded_decisions_total" => {
                        scene_in(&mut totals.scenes, scene).degraded += value
                    }
                    "vigia_store_errors_total" => totals.store_errors += value,
                    "vigia_rule_reloads_total" => {
                        *totals
                            .rule_reloads
                            .entry(label("result").to_string())
                            .or_default() += value;
                    }
                    _ => {}
                }
            }
        }
        totals
    }

    /// What counted between `earlier` and `self` (counters only grow; a name absent
    /// from `earlier` counted all of its value in between).
    pub fn since(&self, earlier: &Totals) -> Totals {
        fn map(
            now: &BTreeMap<String, u64>,
            then: Option<&BTreeMap<String, u64>>,
        ) -> BTreeMap<String, u64> {
            now.iter()
                .map(|(k, v)| {
                    let was = then.and_then(|t| t.get(k)).copied().unwrap_or(0);
                    (k.clone(), v.saturating_sub(was))
                })
                .collect()
        }
        let scenes = self
            .scenes
            .iter()
            .map(|(name, now)| {
                let then = earlier.scenes.get(name);
                let was = |f: fn(&SceneTotals) -> u64| then.map_or(0, f);
                let scene = SceneTotals {
                    decisions: Decisions {
                        allow: now
                            .decisions
                            .allow
                            .saturating_sub(was(|t| t.decisions.allow)),
                        challenge: now
                            .decisions
                            .challenge
                            .saturating_sub(was(|t| t.decisions.challenge)),
                        friendly_deny: now
                            .decisions
                            .friendly_deny
                            .saturating_sub(was(|t| t.decisions.friendly_deny)),
                        silent_deny: now
                            .decisions
                            .silent_deny
                            .saturating_sub(was(|t| t.decisions.silent_deny)),
                    },
                    degraded: now.degraded.saturating_sub(was(|t| t.degraded)),
                    limits: map(&now.limits, then.map(|t| &t.limits)),
                    dimensions: map(&now.dimensions, then.map(|t| &t.dimensions)),
                    signals: map(&now.signals, then.map(|t| &t.signals)),
                    challenge_passes: now
                        .challenge_passes
                        .saturating_sub(was(|t| t.challenge_passes)),
                };
                (name.clone(), scene)
            })
            .collect();
        Totals {
            scenes,
            store_errors: self.store_errors.saturating_sub(earlier.store_errors),
            rule_reloads: map(&self.rule_reloads, Some(&earlier.rule_reloads)),
            challenge_passes_unscoped: self
                .challenge_passes_unscoped
                .saturating_sub(earlier.challenge_passes_unscoped),
        }
    }
}

fn scene_in<'a>(scenes: &'a mut BTreeMap<String, SceneTotals>, name: &str) -> &'a mut SceneTotals {
    scenes.entry(name.to_string()).or_default()
}

/// The store's circuit breaker as the `vigia_store_breaker_open` gauge says: `open` or
/// `closed`; `None` for a store without one (embedded).
pub fn breaker_state(families: &[MetricFamily]) -> Option<&'static str> {
    let family = families
        .iter()
        .find(|f| f.name() == "vigia_store_breaker_open")?;
    let open = family
        .get_metric()
        .iter()
        .any(|m| m.get_gauge().get_value() > 0.0);
    Some(if open { "open" } else { "closed" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn rules() -> RuleSet {
        crate::rules::compile_files(&[(
            "s.toml".into(),
            r#"
[scene.s]
on_store_error = "fail_open"
required = ["user", "ip"]

[[scene.s.limits]]
name = "per_ip"
dimensions = ["ip"]
algorithm = "fixed_window"
window = "1m"
max = 5
"#
            .into(),
        )])
        .expect("valid rules")
    }

    #[test]
    fn lists_every_limit_before_it_counts_and_counts_what_metrics_export() {
        let metrics = Metrics::new();
        let rules = rules();
        let empty = Totals::read(&metrics.gather(), &rules);
        assert_eq!(empty.scenes["s"].limits["per_ip"], 0);
        assert_eq!(empty.scenes["s"].dimensions["ip"], 0);

        metrics.decision("s", "allow", "none", "none");
        metrics.decision("s", "friendly_deny", "business", "per_ip");
        metrics.block("s", "per_ip", "ip");
        metrics.degraded("s", "fail_open");
        metrics.store_error("redis", "timeout");
        let now = Totals::read(&metrics.gather(), &rules);
        let s = &now.scenes["s"];
        assert_eq!(s.decisions.checks(), 2);
        assert_eq!(s.decisions.friendly_deny, 1);
        assert_eq!(s.limits["per_ip"], 1);
        assert_eq!(s.dimensions["ip"], 1);
        assert_eq!(s.degraded, 1);
        assert_eq!(now.store_errors, 1);

        metrics.block("s", "per_ip", "ip");
        let later = Totals::read(&metrics.gather(), &rules);
        let delta = later.since(&now);
        assert_eq!(delta.scenes["s"].limits["per_ip"], 1);
        assert_eq!(delta.scenes["s"].decisions.checks(), 0);
        assert_eq!(delta.store_errors, 0);
    }

    #[test]
    fn challenges_count_as_checks_and_passes_go_to_their_scene_or_to_none() {
        let metrics = Metrics::new();
        let rules = rules();
        metrics.decision("s", "challenge", "security", "score");
        metrics.decision("s", "challenge", "security", "score");
        metrics.decision("s", "allow", "none", "none");
        metrics.challenge_pass("s");
        let before = Totals::read(&metrics.gather(), &rules);
        let s = &before.scenes["s"];
        assert_eq!(s.decisions.challenge, 2);
        assert_eq!(s.decisions.checks(), 3, "a challenge is a check decided");
        assert_eq!(s.challenge_passes, 1);

        // A pass naming no scene is counted apart, not as a scene called "all".
        metrics.challenge_pass("all");
        metrics.challenge_pass("s");
        let after = Totals::read(&metrics.gather(), &rules);
        assert_eq!(after.scenes.keys().collect::<Vec<_>>(), ["s"], "{after:?}");
        assert_eq!(after.challenge_passes_unscoped, 1);
        let delta = after.since(&before);
        assert_eq!(delta.scenes["s"].challenge_passes, 1);
        assert_eq!(delta.scenes["s"].decisions.challenge, 0);
        assert_eq!(delta.challenge_passes_unscoped, 1);
    }

    #[test]
    fn the_breaker_state_comes_from_its_gauge() {
        let metrics = Metrics::new();
        assert_eq!(breaker_state(&metrics.gather()), None);
        metrics.breaker("redis", false);
        assert_eq!(breaker_state(&metrics.gather()), Some("closed"));
        metrics.breaker("redis", true);
        assert_eq!(breaker_state(&metrics.gather()), Some("open"));
    }
}
