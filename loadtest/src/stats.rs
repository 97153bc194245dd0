//! The report's arithmetic, kept apart from the I/O so it can be tested:
//! percentiles, the most visitors admitted at once, the admission-order
//! check, pairing releases with the admissions they caused, and the time
//! series drawn in the chart.

use serde::Serialize;

/// p50 / p99 / max of a set of durations, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub min_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    pub fn of(values_ms: &[f64]) -> Self {
        if values_ms.is_empty() {
            return Self::default();
        }
        let mut v = values_ms.to_vec();
        v.sort_by(f64::total_cmp);
        Self {
            count: v.len(),
            min_ms: v[0],
            p50_ms: percentile(&v, 50.0),
            p99_ms: percentile(&v, 99.0),
            max_ms: v[v.len() - 1],
        }
    }

    pub fn show(&self) -> String {
        if self.count == 0 {
            return "n/a".to_owned();
        }
        format!(
            "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n={})",
            self.p50_ms, self.p99_ms, self.max_ms, self.count
        )
    }
}

/// Nearest-rank percentile of sorted values (`p` in 0..=100).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The most intervals `[start, end)` open at one instant. An interval ending
/// exactly when another starts does not overlap it.
pub fn max_overlap(intervals: &[(f64, f64)]) -> usize {
    let mut edges: Vec<(f64, i32)> = Vec::with_capacity(intervals.len() * 2);
    for &(s, e) in intervals {
        edges.push((s, 1));
        edges.push((e.max(s), -1));
    }
    // Ends sort before starts at the same instant.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in edges {
        now += i64::from(d);
        most = most.max(now);
    }
    most as usize
}

/// Visitors who stayed in line, by ticket number, with when each was seen
/// admitted (`None`: still waiting at the end). A violation is a visitor
/// admitted more than `slack_ms` before someone with a smaller number, or
/// a visitor still waiting while someone with a larger number got in.
/// The slack absorbs delivery jitter between streams: admissions of one
/// tick happen together but reach the tool a little apart.
pub fn order_violations(stayed: &[(u64, Option<f64>)], slack_ms: f64) -> usize {
    let mut v = stayed.to_vec();
    v.sort_by_key(|(n, _)| *n);
    let mut violations = 0;
    let mut latest_before = f64::NEG_INFINITY;
    for &(_, at) in &v {
        if let Some(at) = at {
            if at + slack_ms < latest_before {
                violations += 1;
            }
            latest_before = latest_before.max(at);
        }
    }
    // Left waiting while a later number was admitted.
    let mut later_admitted = false;
    for &(_, at) in v.iter().rev() {
        match at {
            Some(_) => later_admitted = true,
            None if later_admitted => violations += 1,
            None => {}
        }
    }
    violations
}

/// Visitors who came back to the line: `(number, back, admitted)`, `back`
/// being when the tool first heard from the server after returning (the
/// server knew by then). `everyone` is every visitor seen admitted, by
/// number. A violation is someone with a larger number admitted, more
/// than `slack_ms` after a returner was back, ahead of that returner (who
/// then stood ahead of the whole line): more than `slack_ms` before the
/// returner's own admission, or while the returner was never admitted.
pub fn return_order_violations(
    returned: &[(u64, f64, Option<f64>)],
    everyone: &[(u64, f64)],
    slack_ms: f64,
) -> usize {
    let slack = slack_ms / 1000.0;
    returned
        .iter()
        .filter(|&&(number, back, admitted)| {
            everyone.iter().any(|&(other, at)| {
                other > number && at > back + slack && admitted.is_none_or(|a| a > at + slack)
            })
        })
        .count()
}

/// What the tool saw happen, in time order, to pair hand-offs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Seen {
    /// A join answered (the visitor now waits).
    Joined(f64),
    /// An `admitted` event arrived.
    Admitted(f64),
    /// A leave was sent by an admitted visitor.
    Left(f64),
}

impl Seen {
    fn at(&self) -> f64 {
        match *self {
            Seen::Joined(t) | Seen::Admitted(t) | Seen::Left(t) => t,
        }
    }
}

/// Hand-off latencies: each permit given back while someone waited is
/// paired, first come first served, with the next admission seen. An
/// admission with no such release pending (the tick's) is not a hand-off.
pub fn handoff_latencies(events: &[Seen]) -> Vec<f64> {
    let mut ev = events.to_vec();
    ev.sort_by(|a, b| a.at().total_cmp(&b.at()));
    let mut waiting: i64 = 0;
    let mut pending = std::collections::VecDeque::new();
    let mut out = Vec::new();
    for e in ev {
        match e {
            Seen::Joined(_) => waiting += 1,
            Seen::Admitted(t) => {
                waiting -= 1;
                if let Some(left) = pending.pop_front() {
                    out.push(t - left);
                }
            }
            Seen::Left(t) => {
                if waiting > 0 {
                    pending.push_back(t);
                }
            }
        }
    }
    out
}

/// One sample of the chart.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub queue: i64,
    pub admitted: i64,
    pub admissions_per_s: f64,
}

/// Queue length, visitors admitted and admissions in the last second,
/// sampled every `step_s` from the tool's own view (joins answered,
/// admissions seen, leaves sent). Times are seconds from the start.
pub fn series(events: &[Seen], step_s: f64, until_s: f64) -> Vec<Sample> {
    let mut ev = events.to_vec();
    ev.sort_by(|a, b| a.at().total_cmp(&b.at()));
    let admissions: Vec<f64> = ev
        .iter()
        .filter_map(|e| match e {
            Seen::Admitted(t) => Some(*t),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    let (mut i, mut queue, mut admitted) = (0, 0i64, 0i64);
    let mut t = 0.0;
    while t <= until_s + 1e-9 {
        while i < ev.len() && ev[i].at() <= t {
            match ev[i] {
                Seen::Joined(_) => queue += 1,
                Seen::Admitted(_) => {
                    queue -= 1;
                    admitted += 1;
                }
                Seen::Left(_) => admitted -= 1,
            }
            i += 1;
        }
        let lo = admissions.partition_point(|&a| a <= t - 1.0);
        let hi = admissions.partition_point(|&a| a <= t);
        out.push(Sample {
            t_s: t,
            queue,
            admitted,
            admissions_per_s: (hi - lo) as f64,
        });
        t += step_s;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.count, s.min_ms, s.p50_ms, s.max_ms), (3, 1.0, 2.0, 3.0));
        assert_eq!(Summary::of(&[]).show(), "n/a");
    }

    #[test]
    fn overlap_counts_the_busiest_instant() {
        assert_eq!(max_overlap(&[]), 0);
        assert_eq!(max_overlap(&[(0.0, 10.0), (5.0, 15.0), (12.0, 20.0)]), 2);
        // Back to back is not overlapping: a hand-off.
        assert_eq!(max_overlap(&[(0.0, 5.0), (5.0, 9.0)]), 1);
        assert_eq!(max_overlap(&[(0.0, 9.0), (1.0, 9.0), (2.0, 9.0)]), 3);
    }

    #[test]
    fn order_check_finds_overtaking() {
        let fair = [(1, Some(10.0)), (2, Some(10.5)), (3, Some(30.0)), (4, None)];
        assert_eq!(order_violations(&fair, 5.0), 0);
        // Ticket 3 in a full 100 ms before ticket 2.
        let unfair = [(1, Some(10.0)), (2, Some(200.0)), (3, Some(100.0))];
        assert_eq!(order_violations(&unfair, 5.0), 1);
        // Jitter within the slack is not a violation.
        let jitter = [(1, Some(10.0)), (2, Some(12.0)), (3, Some(11.0))];
        assert_eq!(order_violations(&jitter, 5.0), 0);
        // Ticket 1 still waiting while 2 got in.
        let skipped = [(1, None), (2, Some(5.0))];
        assert_eq!(order_violations(&skipped, 5.0), 1);
    }

    #[test]
    fn a_returner_overtaken_after_coming_back_is_a_violation() {
        // 5 came back at 1.0 s; 9 got in at 1.5 s, 5 only at 2.0 s.
        let everyone = [(3, 0.5), (9, 1.5), (5, 2.0)];
        assert_eq!(
            return_order_violations(&[(5, 1.0, Some(2.0))], &everyone, 50.0),
            1
        );
        // 5 got in first: fine; so is 9 getting in before 5 came back, and
        // within the slack of it.
        let fair = [(9, 1.0), (5, 1.2), (7, 1.3)];
        assert_eq!(
            return_order_violations(&[(5, 1.0, Some(1.2))], &fair, 50.0),
            0
        );
        assert_eq!(
            return_order_violations(&[(5, 1.0, Some(1.55))], &everyone, 50.0),
            0
        );
        // Back, never admitted, while a later number got in.
        assert_eq!(
            return_order_violations(&[(5, 1.0, None)], &everyone, 50.0),
            1
        );
    }

    #[test]
    fn handoffs_pair_releases_with_the_next_admissions() {
        use Seen::*;
        let ev = [
            Joined(0.0),
            Joined(0.0),
            Joined(0.0),
            Admitted(1.0), // the tick: not a hand-off
            Left(2.0),
            Admitted(2.5),
            Left(3.0),
            Admitted(3.25),
            Left(4.0), // nobody waits: goes to the tray
        ];
        assert_eq!(handoff_latencies(&ev), vec![0.5, 0.25]);
    }

    #[test]
    fn series_tracks_queue_admitted_and_rate() {
        use Seen::*;
        let ev = [
            Joined(0.0),
            Joined(0.0),
            Admitted(0.5),
            Admitted(0.6),
            Left(1.2),
        ];
        let s = series(&ev, 0.5, 2.0);
        assert_eq!(s.len(), 5);
        assert_eq!((s[0].queue, s[0].admitted), (2, 0));
        assert_eq!(
            (s[1].queue, s[1].admitted, s[1].admissions_per_s),
            (1, 1, 1.0)
        );
        assert_eq!(
            (s[2].queue, s[2].admitted, s[2].admissions_per_s),
            (0, 2, 2.0)
        );
        assert_eq!((s[3].admitted, s[3].admissions_per_s), (1, 1.0));
        assert_eq!(s[4].admissions_per_s, 0.0);
    }
}
