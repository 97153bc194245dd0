//! The journal on a temporary directory: records come back after a reopen,
//! snapshots compact, concurrent appends all become durable, and damage is
//! told apart from a torn tail.

use std::sync::Arc;

use super::*;
use crate::engine::{ManualClock, Room, RoomSettings, TicketState};

fn image(name: &str) -> RoomImage {
    let s = RoomSettings::new(RoomId::new(name).unwrap());
    Room::create(s, Arc::new(ManualClock::new(1_000)), 7, None).image()
}

fn joined(room: &str, ticket: u32) -> Record {
    Record::Room {
        room: RoomId::new(room).unwrap(),
        event: EventRecord::Joined {
            ticket,
            identity: Some(u128::from(ticket) + 99),
            lane: 0,
            index: Some(ticket),
            ahead: ticket,
            at: 2_000,
        },
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn records_come_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (j, rec) = Journal::open(dir.path(), Durability::Fsync).unwrap();
    assert!(rec.rooms.is_empty());
    j.append(&Record::Created(Box::new(image("a"))));
    let mut last = 0;
    for t in 0..10 {
        last = j.append(&joined("a", t));
    }
    block_on(j.wait_durable(last)).unwrap();
    drop(j);
    let (_j, rec) = Journal::open(dir.path(), Durability::Fsync).unwrap();
    assert_eq!(rec.replayed, 11);
    assert_eq!(rec.rooms.len(), 1);
    assert_eq!(rec.rooms[0].count(TicketState::Waiting), 10);
    assert_eq!(rec.rooms[0].tickets[3].identity, Some(102));
}

#[test]
fn a_snapshot_replaces_the_journal_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), Durability::Off).unwrap();
    j.append(&Record::Created(Box::new(image("a"))));
    for t in 0..5 {
        j.append(&joined("a", t));
    }
    let seq = j.rotate().unwrap();
    assert_eq!(seq, 6);
    let mut snap = image("a");
    for t in 0..5 {
        if let Record::Room { event, .. } = joined("a", t) {
            snap.apply(event.as_event());
        }
    }
    j.write_snapshot(seq, vec![snap], Vec::new()).unwrap();
    j.append(&joined("a", 5));
    j.close();
    drop(j);
    let logs = numbered(dir.path(), "journal-", ".log").unwrap();
    assert_eq!(logs.len(), 1, "older segments are deleted: {logs:?}");
    let (_j, rec) = Journal::open(dir.path(), Durability::Off).unwrap();
    assert_eq!(rec.replayed, 1);
    assert_eq!(rec.rooms[0].count(TicketState::Waiting), 6);
}

#[test]
fn concurrent_appends_all_become_durable_and_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), Durability::Fsync).unwrap();
    j.append(&Record::Created(Box::new(image("a"))));
    std::thread::scope(|s| {
        for t in 0..8u32 {
            let j = &j;
            s.spawn(move || {
                for i in 0..50 {
                    let seq = j.append(&joined("a", t * 50 + i));
                    block_on(j.wait_durable(seq)).unwrap();
                    assert!(j.is_durable(seq));
                }
            });
        }
    });
    drop(j);
    let (_j, rec) = Journal::open(dir.path(), Durability::Fsync).unwrap();
    assert_eq!(rec.rooms[0].count(TicketState::Waiting), 400);
}

#[test]
fn damage_before_the_end_is_refused_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), Durability::Fsync).unwrap();
    j.append(&Record::Created(Box::new(image("a"))));
    for t in 0..20 {
        j.append(&joined("a", t));
    }
    j.close();
    drop(j);
    let (_, path) = numbered(dir.path(), "journal-", ".log")
        .unwrap()
        .pop()
        .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = Journal::open(dir.path(), Durability::Fsync).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("damaged at byte offset"),
        "{msg}"
    );
}

/// A journal of an older format is named as such, never decoded: its
/// records could read as other records in this version's layout.
#[test]
fn an_older_format_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path(), Durability::Fsync).unwrap();
    j.append(&Record::Created(Box::new(image("a"))));
    j.close();
    drop(j);
    let (_, path) = numbered(dir.path(), "journal-", ".log")
        .unwrap()
        .pop()
        .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[7] = b'1';
    std::fs::write(&path, &bytes).unwrap();
    let msg = Journal::open(dir.path(), Durability::Fsync)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&path.display().to_string())
            && msg.contains("journal format 1")
            && msg.contains("reads format 5"),
        "{msg}"
    );
    // Any other change of the magic is plain damage.
    bytes[7] = b'7';
    std::fs::write(&path, &bytes).unwrap();
    let msg = Journal::open(dir.path(), Durability::Fsync)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("bad magic"), "{msg}");
}

#[test]
fn a_second_process_cannot_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = Journal::open(dir.path(), Durability::Fsync).unwrap();
    let err = Journal::open(dir.path(), Durability::Fsync).unwrap_err();
    assert!(matches!(err, JournalError::InUse { .. }), "{err}");
    assert!(err.to_string().contains("another Narabu process"), "{err}");
    drop(first);
    Journal::open(dir.path(), Durability::Fsync).unwrap();
}
