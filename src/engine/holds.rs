//! Streams held open by instances: a visitor with a live event stream is
//! present for as long as it stays open, at the cost of one report per
//! instance and period, however many streams the instance holds.
//!
//! An instance (a *holder*) reports the tickets whose first stream on it
//! opened and those whose last stream closed, and otherwise only that it
//! is still there. A ticket held by any live holder counts as seen now
//! ([`super::Room::seen_at`]); when its last stream closes it counts as
//! seen then, so its `away_grace` runs from the close. A holder not heard
//! from for a whole `away_grace` (it died, or lost its way to this engine)
//! lets go of its tickets as if they had been seen when it was last heard:
//! they go away exactly one grace after that, as they would have had it
//! said goodbye. A report that names every ticket the holder holds
//! replaces what was known of it, so a holder that is unsure what this
//! engine knows (it talked to another engine, or a report was lost) sends
//! its whole list once.
//!
//! Holds are not part of the room's image or log: an engine that takes the
//! room over starts with none, presumes everyone seen at the change
//! ([`super::Room::presume_seen`]), and learns the holders' full lists
//! from their next reports, which they send on meeting a new
//! [`Holds::generation`].

use std::collections::{HashMap, HashSet};

use super::ticket::TicketId;

/// Who holds streams: an instance's id, chosen at random when it starts.
pub(crate) type HolderId = u64;

/// What one holder says of its streams in one report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamReport {
    pub holder: HolderId,
    /// `opened` lists every ticket the holder holds now; any other it was
    /// known to hold is let go.
    pub full: bool,
    /// Tickets whose first stream on the holder opened.
    pub opened: Vec<TicketId>,
    /// Tickets whose last stream on the holder closed.
    pub closed: Vec<TicketId>,
}

/// The holders an engine knows, and what each holds.
#[derive(Debug)]
pub(crate) struct Holds {
    /// Tells a holder whether the engine it reports to is the one it
    /// reported to before: a new engine (a new owner, a restart) has
    /// another.
    pub generation: u64,
    pub holders: HashMap<HolderId, Holder>,
}

#[derive(Debug, Default)]
pub(crate) struct Holder {
    pub tickets: HashSet<TicketId>,
    /// When it was last heard from (Unix ms).
    pub heard: u64,
}

impl Holds {
    pub(crate) fn new() -> Self {
        Self {
            generation: rand::random::<u64>().max(1),
            holders: HashMap::new(),
        }
    }

    /// The holders not heard from since `before`, taken out.
    pub(crate) fn take_lapsed(&mut self, before: u64) -> Vec<Holder> {
        let lapsed: Vec<HolderId> = self
            .holders
            .iter()
            .filter(|(_, h)| h.heard < before)
            .map(|(&id, _)| id)
            .collect();
        lapsed
            .into_iter()
            .filter_map(|id| self.holders.remove(&id))
            .collect()
    }
}
