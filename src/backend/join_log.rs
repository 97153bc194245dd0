//! The join limit's log, kept in process for the embedded backend: per
//! (room, client address), the times of its recent new tickets. The rule
//! applied to it is `rules::join_allowance`, the same the Redis backend
//! applies to the log it keeps in Redis, so both give the same answers.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use dashmap::DashMap;

use crate::engine::RoomId;
use crate::engine::rules::{join_allowance, join_window_start};

#[derive(Debug, Default)]
pub(crate) struct JoinLog {
    joins: DashMap<(RoomId, IpAddr), VecDeque<u64>>,
}

impl JoinLog {
    /// A new ticket for `client` if the limit (0: none) allows one now:
    /// `issue` runs, and if it makes a ticket the join is logged. Two joins
    /// from one address are decided one after the other. `Err` says how
    /// long until one more would fit.
    pub(crate) fn admit<T, E>(
        &self,
        room: &RoomId,
        client: IpAddr,
        limit: u32,
        now: u64,
        issue: impl FnOnce() -> Result<T, E>,
    ) -> Result<Result<T, E>, Duration> {
        if limit == 0 {
            return Ok(issue());
        }
        let mut log = self.joins.entry((room.clone(), client)).or_default();
        let since = join_window_start(now);
        while log.front().is_some_and(|&t| t <= since) {
            log.pop_front();
        }
        join_allowance(limit, log.len() as u64, log.front().copied(), now)?;
        let issued = issue();
        if issued.is_ok() {
            log.push_back(now);
        }
        Ok(issued)
    }

    /// Forget addresses with no join left in the window.
    pub(crate) fn sweep(&self, now: u64) {
        let since = join_window_start(now);
        self.joins
            .retain(|_, log| log.back().is_some_and(|&t| t > since));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.joins.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.joins.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rules::JOIN_WINDOW_MS;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn join(
        log: &JoinLog,
        room: &RoomId,
        client: &str,
        limit: u32,
        now: u64,
    ) -> Result<(), Duration> {
        log.admit(room, ip(client), limit, now, || Ok::<_, ()>(()))
            .map(|r| r.unwrap())
    }

    #[test]
    fn the_window_slides() {
        let log = JoinLog::default();
        let room = RoomId::new("sale").unwrap();
        let start = 10 * JOIN_WINDOW_MS;
        for i in 0..5 {
            join(&log, &room, "192.0.2.1", 5, start + i * 1000).unwrap();
        }
        let wait = join(&log, &room, "192.0.2.1", 5, start + 10_000).unwrap_err();
        // The first leaves the window 60 s after it joined.
        assert_eq!(wait, Duration::from_millis(50_000));
        // Another address and another room have their own logs.
        join(&log, &room, "192.0.2.2", 5, start).unwrap();
        join(&log, &RoomId::new("other").unwrap(), "192.0.2.1", 5, start).unwrap();
        // Just before the first leaves: still full; at that moment, room.
        assert!(join(&log, &room, "192.0.2.1", 5, start + JOIN_WINDOW_MS - 1).is_err());
        join(&log, &room, "192.0.2.1", 5, start + JOIN_WINDOW_MS).unwrap();
        assert!(join(&log, &room, "192.0.2.1", 5, start + JOIN_WINDOW_MS).is_err());
        // Limit 0 is off.
        for _ in 0..1000 {
            join(&log, &room, "192.0.2.1", 0, start).unwrap();
        }
    }

    #[test]
    fn the_wait_it_names_is_enough() {
        let room = RoomId::new("sale").unwrap();
        for limit in [1u32, 3, 7, 120] {
            for offset in [0, 1, 17_000, 59_999] {
                let log = JoinLog::default();
                let now = 5 * JOIN_WINDOW_MS + offset;
                while join(&log, &room, "192.0.2.1", limit, now).is_ok() {}
                let wait = join(&log, &room, "192.0.2.1", limit, now).unwrap_err();
                let then = now + u64::try_from(wait.as_millis()).unwrap();
                assert!(
                    join(&log, &room, "192.0.2.1", limit, then).is_ok(),
                    "{limit} {offset}"
                );
            }
        }
    }

    #[test]
    fn a_join_that_makes_no_ticket_is_not_counted() {
        let log = JoinLog::default();
        let room = RoomId::new("sale").unwrap();
        for _ in 0..10 {
            let refused = log.admit(&room, ip("192.0.2.1"), 1, 0, || Err::<(), _>("closed"));
            assert_eq!(refused, Ok(Err("closed")));
        }
        join(&log, &room, "192.0.2.1", 1, 0).unwrap();
    }

    #[test]
    fn sweeping_forgets_quiet_addresses() {
        let log = JoinLog::default();
        let room = RoomId::new("sale").unwrap();
        join(&log, &room, "192.0.2.1", 5, 1_000).unwrap();
        log.sweep(1_000 + JOIN_WINDOW_MS - 1);
        assert_eq!(log.len(), 1);
        log.sweep(1_000 + JOIN_WINDOW_MS);
        assert!(log.is_empty());
    }
}
