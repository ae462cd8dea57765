//! Compiles a scene's `[behaviour]` thresholds and the `[score]` that weighs them.

use std::collections::BTreeMap;

use toml::Spanned;

use super::diag::Diag;
use super::scene::NewAccountKnown;
use crate::rules::raw::{RawBehaviour, RawScene, RawScore, RawSignal, SIGNALS};
use crate::rules::{Behaviour, Score, SignalRule};

/// The score signal for users younger than `[trust].new_account`.
const NEW_ACCOUNT: &str = "new_account";

/// Checks every configured signal; `Some` only when all are valid.
pub fn compile_behaviour(d: &mut Diag, scene: &str, raw: &RawBehaviour) -> Option<Behaviour> {
    let [apd, sw, dpu, api] = raw.signals().map(|(name, signal)| match signal {
        None => Some(None),
        Some(s) => compile_signal(d, &format!("{scene}.behaviour.{name}"), name, s).map(Some),
    });
    Some(Behaviour {
        accounts_per_device: apd?,
        account_switches: sw?,
        devices_per_user: dpu?,
        accounts_per_ip: api?,
    })
}

/// One signal's threshold; `account_switches` may be 0 (any switch counts), the
/// others must allow at least one.
fn compile_signal(
    d: &mut Diag,
    path: &str,
    name: &str,
    raw: &Spanned<RawSignal>,
) -> Option<SignalRule> {
    let raw = raw.get_ref();
    let min = if name == "account_switches" { 0 } else { 1 };
    let window_ms = d.duration(&format!("{path}.window"), &raw.window);
    let max = d.at_least(&format!("{path}.max"), &raw.max, min);
    Some(SignalRule {
        window_ms: window_ms?,
        max: max?,
    })
}

/// Checks the weights (each names a configured signal or `new_account`, in [0, 1]) and
/// the deny line (in (0, 1]).
pub fn compile_score(
    d: &mut Diag,
    scene: &str,
    owner: &RawScene,
    raw: &RawScore,
    new_account: NewAccountKnown,
) -> Option<Score> {
    let path = format!("{scene}.score");
    let mut weights = BTreeMap::new();
    let mut ok = true;
    for (name, weight) in &raw.weights {
        let field = format!("{path}.weights.{name}");
        let known = check_weight_name(d, &field, scene, owner, name, weight, new_account);
        match d.fraction(&field, weight, true) {
            Some(w) if known => {
                weights.insert(name.clone(), w);
            }
            _ => ok = false,
        }
    }
    let silent_deny_at = d.fraction(
        &format!("{path}.silent_deny_at"),
        &raw.silent_deny_at,
        false,
    );
    Some(Score {
        weights: ok.then_some(weights)?,
        silent_deny_at: silent_deny_at?,
    })
}

fn check_weight_name(
    d: &mut Diag,
    field: &str,
    scene: &str,
    owner: &RawScene,
    name: &str,
    weight: &Spanned<f64>,
    new_account: NewAccountKnown,
) -> bool {
    let problem = if name == NEW_ACCOUNT {
        match new_account {
            Some(false) => {
                "needs [trust].new_account = { younger_than, max_factor } in the rule set"
                    .to_string()
            }
            _ => return true,
        }
    } else if !SIGNALS.contains(&name) {
        format!(
            "{name:?} is not a signal ({}, {NEW_ACCOUNT})",
            SIGNALS.join(", ")
        )
    } else {
        let configured = owner
            .behaviour
            .as_ref()
            .is_some_and(|b| b.signals().iter().any(|(n, s)| *n == name && s.is_some()));
        match configured {
            true => return true,
            // The behaviour table could not be read: the signal may well be in it.
            false if !owner.complete => return false,
            false => format!("{name:?} is not configured in {scene}.behaviour (add it there, or drop the weight)"),
        }
    };
    d.at(&weight.span(), format!("{field}: {problem}"));
    false
}
