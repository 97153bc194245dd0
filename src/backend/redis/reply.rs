//! The scripts' answers. Each script returns one cjson-encoded object of
//! named fields (`lib.lua`'s `reply`); this decodes it into typed Rust. The
//! rules applied to what comes back (a status, a view, a rate, the join
//! limit's answer) are `crate::engine::rules`, as for the embedded engine.

use std::collections::HashMap;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer};

use crate::backend::BackendError;
use crate::engine::rules::{
    self, AdmissionRate, Mode, PassTimeouts, PresenceTimeouts, TicketFacts,
};
use crate::engine::{LaneView, RoomSettings, RoomView, TicketState};

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Decode a script's answer.
pub fn decode<T: DeserializeOwned>(raw: &str) -> Result<T, BackendError> {
    serde_json::from_str(raw).map_err(|e| {
        tracing::warn!(error = %e, "a Redis script answered in an unexpected shape");
        BackendError::Unavailable("unexpected reply from Redis".into())
    })
}

/// cjson writes an empty Lua table as `{}`, whatever it was meant to be:
/// a list that may be empty takes either.
pub fn list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrEmpty<T> {
        List(Vec<T>),
        Empty(HashMap<String, ()>),
    }
    match ListOrEmpty::deserialize(d)? {
        ListOrEmpty::List(v) => Ok(v),
        ListOrEmpty::Empty(m) if m.is_empty() => Ok(Vec::new()),
        ListOrEmpty::Empty(_) => Err(de::Error::custom("expected a list")),
    }
}

/// One ticket as a script reports it (`lib.lua`'s `facts`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
pub struct Facts {
    pub id: u64,
    /// State code.
    s: u8,
    /// Queue index; absent before the opening draw.
    q: Option<u64>,
    j: u64,
    a: u64,
    l: u64,
    v: bool,
    i: u64,
    /// Tickets still waiting ahead (never more than shown before).
    h: Option<u64>,
    /// The ticket's lane; absent for a room without lanes.
    #[serde(default, rename = "ln")]
    lane: u8,
}

impl Facts {
    pub fn ticket(&self) -> TicketFacts {
        TicketFacts {
            id: self.id,
            state: TicketState::from_code(self.s).unwrap_or(TicketState::Abandoned),
            index: self.q,
            initial_ahead: self.i,
            joined_at: self.j,
            admitted_at: self.a,
            last_seen: self.l,
            arrived: self.v,
            lane: self.lane,
        }
    }

    pub fn ahead(&self) -> Option<u64> {
        self.h
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "r", rename_all = "lowercase")]
pub enum Join {
    Ok {
        id: u64,
        new: bool,
        epoch: String,
        t: Facts,
        /// Tickets waiting in the room.
        w: u64,
    },
    Limited {
        /// Joins of the address in the window.
        n: u64,
        oldest: u64,
        limit: u32,
    },
    /// A new ticket needs what the join lacks (`JoinRequest::refuse_new`).
    Denied,
    /// The join's proof-of-work nonce was spent before.
    Spent,
    Closed,
    /// The room is sold out (`rules::Mode::SoldOut`).
    SoldOut,
    Full,
    NoRoom,
    /// The carried ticket names another incarnation of the room, and no
    /// new ticket was asked for.
    Reset,
}

/// One ticket of a batched status read: its facts, or unknown (`{x = 'noticket'}`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneStatus {
    Known(Facts),
    Unknown(de::IgnoredAny),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "r", rename_all = "lowercase")]
pub enum Status {
    Ok {
        w: u64,
        #[serde(deserialize_with = "list")]
        t: Vec<OneStatus>,
    },
    NoRoom,
}

/// The room's timeouts, when those a caller computed its cutoffs with were
/// not the room's.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct Timeouts {
    pub queue_idle_ms: u64,
    pub pass_idle_ms: u64,
    pub arrival_grace_ms: u64,
    /// 0 for a room stored before presence existed.
    #[serde(default)]
    pub away_grace_ms: u64,
}

impl Timeouts {
    /// What the head judges presence by; a room without a stored grace has
    /// the default one.
    pub fn presence(&self) -> PresenceTimeouts {
        let away_grace_ms = match self.away_grace_ms {
            0 => millis(RoomSettings::DEFAULT_AWAY_GRACE),
            ms => ms,
        };
        PresenceTimeouts {
            away_grace_ms,
            queue_idle_ms: self.queue_idle_ms,
        }
    }

    /// The away cutoff at `now`, and the grace as the room stores it (for
    /// the script's check that the two agree).
    pub fn away_args(&self, now: u64) -> [String; 2] {
        [
            rules::away_cutoff(now, self.presence().away_grace_ms).to_string(),
            self.away_grace_ms.to_string(),
        ]
    }

    pub fn pass(&self) -> PassTimeouts {
        PassTimeouts {
            pass_idle_ms: self.pass_idle_ms,
            arrival_grace_ms: self.arrival_grace_ms,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "r", rename_all = "lowercase")]
pub enum Presence {
    Ok { away_grace_ms: u64 },
    NoRoom,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "r", rename_all = "lowercase")]
pub enum Depart {
    Left,
    /// Handed `to` the next ticket, `retired` to pay capacity debt, or
    /// (neither) put on the tray.
    Gave {
        to: Option<u64>,
        #[serde(default)]
        retired: bool,
    },
    Nothing {
        s: u8,
    },
    NoTicket,
    NoRoom,
    Stale(Timeouts),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "r", rename_all = "lowercase")]
pub enum Tick {
    Ok {
        tick_ms: u64,
        #[serde(default)]
        closed: bool,
        #[serde(default)]
        from_tray: u64,
        #[serde(default)]
        abandoned: u64,
        #[serde(default, deserialize_with = "list")]
        admitted: Vec<u64>,
        #[serde(default, deserialize_with = "list")]
        expired: Vec<u64>,
        #[serde(default)]
        total: u64,
        #[serde(default)]
        prev_total: u64,
        #[serde(default)]
        prev_at: u64,
        view: Option<ViewFields>,
    },
    NotOwner,
    #[serde(rename = "open_needed")]
    OpenNeeded,
    NoRoom,
    Stale(Timeouts),
}

/// What an operator's script (and the tick) answer: the room as stored, to
/// publish a view of.
#[derive(Debug, Deserialize)]
#[serde(tag = "r", rename_all = "lowercase")]
pub enum Changed {
    Ok { view: ViewFields },
    Created { view: ViewFields },
    Exists { epoch: String },
    Already,
    Closed,
    NoRoom,
}

/// `purchase.lua`'s answer.
#[derive(Debug, Deserialize)]
#[serde(tag = "r", rename_all = "lowercase")]
pub enum Purchase {
    Ok {
        left: u64,
        before: String,
        mode: String,
        sold_out_now: bool,
        view: ViewFields,
    },
    NoStock,
    NoRoom,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "r", rename_all = "lowercase")]
pub enum Publish {
    Published { version: u64 },
    Same,
    Superseded,
    NotOwner,
    NoRoom,
}

/// The room's stored fields a view is made of (`lib.lua`'s `view_fields`),
/// as Redis keeps them: text.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(transparent)]
pub struct ViewFields(pub HashMap<String, String>);

impl ViewFields {
    pub fn num(&self, field: &str) -> u64 {
        self.0.get(field).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    fn float(&self, field: &str) -> f64 {
        self.0
            .get(field)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    fn text(&self, field: &str) -> Option<String> {
        self.0.get(field).filter(|v| !v.is_empty()).cloned()
    }

    pub fn epoch(&self) -> Option<u64> {
        self.0.get("epoch")?.parse().ok()
    }

    /// The change this reflects; views are ordered by it.
    pub fn change(&self) -> u64 {
        self.num("chg")
    }

    pub fn rate(&self) -> AdmissionRate {
        AdmissionRate {
            mean: self.float("rate_mean"),
            variance: self.float("rate_var"),
            primed: self.num("rate_primed") == 1,
        }
    }

    /// Each lane's name, weight and counts; none for a room without lanes.
    fn lanes(&self) -> Vec<LaneView> {
        (0..self.num("lanes"))
            .map(|l| LaneView {
                name: self
                    .0
                    .get(&format!("lane_n{l}"))
                    .cloned()
                    .unwrap_or_default(),
                weight: u32::try_from(self.num(&format!("lane_w{l}"))).unwrap_or(u32::MAX),
                waiting: self.num(&format!("lw{l}")),
                admitted: self.num(&format!("la{l}")),
            })
            .collect()
    }

    /// The room view these fields describe (version and time left for the
    /// publisher).
    pub fn view(&self) -> RoomView {
        let open = self.num("open") == 1;
        RoomView {
            version: 0,
            at_ms: 0,
            capacity: u32::try_from(self.num("capacity")).unwrap_or(u32::MAX),
            waiting: self.num("waiting"),
            admitted: self.num("admitted"),
            held: self.num("hand"),
            tray: self.num("tray"),
            debt: self.num("debt"),
            paused: self.num("paused") == 1,
            open,
            closed: self.num("closed") == 1,
            mode: self
                .0
                .get("mode")
                .and_then(|m| Mode::from_name(m))
                .unwrap_or_default(),
            stock: self.text("stock").and_then(|v| v.parse().ok()),
            opens_at: self.text("opens_at").and_then(|v| v.parse().ok()),
            lottery_commitment: self.text("commitment"),
            lottery_seed: self.text("seed").filter(|_| open),
            rate: self.rate(),
            admissions_total: self.num("c_admissions"),
            tick_ms: self.num("tick_ms"),
            lanes: self.lanes(),
            timeouts: PassTimeouts {
                pass_idle_ms: self.num("pass_idle_ms"),
                arrival_grace_ms: self.num("arrival_grace_ms"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_decode_by_name() {
        let j: Join = decode(
            r#"{"r":"ok","id":3,"new":true,"epoch":"123456789012345678","t":{"id":3,"s":0,"q":3,"j":1800000000000,"a":0,"l":1800000000000,"v":false,"i":2,"h":2},"w":3}"#,
        )
        .unwrap();
        let Join::Ok { t, epoch, w, .. } = j else {
            panic!("{j:?}")
        };
        assert_eq!(epoch, "123456789012345678");
        assert_eq!((t.ticket().index, t.ahead(), w), (Some(3), Some(2), 3));
        // An empty Lua table is `{}`, even for a list.
        let s: Status = decode(r#"{"r":"ok","w":0,"t":{}}"#).unwrap();
        assert!(matches!(s, Status::Ok { t, .. } if t.is_empty()));
        let s: Status = decode(r#"{"r":"ok","w":0,"t":[{"x":"noticket"}]}"#).unwrap();
        assert!(matches!(&s, Status::Ok { t, .. } if matches!(t[0], OneStatus::Unknown(_))));
        let d: Depart = decode(r#"{"r":"gave","to":7}"#).unwrap();
        assert!(matches!(d, Depart::Gave { to: Some(7), .. }));
        let d: Depart =
            decode(r#"{"r":"stale","queue_idle_ms":1,"pass_idle_ms":2,"arrival_grace_ms":3}"#)
                .unwrap();
        assert!(matches!(d, Depart::Stale(t) if t.pass_idle_ms == 2));
        assert!(decode::<Depart>(r#"{"r":"what"}"#).is_err());
        let t: Tick = decode(r#"{"r":"ok","closed":true,"tick_ms":1000}"#).unwrap();
        assert!(matches!(t, Tick::Ok { closed: true, .. }));
    }

    #[test]
    fn stored_fields_make_a_view() {
        let fields: ViewFields = decode(
            r#"{"capacity":"5","waiting":"3","open":"1","opens_at":"","seed":"ab","rate_mean":"2.5","rate_primed":"1","tick_ms":"1000","chg":"9","epoch":"77"}"#,
        )
        .unwrap();
        let v = fields.view();
        assert_eq!(
            (v.capacity, v.waiting, v.open, v.opens_at),
            (5, 3, true, None)
        );
        assert_eq!(v.lottery_seed.as_deref(), Some("ab"));
        assert!(v.rate.primed && (v.rate.mean - 2.5).abs() < 1e-9);
        assert_eq!((fields.change(), fields.epoch()), (9, Some(77)));
    }
}
