//! A ticket's status: its place, the people ahead, progress, an estimated
//! wait and, once admitted, when its pass lapses. Computed here from plain
//! facts, whichever store holds them, and sent as is: the API's JSON, the
//! stream's `position` events and the queue page all show this one type.
//!
//! The count of tickets still waiting ahead is an input, not something this
//! module finds out: the embedded engine counts it with its departures index
//! (`Departures`), the Redis backend with the rank in its queue set, and a
//! stream may compute it from a replica of either.

use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::lanes::LaneLoads;
use super::mode::Mode;
use super::rate::AdmissionRate;
use super::state::{Status, TicketState};
use crate::engine::clock::Timestamp;

/// What the status needs to know of one ticket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TicketFacts {
    pub id: u64,
    pub state: TicketState,
    /// Queue index (the number minus one); `None` in the pre-queue.
    pub index: Option<u64>,
    /// Tickets waiting ahead when it was placed, for the progress bar.
    pub initial_ahead: u64,
    pub joined_at: u64,
    pub admitted_at: u64,
    pub last_seen: u64,
    /// Seen since admission (its pass then lapses after `pass_idle`).
    pub arrived: bool,
    /// The lane it queues in (0 in a room without lanes); `index` counts
    /// in that lane's line.
    pub lane: u8,
}

/// What the status needs to know of the room.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoomFacts {
    pub open: bool,
    pub paused: bool,
    pub closed: bool,
    /// How the room queues now; `sold_out` closes it like `closed`.
    pub mode: Mode,
    /// Units left to sell, for a room that counts its stock.
    pub stock: Option<u64>,
    pub opens_at: Option<u64>,
    /// Tickets waiting in all.
    pub waiting: u64,
    /// Permits the worker can hand out at its next tick (its hand and the
    /// tray).
    pub free_permits: u64,
    pub rate: AdmissionRate,
    pub tick_ms: u64,
    pub timeouts: PassTimeouts,
    /// The lanes' weights and which have people waiting, for the part of
    /// the admissions each lane can expect.
    pub lanes: LaneLoads,
}

/// How long a pass lasts without activity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct PassTimeouts {
    /// After the visitor's last activity, once arrived.
    pub pass_idle_ms: u64,
    /// After admission, for a visitor who has not arrived yet.
    pub arrival_grace_ms: u64,
}

/// The moments before which a pass has lapsed, by what renewed it last:
/// the reaper's side of [`PassTimeouts::deadline`], for stores that index
/// passes by their admission time and their last activity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg(test)]
pub(crate) struct PassCutoffs {
    /// A pass admitted before this and never used has lapsed.
    pub unarrived_before: u64,
    /// A used pass last seen before this has lapsed.
    pub idle_before: u64,
}

impl PassTimeouts {
    /// When an admitted ticket's pass lapses if nothing more is heard.
    pub(crate) fn deadline(&self, arrived: bool, admitted_at: u64, last_seen: u64) -> u64 {
        if arrived {
            last_seen.saturating_add(self.pass_idle_ms)
        } else {
            admitted_at.saturating_add(self.arrival_grace_ms)
        }
    }

    /// The same rule seen from `now`: a pass has lapsed when the moment
    /// that renewed it last is before its cutoff (its deadline is then
    /// before `now`).
    #[cfg(test)]
    pub(crate) fn cutoffs(&self, now: u64) -> PassCutoffs {
        PassCutoffs {
            unarrived_before: now.saturating_sub(self.arrival_grace_ms),
            idle_before: now.saturating_sub(self.pass_idle_ms),
        }
    }
}

/// A waiting ticket quiet for longer than `queue_idle` is abandoned: the
/// moment before which its last sign of life must fall.
pub(crate) fn quiet_cutoff(now: u64, queue_idle_ms: u64) -> u64 {
    now.saturating_sub(queue_idle_ms)
}

/// An estimated wait, in seconds, as a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eta {
    pub low_secs: u64,
    pub expected_secs: u64,
    pub high_secs: u64,
}

/// One ticket as its holder sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct TicketStatus {
    pub id: u64,
    pub state: TicketState,
    /// The lane it queues in; `number`, `position` and `ahead` count in it.
    pub lane: u8,
    /// Queue number (1-based); `None` in the pre-queue before the draw.
    pub number: Option<u64>,
    /// Tickets still waiting ahead, plus one; `None` unless waiting and placed.
    pub position: Option<u64>,
    pub ahead: Option<u64>,
    pub eta: Option<Eta>,
    /// 0.0 at join, 1.0 at the head of the line.
    pub progress: f64,
    pub queue_length: u64,
    pub paused: bool,
    /// The room closed (deleted, or sold out: see `mode`).
    pub closed: bool,
    pub mode: Mode,
    /// Units left to sell, for a room that counts its stock.
    pub stock: Option<u64>,
    pub joined_at: Timestamp,
    pub admitted_at: Option<Timestamp>,
    /// For an admitted ticket: when the pass lapses without activity.
    pub pass_expires_at: Option<Timestamp>,
    /// While the room has not opened yet.
    pub opens_at: Option<Timestamp>,
    /// When this status was computed.
    pub at: Timestamp,
}

impl TicketStatus {
    /// What the holder is told.
    pub fn status(&self) -> Status {
        Status::of(self.state, self.closed)
    }

    /// Whether a waiting visitor would see anything different: a stream
    /// sends a `position` event only then.
    pub(crate) fn shows_same_as(&self, other: &TicketStatus) -> bool {
        let eta_range = |s: &TicketStatus| s.eta.map(|e| (e.low_secs, e.high_secs));
        self.position == other.position
            && eta_range(self) == eta_range(other)
            && self.queue_length == other.queue_length
            && self.paused == other.paused
            && self.mode == other.mode
            && self.stock == other.stock
    }

    /// Why a closed room closed, as the `closed` event and the page say it:
    /// `sold_out` or `closed`.
    pub fn closed_reason(&self) -> &'static str {
        if self.mode.closes() {
            self.mode.name()
        } else {
            "closed"
        }
    }

    /// Progress as a whole percentage, 0 to 100.
    pub(crate) fn percent(&self) -> u8 {
        (self.progress * 100.0).round().clamp(0.0, 100.0) as u8
    }
}

/// The wire form of a [`TicketStatus`]: times in RFC 3339, progress to
/// three decimals. The API's JSON and its OpenAPI schema are both made from
/// this one struct, so they cannot disagree.
#[derive(Serialize, ToSchema)]
#[schema(as = TicketStatus)]
pub(crate) struct StatusBody {
    pub status: Status,
    /// The priority lane the ticket queues in, for a room with lanes:
    /// `number`, `position` and `ahead` count in that lane's line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// Queue number (1-based); `null` in the pre-queue before the draw.
    pub number: Option<u64>,
    /// Place in line (1 = next); `null` unless waiting and placed.
    #[schema(minimum = 1)]
    pub position: Option<u64>,
    /// Tickets still waiting ahead.
    pub ahead: Option<u64>,
    /// Expected wait; `null` when not waiting or not yet estimable.
    pub eta_seconds: Option<u64>,
    pub eta_low_seconds: Option<u64>,
    pub eta_high_seconds: Option<u64>,
    /// 0.0 at join, 1.0 at the head of the line.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub progress: f64,
    /// Tickets waiting in the room.
    pub queue_length: u64,
    pub paused: bool,
    /// How the room queues now; `sold_out` comes with `status: closed`.
    pub mode: Mode,
    /// Units left to sell, for a room that counts its stock.
    pub stock: Option<u64>,
    /// While the room has not opened yet.
    pub opens_at: Option<Timestamp>,
    /// For an admitted ticket: when the pass lapses without activity.
    pub pass_expires_at: Option<Timestamp>,
    /// When this status was computed.
    pub updated_at: Timestamp,
}

impl From<&TicketStatus> for StatusBody {
    fn from(t: &TicketStatus) -> Self {
        Self {
            status: t.status(),
            lane: None,
            number: t.number,
            position: t.position,
            ahead: t.ahead,
            eta_seconds: t.eta.map(|e| e.expected_secs),
            eta_low_seconds: t.eta.map(|e| e.low_secs),
            eta_high_seconds: t.eta.map(|e| e.high_secs),
            progress: (t.progress * 1000.0).round() / 1000.0,
            queue_length: t.queue_length,
            paused: t.paused,
            mode: t.mode,
            stock: t.stock,
            opens_at: t.opens_at,
            pass_expires_at: t.pass_expires_at,
            updated_at: t.at,
        }
    }
}

impl StatusBody {
    /// The wire form, naming the ticket's lane (`None` for a room without
    /// lanes).
    pub(crate) fn named(t: &TicketStatus, lane: Option<&str>) -> Self {
        Self {
            lane: lane.map(str::to_owned),
            ..Self::from(t)
        }
    }
}

impl Serialize for TicketStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        StatusBody::from(self).serialize(s)
    }
}

/// A ticket's status at `now`. `ahead` is the count of tickets still
/// waiting ahead of it (meaningful only while it waits and is placed),
/// already kept from going up by whoever counted it.
pub(crate) fn ticket_status(
    t: &TicketFacts,
    ahead: Option<u64>,
    room: &RoomFacts,
    now: u64,
) -> TicketStatus {
    let mut status = TicketStatus {
        id: t.id,
        state: t.state,
        lane: t.lane,
        number: t.index.map(|i| i + 1),
        position: None,
        ahead: None,
        eta: None,
        progress: 0.0,
        queue_length: room.waiting,
        paused: room.paused,
        closed: room.closed || room.mode.closes(),
        mode: room.mode,
        stock: room.stock,
        joined_at: Timestamp(t.joined_at),
        admitted_at: None,
        pass_expires_at: None,
        opens_at: room.opens_at.filter(|_| !room.open).map(Timestamp),
        at: Timestamp(now),
    };
    match t.state {
        TicketState::Waiting => {
            if let (Some(_), Some(ahead)) = (t.index, ahead) {
                let position = ahead + 1;
                status.position = Some(position);
                status.ahead = Some(ahead);
                status.progress = progress(ahead, t.initial_ahead);
                // A lane gets its share of the room's admissions: its
                // place in its line counts for more of the room's.
                let share = room.lanes.share(t.lane);
                let room_position = (position as f64 / share).ceil() as u64;
                status.eta = eta(room_position.max(position), room);
            }
        }
        TicketState::Admitted => {
            status.progress = 1.0;
            status.admitted_at = Some(Timestamp(t.admitted_at));
            status.pass_expires_at = Some(Timestamp(room.timeouts.deadline(
                t.arrived,
                t.admitted_at,
                t.last_seen,
            )));
        }
        _ => {}
    }
    status
}

/// How far along the line a ticket is: the share of those ahead at its
/// placement who are gone.
pub(crate) fn progress(ahead: u64, initial_ahead: u64) -> f64 {
    if initial_ahead == 0 {
        1.0
    } else {
        1.0 - (ahead.min(initial_ahead) as f64 / initial_ahead as f64)
    }
}

/// The wait for the ticket at `position`, or `None` while nobody is being
/// admitted (closed, paused, not open yet, a mode that admits nobody) or nothing was admitted lately
/// to estimate from.
pub(crate) fn eta(position: u64, room: &RoomFacts) -> Option<Eta> {
    if !room.open || room.paused || room.closed || !room.mode.admits() {
        return None;
    }
    if position <= room.free_permits {
        // Permits are free: the next tick takes them.
        let tick = room.tick_ms.div_ceil(1000);
        return Some(Eta {
            low_secs: 0,
            expected_secs: tick,
            high_secs: tick,
        });
    }
    room.rate.eta(position).map(|(low, expected, high)| Eta {
        low_secs: low,
        expected_secs: expected,
        high_secs: high,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_room() -> RoomFacts {
        RoomFacts {
            open: true,
            waiting: 12,
            tick_ms: 1_000,
            rate: AdmissionRate {
                mean: 2.5,
                variance: 0.0,
                primed: true,
            },
            timeouts: PassTimeouts {
                pass_idle_ms: 300_000,
                arrival_grace_ms: 60_000,
            },
            ..RoomFacts::default()
        }
    }

    fn waiting(index: u64, initial_ahead: u64) -> TicketFacts {
        TicketFacts {
            id: 3,
            index: Some(index),
            initial_ahead,
            joined_at: 1_000,
            ..TicketFacts::default()
        }
    }

    #[test]
    fn a_waiting_ticket_shows_its_place_progress_and_wait() {
        let s = ticket_status(&waiting(4, 8), Some(4), &open_room(), 9_000);
        assert_eq!(s.status(), Status::Waiting);
        assert_eq!((s.number, s.position, s.ahead), (Some(5), Some(5), Some(4)));
        assert!((s.progress - 0.5).abs() < 1e-9);
        assert_eq!(s.queue_length, 12);
        // 5 at 2.5 a second.
        assert_eq!(s.eta.map(|e| e.expected_secs), Some(2));
        assert_eq!(s.at, Timestamp(9_000));
        // With free permits in the worker's hand, the next tick takes it.
        let room = RoomFacts {
            free_permits: 3,
            ..open_room()
        };
        let s = ticket_status(&waiting(1, 1), Some(1), &room, 9_000);
        assert_eq!(
            s.eta,
            Some(Eta {
                low_secs: 0,
                expected_secs: 1,
                high_secs: 1
            })
        );
    }

    #[test]
    fn before_opening_there_is_no_place_and_no_estimate() {
        let room = RoomFacts {
            open: false,
            opens_at: Some(50_000),
            ..open_room()
        };
        let pre = TicketFacts {
            index: None,
            ..waiting(0, 0)
        };
        let s = ticket_status(&pre, None, &room, 1_000);
        assert_eq!((s.number, s.position, s.eta), (None, None, None));
        assert_eq!(s.opens_at, Some(Timestamp(50_000)));
        // Once open, the opening time is no longer news.
        let s = ticket_status(&waiting(0, 0), Some(0), &open_room(), 1_000);
        assert_eq!(s.opens_at, None);
    }

    #[test]
    fn an_admitted_ticket_carries_its_pass() {
        let t = TicketFacts {
            state: TicketState::Admitted,
            admitted_at: 2_000,
            last_seen: 5_000,
            ..waiting(0, 0)
        };
        let s = ticket_status(&t, None, &open_room(), 6_000);
        assert_eq!(s.position, None);
        assert!((s.progress - 1.0).abs() < 1e-9);
        assert_eq!(s.admitted_at, Some(Timestamp(2_000)));
        // Not arrived: the grace after admission.
        assert_eq!(s.pass_expires_at, Some(Timestamp(62_000)));
        let arrived = TicketFacts { arrived: true, ..t };
        let s = ticket_status(&arrived, None, &open_room(), 6_000);
        assert_eq!(s.pass_expires_at, Some(Timestamp(305_000)));
    }

    #[test]
    fn deadlines_and_cutoffs_are_one_rule() {
        let timeouts = open_room().timeouts;
        for (arrived, admitted_at, last_seen) in [(false, 1_000, 1_000), (true, 1_000, 90_000)] {
            let deadline = timeouts.deadline(arrived, admitted_at, last_seen);
            for now in [deadline - 1, deadline, deadline + 1] {
                let c = timeouts.cutoffs(now);
                let lapsed = if arrived {
                    last_seen < c.idle_before
                } else {
                    admitted_at < c.unarrived_before
                };
                assert_eq!(lapsed, deadline < now, "now {now}, deadline {deadline}");
            }
        }
    }

    #[test]
    fn the_wire_form_is_the_api_s() {
        let mut s = ticket_status(&waiting(4, 8), Some(4), &open_room(), 1_796_086_800_000);
        s.progress = 0.123_456;
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "status": "waiting", "number": 5, "position": 5, "ahead": 4,
                "eta_seconds": 2, "eta_low_seconds": 2, "eta_high_seconds": 2,
                "progress": 0.123, "queue_length": 12, "paused": false,
                "mode": "queue", "stock": null, "opens_at": null, "pass_expires_at": null,
                "updated_at": "2026-12-01T01:00:00Z"
            })
        );
    }

    #[test]
    fn only_visible_changes_count_as_changes() {
        let a = ticket_status(&waiting(4, 8), Some(4), &open_room(), 1_000);
        let later = TicketStatus {
            at: Timestamp(2_000),
            progress: 0.9,
            ..a.clone()
        };
        assert!(a.shows_same_as(&later));
        let closer = ticket_status(&waiting(4, 8), Some(3), &open_room(), 1_000);
        assert!(!a.shows_same_as(&closer));
    }
}
