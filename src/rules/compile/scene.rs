//! Compiles one `[scene.NAME]`: its own keys here, then its limits, overrides,
//! behaviour and score through their modules.

use std::collections::BTreeSet;

use super::diag::Diag;
use super::limits::{compile_limits, compile_overrides};
use super::signals::{compile_behaviour, compile_score, compile_signals};
use crate::rules::raw::{key_segment, RawChallenge, RawGateway, RawScene, RawSceneHead};
use crate::rules::{Behaviour, Challenge, Dimension, Gateway, Network, Scene, StoreErrorPolicy};

const POLICIES: [(&str, StoreErrorPolicy); 3] = [
    ("fail_open", StoreErrorPolicy::FailOpen),
    ("fail_close", StoreErrorPolicy::FailClose),
    ("local", StoreErrorPolicy::Local),
];

/// What the rest of the rule set says about `[trust].new_account`: `None` when a broken
/// `[trust]` leaves it unknown (then nothing is reported against it).
pub type NewAccountKnown = Option<bool>;

/// What the set-wide sections say that a scene's parts depend on. An unknown (a broken
/// section) is `None`, and then nothing is reported against it.
pub struct SetFacts {
    pub new_account: NewAccountKnown,
    /// The names `[attributes]` declares.
    pub attributes: Option<BTreeSet<String>>,
    /// What `[trust]` configures, which decides the `where` filters a rule may use.
    pub trust: Option<TrustShape>,
    /// `[network]` (its defaults when absent), which decides the ranges an override may
    /// name.
    pub network: Option<Network>,
}

/// Which parts of `[trust]` exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrustShape {
    pub present: bool,
    pub new_account: bool,
    pub new_device: bool,
}

/// Checks one scene, reporting every problem; `Some` only when it is wholly valid.
pub fn compile_scene(d: &mut Diag, raw: &RawScene, facts: &SetFacts) -> Option<Scene> {
    let path = format!("scene{}", key_segment(raw.name.get_ref()));
    let name_ok = d.key_name(&path, "scene name", &raw.name);
    let head = raw
        .head
        .as_ref()
        .map(|head| compile_head(d, &path, raw, head, facts));
    // Dimensions of limits are checked against `required` only when it could be read.
    let required = head.as_ref().and_then(|h| h.required.clone());
    let limits = compile_limits(d, &path, &raw.limits, required.as_deref(), facts);
    let overrides = compile_overrides(d, &path, raw, facts.network.as_ref());
    let behaviour = match &raw.behaviour {
        Some(b) => compile_behaviour(d, &path, b),
        None => Some(Behaviour::default()),
    };
    let signals = compile_signals(
        d,
        &path,
        raw,
        behaviour.as_ref(),
        required.as_deref(),
        facts,
    );
    let score = raw
        .score
        .as_ref()
        .map(|s| compile_score(d, &path, raw, s, facts.new_account));
    let challenge = compile_challenge(d, &path, raw);

    let head = head?;
    // The shorthands live on as `signals`; one that did not compile fails the scene.
    behaviour?;
    let limits = limits.into_iter().collect::<Option<Vec<_>>>()?;
    if !name_ok || !raw.complete {
        return None;
    }
    Some(Scene {
        name: raw.name.get_ref().clone(),
        on_store_error: head.on_store_error?,
        deny_message: head.deny_message,
        required: head.required?,
        gateway: head.gateway?,
        limits,
        overrides: overrides?,
        signals: signals?,
        score: score.map_or(Some(None), |s| s.map(Some))?,
        challenge: challenge?,
    })
}

/// `[scene.X.challenge]`, and that it goes with a way to answer challenge: a band needs
/// the section (the answer says what to ask), and the section needs a band.
fn compile_challenge(d: &mut Diag, path: &str, raw: &RawScene) -> Option<Option<Challenge>> {
    let band = raw.score.as_ref().and_then(|s| s.challenge_at.as_ref());
    let Some(c) = &raw.challenge else {
        // A section that could not be read is reported on its own (`complete` is false).
        if let (Some(at), true) = (band, raw.complete) {
            d.at(
                &at.span(),
                format!(
                    "{path}.score.challenge_at: the scene can answer challenge, so it needs [{path}.challenge] with kind and pass_ttl"
                ),
            );
            return None;
        }
        return Some(None);
    };
    let compiled = challenge(d, path, c);
    // A section nothing can trigger is a mistake the operator would want to hear of.
    if band.is_none() {
        d.at(
            &c.kind.span(),
            format!(
                "{path}.challenge: nothing answers challenge in this scene: set [{path}.score].challenge_at"
            ),
        );
        return None;
    }
    compiled.map(Some)
}

fn challenge(d: &mut Diag, path: &str, raw: &RawChallenge) -> Option<Challenge> {
    let kind = raw.kind.get_ref().trim();
    let kind_ok = if kind.is_empty() {
        d.at(
            &raw.kind.span(),
            format!("{path}.challenge.kind: empty (what the backend asks: captcha, sms…)"),
        );
        false
    } else {
        true
    };
    let pass_ttl_ms = d.duration(&format!("{path}.challenge.pass_ttl"), &raw.pass_ttl);
    kind_ok.then_some(())?;
    Some(Challenge {
        kind: kind.to_string(),
        message: raw.message.as_ref().map(|m| m.get_ref().clone()),
        pass_ttl_ms: pass_ttl_ms?,
    })
}

/// The scene's own keys, each `None` when invalid.
struct Head {
    on_store_error: Option<StoreErrorPolicy>,
    deny_message: Option<String>,
    required: Option<Vec<Dimension>>,
    /// `Some(None)`: no gateway.
    gateway: Option<Option<Gateway>>,
}

fn compile_head(
    d: &mut Diag,
    path: &str,
    raw: &RawScene,
    head: &RawSceneHead,
    facts: &SetFacts,
) -> Head {
    let on_store_error = match &head.on_store_error {
        Some(policy) => d.choice(&format!("{path}.on_store_error"), policy, &POLICIES),
        None => {
            d.at(
                &raw.name.span(),
                format!("{path}.on_store_error: missing (fail_open | fail_close | local)"),
            );
            None
        }
    };
    Head {
        on_store_error,
        deny_message: head.deny_message.as_ref().map(|m| m.get_ref().clone()),
        required: compile_required(d, path, head, facts),
        gateway: match &head.gateway {
            Some(g) => compile_gateway(d, path, g.get_ref()).map(Some),
            None => Some(None),
        },
    }
}

fn compile_required(
    d: &mut Diag,
    path: &str,
    head: &RawSceneHead,
    facts: &SetFacts,
) -> Option<Vec<Dimension>> {
    let mut dims = Vec::new();
    let mut ok = true;
    for (i, name) in head.required.iter().enumerate() {
        let field = format!("{path}.required[{i}]");
        match d.dimension(&field, name, facts) {
            Some(Dimension::Net) => {
                d.at(
                    &name.span(),
                    format!("{field}: \"net\" comes from the check's ip: require \"ip\" instead"),
                );
                ok = false;
            }
            Some(dim) if dims.contains(&dim) => {
                d.at(
                    &name.span(),
                    format!("{field}: {:?} is listed twice", dim.name()),
                );
                ok = false;
            }
            Some(dim) => dims.push(dim),
            None => ok = false,
        }
    }
    ok.then_some(dims)
}

fn compile_gateway(d: &mut Diag, path: &str, raw: &RawGateway) -> Option<Gateway> {
    let rate_per_s = d.at_least_u32(&format!("{path}.gateway.rate_per_s"), &raw.rate_per_s, 1);
    let burst = d.at_least_u32(&format!("{path}.gateway.burst"), &raw.burst, 1);
    Some(Gateway {
        rate_per_s: rate_per_s?,
        burst: burst?,
    })
}
