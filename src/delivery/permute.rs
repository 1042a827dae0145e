//! A keyed bijection on `0..n` for any `n`: a balanced Feistel network over the smallest
//! even number of bits that covers `n`, with cycle-walking for values past `n`.
//!
//! Hand-written because it must be O(1) per value, allocation-free and fixed forever (a
//! change would change every user's shuffled order); the crates that offer format-preserving
//! permutations either allocate a table, need a power-of-two domain, or do not promise a
//! stable output across versions.

/// Rounds of the network. Six rounds of a full-avalanche round function mix well beyond
/// what a training shuffle needs (Luby–Rackoff needs four for a pseudorandom permutation).
const ROUNDS: u64 = 6;

/// A bijection on `0..n` chosen by `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    /// Bits of each half.
    half: u32,
    mask: u64,
    keys: [u64; ROUNDS as usize],
}

impl Permutation {
    /// The permutation of `0..n` for `key` (`n` may be 0).
    pub fn new(n: u64, key: u64) -> Self {
        // Bits to cover 0..n, at least 2 and even, so that the domain is at most 4n and
        // cycle-walking takes fewer than 4 tries on average (none for powers of four).
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let half = bits.div_ceil(2);
        let mut keys = [0; ROUNDS as usize];
        for (r, k) in keys.iter_mut().enumerate() {
            *k = mix(key ^ mix(r as u64 + 1));
        }
        Permutation {
            n,
            half,
            mask: (1u64 << half) - 1,
            keys,
        }
    }

    /// The size of the domain.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether the domain is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Where `x` (< `n`) goes.
    #[inline]
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        // Cycle-walking: the network permutes 0..2^bits; values that land outside 0..n are
        // sent through again until they land inside, which keeps it a bijection on 0..n.
        let mut y = self.network(x);
        while y >= self.n {
            y = self.network(y);
        }
        y
    }

    #[inline]
    fn network(&self, x: u64) -> u64 {
        let (mut left, mut right) = (x >> self.half, x & self.mask);
        for k in self.keys {
            let next = left ^ (mix(right ^ k) & self.mask);
            left = right;
            right = next;
        }
        (left << self.half) | right
    }
}

/// A 64-bit finalizer with full avalanche (splitmix64's), fixed here so that orders never
/// change with a dependency.
#[inline]
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Every size, every key: a bijection of 0..n.
        #[test]
        fn is_a_bijection(n in prop_oneof![0u64..70, 70u64..5000], key: u64) {
            let p = Permutation::new(n, key);
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = p.apply(x);
                prop_assert!(y < n);
                prop_assert!(!seen[y as usize]);
                seen[y as usize] = true;
            }
        }
    }

    #[test]
    fn keys_give_different_orders_and_the_order_mixes() {
        let n = 65_536;
        let a: Vec<u64> = (0..n).map(|x| Permutation::new(n, 1).apply(x)).collect();
        let b: Vec<u64> = (0..n).map(|x| Permutation::new(n, 2).apply(x)).collect();
        assert_ne!(a, b);
        // Neighbours land far apart: few consecutive inputs stay consecutive.
        let adjacent = a.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(adjacent < 20, "{adjacent} adjacent pairs");
        // Each quarter of the inputs spreads over the whole range.
        let quarter = &a[..n as usize / 4];
        let high = quarter.iter().filter(|&&y| y >= n / 2).count();
        assert!(
            (6_000..10_400).contains(&high),
            "{high} of 16384 in the upper half"
        );
    }

    #[test]
    fn a_fixed_key_gives_a_fixed_order() {
        // Pinned: a change here changes every user's shuffled epochs.
        let p = Permutation::new(10, 42);
        let got: Vec<u64> = (0..10).map(|x| p.apply(x)).collect();
        assert_eq!(got, PINNED);
    }

    const PINNED: [u64; 10] = [4, 5, 1, 7, 0, 3, 9, 2, 6, 8];
}
