//! Proves a template set before any visitor sees it.
//!
//! Three checks, each naming file, line and reason:
//!
//! - every variable an operator's template names (`ticket.numbr`, in any
//!   branch, found by minijinja's introspection of the source) must be one
//!   its page provides; a template that is not a page (a base or a
//!   partial) may name any page's variable;
//! - every page renders, with undefined values refused, against sample
//!   visits that take each branch the data can take (a ticket with and
//!   without a number, a proof of work, a draw, each closing reason) in
//!   every language the set speaks: this finds what introspection cannot, such
//!   as a base template using a variable only the queue page has, an
//!   `include` of a file that is not there, or a filter given a number;
//! - no template carries inline script, inline style or event-handler
//!   attributes, which the pages' Content-Security-Policy would block:
//!   refusing them here saves an operator from a page that silently
//!   misbehaves.
//!
//! The variables a page provides are read off the sample contexts
//! themselves, so the list cannot drift from what handlers really pass.

use std::collections::BTreeSet;

use axum::http::StatusCode;

use super::templates::{PageError, PageTemplates, Source};
use super::{
    ClosedPage, ClosedReason, DrawLink, ErrorPage, Page, PageKind, PowForm, QueuePage, QueueUrls,
    Visit, context,
};
use crate::engine::rules::Mode;
use crate::engine::{Eta, TicketState, TicketStatus, Timestamp};
use crate::http::i18n::{Lang, Languages};

/// Names minijinja provides itself, which introspection reports as
/// undeclared like any variable.
const GLOBALS: [&str; 8] = [
    "range",
    "dict",
    "namespace",
    "debug",
    "loop",
    "self",
    "super",
    "caller",
];

/// Checks a parsed set; see the module doc.
pub(super) fn check(set: &PageTemplates, languages: &Languages) -> Result<(), PageError> {
    let samples = samples(languages.default_language().clone());
    let mut all = BTreeSet::new();
    let mut by_kind: Vec<(PageKind, BTreeSet<String>)> = Vec::new();
    for kind in PageKind::ALL {
        let mut vars = BTreeSet::new();
        for (visit, page) in samples.iter().filter(|(_, p)| p.kind() == kind) {
            let json = serde_json::to_value(context(visit, page, languages)).unwrap_or_default();
            paths(&json, "", &mut vars);
        }
        all.extend(vars.iter().cloned());
        by_kind.push((kind, vars));
    }
    for source in set.sources().iter().filter(|s| s.path.is_some()) {
        let allowed = by_kind
            .iter()
            .find(|(kind, _)| kind.file() == source.name)
            .map_or(&all, |(_, vars)| vars);
        for var in set.undeclared(&source.name) {
            if GLOBALS.contains(&var.as_str()) {
                continue;
            }
            // Name the first part that is unknown: `ticket` in
            // `ticket.position_text` on a page without a ticket.
            let mut end = 0;
            let unknown = loop {
                end = var[end..].find('.').map_or(var.len(), |i| end + i);
                let prefix = &var[..end];
                if !allowed.contains(prefix) {
                    break Some(prefix);
                }
                if end == var.len() {
                    break None;
                }
                end += 1;
            };
            if let Some(unknown) = unknown {
                return Err(unknown_variable(source, unknown, allowed));
            }
        }
        if let Some((line, what)) = inline_code(&source.text) {
            return Err(PageError::new(
                source.shown(),
                Some(line),
                format!(
                    "{what} is blocked by the pages' Content-Security-Policy \
                     (default-src 'self'); link a script or stylesheet file instead"
                ),
            ));
        }
    }
    for (visit, page) in &samples {
        for lang in languages.all() {
            let visit = Visit {
                lang: lang.clone(),
                ..visit.clone()
            };
            set.render(page.kind(), &context(&visit, page, languages))
                .map_err(|e| set.describe(&e))?;
        }
    }
    // A partial no page includes yet is still rendered once, with every
    // variable there is, so its mistakes show now rather than on the day
    // a page starts to include it.
    for source in set.sources().iter().filter(|s| s.path.is_some()) {
        if PageKind::ALL.iter().any(|k| k.file() == source.name) || is_layout(source) {
            continue;
        }
        let (visit, page) = &samples[0];
        set.render_named(&source.name, &context(visit, page, languages))
            .map_err(|e| set.describe(&e))?;
    }
    Ok(())
}

/// A template meant to be extended (it has blocks): rendered through the
/// pages that extend it, not alone.
fn is_layout(source: &Source) -> bool {
    source.text.contains("{% block") || source.text.contains("{%- block")
}

fn unknown_variable(source: &Source, var: &str, allowed: &BTreeSet<String>) -> PageError {
    let top: BTreeSet<&str> = allowed
        .iter()
        .filter(|p| !p.contains('.'))
        .map(String::as_str)
        .collect();
    let hint = match var.rsplit_once('.') {
        Some((parent, _)) if allowed.contains(parent) => {
            let fields: Vec<&str> = allowed
                .iter()
                .filter_map(|p| p.strip_prefix(parent)?.strip_prefix('.'))
                .filter(|rest| !rest.contains('.'))
                .collect();
            format!("`{parent}` has {}", fields.join(", "))
        }
        _ => format!(
            "this page's variables are {}",
            top.into_iter().collect::<Vec<_>>().join(", ")
        ),
    };
    let line = find_line(&source.text, var);
    PageError::new(
        source.shown(),
        line,
        format!("unknown variable `{var}` ({hint})"),
    )
}

/// Every dotted path of a context: `ticket`, `ticket.number`, `t.fair`,
/// `t.fair.pow_title`. Lists are not entered: their items are named by
/// loop variables, which introspection does not report.
fn paths(value: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let serde_json::Value::Object(map) = value {
        for (key, inner) in map {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            paths(inner, &path, out);
            out.insert(path);
        }
    }
}

/// The 1-based line where `var` first appears as a whole name.
fn find_line(text: &str, var: &str) -> Option<usize> {
    let is_name = |c: char| c.is_alphanumeric() || c == '_' || c == '.';
    text.match_indices(var)
        .find(|(i, _)| {
            let before = text[..*i].chars().next_back();
            let after = text[i + var.len()..].chars().next();
            !before.is_some_and(is_name) && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(i, _)| text[..i].matches('\n').count() + 1)
}

/// The first inline script, inline style or event-handler attribute in a
/// template's markup, with its line.
fn inline_code(text: &str) -> Option<(usize, &'static str)> {
    let lower = text.to_ascii_lowercase();
    let line_of = |i: usize| lower[..i].matches('\n').count() + 1;
    let mut from = 0;
    while let Some(start) = lower[from..].find('<').map(|i| from + i) {
        let end = lower[start..].find('>').map_or(lower.len(), |i| start + i);
        let tag = &lower[start + 1..end];
        from = end.max(start + 1);
        let name: String = tag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        if name == "style" {
            return Some((line_of(start), "an inline <style> element"));
        }
        if name == "script" && !has_attribute(tag, "src") {
            return Some((line_of(start), "an inline <script>"));
        }
        if name.is_empty() {
            continue;
        }
        if has_attribute(tag, "style") {
            return Some((line_of(start), "a style attribute"));
        }
        let mut rest = tag;
        while let Some(i) = rest.find(|c: char| c.is_ascii_whitespace()) {
            rest = rest[i..].trim_start();
            let attr: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if attr.len() > 2
                && attr.starts_with("on")
                && rest[attr.len()..].trim_start().starts_with('=')
            {
                return Some((line_of(start), "an event-handler attribute (on…=)"));
            }
        }
    }
    None
}

/// Whether a tag's text (after `<`) has the attribute `name`.
fn has_attribute(tag: &str, name: &str) -> bool {
    tag.match_indices(name).any(|(i, _)| {
        let before = tag[..i].chars().next_back();
        let after = tag[i + name.len()..].trim_start();
        before.is_some_and(|c| c.is_ascii_whitespace()) && after.starts_with('=')
    })
}

/// Visits that between them take every branch the built-in pages have.
fn samples(lang: Lang) -> Vec<(Visit, Page)> {
    let visit = Visit {
        lang,
        room: "sale".into(),
        return_path: "/tickets?id=7".into(),
    };
    let at = Timestamp(1_795_428_005_000);
    let full = TicketStatus {
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
        paused: true,
        closed: false,
        mode: Mode::Maintenance,
        stock: Some(40),
        joined_at: at,
        admitted_at: None,
        pass_expires_at: None,
        opens_at: Some(Timestamp(1_796_086_800_000)),
        at,
    };
    let empty = TicketStatus {
        number: None,
        position: None,
        ahead: None,
        eta: None,
        progress: 0.0,
        paused: false,
        mode: Mode::Queue,
        stock: None,
        opens_at: None,
        ..full.clone()
    };
    let urls = QueueUrls {
        events: "/api/rooms/sale/events".into(),
        status: "/api/rooms/sale/status".into(),
        leave: "/api/rooms/sale/leave".into(),
        receipt: "/api/rooms/sale/receipt".into(),
        notify: Some("/api/rooms/sale/notify".into()),
    };
    let mut out = vec![
        (
            visit.clone(),
            Page::Queue(Box::new(QueuePage {
                status: full,
                lane: Some("members".into()),
                refresh_seconds: 20,
                urls: urls.clone(),
                pow: Some(PowForm {
                    token: "challenge".into(),
                    difficulty: 16,
                    join_url: "/api/rooms/sale/join".into(),
                    page_url: "/queue/sale?return=%2F".into(),
                    enqueue_token: Some("invitation".into()),
                }),
                draw: Some(DrawLink {
                    commitment: "0".repeat(64),
                    url: "/api/rooms/sale/draw".into(),
                }),
            })),
        ),
        (
            visit.clone(),
            Page::Queue(Box::new(QueuePage {
                status: empty,
                lane: None,
                refresh_seconds: 0,
                urls,
                pow: None,
                draw: None,
            })),
        ),
        (visit.clone(), Page::Admitted),
    ];
    for reason in [
        ClosedReason::Closed,
        ClosedReason::SoldOut,
        ClosedReason::Expired,
        ClosedReason::Left,
        ClosedReason::Reset,
    ] {
        out.push((
            visit.clone(),
            Page::Closed(ClosedPage {
                reason,
                rejoin_url: matches!(
                    reason,
                    ClosedReason::Expired | ClosedReason::Left | ClosedReason::Reset
                )
                .then(|| "/queue/sale?rejoin=1".into()),
            }),
        ));
    }
    for status in [StatusCode::NOT_FOUND, StatusCode::TOO_MANY_REQUESTS] {
        out.push((
            Visit {
                room: String::new(),
                ..visit.clone()
            },
            Page::Error(ErrorPage::for_status(status)),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_names_and_inline_code() {
        let text = "a\n{{ ticket.numbr }}\n{{ ticket.numbr2 }}";
        assert_eq!(find_line(text, "ticket.numbr"), Some(2));
        assert_eq!(find_line(text, "ticket.numbr2"), Some(3));
        assert_eq!(find_line(text, "nothing"), None);
        assert_eq!(
            inline_code("<p>\n<script>alert(1)</script>"),
            Some((2, "an inline <script>"))
        );
        assert_eq!(inline_code("<script src=\"/x.js\"></script>"), None);
        assert_eq!(
            inline_code("<p\n style=\"color:red\">"),
            Some((1, "a style attribute"))
        );
        assert_eq!(
            inline_code("x\n\n<STYLE>p{}</STYLE>"),
            Some((3, "an inline <style> element"))
        );
        assert_eq!(
            inline_code("<a href=\"/\" onclick = \"x()\">"),
            Some((1, "an event-handler attribute (on…=)"))
        );
        assert_eq!(
            inline_code("<a data-on=\"1\" class=\"only\">{{ x }} < 3 </a>"),
            None
        );
        assert_eq!(inline_code("<p>{{ t.queue_title }}</p>"), None);
    }
}
