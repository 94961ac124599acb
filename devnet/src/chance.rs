//! Reproducible random draws.
//!
//! Every random choice devnet makes is a pure function of the seed, what the choice is about
//! (a [`Draw`]), a key (a batch id or a ledger key) and a counter. Nothing depends on which
//! task happens to run first: the same batch id is always Invalid or always valid under a
//! given seed and fraction, and the n-th POST to a ledger always meets the same fault. A run
//! replays exactly as long as each ledger receives its requests in the same order.

/// What a draw decides; each kind is an independent stream.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Draw {
    /// Whether a batch falls in `invalid_fraction` (key: batch id).
    Invalid = 1,
    /// A batch's commit latency (key: ledger, counter: acceptance number).
    CommitLatency = 2,
    /// The fault before accepting a POST (key: ledger, counter: POST number).
    BeforeAccept = 3,
    /// The fault after committing a POST (key: ledger, counter: POST number).
    AfterCommit = 4,
    /// A response latency (key: ledger, counter: request number).
    ResponseLatency = 5,
}

/// A draw in `[0, 1)`.
pub(crate) fn unit(seed: u64, draw: Draw, key: &str, counter: u64) -> f64 {
    let mut h = mix(seed ^ mix(draw as u64));
    h = mix(h ^ fnv1a(key.as_bytes()));
    h = mix(h ^ counter);
    // The top 53 bits fill an f64 mantissa exactly.
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// SplitMix64's finaliser: a bijection that spreads every input bit over the output.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_reproducible_and_depend_on_every_input() {
        let a = unit(1, Draw::Invalid, "abc", 0);
        assert_eq!(a, unit(1, Draw::Invalid, "abc", 0));
        assert_ne!(a, unit(2, Draw::Invalid, "abc", 0));
        assert_ne!(a, unit(1, Draw::CommitLatency, "abc", 0));
        assert_ne!(a, unit(1, Draw::Invalid, "abd", 0));
        assert_ne!(a, unit(1, Draw::Invalid, "abc", 1));
    }

    #[test]
    fn draws_are_roughly_uniform() {
        let n = 10_000;
        let below: usize = (0..n)
            .filter(|i| unit(42, Draw::BeforeAccept, "s", *i) < 0.3)
            .count();
        assert!((2_700..3_300).contains(&below), "{below} of {n} below 0.3");
        assert!((0..n).all(|i| (0.0..1.0).contains(&unit(9, Draw::AfterCommit, "x", i))));
    }
}
