//! The opening draw: a verifiable shuffle of the pre-queue.
//!
//! Visitors who join before `opens_at` wait in a pre-queue. At opening it is
//! shuffled once, so arriving early or refreshing gains nothing. To make the
//! draw checkable by anyone, the room publishes `commitment = SHA-256(seed)`
//! before opening and the `seed` after. The order is then fully determined:
//! every pre-queue ticket id `i` gets the key `SHA-256(seed || "/" || i)`
//! (the id in decimal ASCII), and tickets are placed in ascending key order
//! (ties, which need a SHA-256 collision, fall back to the id). Anyone with
//! the seed, the list of pre-queue ticket ids and `sha256sum` can recompute
//! it; nobody, including the operator, could pick a seed after seeing who
//! joined without breaking the published commitment.

use sha2::{Digest, Sha256};

use super::ticket::TicketId;

/// The secret drawn when the room is created, revealed at opening.
#[derive(Clone, PartialEq, Eq)]
pub struct LotterySeed(pub [u8; 32]);

impl std::fmt::Debug for LotterySeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The seed must not leak before opening, not even in a debug log.
        f.write_str("LotterySeed(..)")
    }
}

impl LotterySeed {
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// SHA-256 of the seed, hex: safe to publish before the draw.
    pub fn commitment(&self) -> String {
        hex::encode(Sha256::digest(self.0))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    fn draw_key(&self, id: TicketId) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.0);
        h.update(b"/");
        h.update(id.to_string().as_bytes());
        h.finalize().into()
    }

    /// The pre-queue in drawn order.
    pub fn draw(&self, ids: &[TicketId]) -> Vec<TicketId> {
        let mut keyed: Vec<([u8; 32], TicketId)> =
            ids.iter().map(|&id| (self.draw_key(id), id)).collect();
        keyed.sort_unstable();
        keyed.into_iter().map(|(_, id)| id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draw_is_a_deterministic_permutation() {
        let seed = LotterySeed([7; 32]);
        let ids: Vec<TicketId> = (0..1000).collect();
        let a = seed.draw(&ids);
        let mut input_reversed = ids.clone();
        input_reversed.reverse();
        // Arrival order of the input does not matter, only the seed.
        assert_eq!(a, seed.draw(&input_reversed));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, ids);
        assert_ne!(a, ids, "1000 tickets should not stay in order");
        assert_ne!(a, LotterySeed([8; 32]).draw(&ids));
    }

    #[test]
    fn the_commitment_is_sha256_of_the_seed() {
        let seed = LotterySeed([0; 32]);
        assert_eq!(
            seed.commitment(),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
        assert!(!format!("{seed:?}").contains("00"));
    }

    #[test]
    fn early_arrivals_gain_nothing_on_average() {
        // Over many seeds, the first joiner lands in the first half about
        // half the time.
        let ids: Vec<TicketId> = (0..100).collect();
        let first_half = (0u8..200)
            .filter(|&s| {
                let order = LotterySeed([s; 32]).draw(&ids);
                order.iter().position(|&id| id == 0).unwrap() < 50
            })
            .count();
        assert!((70..=130).contains(&first_half), "{first_half}");
    }
}
