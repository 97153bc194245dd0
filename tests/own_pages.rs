//! An operator's own pages in a real browser: a room whose `templates_dir`
//! holds a branded queue page and a French message file. Headless Chromium,
//! set to prefer French, opens the queue page: the page is in French (the
//! language came from the browser's `Accept-Language`), carries the brand,
//! and still works as the built-in page does (the event stream updates the
//! place in line). The screenshot is read back with OCR (tesseract), so the
//! brand is checked where a visitor sees it, in pixels, not only in the
//! markup.
//!
//! The screenshot stays in `target/e2e/own-pages-queue.png` for a person to
//! look at.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use narabu::backend::embedded::EmbeddedBackend;
use narabu::config::Config;
use narabu::engine::{RoomSettings, SystemClock};
use narabu_testkit::app::{config, spawn_with};
use narabu_testkit::browser::Driver;
use narabu_testkit::room;

const BRAND: &str = "KOMOREBI TICKETS";

/// The queue page of the worked example, with the brand above the title in
/// the large type of the ticket number (the page's CSS: inline styles are
/// refused, as the Content-Security-Policy would block them).
fn branded_queue_page() -> String {
    let builtin = include_str!("../templates/pages/queue.html");
    let header = "<header class=\"masthead\">";
    assert!(builtin.contains(header));
    builtin.replacen(
        header,
        &format!("<p class=\"ticket-number\" id=\"brand\">{BRAND}</p>\n  {header}"),
        1,
    )
}

fn french_messages() -> String {
    let mut text = include_str!("../templates/pages/messages/en.toml").to_owned();
    for (from, to) in [
        (
            "language_name = \"English\"",
            "language_name = \"Français\"",
        ),
        ("html_lang = \"en\"", "html_lang = \"fr\""),
        (
            "queue_title = \"You're in line\"",
            "queue_title = \"Vous êtes dans la file\"",
        ),
        (
            "position = \"Your place in line\"",
            "position = \"Votre place dans la file\"",
        ),
    ] {
        assert!(text.contains(from), "{from}");
        text = text.replacen(from, to, 1);
    }
    text
}

fn write_pages(dir: &Path) {
    std::fs::write(dir.join("queue.html"), branded_queue_page()).unwrap();
    std::fs::create_dir(dir.join("messages")).unwrap();
    std::fs::write(dir.join("messages/fr.toml"), french_messages()).unwrap();
}

/// The text tesseract reads in an image.
fn ocr(png: &Path) -> String {
    let out = Command::new("tesseract")
        .arg(png)
        .arg("stdout")
        .args(["-l", "eng", "--psm", "3"])
        .output()
        .expect("tesseract is installed (scripts/test installs tesseract-ocr)");
    assert!(
        out.status.success(),
        "tesseract failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_a_room_s_own_branded_page_in_the_browser_s_language() {
    let dir = tempfile::tempdir().unwrap();
    write_pages(dir.path());
    let branded = RoomSettings {
        templates_dir: Some(dir.path().display().to_string()),
        ..room("brand", 1)
    };
    let rooms = vec![branded, room("plain", 1)];
    let backend = EmbeddedBackend::new(rooms.clone(), Arc::new(SystemClock));
    let app = spawn_with(Config { rooms, ..config() }, backend).await;
    // One visitor holds the only permit, so the browser waits at place 1.
    let holder = app.join("brand").await;

    let browser = Driver::start_in_language("fr-FR,fr").await;
    browser.goto(&app.url("/queue/brand?return=%2F")).await;
    browser
        .wait_until(
            "the French page with its place from the event stream",
            "return document.documentElement.lang === 'fr' && \
             document.querySelector('h1').textContent === 'Vous êtes dans la file' && \
             document.getElementById('position').textContent === '1'",
        )
        .await;
    assert_eq!(browser.text("#brand").await, BRAND);
    // The room's own language joins the switcher, marked as the current one.
    assert_eq!(
        browser.text("nav.languages a[aria-current='true']").await,
        "Français"
    );

    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/e2e");
    let shot = shots.join("own-pages-queue.png");
    browser.screenshot(&shot).await;
    // The brand is set large and may wrap: words count, not line breaks.
    let text = ocr(&shot).split_whitespace().collect::<Vec<_>>().join(" ");
    println!("OCR of {}: {text}", shot.display());
    assert!(
        text.contains(BRAND),
        "the brand is not in the screenshot's text:\n{text}"
    );
    assert!(
        text.contains("Vous") && text.contains("file"),
        "the French title is not in the screenshot's text:\n{text}"
    );

    // Another room of the same instance keeps the built-in pages and does
    // not speak French.
    browser.goto(&app.url("/queue/plain?return=%2F")).await;
    browser
        .wait_until(
            "the built-in page",
            "return document.documentElement.lang === 'en' && \
             document.getElementById('queue') !== null",
        )
        .await;
    let brand_shown = browser
        .script("return document.getElementById('brand') !== null")
        .await;
    assert_eq!(brand_shown, false);

    browser.quit().await;
    drop(holder);
    app.stop().await;
}
