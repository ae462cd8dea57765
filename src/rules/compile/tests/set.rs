//! Rules across files: duplicates, every error at once in order, versions.

use super::support::*;
use crate::rules::compile_files;

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect()
}

#[test]
fn same_scene_in_two_files_names_both() {
    let errs = errors(&[
        ("rules/b.toml", BASE),
        ("rules/a.toml", &format!("\n\n{BASE}")),
    ]);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let err = &errs[0];
    assert_eq!((err.file.as_str(), err.line), ("rules/b.toml", 1), "{err}");
    assert!(err.message.starts_with("scene.s: "), "{err}");
    assert!(err.message.contains("rules/a.toml:3"), "{err}");
    assert!(err.message.contains("rules/b.toml:1"), "{err}");
}

#[test]
fn every_error_of_every_file_at_once_sorted() {
    let a = base_with("window = \"1m\"", "window = \"0s\"").replacen("max = 1\n", "max = 0\n", 1);
    let b = "[scene.t]\non_store_error = \"sometimes\"\n\n[[scene.t.limits]]\nname = \"x\"\ndimensions = [\"ip\"]\nalgorithm = \"fixed_window\"\nwindow = \"1m\"\nmax = 1\nbogus = 1\n";
    // Given out of order: the report is still by file, then line.
    let errs = errors(&[("rules/b.toml", b), ("rules/a.toml", &a)]);
    let got: Vec<(&str, usize, &str)> = errs
        .iter()
        .map(|e| {
            let field = e.message.split(": ").next().unwrap_or_default();
            (e.file.as_str(), e.line, field)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "rules/a.toml",
                line_of(&a, "max = 0"),
                "scene.s.limits[0].max"
            ),
            (
                "rules/a.toml",
                line_of(&a, "window = \"0s\""),
                "scene.s.limits[1].window"
            ),
            ("rules/b.toml", 2, "scene.t.on_store_error"),
            ("rules/b.toml", 10, "scene.t.limits[0].bogus"),
        ]
    );
}

#[test]
fn errors_display_as_file_line_message() {
    let text = base_with("max = 100", "max = 0");
    let err = compile_files(&files(&[(FILE, &text)])).expect_err("invalid");
    assert_eq!(
        err.to_string(),
        format!(
            "{FILE}:{}: scene.s.limits[1].max: 0 is not an integer >= 1",
            line_of(&text, "max = 0")
        )
    );
}

#[test]
fn scenes_from_several_files_form_one_set() {
    let other = BASE.replace("scene.s", "scene.t");
    let rules = compile_files(&files(&[("r/a.toml", BASE), ("r/b.toml", &other)])).expect("valid");
    let names: Vec<&str> = rules.scenes.keys().map(String::as_str).collect();
    assert_eq!(names, ["s", "t"]);
}

#[test]
fn same_content_same_version() {
    let one = compile_files(&files(&[("r/a.toml", BASE)])).expect("valid");
    let two = compile_files(&files(&[("elsewhere/a.toml", BASE)])).expect("valid");
    assert_eq!(
        one.version, two.version,
        "the folder is not part of the version"
    );
    assert_eq!(one.version.len(), 64);
    assert!(one
        .version
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
}

#[test]
fn version_does_not_depend_on_file_order() {
    let other = BASE.replace("scene.s", "scene.t");
    let ab = compile_files(&files(&[("r/a.toml", BASE), ("r/b.toml", &other)])).expect("valid");
    let ba = compile_files(&files(&[("r/b.toml", &other), ("r/a.toml", BASE)])).expect("valid");
    assert_eq!(ab.version, ba.version);
}

#[test]
fn changed_content_or_name_changes_the_version() {
    let base = compile_files(&files(&[("r/a.toml", BASE)])).expect("valid");
    let comment =
        compile_files(&files(&[("r/a.toml", &format!("{BASE}# note\n"))])).expect("valid");
    let renamed = compile_files(&files(&[("r/b.toml", BASE)])).expect("valid");
    assert_ne!(base.version, comment.version);
    assert_ne!(base.version, renamed.version);
}
