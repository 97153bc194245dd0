//! The visitor's HTML pages: waiting, admitted, closed, and errors.
//!
//! Each page is a minijinja template rendered at run time, so an operator
//! can give the whole instance or one room a directory of their own
//! (`templates_dir`) without rebuilding: [`templates`] loads and checks such
//! a directory, [`book`] keeps which room uses which. The built-in pages in
//! `templates/pages/` are compiled in as the default and are the worked
//! example to copy.
//!
//! A handler describes a page as data: the [`Visit`] (language, room,
//! return path) and one of [`Page`]'s variants. Together they form the
//! template's context, whose every variable is documented in docs/pages.md
//! ("Your own pages") and known in advance, which is what lets a template
//! that names an unknown variable be refused when it is loaded instead of
//! failing in front of a visitor.
//!
//! Everything a page prints is HTML-escaped unless a template says
//! otherwise. The pages carry no inline script or style: the site sends
//! `Content-Security-Policy: default-src 'self'`, so behaviour lives in
//! `/static/queue.js` and reads its inputs from `data-*` attributes, and
//! looks live in `/static/narabu.css`.
//!
//! Every built-in page works without JavaScript: the queue page reloads
//! itself with a `<noscript>` meta refresh (the server answers the reload
//! with a 303 once the visitor is admitted), leaving is a plain form post,
//! and the admitted page links to the return path.

pub(crate) mod book;
mod check;
pub(crate) mod files;
pub(crate) mod templates;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::i18n::{Lang, Languages, Strings};
use crate::engine::TicketStatus;

pub use book::PageBook;
pub(crate) use templates::PageError;

/// The shortest meta refresh the queue page asks for: a zero would have
/// every visitor without JavaScript reload as fast as their browser can.
pub(crate) const MIN_REFRESH_SECONDS: u32 = 5;

/// The pages a template directory may provide, each a file of that name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageKind {
    Queue,
    Admitted,
    Closed,
    Error,
}

impl PageKind {
    pub(crate) const ALL: [PageKind; 4] = [
        PageKind::Queue,
        PageKind::Admitted,
        PageKind::Closed,
        PageKind::Error,
    ];

    /// The value of the `page` variable.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PageKind::Queue => "queue",
            PageKind::Admitted => "admitted",
            PageKind::Closed => "closed",
            PageKind::Error => "error",
        }
    }

    pub(crate) fn file(self) -> &'static str {
        match self {
            PageKind::Queue => "queue.html",
            PageKind::Admitted => "admitted.html",
            PageKind::Closed => "closed.html",
            PageKind::Error => "error.html",
        }
    }
}

/// Who is looking and from where: what every page shows whatever it is.
#[derive(Clone, Debug)]
pub(crate) struct Visit {
    pub lang: Lang,
    /// The room's id; empty for an error before the room is known.
    pub room: String,
    /// Validated by the handler as a relative path; checked again here
    /// ([`safe_return`]) before it lands in a link.
    pub return_path: String,
}

/// One page, with what only it shows.
#[derive(Clone, Debug)]
pub(crate) enum Page {
    Queue(Box<QueuePage>),
    Admitted,
    Closed(ClosedPage),
    Error(ErrorPage),
}

impl Page {
    pub(crate) fn kind(&self) -> PageKind {
        match self {
            Page::Queue(_) => PageKind::Queue,
            Page::Admitted => PageKind::Admitted,
            Page::Closed(_) => PageKind::Closed,
            Page::Error(_) => PageKind::Error,
        }
    }
}

/// The waiting page at `/queue/{room}`: the ticket's status as the API
/// returns it, in the visitor's language.
#[derive(Clone, Debug)]
pub(crate) struct QueuePage {
    pub status: TicketStatus,
    /// The visitor's lane, in a room with lanes.
    pub lane: Option<String>,
    /// How often visitors without JavaScript reload the page; at least
    /// [`MIN_REFRESH_SECONDS`].
    pub refresh_seconds: u32,
    pub urls: QueueUrls,
    /// Set while the browser must solve a proof of work to get a ticket.
    pub pow: Option<PowForm>,
    /// Before a scheduled opening with a draw: its commitment, and where
    /// anyone can read the draw's record.
    pub draw: Option<DrawLink>,
}

/// Where the queue page's script and form talk to.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct QueueUrls {
    pub events: String,
    pub status: String,
    pub leave: String,
    /// The visitor's signed receipt (`GET /api/rooms/{room}/receipt`).
    pub receipt: String,
    /// Where the page subscribes to be called back; `None` when push is
    /// off (the page then offers nothing).
    pub notify: Option<String>,
}

/// What the page's script needs to solve a challenge and join.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PowForm {
    pub token: String,
    pub difficulty: u8,
    pub join_url: String,
    /// This page's address without the enqueue token, to reload once joined.
    pub page_url: String,
    pub enqueue_token: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct DrawLink {
    pub commitment: String,
    pub url: String,
}

/// Why a visitor's wait ended without admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClosedReason {
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

impl ClosedReason {
    /// The value of the closed page's `reason` variable.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ClosedReason::Closed => "closed",
            ClosedReason::SoldOut => "sold_out",
            ClosedReason::Expired => "expired",
            ClosedReason::Left => "left",
            ClosedReason::Reset => "reset",
        }
    }
}

/// The end of a wait that did not lead to the site: the room closed, the
/// place expired, or the visitor left.
#[derive(Clone, Debug)]
pub(crate) struct ClosedPage {
    pub reason: ClosedReason,
    /// Where "Join the line again" goes; no button when `None` (a closed
    /// room cannot be joined). It must start a fresh join, not show this
    /// page again for the old ticket.
    pub rejoin_url: Option<String>,
}

/// An error page for visitors, in their language. It never shows internal
/// details: those belong in the log.
#[derive(Clone, Debug)]
pub(crate) struct ErrorPage {
    pub status: StatusCode,
    /// A title and message other than the status's own (an invitation
    /// page); `None` for the status's localized wording.
    pub wording: Option<(String, String)>,
}

impl ErrorPage {
    pub(crate) fn for_status(status: StatusCode) -> Self {
        Self {
            status,
            wording: None,
        }
    }
}

/// The localized title and message of an error status; statuses without
/// their own wording read as a server error.
fn error_wording(t: &Strings, status: StatusCode) -> (&str, &str) {
    match status {
        StatusCode::BAD_REQUEST => (&t.bad_request_title, &t.bad_request_body),
        StatusCode::NOT_FOUND => (&t.not_found_title, &t.not_found_body),
        StatusCode::TOO_MANY_REQUESTS => (&t.too_many_requests_title, &t.too_many_requests_body),
        StatusCode::SERVICE_UNAVAILABLE => (&t.unavailable_title, &t.unavailable_body),
        _ => (&t.server_error_title, &t.server_error_body),
    }
}

// ----- the template context ------------------------------------------------

/// The variables every page has.
#[derive(Serialize)]
pub(crate) struct Common<'a> {
    page: &'static str,
    room: &'a str,
    lang: LangVar<'a>,
    languages: Vec<LanguageLink<'a>>,
    t: &'a Strings,
    assets: Assets,
    return_path: &'a str,
}

#[derive(Serialize)]
struct LangVar<'a> {
    code: &'a str,
    html_lang: &'a str,
    name: &'a str,
}

/// One entry of the language switcher.
#[derive(Serialize)]
struct LanguageLink<'a> {
    code: &'a str,
    html_lang: &'a str,
    name: &'a str,
    /// This page in that language.
    url: String,
    current: bool,
}

/// The embedded script and styles, each with its version in the query.
#[derive(Serialize)]
struct Assets {
    css: String,
    queue_js: String,
    pow_js: String,
    pow_worker_js: String,
    /// The service worker that shows call-backs.
    push_sw_js: String,
}

impl Assets {
    fn new() -> Self {
        use super::assets::url;
        Self {
            css: url("narabu.css"),
            queue_js: url("queue.js"),
            pow_js: url("pow.js"),
            pow_worker_js: url("pow-worker.js"),
            push_sw_js: url("narabu-sw.js"),
        }
    }
}

/// The queue page's own variables.
#[derive(Serialize)]
struct QueueVars<'a> {
    ticket: TicketVar,
    lane: Option<&'a str>,
    refresh_seconds: u32,
    refresh_note: String,
    urls: &'a QueueUrls,
    pow: Option<&'a PowForm>,
    draw: Option<&'a DrawLink>,
    /// The call-back control's phrases, when the page offers it.
    push: Option<&'a crate::http::i18n::PushStrings>,
}

/// The ticket as the queue page shows it: each number raw (`none` when
/// not known yet) and as text in the page's language.
#[derive(Serialize)]
struct TicketVar {
    number: Option<u64>,
    number_text: String,
    position: Option<u64>,
    position_text: String,
    ahead: Option<u64>,
    ahead_text: String,
    eta: Option<EtaVar>,
    eta_text: String,
    queue_length: u64,
    queue_length_text: String,
    progress_percent: u8,
    progress_text: String,
    paused: bool,
    /// `queue`, `passthrough`, `maintenance` or `sold_out`.
    mode: &'static str,
    /// Units left, in a room that counts its stock.
    stock: Option<u64>,
    stock_text: String,
    /// RFC 3339, for `<time datetime>`.
    opens_at: Option<String>,
    opens_at_text: String,
    updated_at: String,
    updated_at_text: String,
    /// What screen readers announce about the place in line.
    announcement: String,
}

#[derive(Serialize)]
struct EtaVar {
    low_seconds: u64,
    expected_seconds: u64,
    high_seconds: u64,
}

impl TicketVar {
    fn new(s: &TicketStatus, t: &Strings) -> Self {
        let eta_text = t.format_eta_opt(s.eta.map(|e| e.low_secs), s.eta.map(|e| e.high_secs));
        let announcement = t.format_announcement(s.position, s.eta.is_some().then_some(&*eta_text));
        Self {
            number: s.number,
            number_text: t.count(s.number),
            position: s.position,
            position_text: t.count(s.position),
            ahead: s.ahead,
            ahead_text: t.count(s.ahead),
            eta: s.eta.map(|e| EtaVar {
                low_seconds: e.low_secs,
                expected_seconds: e.expected_secs,
                high_seconds: e.high_secs,
            }),
            eta_text,
            queue_length: s.queue_length,
            queue_length_text: t.format_queue_length(s.queue_length),
            progress_percent: s.percent(),
            progress_text: t.format_progress(s.percent()),
            paused: s.paused,
            mode: s.mode.name(),
            stock: s.stock,
            stock_text: s.stock.map(|n| t.format_stock_left(n)).unwrap_or_default(),
            opens_at: s.opens_at.map(|o| o.to_string()),
            opens_at_text: s.opens_at.map(|o| o.display_utc(true)).unwrap_or_default(),
            updated_at: s.at.to_string(),
            updated_at_text: s.at.display_utc(false),
            announcement,
        }
    }
}

#[derive(Serialize)]
struct ClosedVars<'a> {
    reason: &'static str,
    title: &'a str,
    message: &'a str,
    rejoin_url: Option<&'a str>,
}

#[derive(Serialize)]
struct ErrorVars<'a> {
    status: u16,
    code_text: String,
    title: &'a str,
    message: &'a str,
}

#[derive(Serialize)]
struct Context<'a, P: Serialize> {
    #[serde(flatten)]
    common: Common<'a>,
    #[serde(flatten)]
    page: P,
}

#[derive(Serialize)]
struct NoVars {}

/// A page's whole context, for rendering or (as JSON) for listing the
/// variables a template may use.
pub(crate) fn context(visit: &Visit, page: &Page, languages: &Languages) -> minijinja::Value {
    let t = visit.lang.strings();
    let return_path = safe_return(&visit.return_path);
    let link_query = match page {
        // The queue page keeps the return path across a language switch.
        Page::Queue(_) => form_urlencoded::Serializer::new(String::new())
            .append_pair("return", return_path)
            .finish(),
        _ => String::new(),
    };
    let common = Common {
        page: page.kind().name(),
        room: &visit.room,
        lang: LangVar {
            code: visit.lang.code(),
            html_lang: visit.lang.html_lang(),
            name: visit.lang.native_name(),
        },
        languages: languages
            .all()
            .iter()
            .map(|other| LanguageLink {
                code: other.code(),
                html_lang: other.html_lang(),
                name: other.native_name(),
                url: if link_query.is_empty() {
                    format!("?lang={}", other.code())
                } else {
                    format!("?lang={}&{link_query}", other.code())
                },
                current: other.code() == visit.lang.code(),
            })
            .collect(),
        t,
        assets: Assets::new(),
        return_path,
    };
    match page {
        Page::Queue(q) => {
            let refresh_seconds = q.refresh_seconds.max(MIN_REFRESH_SECONDS);
            let page = QueueVars {
                ticket: TicketVar::new(&q.status, t),
                lane: q.lane.as_deref(),
                refresh_seconds,
                refresh_note: t.format_refresh_note(refresh_seconds),
                urls: &q.urls,
                pow: q.pow.as_ref(),
                draw: q.draw.as_ref(),
                push: q
                    .urls
                    .notify
                    .as_ref()
                    .map(|_| languages.push_strings(visit.lang.code())),
            };
            minijinja::Value::from(minijinja::value::Serde(Context { common, page }))
        }
        Page::Admitted => minijinja::Value::from(minijinja::value::Serde(Context {
            common,
            page: NoVars {},
        })),
        Page::Closed(c) => {
            let (title, message) = match c.reason {
                ClosedReason::Closed => (&t.closed_title, &t.closed_body),
                ClosedReason::SoldOut => (&t.sold_out_title, &t.sold_out_body),
                ClosedReason::Expired => (&t.expired_title, &t.expired_body),
                ClosedReason::Left => (&t.left_title, &t.left_body),
                ClosedReason::Reset => (&t.reset_title, &t.reset_body),
            };
            let page = ClosedVars {
                reason: c.reason.name(),
                title,
                message,
                rejoin_url: c.rejoin_url.as_deref(),
            };
            minijinja::Value::from(minijinja::value::Serde(Context { common, page }))
        }
        Page::Error(e) => {
            let (title, message) = match &e.wording {
                Some((title, message)) => (title.as_str(), message.as_str()),
                None => error_wording(t, e.status),
            };
            let page = ErrorVars {
                status: e.status.as_u16(),
                code_text: t.format_error_code(e.status.as_u16()),
                title,
                message,
            };
            minijinja::Value::from(minijinja::value::Serde(Context { common, page }))
        }
    }
}

/// An HTML response. Pages are about one visitor's place in line, so no
/// cache may keep them.
pub(crate) fn html(status: StatusCode, body: String) -> Response {
    (
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
        .into_response()
}

/// The return path if it is a plain same-site path, else `/`.
///
/// Handlers validate the return path already; this is the last line before
/// it lands in a link, a meta refresh and a script's navigation, so it also
/// refuses what browsers would turn into another host: `//host`, and
/// backslashes or control characters that URL parsing rewrites or drops
/// (`/\host`, `/\t/host`).
pub(crate) fn safe_return(path: &str) -> &str {
    let plain = path.starts_with('/')
        && !path.starts_with("//")
        && !path.chars().any(|c| c == '\\' || c.is_control());
    if plain { path } else { "/" }
}

#[cfg(test)]
mod tests;
