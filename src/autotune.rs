//! Autotune: a room's admission rate set from its origin's health.
//!
//! A room's `autotune` section (off unless given) names the bounds the
//! rate may move in, the targets (a latency quantile, an error ratio) and
//! where the signal comes from: a probe of an origin URL that Narabu times
//! itself (`signal::Probe`), and/or a latency histogram read from the
//! origin's Prometheus `/metrics` (`signal::Scrape`). The section is the
//! same in the config file, in the admin API's `PUT` and `PATCH`, and as
//! the backends store it with the room ([`Autotune`]), checked once by
//! [`Autotune::validate`] wherever it comes from.
//!
//! The rule that turns a signal into the next rate is the engine's
//! (`engine::rules::autotune`); the task that measures, decides and
//! applies is [`tuner`]. It changes the room through the backend exactly
//! as an operator's `PATCH` does, on the one instance that decides for the
//! room (`Backend::decides`), and tells of every change in the log, in
//! `/metrics` and as a `room.autotuned` webhook.

pub(crate) mod signal;
pub(crate) mod tuner;

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{CAPACITY_MAX, CAPACITY_MIN};
use crate::engine::rules::Controller;
use crate::secret::RedactedUrl;

/// A room's autotune section. Every key but the bounds and a source has a
/// documented default. Ratios are plain numbers (`0.02` for 2 %). Every
/// key is written out, `null`s included: postcard, which the backends
/// store it with, has no missing keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Autotune {
    /// Off keeps the section but leaves the rate where it is.
    #[serde(default = "yes")]
    pub(crate) enabled: bool,
    /// The lowest admission rate (a minute) the tuner may set.
    #[schema(minimum = 1, example = 60)]
    pub(crate) min_rate: u32,
    /// The highest admission rate (a minute) the tuner may set.
    #[schema(minimum = 1, example = 6000)]
    pub(crate) max_rate: u32,
    /// With `max_capacity`: the capacity moves with the rate, between them.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub(crate) min_capacity: Option<u32>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub(crate) max_capacity: Option<u32>,
    /// The latency the origin's `quantile` should stay under.
    #[serde(default = "default_target", with = "duration")]
    #[schema(value_type = String, example = "800ms")]
    pub(crate) target_latency: Duration,
    /// Which latency quantile is held to the target (0.5 to 0.999).
    #[serde(default = "default_quantile")]
    #[schema(example = 0.95)]
    pub(crate) quantile: f64,
    /// The share of failed requests (0 to 1) past which the rate backs off.
    #[serde(default = "default_error_ratio")]
    #[schema(example = 0.02)]
    pub(crate) max_error_ratio: f64,
    /// The least time between two changes (1s to 10m).
    #[serde(default = "default_interval", with = "duration")]
    #[schema(value_type = String, example = "5s")]
    pub(crate) interval: Duration,
    /// The most one change moves the rate, as a share of it (0.01 to 0.5).
    #[serde(default = "default_step")]
    #[schema(example = 0.25)]
    pub(crate) step: f64,
    /// Admissions a minute one increase adds (before the step's limit);
    /// by default a binary search towards the ceiling (the rate the
    /// latest run of cuts began at, a tenth lower if that run was for
    /// latency over the target or errors), or the step while none is
    /// known.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub(crate) increase: Option<u32>,
    /// How far under the target (a share of it, 0 to 0.9) latency must be
    /// before the rate rises: the band between holds it steady.
    #[serde(default = "default_headroom")]
    #[schema(example = 0.2)]
    pub(crate) headroom: f64,
    /// Requests measured since the last change before anything changes.
    #[serde(default = "default_min_samples")]
    #[schema(minimum = 1, maximum = 100_000)]
    pub(crate) min_samples: u32,
    /// Time an origin URL.
    #[serde(default)]
    pub(crate) probe: Option<ProbeSource>,
    /// Read a latency histogram from the origin's Prometheus metrics.
    #[serde(default)]
    pub(crate) metrics: Option<MetricsSource>,
}

/// Validation refuses NaN, so every stored section equals itself.
impl Eq for Autotune {}

/// A probe: Narabu requests `url` every `every` and times the answer; a
/// `5xx`, a `429`, a timeout or a failed connection is an error.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProbeSource {
    /// An http:// or https:// URL (credentials in it are never logged).
    #[schema(example = "http://origin.internal/health")]
    pub(crate) url: String,
    #[serde(default = "default_probe_every", with = "duration")]
    #[schema(value_type = String, example = "500ms")]
    pub(crate) every: Duration,
    #[serde(default = "default_timeout", with = "duration")]
    #[schema(value_type = String, example = "2s")]
    pub(crate) timeout: Duration,
    /// The longest stretch of answers the signal covers.
    #[serde(default = "default_probe_window", with = "duration")]
    #[schema(value_type = String, example = "30s")]
    pub(crate) window: Duration,
}

/// A histogram in the origin's Prometheus text (`{histogram}_bucket`
/// series, every label set summed), read every `every`; the quantile is
/// taken over the bucket counts' growth within `window`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetricsSource {
    #[schema(example = "http://origin.internal/metrics")]
    pub(crate) url: String,
    /// The histogram's name, without `_bucket`; its unit is seconds.
    #[schema(example = "http_request_duration_seconds")]
    pub(crate) histogram: String,
    #[serde(default = "default_scrape_every", with = "duration")]
    #[schema(value_type = String, example = "5s")]
    pub(crate) every: Duration,
    #[serde(default = "default_timeout", with = "duration")]
    #[schema(value_type = String, example = "2s")]
    pub(crate) timeout: Duration,
    #[serde(default = "default_scrape_window", with = "duration")]
    #[schema(value_type = String, example = "1m")]
    pub(crate) window: Duration,
}

// The configuration is logged whole at start: a source's URL, which may
// carry credentials, shows by scheme and host only.
impl fmt::Debug for ProbeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbeSource")
            .field("url", &RedactedUrl(&self.url))
            .field("every", &self.every)
            .field("timeout", &self.timeout)
            .field("window", &self.window)
            .finish()
    }
}

impl fmt::Debug for MetricsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsSource")
            .field("url", &RedactedUrl(&self.url))
            .field("histogram", &self.histogram)
            .field("every", &self.every)
            .field("timeout", &self.timeout)
            .field("window", &self.window)
            .finish()
    }
}

fn yes() -> bool {
    true
}
fn default_target() -> Duration {
    Duration::from_millis(800)
}
fn default_quantile() -> f64 {
    0.95
}
fn default_error_ratio() -> f64 {
    0.02
}
fn default_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_step() -> f64 {
    0.25
}
fn default_headroom() -> f64 {
    0.2
}
fn default_min_samples() -> u32 {
    10
}
fn default_probe_every() -> Duration {
    Duration::from_millis(500)
}
fn default_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_probe_window() -> Duration {
    Duration::from_secs(30)
}
fn default_scrape_every() -> Duration {
    Duration::from_secs(5)
}
fn default_scrape_window() -> Duration {
    Duration::from_secs(60)
}

/// What is wrong with a section: the field under `autotune` and why.
pub(crate) type Invalid = (String, String);

fn invalid(field: &str, message: impl Into<String>) -> Invalid {
    (format!("autotune.{field}"), message.into())
}

fn ratio(field: &str, v: f64, low: f64, high: f64) -> Result<(), Invalid> {
    if v.is_finite() && (low..=high).contains(&v) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("must be between {low} and {high}, got {v}"),
        ))
    }
}

fn within(field: &str, d: Duration, low: Duration, high: Duration) -> Result<(), Invalid> {
    if (low..=high).contains(&d) {
        return Ok(());
    }
    let show = humantime::format_duration;
    Err(invalid(
        field,
        format!(
            "must be between {} and {}, got {}",
            show(low),
            show(high),
            show(d)
        ),
    ))
}

fn http_url(field: &str, url: &str) -> Result<(), Invalid> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|_| invalid(field, "must be an http:// or https:// URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(invalid(field, "must be an http:// or https:// URL"));
    }
    Ok(())
}

/// A Prometheus metric name.
fn metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

impl Autotune {
    /// Every limit, the failing field named (`autotune.max_rate`).
    pub(crate) fn validate(&self) -> Result<(), Invalid> {
        if self.min_rate == 0 {
            return Err(invalid("min_rate", "must be at least 1"));
        }
        if self.max_rate < self.min_rate {
            return Err(invalid(
                "max_rate",
                format!(
                    "must be at least min_rate ({}), got {}",
                    self.min_rate, self.max_rate
                ),
            ));
        }
        match (self.min_capacity, self.max_capacity) {
            (None, None) => {}
            (Some(low), Some(high)) => {
                for (field, v) in [("min_capacity", low), ("max_capacity", high)] {
                    if !(CAPACITY_MIN..=CAPACITY_MAX).contains(&v) {
                        return Err(invalid(
                            field,
                            format!("must be between {CAPACITY_MIN} and {CAPACITY_MAX}, got {v}"),
                        ));
                    }
                }
                if high < low {
                    return Err(invalid(
                        "max_capacity",
                        format!("must be at least min_capacity ({low}), got {high}"),
                    ));
                }
            }
            (Some(_), None) => return Err(invalid("max_capacity", "is needed with min_capacity")),
            (None, Some(_)) => return Err(invalid("min_capacity", "is needed with max_capacity")),
        }
        within(
            "target_latency",
            self.target_latency,
            Duration::from_millis(1),
            Duration::from_secs(60),
        )?;
        ratio("quantile", self.quantile, 0.5, 0.999)?;
        ratio("max_error_ratio", self.max_error_ratio, 0.0, 1.0)?;
        within(
            "interval",
            self.interval,
            Duration::from_secs(1),
            Duration::from_secs(600),
        )?;
        ratio("step", self.step, 0.01, 0.5)?;
        ratio("headroom", self.headroom, 0.0, 0.9)?;
        if self.increase == Some(0) {
            return Err(invalid("increase", "must be at least 1"));
        }
        if !(1..=100_000).contains(&self.min_samples) {
            return Err(invalid("min_samples", "must be between 1 and 100000"));
        }
        if self.probe.is_none() && self.metrics.is_none() {
            return Err(invalid(
                "probe",
                "a signal is needed: a probe, metrics, or both",
            ));
        }
        if let Some(p) = &self.probe {
            http_url("probe.url", &p.url)?;
            let (low, high) = (Duration::from_millis(50), Duration::from_secs(60));
            within("probe.every", p.every, low, high)?;
            within("probe.timeout", p.timeout, low, high)?;
            within("probe.window", p.window, p.every, Duration::from_secs(600))?;
        }
        if let Some(m) = &self.metrics {
            http_url("metrics.url", &m.url)?;
            if !metric_name(&m.histogram) {
                return Err(invalid(
                    "metrics.histogram",
                    "must be a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)",
                ));
            }
            let (low, high) = (Duration::from_millis(100), Duration::from_secs(60));
            within("metrics.every", m.every, low, high)?;
            within("metrics.timeout", m.timeout, low, high)?;
            within(
                "metrics.window",
                m.window,
                m.every * 2,
                Duration::from_secs(600),
            )?;
        }
        Ok(())
    }

    /// The engine's controller for this section.
    pub(crate) fn controller(&self) -> Controller {
        Controller {
            min_rate: self.min_rate,
            max_rate: self.max_rate,
            capacity: self.min_capacity.zip(self.max_capacity),
            target_ms: self.target_latency.as_secs_f64() * 1000.0,
            max_error_ratio: self.max_error_ratio,
            interval_ms: u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX),
            step: self.step,
            increase: self.increase,
            headroom: self.headroom,
            min_samples: self.min_samples,
        }
    }
}

/// A duration as text (`"800ms"`) where people read it (TOML, JSON), as
/// milliseconds where only Narabu does (the journal, commands on Redis).
mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.collect_str(&humantime::format_duration(*d))
        } else {
            s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        if !d.is_human_readable() {
            return u64::deserialize(d).map(Duration::from_millis);
        }
        let text = String::deserialize(d)?;
        humantime::parse_duration(text.trim()).map_err(|e| {
            de::Error::custom(format_args!(
                r#"expected a duration such as "500ms", "1s" or "10m", got {text:?} ({e})"#
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(toml_text: &str) -> Autotune {
        toml::from_str(toml_text).expect("parses")
    }

    const MINIMAL: &str = r#"
        min_rate = 60
        max_rate = 6000
        probe = { url = "http://origin.internal/health" }
    "#;

    #[test]
    fn a_minimal_section_takes_the_documented_defaults() {
        let a = section(MINIMAL);
        assert_eq!(a.validate(), Ok(()));
        assert!(a.enabled);
        assert_eq!(a.target_latency, Duration::from_millis(800));
        let c = a.controller();
        assert_eq!(
            (c.target_ms, c.increase, c.interval_ms),
            (800.0, None, 5000)
        );
        let p = a.probe.as_ref().unwrap();
        assert_eq!(
            (p.every, p.window),
            (Duration::from_millis(500), Duration::from_secs(30))
        );
    }

    #[test]
    fn each_bad_value_is_named() {
        let cases = [
            ("min_rate = 0\nmax_rate = 6000", "autotune.min_rate"),
            ("min_rate = 60\nmax_rate = 10", "autotune.max_rate"),
            (
                "min_rate = 1\nmax_rate = 2\nmin_capacity = 5",
                "autotune.max_capacity",
            ),
            (
                "min_rate = 1\nmax_rate = 2\nmin_capacity = 50\nmax_capacity = 5",
                "autotune.max_capacity",
            ),
            (
                "min_rate = 1\nmax_rate = 2\nquantile = 1.5",
                "autotune.quantile",
            ),
            ("min_rate = 1\nmax_rate = 2\nstep = 0.9", "autotune.step"),
            (
                "min_rate = 1\nmax_rate = 2\ninterval = \"100ms\"",
                "autotune.interval",
            ),
            (
                "min_rate = 1\nmax_rate = 2\nmax_error_ratio = -1.0",
                "autotune.max_error_ratio",
            ),
            (
                "min_rate = 1\nmax_rate = 2\nincrease = 0",
                "autotune.increase",
            ),
        ];
        for (text, field) in cases {
            let text = format!("{text}\nprobe = {{ url = \"http://o/\" }}");
            let a: Autotune = toml::from_str(&text).expect(&text);
            assert_eq!(a.validate().unwrap_err().0, field, "{text}");
        }
        let no_source = section("min_rate = 1\nmax_rate = 2");
        assert_eq!(no_source.validate().unwrap_err().0, "autotune.probe");
        let bad_url = section("min_rate = 1\nmax_rate = 2\nprobe = { url = \"ftp://o/\" }");
        assert_eq!(bad_url.validate().unwrap_err().0, "autotune.probe.url");
        let bad_name = section(
            "min_rate = 1\nmax_rate = 2\nmetrics = { url = \"http://o/metrics\", histogram = \"a b\" }",
        );
        assert_eq!(
            bad_name.validate().unwrap_err().0,
            "autotune.metrics.histogram"
        );
    }

    #[test]
    fn a_sources_credentials_never_show_in_debug() {
        let a = section(
            "min_rate = 1\nmax_rate = 2\nprobe = { url = \"https://user:hunter2@origin/health?key=s3cret\" }\nmetrics = { url = \"http://u:pw@origin/metrics\", histogram = \"h\" }",
        );
        let shown = format!("{a:?}");
        for secret in ["hunter2", "s3cret", "pw@", "health"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("origin"), "{shown}");
    }

    #[test]
    fn it_round_trips_as_text_and_as_stored_bytes() {
        let a = section(MINIMAL);
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["target_latency"], "800ms");
        assert_eq!(serde_json::from_value::<Autotune>(json).unwrap(), a);
        let bytes = postcard::to_allocvec(&a).unwrap();
        assert_eq!(postcard::from_bytes::<Autotune>(&bytes).unwrap(), a);
    }
}
