//! The bytes of an event stream, written without serde or axum's `Event`
//! on the hot path: a wave sends the same room figures to thousands of
//! streams, so what they share (the line's length, the mode, the time) is
//! encoded once per wave ([`Tail`]) and each stream's own numbers are
//! spliced in front of it.
//!
//! The `position` event's data is the same JSON object the `status`
//! answer sends (`StatusBody`); a test holds the two to the same value.

use serde::Serialize;

use crate::engine::rules::Mode;
use crate::engine::{Status, TicketStatus, Timestamp};

/// The `id:` of an event that ends the stream.
pub(crate) const END_ID: &str = "end";
/// What a browser waits before reconnecting a dropped stream, in ms.
pub(crate) const RETRY_MS: u64 = 3_000;
/// A keep-alive comment.
pub(crate) const KEEP_ALIVE: &[u8] = b":keep-alive\n\n";

/// The fields every waiting ticket of a room shows alike at one moment,
/// encoded once: the end of a `position` event's data.
#[derive(Default)]
pub(crate) struct Tail {
    key: Option<TailKey>,
    bytes: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Serialize)]
struct TailKey {
    queue_length: u64,
    paused: bool,
    mode: Mode,
    stock: Option<u64>,
    opens_at: Option<Timestamp>,
    pass_expires_at: Option<Timestamp>,
    updated_at: Timestamp,
}

impl TailKey {
    fn of(s: &TicketStatus) -> Self {
        Self {
            queue_length: s.queue_length,
            paused: s.paused,
            mode: s.mode,
            stock: s.stock,
            opens_at: s.opens_at,
            pass_expires_at: s.pass_expires_at,
            updated_at: s.at,
        }
    }
}

impl Tail {
    /// The shared end of `s`'s data: encoded again only when it differs
    /// from the last one asked for.
    fn of(&mut self, s: &TicketStatus) -> &[u8] {
        let key = TailKey::of(s);
        if self.key != Some(key) {
            self.bytes.clear();
            // Writing to a Vec cannot fail; the object's `{` is the
            // stream's own part's.
            let _ = serde_json::to_writer(&mut self.bytes, &key);
            self.bytes.remove(0);
            self.key = Some(key);
        }
        &self.bytes
    }
}

/// `"lane":"<name>",`, encoded once for a stream's life.
pub(crate) fn lane_field(lane: Option<&str>) -> Option<Box<[u8]>> {
    let lane = lane?;
    let mut out = b"\"lane\":".to_vec();
    let _ = serde_json::to_writer(&mut out, lane);
    out.push(b',');
    Some(out.into_boxed_slice())
}

/// A `position` event for a waiting ticket, its `id:` the count ahead.
pub(crate) fn position(out: &mut Vec<u8>, s: &TicketStatus, lane: Option<&[u8]>, tail: &mut Tail) {
    out.extend_from_slice(b"event: position\n");
    if let Some(ahead) = s.ahead {
        out.extend_from_slice(b"id: ");
        number(out, Some(ahead));
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: {\"status\":\"");
    out.extend_from_slice(s.status().name().as_bytes());
    out.extend_from_slice(b"\",");
    if let Some(lane) = lane {
        out.extend_from_slice(lane);
    }
    field(out, b"number", s.number);
    field(out, b"position", s.position);
    field(out, b"ahead", s.ahead);
    field(out, b"eta_seconds", s.eta.map(|e| e.expected_secs));
    field(out, b"eta_low_seconds", s.eta.map(|e| e.low_secs));
    field(out, b"eta_high_seconds", s.eta.map(|e| e.high_secs));
    out.extend_from_slice(b"\"progress\":");
    progress(out, s.progress);
    out.push(b',');
    out.extend_from_slice(tail.of(s));
    out.extend_from_slice(b"\n\n");
}

fn field(out: &mut Vec<u8>, name: &[u8], value: Option<u64>) {
    out.push(b'"');
    out.extend_from_slice(name);
    out.extend_from_slice(b"\":");
    number(out, value);
    out.push(b',');
}

fn number(out: &mut Vec<u8>, value: Option<u64>) {
    match value {
        Some(n) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

/// Progress to three decimals, as the `status` answer rounds it.
fn progress(out: &mut Vec<u8>, p: f64) {
    let thousandths = (p.clamp(0.0, 1.0) * 1000.0).round() as u64;
    number(out, Some(thousandths / 1000));
    out.push(b'.');
    let frac = thousandths % 1000;
    if frac == 0 {
        out.push(b'0');
        return;
    }
    let digits = [frac / 100, frac / 10 % 10, frac % 10];
    let len = if digits[2] != 0 {
        3
    } else if digits[1] != 0 {
        2
    } else {
        1
    };
    out.extend(digits[..len].iter().map(|&d| b'0' + d as u8));
}

/// The first event of a stream also tells the browser how long to wait
/// before reconnecting.
pub(crate) fn retry(out: &mut Vec<u8>) {
    out.extend_from_slice(b"retry: ");
    number(out, Some(RETRY_MS));
    out.push(b'\n');
}

/// An event that ends the stream, `id: end`, with a small JSON object.
fn ending_event(out: &mut Vec<u8>, name: &str, data: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\nid: ");
    out.extend_from_slice(END_ID.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data.as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// `{"status": ...}`: `expired` or `left`.
pub(crate) fn ending(out: &mut Vec<u8>, status: Status) {
    ending_event(
        out,
        status.name(),
        &format!(r#"{{"status":"{}"}}"#, status.name()),
    );
}

/// `{"status": "closed", "reason": ...}`: `sold_out`, or `closed` for a
/// room an operator closed or replaced.
pub(crate) fn closed(out: &mut Vec<u8>, reason: &str) {
    ending_event(
        out,
        Status::Closed.name(),
        &format!(r#"{{"status":"closed","reason":"{reason}"}}"#),
    );
}

/// The line this ticket stood in was reset (its room started again).
pub(crate) fn reset(out: &mut Vec<u8>) {
    ending_event(out, "reset", r#"{"status":"reset"}"#);
}

/// The `admitted` event.
#[derive(Serialize)]
struct Admitted<'a> {
    status: Status,
    redirect: Option<&'a str>,
    pass_expires_at: Option<Timestamp>,
}

pub(crate) fn admitted(
    out: &mut Vec<u8>,
    redirect: Option<&str>,
    pass_expires_at: Option<Timestamp>,
) {
    let data = Admitted {
        status: Status::Admitted,
        redirect,
        pass_expires_at,
    };
    let data = serde_json::to_string(&data).unwrap_or_default();
    ending_event(out, "admitted", &data);
}

/// The event for a status that ends the stream, if it does.
pub(crate) fn final_event(
    out: &mut Vec<u8>,
    status: &TicketStatus,
    redirect: Option<&str>,
) -> bool {
    if status.closed {
        closed(out, status.closed_reason());
        return true;
    }
    match status.status() {
        Status::Waiting => false,
        Status::Admitted => {
            admitted(out, redirect, status.pass_expires_at);
            true
        }
        ended => {
            ending(out, ended);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rules::Eta;
    use crate::engine::{StatusBody, TicketState};
    use proptest::prelude::*;

    /// The `position` event's data as serde writes the `status` answer.
    fn position_by_serde(s: &TicketStatus, lane: Option<&str>) -> String {
        serde_json::to_string(&StatusBody::named(s, lane)).unwrap_or_default()
    }

    fn data(event: &[u8]) -> serde_json::Value {
        let text = std::str::from_utf8(event).unwrap();
        let line = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
        serde_json::from_str(line).unwrap()
    }

    proptest! {
        #[test]
        fn a_position_is_the_status_answer_s_json(
            number in proptest::option::of(1u64..u64::MAX / 2),
            ahead in proptest::option::of(0u64..10_000_000),
            eta in proptest::option::of((0u64..100_000, 0u64..100_000, 0u64..100_000)),
            progress in 0.0f64..=1.0,
            queue_length in 0u64..u64::MAX,
            paused: bool,
            stock in proptest::option::of(0u64..1_000),
            opens_at in proptest::option::of(0u64..4_000_000_000_000),
            at in 0u64..4_000_000_000_000,
            lane in proptest::option::of("[a-z\"\\\\]{1,8}"),
        ) {
            let s = TicketStatus {
                id: 1,
                state: TicketState::Waiting,
                lane: 0,
                number,
                position: ahead.map(|a| a + 1),
                ahead,
                eta: eta.map(|(expected_secs, low_secs, high_secs)| Eta { expected_secs, low_secs, high_secs }),
                progress,
                queue_length,
                paused,
                closed: false,
                mode: Mode::Queue,
                stock,
                joined_at: Timestamp(0),
                admitted_at: None,
                pass_expires_at: None,
                opens_at: opens_at.map(Timestamp),
                at: Timestamp(at),
            };
            let mut out = Vec::new();
            let mut tail = Tail::default();
            let lane_bytes = lane_field(lane.as_deref());
            position(&mut out, &s, lane_bytes.as_deref(), &mut tail);
            let expected: serde_json::Value =
                serde_json::from_str(&position_by_serde(&s, lane.as_deref())).unwrap();
            prop_assert_eq!(data(&out), expected);
            prop_assert!(out.ends_with(b"\n\n"));
            // The tail is reused, and still right, for the next stream.
            let mut again = Vec::new();
            position(&mut again, &s, lane_bytes.as_deref(), &mut tail);
            prop_assert_eq!(&again, &out);
        }
    }

    #[test]
    fn ending_events_carry_the_end_id() {
        let mut out = Vec::new();
        closed(&mut out, "sold_out");
        assert_eq!(
            out,
            b"event: closed\nid: end\ndata: {\"status\":\"closed\",\"reason\":\"sold_out\"}\n\n"
        );
    }
}
