//! Where autotune's signal comes from: the origin measured from outside (a
//! probe Narabu times itself) and from inside (a latency histogram in the
//! origin's Prometheus text). Each source runs as a task of its own that
//! keeps its recent readings; [`Sources::signal`] sums them up for the
//! tuner over the stretch since its last change, so a decision is never
//! made on what the origin did under the previous rate.
//!
//! URLs may carry credentials: logs name them through `RedactedUrl`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Autotune, MetricsSource, ProbeSource};
use crate::engine::Clock;
use crate::engine::rules::Signal;
use crate::locks::lock;
use crate::secret::RedactedUrl;

/// One probe: when it started (Unix ms), how long it took, whether it
/// failed.
#[derive(Clone, Copy, Debug)]
struct Timing {
    at_ms: u64,
    latency_ms: f64,
    failed: bool,
}

/// One reading of the histogram: when, and each bucket's cumulative count
/// by upper bound (seconds), every label set summed.
#[derive(Clone, Debug)]
struct Reading {
    at_ms: u64,
    buckets: Vec<(f64, f64)>,
}

#[derive(Debug, Default)]
struct Log {
    timings: VecDeque<Timing>,
    readings: VecDeque<Reading>,
}

/// The running sources of one room; dropping it stops them.
#[derive(Debug)]
pub(crate) struct Sources {
    log: Arc<Mutex<Log>>,
    probe_window_ms: u64,
    scrape_window_ms: u64,
    stop: CancellationToken,
}

impl Drop for Sources {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Sources {
    /// Start the section's probe and scrape (whichever it has).
    pub(crate) fn start(
        a: &Autotune,
        client: &reqwest::Client,
        clock: Arc<dyn Clock>,
        stop: &CancellationToken,
    ) -> Self {
        let log = Arc::new(Mutex::new(Log::default()));
        let stop = stop.child_token();
        let reader = Reader {
            client: client.clone(),
            clock,
            log: log.clone(),
        };
        if let Some(p) = &a.probe {
            tokio::spawn(probe(p.clone(), reader.clone(), stop.clone()));
        }
        if let Some(m) = &a.metrics {
            tokio::spawn(scrape(m.clone(), reader, stop.clone()));
        }
        Self {
            log,
            probe_window_ms: a.probe.as_ref().map_or(0, |p| ms(p.window)),
            scrape_window_ms: a.metrics.as_ref().map_or(0, |m| ms(m.window)),
            stop,
        }
    }

    /// The origin since `since_ms` (and within each source's window): the
    /// worse latency of the two sources at `quantile`, the probe's error
    /// ratio, and how many requests that stands on.
    pub(crate) fn signal(&self, since_ms: u64, now_ms: u64, quantile: f64) -> Signal {
        let log = lock(&self.log);
        let from = since_ms.max(now_ms.saturating_sub(self.probe_window_ms));
        let probed = probe_signal(log.timings.iter().filter(|t| t.at_ms >= from), quantile);
        let from = since_ms.max(now_ms.saturating_sub(self.scrape_window_ms));
        let scraped = histogram_signal(log.readings.iter().filter(|r| r.at_ms >= from), quantile);
        combine(probed, scraped)
    }
}

fn combine(a: Signal, b: Signal) -> Signal {
    let worse = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    Signal {
        latency_ms: worse(a.latency_ms, b.latency_ms),
        error_ratio: worse(a.error_ratio, b.error_ratio),
        samples: a.samples.saturating_add(b.samples),
    }
}

/// Nearest-rank quantile of the probes' latencies and their error ratio.
fn probe_signal<'a>(timings: impl Iterator<Item = &'a Timing>, quantile: f64) -> Signal {
    let mut latencies = Vec::new();
    let mut failed = 0u32;
    for t in timings {
        latencies.push(t.latency_ms);
        failed += u32::from(t.failed);
    }
    if latencies.is_empty() {
        return Signal::default();
    }
    latencies.sort_by(f64::total_cmp);
    let n = latencies.len();
    let rank = ((quantile * n as f64).ceil() as usize).clamp(1, n);
    let samples = u32::try_from(n).unwrap_or(u32::MAX);
    Signal {
        latency_ms: Some(latencies[rank - 1]),
        error_ratio: Some(f64::from(failed) / f64::from(samples)),
        samples,
    }
}

/// The quantile of what the histogram counted between the first and the
/// last reading given, interpolated within its bucket as Prometheus's
/// `histogram_quantile` does. A counter that went down (the origin
/// restarted) counts from zero.
fn histogram_signal<'a>(readings: impl Iterator<Item = &'a Reading>, quantile: f64) -> Signal {
    let mut readings = readings;
    let Some(first) = readings.next() else {
        return Signal::default();
    };
    let Some(last) = readings.last() else {
        return Signal::default();
    };
    let restarted = first
        .buckets
        .iter()
        .zip(&last.buckets)
        .any(|(a, b)| b.1 < a.1)
        || first.buckets.len() != last.buckets.len();
    let delta: Vec<(f64, f64)> = if restarted {
        last.buckets.clone()
    } else {
        last.buckets
            .iter()
            .zip(&first.buckets)
            .map(|(b, a)| (b.0, b.1 - a.1))
            .collect()
    };
    let Some(&(_, total)) = delta.last() else {
        return Signal::default();
    };
    if total < 1.0 {
        return Signal::default();
    }
    let rank = quantile * total;
    let mut lower = (0.0, 0.0);
    let mut latency = None;
    for &(le, count) in &delta {
        if count >= rank {
            latency = Some(if le.is_infinite() {
                // Past the last finite bound: that bound is all one knows.
                lower.0
            } else if count > lower.1 {
                lower.0 + (le - lower.0) * (rank - lower.1) / (count - lower.1)
            } else {
                le
            });
            break;
        }
        lower = (le, count);
    }
    Signal {
        latency_ms: latency.map(|s| s * 1000.0),
        error_ratio: None,
        samples: total.min(f64::from(u32::MAX)) as u32,
    }
}

/// The `{name}_bucket` series of a Prometheus text page, each bound's
/// counts summed over label sets, in order of bound; `None` when the page
/// has none.
fn buckets(page: &str, name: &str) -> Option<Vec<(f64, f64)>> {
    let lines = page.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).ok()?;
    let mut by_bound: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    let mut add = |le: f64, count: f64| {
        // Bounds as ordered keys: non-negative floats order as their bits.
        let entry = by_bound.entry(le.max(0.0).to_bits()).or_insert((le, 0.0));
        entry.1 += count;
    };
    for sample in &scrape.samples {
        if sample.metric != name && sample.metric != format!("{name}_bucket") {
            continue;
        }
        match &sample.value {
            prometheus_parse::Value::Histogram(counts) => {
                counts.iter().for_each(|c| add(c.less_than, c.count));
            }
            prometheus_parse::Value::Untyped(count) | prometheus_parse::Value::Counter(count) => {
                if let Some(le) = sample.labels.get("le").and_then(|v| v.parse::<f64>().ok()) {
                    add(le, *count);
                }
            }
            _ => {}
        }
    }
    (!by_bound.is_empty()).then(|| by_bound.into_values().collect())
}

/// A source's pace: a reading every period (a slow one delays the next
/// rather than bunching them up), until it is stopped.
struct Ticks {
    every: tokio::time::Interval,
    stop: CancellationToken,
}

impl Ticks {
    fn new(period: Duration, stop: CancellationToken) -> Self {
        let mut every = tokio::time::interval(period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { every, stop }
    }

    /// Waits for the next reading's time; false once stopped.
    async fn next(&mut self) -> bool {
        tokio::select! {
            () = self.stop.cancelled() => false,
            _ = self.every.tick() => true,
        }
    }
}

/// What a source reads with and writes to.
#[derive(Clone)]
struct Reader {
    client: reqwest::Client,
    clock: Arc<dyn Clock>,
    log: Arc<Mutex<Log>>,
}

async fn probe(p: ProbeSource, reader: Reader, stop: CancellationToken) {
    let Reader { client, clock, log } = reader;
    let mut ticks = Ticks::new(p.every, stop);
    let window = ms(p.window);
    while ticks.next().await {
        let at_ms = clock.now_ms();
        let started = Instant::now();
        let failed = match client.get(&p.url).timeout(p.timeout).send().await {
            Ok(r) => {
                let status = r.status();
                // The body is part of the time a visitor waits.
                let body = tokio::time::timeout(p.timeout, r.bytes()).await;
                status.is_server_error() || status.as_u16() == 429 || !matches!(body, Ok(Ok(_)))
            }
            Err(e) => {
                tracing::debug!(url = ?RedactedUrl(&p.url), error = %e.without_url(), "autotune: probe failed");
                true
            }
        };
        let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut log = lock(&log);
        log.timings.push_back(Timing {
            at_ms,
            latency_ms,
            failed,
        });
        while log
            .timings
            .front()
            .is_some_and(|t| t.at_ms + window < at_ms)
        {
            log.timings.pop_front();
        }
    }
}

async fn scrape(m: MetricsSource, reader: Reader, stop: CancellationToken) {
    let Reader { client, clock, log } = reader;
    let mut ticks = Ticks::new(m.every, stop);
    let window = ms(m.window);
    let mut warned = false;
    while ticks.next().await {
        let at_ms = clock.now_ms();
        let page = match client.get(&m.url).timeout(m.timeout).send().await {
            Ok(r) if r.status().is_success() => r.text().await.ok(),
            _ => None,
        };
        let Some(buckets) = page.as_deref().and_then(|p| buckets(p, &m.histogram)) else {
            if !warned {
                tracing::warn!(url = ?RedactedUrl(&m.url), histogram = %m.histogram, "autotune: the origin's metrics could not be read, or have no such histogram");
                warned = true;
            }
            continue;
        };
        warned = false;
        let mut log = lock(&log);
        log.readings.push_back(Reading { at_ms, buckets });
        // One reading older than the window stays: the difference over
        // the whole window needs a start.
        while log.readings.len() > 2 && log.readings[1].at_ms + window < at_ms {
            log.readings.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_quantile_is_nearest_rank_and_errors_are_a_share() {
        let timings: Vec<Timing> = (1..=20)
            .map(|i| Timing {
                at_ms: i,
                latency_ms: f64::from(i as u32) * 10.0,
                failed: i % 10 == 0,
            })
            .collect();
        let s = probe_signal(timings.iter(), 0.95);
        assert_eq!(s.latency_ms, Some(190.0));
        assert_eq!(s.error_ratio, Some(0.1));
        assert_eq!(s.samples, 20);
        assert_eq!(probe_signal([].iter(), 0.95), Signal::default());
    }

    const PAGE_A: &str = "# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{route=\"/a\",le=\"0.1\"} 10
http_request_duration_seconds_bucket{route=\"/a\",le=\"0.5\"} 10
http_request_duration_seconds_bucket{route=\"/a\",le=\"1\"} 10
http_request_duration_seconds_bucket{route=\"/a\",le=\"+Inf\"} 10
http_request_duration_seconds_sum{route=\"/a\"} 0.5
http_request_duration_seconds_count{route=\"/a\"} 10
";

    #[test]
    fn the_histogram_quantile_comes_from_bucket_growth() {
        let a = buckets(PAGE_A, "http_request_duration_seconds").unwrap();
        assert_eq!(a.len(), 4);
        // Since: 100 more, 90 between 0.1 and 0.5 s, 10 between 0.5 and 1.
        let page_b = PAGE_A
            .replace("le=\"0.5\"} 10", "le=\"0.5\"} 100")
            .replace("le=\"1\"} 10", "le=\"1\"} 110")
            .replace("le=\"+Inf\"} 10", "le=\"+Inf\"} 110");
        let b = buckets(&page_b, "http_request_duration_seconds").unwrap();
        let readings = [
            Reading {
                at_ms: 0,
                buckets: a,
            },
            Reading {
                at_ms: 5_000,
                buckets: b,
            },
        ];
        let s = histogram_signal(readings.iter(), 0.95);
        assert_eq!(s.samples, 100);
        // The 95th of 100 is half-way through the 0.5–1 s bucket.
        let l = s.latency_ms.unwrap();
        assert!((l - 750.0).abs() < 1e-6, "{l}");
        let median = histogram_signal(readings.iter(), 0.5).latency_ms.unwrap();
        assert!(
            (median - (100.0 + 400.0 * 50.0 / 90.0)).abs() < 1e-6,
            "{median}"
        );
        // One reading is no difference.
        assert_eq!(
            histogram_signal(readings[..1].iter(), 0.95),
            Signal::default()
        );
        assert_eq!(buckets(PAGE_A, "other_seconds"), None);
    }

    #[test]
    fn the_worse_source_wins() {
        let probe = Signal {
            latency_ms: Some(100.0),
            error_ratio: Some(0.5),
            samples: 10,
        };
        let hist = Signal {
            latency_ms: Some(900.0),
            error_ratio: None,
            samples: 50,
        };
        let s = combine(probe, hist);
        assert_eq!(
            (s.latency_ms, s.error_ratio, s.samples),
            (Some(900.0), Some(0.5), 60)
        );
    }
}
