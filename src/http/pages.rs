//! The visitor's HTML pages: waiting, admitted, closed, and errors.
//!
//! Each page is an askama template compiled into the binary, so a page can
//! never refer to a field that does not exist, and everything it prints is
//! HTML-escaped unless a template says otherwise (none do). The pages carry
//! no inline script or style: the site sends `Content-Security-Policy:
//! default-src 'self'`, so behaviour lives in `/static/queue.js` and reads
//! its inputs from `data-*` attributes, and looks live in `/static/narabu.css`.
//!
//! Every page works without JavaScript: the queue page reloads itself with a
//! `<noscript>` meta refresh (the server answers the reload with a 303 once
//! the visitor is admitted), leaving is a plain form post, and the admitted
//! page links to the return path.

use std::borrow::Cow;

use askama::Template;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::i18n::{Lang, Strings};
use crate::engine::TicketStatus;

/// The shortest meta refresh the queue page asks for: a zero would have
/// every visitor without JavaScript reload as fast as their browser can.
pub const MIN_REFRESH_SECONDS: u32 = 5;

/// The waiting page at `/queue/{room}`: the ticket's status as the API
/// returns it, in the visitor's language.
#[derive(Debug, Template)]
#[template(path = "queue.html")]
pub struct QueuePage {
    pub lang: Lang,
    pub t: &'static Strings,
    pub room: String,
    pub status: TicketStatus,
    /// Already validated as a relative path; checked again before use.
    pub return_path: String,
    /// How often visitors without JavaScript reload the page; at least
    /// [`MIN_REFRESH_SECONDS`].
    pub refresh_seconds: u32,
    pub events_url: String,
    pub status_url: String,
    pub leave_url: String,
    /// Set while the browser must solve a proof of work to get a ticket.
    pub pow: Option<PowForm>,
    /// Before a scheduled opening with a draw: its commitment, and where
    /// anyone can read the draw's record.
    pub draw: Option<DrawLink>,
}

/// What the page's script needs to solve a challenge and join.
#[derive(Debug)]
pub struct PowForm {
    pub token: String,
    pub difficulty: u8,
    pub join_url: String,
    /// This page's address without the enqueue token, to reload once joined.
    pub page_url: String,
    pub enqueue_token: Option<String>,
}

#[derive(Debug)]
pub struct DrawLink {
    pub commitment: String,
    pub url: String,
}

impl QueuePage {
    fn safe_return(&self) -> &str {
        safe_return(&self.return_path)
    }

    /// Askama hands method arguments over by reference, hence `&Option`.
    fn count(&self, n: &Option<u64>) -> String {
        self.t.count(*n)
    }

    fn queue_length_text(&self) -> String {
        self.t.format_queue_length(self.status.queue_length)
    }

    fn refresh_seconds(&self) -> u32 {
        self.refresh_seconds.max(MIN_REFRESH_SECONDS)
    }

    fn refresh_note(&self) -> String {
        self.t.format_refresh_note(self.refresh_seconds())
    }

    fn percent(&self) -> u8 {
        self.status.percent()
    }

    fn eta_text(&self) -> String {
        let eta = self.status.eta;
        self.t
            .format_eta_opt(eta.map(|e| e.low_secs), eta.map(|e| e.high_secs))
    }

    fn announcement(&self) -> String {
        let eta = self.status.eta.is_some().then(|| self.eta_text());
        self.t
            .format_announcement(self.status.position, eta.as_deref())
    }
}

/// "It's your turn": shown when an admitted visitor lands on the queue page
/// in a way that cannot be answered with a redirect. It forwards by itself
/// after a second (a meta refresh, which needs no script), and its link is
/// there for anyone whose browser does not follow it.
#[derive(Debug, Template)]
#[template(path = "admitted.html")]
pub struct AdmittedPage {
    pub lang: Lang,
    pub t: &'static Strings,
    pub room: String,
    /// Already validated as a relative path; checked again before use.
    pub return_path: String,
}

impl AdmittedPage {
    fn safe_return(&self) -> &str {
        safe_return(&self.return_path)
    }
}

/// Why a visitor's wait ended without admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosedReason {
    /// The operator closed the room.
    Closed,
    /// The room sold out (`rules::Mode::SoldOut`).
    SoldOut,
    /// The ticket was abandoned or its pass revoked.
    Expired,
    /// The visitor left the line.
    Left,
    /// The line the ticket stood in was reset.
    Reset,
}

/// The end of a wait that did not lead to the site: the room closed, the
/// place expired, or the visitor left.
#[derive(Debug, Template)]
#[template(path = "closed.html")]
pub struct ClosedPage {
    pub lang: Lang,
    pub t: &'static Strings,
    pub room: String,
    pub reason: ClosedReason,
    /// Where "Join the line again" goes; no button when `None` (a closed
    /// room cannot be joined). It must start a fresh join, not show this
    /// page again for the old ticket.
    pub rejoin_url: Option<String>,
}

impl ClosedPage {
    fn title(&self) -> &'static str {
        match self.reason {
            ClosedReason::Closed => self.t.closed_title,
            ClosedReason::SoldOut => self.t.sold_out_title,
            ClosedReason::Expired => self.t.expired_title,
            ClosedReason::Left => self.t.left_title,
            ClosedReason::Reset => self.t.reset_title,
        }
    }

    fn body(&self) -> &'static str {
        match self.reason {
            ClosedReason::Closed => self.t.closed_body,
            ClosedReason::SoldOut => self.t.sold_out_body,
            ClosedReason::Expired => self.t.expired_body,
            ClosedReason::Left => self.t.left_body,
            ClosedReason::Reset => self.t.reset_body,
        }
    }
}

/// An error page for visitors, in their language. It never shows internal
/// details: those belong in the log.
#[derive(Debug, Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub lang: Lang,
    pub t: &'static Strings,
    pub status: u16,
    pub title: Cow<'static, str>,
    pub message: Cow<'static, str>,
}

impl ErrorPage {
    /// The page for a status code, with the fitting localized title and
    /// message; statuses without their own wording read as a server error.
    pub fn for_status(lang: Lang, status: StatusCode) -> Self {
        let t = lang.strings();
        let (title, message) = match status {
            StatusCode::BAD_REQUEST => (t.bad_request_title, t.bad_request_body),
            StatusCode::NOT_FOUND => (t.not_found_title, t.not_found_body),
            StatusCode::TOO_MANY_REQUESTS => (t.too_many_requests_title, t.too_many_requests_body),
            StatusCode::SERVICE_UNAVAILABLE => (t.unavailable_title, t.unavailable_body),
            _ => (t.server_error_title, t.server_error_body),
        };
        ErrorPage {
            lang,
            t,
            status: status.as_u16(),
            title: Cow::Borrowed(title),
            message: Cow::Borrowed(message),
        }
    }
}

impl ErrorPage {
    fn code_text(&self) -> String {
        self.t.format_error_code(self.status)
    }
}

impl IntoResponse for ErrorPage {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        html(status, &self)
    }
}

/// Renders a page as an HTML response. Pages are about one visitor's place
/// in line, so no cache may keep them. A template that fails to render is
/// logged and answered with a bare 500 rather than half a page.
pub fn html<T: Template>(status: StatusCode, page: &T) -> Response {
    match page.render() {
        Ok(body) => (
            status,
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=utf-8"),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            ],
            body,
        )
            .into_response(),
        Err(err) => {
            tracing::error!(error = %err, "rendering a page failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// The return path if it is a plain same-site path, else `/`.
///
/// Handlers validate the return path already; this is the last line before
/// it lands in a link, a meta refresh and a script's navigation, so it also
/// refuses what browsers would turn into another host: `//host`, and
/// backslashes or control characters that URL parsing rewrites or drops
/// (`/\host`, `/\t/host`).
pub fn safe_return(path: &str) -> &str {
    let plain = path.starts_with('/')
        && !path.starts_with("//")
        && !path.chars().any(|c| c == '\\' || c.is_control());
    if plain { path } else { "/" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Eta, Timestamp};

    fn waiting() -> TicketStatus {
        TicketStatus {
            id: 7,
            state: crate::engine::TicketState::Waiting,
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
            mode: crate::engine::rules::Mode::Queue,
            stock: None,
            joined_at: Timestamp(1_795_428_000_000),
            admitted_at: None,
            pass_expires_at: None,
            opens_at: None,
            // 2026-11-23T10:00:05Z
            at: Timestamp(1_795_428_005_000),
        }
    }

    fn queue_page(lang: Lang) -> QueuePage {
        QueuePage {
            lang,
            t: lang.strings(),
            room: "sale".into(),
            status: waiting(),
            return_path: "/tickets?id=7&seat=a".into(),
            refresh_seconds: 20,
            events_url: "/api/rooms/sale/events".into(),
            status_url: "/api/rooms/sale/status".into(),
            leave_url: "/api/rooms/sale/leave".into(),
            pow: None,
            draw: None,
        }
    }

    /// A string as askama's HTML escaper prints it.
    fn esc(s: &str) -> String {
        s.replace('&', "&#38;")
            .replace('<', "&#60;")
            .replace('>', "&#62;")
            .replace('"', "&#34;")
            .replace('\'', "&#39;")
    }

    fn assert_text(html: &str, text: &str) {
        assert!(html.contains(&esc(text)), "lacks {text:?}\n{html}");
    }

    fn assert_base(html: &str, lang: Lang) {
        assert!(html.starts_with("<!DOCTYPE html>"));
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
    fn queue_page_renders_in_every_language() {
        for lang in Lang::ALL {
            let t = lang.strings();
            let html = queue_page(lang).render().unwrap();
            assert_base(&html, lang);
            for text in [
                t.queue_title,
                t.ticket_number,
                t.position,
                t.ahead,
                t.eta,
                t.progress,
                t.last_updated,
                t.leave,
                t.leave_confirm,
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
                "data-return=\"/tickets?id=7&#38;seat=a\"",
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
                    ("range", unit.range),
                    ("single", unit.single),
                    ("one", unit.one),
                ] {
                    let attr = format!("data-eta-{name}-{form}=\"{}\"", esc(template));
                    assert!(html.contains(&attr), "{lang:?} lacks {attr}");
                }
            }
            for attr in [
                "data-eta-now",
                "data-eta-unknown",
                "data-unknown",
                "data-progress-text",
                "data-queue-length",
                "data-announce",
                "data-announce-eta",
            ] {
                assert!(
                    html.contains(&format!("{attr}=\"")),
                    "{lang:?} lacks {attr}"
                );
            }
            // Not paused and already open: the notices stay hidden or absent.
            assert!(html.contains("id=\"paused\" aria-labelledby=\"paused-title\" hidden>"));
            assert!(!html.contains("id=\"preopen\""));
        }
    }

    /// queue.js reads `data.someName` for `data-some-name`; every one it
    /// reads must be on the page, or the script would show "undefined".
    #[test]
    fn queue_page_carries_every_data_attribute_the_script_reads() {
        let script = include_str!("../../static/queue.js");
        let html = queue_page(Lang::Ja).render().unwrap();
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
        assert!(script.contains("data[\"return\"]") && html.contains(" data-return=\""));
    }

    #[test]
    fn queue_page_before_opening_and_while_paused() {
        for lang in Lang::ALL {
            let t = lang.strings();
            let page = QueuePage {
                status: TicketStatus {
                    number: None,
                    position: None,
                    ahead: None,
                    eta: None,
                    progress: 0.0,
                    // 2026-12-01T01:00:00Z
                    opens_at: Some(Timestamp(1_796_086_800_000)),
                    paused: true,
                    ..waiting()
                },
                ..queue_page(lang)
            };
            let html = page.render().unwrap();
            assert_text(&html, t.ticket_number_pending);
            assert_text(&html, t.not_open_title);
            assert_text(&html, t.opens_at);
            assert_text(&html, t.not_open_note);
            assert!(html.contains(
                "<time datetime=\"2026-12-01T01:00:00Z\" data-format=\"datetime\">\
                 2026-12-01 01:00 UTC</time>"
            ));
            assert_text(&html, t.paused_title);
            assert!(!html.contains("aria-labelledby=\"paused-title\" hidden"));
            assert!(html.contains(&format!("<dd id=\"eta\">{}</dd>", esc(t.eta_unknown))));
            assert!(html.contains(&format!(
                "<dd id=\"position\">{}</dd>",
                esc(t.unknown_value)
            )));
        }
    }

    #[test]
    fn queue_page_never_refreshes_in_a_tight_loop() {
        let page = QueuePage {
            refresh_seconds: 0,
            ..queue_page(Lang::En)
        };
        let html = page.render().unwrap();
        assert!(html.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
        assert_text(&html, &page.t.format_refresh_note(5));
    }

    #[test]
    fn queue_page_escapes_everything() {
        let page = QueuePage {
            room: "<script>alert(1)</script>".into(),
            return_path: "/x?a=\"><script>alert(2)</script>".into(),
            events_url: "\"><script>alert(3)</script>".into(),
            ..queue_page(Lang::En)
        };
        let html = page.render().unwrap();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&#60;script&#62;alert(1)&#60;/script&#62;"));
        assert!(html.contains("data-return=\"/x?a=&#34;&#62;&#60;script&#62;alert(2)"));
        assert!(html.contains("data-events-url=\"&#34;&#62;&#60;script&#62;alert(3)"));
        // The language links carry the return path percent-encoded.
        assert!(html.contains("return=/x%3Fa%3D%22%3E%3Cscript%3Ealert%282%29"));
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
            let page = AdmittedPage {
                return_path: bad.into(),
                ..admitted_page(Lang::En)
            };
            let html = page.render().unwrap();
            assert!(html.contains("content=\"1; url=/\""), "{bad:?}");
        }
        for good in ["/", "/tickets", "/a/b?c=d&e=%2F#top", "/%2F%2Fevil"] {
            assert_eq!(safe_return(good), good);
        }
    }

    fn admitted_page(lang: Lang) -> AdmittedPage {
        AdmittedPage {
            lang,
            t: lang.strings(),
            room: "sale".into(),
            return_path: "/checkout".into(),
        }
    }

    #[test]
    fn admitted_page_renders_in_every_language() {
        for lang in Lang::ALL {
            let t = lang.strings();
            let html = admitted_page(lang).render().unwrap();
            assert_base(&html, lang);
            assert_text(&html, t.admitted_title);
            assert_text(&html, t.admitted_body);
            assert_text(&html, t.redirecting);
            assert!(html.contains(&format!(
                "<a class=\"button\" href=\"/checkout\">{}</a>",
                esc(t.continue_label)
            )));
            assert!(html.contains("<meta http-equiv=\"refresh\" content=\"1; url=/checkout\">"));
        }
    }

    #[test]
    fn closed_page_renders_each_reason_in_every_language() {
        for lang in Lang::ALL {
            let t = lang.strings();
            for (reason, title, body) in [
                (ClosedReason::Closed, t.closed_title, t.closed_body),
                (ClosedReason::SoldOut, t.sold_out_title, t.sold_out_body),
                (ClosedReason::Expired, t.expired_title, t.expired_body),
                (ClosedReason::Left, t.left_title, t.left_body),
                (ClosedReason::Reset, t.reset_title, t.reset_body),
            ] {
                let ended = !matches!(reason, ClosedReason::Closed | ClosedReason::SoldOut);
                let rejoin = ended.then(|| "/queue/sale?return=%2F".into());
                let html = ClosedPage {
                    lang,
                    t,
                    room: "sale".into(),
                    reason,
                    rejoin_url: rejoin.clone(),
                }
                .render()
                .unwrap();
                assert_base(&html, lang);
                assert!(html.contains(&format!("<h1>{}</h1>", esc(title))));
                assert_text(&html, body);
                assert_eq!(html.contains(&esc(t.join_again)), rejoin.is_some());
                if rejoin.is_some() {
                    assert!(html.contains("href=\"/queue/sale?return=%2F\""));
                }
            }
        }
    }

    #[test]
    fn error_pages_render_in_every_language() {
        for lang in Lang::ALL {
            let t = lang.strings();
            for (status, title) in [
                (StatusCode::BAD_REQUEST, t.bad_request_title),
                (StatusCode::NOT_FOUND, t.not_found_title),
                (StatusCode::TOO_MANY_REQUESTS, t.too_many_requests_title),
                (StatusCode::SERVICE_UNAVAILABLE, t.unavailable_title),
                (StatusCode::INTERNAL_SERVER_ERROR, t.server_error_title),
                (StatusCode::IM_A_TEAPOT, t.server_error_title),
            ] {
                let page = ErrorPage::for_status(lang, status);
                let html = page.render().unwrap();
                assert_base(&html, lang);
                assert!(html.contains(&format!("<h1>{}</h1>", esc(title))));
                assert_text(&html, &t.format_error_code(status.as_u16()));
            }
        }
        let custom = ErrorPage {
            title: "<i>x</i>".into(),
            message: format!("room {}", "<script>").into(),
            ..ErrorPage::for_status(Lang::En, StatusCode::BAD_REQUEST)
        };
        let html = custom.render().unwrap();
        assert!(html.contains(&esc("<i>x</i>")) && html.contains(&esc("room <script>")));
    }

    #[test]
    fn error_page_responds_with_its_status() {
        let response =
            ErrorPage::for_status(Lang::Ja, StatusCode::TOO_MANY_REQUESTS).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        assert_eq!(response.headers()[header::CACHE_CONTROL], "no-store");
    }
}
