use std::path::Path;

use super::templates::PageTemplates;
use super::*;
use crate::engine::rules::Mode;
use crate::engine::{Eta, TicketState, Timestamp};
use crate::http::i18n::{Lang, Languages};

fn waiting() -> TicketStatus {
    TicketStatus {
        id: 7,
        state: TicketState::Waiting,
        lane: 0,
        number: Some(12_345),
        position: Some(1_234),
        ahead: Some(1_233),
        eta: Some(Eta {
            low_secs: 90,
            expected_secs: 120,
            high_secs: 150,
        }),
        progress: 0.42,
        queue_length: 200_000,
        paused: false,
        closed: false,
        mode: Mode::Queue,
        stock: None,
        joined_at: Timestamp(1_795_428_000_000),
        admitted_at: None,
        pass_expires_at: None,
        opens_at: None,
        // 2026-11-23T10:00:05Z
        at: Timestamp(1_795_428_005_000),
    }
}

fn lang(code: &str) -> Lang {
    Languages::builtin().get(code).expect("built in").clone()
}

fn all_languages() -> Vec<Lang> {
    Languages::builtin().all().to_vec()
}

fn visit(lang: &Lang) -> Visit {
    Visit {
        lang: lang.clone(),
        room: "sale".into(),
        return_path: "/tickets?id=7&seat=a".into(),
    }
}

fn queue(status: TicketStatus) -> QueuePage {
    QueuePage {
        status,
        lane: None,
        refresh_seconds: 20,
        urls: QueueUrls {
            events: "/api/rooms/sale/events".into(),
            notify: None,
            status: "/api/rooms/sale/status".into(),
            leave: "/api/rooms/sale/leave".into(),
            receipt: "/api/rooms/sale/receipt".into(),
        },
        pow: None,
        draw: None,
    }
}

fn render_with(set: &PageTemplates, visit: &Visit, page: &Page) -> String {
    set.render(page.kind(), &context(visit, page, &Languages::builtin()))
        .unwrap_or_else(|e| panic!("{}", set.describe(&e)))
}

fn render(visit: &Visit, page: &Page) -> String {
    render_with(&PageTemplates::builtin(), visit, page)
}

/// A string as the pages' HTML escaper prints it.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn assert_text(html: &str, text: &str) {
    assert!(html.contains(&esc(text)), "lacks {text:?}\n{html}");
}

fn assert_base(html: &str, lang: &Lang) {
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(html.contains(&format!("<html lang=\"{}\">", lang.html_lang())));
    assert!(html.contains("name=\"viewport\""));
    assert!(html.contains("href=\"/static/narabu.css?v="));
    assert!(!html.contains("style="), "no inline style");
    assert!(!html.contains("<style"), "no inline style");
    for (i, _) in html.match_indices("<script") {
        assert!(
            html[i..].starts_with("<script src=\"/static/"),
            "no inline script"
        );
    }
    for (i, _) in html.match_indices(" on") {
        let name: String = html[i + 1..]
            .chars()
            .take_while(char::is_ascii_alphabetic)
            .collect();
        assert!(
            !html[i + 1 + name.len()..].starts_with('='),
            "inline handler {name}"
        );
    }
}

#[test]
fn the_built_in_pages_pass_their_own_check() {
    check::check(&PageTemplates::builtin(), &Languages::builtin())
        .expect("the built-in pages are valid");
}

#[test]
fn queue_page_renders_in_every_language() {
    for lang in all_languages() {
        let t = lang.strings();
        let html = render(&visit(&lang), &Page::Queue(Box::new(queue(waiting()))));
        assert_base(&html, &lang);
        for text in [
            &t.queue_title,
            &t.ticket_number,
            &t.position,
            &t.ahead,
            &t.eta,
            &t.progress,
            &t.last_updated,
            &t.leave,
            &t.leave_confirm,
            &t.format_progress(42),
            &t.format_refresh_note(20),
        ] {
            assert_text(&html, text);
        }
        for needle in [
            ">12,345<",
            ">1,234<",
            ">1,233<",
            &format!(">{}<", esc(&t.format_queue_length(200_000))),
            "aria-live=\"polite\"",
            "<noscript><meta http-equiv=\"refresh\" content=\"20\"></noscript>",
            "<script src=\"/static/queue.js?v=",
            "<progress id=\"progress\" max=\"100\" value=\"42\">",
            "<time id=\"updated\" datetime=\"2026-11-23T10:00:05Z\"",
            ">10:00:05 UTC</time>",
            "data-events-url=\"/api/rooms/sale/events\"",
            "data-status-url=\"/api/rooms/sale/status\"",
            "data-return=\"/tickets?id=7&amp;seat=a\"",
            &format!("data-lang=\"{}\"", lang.code()),
            "<form method=\"post\" action=\"/api/rooms/sale/leave\"",
            "<button type=\"submit\"",
        ] {
            assert!(html.contains(needle), "{lang:?} lacks {needle:?}\n{html}");
        }
        let eta = t.format_eta(90, 150);
        assert!(html.contains(&format!("<dd id=\"eta\">{}</dd>", esc(&eta))));
        assert_text(&html, &t.format_announcement(Some(1234), Some(&eta)));
        for (name, unit) in [
            ("seconds", &t.eta_seconds),
            ("minutes", &t.eta_minutes),
            ("hours", &t.eta_hours),
        ] {
            for (form, template) in [
                ("range", &unit.range),
                ("single", &unit.single),
                ("one", &unit.one),
            ] {
                let attr = format!("data-eta-{name}-{form}=\"{}\"", esc(template));
                assert!(html.contains(&attr), "{lang:?} lacks {attr}");
            }
        }
        // Not paused and already open: the notices stay hidden or absent.
        assert!(html.contains("id=\"paused\" aria-labelledby=\"paused-title\" hidden>"));
        assert!(!html.contains("id=\"preopen\""));
        // The language switcher keeps the return path, and marks this one.
        for other in all_languages() {
            let link = format!(
                "href=\"?lang={}&amp;return=%2Ftickets%3Fid%3D7%26seat%3Da\"",
                other.code()
            );
            assert!(html.contains(&link), "{lang:?} lacks {link}");
        }
        assert!(html.contains(&format!(
            "lang=\"{}\" aria-current=\"true\">{}</a>",
            lang.html_lang(),
            lang.native_name()
        )));
    }
}

/// queue.js reads `data.someName` for `data-some-name`; every one it
/// reads must be on the page, or the script would show "undefined".
#[test]
fn queue_page_carries_every_data_attribute_the_script_reads() {
    let script = include_str!("../../../static/queue.js");
    let html = render(
        &visit(&lang("ja")),
        &Page::Queue(Box::new(queue(waiting()))),
    );
    let mut checked = 0;
    for (i, _) in script.match_indices("data.") {
        let name: String = script[i + 5..]
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        let kebab: String = name
            .chars()
            .flat_map(|c| {
                let dash = c.is_ascii_uppercase().then_some('-');
                dash.into_iter()
                    .chain(std::iter::once(c.to_ascii_lowercase()))
            })
            .collect();
        assert!(html.contains(&format!(" data-{kebab}=\"")), "data-{kebab}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} found");
    assert!(script.contains("data[\"return\"]") & html.contains(" data-return=\""));
}

#[test]
fn queue_page_before_opening_and_while_paused() {
    for lang in all_languages() {
        let t = lang.strings();
        let status = TicketStatus {
            number: None,
            position: None,
            ahead: None,
            eta: None,
            progress: 0.0,
            // 2026-12-01T01:00:00Z
            opens_at: Some(Timestamp(1_796_086_800_000)),
            paused: true,
            ..waiting()
        };
        let html = render(&visit(&lang), &Page::Queue(Box::new(queue(status))));
        assert_text(&html, &t.ticket_number_pending);
        assert_text(&html, &t.not_open_title);
        assert_text(&html, &t.opens_at);
        assert_text(&html, &t.not_open_note);
        assert!(html.contains(
            "<time datetime=\"2026-12-01T01:00:00Z\" data-format=\"datetime\">\
             2026-12-01 01:00 UTC</time>"
        ));
        assert_text(&html, &t.paused_title);
        assert!(!html.contains("aria-labelledby=\"paused-title\" hidden"));
        assert!(html.contains(&format!("<dd id=\"eta\">{}</dd>", esc(&t.eta_unknown))));
        assert!(html.contains(&format!(
            "<dd id=\"position\">{}</dd>",
            esc(&t.unknown_value)
        )));
    }
}

#[test]
fn queue_page_never_refreshes_in_a_tight_loop() {
    let page = QueuePage {
        refresh_seconds: 0,
        ..queue(waiting())
    };
    let html = render(&visit(&lang("en")), &Page::Queue(Box::new(page)));
    assert!(html.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
    assert_text(&html, &lang("en").strings().format_refresh_note(5));
}

#[test]
fn queue_page_escapes_everything() {
    let v = Visit {
        room: "<script>alert(1)</script>".into(),
        return_path: "/x?a=\"><script>alert(2)</script>".into(),
        ..visit(&lang("en"))
    };
    let mut page = queue(waiting());
    page.urls.events = "\"><script>alert(3)</script>".into();
    let html = render(&v, &Page::Queue(Box::new(page)));
    assert!(!html.contains("<script>alert"), "{html}");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("data-return=\"/x?a=&quot;&gt;&lt;script&gt;alert(2)"));
    assert!(html.contains("data-events-url=\"&quot;&gt;&lt;script&gt;alert(3)"));
    // The language links carry the return path percent-encoded.
    assert!(html.contains("return=%2Fx%3Fa%3D%22%3E%3Cscript%3Ealert%282%29"));
}

#[test]
fn return_paths_that_leave_the_site_become_root() {
    for bad in [
        "",
        "tickets",
        "https://evil.example/",
        "//evil.example/",
        "/\\evil.example",
        "/\t/evil.example",
        "/\n/evil.example",
        "javascript:alert(1)",
    ] {
        assert_eq!(safe_return(bad), "/", "{bad:?}");
        let v = Visit {
            return_path: bad.into(),
            ..visit(&lang("en"))
        };
        let html = render(&v, &Page::Admitted);
        assert!(html.contains("content=\"1; url=/\""), "{bad:?}");
    }
    for good in ["/", "/tickets", "/a/b?c=d&e=%2F#top", "/%2F%2Fevil"] {
        assert_eq!(safe_return(good), good);
    }
}

#[test]
fn admitted_page_renders_in_every_language() {
    for lang in all_languages() {
        let t = lang.strings();
        let v = Visit {
            return_path: "/checkout".into(),
            ..visit(&lang)
        };
        let html = render(&v, &Page::Admitted);
        assert_base(&html, &lang);
        assert_text(&html, &t.admitted_title);
        assert_text(&html, &t.admitted_body);
        assert_text(&html, &t.redirecting);
        assert!(html.contains(&format!(
            "<a class=\"button\" href=\"/checkout\">{}</a>",
            esc(&t.continue_label)
        )));
        assert!(html.contains("<meta http-equiv=\"refresh\" content=\"1; url=/checkout\">"));
    }
}

#[test]
fn closed_page_renders_each_reason_in_every_language() {
    for lang in all_languages() {
        let t = lang.strings();
        for (reason, title, body) in [
            (ClosedReason::Closed, &t.closed_title, &t.closed_body),
            (ClosedReason::SoldOut, &t.sold_out_title, &t.sold_out_body),
            (ClosedReason::Expired, &t.expired_title, &t.expired_body),
            (ClosedReason::Left, &t.left_title, &t.left_body),
            (ClosedReason::Reset, &t.reset_title, &t.reset_body),
        ] {
            let ended = !matches!(reason, ClosedReason::Closed | ClosedReason::SoldOut);
            let rejoin = ended.then(|| "/queue/sale?return=%2F".into());
            let page = Page::Closed(ClosedPage {
                reason,
                rejoin_url: rejoin.clone(),
            });
            let html = render(&visit(&lang), &page);
            assert_base(&html, &lang);
            assert!(html.contains(&format!("<h1>{}</h1>", esc(title))));
            assert_text(&html, body);
            assert_eq!(html.contains(&esc(&t.join_again)), rejoin.is_some());
            if rejoin.is_some() {
                assert!(html.contains("href=\"/queue/sale?return=%2F\""));
            }
        }
    }
}

#[test]
fn error_pages_render_in_every_language() {
    for lang in all_languages() {
        let t = lang.strings();
        for (status, title) in [
            (StatusCode::BAD_REQUEST, &t.bad_request_title),
            (StatusCode::NOT_FOUND, &t.not_found_title),
            (StatusCode::TOO_MANY_REQUESTS, &t.too_many_requests_title),
            (StatusCode::SERVICE_UNAVAILABLE, &t.unavailable_title),
            (StatusCode::INTERNAL_SERVER_ERROR, &t.server_error_title),
            (StatusCode::IM_A_TEAPOT, &t.server_error_title),
        ] {
            let html = render(&visit(&lang), &Page::Error(ErrorPage::for_status(status)));
            assert_base(&html, &lang);
            assert!(html.contains(&format!("<h1>{}</h1>", esc(title))));
            assert_text(&html, &t.format_error_code(status.as_u16()));
        }
    }
    let custom = ErrorPage {
        status: StatusCode::BAD_REQUEST,
        wording: Some(("<i>x</i>".into(), "room <script>".into())),
    };
    let html = render(&visit(&lang("en")), &Page::Error(custom));
    assert!(html.contains(&esc("<i>x</i>")) & html.contains(&esc("room <script>")));
}

#[test]
fn pages_respond_with_their_status_and_no_store() {
    let book = PageBook::default();
    let page = Page::Error(ErrorPage::for_status(StatusCode::TOO_MANY_REQUESTS));
    let response = book.render(StatusCode::TOO_MANY_REQUESTS, &visit(&lang("ja")), &page);
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/html; charset=utf-8"
    );
    assert_eq!(response.headers()[header::CACHE_CONTROL], "no-store");
}

// ----- operators' template directories -------------------------------------

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn load(dirs: &[&Path]) -> Result<PageTemplates, PageError> {
    PageTemplates::load(dirs, &Languages::builtin())
}

#[test]
fn a_template_directory_replaces_the_pages_it_has() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "queue.html",
        "{% extends \"base.html\" %}\n{% block body %}<h1 class=\"brand\">Example Tickets</h1>\n\
         <p>{{ t.position }}: {{ ticket.position_text }} · {{ ticket.eta_text }}\
         {% if lane %} · {{ lane }}{% endif %}</p>{% endblock %}\n",
    );
    let set = load(&[dir.path()]).expect("a valid directory");
    let mut page = queue(waiting());
    page.lane = Some("members".into());
    let html = render_with(&set, &visit(&lang("ja")), &Page::Queue(Box::new(page)));
    assert_base(&html, &lang("ja"));
    assert!(
        html.contains("<h1 class=\"brand\">Example Tickets</h1>"),
        "{html}"
    );
    assert!(
        html.contains("現在の順番: 1,234 · 約2〜3分 · members"),
        "{html}"
    );
    // Pages the directory lacks are the built-in ones.
    let admitted = render_with(&set, &visit(&lang("en")), &Page::Admitted);
    assert_eq!(admitted, render(&visit(&lang("en")), &Page::Admitted));
}

#[test]
fn a_room_directory_goes_over_the_instance_directory() {
    let instance = tempfile::tempdir().unwrap();
    let room = tempfile::tempdir().unwrap();
    write(
        instance.path(),
        "base.html",
        "<!DOCTYPE html><html lang=\"{{ lang.html_lang }}\"><title>{% block title %}{% endblock %}</title>\
         <link rel=\"stylesheet\" href=\"{{ assets.css }}\"><body><header>Instance brand</header>\
         {% block body %}{% endblock %}</body></html>",
    );
    write(
        instance.path(),
        "queue.html",
        "{% extends \"base.html\" %}{% block body %}instance queue{% endblock %}",
    );
    write(
        room.path(),
        "queue.html",
        "{% extends \"base.html\" %}{% block body %}room queue {% include \"partials/note.html\" %}{% endblock %}",
    );
    write(
        room.path(),
        "partials/note.html",
        "<p>{{ t.queue_intro }}</p>",
    );
    let set = load(&[room.path(), instance.path()]).expect("valid layers");
    let html = render_with(
        &set,
        &visit(&lang("en")),
        &Page::Queue(Box::new(queue(waiting()))),
    );
    assert!(
        html.contains("<header>Instance brand</header>room queue <p>"),
        "{html}"
    );
    let closed = render_with(
        &set,
        &visit(&lang("en")),
        &Page::Closed(ClosedPage {
            reason: ClosedReason::Closed,
            rejoin_url: None,
        }),
    );
    assert!(
        closed.contains("<header>Instance brand</header>"),
        "{closed}"
    );
}

/// What a refusal says, checked in parts: the file relative to its
/// directory, the line, and words of the reason.
fn assert_refused(dir: &Path, file: &str, line: Option<usize>, words: &str) {
    let e = load(&[dir]).expect_err("refused");
    assert_eq!(e.file, file, "{e}");
    assert_eq!(e.line, line, "{e}");
    assert!(e.reason.contains(words), "{e}");
    let shown = e.to_string();
    assert!(shown.starts_with(&e.file), "{shown}");
}

#[test]
fn a_template_that_does_not_parse_is_refused_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "queue.html",
        "{% extends \"base.html\" %}\n{% block body %}\n<p>{{ ticket.position_text }</p>\n{% endblock %}\n",
    );
    assert_refused(dir.path(), "queue.html", Some(3), "syntax error");

    let dir = tempfile::tempdir().unwrap();
    // An unclosed block is reported where it opens.
    write(
        dir.path(),
        "closed.html",
        "<p>\n{% if reason %}\n<p>open</p>\n",
    );
    assert_refused(
        dir.path(),
        "closed.html",
        Some(2),
        "unexpected end of input",
    );
}

#[test]
fn an_unknown_variable_is_refused_even_in_a_branch_not_taken() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "queue.html",
        "{% extends \"base.html\" %}\n{% block body %}\n{% if pow %}\n  <p>{{ ticket.numbr }}</p>\n{% endif %}\n{% endblock %}\n",
    );
    let e = load(&[dir.path()]).expect_err("a typo");
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.reason.contains("unknown variable `ticket.numbr`"), "{e}");
    assert!(
        e.reason.contains("number_text"),
        "the hint lists the fields: {e}"
    );

    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "admitted.html",
        "<p>\n{{ ticket.position_text }}</p>",
    );
    assert_refused(
        dir.path(),
        "admitted.html",
        Some(2),
        "unknown variable `ticket`",
    );

    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "error.html", "<p>{{ t.no_such_message }}</p>");
    assert_refused(dir.path(), "error.html", Some(1), "`t.no_such_message`");
}

#[test]
fn a_shared_template_that_needs_another_page_s_variable_is_refused_on_render() {
    // base.html may name the queue page's variables as far as introspection
    // can tell, but the error page has no ticket: rendering finds it.
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "base.html",
        "<!DOCTYPE html>\n<html>\n<p>{{ ticket.position_text }}</p>{% block body %}{% endblock %}</html>",
    );
    assert_refused(dir.path(), "base.html", Some(3), "undefined");

    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "error.html",
        "<p>x</p>\n{% include \"missing.html\" %}",
    );
    assert_refused(dir.path(), "error.html", Some(2), "missing.html");
}

#[test]
fn inline_script_and_style_are_refused() {
    for (text, words) in [
        ("<p>x</p>\n<script>alert(1)</script>", "inline <script>"),
        ("<p>x</p>\n<p style=\"color: red\">x</p>", "style attribute"),
        (
            "<p>x</p>\n<a href=\"/\" onclick=\"x()\">x</a>",
            "event-handler",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "error.html", text);
        assert_refused(dir.path(), "error.html", Some(2), words);
    }
}

#[test]
fn a_directory_that_cannot_be_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let e = load(&[&missing]).expect_err("missing");
    assert_eq!(e.file, ".");
    assert!(!e.to_string().contains("/tmp"), "{e}");
    assert!(e.reason.contains("cannot read the directory"), "{e}");

    // A wrong path such as the root is refused, not walked whole.
    let e = load(&[Path::new("/")]).expect_err("the root directory");
    assert!(
        e.reason.contains("more than")
            || e.reason.contains("deep")
            || e.reason.contains("symbolic link"),
        "{e}"
    );
    // Named relative to the directory, not by the server's paths.
    assert!(!e.file.starts_with('/'), "{e}");

    write(dir.path(), "file", "x");
    let e = load(&[&dir.path().join("file")]).expect_err("a file");
    assert!(e.reason.contains("not a directory"), "{e}");

    write(dir.path(), "bad/queue.html", "");
    std::fs::write(dir.path().join("bad/queue.html"), [0xff, 0xfe]).unwrap();
    let e = load(&[&dir.path().join("bad")]).expect_err("not UTF-8");
    assert!(e.file == "queue.html" && e.reason.contains("UTF-8"), "{e}");
}

#[test]
fn the_book_loads_the_instance_and_configured_rooms_and_refuses_at_start() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "error.html",
        "{% extends \"base.html\" %}{% block body %}<h1>Brand error {{ status }}</h1>{% endblock %}",
    );
    let mut config = crate::config::Config::default();
    config.rooms[0].templates_dir = Some(dir.path().display().to_string());
    let book = PageBook::load(&config).expect("loads");
    let page = Page::Error(ErrorPage::for_status(StatusCode::NOT_FOUND));
    let body = |room: &str| {
        let v = Visit {
            room: room.into(),
            ..visit(&lang("en"))
        };
        let response = book.render(StatusCode::NOT_FOUND, &v, &page);
        let bytes = futures_util::FutureExt::now_or_never(axum::body::to_bytes(
            response.into_body(),
            usize::MAX,
        ))
        .unwrap()
        .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    };
    assert!(body("default").contains("Brand error 404"));
    assert!(!body("other").contains("Brand error"));

    write(dir.path(), "queue.html", "{{ nope }}");
    let e = PageBook::load(&config).expect_err("a broken room directory");
    assert!(
        e.to_string()
            .contains("queue.html:1: unknown variable `nope`"),
        "{e}"
    );
    config.rooms[0].templates_dir = None;
    config.templates_dir = Some(dir.path().to_path_buf());
    assert!(
        PageBook::load(&config).is_err(),
        "a broken instance directory"
    );
}
