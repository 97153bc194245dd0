//! The wait-time histogram's buckets: join to admission, in the shape
//! Prometheus wants.

/// Upper bounds (ms) of the buckets; the last catches everything longer.
pub(crate) const WAIT_BUCKETS_MS: [u64; 14] = [
    100,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_800_000,
    3_600_000,
    u64::MAX,
];

/// The bucket a wait falls in: the first whose bound it does not pass.
pub(crate) fn wait_bucket(wait_ms: u64) -> usize {
    WAIT_BUCKETS_MS
        .iter()
        .position(|&b| wait_ms <= b)
        .unwrap_or(WAIT_BUCKETS_MS.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive() {
        assert_eq!(wait_bucket(0), 0);
        assert_eq!(wait_bucket(100), 0);
        assert_eq!(wait_bucket(101), 1);
        assert_eq!(wait_bucket(3_600_001), WAIT_BUCKETS_MS.len() - 1);
    }
}
