//! Compiles a scene's signals — the `[behaviour]` shorthands and `[[signals]]` entries, one
//! grammar (count × per × where × window) — and the `[score]` that weighs them.

use std::collections::BTreeMap;

use toml::Spanned;

use super::diag::Diag;
use super::limits::compile_dimensions;
use super::scene::{NewAccountKnown, SetFacts};
use crate::rules::raw::{RawBehaviour, RawScene, RawScore, RawSignal, RawSignalEntry, SIGNALS};
use crate::rules::{Behaviour, Count, Dimension, Score, Signal, SignalRule};

/// The score signal for users younger than `[trust].new_account`.
const NEW_ACCOUNT: &str = "new_account";

/// What each `[behaviour]` shorthand means in the grammar: (name, count, per).
pub const SHORTHANDS: [(&str, Count, Dimension); 4] = [
    ("accounts_per_device", Count::Users, Dimension::Device),
    ("account_switches", Count::UserSwitches, Dimension::Device),
    ("devices_per_user", Count::Devices, Dimension::User),
    ("accounts_per_ip", Count::Users, Dimension::Ip),
];

/// Every signal of the scene: the shorthands of `behaviour` (already checked) first, then
/// each `[[signals]]` entry. Each must count and be per dimensions the check carries.
/// `None` when any is invalid.
pub fn compile_signals(
    d: &mut Diag,
    scene: &str,
    raw: &RawScene,
    behaviour: Option<&Behaviour>,
    required: Option<&[Dimension]>,
    facts: &SetFacts,
) -> Option<Vec<Signal>> {
    let mut out = Some(Vec::new());
    if let (Some(b), Some(rb)) = (behaviour, &raw.behaviour) {
        let rules = [
            b.accounts_per_device,
            b.account_switches,
            b.devices_per_user,
            b.accounts_per_ip,
        ];
        for (((name, count, per), rule), (_, spanned)) in
            SHORTHANDS.iter().zip(rules).zip(rb.signals())
        {
            let (Some(rule), Some(spanned)) = (rule, spanned) else {
                continue;
            };
            let counted = count.counted().unwrap_or(Dimension::User);
            let missing: Vec<String> = [per.clone(), counted]
                .iter()
                .filter(|dim| required.is_some_and(|req| !req.contains(dim)))
                .map(|dim| format!("{:?}", dim.name()))
                .collect();
            if !missing.is_empty() {
                d.at(
                    &spanned.span(),
                    format!(
                        "{scene}.behaviour.{name}: counts {} per {}; add {} to {scene}.required",
                        count.name(),
                        per.name(),
                        missing.join(" and ")
                    ),
                );
                out = None;
                continue;
            }
            if let Some(all) = out.as_mut() {
                all.push(Signal {
                    name: name.to_string(),
                    count: *count,
                    per: vec![per.clone()],
                    filter: None,
                    window_ms: rule.window_ms,
                    max: rule.max,
                    min_share: None,
                });
            }
        }
    }
    for (i, entry) in raw.signals.iter().enumerate() {
        let Some(entry) = entry else {
            out = None;
            continue;
        };
        let path = format!("{scene}.signals[{i}]");
        let compiled = compile_entry(d, &path, scene, raw, entry, i, required, facts);
        out = out.zip(compiled).map(|(mut all, s)| {
            all.push(s);
            all
        });
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn compile_entry(
    d: &mut Diag,
    path: &str,
    scene: &str,
    owner: &RawScene,
    raw: &RawSignalEntry,
    index: usize,
    required: Option<&[Dimension]>,
    facts: &SetFacts,
) -> Option<Signal> {
    let field = format!("{path}.name");
    let name = raw.name.get_ref();
    let mut name_ok = d.key_name(&field, "signal name", &raw.name);
    let shorthand = owner
        .behaviour
        .as_ref()
        .is_some_and(|b| b.signals().iter().any(|(n, s)| *n == name && s.is_some()));
    let earlier = owner.signals[..index]
        .iter()
        .position(|e| e.as_ref().is_some_and(|e| e.name.get_ref() == name));
    let clash = if name == NEW_ACCOUNT {
        Some("is the score's new-account signal".to_string())
    } else if shorthand {
        Some(format!("is already configured in {scene}.behaviour"))
    } else {
        earlier.map(|j| format!("is already the name of {scene}.signals[{j}]"))
    };
    if let Some(clash) = clash {
        d.at(
            &raw.name.span(),
            format!("{field}: {name:?} {clash} (signal names are unique within a scene)"),
        );
        name_ok = false;
    }
    let choices = Count::ALL.map(|c| (c.name(), c));
    let count = d.choice(&format!("{path}.count"), &raw.count, &choices);
    let per = compile_dimensions(
        d,
        &format!("{path}.per"),
        scene,
        &raw.per,
        required,
        facts,
        "signal",
    );
    let filter = match &raw.filter {
        Some(f) => d.filter(&format!("{path}.where"), f, facts).map(Some),
        None => Some(None),
    };
    let window_ms = d.duration(&format!("{path}.window"), &raw.window);
    let max = d.at_least(&format!("{path}.max"), &raw.max, 0);
    let min_share = match &raw.min_share {
        Some(share) => d
            .fraction(&format!("{path}.min_share"), share, false)
            .map(Some),
        None => Some(None),
    };
    let count = count?;
    let per = per?;
    // What is counted must come with the check, and counting it per itself means nothing.
    if let Some(counted) = count.counted() {
        let carried_as = match counted {
            Dimension::Net => Dimension::Ip,
            ref other => other.clone(),
        };
        if per.contains(&counted) {
            d.at(
                &raw.count.span(),
                format!(
                    "{path}.count: counting {} per {} is always 1 (count something else, or per something else)",
                    count.name(),
                    counted.name()
                ),
            );
            return None;
        }
        if required.is_some_and(|req| !req.contains(&carried_as)) {
            d.at(
                &raw.count.span(),
                format!(
                    "{path}.count: counting {} needs {:?} in {scene}.required",
                    count.name(),
                    carried_as.name()
                ),
            );
            return None;
        }
    }
    let (filter, min_share) = (filter?, min_share?);
    if let (Some(share), Some(share_span)) = (min_share, raw.min_share.as_ref()) {
        let problem = if filter.is_none() {
            Some("needs where (the share of matching requests among all)")
        } else if count == Count::UserSwitches {
            Some("does not apply to user_switches")
        } else {
            None
        };
        if let Some(problem) = problem {
            d.at(
                &share_span.span(),
                format!("{path}.min_share: {share} {problem}"),
            );
            return None;
        }
    }
    if !name_ok {
        return None;
    }
    Some(Signal {
        name: name.clone(),
        count,
        per,
        filter,
        window_ms: window_ms?,
        max: max?,
        min_share,
    })
}

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
    let challenge_at = match (&raw.challenge_at, silent_deny_at) {
        (None, _) => Some(None),
        (Some(at), deny_at) => {
            let field = format!("{path}.challenge_at");
            match (d.fraction(&field, at, false), deny_at) {
                (Some(x), Some(deny_at)) if x >= deny_at => {
                    d.at(
                        &at.span(),
                        format!(
                            "{field}: {x} is not below silent_deny_at ({deny_at}): the challenge band is [challenge_at, silent_deny_at)"
                        ),
                    );
                    None
                }
                (x, _) => x.map(Some),
            }
        }
    };
    Some(Score {
        weights: ok.then_some(weights)?,
        silent_deny_at: silent_deny_at?,
        challenge_at: challenge_at?,
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
    } else if owner
        .signals
        .iter()
        .flatten()
        .any(|e| e.name.get_ref() == name)
    {
        return true;
    } else if !SIGNALS.contains(&name) {
        let mut known: Vec<&str> = owner
            .signals
            .iter()
            .flatten()
            .map(|e| e.name.get_ref().as_str())
            .collect();
        known.extend(SIGNALS);
        known.push(NEW_ACCOUNT);
        // Entries that could not be read may hold the name.
        if owner.signals.iter().any(Option::is_none) {
            return false;
        }
        format!("{name:?} is not a signal of {scene} ({})", known.join(", "))
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
