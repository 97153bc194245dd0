//! The room's change log as its followers read it: one Redis Stream per
//! room (`narabu:{room}:log`), one entry per script call that changed what
//! positions or streams depend on (`lib.lua`'s `reply` appends it in the
//! same atomic step), each with the next `seq` so a gap shows.
//!
//! An entry holds one of: `e`, the events of one script call (a JSON
//! array, see [`Event`]); `v`, a published room view (`<version> <json>`);
//! `n`, the epoch of a new incarnation of the room.

use std::collections::HashMap;

use serde_json::Value as Json;

use crate::engine::{RoomView, TicketState};

/// What the head did with the ticket it took (a pop's outcome).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Admitted,
    /// Skipped while absent; it keeps its number and may come back.
    Away,
    /// Abandoned (quiet past `queue_idle`).
    Gone,
}

/// One change to a lane's line, or to a ticket out of it.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The head took `qi` (from the back set, if it was there).
    Pop {
        lane: u8,
        qi: u32,
        id: u64,
        outcome: Outcome,
    },
    /// A waiting ticket left the line; `qi` is `None` for one that never
    /// had a place (it left the pre-queue).
    Dep {
        lane: u8,
        qi: Option<u32>,
        id: u64,
        state: Option<TicketState>,
    },
    /// A skipped ticket came back.
    Back { lane: u8, qi: u32, id: u64 },
    /// A ticket out of the line ended (an admitted one released, expired…).
    End { id: u64, state: Option<TicketState> },
    /// The opening placed the pre-queue.
    Open,
}

impl Event {
    /// The ticket this event is news to, if any.
    pub fn ticket(&self) -> Option<u64> {
        match self {
            Self::Pop { id, .. } | Self::Dep { id, .. } | Self::Back { id, .. } => Some(*id),
            Self::End { id, .. } => Some(*id),
            Self::Open => None,
        }
    }

    fn parse(v: &Json) -> Option<Self> {
        let a = v.as_array()?;
        let num = |i: usize| a.get(i).and_then(Json::as_i64);
        let lane = u8::try_from(num(1)?).ok()?;
        let qi = || u32::try_from(num(2)?).ok();
        let id = || u64::try_from(num(3)?).ok();
        let state = || {
            num(4)
                .and_then(|c| u8::try_from(c).ok())
                .and_then(TicketState::from_code)
        };
        Some(match a.first()?.as_str()? {
            "p" => Self::Pop {
                lane,
                qi: qi()?,
                id: id()?,
                outcome: match a.get(4)?.as_str()? {
                    "adm" => Outcome::Admitted,
                    "away" => Outcome::Away,
                    _ => Outcome::Gone,
                },
            },
            "d" => Self::Dep {
                lane,
                qi: qi(),
                id: id()?,
                state: state(),
            },
            "b" => Self::Back {
                lane,
                qi: qi()?,
                id: id()?,
            },
            "e" => Self::End {
                id: id()?,
                state: state(),
            },
            "o" => Self::Open,
            _ => return None,
        })
    }
}

/// What one log entry says.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Events(Vec<Event>),
    View(Box<RoomView>),
    Epoch(u64),
    /// Something this version cannot read (a newer instance wrote it):
    /// the follower reloads the line from a snapshot rather than guess.
    Unknown,
}

/// One entry: its seq and what it says.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub seq: u64,
    pub change: Change,
}

impl Entry {
    /// An entry from its fields as Redis returns them; `None` without a
    /// readable seq.
    pub fn parse(fields: &HashMap<String, redis::Value>) -> Option<Self> {
        let text = |k: &str| -> Option<String> { redis::from_redis_value_ref(fields.get(k)?).ok() };
        let seq = text("s")?.parse().ok()?;
        let change = Self::change(text("e"), text("v"), text("n")).unwrap_or(Change::Unknown);
        Some(Self { seq, change })
    }

    fn change(
        events: Option<String>,
        view: Option<String>,
        epoch: Option<String>,
    ) -> Option<Change> {
        if let Some(events) = events {
            let list: Json = serde_json::from_str(&events).ok()?;
            let list = list.as_array()?;
            let events: Vec<Event> = list.iter().filter_map(Event::parse).collect();
            // An event this version cannot read could move positions.
            return (events.len() == list.len()).then_some(Change::Events(events));
        }
        if let Some(view) = view {
            let (version, json) = view.split_once(' ')?;
            let mut view: RoomView = serde_json::from_str(json).ok()?;
            view.version = version.parse().ok()?;
            return Some(Change::View(Box::new(view)));
        }
        Some(Change::Epoch(epoch?.parse().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, redis::Value> {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    redis::Value::BulkString(v.as_bytes().to_vec()),
                )
            })
            .collect()
    }

    #[test]
    fn entries_parse_by_kind() {
        let e = Entry::parse(&fields(&[
            ("s", "12"),
            (
                "e",
                r#"[["p",0,5,5,"adm"],["d",0,-1,9,5],["d",0,7,7,6],["b",0,2,2],["e",0,4,4,3],["o",0,10,12]]"#,
            ),
        ]))
        .unwrap();
        assert_eq!(e.seq, 12);
        let Change::Events(events) = e.change else {
            panic!("{e:?}")
        };
        assert_eq!(events.len(), 6);
        assert_eq!(
            events[0],
            Event::Pop {
                lane: 0,
                qi: 5,
                id: 5,
                outcome: Outcome::Admitted
            }
        );
        assert!(matches!(
            events[1],
            Event::Dep {
                qi: None,
                id: 9,
                ..
            }
        ));
        assert!(matches!(events[2], Event::Dep { qi: Some(7), .. }));
        assert_eq!(events[3].ticket(), Some(2));
        assert!(matches!(events[4], Event::End { id: 4, .. }));
        assert_eq!(events[5], Event::Open);
        let view = serde_json::to_string(&RoomView {
            waiting: 3,
            ..RoomView::default()
        })
        .unwrap();
        let v = Entry::parse(&fields(&[("s", "13"), ("v", &format!("4 {view}"))])).unwrap();
        assert!(matches!(v.change, Change::View(ref v) if v.version == 4 && v.waiting == 3));
        let n = Entry::parse(&fields(&[("s", "14"), ("n", "77")])).unwrap();
        assert_eq!(n.change, Change::Epoch(77));
        for unreadable in [("x", "1"), ("e", r#"[["z",0]]"#), ("v", "{}")] {
            assert_eq!(
                Entry::parse(&fields(&[("s", "15"), unreadable])).map(|e| e.change),
                Some(Change::Unknown)
            );
        }
        assert_eq!(Entry::parse(&fields(&[("e", "[]")])), None);
    }
}
