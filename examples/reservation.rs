//! The source article's own simulation, on Narabu's engine: 20 users, 2
//! permits, users arriving 100–200 ms after the start, each holding its
//! permit 100–200 ms, and a worker that runs every 500 ms. It prints the
//! same log the article shows: every user gets an answer at once, the first
//! two are admitted by the worker, and the rest by hand-off ("baton touch")
//! from the users who finish.
//!
//! `cargo run --example reservation` runs the crowded case; `-- --quiet`
//! spreads arrivals over five seconds (the article's second log), where the
//! worker moves permits from the tray back into its hand. It runs on
//! virtual time, so it is instant and reproducible (`-- --seed N`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use narabu::engine::{Departure, Handoff, ManualClock, Room, RoomId, RoomSettings, TicketId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One line of the simulation's log.
#[derive(Debug, Clone)]
pub struct Line {
    pub at_ms: u64,
    pub thread: String,
    pub text: String,
}

/// An admission, for checking order and capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub user: u32,
    pub number: u64,
    pub at_ms: u64,
    pub delay_ms: u64,
}

#[derive(Debug, Default)]
pub struct Outcome {
    pub log: Vec<Line>,
    pub admissions: Vec<Admission>,
    /// Most users holding a permit at once, from the simulation's own view.
    pub peak_holding: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Tick,
    Arrive(u32),
    Release(u32),
}

const USERS: u32 = 20;
const PERMITS: u32 = 2;
const TICK_MS: u64 = 500;

pub fn simulate(seed: u64, quiet: bool) -> Outcome {
    let start = 1_629_700_000_000;
    let clock = ManualClock::new(start);
    let mut settings = RoomSettings::new(RoomId::new("article").expect("valid id"));
    settings.capacity = PERMITS;
    settings.tick = Duration::from_millis(TICK_MS);
    let room = Room::new(settings, Arc::new(clock.clone()));
    let mut rng = StdRng::seed_from_u64(seed);

    let mut events = BinaryHeap::new();
    for user in 1..=USERS {
        let at = if quiet {
            rng.random_range(100..5_000)
        } else {
            rng.random_range(100..200)
        };
        events.push(Reverse((at, Event::Arrive(user))));
    }
    events.push(Reverse((0, Event::Tick)));

    let mut out = Outcome::default();
    let mut tickets: HashMap<TicketId, (u32, u64)> = HashMap::new();
    let mut holding = 0usize;
    let mut released = 0;
    let log = |out: &mut Outcome, at: u64, thread: &str, text: String| {
        out.log.push(Line {
            at_ms: at,
            thread: thread.to_owned(),
            text,
        });
    };

    while let Some(Reverse((at, event))) = events.pop() {
        clock.set(start + at);
        let mut admitted: Vec<(TicketId, String)> = Vec::new();
        match event {
            Event::Arrive(user) => {
                let joined = room.join(None).expect("room is open");
                tickets.insert(joined.ticket, (user, at));
                log(
                    &mut out,
                    at,
                    "sender",
                    format!("INFO - acquire permit, user request {user}, time 0ms"),
                );
            }
            Event::Tick => {
                let report = room.tick();
                if report.from_tray > 0 {
                    log(
                        &mut out,
                        at,
                        "semaphore",
                        format!(
                            "DEBUG - move reserved permits {} to available permits",
                            report.from_tray
                        ),
                    );
                }
                admitted.extend(report.admitted.into_iter().map(|t| (t, "semaphore".into())));
                if released < USERS {
                    events.push(Reverse((at + TICK_MS, Event::Tick)));
                }
            }
            Event::Release(user) => {
                let (&ticket, _) = tickets
                    .iter()
                    .find(|(_, (u, _))| *u == user)
                    .expect("user has a ticket");
                holding -= 1;
                released += 1;
                let thread = format!("user-{user}");
                log(
                    &mut out,
                    at,
                    &thread,
                    format!("DEBUG - release permit, user request {user}"),
                );
                if let Departure::GaveBack(Handoff::To(next)) = room.leave(ticket) {
                    admitted.push((next, thread));
                }
            }
        }
        for (ticket, thread) in admitted {
            let (user, joined_at) = tickets[&ticket];
            holding += 1;
            out.peak_holding = out.peak_holding.max(holding);
            let delay_ms = at - joined_at;
            let number = room.status(ticket).and_then(|s| s.number).unwrap_or(0);
            out.admissions.push(Admission {
                user,
                number,
                at_ms: at,
                delay_ms,
            });
            log(
                &mut out,
                at,
                &thread,
                format!("DEBUG - acquired permit, user request {user}, delay {delay_ms}ms"),
            );
            let hold = rng.random_range(100..200);
            events.push(Reverse((at + hold, Event::Release(user))));
        }
    }
    out
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quiet = args.iter().any(|a| a == "--quiet");
    let seed = args
        .iter()
        .position(|a| a == "--seed")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(2021);
    let outcome = simulate(seed, quiet);
    for line in &outcome.log {
        println!(
            "{:02}:{:02}.{:03} [{}] {}",
            line.at_ms / 60_000,
            line.at_ms / 1000 % 60,
            line.at_ms % 1000,
            line.thread,
            line.text
        );
    }
    let longest = outcome.admissions.iter().max_by_key(|a| a.delay_ms);
    if let Some(a) = longest {
        println!(
            "\n{} admitted, at most {} at once; longest wait: user request {}, {} ms",
            outcome.admissions.len(),
            outcome.peak_holding,
            a.user,
            a.delay_ms
        );
    }
}
