//! Compiles a scene's `[[limits]]` and `[[overrides]]`: the counted rules and the CIDR
//! ranges that get a different max on them.

use std::str::FromStr;

use ipnet::IpNet;

use super::diag::Diag;
use super::scene::SetFacts;
use toml::Spanned;

use crate::rules::network::fold_range;
use crate::rules::raw::{RawLimit, RawOverride, RawScene, Text};
use crate::rules::{Algorithm, Dimension, Layer, Limit, Network, Override};

const ALGORITHMS: [(&str, Algorithm); 3] = [
    ("sliding_window", Algorithm::SlidingWindow),
    ("fixed_window", Algorithm::FixedWindow),
    ("token_bucket", Algorithm::TokenBucket),
];

const LAYERS: [(&str, Layer); 2] = [("business", Layer::Business), ("security", Layer::Security)];

/// Checks every limit; one entry per raw entry, `None` where invalid or unreadable.
///
/// `required` is the scene's valid `required` list, or `None` when it is unknown (then
/// dimensions are not checked against it, rather than reported for a problem elsewhere).
pub fn compile_limits(
    d: &mut Diag,
    scene: &str,
    raw: &[Option<RawLimit>],
    required: Option<&[Dimension]>,
    facts: &SetFacts,
) -> Vec<Option<Limit>> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, entry) in raw.iter().enumerate() {
        let path = format!("{scene}.limits[{i}]");
        let earlier = raw.get(..i).unwrap_or_default();
        out.push(
            entry
                .as_ref()
                .and_then(|limit| compile_limit(d, &path, scene, limit, earlier, required, facts)),
        );
    }
    out
}

fn compile_limit(
    d: &mut Diag,
    path: &str,
    scene: &str,
    raw: &RawLimit,
    earlier: &[Option<RawLimit>],
    required: Option<&[Dimension]>,
    facts: &SetFacts,
) -> Option<Limit> {
    let field = format!("{path}.name");
    let mut name_ok = d.key_name(&field, "limit name", &raw.name);
    let twin = earlier.iter().position(|l| {
        l.as_ref()
            .is_some_and(|l| l.name.get_ref() == raw.name.get_ref())
    });
    if let Some(j) = twin {
        d.at(
            &raw.name.span(),
            format!(
                "{field}: {:?} is already the name of {scene}.limits[{j}] (names are unique within a scene)",
                raw.name.get_ref()
            ),
        );
        name_ok = false;
    }
    let dimensions = compile_dimensions(
        d,
        &format!("{path}.dimensions"),
        scene,
        &raw.dimensions,
        required,
        facts,
        "limit",
    );
    let algorithm = d.choice(&format!("{path}.algorithm"), &raw.algorithm, &ALGORITHMS);
    let window_ms = d.duration(&format!("{path}.window"), &raw.window);
    let max = d.at_least(&format!("{path}.max"), &raw.max, 1);
    let layer = match &raw.layer {
        Some(layer) => d.choice(&format!("{path}.layer"), layer, &LAYERS),
        None => Some(Layer::Business),
    };
    let filter = match &raw.filter {
        Some(f) => d.filter(&format!("{path}.where"), f, facts).map(Some),
        None => Some(None),
    };
    if !name_ok {
        return None;
    }
    Some(Limit {
        name: raw.name.get_ref().clone(),
        dimensions: dimensions?,
        algorithm: algorithm?,
        window_ms: window_ms?,
        max: max?,
        layer: layer?,
        trust_bonus: raw.trust_bonus,
        filter: filter?,
    })
}

/// A dimension list of a limit or signal: known names, no repeats, each carried by the
/// check (in `required`; `net` through `ip`). Empty is the whole scene.
pub fn compile_dimensions(
    d: &mut Diag,
    field: &str,
    scene: &str,
    raw: &Spanned<Vec<Text>>,
    required: Option<&[Dimension]>,
    facts: &SetFacts,
    what: &str,
) -> Option<Vec<Dimension>> {
    let mut dims = Vec::new();
    let mut ok = true;
    for (i, name) in raw.get_ref().iter().enumerate() {
        let item = format!("{field}[{i}]");
        let Some(dim) = d.dimension(&item, name, facts) else {
            ok = false;
            continue;
        };
        // The check carries `net` in its ip.
        let carried_as = match dim {
            Dimension::Net => Dimension::Ip,
            ref other => other.clone(),
        };
        if dims.contains(&dim) {
            d.at(
                &name.span(),
                format!("{item}: {:?} is listed twice", dim.name()),
            );
            ok = false;
        } else if required.is_some_and(|req| !req.contains(&carried_as)) {
            d.at(
                &name.span(),
                format!(
                    "{item}: {:?} is not in {scene}.required (add {:?} to required: a check must carry every dimension a {what} counts)",
                    dim.name(),
                    carried_as.name()
                ),
            );
            ok = false;
        }
        dims.push(dim);
    }
    ok.then_some(dims)
}

/// Checks every override of `scene` against `network` (unknown when `[network]` is
/// broken); `Some` only when all are valid.
pub fn compile_overrides(
    d: &mut Diag,
    scene: &str,
    raw: &RawScene,
    network: Option<&Network>,
) -> Option<Vec<Override>> {
    let mut out = Some(Vec::with_capacity(raw.overrides.len()));
    for (i, entry) in raw.overrides.iter().enumerate() {
        let path = format!("{scene}.overrides[{i}]");
        let compiled = entry
            .as_ref()
            .and_then(|o| compile_override(d, &path, scene, raw, o, network));
        out = out.zip(compiled).map(|(mut all, o)| {
            all.push(o);
            all
        });
    }
    out
}

fn compile_override(
    d: &mut Diag,
    path: &str,
    scene: &str,
    owner: &RawScene,
    raw: &RawOverride,
    network: Option<&Network>,
) -> Option<Override> {
    let cidr = match IpNet::from_str(raw.cidr.get_ref()) {
        // Matched as checks' addresses are: `::ffff:10.8.0.0/112` is `10.8.0.0/16`, and a
        // range narrower than one IPv6 `ip` (which would count some addresses of a /64
        // under one max and the rest under another, in one key) is refused.
        Ok(net) => match network.map(|n| n.range(net)) {
            Some(Ok(net)) => Some(net),
            Some(Err(e)) => {
                d.at(&raw.cidr.span(), format!("{path}.cidr: {e}"));
                None
            }
            None => Some(fold_range(net.trunc())),
        },
        Err(e) => {
            d.at(
                &raw.cidr.span(),
                format!(
                    "{path}.cidr: {:?} is not a CIDR range ({e})",
                    raw.cidr.get_ref()
                ),
            );
            None
        }
    };
    let limit_ok = check_override_target(d, path, scene, owner, raw);
    let max = d.at_least(&format!("{path}.max"), &raw.max, 1);
    if !limit_ok {
        return None;
    }
    Some(Override {
        cidr: cidr?,
        limit: raw.limit.get_ref().clone(),
        max: max?,
    })
}

/// The override's `limit` must name a limit of the scene that counts by `ip`.
fn check_override_target(
    d: &mut Diag,
    path: &str,
    scene: &str,
    owner: &RawScene,
    raw: &RawOverride,
) -> bool {
    let name = raw.limit.get_ref();
    let target = owner
        .limits
        .iter()
        .flatten()
        .find(|l| l.name.get_ref() == name);
    let problem = match target {
        // An unreadable limit may be the one meant: say nothing rather than mislead.
        None if !owner.complete => return false,
        None => format!("no limit named {name:?} in {scene}"),
        Some(l)
            if !l
                .dimensions
                .get_ref()
                .iter()
                .any(|n| matches!(n.get_ref().as_str(), "ip" | "net")) =>
        {
            format!("limit {name:?} does not count by ip or net (a CIDR override applies to limits on the address)")
        }
        Some(_) => return true,
    };
    d.at(&raw.limit.span(), format!("{path}.limit: {problem}"));
    false
}
