//! Languages of the visitor pages.
//!
//! A waiting room is often the first thing a visitor sees of a sale, at its
//! most stressful moment, so it should speak their language without asking.
//! Narabu speaks English, Japanese and Simplified Chinese. The choice comes
//! from `?lang=` first (a visitor who picked a language meant it), then from
//! the browser's `Accept-Language`, and falls back to English for anything
//! unknown or malformed: a header can never make the page fail.
//!
//! Every user-visible sentence of the visitor pages lives in one [`Strings`]
//! table per language, a file each (`i18n/en.rs`, `ja.rs`, `zh.rs`), so a
//! translation is reviewed in one place and a missing string is a compile
//! error rather than a blank on the page. The phrases were written for each
//! language, not translated word by word.

mod en;
mod ja;
mod zh;

/// A language the visitor pages are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Lang {
    #[default]
    En,
    Ja,
    /// Simplified Chinese; visitors asking for Traditional Chinese get it too,
    /// which they read more easily than English.
    Zh,
}

/// The most language ranges of one `Accept-Language` header we look at, so
/// that a hostile header costs a bounded amount of work.
const MAX_LANGUAGE_RANGES: usize = 32;

impl Lang {
    /// Every language, in the order the language switcher lists them.
    pub const ALL: [Lang; 3] = [Lang::En, Lang::Ja, Lang::Zh];

    /// Picks the page language: a known `?lang=` wins, then the best-rated
    /// supported language of `Accept-Language`, then English.
    pub fn negotiate(query_lang: Option<&str>, accept_language: Option<&str>) -> Lang {
        query_lang
            .and_then(Lang::from_tag)
            .or_else(|| accept_language.and_then(Lang::from_accept_language))
            .unwrap_or_default()
    }

    /// The short code used in `?lang=` and handed to scripts.
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Ja => "ja",
            Lang::Zh => "zh",
        }
    }

    /// The value for `<html lang>`. Chinese says which script it is written
    /// in, because browsers pick Han glyph shapes (and fonts) from it.
    pub fn html_lang(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Ja => "ja",
            Lang::Zh => "zh-Hans",
        }
    }

    /// The language's name in itself, for the language switcher.
    pub fn native_name(self) -> &'static str {
        match self {
            Lang::En => "English",
            Lang::Ja => "日本語",
            Lang::Zh => "简体中文",
        }
    }

    /// Every user-visible string of the visitor pages in this language.
    pub fn strings(self) -> &'static Strings {
        match self {
            Lang::En => &en::EN,
            Lang::Ja => &ja::JA,
            Lang::Zh => &zh::ZH,
        }
    }

    /// Reads a BCP 47 tag by its primary subtag, so `ja-JP`, `zh-Hans`,
    /// `zh-TW` and `EN-gb` all count.
    fn from_tag(tag: &str) -> Option<Lang> {
        let primary = tag.trim().split(['-', '_']).next()?;
        if primary.eq_ignore_ascii_case("en") {
            Some(Lang::En)
        } else if primary.eq_ignore_ascii_case("ja") {
            Some(Lang::Ja)
        } else if primary.eq_ignore_ascii_case("zh") {
            Some(Lang::Zh)
        } else {
            None
        }
    }

    /// The supported language with the highest q-value; on a tie the one
    /// listed first, as RFC 9110 leaves ties to the server and browsers list
    /// their preference first. Ranges with a malformed q-value are skipped.
    fn from_accept_language(header: &str) -> Option<Lang> {
        let mut best: Option<(u16, Lang)> = None;
        for range in header.split(',').take(MAX_LANGUAGE_RANGES) {
            let mut parts = range.split(';');
            let Some(lang) = parts.next().and_then(Lang::from_tag) else {
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
#[derive(Debug)]
pub struct EtaUnit {
    /// `{low}` and `{high}` are replaced, e.g. "about {low}–{high} minutes".
    pub range: &'static str,
    /// `{n}` is replaced, e.g. "about {n} minutes".
    pub single: &'static str,
    /// The phrase for exactly one of the unit, e.g. "about 1 minute".
    pub one: &'static str,
}

/// Every user-visible string of the visitor pages, in one language.
///
/// Fields holding `{name}` placeholders are filled by the methods below on
/// the server, and by `static/queue.js` (which gets them through `data-*`
/// attributes) in the browser.
#[derive(Debug)]
pub struct Strings {
    /// Small heading above the page title, next to the room id.
    pub waiting_room: &'static str,
    pub queue_title: &'static str,
    pub queue_intro: &'static str,
    pub ticket_number: &'static str,
    /// Shown in place of the ticket number before a scheduled opening draws
    /// the order.
    pub ticket_number_pending: &'static str,
    pub position: &'static str,
    pub ahead: &'static str,
    /// `{n}`: how many wait in the room in total.
    pub queue_length: &'static str,
    pub eta: &'static str,
    /// Shown while no estimate is known yet.
    pub eta_unknown: &'static str,
    /// Shown when the estimate is zero.
    pub eta_now: &'static str,
    pub eta_seconds: EtaUnit,
    pub eta_minutes: EtaUnit,
    pub eta_hours: EtaUnit,
    /// Placeholder for a number not known yet.
    pub unknown_value: &'static str,
    pub progress: &'static str,
    /// `{percent}`; read out by screen readers for the progress bar.
    pub progress_value: &'static str,
    /// `{position}`; what screen readers announce when the place changes.
    pub position_announcement: &'static str,
    /// `{position}` and `{eta}`.
    pub position_eta_announcement: &'static str,
    pub last_updated: &'static str,
    /// `{n}` seconds; tells visitors without JavaScript why the page reloads.
    pub refresh_note: &'static str,
    pub not_open_title: &'static str,
    /// Label before the opening time: "This sale opens at".
    pub opens_at: &'static str,
    pub not_open_note: &'static str,
    pub paused_title: &'static str,
    pub paused_body: &'static str,
    pub leave: &'static str,
    pub leave_confirm: &'static str,
    pub leave_note: &'static str,
    pub admitted_title: &'static str,
    pub admitted_body: &'static str,
    pub continue_label: &'static str,
    pub redirecting: &'static str,
    pub closed_title: &'static str,
    pub closed_body: &'static str,
    /// The closed page when the room sold out.
    pub sold_out_title: &'static str,
    pub sold_out_body: &'static str,
    /// The queue page's notice in mode `maintenance`.
    pub maintenance_title: &'static str,
    pub maintenance_body: &'static str,
    /// `{n}`: the units a stock-aware room has left.
    pub stock_left: &'static str,
    pub expired_title: &'static str,
    pub expired_body: &'static str,
    pub left_title: &'static str,
    pub left_body: &'static str,
    /// The line itself started again (its state was lost): every ticket
    /// of the old line is void.
    pub reset_title: &'static str,
    pub reset_body: &'static str,
    pub join_again: &'static str,
    /// `{code}`; the small line above an error page's title.
    pub error_code: &'static str,
    pub bad_request_title: &'static str,
    pub bad_request_body: &'static str,
    pub not_found_title: &'static str,
    pub not_found_body: &'static str,
    pub too_many_requests_title: &'static str,
    pub too_many_requests_body: &'static str,
    pub server_error_title: &'static str,
    pub server_error_body: &'static str,
    pub unavailable_title: &'static str,
    pub unavailable_body: &'static str,
    /// Accessible name of the language switcher.
    pub language: &'static str,
    pub fair: FairStrings,
}

/// Phrases of fair access: the browser's proof of work, invitations, and
/// the opening draw's commitment.
#[derive(Debug)]
pub struct FairStrings {
    pub pow_title: &'static str,
    pub pow_body: &'static str,
    /// `{percent}`: how far the puzzle probably is.
    pub pow_progress: &'static str,
    pub pow_noscript: &'static str,
    pub pow_failed: &'static str,
    pub invite_title: &'static str,
    pub invite_body: &'static str,
    pub invite_invalid_body: &'static str,
    /// Label of the draw's commitment (a SHA-256 in hex).
    pub draw_commitment: &'static str,
    /// The link to the draw's public record.
    pub draw_check: &'static str,
}

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
/// Waits up to this long read better in minutes ("about 60–80 minutes")
/// than in hours ("about 1–2 hours").
const MINUTES_UP_TO: u64 = 90 * MINUTE;

impl Strings {
    /// Phrases an estimated wait between `low_secs` and `high_secs` as a
    /// range in one unit: seconds under a minute, minutes up to an hour and
    /// a half, hours beyond. The low end rounds to nearest and the high end
    /// rounds up, and neither shows as zero, so the range never promises less
    /// than the estimate.
    pub fn format_eta(&self, low_secs: u64, high_secs: u64) -> String {
        let (low, high) = (low_secs.min(high_secs), low_secs.max(high_secs));
        if high == 0 {
            return self.eta_now.to_owned();
        }
        let (unit, size) = if high < MINUTE {
            (&self.eta_seconds, 1)
        } else if high <= MINUTES_UP_TO {
            (&self.eta_minutes, MINUTE)
        } else {
            (&self.eta_hours, HOUR)
        };
        let low = (low / size + u64::from(low % size >= size.div_ceil(2))).max(1);
        let high = (high / size + u64::from(high % size != 0)).max(low);
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
    pub fn format_eta_opt(&self, low_secs: Option<u64>, high_secs: Option<u64>) -> String {
        match (low_secs, high_secs) {
            (Some(low), Some(high)) => self.format_eta(low, high),
            (Some(one), None) | (None, Some(one)) => self.format_eta(one, one),
            (None, None) => self.eta_unknown.to_owned(),
        }
    }

    /// A count as shown on the page, or the placeholder when unknown.
    pub fn count(&self, n: Option<u64>) -> String {
        n.map_or_else(|| self.unknown_value.to_owned(), group_digits)
    }

    pub fn format_progress(&self, percent: u8) -> String {
        self.progress_value
            .replace("{percent}", &percent.min(100).to_string())
    }

    pub fn format_queue_length(&self, n: u64) -> String {
        self.queue_length.replace("{n}", &group_digits(n))
    }

    pub fn format_refresh_note(&self, seconds: u32) -> String {
        self.refresh_note.replace("{n}", &seconds.to_string())
    }

    pub fn format_error_code(&self, code: u16) -> String {
        self.error_code.replace("{code}", &code.to_string())
    }

    /// The sentence screen readers announce for the visitor's place.
    pub fn format_announcement(&self, position: Option<u64>, eta: Option<&str>) -> String {
        let Some(position) = position else {
            return String::new();
        };
        let template = match eta {
            Some(_) => self.position_eta_announcement,
            None => self.position_announcement,
        };
        template
            .replace("{position}", &group_digits(position))
            .replace("{eta}", eta.unwrap_or_default())
    }
}

/// Groups digits in threes with commas, as English, Japanese and Chinese
/// all write large counts: 200,000.
pub fn group_digits(n: u64) -> String {
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

    #[test]
    fn negotiation_table() {
        let cases: &[(Option<&str>, Option<&str>, Lang)] = &[
            (None, None, Lang::En),
            (Some("ja"), None, Lang::Ja),
            (Some("zh"), Some("ja"), Lang::Zh),
            (Some("EN"), Some("ja"), Lang::En),
            (Some("fr"), Some("ja"), Lang::Ja),
            (Some(""), Some("zh-CN"), Lang::Zh),
            (None, Some("ja"), Lang::Ja),
            (None, Some("ja-JP"), Lang::Ja),
            (None, Some("ja-JP,ja;q=0.9,en;q=0.8"), Lang::Ja),
            (None, Some("zh"), Lang::Zh),
            (None, Some("zh-CN"), Lang::Zh),
            (None, Some("zh-Hans"), Lang::Zh),
            (None, Some("zh-Hans-CN"), Lang::Zh),
            (None, Some("zh-TW"), Lang::Zh),
            (None, Some("zh_TW"), Lang::Zh),
            (None, Some("en-US,en;q=0.9"), Lang::En),
            (None, Some("fr-FR,fr;q=0.9,ja;q=0.8"), Lang::Ja),
            (None, Some("en;q=0.5, ja;q=0.8, zh;q=0.7"), Lang::Ja),
            (None, Some("ja;q=0.5,zh;q=0.5"), Lang::Ja),
            (None, Some("ja;q=0, zh;q=0.1"), Lang::Zh),
            (None, Some("ja;q=0"), Lang::En),
            (None, Some("*"), Lang::En),
            (None, Some("de, *;q=0.1"), Lang::En),
            (None, Some("ja;q=1.0"), Lang::Ja),
            (None, Some("JA-jp ; Q=0.9 , en;q=0.1"), Lang::Ja),
            (None, Some("ja;level=1;q=0.4,en;q=0.3"), Lang::Ja),
        ];
        for &(query, header, want) in cases {
            assert_eq!(
                Lang::negotiate(query, header),
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
            assert_eq!(Lang::negotiate(None, Some(header)), Lang::En, "{header:?}");
        }
        let long = "xx,".repeat(10_000) + "ja";
        assert_eq!(Lang::negotiate(None, Some(&long)), Lang::En);
        // Parameters other than q are ignored; a malformed q-value spoils
        // only its own range.
        assert_eq!(Lang::negotiate(None, Some("ja;=;x=y")), Lang::Ja);
        assert_eq!(Lang::negotiate(None, Some("en;q=x, ja;q=0.2")), Lang::Ja);
    }

    #[test]
    fn codes_and_strings_line_up() {
        for lang in Lang::ALL {
            assert_eq!(Lang::negotiate(Some(lang.code()), None), lang);
            assert_eq!(Lang::negotiate(Some(lang.html_lang()), None), lang);
        }
        assert_eq!(Lang::Ja.strings().ticket_number, "あなたの整理番号");
        assert_eq!(Lang::Zh.strings().admitted_title, "轮到您了");
    }

    #[test]
    fn eta_in_english() {
        let t = Lang::En.strings();
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
        let t = Lang::Ja.strings();
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
        let t = Lang::Zh.strings();
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
        let t = Lang::En.strings();
        assert_eq!(t.count(None), "—");
        assert_eq!(t.count(Some(1234)), "1,234");
        assert_eq!(t.format_progress(200), "100% of the way to the front");
        assert_eq!(t.format_queue_length(200_000), "Total in line: 200,000");
        assert_eq!(
            Lang::Ja.strings().format_queue_length(1500),
            "待っている人数：1,500人"
        );
        assert_eq!(
            t.format_announcement(Some(5), Some("about 1 minute")),
            "You are number 5 in line. Estimated wait: about 1 minute."
        );
        assert_eq!(t.format_announcement(None, Some("x")), "");
        let ja = Lang::Ja.strings();
        assert_eq!(
            ja.format_announcement(Some(5), Some("約1分")),
            "現在5番目です。予想待ち時間は約1分です。"
        );
    }

    #[test]
    fn every_template_keeps_its_placeholders() {
        for lang in Lang::ALL {
            let t = lang.strings();
            for unit in [&t.eta_seconds, &t.eta_minutes, &t.eta_hours] {
                assert!(unit.range.contains("{low}") && unit.range.contains("{high}"));
                assert!(unit.single.contains("{n}"));
                assert!(!unit.one.contains('{'));
            }
            assert!(t.progress_value.contains("{percent}"));
            assert!(t.position_announcement.contains("{position}"));
            assert!(t.position_eta_announcement.contains("{eta}"));
            assert!(t.refresh_note.contains("{n}"));
            assert!(t.queue_length.contains("{n}"));
            assert!(t.error_code.contains("{code}"));
        }
    }
}
