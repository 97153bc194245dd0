//! A ticket's life as codes and names: the engine's states, the numbers
//! stores keep them as, and what a visitor is told.

use serde::{Deserialize, Serialize};

/// Where a ticket is in its life. Only `Waiting` and `Admitted` are live.
/// The discriminants are the codes stores keep (the engine's atomics, the
/// Redis ticket records); [`TicketState::ALL`] is the table both read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum TicketState {
    /// In the queue (or the pre-queue, before opening).
    #[default]
    Waiting = 0,
    /// Holds a permit.
    Admitted = 1,
    /// Gave its permit back (finished, or left after admission).
    Released = 2,
    /// An operator took its permit or place away.
    Revoked = 3,
    /// Held a permit but went idle past `pass_idle`, or never arrived within
    /// `arrival_grace`: the worker took the permit back.
    Expired = 4,
    /// Left the queue before being admitted.
    Left = 5,
    /// Went quiet in the queue past `queue_idle`; skipped when reached.
    Abandoned = 6,
    /// Skipped at the head while its visitor was absent (no live stream,
    /// nothing heard for `away_grace`). Keeps its number; its visitor's
    /// return puts it ahead of the line again, `queue_idle` of quiet
    /// abandons it.
    Away = 7,
}

impl TicketState {
    /// Every state, in code order.
    pub(crate) const ALL: [TicketState; 8] = [
        Self::Waiting,
        Self::Admitted,
        Self::Released,
        Self::Revoked,
        Self::Expired,
        Self::Left,
        Self::Abandoned,
        Self::Away,
    ];

    /// The number a store keeps this state as.
    pub(crate) const fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code)).copied()
    }

    /// The operator's name for the state (logs, the admin API).
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Admitted => "admitted",
            Self::Released => "released",
            Self::Revoked => "revoked",
            Self::Expired => "expired",
            Self::Left => "left",
            Self::Abandoned => "abandoned",
            Self::Away => "away",
        }
    }

    /// Holds a place or a permit (an away ticket still holds its place).
    pub fn is_live(self) -> bool {
        matches!(self, Self::Waiting | Self::Admitted | Self::Away)
    }

    /// Waiting for a permit, in the line or skipped while away.
    pub(crate) fn is_queued(self) -> bool {
        matches!(self, Self::Waiting | Self::Away)
    }
}

/// What a ticket's holder is told: the API's `status`, the event names of
/// the stream and the page shown. Coarser than [`TicketState`]: a visitor
/// need not know whether an operator or the worker ended the wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Waiting,
    Admitted,
    /// Ended without the visitor leaving: revoked, expired or abandoned.
    Expired,
    /// The visitor left the line or gave the permit back.
    Left,
    /// The room closed while the ticket was live.
    Closed,
}

impl Status {
    /// A ticket's status; a closed room overrides a live state.
    pub(crate) fn of(state: TicketState, room_closed: bool) -> Self {
        if room_closed && state.is_live() {
            return Self::Closed;
        }
        match state {
            // Away is the store's business: its visitor, back, waits again.
            TicketState::Waiting | TicketState::Away => Self::Waiting,
            TicketState::Admitted => Self::Admitted,
            TicketState::Released | TicketState::Left => Self::Left,
            TicketState::Revoked | TicketState::Expired | TicketState::Abandoned => Self::Expired,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Admitted => "admitted",
            Self::Expired => "expired",
            Self::Left => "left",
            Self::Closed => "closed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_names_match_serde() {
        for s in TicketState::ALL {
            assert_eq!(TicketState::from_code(s.code()), Some(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::json!(s.name())
            );
        }
        assert_eq!(TicketState::from_code(8), None);
    }

    #[test]
    fn a_closed_room_shows_closed_only_to_live_tickets() {
        assert_eq!(Status::of(TicketState::Waiting, true), Status::Closed);
        assert_eq!(Status::of(TicketState::Admitted, true), Status::Closed);
        assert_eq!(Status::of(TicketState::Left, true), Status::Left);
        assert_eq!(Status::of(TicketState::Abandoned, false), Status::Expired);
        assert_eq!(Status::of(TicketState::Released, false), Status::Left);
        for s in [Status::Waiting, Status::Closed, Status::Left] {
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::json!(s.name())
            );
        }
    }
}
