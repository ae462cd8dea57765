//! The arithmetic of a decision, shared by both deciders: the embedded one calls these
//! functions, and `lua/decide.lua` mirrors them step for step (the behaviour suite, run on
//! both, holds them to the same answers). Pure functions of their arguments. A signal's
//! own arithmetic (its cap, share and firing) is [`crate::signal`]'s, shared with the
//! behaviour actors.

use super::{Facts, LimitPlan, ScorePlan, SignalValue, TrustPlan};
use crate::rules::Filter;
use crate::signal::round;

/// Was something born at `born_ms` younger than `younger_than_ms` at `now_ms`?
pub fn is_young(born_ms: u64, now_ms: u64, younger_than_ms: u64) -> bool {
    now_ms.saturating_sub(born_ms) < younger_than_ms
}

/// Does a request with these facts pass `filter`? An unknown age is not young; a pass not
/// looked for is not a pass.
pub fn passes(filter: Filter, facts: &Facts) -> bool {
    match filter {
        Filter::NewAccount => facts.new_account == Some(true),
        Filter::NewDevice => facts.new_device == Some(true),
        Filter::Untrusted => facts.points == 0,
        Filter::Unverified => facts.passed != Some(true),
    }
}

/// The score, and whether it denies: fired signals' weights in plan order, then
/// `new_account`'s, minus `points * discount`, clamped to [0, 1] and rounded to 1e-9.
/// Without a plan nothing is weighed (the score is 0) and nothing is denied.
pub fn score(
    plan: Option<&ScorePlan>,
    signals: &[SignalValue],
    facts: &Facts,
    discount_per_point: f64,
) -> (f64, bool) {
    let Some(plan) = plan else {
        return (0.0, false);
    };
    // `round` also turns a `-0.0` (clamp keeps the sign of a zero) into `0.0`.
    let mut raw = 0.0;
    for (signal, weight) in signals.iter().zip(&plan.weights) {
        if signal.fired {
            raw += weight;
        }
    }
    if let (Some(weight), Some(true)) = (plan.new_account_weight, facts.new_account) {
        raw += weight;
    }
    let discount = f64::from(facts.points) * discount_per_point;
    let score = round((raw - discount).clamp(0.0, 1.0));
    (score, score >= plan.silent_deny_at)
}

/// Whether a check that the score did not deny is challenged: its score is in the band
/// (`challenge_at` or more; below `silent_deny_at`, or the score denied) and no pass lifts it.
pub fn challenged(plan: Option<&ScorePlan>, score: f64, facts: &Facts) -> bool {
    plan.and_then(|p| p.challenge_at)
        .is_some_and(|at| score >= at && facts.passed != Some(true))
}

/// The max a limit holds this request to: a new account gets `max_factor` of a per-user
/// limit (rounded down, never below 1), then trust points add `points * bonus_per_point`
/// to a `trust_bonus` limit.
pub fn effective_max(limit: &LimitPlan, facts: &Facts, trust: Option<&TrustPlan>) -> u64 {
    let mut max = limit.base_max;
    let Some(trust) = trust else {
        return max;
    };
    if let (Some((_, factor)), Some(true)) = (trust.new_account, facts.new_account) {
        if limit.per_user {
            // Float math on counts up to 2^53 is exact enough; `as` saturates.
            max = ((max as f64 * factor).floor() as u64).max(1);
        }
    }
    if limit.trust_bonus {
        max = max.saturating_add(u64::from(facts.points) * u64::from(trust.bonus_per_point));
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Algorithm;

    fn fired(weights_fired: &[bool]) -> Vec<SignalValue> {
        weights_fired
            .iter()
            .map(|&fired| SignalValue {
                applies: true,
                value: 0,
                share: None,
                fired,
            })
            .collect()
    }

    fn plan(weights: &[f64], new_account: Option<f64>, at: f64) -> ScorePlan {
        ScorePlan {
            weights: weights.to_vec(),
            new_account_weight: new_account,
            silent_deny_at: at,
            challenge_at: None,
        }
    }

    #[test]
    fn weights_add_as_written_the_line_is_inclusive_and_trust_discounts() {
        let p = plan(&[0.6, 0.1, 0.5], Some(0.2), 0.7);
        let none = Facts::default();
        assert_eq!(
            score(Some(&p), &fired(&[true, true, false]), &none, 0.1),
            (0.7, true)
        );
        assert_eq!(
            score(Some(&p), &fired(&[true, false, false]), &none, 0.1),
            (0.6, false)
        );
        let young = Facts {
            new_account: Some(true),
            ..Facts::default()
        };
        assert_eq!(
            score(Some(&p), &fired(&[false, false, true]), &young, 0.1),
            (0.7, true)
        );
        let trusted = Facts { points: 2, ..young };
        assert_eq!(
            score(Some(&p), &fired(&[true, true, true]), &trusted, 0.1),
            (1.0, true)
        );
        assert_eq!(
            score(Some(&p), &fired(&[true, false, false]), &trusted, 0.1),
            (0.6, false)
        );
        assert_eq!(
            score(Some(&p), &fired(&[false, false, false]), &trusted, 0.5),
            (0.0, false)
        );
        assert_eq!(
            score(None, &fired(&[true, true, true]), &young, 0.0),
            (0.0, false)
        );
    }

    #[test]
    fn a_zero_score_is_never_negative_zero() {
        // What rounds to zero from below (a script's "-0", a float leftover) is 0.0.
        for x in [-0.0, -1e-12] {
            let r = crate::signal::round(x);
            assert!(r == 0.0 && r.is_sign_positive(), "{x:?} -> {r:?}");
            assert_eq!(serde_json::to_string(&r).unwrap(), "0.0");
        }
        let p = plan(&[0.1], None, 0.7);
        let (s, _) = score(Some(&p), &fired(&[false]), &Facts::default(), 0.1);
        assert_eq!(serde_json::to_string(&s).unwrap(), "0.0");
    }

    #[test]
    fn a_filter_passes_only_what_is_known() {
        let unknown = Facts::default();
        assert!(!passes(Filter::NewAccount, &unknown));
        assert!(!passes(Filter::NewDevice, &unknown));
        assert!(passes(Filter::Untrusted, &unknown));
        let f = Facts {
            points: 1,
            new_account: Some(true),
            new_device: Some(false),
            passed: None,
        };
        assert!(passes(Filter::NewAccount, &f));
        assert!(!passes(Filter::NewDevice, &f));
        assert!(!passes(Filter::Untrusted, &f));
    }

    #[test]
    fn new_accounts_get_a_share_of_per_user_limits_and_trust_adds() {
        let limit = |per_user, trust_bonus| LimitPlan {
            key: "k".into(),
            algorithm: Algorithm::SlidingWindow,
            window_ms: 1000,
            base_max: 5,
            per_user,
            trust_bonus,
            retain_ms: 1000,
            filter: None,
        };
        let trust = TrustPlan {
            points_key: None,
            user_seen_key: None,
            device_seen_key: None,
            user_created_ms: None,
            seen_ttl_ms: 1,
            max_points: 3,
            bonus_per_point: 2,
            discount_per_point: 0.0,
            new_account: Some((1000, 0.5)),
            new_device_ms: None,
            passes: None,
        };
        let young = Facts {
            points: 1,
            new_account: Some(true),
            new_device: None,
            passed: None,
        };
        assert_eq!(effective_max(&limit(true, false), &young, Some(&trust)), 2);
        assert_eq!(effective_max(&limit(false, false), &young, Some(&trust)), 5);
        assert_eq!(effective_max(&limit(true, true), &young, Some(&trust)), 4);
        assert_eq!(effective_max(&limit(true, true), &young, None), 5);
        let tiny = LimitPlan {
            base_max: 1,
            ..limit(true, false)
        };
        assert_eq!(
            effective_max(&tiny, &young, Some(&trust)),
            1,
            "never below 1"
        );
        assert!(is_young(0, 999, 1000));
        assert!(!is_young(0, 1000, 1000));
    }
}
