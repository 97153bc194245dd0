//! Operators' own page templates through the admin API: a room's
//! `templates_dir` is loaded and checked by `PUT` and `PATCH`, refused with
//! file, line and reason (422) before anything is stored, and the pages of
//! an accepted directory are what visitors see at once.

use std::path::Path;

use narabu_testkit::app::{TestApp, spawn_app};
use narabu_testkit::room;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::admin;

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

const BRANDED: &str = "{% extends \"base.html\" %}\n{% block body %}\n<h1>Example Tickets</h1>\n\
    <p id=\"position\">{{ ticket.position_text }}</p>\n{% endblock %}\n";

/// A template with an unknown variable on line 3.
const BROKEN: &str =
    "{% extends \"base.html\" %}\n{% block body %}\n<h1>{{ ticket.numbr }}</h1>\n{% endblock %}\n";

async fn queue_page(app: &TestApp, room: &str) -> String {
    let response = app
        .client
        .get(app.url(&format!("/queue/{room}?return=%2F")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.unwrap()
}

fn assert_refusal(status: StatusCode, body: &Value, file: &str, line: u64, words: &str) {
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"], "invalid_field", "{body}");
    assert_eq!(body["field"], "templates_dir", "{body}");
    assert_eq!(body["file"], file, "{body}");
    assert_eq!(body["line"], line, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("templates_dir: {file}:{line}: ")),
        "{message}"
    );
    assert!(message.contains(words), "{message}");
}

#[tokio::test]
async fn put_and_patch_check_a_room_s_templates_dir() {
    let app = spawn_app(vec![room("sale", 2)]).await;
    let dir = tempfile::tempdir().unwrap();
    let queue = "queue.html";
    let dir_text = dir.path().display().to_string();

    // A broken directory is refused by PUT, and the room is not created.
    write(dir.path(), "queue.html", BROKEN);
    let (status, body) = admin(
        &app,
        Method::PUT,
        "/admin/rooms/brand",
        Some(json!({"capacity": 5, "templates_dir": dir_text})),
    )
    .await;
    assert_refusal(status, &body, queue, 3, "unknown variable `ticket.numbr`");
    let (status, _) = admin(&app, Method::GET, "/admin/rooms/brand", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A syntax error, likewise.
    write(dir.path(), "queue.html", "<p>\n\n{{ room </p>\n");
    let (status, body) = admin(
        &app,
        Method::PUT,
        "/admin/rooms/brand",
        Some(json!({"templates_dir": dir_text})),
    )
    .await;
    assert_refusal(status, &body, queue, 3, "syntax error");

    // Fixed: created, and visitors see the room's own page at once.
    write(dir.path(), "queue.html", BRANDED);
    let (status, body) = admin(
        &app,
        Method::PUT,
        "/admin/rooms/brand",
        Some(json!({"capacity": 5, "templates_dir": dir_text})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["settings"]["templates_dir"], dir_text);
    let page = queue_page(&app, "brand").await;
    assert!(page.contains("<h1>Example Tickets</h1>"), "{page}");
    assert!(page.contains("<p id=\"position\">1</p>"), "{page}");
    // Other rooms keep the built-in pages.
    assert!(!queue_page(&app, "sale").await.contains("Example Tickets"));

    // A PATCH to a broken file is refused and changes nothing.
    write(dir.path(), "queue.html", BROKEN);
    let (status, body) = admin(
        &app,
        Method::PATCH,
        "/admin/rooms/brand",
        Some(json!({"templates_dir": dir_text})),
    )
    .await;
    assert_refusal(status, &body, queue, 3, "ticket.numbr");
    assert!(queue_page(&app, "brand").await.contains("Example Tickets"));

    // Patching the same directory again reloads its files.
    write(
        dir.path(),
        "queue.html",
        &BRANDED.replace("Example Tickets", "Example Tickets, reloaded"),
    );
    let (status, body) = admin(
        &app,
        Method::PATCH,
        "/admin/rooms/brand",
        Some(json!({"templates_dir": dir_text})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        queue_page(&app, "brand")
            .await
            .contains("Example Tickets, reloaded")
    );

    // A directory that is not there is refused naming it.
    let missing = dir.path().join("missing");
    let (status, body) = admin(
        &app,
        Method::PATCH,
        "/admin/rooms/brand",
        Some(json!({"templates_dir": missing.display().to_string()})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["file"], ".", "{body}");
    assert!(body["line"].is_null(), "{body}");

    // null goes back to the built-in pages.
    let (status, body) = admin(
        &app,
        Method::PATCH,
        "/admin/rooms/brand",
        Some(json!({"templates_dir": null})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["settings"].get("templates_dir").is_none(), "{body}");
    let page = queue_page(&app, "brand").await;
    assert!(!page.contains("Example Tickets") && page.contains("id=\"queue\""));
    app.stop().await;
}

/// The built-in English messages with a few lines changed.
fn english_with(changes: &[(&str, &str)]) -> String {
    let mut text = include_str!("../../templates/pages/messages/en.toml").to_owned();
    for (from, to) in changes {
        assert!(text.contains(from), "{from}");
        text = text.replacen(from, to, 1);
    }
    text
}

async fn page_in(app: &TestApp, path: &str, accept_language: &str) -> String {
    let response = app
        .client
        .get(app.url(path))
        .header("accept-language", accept_language)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.unwrap()
}

#[tokio::test]
async fn a_room_s_message_files_add_languages_chosen_by_the_browser() {
    let app = spawn_app(vec![room("sale", 2)]).await;
    let dir = tempfile::tempdir().unwrap();
    let messages = dir.path().join("messages");
    std::fs::create_dir(&messages).unwrap();
    let french = english_with(&[
        (
            "language_name = \"English\"",
            "language_name = \"Français\"",
        ),
        ("html_lang = \"en\"", "html_lang = \"fr\""),
        (
            "queue_title = \"You're in line\"",
            "queue_title = \"Vous êtes dans la file\"",
        ),
    ]);
    // A broken message file is refused like a broken template.
    let broken = french.replacen("queue_title = ", "queue_titre = ", 1);
    write(&messages, "fr.toml", &broken);
    let dir_text = dir.path().display().to_string();
    let (status, body) = admin(
        &app,
        Method::PUT,
        "/admin/rooms/paris",
        Some(json!({"templates_dir": dir_text})),
    )
    .await;
    assert_refusal(
        status,
        &body,
        "messages/fr.toml",
        13,
        "unknown field `queue_titre`",
    );

    write(&messages, "fr.toml", &french);
    let (status, body) = admin(
        &app,
        Method::PUT,
        "/admin/rooms/paris",
        Some(json!({"templates_dir": dir_text})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let page = page_in(&app, "/queue/paris?return=%2F", "fr-FR,fr;q=0.9,en;q=0.5").await;
    assert!(page.contains("<html lang=\"fr\">"), "{page}");
    assert!(page.contains("<h1>Vous êtes dans la file</h1>"), "{page}");
    assert!(
        page.contains("hreflang=\"fr\" lang=\"fr\" aria-current=\"true\">Français</a>"),
        "{page}"
    );
    // ?lang= wins over the header; other rooms do not speak French.
    let page = page_in(&app, "/queue/paris?return=%2F&lang=ja", "fr").await;
    assert!(page.contains("<html lang=\"ja\">"), "{page}");
    let page = page_in(&app, "/queue/sale?return=%2F", "fr").await;
    assert!(
        page.contains("<html lang=\"en\">") && !page.contains("Français"),
        "{page}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_broken_template_stops_the_start_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "queue.html", BROKEN);
    let config = narabu::config::Config {
        templates_dir: Some(dir.path().to_path_buf()),
        ..narabu_testkit::app::config()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = narabu::backend::embedded::EmbeddedBackend::without_workers(
        config.rooms.clone(),
        std::sync::Arc::new(narabu::engine::SystemClock),
    );
    // The server returns at once with the reason, before serving anything.
    let e = narabu::server::serve(listener, config, backend, std::future::pending())
        .await
        .expect_err("refused at start");
    let shown = format!("{e:#}");
    assert!(shown.contains("queue.html:3: "), "{shown}");
    assert!(
        !shown.contains(&dir.path().display().to_string()),
        "{shown}"
    );
    assert!(shown.contains("unknown variable `ticket.numbr`"), "{shown}");
}

/// What a directory's writer can put in it must not reach the service's
/// secrets or memory: links are refused rather than followed, only regular
/// files are read, sizes are capped, and a refusal names the file relative
/// to the directory, never a server path.
#[tokio::test]
async fn links_devices_fifos_and_huge_files_in_a_templates_dir_are_refused() {
    let app = spawn_app(vec![room("sale", 2)]).await;
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.key");
    std::fs::write(&secret, "TOP-SECRET-SIGNING-KEY").unwrap();

    let put = |dir: &Path| {
        let dir_text = dir.display().to_string();
        let app = &app;
        async move {
            let request = admin(
                app,
                Method::PUT,
                "/admin/rooms/brand",
                Some(json!({"capacity": 5, "templates_dir": dir_text})),
            );
            // Refused without reading an endless file.
            tokio::time::timeout(std::time::Duration::from_secs(10), request)
                .await
                .expect("answered quickly")
        }
    };
    let refused = |body: &Value, file: &str, words: &str, dir: &Path| {
        assert_eq!(body["field"], "templates_dir", "{body}");
        assert_eq!(body["file"], file, "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(words), "{message}");
        assert!(!message.contains("TOP-SECRET"), "{message}");
        for path in [dir, outside.path()] {
            assert!(
                !body.to_string().contains(&path.display().to_string()),
                "no server path in {body}"
            );
        }
    };

    // What each case is, how it fills the directory, the file named, why.
    type Case<'a> = (&'a str, Box<dyn Fn(&Path) + 'a>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            "a link to the signing key",
            Box::new(|d: &Path| std::os::unix::fs::symlink(&secret, d.join("queue.html")).unwrap()),
            "queue.html",
            "symbolic link",
        ),
        (
            "a link to /dev/zero",
            Box::new(|d: &Path| {
                std::os::unix::fs::symlink("/dev/zero", d.join("queue.html")).unwrap()
            }),
            "queue.html",
            "symbolic link",
        ),
        (
            "a linked subdirectory",
            Box::new(|d: &Path| {
                std::os::unix::fs::symlink(outside.path(), d.join("partials")).unwrap()
            }),
            "partials",
            "symbolic link",
        ),
        (
            "a linked messages directory",
            Box::new(|d: &Path| {
                std::os::unix::fs::symlink(outside.path(), d.join("messages")).unwrap()
            }),
            "messages",
            "symbolic link",
        ),
        (
            "a linked message file",
            Box::new(|d: &Path| {
                std::fs::create_dir(d.join("messages")).unwrap();
                std::os::unix::fs::symlink(&secret, d.join("messages/fr.toml")).unwrap();
            }),
            "messages/fr.toml",
            "symbolic link",
        ),
        (
            "a FIFO",
            Box::new(|d: &Path| {
                let made = std::process::Command::new("mkfifo")
                    .arg(d.join("queue.html"))
                    .status()
                    .unwrap();
                assert!(made.success());
            }),
            "queue.html",
            "not a regular file",
        ),
        (
            "an oversized file",
            Box::new(|d: &Path| write(d, "queue.html", &"<p>x</p>\n".repeat(100_000))),
            "queue.html",
            "larger than",
        ),
    ];
    for (what, make, file, words) in cases {
        let dir = tempfile::tempdir().unwrap();
        make(dir.path());
        let (status, body) = put(dir.path()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {body}");
        refused(&body, file, words, dir.path());
    }
    let (status, _) = admin(&app, Method::GET, "/admin/rooms/brand", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created");
    app.stop().await;
}

#[tokio::test]
async fn a_linked_template_stops_the_start_naming_only_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.key"), "TOP-SECRET").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.key"),
        dir.path().join("queue.html"),
    )
    .unwrap();
    let config = narabu::config::Config {
        templates_dir: Some(dir.path().to_path_buf()),
        ..narabu_testkit::app::config()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = narabu::backend::embedded::EmbeddedBackend::without_workers(
        config.rooms.clone(),
        std::sync::Arc::new(narabu::engine::SystemClock),
    );
    let serve = narabu::server::serve(listener, config, backend, std::future::pending());
    let e = tokio::time::timeout(std::time::Duration::from_secs(10), serve)
        .await
        .expect("refused at start, not served")
        .expect_err("refused at start");
    let shown = format!("{e:#}");
    assert!(shown.contains("queue.html: is a symbolic link"), "{shown}");
    assert!(
        !shown.contains(&dir.path().display().to_string()),
        "{shown}"
    );
    assert!(!shown.contains("TOP-SECRET"), "{shown}");
}
