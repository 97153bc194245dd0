//! The sale's report: what an operator shows after (or during) a sale, all
//! computed from the room's admission record (so it says what the public
//! record says, and survives restarts and owner changes with it) and the
//! room's settings, plus this instance's count of refused joins.
//!
//! Figures: joins and admissions per minute; waits (join to admission)
//! p50/p90/p99 overall and by place in line; time on the site (admission
//! to release, revocation or expiry); abandonment and away returns; the
//! admission rate against the configured one; and the fairness figures
//! `narabu verify-record` reports (inversions within lanes, explained or
//! not, and each lane's share against its weight).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::engine::{AdmissionRecord, EntryKind, RoomSettings, TicketState};

/// A minute of the sale.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Minute {
    /// The minute's start, Unix milliseconds.
    pub at: u64,
    pub joins: u64,
    pub admissions: u64,
}

/// Quantiles of a set of durations, in milliseconds (nearest rank).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Spread {
    pub count: u64,
    pub p50_ms: Option<u64>,
    pub p90_ms: Option<u64>,
    pub p99_ms: Option<u64>,
}

impl Spread {
    /// Nearest-rank quantiles of `values` (sorted here).
    pub(crate) fn of(mut values: Vec<u64>) -> Self {
        values.sort_unstable();
        let q = |p: f64| {
            if values.is_empty() {
                return None;
            }
            let rank = (p * values.len() as f64).ceil() as usize;
            Some(values[rank.clamp(1, values.len()) - 1])
        };
        Self {
            count: values.len() as u64,
            p50_ms: q(0.50),
            p90_ms: q(0.90),
            p99_ms: q(0.99),
        }
    }
}

/// Waits of the tickets whose numbers fall in `[from, to]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PlaceWaits {
    pub from: u64,
    pub to: u64,
    #[serde(flatten)]
    pub waits: Spread,
}

/// How tickets ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Endings {
    pub released: u64,
    pub revoked: u64,
    pub expired: u64,
    /// Left the line before their turn.
    pub left: u64,
    /// Went quiet in the line past `queue_idle`.
    pub abandoned: u64,
    /// `(left + abandoned) / joins`.
    pub abandonment: f64,
}

/// Visitors away at their turn.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Away {
    /// Times the head passed a visitor who was away.
    pub skips: u64,
    /// Times an away visitor came back.
    pub returns: u64,
    /// Of the tickets ever skipped, how many were admitted later.
    pub admitted_after_return: u64,
}

/// The admission rate over the minutes admissions happened in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Rate {
    /// Admissions per minute, from the first admission to the last.
    pub observed_per_minute: f64,
    /// The room's `admit_per_minute`, if it has one.
    pub configured_per_minute: Option<u32>,
    pub capacity: u32,
}

/// One lane's share of admissions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Share {
    pub lane: String,
    pub weight: u32,
    pub admissions: u64,
    /// Its admissions ÷ all admissions.
    pub share: f64,
    /// Its weight ÷ all weights.
    pub weight_share: f64,
}

/// The fairness figures of the record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Fairness {
    /// Entries in the record, and its head hash.
    pub entries: u64,
    pub head: String,
    /// Pairs admitted out of ticket order within a lane (Kendall-tau).
    pub inversions: u64,
    /// Of those, how many nothing in the record explains.
    pub unexplained: u64,
    pub shares: Vec<Share>,
}

/// A refused join, by reason, as this instance counted it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Refusals {
    pub reason: String,
    pub count: u64,
}

/// The sale's report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = SaleReport)]
pub struct Report {
    pub room: String,
    pub epoch: u64,
    pub joins: u64,
    pub admissions: u64,
    pub timeline: Vec<Minute>,
    /// Join to admission.
    pub waits: Spread,
    pub waits_by_place: Vec<PlaceWaits>,
    /// Admission to release, revocation or expiry.
    pub time_on_site: Spread,
    pub endings: Endings,
    pub away: Away,
    pub rate: Rate,
    pub fairness: Fairness,
    pub refused: Vec<Refusals>,
}

const MINUTE: u64 = 60_000;

/// Places in line grouped by powers of ten: 1–9, 10–99, 100–999, …
fn place_group(number: u64) -> (u64, u64) {
    let mut from = 1;
    while from * 10 <= number {
        from *= 10;
    }
    (from, from * 10 - 1)
}

/// The report of `record`, a room with `settings`, and this instance's
/// refusals.
pub(crate) fn report(
    record: &AdmissionRecord,
    settings: &RoomSettings,
    refused: Vec<Refusals>,
) -> Report {
    let joined: HashMap<u32, (u64, u32)> = record
        .tickets()
        .map(|(id, _, number, at)| (id, (at, number)))
        .collect();
    let joins = joined.values().filter(|(at, _)| *at > 0).count() as u64;
    let mut timeline: BTreeMap<u64, Minute> = BTreeMap::new();
    for &(at, _) in joined.values().filter(|(at, _)| *at > 0) {
        let start = at - at % MINUTE;
        timeline
            .entry(start)
            .or_insert(Minute {
                at: start,
                joins: 0,
                admissions: 0,
            })
            .joins += 1;
    }
    let mut admitted_at: HashMap<u32, u64> = HashMap::new();
    let mut waits = Vec::new();
    let mut by_place: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    let mut on_site = Vec::new();
    let mut endings = Endings::default();
    let mut away = Away::default();
    let mut skipped = std::collections::HashSet::new();
    let (mut first, mut last) = (u64::MAX, 0);
    for e in record.entries() {
        match e.kind {
            EntryKind::Admit => {
                admitted_at.insert(e.ticket, e.at);
                let start = e.at - e.at % MINUTE;
                timeline
                    .entry(start)
                    .or_insert(Minute {
                        at: start,
                        joins: 0,
                        admissions: 0,
                    })
                    .admissions += 1;
                first = first.min(e.at);
                last = last.max(e.at);
                if let Some(&(joined_at, _)) = joined.get(&e.ticket).filter(|(at, _)| *at > 0) {
                    let wait = e.at.saturating_sub(joined_at);
                    waits.push(wait);
                    if e.number > 0 {
                        by_place
                            .entry(place_group(u64::from(e.number)))
                            .or_default()
                            .push(wait);
                    }
                }
                if skipped.contains(&e.ticket) {
                    away.admitted_after_return += 1;
                }
            }
            EntryKind::Skip => {
                away.skips += 1;
                skipped.insert(e.ticket);
            }
            EntryKind::Return => away.returns += 1,
            EntryKind::End(state) => {
                match state {
                    TicketState::Released => endings.released += 1,
                    TicketState::Revoked => endings.revoked += 1,
                    TicketState::Expired => endings.expired += 1,
                    TicketState::Left => endings.left += 1,
                    TicketState::Abandoned => endings.abandoned += 1,
                    _ => {}
                }
                if let Some(&admitted) = admitted_at.get(&e.ticket)
                    && matches!(
                        state,
                        TicketState::Released | TicketState::Revoked | TicketState::Expired
                    )
                {
                    on_site.push(e.at.saturating_sub(admitted));
                }
            }
            EntryKind::Draw | EntryKind::Close => {}
        }
    }
    let admissions = admitted_at.len() as u64;
    endings.abandonment = if joins == 0 {
        0.0
    } else {
        (endings.left + endings.abandoned) as f64 / joins as f64
    };
    let span_minutes = if admissions > 1 {
        (last - first) as f64 / MINUTE as f64
    } else {
        0.0
    };
    let entries: Vec<crate::published_record::EntryBody> = record
        .entries()
        .iter()
        .enumerate()
        .map(|(i, e)| crate::published_record::EntryBody {
            n: i as u64 + 1,
            kind: e.kind.word().to_owned(),
            ticket: u64::from(e.ticket),
            lane: e.lane,
            number: u64::from(e.number),
            at: e.at,
            hash: String::new(),
        })
        .collect();
    let order = crate::verify_record::order(&entries);
    let weights: u64 = settings.lane_weights().iter().map(|&w| u64::from(w)).sum();
    let lane_admissions: u64 = order.admitted.values().sum();
    let shares = settings
        .lane_weights()
        .iter()
        .enumerate()
        .map(|(i, &weight)| {
            let n = order.admitted.get(&(i as u8)).copied().unwrap_or(0);
            Share {
                lane: settings
                    .lane_name(i as u8)
                    .unwrap_or("(the line)")
                    .to_owned(),
                weight,
                admissions: n,
                share: if lane_admissions == 0 {
                    0.0
                } else {
                    n as f64 / lane_admissions as f64
                },
                weight_share: f64::from(weight) / weights.max(1) as f64,
            }
        })
        .collect();
    Report {
        room: settings.id.to_string(),
        epoch: record.epoch(),
        joins,
        admissions,
        timeline: timeline.into_values().collect(),
        waits: Spread::of(waits),
        waits_by_place: by_place
            .into_iter()
            .map(|((from, to), w)| PlaceWaits {
                from,
                to,
                waits: Spread::of(w),
            })
            .collect(),
        time_on_site: Spread::of(on_site),
        endings,
        away,
        rate: Rate {
            observed_per_minute: if span_minutes > 0.0 {
                admissions as f64 / span_minutes
            } else {
                admissions as f64
            },
            configured_per_minute: settings.admit_per_minute,
            capacity: settings.capacity,
        },
        fairness: Fairness {
            entries: record.len(),
            head: hex::encode(record.head()),
            inversions: order.inversions,
            unexplained: order.unexplained,
            shares,
        },
        refused,
    }
}

/// The report as CSV: one `section,key,value` row per figure, and the
/// timeline as `timeline,<minute>,joins,admissions` rows.
pub(crate) fn csv(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("section,key,value\n");
    let mut row = |section: &str, key: &str, value: String| {
        let _ = writeln!(out, "{section},{key},{value}");
    };
    let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    row("sale", "room", r.room.clone());
    row("sale", "epoch", r.epoch.to_string());
    row("sale", "joins", r.joins.to_string());
    row("sale", "admissions", r.admissions.to_string());
    for (name, s) in [("waits", &r.waits), ("time_on_site", &r.time_on_site)] {
        row(name, "count", s.count.to_string());
        row(name, "p50_ms", opt(s.p50_ms));
        row(name, "p90_ms", opt(s.p90_ms));
        row(name, "p99_ms", opt(s.p99_ms));
    }
    for p in &r.waits_by_place {
        let key = format!("{}-{}", p.from, p.to);
        row(
            "waits_by_place",
            &format!("{key} count"),
            p.waits.count.to_string(),
        );
        row(
            "waits_by_place",
            &format!("{key} p50_ms"),
            opt(p.waits.p50_ms),
        );
        row(
            "waits_by_place",
            &format!("{key} p90_ms"),
            opt(p.waits.p90_ms),
        );
        row(
            "waits_by_place",
            &format!("{key} p99_ms"),
            opt(p.waits.p99_ms),
        );
    }
    let e = &r.endings;
    for (k, v) in [
        ("released", e.released),
        ("revoked", e.revoked),
        ("expired", e.expired),
        ("left", e.left),
        ("abandoned", e.abandoned),
    ] {
        row("endings", k, v.to_string());
    }
    row("endings", "abandonment", format!("{:.4}", e.abandonment));
    row("away", "skips", r.away.skips.to_string());
    row("away", "returns", r.away.returns.to_string());
    row(
        "away",
        "admitted_after_return",
        r.away.admitted_after_return.to_string(),
    );
    row(
        "rate",
        "observed_per_minute",
        format!("{:.2}", r.rate.observed_per_minute),
    );
    row(
        "rate",
        "configured_per_minute",
        r.rate
            .configured_per_minute
            .map_or(String::new(), |v| v.to_string()),
    );
    row("rate", "capacity", r.rate.capacity.to_string());
    row("fairness", "entries", r.fairness.entries.to_string());
    row("fairness", "head", r.fairness.head.clone());
    row("fairness", "inversions", r.fairness.inversions.to_string());
    row(
        "fairness",
        "unexplained",
        r.fairness.unexplained.to_string(),
    );
    for s in &r.fairness.shares {
        row(
            "share",
            &format!("{} admissions", s.lane),
            s.admissions.to_string(),
        );
        row(
            "share",
            &format!("{} share", s.lane),
            format!("{:.4}", s.share),
        );
        row(
            "share",
            &format!("{} weight_share", s.lane),
            format!("{:.4}", s.weight_share),
        );
    }
    for f in &r.refused {
        row("refused", &f.reason, f.count.to_string());
    }
    for m in &r.timeline {
        row(
            "timeline",
            &m.at.to_string(),
            format!("{} joins {} admissions", m.joins, m.admissions),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let s = Spread::of((1..=100).collect());
        assert_eq!(
            (s.p50_ms, s.p90_ms, s.p99_ms),
            (Some(50), Some(90), Some(99))
        );
        assert_eq!(Spread::of(vec![]).p50_ms, None);
        assert_eq!(place_group(1), (1, 9));
        assert_eq!(place_group(10), (10, 99));
        assert_eq!(place_group(999), (100, 999));
    }
}
