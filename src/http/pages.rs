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

/// The shortest meta refresh the queue page asks for: a zero would have
/// every visitor without JavaScript reload as fast as their browser can.
pub const MIN_REFRESH_SECONDS: u32 = 5;

/// The waiting page at `/queue/{room}`.
#[derive(Debug, Template)]
#[template(path = "queue.html")]
pub struct QueuePage {
    pub lang: Lang,
    pub t: &'static Strings,
    pub room: String,
    /// The ticket number; `None` until a scheduled opening draws the order.
    pub number: Option<u64>,
    pub position: Option<u64>,
    pub ahead: Option<u64>,
    pub eta_low_secs: Option<u64>,
    pub eta_high_secs: Option<u64>,
    /// 0 to 100; larger values show as 100.
    pub progress_percent: u8,
    pub queue_length: u64,
    /// RFC 3339, UTC.
    pub updated_at: String,
    /// RFC 3339; shown while the room has not opened yet.
    pub opens_at: Option<String>,
    pub paused: bool,
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
        self.t.format_queue_length(self.queue_length)
    }

    fn refresh_seconds(&self) -> u32 {
        self.refresh_seconds.max(MIN_REFRESH_SECONDS)
    }

    fn refresh_note(&self) -> String {
        self.t.format_refresh_note(self.refresh_seconds())
    }

    fn percent(&self) -> u8 {
        self.progress_percent.min(100)
    }

    fn eta_text(&self) -> String {
        self.t.format_eta_opt(self.eta_low_secs, self.eta_high_secs)
    }

    fn announcement(&self) -> String {
        let eta =
            (self.eta_low_secs.is_some() || self.eta_high_secs.is_some()).then(|| self.eta_text());
        self.t.format_announcement(self.position, eta.as_deref())
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
    /// The ticket was abandoned or its pass revoked.
    Expired,
    /// The visitor left the line.
    Left,
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
            ClosedReason::Expired => self.t.expired_title,
            ClosedReason::Left => self.t.left_title,
        }
    }

    fn body(&self) -> &'static str {
        match self.reason {
            ClosedReason::Closed => self.t.closed_body,
            ClosedReason::Expired => self.t.expired_body,
            ClosedReason::Left => self.t.left_body,
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

/// An RFC 3339 time as a reader sees it before the script localizes it to
/// their own time zone: `2026-12-01 10:00 UTC+09:00`, or `10:00:00 UTC`
/// with `with_date` off. Anything that does not parse is shown as given.
pub fn display_time(rfc3339: &str, with_date: bool) -> String {
    parse_rfc3339(rfc3339).map_or_else(
        || rfc3339.to_owned(),
        |(date, hm, secs, zone)| {
            if with_date {
                format!("{date} {hm} {zone}")
            } else {
                format!("{hm}:{secs} {zone}")
            }
        },
    )
}

/// Splits `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` into its date, `HH:MM`,
/// seconds and zone (`UTC` or `UTC±HH:MM`), checking only its shape.
fn parse_rfc3339(s: &str) -> Option<(&str, &str, &str, String)> {
    let shape = |part: &str, pattern: &str| {
        part.len() == pattern.len()
            && part.bytes().zip(pattern.bytes()).all(|(c, p)| {
                if p == b'9' {
                    c.is_ascii_digit()
                } else {
                    c == p
                }
            })
    };
    let date = s.get(..10).filter(|d| shape(d, "9999-99-99"))?;
    if !matches!(s.as_bytes().get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let time = s.get(11..19).filter(|t| shape(t, "99:99:99"))?;
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        rest = frac.get(digits..).filter(|_| digits > 0)?;
    }
    let zone = match rest {
        "Z" | "z" => "UTC".to_owned(),
        offset if shape(&offset.replace('-', "+"), "+99:99") => format!("UTC{offset}"),
        _ => return None,
    };
    Some((date, &time[..5], &time[6..], zone))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_page(lang: Lang) -> QueuePage {
        QueuePage {
            lang,
            t: lang.strings(),
            room: "sale".into(),
            number: Some(12_345),
            position: Some(1_234),
            ahead: Some(1_233),
            eta_low_secs: Some(90),
            eta_high_secs: Some(150),
            progress_percent: 42,
            queue_length: 200_000,
            updated_at: "2026-11-23T10:00:05Z".into(),
            opens_at: None,
            paused: false,
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
                number: None,
                position: None,
                ahead: None,
                eta_low_secs: None,
                eta_high_secs: None,
                progress_percent: 0,
                opens_at: Some("2026-12-01T10:00:00+09:00".into()),
                paused: true,
                ..queue_page(lang)
            };
            let html = page.render().unwrap();
            assert_text(&html, t.ticket_number_pending);
            assert_text(&html, t.not_open_title);
            assert_text(&html, t.opens_at);
            assert_text(&html, t.not_open_note);
            assert!(html.contains(
                "<time datetime=\"2026-12-01T10:00:00+09:00\" data-format=\"datetime\">\
                 2026-12-01 10:00 UTC+09:00</time>"
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
            updated_at: "<b>now</b>".into(),
            events_url: "\"><script>alert(3)</script>".into(),
            ..queue_page(Lang::En)
        };
        let html = page.render().unwrap();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(!html.contains("<b>"));
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
                (ClosedReason::Expired, t.expired_title, t.expired_body),
                (ClosedReason::Left, t.left_title, t.left_body),
            ] {
                let rejoin =
                    (reason != ClosedReason::Closed).then(|| "/queue/sale?return=%2F".into());
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

    #[test]
    fn times_display_before_the_script_localizes_them() {
        assert_eq!(display_time("2026-11-23T10:00:05Z", false), "10:00:05 UTC");
        assert_eq!(
            display_time("2026-11-23T10:00:05.123Z", true),
            "2026-11-23 10:00 UTC"
        );
        assert_eq!(
            display_time("2026-12-01T10:00:00-05:30", true),
            "2026-12-01 10:00 UTC-05:30"
        );
        for raw in [
            "",
            "soon",
            "2026-11-23",
            "2026-11-23T10:00:05",
            "2026-11-23T10:00:05.Z",
            "２026-11-23T10:00:05Z",
            "2026-11-23T10:00:05+0900",
        ] {
            assert_eq!(display_time(raw, true), raw);
        }
    }
}
