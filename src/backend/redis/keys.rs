//! Key names. Every key of a room carries the room's hash tag
//! (`narabu:{room}:…`), so a room lives on one Redis Cluster slot, its
//! scripts can touch all of its keys atomically, and rooms spread over the
//! shards. Per-incarnation keys (`narabu:{room}:<epoch>:tk`, `:q`, `:pre`,
//! `:ids`, `:adm`, `:seen`, `:draw`, `:dep`, `:back`, `:away`, `:ln`, and a
//! priority lane's own `:q:<lane>`, `:dep:<lane>`, `:back:<lane>`,
//! `:away:<lane>`) are built inside the scripts from the prefix, so replacing a room is one atomic script that
//! unlinks the old ones. Spent proof-of-work nonces
//! (`narabu:{room}:pow:<nonce>`) expire by themselves with their challenge.
//! The change log (`:log`, its seq `:lseq`, its followers' marks
//! `:followers`) is the room's, across incarnations.

use crate::engine::RoomId;

/// The set of room ids, for `list_rooms` and for instances to find rooms
/// created on another instance. Outside any room's slot on purpose.
pub const ROOMS: &str = "narabu:rooms";

/// The one pub/sub channel: ticket changes, room views, room (re)creations.
/// Classic PUBLISH reaches every node of a cluster, so one subscription on
/// any node hears every room.
pub const CHANNEL: &str = "narabu:events";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomKeys {
    /// `narabu:{room}:` — scripts build every other key from it.
    pub prefix: String,
    /// The room's meta hash: settings, counters, the worker's hand, the
    /// tray, the published view.
    pub meta: String,
    /// The worker lease (owner token, expiring).
    pub lease: String,
    /// The room's change log (a Redis Stream), whatever its epoch.
    pub log: String,
}

impl RoomKeys {
    pub fn new(room: &RoomId) -> Self {
        let prefix = format!("narabu:{{{room}}}:");
        Self {
            meta: format!("{prefix}room"),
            lease: format!("{prefix}lease"),
            log: format!("{prefix}log"),
            prefix,
        }
    }

    /// The pre-queue list of one incarnation (read by the opening draw).
    pub fn prequeue(&self, epoch: &str) -> String {
        format!("{}{epoch}:pre", self.prefix)
    }

    /// The drawn order of one incarnation (written by open.lua).
    pub fn draw(&self, epoch: &str) -> String {
        format!("{}{epoch}:draw", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_room_shares_its_hash_tag() {
        let k = RoomKeys::new(&RoomId::new("big-sale").unwrap());
        assert_eq!(k.prefix, "narabu:{big-sale}:");
        for key in [&k.meta, &k.lease, &k.log, &k.prequeue("42"), &k.draw("42")] {
            assert!(key.starts_with("narabu:{big-sale}:"), "{key}");
        }
        // The scripts take the room id back out of the prefix.
        assert_eq!(&k.prefix[8..k.prefix.len() - 2], "big-sale");
    }
}
