//! Languages of the visitor pages.
//!
//! A waiting room is often the first thing a visitor sees of a sale, at its
//! most stressful moment, so it should speak their language without asking.
//! Narabu speaks English, Japanese and Simplified Chinese, and any language
//! an operator adds with a message file. The choice comes from `?lang=`
//! first (a visitor who picked a language meant it), then from the
//! browser's `Accept-Language`, and falls back to English for anything
//! unknown or malformed: a header can never make the page fail.
//!
//! Every user-visible sentence of the visitor pages lives in one [`Strings`]
//! table per language, a TOML message file each. The built-in ones
//! (`templates/pages/messages/en.toml`, `ja.toml`, `zh.toml`) are compiled
//! in and are the example to copy; an operator's (`messages/ko.toml` in a
//! template directory, or in `messages_dir`) are read when the pages are
//! loaded, at start or on an admin change, and checked then: every key
//! present, no unknown key, every `{placeholder}` kept, or the file is
//! refused with its line. A missing string is an error before the first
//! visitor, never a blank on the page. The phrases were written for each
//! language, not translated word by word.

use std::path::Path;
use std::sync::{Arc, LazyLock};

use serde::{Deserialize, Serialize};

use super::pages::PageError;
use super::pages::files;
use crate::engine::rules::{self, WaitUnit};

/// The built-in message files, compiled in.
pub(crate) const BUILTIN: [(&str, &str); 3] = [
    ("en", include_str!("../../templates/pages/messages/en.toml")),
    ("ja", include_str!("../../templates/pages/messages/ja.toml")),
    ("zh", include_str!("../../templates/pages/messages/zh.toml")),
];

/// The language every visitor gets when nothing better matches.
pub(crate) const DEFAULT: &str = "en";

/// The most language ranges of one `Accept-Language` header we look at, so
/// that a hostile header costs a bounded amount of work.
const MAX_LANGUAGE_RANGES: usize = 32;
/// Bounds on a message directory, as for template directories.
const MAX_FILES: usize = 100;
const MAX_FILE_BYTES: u64 = 256 * 1024;

/// One language the pages are written in.
#[derive(Debug)]
pub(crate) struct Language {
    /// The file's name without `.toml`: what `?lang=` names.
    code: String,
    pub strings: Strings,
}

/// A page's language, shared by every page that shows it.
pub(crate) type Lang = Arc<Language>;

impl Language {
    /// The short code used in `?lang=` and handed to scripts.
    pub(crate) fn code(&self) -> &str {
        &self.code
    }

    /// The value for `<html lang>`: the file's `html_lang`, else its code.
    /// Chinese says which script it is written in, because browsers pick
    /// Han glyph shapes (and fonts) from it.
    pub(crate) fn html_lang(&self) -> &str {
        if self.strings.html_lang.is_empty() {
            &self.code
        } else {
            &self.strings.html_lang
        }
    }

    /// The language's name in itself, for the language switcher.
    pub(crate) fn native_name(&self) -> &str {
        &self.strings.language_name
    }

    /// Every user-visible string of the visitor pages in this language.
    pub(crate) fn strings(&self) -> &Strings {
        &self.strings
    }
}

/// The languages one set of pages speaks: the built-in ones, replaced or
/// joined by an operator's message files.
#[derive(Debug)]
pub(crate) struct Languages {
    /// The built-in languages first, then the added ones by code; the
    /// language switcher lists them in this order.
    all: Vec<Lang>,
}

static BUILTIN_LANGUAGES: LazyLock<Arc<Languages>> = LazyLock::new(|| {
    let all = BUILTIN
        .iter()
        .map(|(code, text)| {
            let file = format!("built-in messages/{code}.toml");
            parse_language(code, text, &file).map(Arc::new)
        })
        .collect::<Result<Vec<_>, _>>()
        .expect("the built-in message files are valid");
    Arc::new(Languages { all })
});

impl Languages {
    /// English, Japanese and Chinese as compiled in.
    pub(crate) fn builtin() -> Arc<Languages> {
        BUILTIN_LANGUAGES.clone()
    }

    /// The built-in languages with the message files of `dirs` (`*.toml`,
    /// each named by its language tag); for the same language, a file in
    /// an earlier directory wins over a later one and over the built-in.
    pub(crate) fn load(dirs: &[&Path]) -> Result<Languages, PageError> {
        let mut all: Vec<Lang> = Languages::builtin().all.clone();
        let mut added: Vec<Lang> = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        for dir in dirs {
            for (code, file, text) in read_messages(dir)? {
                if seen.iter().any(|c| c.eq_ignore_ascii_case(&code)) {
                    continue;
                }
                let language = Arc::new(parse_language(&code, &text, &file)?);
                seen.push(code.clone());
                match all.iter_mut().find(|l| l.code.eq_ignore_ascii_case(&code)) {
                    Some(builtin) => *builtin = language,
                    None => added.push(language),
                }
            }
        }
        added.sort_by(|a, b| a.code.cmp(&b.code));
        all.extend(added);
        Ok(Languages { all })
    }

    /// Every language, in the order the language switcher lists them.
    pub(crate) fn all(&self) -> &[Lang] {
        &self.all
    }

    /// A language by its code (`ja`, `ko`, `pt-BR`), ignoring case.
    pub(crate) fn get(&self, code: &str) -> Option<&Lang> {
        self.all.iter().find(|l| l.code.eq_ignore_ascii_case(code))
    }

    /// English (the built-in, or an operator's `en.toml`).
    pub(crate) fn default_language(&self) -> &Lang {
        self.get(DEFAULT)
            .or_else(|| self.all.first())
            .expect("English is always there")
    }

    /// Picks the page language: a known `?lang=` wins, then the best-rated
    /// known language of `Accept-Language`, then English.
    pub(crate) fn negotiate(
        &self,
        query_lang: Option<&str>,
        accept_language: Option<&str>,
    ) -> Lang {
        query_lang
            .and_then(|q| self.for_tag(q))
            .or_else(|| accept_language.and_then(|h| self.for_accept_language(h)))
            .unwrap_or_else(|| self.default_language())
            .clone()
    }

    /// Reads a BCP 47 tag: the language of exactly that code, else of its
    /// primary subtag, else one whose primary subtag is the same. So `ja-JP`,
    /// `zh-Hans`, `zh-TW`, `EN-gb` all count, and `pt` finds `pt-BR`.
    fn for_tag(&self, tag: &str) -> Option<&Lang> {
        let tag = tag.trim();
        let primary = |t: &str| t.split(['-', '_']).next().unwrap_or_default().to_owned();
        let wanted = primary(tag);
        if wanted.is_empty() || !wanted.bytes().all(|b| b.is_ascii_alphabetic()) {
            return None;
        }
        self.get(&tag.replace('_', "-"))
            .or_else(|| self.get(&wanted))
            .or_else(|| {
                self.all
                    .iter()
                    .find(|l| primary(&l.code).eq_ignore_ascii_case(&wanted))
            })
    }

    /// The known language with the highest q-value; on a tie the one
    /// listed first, as RFC 9110 leaves ties to the server and browsers list
    /// their preference first. Ranges with a malformed q-value are skipped.
    fn for_accept_language(&self, header: &str) -> Option<&Lang> {
        let mut best: Option<(u16, &Lang)> = None;
        for range in header.split(',').take(MAX_LANGUAGE_RANGES) {
            let mut parts = range.split(';');
            let Some(lang) = parts.next().and_then(|t| self.for_tag(t)) else {
                continue;
            };
            let Ok(q) = parts.try_fold(1000, |q, param| parse_q(param).map(|p| p.unwrap_or(q)))
            else {
                continue;
            };
            if q > 0 && best.is_none_or(|(best_q, _)| q > best_q) {
                best = Some((q, lang));
            }
        }
        best.map(|(_, lang)| lang)
    }
}

/// Whether a file name (without `.toml`) can be a language code: a BCP 47
/// tag of letters, digits and hyphens, starting with a 2–3 letter language.
fn is_language_tag(code: &str) -> bool {
    let mut parts = code.split('-');
    let first = parts.next().unwrap_or_default();
    code.len() <= 35
        && (2..=3).contains(&first.len())
        && first.bytes().all(|b| b.is_ascii_alphabetic())
        && parts.all(|p| (1..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The `*.toml` files of a message directory, as (code, shown name, text).
/// Files are named relative to the template directory (`messages/ko.toml`)
/// or to `messages_dir` (`ko.toml`), never by the server's absolute path,
/// and read like templates: no symbolic links, regular files only, capped.
fn read_messages(dir: &Path) -> Result<Vec<(String, String, String)>, PageError> {
    let prefix = if dir.file_name().is_some_and(|n| n == "messages") {
        "messages/"
    } else {
        ""
    };
    let shown = if prefix.is_empty() { "." } else { "messages" };
    let entries = std::fs::read_dir(dir).map_err(|e| {
        PageError::new(
            shown,
            None,
            format!("cannot read the directory: {}", files::io_reason(&e)),
        )
    })?;
    // Bounded like a template directory: a wrong path is refused quickly.
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .take(4 * MAX_FILES)
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let file = format!("{prefix}{name}");
        let code = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        if !is_language_tag(&code) {
            return Err(PageError::new(
                file,
                None,
                "the file's name must be a language tag, such as ko.toml, fr.toml or pt-BR.toml",
            ));
        }
        if out.len() == MAX_FILES {
            return Err(PageError::new(
                shown,
                None,
                format!("holds more than {MAX_FILES} message files"),
            ));
        }
        let text = files::read_text(&path, &file, MAX_FILE_BYTES)?;
        out.push((code, file, text));
    }
    Ok(out)
}

/// Placeholders each message must keep, by its key (`table.key` for the
/// keys of a table), and messages that must have none.
const PLACEHOLDERS: [(&str, &[&str]); 17] = [
    ("eta_seconds.range", &["{low}", "{high}"]),
    ("eta_seconds.single", &["{n}"]),
    ("eta_minutes.range", &["{low}", "{high}"]),
    ("eta_minutes.single", &["{n}"]),
    ("eta_hours.range", &["{low}", "{high}"]),
    ("eta_hours.single", &["{n}"]),
    ("queue_length", &["{n}"]),
    ("progress_value", &["{percent}"]),
    ("position_announcement", &["{position}"]),
    ("position_eta_announcement", &["{position}", "{eta}"]),
    ("refresh_note", &["{n}"]),
    ("error_code", &["{code}"]),
    ("stock_left", &["{n}"]),
    ("fair.pow_progress", &["{percent}"]),
    ("eta_seconds.one", &[]),
    ("eta_minutes.one", &[]),
    ("eta_hours.one", &[]),
];

/// Reads and checks one message file; `file` names it in errors.
fn parse_language(code: &str, text: &str, file: &str) -> Result<Language, PageError> {
    let strings: Strings = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let message = e.message();
        // serde lists every expected key after an unknown one: too long to
        // read, and the built-in en.toml shows them all.
        let message = match message.split_once(", expected") {
            Some((head, _)) => format!("{head} (the built-in en.toml lists every key)"),
            None => message.to_owned(),
        };
        PageError::new(file, line, message)
    })?;
    let value: toml::Table = toml::from_str(text).unwrap_or_default();
    for (key, needed) in PLACEHOLDERS {
        let message = match key.split_once('.') {
            Some((table, name)) => value
                .get(table)
                .and_then(|t| t.get(name))
                .and_then(|v| v.as_str()),
            None => value.get(key).and_then(|v| v.as_str()),
        }
        .unwrap_or_default();
        let line = key_line(text, key);
        for placeholder in needed {
            if !message.contains(placeholder) {
                return Err(PageError::new(
                    file,
                    line,
                    format!("`{key}` must contain {placeholder}"),
                ));
            }
        }
        if needed.is_empty() && message.contains('{') {
            return Err(PageError::new(
                file,
                line,
                format!("`{key}` takes no placeholder"),
            ));
        }
    }
    if strings.language_name.trim().is_empty() {
        return Err(PageError::new(
            file,
            key_line(text, "language_name"),
            "`language_name` must name the language in itself (한국어, Français)",
        ));
    }
    Ok(Language {
        code: code.to_owned(),
        strings,
    })
}

/// The line of `key` (`table.key` for a key of a table) in a TOML file.
fn key_line(text: &str, key: &str) -> Option<usize> {
    let (table, name) = key.split_once('.').unwrap_or(("", key));
    let mut current = "";
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            current = header.trim_end_matches(']').trim();
            continue;
        }
        let at_key = line
            .strip_prefix(name)
            .is_some_and(|rest| rest.trim_start().starts_with('='));
        if current == table && at_key {
            return Some(i + 1);
        }
    }
    None
}

/// A `q=` parameter as thousandths, `Ok(None)` for any other parameter
/// (ignored), and an error for a malformed q-value, which spoils its range.
fn parse_q(param: &str) -> Result<Option<u16>, ()> {
    match param.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("q") => {
            parse_qvalue(value.trim()).map(Some).ok_or(())
        }
        _ => Ok(None),
    }
}

/// RFC 9110 `qvalue`: `0`, `0.xyz`, `1`, `1.000` with up to three decimals.
fn parse_qvalue(value: &str) -> Option<u16> {
    let (int, frac) = value.split_once('.').unwrap_or((value, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u16, |acc, b| acc * 10 + u16::from(b - b'0'));
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// One unit of an estimated wait, with the phrasing for a range, for a
/// single value, and for exactly one (English needs a singular).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EtaUnit {
    /// `{low}` and `{high}` are replaced, e.g. "about {low}–{high} minutes".
    pub range: String,
    /// `{n}` is replaced, e.g. "about {n} minutes".
    pub single: String,
    /// The phrase for exactly one of the unit, e.g. "about 1 minute".
    pub one: String,
}

/// Every user-visible string of the visitor pages, in one language.
///
/// Fields holding `{name}` placeholders are filled by the methods below on
/// the server, and by `static/queue.js` (which gets them through `data-*`
/// attributes) in the browser.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Strings {
    /// The language's name in itself, for the language switcher.
    pub language_name: String,
    /// The value for `<html lang>` when it is not the file's code (the
    /// built-in Chinese is `zh-Hans`).
    #[serde(default)]
    pub html_lang: String,
    /// Small heading above the page title, next to the room id.
    pub waiting_room: String,
    pub queue_title: String,
    pub queue_intro: String,
    pub ticket_number: String,
    /// Shown in place of the ticket number before a scheduled opening draws
    /// the order.
    pub ticket_number_pending: String,
    /// Beside the lane's name, in a room with priority lanes (the number
    /// and place count in that lane).
    #[serde(default)]
    pub lane: String,
    pub position: String,
    pub ahead: String,
    /// `{n}`: how many wait in the room in total.
    pub queue_length: String,
    pub eta: String,
    /// Shown while no estimate is known yet.
    pub eta_unknown: String,
    /// Shown when the estimate is zero.
    pub eta_now: String,
    pub eta_seconds: EtaUnit,
    pub eta_minutes: EtaUnit,
    pub eta_hours: EtaUnit,
    /// Placeholder for a number not known yet.
    pub unknown_value: String,
    pub progress: String,
    /// `{percent}`; read out by screen readers for the progress bar.
    pub progress_value: String,
    /// `{position}`; what screen readers announce when the place changes.
    pub position_announcement: String,
    /// `{position}` and `{eta}`.
    pub position_eta_announcement: String,
    pub last_updated: String,
    /// `{n}` seconds; tells visitors without JavaScript why the page reloads.
    pub refresh_note: String,
    pub not_open_title: String,
    /// Label before the opening time: "This sale opens at".
    pub opens_at: String,
    pub not_open_note: String,
    pub paused_title: String,
    pub paused_body: String,
    pub leave: String,
    pub leave_confirm: String,
    pub leave_note: String,
    /// The queue page's link to the visitor's signed receipt (empty: no
    /// link).
    #[serde(default)]
    pub receipt: String,
    pub admitted_title: String,
    pub admitted_body: String,
    pub continue_label: String,
    pub redirecting: String,
    pub closed_title: String,
    pub closed_body: String,
    /// The closed page when the room sold out.
    pub sold_out_title: String,
    pub sold_out_body: String,
    /// The queue page's notice in mode `maintenance`.
    pub maintenance_title: String,
    pub maintenance_body: String,
    /// `{n}`: the units a stock-aware room has left.
    pub stock_left: String,
    pub expired_title: String,
    pub expired_body: String,
    pub left_title: String,
    pub left_body: String,
    /// The line itself started again (its state was lost): every ticket
    /// of the old line is void.
    pub reset_title: String,
    pub reset_body: String,
    pub join_again: String,
    /// `{code}`; the small line above an error page's title.
    pub error_code: String,
    pub bad_request_title: String,
    pub bad_request_body: String,
    pub not_found_title: String,
    pub not_found_body: String,
    pub too_many_requests_title: String,
    pub too_many_requests_body: String,
    pub server_error_title: String,
    pub server_error_body: String,
    pub unavailable_title: String,
    pub unavailable_body: String,
    /// Accessible name of the language switcher.
    pub language: String,
    pub fair: FairStrings,
    /// Being called back: the queue page's control and the notifications'
    /// texts. A message file without this table speaks English here.
    #[serde(default)]
    pub push: Option<PushStrings>,
}

/// Phrases of Web Push call-backs.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PushStrings {
    pub notify_me: String,
    pub notify_stop: String,
    pub notify_on: String,
    pub notify_off: String,
    pub notify_blocked: String,
    pub notify_unsupported: String,
    pub ahead_title: String,
    /// `{n}`: how many people are ahead.
    pub ahead_body: String,
    pub turn_title: String,
    /// `{minutes}`: how long their place is kept for them.
    pub turn_body: String,
}

impl Languages {
    /// The call-back phrases of `lang` (a code as a visitor's page had
    /// it), else English's.
    pub(crate) fn push_strings(&self, lang: &str) -> &PushStrings {
        self.get(lang)
            .and_then(|l| l.strings.push.as_ref())
            .or(self.default_language().strings.push.as_ref())
            .unwrap_or_else(|| {
                BUILTIN_LANGUAGES.all[0]
                    .strings
                    .push
                    .as_ref()
                    .expect("the built-in English has push phrases")
            })
    }
}

/// Phrases of fair access: the browser's proof of work, invitations, and
/// the opening draw's commitment.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FairStrings {
    pub pow_title: String,
    pub pow_body: String,
    /// `{percent}`: how far the puzzle probably is.
    pub pow_progress: String,
    pub pow_noscript: String,
    pub pow_failed: String,
    pub invite_title: String,
    pub invite_body: String,
    pub invite_invalid_body: String,
    /// Label of the draw's commitment (a SHA-256 in hex).
    pub draw_commitment: String,
    /// The link to the draw's public record.
    pub draw_check: String,
}

impl Strings {
    /// Phrases an estimated wait between `low_secs` and `high_secs` as a
    /// range in one unit, rounded as `rules::wait_shown` says (the rule the
    /// streams' cadence counts steps of).
    pub(crate) fn format_eta(&self, low_secs: u64, high_secs: u64) -> String {
        let shown = rules::wait_shown(low_secs, high_secs);
        if shown.high == 0 {
            return self.eta_now.to_owned();
        }
        let unit = match shown.unit {
            WaitUnit::Seconds => &self.eta_seconds,
            WaitUnit::Minutes => &self.eta_minutes,
            WaitUnit::Hours => &self.eta_hours,
        };
        let (low, high) = (shown.low, shown.high);
        if low == high {
            if low == 1 {
                unit.one.to_owned()
            } else {
                unit.single.replace("{n}", &group_digits(low))
            }
        } else {
            unit.range
                .replace("{low}", &group_digits(low))
                .replace("{high}", &group_digits(high))
        }
    }

    /// [`Strings::format_eta`] for an estimate that may not be known yet.
    pub(crate) fn format_eta_opt(&self, low_secs: Option<u64>, high_secs: Option<u64>) -> String {
        match (low_secs, high_secs) {
            (Some(low), Some(high)) => self.format_eta(low, high),
            (Some(one), None) | (None, Some(one)) => self.format_eta(one, one),
            (None, None) => self.eta_unknown.to_owned(),
        }
    }

    /// A count as shown on the page, or the placeholder when unknown.
    pub(crate) fn count(&self, n: Option<u64>) -> String {
        n.map_or_else(|| self.unknown_value.to_owned(), group_digits)
    }

    pub(crate) fn format_progress(&self, percent: u8) -> String {
        self.progress_value
            .replace("{percent}", &percent.min(100).to_string())
    }

    pub(crate) fn format_queue_length(&self, n: u64) -> String {
        self.queue_length.replace("{n}", &group_digits(n))
    }

    pub(crate) fn format_refresh_note(&self, seconds: u32) -> String {
        self.refresh_note.replace("{n}", &seconds.to_string())
    }

    pub(crate) fn format_stock_left(&self, n: u64) -> String {
        self.stock_left.replace("{n}", &group_digits(n))
    }

    pub(crate) fn format_error_code(&self, code: u16) -> String {
        self.error_code.replace("{code}", &code.to_string())
    }

    /// The sentence screen readers announce for the visitor's place.
    pub(crate) fn format_announcement(&self, position: Option<u64>, eta: Option<&str>) -> String {
        let Some(position) = position else {
            return String::new();
        };
        let template = match eta {
            Some(_) => &self.position_eta_announcement,
            None => &self.position_announcement,
        };
        template
            .replace("{position}", &group_digits(position))
            .replace("{eta}", eta.unwrap_or_default())
    }
}

/// Groups digits in threes with commas, as English, Japanese and Chinese
/// all write large counts: 200,000.
pub(crate) fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn langs() -> &'static Languages {
        &BUILTIN_LANGUAGES
    }

    fn lang(code: &str) -> &'static Language {
        langs().get(code).expect("a built-in language")
    }

    fn negotiate(query: Option<&str>, header: Option<&str>) -> String {
        langs().negotiate(query, header).code().to_owned()
    }

    #[test]
    fn negotiation_table() {
        let cases: &[(Option<&str>, Option<&str>, &str)] = &[
            (None, None, "en"),
            (Some("ja"), None, "ja"),
            (Some("zh"), Some("ja"), "zh"),
            (Some("EN"), Some("ja"), "en"),
            (Some("fr"), Some("ja"), "ja"),
            (Some(""), Some("zh-CN"), "zh"),
            (None, Some("ja"), "ja"),
            (None, Some("ja-JP"), "ja"),
            (None, Some("ja-JP,ja;q=0.9,en;q=0.8"), "ja"),
            (None, Some("zh"), "zh"),
            (None, Some("zh-CN"), "zh"),
            (None, Some("zh-Hans"), "zh"),
            (None, Some("zh-Hans-CN"), "zh"),
            (None, Some("zh-TW"), "zh"),
            (None, Some("zh_TW"), "zh"),
            (None, Some("en-US,en;q=0.9"), "en"),
            (None, Some("fr-FR,fr;q=0.9,ja;q=0.8"), "ja"),
            (None, Some("en;q=0.5, ja;q=0.8, zh;q=0.7"), "ja"),
            (None, Some("ja;q=0.5,zh;q=0.5"), "ja"),
            (None, Some("ja;q=0, zh;q=0.1"), "zh"),
            (None, Some("ja;q=0"), "en"),
            (None, Some("*"), "en"),
            (None, Some("de, *;q=0.1"), "en"),
            (None, Some("ja;q=1.0"), "ja"),
            (None, Some("JA-jp ; Q=0.9 , en;q=0.1"), "ja"),
            (None, Some("ja;level=1;q=0.4,en;q=0.3"), "ja"),
        ];
        for &(query, header, want) in cases {
            assert_eq!(
                negotiate(query, header),
                want,
                "query {query:?}, header {header:?}"
            );
        }
    }

    #[test]
    fn malformed_headers_fall_back_without_panicking() {
        let cases = [
            "",
            ",,,",
            ";;;",
            ";q=1",
            "ja;q=",
            "ja;q=2",
            "ja;q=1.5",
            "ja;q=0.1234",
            "ja;q=-1",
            "ja;q=abc",
            "ja;q=0.５",
            "日本語",
            "-",
            "\u{0}",
            "ja;q=0.\u{1F600}",
        ];
        for header in cases {
            assert_eq!(negotiate(None, Some(header)), "en", "{header:?}");
        }
        let long = "xx,".repeat(10_000) + "ja";
        assert_eq!(negotiate(None, Some(&long)), "en");
        // Parameters other than q are ignored; a malformed q-value spoils
        // only its own range.
        assert_eq!(negotiate(None, Some("ja;=;x=y")), "ja");
        assert_eq!(negotiate(None, Some("en;q=x, ja;q=0.2")), "ja");
    }

    #[test]
    fn codes_and_strings_line_up() {
        for lang in langs().all() {
            assert_eq!(negotiate(Some(lang.code()), None), lang.code());
            assert_eq!(negotiate(Some(lang.html_lang()), None), lang.code());
        }
        let names: Vec<&str> = langs().all().iter().map(|l| l.native_name()).collect();
        assert_eq!(names, ["English", "日本語", "简体中文"]);
        assert_eq!(lang("zh").html_lang(), "zh-Hans");
        assert_eq!(lang("ja").strings().ticket_number, "あなたの整理番号");
        assert_eq!(lang("zh").strings().admitted_title, "轮到您了");
    }

    #[test]
    fn eta_in_english() {
        let t = lang("en").strings();
        assert_eq!(t.format_eta(0, 0), "Any moment now");
        assert_eq!(t.format_eta(1, 1), "about 1 second");
        assert_eq!(t.format_eta(20, 45), "about 20–45 seconds");
        assert_eq!(t.format_eta(45, 20), "about 20–45 seconds");
        assert_eq!(t.format_eta(0, 30), "about 1–30 seconds");
        assert_eq!(t.format_eta(30, 30), "about 30 seconds");
        assert_eq!(t.format_eta(20, 59), "about 20–59 seconds");
        assert_eq!(t.format_eta(20, 60), "about 1 minute");
        assert_eq!(t.format_eta(20, 61), "about 1–2 minutes");
        assert_eq!(t.format_eta(90, 150), "about 2–3 minutes");
        assert_eq!(t.format_eta(300, 300), "about 5 minutes");
        assert_eq!(t.format_eta(1800, 5400), "about 30–90 minutes");
        assert_eq!(t.format_eta(3600, 5401), "about 1–2 hours");
        assert_eq!(t.format_eta(7200, 7200), "about 2 hours");
        assert_eq!(t.format_eta(600, 7200), "about 1–2 hours");
        assert_eq!(
            t.format_eta(3_600_000, 7_200_000),
            "about 1,000–2,000 hours"
        );
        assert_eq!(
            t.format_eta(u64::MAX - 15, u64::MAX),
            "about 5,124,095,576,030,431–5,124,095,576,030,432 hours"
        );
        assert_eq!(t.format_eta_opt(None, None), "Estimating…");
        assert_eq!(t.format_eta_opt(Some(120), None), "about 2 minutes");
    }

    #[test]
    fn eta_in_japanese() {
        let t = lang("ja").strings();
        assert_eq!(t.format_eta(0, 0), "まもなく");
        assert_eq!(t.format_eta(20, 45), "約20〜45秒");
        assert_eq!(t.format_eta(30, 30), "約30秒");
        assert_eq!(t.format_eta(60, 60), "約1分");
        assert_eq!(t.format_eta(90, 150), "約2〜3分");
        assert_eq!(t.format_eta(3600, 7200), "約1〜2時間");
        assert_eq!(t.format_eta(36_000, 36_000), "約10時間");
        assert_eq!(t.format_eta_opt(None, None), "計算中…");
    }

    #[test]
    fn eta_in_chinese() {
        let t = lang("zh").strings();
        assert_eq!(t.format_eta(0, 0), "马上就轮到您");
        assert_eq!(t.format_eta(20, 45), "约20–45秒");
        assert_eq!(t.format_eta(1, 1), "约1秒");
        assert_eq!(t.format_eta(120, 120), "约2分钟");
        assert_eq!(t.format_eta(90, 150), "约2–3分钟");
        assert_eq!(t.format_eta(3600, 3600), "约60分钟");
        assert_eq!(t.format_eta(3600, 7200), "约1–2小时");
        assert_eq!(t.format_eta_opt(None, None), "正在估算…");
    }

    #[test]
    fn counts_and_sentences() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(200_000), "200,000");
        assert_eq!(group_digits(u64::MAX), "18,446,744,073,709,551,615");
        let t = lang("en").strings();
        assert_eq!(t.count(None), "—");
        assert_eq!(t.count(Some(1234)), "1,234");
        assert_eq!(t.format_progress(200), "100% of the way to the front");
        assert_eq!(t.format_queue_length(200_000), "Total in line: 200,000");
        assert_eq!(
            lang("ja").strings().format_queue_length(1500),
            "待っている人数：1,500人"
        );
        assert_eq!(
            t.format_announcement(Some(5), Some("about 1 minute")),
            "You are number 5 in line. Estimated wait: about 1 minute."
        );
        assert_eq!(t.format_announcement(None, Some("x")), "");
        let ja = lang("ja").strings();
        assert_eq!(
            ja.format_announcement(Some(5), Some("約1分")),
            "現在5番目です。予想待ち時間は約1分です。"
        );
    }

    #[test]
    fn the_built_in_message_files_parse_and_keep_their_placeholders() {
        for (code, text) in BUILTIN {
            let language = parse_language(code, text, code).expect("valid");
            assert_eq!(language.code(), code);
        }
        assert_eq!(langs().all().len(), 3);
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    /// The built-in English file with some lines changed.
    fn english_with(changes: &[(&str, &str)]) -> String {
        let mut text = BUILTIN[0].1.to_owned();
        for (from, to) in changes {
            assert!(text.contains(from), "{from}");
            text = text.replacen(from, to, 1);
        }
        text
    }

    #[test]
    fn an_operator_s_message_file_adds_a_language() {
        let dir = tempfile::tempdir().unwrap();
        let korean = english_with(&[
            ("language_name = \"English\"", "language_name = \"한국어\""),
            ("html_lang = \"en\"", "html_lang = \"ko\""),
            (
                "queue_title = \"You're in line\"",
                "queue_title = \"대기열에 있습니다\"",
            ),
        ]);
        write(dir.path(), "ko.toml", &korean);
        write(
            dir.path(),
            "fr.toml",
            &english_with(&[(
                "language_name = \"English\"",
                "language_name = \"Français\"",
            )]),
        );
        write(dir.path(), "README.txt", "not a message file");
        let languages = Languages::load(&[dir.path()]).expect("valid files");
        let codes: Vec<&str> = languages.all().iter().map(|l| l.code()).collect();
        assert_eq!(codes, ["en", "ja", "zh", "fr", "ko"]);
        let ko = languages.negotiate(None, Some("ko-KR,ko;q=0.9,en;q=0.5"));
        assert_eq!(ko.code(), "ko");
        assert_eq!(ko.strings().queue_title, "대기열에 있습니다");
        assert_eq!(languages.negotiate(Some("fr"), Some("ko")).code(), "fr");
        assert_eq!(languages.negotiate(None, Some("fr-CA")).code(), "fr");
        assert_eq!(languages.negotiate(None, Some("de")).code(), "en");
        // Without the files, Korean is not offered.
        assert_eq!(negotiate(None, Some("ko")), "en");
    }

    #[test]
    fn an_operator_s_file_replaces_a_built_in_language_and_earlier_dirs_win() {
        let room = tempfile::tempdir().unwrap();
        let instance = tempfile::tempdir().unwrap();
        write(
            room.path(),
            "ja.toml",
            &BUILTIN[1]
                .1
                .replacen("順番をお待ちください", "ルームの言葉", 1),
        );
        write(
            instance.path(),
            "ja.toml",
            &BUILTIN[1]
                .1
                .replacen("順番をお待ちください", "インスタンスの言葉", 1),
        );
        let languages = Languages::load(&[room.path(), instance.path()]).unwrap();
        assert_eq!(languages.all().len(), 3);
        assert_eq!(
            languages.get("ja").unwrap().strings().queue_title,
            "ルームの言葉"
        );
    }

    #[test]
    fn a_bad_message_file_is_refused_with_file_and_line() {
        let cases: [(&str, String, Option<usize>, &str); 6] = [
            (
                "ko.toml",
                english_with(&[("queue_title = ", "queue_titel = ")]),
                Some(13),
                "unknown field `queue_titel`",
            ),
            (
                "ko.toml",
                english_with(&[("queue_title = \"You're in line\"\n", "")]),
                None,
                "missing field `queue_title`",
            ),
            (
                "ko.toml",
                english_with(&[(
                    "queue_length = \"Total in line: {n}\"",
                    "queue_length = \"Total in line\"",
                )]),
                Some(20),
                "`queue_length` must contain {n}",
            ),
            (
                "ko.toml",
                english_with(&[(
                    "range = \"about {low}–{high} minutes\"",
                    "range = \"about {low} minutes\"",
                )]),
                None,
                "`eta_minutes.range` must contain {high}",
            ),
            (
                "ko.toml",
                english_with(&[(
                    "waiting_room = \"Waiting room\"",
                    "waiting_room = \"Waiting room",
                )]),
                Some(12),
                "",
            ),
            (
                "korean.toml",
                BUILTIN[0].1.to_owned(),
                None,
                "must be a language tag",
            ),
        ];
        for (name, text, line, words) in cases {
            let dir = tempfile::tempdir().unwrap();
            write(dir.path(), name, &text);
            let e = Languages::load(&[dir.path()]).expect_err(words);
            assert_eq!(e.file, name, "{e}");
            if line.is_some() {
                assert_eq!(e.line, line, "{e}");
            }
            assert!(e.reason.contains(words), "{e}");
            assert!(e.reason.len() < 200, "short enough to read: {e}");
        }
        let e = Languages::load(&[Path::new("/nonexistent-narabu-messages")]).unwrap_err();
        assert!(e.reason.contains("cannot read the directory"), "{e}");
    }
}
