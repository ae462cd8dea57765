//! `[scene.X.challenge]`, `[score].challenge_at` and `[trust].challenge_passed`.

use super::support::*;

/// BASE with a score whose band starts at `challenge_at`, and `section` after it.
fn scored(challenge_at: &str, section: &str) -> String {
    format!(
        "{BASE}\n[scene.s.score]\nweights = {{}}\nsilent_deny_at = 0.7\n{challenge_at}\n{section}"
    )
}

const SECTION: &str =
    "[scene.s.challenge]\nkind = \"captcha\"\nmessage = \"Confirma\"\npass_ttl = \"30m\"\n";

#[test]
fn a_band_and_its_section_compile() {
    let rules = ok(&scored("challenge_at = 0.4", SECTION));
    let scene = rules.scene("s").expect("scene");
    assert_eq!(scene.score.as_ref().and_then(|s| s.challenge_at), Some(0.4));
    let c = scene.challenge.as_ref().expect("challenge");
    assert_eq!(
        (c.kind.as_str(), c.message.as_deref(), c.pass_ttl_ms),
        ("captcha", Some("Confirma"), 1_800_000)
    );
    let plain = ok(BASE);
    assert!(plain.scene("s").is_some_and(|s| s.challenge.is_none()));
}

#[test]
fn the_band_lies_below_the_line() {
    for at in ["0.7", "0.9"] {
        let text = scored(&format!("challenge_at = {at}"), SECTION);
        let err = single(&text);
        assert_error(
            &err,
            &text,
            "challenge_at",
            "scene.s.score.challenge_at",
            &[
                "not below silent_deny_at (0.7)",
                "[challenge_at, silent_deny_at)",
            ],
        );
    }
    let text = scored("challenge_at = 0.0", SECTION);
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "challenge_at",
        "scene.s.score.challenge_at",
        &["(0, 1]"],
    );
}

#[test]
fn a_band_needs_its_section_and_a_section_needs_a_band() {
    let text = scored("challenge_at = 0.4", "");
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "challenge_at",
        "scene.s.score.challenge_at",
        &["needs [scene.s.challenge]", "kind and pass_ttl"],
    );
    let text = scored("", SECTION);
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "kind = ",
        "scene.s.challenge",
        &["nothing answers challenge", "challenge_at"],
    );
}

#[test]
fn a_section_names_what_to_ask_and_for_how_long_a_pass_holds() {
    let text = scored(
        "challenge_at = 0.4",
        "[scene.s.challenge]\nkind = \"\"\npass_ttl = \"30m\"\n",
    );
    let err = single(&text);
    assert_error(&err, &text, "kind = ", "scene.s.challenge.kind", &["empty"]);
    let text = scored(
        "challenge_at = 0.4",
        "[scene.s.challenge]\nkind = \"sms\"\npass_ttl = \"soon\"\n",
    );
    let err = single(&text);
    assert_error(
        &err,
        &text,
        "pass_ttl",
        "scene.s.challenge.pass_ttl",
        &["duration"],
    );
    let text = scored(
        "challenge_at = 0.4",
        "[scene.s.challenge]\nkind = \"sms\"\npass_ttl = \"30m\"\nttl = \"1h\"\n",
    );
    let err = single(&text);
    assert!(err.message.contains("ttl"), "{err}");
    let text = scored(
        "challenge_at = 0.4",
        "[scene.s.challenge]\nkind = \"sms\"\n",
    );
    let err = single(&text);
    assert!(err.message.contains("pass_ttl"), "{err}");
}

#[test]
fn a_pass_may_earn_trust_points() {
    let text = format!(
        "{BASE}\n[trust]\nmax_points = 3\nchallenge_passed = {{ points = 1, ttl = \"7d\" }}\n"
    );
    let rules = ok(&text);
    let award = rules
        .trust
        .as_ref()
        .and_then(|t| t.challenge_passed)
        .expect("an award");
    assert_eq!((award.points, award.ttl_ms), (1, 7 * 86_400_000));
}
