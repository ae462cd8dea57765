//! `GET /v1/rules` shows every error of a failed reload, not the first of them only: an
//! operator fixing a folder with three mistakes once met them one reload at a time.
//! `last_error` keeps its first-error fields for the clients that read them.

use serde_json::{json, Value};

use crate::common::{limit, scene, spawn_app, TestApp};

fn valid() -> String {
    scene(&limit(
        "user_10s",
        "\"user\"",
        "sliding_window",
        "10s",
        5,
        "business",
    ))
}

/// A second scene, in a file of its own, with `window` as given.
fn scene_t(window: &str) -> String {
    format!(
        r#"
[scene.t]
on_store_error = "fail_open"
required = ["user"]

[[scene.t.limits]]
name = "user_1m"
dimensions = ["user"]
algorithm = "fixed_window"
window = "{window}"
max = 5
"#
    )
}

async fn rules_of(app: &TestApp) -> Value {
    app.get("/v1/rules")
        .await
        .json()
        .await
        .expect("JSON answer")
}

#[actix_web::test]
async fn a_failed_reload_lists_every_error_in_last_error() {
    let app = spawn_app(&[("s.toml", &valid())]).await;
    assert_eq!(rules_of(&app).await["last_error"], Value::Null);

    let dir = app.rules_path();
    std::fs::write(
        dir.join("s.toml"),
        valid().replace("sliding_window", "leaky"),
    )
    .expect("write");
    std::fs::write(dir.join("t.toml"), scene_t("0s")).expect("write");
    let resp = app.post("/v1/admin/reload", &json!({})).await;
    assert_eq!(resp.status(), 422);

    let rules = rules_of(&app).await;
    let e = &rules["last_error"];
    let errors = e["errors"].as_array().expect("errors listed");
    let files: Vec<&str> = errors.iter().filter_map(|x| x["file"].as_str()).collect();
    assert!(
        files.iter().any(|f| f.ends_with("s.toml")) && files.iter().any(|f| f.ends_with("t.toml")),
        "both files' errors: {rules}"
    );
    for x in errors {
        assert!(x["line"].as_u64().is_some_and(|l| l > 0), "{rules}");
        assert!(!x["message"].as_str().unwrap_or("").is_empty(), "{rules}");
    }
    // The first is where clients read it before.
    assert_eq!(
        (&e["file"], &e["line"], &e["message"]),
        (
            &errors[0]["file"],
            &errors[0]["line"],
            &errors[0]["message"]
        ),
        "{rules}"
    );
    assert!(e["at"].is_string(), "{rules}");

    // A valid folder clears it.
    std::fs::write(dir.join("s.toml"), valid()).expect("write");
    std::fs::write(dir.join("t.toml"), scene_t("1m")).expect("write");
    let resp = app.post("/v1/admin/reload", &json!({})).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(rules_of(&app).await["last_error"], Value::Null);
}
