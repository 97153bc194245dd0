//! Each backend operation as calls into one room's engine, written once for
//! every deployment: the embedded backend makes them on its rooms, a room's
//! owner on Redis makes them on the room it owns (for its own requests and
//! for the commands other instances send it).
//!
//! A call changes the engine and says which of the room's records its
//! caller must wait for before answering (the engine reports each change
//! on the thread that made it, so [`journal::recording`] names exactly this
//! call's records); waiting is the caller's part, since a journal and a
//! room's log are made durable differently.

use super::join_log::JoinLog;
use super::journal;
use super::spent::SpentNonces;
use super::{
    BackendError, Ending, JoinRequest, RoomSnapshot, StreamsHeard, StreamsReport, TicketRef,
};
use crate::engine::{
    Callback, Departure, JoinError, Joined, Room, StreamReport, SubscribeError, TicketId,
    TicketState,
};

/// What a join did, and the record to wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JoinDone {
    pub(crate) ticket: TicketId,
    pub(crate) is_new: bool,
    /// Wait until this record is durable (0: nothing to wait for).
    pub(crate) wait_for: u64,
}

/// The join procedure's order of checks: a carried live ticket answers
/// itself; then closed, sold out, the access rules, the join limit, the
/// proof-of-work nonce, and the engine's join. `appended` is the number of
/// the last record the room's log holds so far: a repeated join waits for
/// it, since the ticket it answers may be another request's, still on its
/// way to the log.
pub(crate) fn join(
    room: &Room,
    request: &JoinRequest,
    joins: &JoinLog,
    spent: &SpentNonces,
    appended: impl Fn() -> u64,
) -> Result<JoinDone, BackendError> {
    let id = room.id();
    // A ticket of a line that was reset is answered as such, like an ended
    // one, unless a new ticket is asked for.
    if let Some(held) = request.held
        && held.epoch != room.epoch()
        && !request.replace_ended
    {
        return Err(BackendError::LineReset);
    }
    if let Some(held) = request.held
        && let Ok(ticket) = ticket(room, held)
    {
        room.touch(ticket);
        let state = room.state_of(ticket);
        if state.is_some_and(TicketState::is_live) || !request.replace_ended {
            return Ok(JoinDone {
                ticket,
                is_new: false,
                wait_for: appended(),
            });
        }
    }
    if room.is_closed() {
        return Err(BackendError::Closed(id.clone()));
    }
    // Sold out comes before the access rules and the join limit: nobody
    // gets in, so nobody need be told to slow down or to solve a challenge
    // first.
    if room.mode().closes() {
        return Err(BackendError::SoldOut(id.clone()));
    }
    let known = request
        .identity
        .and_then(|i| room.ticket_bound(i, request.binding));
    if known.is_none() && request.refuse_new {
        return Err(BackendError::AccessDenied);
    }
    let limit = match (known, request.client) {
        (None, Some(client)) => Some((client, room.settings().join_limit_per_minute)),
        _ => None,
    };
    // A new ticket spends the join's proof-of-work nonce first, so a
    // solution replayed at the same moment makes no second ticket.
    let now = room.now_ms();
    let issue = || {
        if known.is_none()
            && let Some(spend) = request.nonce
            && !spent.spend(spend.nonce, spend.until_ms, now)
        {
            return Err(BackendError::NonceSpent);
        }
        room.join_bound(request.identity, request.lane, request.binding)
            .map_err(|e| match e {
                JoinError::Closed => BackendError::Closed(id.clone()),
                JoinError::Full => BackendError::Full(id.clone()),
                JoinError::SoldOut => BackendError::SoldOut(id.clone()),
            })
    };
    let (joined, recorded) = journal::recording(|| match limit {
        Some((client, limit)) => joins
            .admit(id, client, limit, now, issue)
            .map_err(|retry_after| BackendError::JoinLimited { limit, retry_after }),
        None => Ok(issue()),
    });
    let Joined { ticket, is_new, .. } = joined??;
    Ok(JoinDone {
        ticket,
        is_new,
        wait_for: if is_new { recorded } else { appended() },
    })
}

/// The engine's ticket id, if the ticket is of this incarnation (else its
/// line was reset) and was ever issued.
pub(crate) fn ticket(room: &Room, t: TicketRef) -> Result<TicketId, BackendError> {
    let ticket = TicketId::try_from(t.id).map_err(|_| BackendError::NoSuchTicket)?;
    // Not `ticket >= room.issued()`: the count lags a push that finished
    // while an earlier slot is still being written, so a ticket just
    // issued could read as unknown.
    if t.epoch != room.epoch() {
        return Err(BackendError::LineReset);
    }
    if room.state_of(ticket).is_none() {
        return Err(BackendError::NoSuchTicket);
    }
    Ok(ticket)
}

/// Give a ticket up; the record to wait for.
pub(crate) fn depart(
    room: &Room,
    t: TicketRef,
    how: Ending,
) -> Result<(Departure, u64), BackendError> {
    let ticket = ticket(room, t)?;
    Ok(journal::recording(|| match how {
        Ending::Leave => room.leave(ticket),
        Ending::Release => room.release(ticket),
        Ending::Revoke => room.revoke(ticket),
    }))
}

/// Keep a ticket's callback; the record to wait for.
pub(crate) fn subscribe(
    room: &Room,
    t: TicketRef,
    callback: Callback,
) -> Result<u64, BackendError> {
    let ticket = ticket(room, t)?;
    let (done, recorded) = journal::recording(|| room.subscribe(ticket, callback));
    done.map_err(|SubscribeError::NotWaiting(state)| BackendError::NotWaiting(state))?;
    Ok(recorded)
}

/// Forget a ticket's callback: whether it had one, and the record to wait
/// for.
pub(crate) fn unsubscribe(room: &Room, t: TicketRef) -> Result<(bool, u64), BackendError> {
    let ticket = ticket(room, t)?;
    Ok(journal::recording(|| room.unsubscribe(ticket)))
}

/// Hear an instance's report of the streams it holds.
pub(crate) fn hold_streams(room: &Room, report: &StreamsReport) -> StreamsHeard {
    let epoch = room.epoch();
    let ids = |tickets: &[TicketRef]| -> Vec<TicketId> {
        tickets
            .iter()
            .filter(|t| t.epoch == epoch)
            .filter_map(|t| TicketId::try_from(t.id).ok())
            .filter(|&t| room.state_of(t).is_some())
            .collect()
    };
    let generation = room.hold_streams(&StreamReport {
        holder: report.holder,
        full: report.full,
        opened: ids(&report.opened),
        closed: ids(&report.closed),
    });
    StreamsHeard {
        away_grace: room.settings().away_grace,
        generation,
    }
}

/// Everything an operator sees of a room.
pub(crate) fn snapshot(room: &Room) -> RoomSnapshot {
    // The published view changes only on ticks and operators' actions;
    // operators want the line's length as of now.
    let mut view = room.view();
    view.waiting = room.waiting_count();
    view.admitted = room.admitted_count();
    view.lanes = room.lane_views();
    RoomSnapshot {
        settings: room.settings(),
        epoch: room.epoch(),
        view,
        stats: room.stats(),
        ledger: room.ledger(),
        subscriptions: room.callback_count() as u64,
    }
}
