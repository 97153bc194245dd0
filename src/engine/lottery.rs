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
//!
//! [`DrawRecord`] is what a room publishes of its draw, for anyone to check
//! with [`LotterySeed::verify`] (or with `sha256sum`: docs/fair-access.md shows how).

use sha2::{Digest, Sha256};

use super::room::Room;
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
    pub(crate) fn random() -> Self {
        Self(rand::random())
    }

    /// SHA-256 of the seed, hex: safe to publish before the draw.
    pub fn commitment(&self) -> String {
        hex::encode(Sha256::digest(self.0))
    }

    pub(crate) fn to_hex(&self) -> String {
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

/// What a room publishes of its opening draw: the commitment from the
/// start, then the seed and the order it gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrawRecord {
    /// SHA-256 of the seed, hex.
    pub commitment: String,
    /// The seed, hex, once the room has opened.
    pub seed: Option<String>,
    /// The pre-queue's ticket ids in drawn order, once the room has opened.
    pub order: Option<Vec<TicketId>>,
}

/// Why a published draw does not check out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DrawMismatch {
    #[error("the seed is not 64 hex digits")]
    BadSeed,
    #[error("SHA-256 of the seed is {actual}, not the published commitment {published}")]
    Commitment { published: String, actual: String },
    #[error("the published order lists a ticket twice")]
    Duplicate,
    #[error(
        "place {place}: the seed puts ticket {expected} there, the published order ticket {published}"
    )]
    Order {
        place: usize,
        expected: TicketId,
        published: TicketId,
    },
}

impl DrawRecord {
    /// Recomputes the order from the seed and the ids it lists, and checks
    /// the commitment. `Ok` for a draw that has not happened yet, as long
    /// as it has a commitment.
    pub fn verify(&self) -> Result<(), DrawMismatch> {
        let (Some(seed), Some(order)) = (&self.seed, &self.order) else {
            return Ok(());
        };
        let seed = hex::decode(seed)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .map(LotterySeed)
            .ok_or(DrawMismatch::BadSeed)?;
        if seed.commitment() != self.commitment.to_ascii_lowercase() {
            return Err(DrawMismatch::Commitment {
                published: self.commitment.clone(),
                actual: seed.commitment(),
            });
        }
        let mut ids = order.clone();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(DrawMismatch::Duplicate);
        }
        let expected = seed.draw(&ids);
        match expected.iter().zip(order).position(|(e, p)| e != p) {
            None => Ok(()),
            Some(i) => Err(DrawMismatch::Order {
                place: i + 1,
                expected: expected[i],
                published: order[i],
            }),
        }
    }
}

impl Room {
    /// The room's draw as published: `None` for a room without one
    /// (`order = "fifo"`, or open from the start).
    pub(crate) fn draw_record(&self) -> Option<DrawRecord> {
        let seed = self.lottery.as_ref()?;
        let order: Option<Vec<TicketId>> = self.drawn.get().cloned();
        Some(DrawRecord {
            commitment: seed.commitment(),
            seed: order.as_ref().map(|_| seed.to_hex()),
            order,
        })
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

    #[test]
    fn a_published_draw_checks_out_and_any_edit_does_not() {
        let seed = LotterySeed([3; 32]);
        let ids: Vec<TicketId> = (0..50).collect();
        let good = DrawRecord {
            commitment: seed.commitment(),
            seed: Some(seed.to_hex()),
            order: Some(seed.draw(&ids)),
        };
        assert_eq!(good.verify(), Ok(()));
        let before = DrawRecord {
            seed: None,
            order: None,
            ..good.clone()
        };
        assert_eq!(before.verify(), Ok(()));

        let mut swapped = good.clone();
        swapped.order.as_mut().unwrap().swap(3, 4);
        assert!(matches!(
            swapped.verify(),
            Err(DrawMismatch::Order { place: 4, .. })
        ));
        let mut other_seed = good.clone();
        other_seed.seed = Some(LotterySeed([4; 32]).to_hex());
        assert!(matches!(
            other_seed.verify(),
            Err(DrawMismatch::Commitment { .. })
        ));
        let mut twice = good.clone();
        twice.order.as_mut().unwrap()[0] = good.order.as_ref().unwrap()[1];
        assert_eq!(twice.verify(), Err(DrawMismatch::Duplicate));
        let mut bad = good;
        bad.seed = Some("zz".into());
        assert_eq!(bad.verify(), Err(DrawMismatch::BadSeed));
    }
}
