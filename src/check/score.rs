//! The scorer: behaviour signals and the new-account flag become a risk score in [0, 1].
//!
//! Per API.md: a signal whose value (the current request included) exceeds its max adds
//! its weight; trust points discount; the result is clamped to [0, 1]; at or over the
//! scene's `silent_deny_at` the check is a silent deny with reason `score`. Pure functions:
//! the pipeline gathers the inputs (actors, ledger) and applies the verdict.

use super::decision::SignalReport;
use crate::behaviour::state::Signals;
use crate::rules::{Scene, Trust};

/// The name of the new-account signal in `[scene.X.score].weights`.
pub const NEW_ACCOUNT: &str = "new_account";

/// Scores are compared after rounding to this many decimal places, so weights written as
/// decimals add up as they read (0.6 + 0.1 reaches a threshold of 0.7).
const SCORE_DECIMALS: f64 = 1e9;

/// What the scorer decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub score: f64,
    /// Every signal the scene configures and that was answered, in a fixed order.
    pub signals: Vec<SignalReport>,
    /// The score reached the scene's `silent_deny_at`.
    pub deny: bool,
}

/// Scores one check. `signals` are the behaviour actors' answers (`None` where a shard did
/// not answer in time: no signal, no contribution); `new_account` is `None` when unknown
/// or when the rule set has no `[trust].new_account`; `points` are already capped.
pub fn score(
    scene: &Scene,
    signals: &Signals,
    new_account: Option<bool>,
    trust: Option<&Trust>,
    points: u32,
) -> Scored {
    let weight = |name: &str| {
        scene
            .score
            .as_ref()
            .and_then(|s| s.weights.get(name).copied())
            .unwrap_or(0.0)
    };
    let b = &scene.behaviour;
    let configured = [
        (
            "accounts_per_device",
            b.accounts_per_device,
            signals.accounts_per_device,
        ),
        (
            "account_switches",
            b.account_switches,
            signals.account_switches,
        ),
        (
            "devices_per_user",
            b.devices_per_user,
            signals.devices_per_user,
        ),
        (
            "accounts_per_ip",
            b.accounts_per_ip,
            signals.accounts_per_ip,
        ),
    ];
    let mut reports: Vec<SignalReport> = configured
        .into_iter()
        .filter_map(|(name, rule, value)| {
            let (rule, value) = (rule?, value?);
            Some(report(name, value, rule.max, weight(name)))
        })
        .collect();
    if let Some(is_new) = new_account {
        reports.push(report(
            NEW_ACCOUNT,
            u64::from(is_new),
            0,
            weight(NEW_ACCOUNT),
        ));
    }
    let raw: f64 = reports.iter().map(|r| r.contribution).sum();
    let discount = trust.map_or(0.0, |t| f64::from(points) * t.score_discount_per_point);
    let score = ((raw - discount).clamp(0.0, 1.0) * SCORE_DECIMALS).round() / SCORE_DECIMALS;
    let deny = scene
        .score
        .as_ref()
        .is_some_and(|s| score >= s.silent_deny_at);
    Scored {
        score,
        signals: reports,
        deny,
    }
}

fn report(name: &str, value: u64, max: u64, weight: f64) -> SignalReport {
    SignalReport {
        name: name.to_string(),
        value,
        max,
        contribution: if value > max { weight } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::rules::{Behaviour, Score, SignalRule, StoreErrorPolicy};

    fn scene(weights: &[(&str, f64)], silent_deny_at: f64) -> Scene {
        let rule = |max| {
            Some(SignalRule {
                window_ms: 60_000,
                max,
            })
        };
        Scene {
            name: "s".into(),
            on_store_error: StoreErrorPolicy::FailClose,
            deny_message: None,
            required: vec![],
            gateway: None,
            limits: vec![],
            overrides: vec![],
            signals: vec![],
            behaviour: Behaviour {
                accounts_per_device: rule(3),
                account_switches: rule(2),
                devices_per_user: rule(5),
                accounts_per_ip: rule(50),
            },
            score: Some(Score {
                weights: weights
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect::<BTreeMap<_, _>>(),
                silent_deny_at,
            }),
        }
    }

    fn trust(discount: f64) -> Trust {
        Trust {
            payment_succeeded: None,
            identity_verified: None,
            max_points: 3,
            bonus_per_point: 1,
            score_discount_per_point: discount,
            new_account: None,
            new_device: None,
        }
    }

    const API_WEIGHTS: &[(&str, f64)] = &[
        ("accounts_per_device", 0.6),
        ("account_switches", 0.5),
        ("devices_per_user", 0.3),
        ("accounts_per_ip", 0.2),
    ];

    fn signals(apd: u64, sw: u64, dpu: u64, api: u64) -> Signals {
        Signals {
            accounts_per_device: Some(apd),
            account_switches: Some(sw),
            devices_per_user: Some(dpu),
            accounts_per_ip: Some(api),
        }
    }

    #[test]
    fn a_signal_contributes_only_past_its_max() {
        let s = scene(API_WEIGHTS, 0.7);
        let at_max = score(&s, &signals(3, 2, 5, 50), None, None, 0);
        assert_eq!(at_max.score, 0.0);
        assert!(!at_max.deny);
        assert!(at_max.signals.iter().all(|r| r.contribution == 0.0));
        let over = score(&s, &signals(4, 2, 5, 50), None, None, 0);
        assert_eq!(over.score, 0.6);
        assert_eq!(over.signals[0].name, "accounts_per_device");
        assert_eq!((over.signals[0].value, over.signals[0].max), (4, 3));
        assert_eq!(over.signals[0].contribution, 0.6);
        assert!(!over.deny);
    }

    #[test]
    fn weights_add_up_as_written_and_the_threshold_is_inclusive() {
        let s = scene(
            &[("accounts_per_device", 0.6), ("accounts_per_ip", 0.1)],
            0.7,
        );
        let r = score(&s, &signals(4, 0, 0, 51), None, None, 0);
        assert_eq!(r.score, 0.7);
        assert!(r.deny, "0.6 + 0.1 reaches 0.7");
    }

    #[test]
    fn the_score_is_clamped_to_one() {
        let s = scene(API_WEIGHTS, 0.7);
        let r = score(&s, &signals(9, 9, 9, 99), None, None, 0);
        assert_eq!(r.score, 1.0);
        assert!(r.deny);
    }

    #[test]
    fn trust_discounts_and_never_goes_below_zero() {
        let s = scene(API_WEIGHTS, 0.7);
        let t = trust(0.1);
        let r = score(&s, &signals(4, 3, 0, 0), None, Some(&t), 3);
        // 0.6 + 0.5 = 1.1 -> 1.1 - 0.3 = 0.8, clamped after the discount.
        assert_eq!(r.score, 0.8);
        assert!(r.deny);
        let r = score(&s, &signals(4, 0, 0, 0), None, Some(&t), 2);
        assert_eq!(r.score, 0.4);
        assert!(!r.deny, "trust took a would-be 0.6 down to 0.4");
        let r = score(&s, &signals(0, 0, 0, 0), None, Some(&t), 3);
        assert_eq!(r.score, 0.0);
    }

    #[test]
    fn an_unanswered_signal_is_absent_and_adds_nothing() {
        let s = scene(API_WEIGHTS, 0.7);
        let sig = Signals {
            accounts_per_device: None,
            ..signals(0, 9, 0, 0)
        };
        let r = score(&s, &sig, None, None, 0);
        assert_eq!(r.score, 0.5);
        assert!(r.signals.iter().all(|x| x.name != "accounts_per_device"));
        assert_eq!(r.signals.len(), 3);
    }

    #[test]
    fn new_account_is_a_signal_with_max_zero() {
        let s = scene(&[("new_account", 0.3)], 0.7);
        let young = score(&s, &signals(0, 0, 0, 0), Some(true), None, 0);
        let na = young
            .signals
            .iter()
            .find(|r| r.name == NEW_ACCOUNT)
            .unwrap();
        assert_eq!((na.value, na.max, na.contribution), (1, 0, 0.3));
        assert_eq!(young.score, 0.3);
        let old = score(&s, &signals(0, 0, 0, 0), Some(false), None, 0);
        assert_eq!(old.score, 0.0);
        let unknown = score(&s, &signals(0, 0, 0, 0), None, None, 0);
        assert!(unknown.signals.iter().all(|r| r.name != NEW_ACCOUNT));
    }

    #[test]
    fn a_scene_without_score_reports_signals_but_never_denies() {
        let mut s = scene(API_WEIGHTS, 0.7);
        s.score = None;
        let r = score(&s, &signals(99, 99, 99, 999), None, None, 0);
        assert_eq!(r.score, 0.0);
        assert!(!r.deny);
        assert_eq!(r.signals.len(), 4);
    }
}
