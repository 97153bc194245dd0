//! Spent proof-of-work nonces on one instance: an add-if-absent with
//! expiry, the in-process counterpart of Redis' `SET key NX PX ttl`.
//!
//! A nonce need only be remembered until its challenge expires (after
//! that the challenge is refused anyway), so nonces are kept in buckets by
//! expiry minute and a whole bucket is dropped once its minute has passed:
//! forgetting costs nothing per nonce, and memory follows the join rate
//! over one challenge lifetime.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

const BUCKET_MS: u64 = 60_000;

#[derive(Debug, Default)]
pub(crate) struct SpentNonces {
    /// Expiry minute → nonces that expire within it.
    buckets: Mutex<BTreeMap<u64, HashSet<[u8; 16]>>>,
}

impl SpentNonces {
    /// Remembers `nonce` until `until_ms`; false if it was already spent
    /// (and not yet forgotten).
    pub(crate) fn spend(&self, nonce: [u8; 16], until_ms: u64, now_ms: u64) -> bool {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Buckets whose whole minute is over hold only expired nonces.
        let current = now_ms / BUCKET_MS;
        while let Some(entry) = buckets.first_entry() {
            if *entry.key() >= current {
                break;
            }
            entry.remove();
        }
        if buckets.values().any(|b| b.contains(&nonce)) {
            return false;
        }
        buckets
            .entry(until_ms / BUCKET_MS)
            .or_default()
            .insert(nonce)
    }

    /// Nonces remembered now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(HashSet::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_is_spent_once_until_it_expires() {
        let spent = SpentNonces::default();
        let t = 1_000_000_000;
        assert!(spent.spend([1; 16], t + 300_000, t));
        assert!(!spent.spend([1; 16], t + 300_000, t + 1));
        assert!(spent.spend([2; 16], t + 300_000, t + 2));
        assert!(!spent.spend([1; 16], t + 300_000, t + 299_000));
        assert_eq!(spent.len(), 2);
        // A minute after its expiry minute it is forgotten.
        assert!(spent.spend([3; 16], t + 700_000, t + 300_000 + 2 * BUCKET_MS));
        assert_eq!(spent.len(), 1);
    }

    #[test]
    fn racing_spends_of_one_nonce_admit_one() {
        let spent = std::sync::Arc::new(SpentNonces::default());
        let wins: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let spent = spent.clone();
                    s.spawn(move || {
                        (0..1000u32)
                            .filter(|i| {
                                let mut n = [0u8; 16];
                                n[..4].copy_from_slice(&i.to_be_bytes());
                                spent.spend(n, 10 * BUCKET_MS, 0)
                            })
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            wins, 1000,
            "each of 1000 nonces spent exactly once by 8 threads"
        );
    }
}
