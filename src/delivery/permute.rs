//! A keyed bijection on `0..n` for any `n`: a balanced Feistel network over the smallest
//! even number of bits that covers `n`, with cycle-walking for values past `n`; and the
//! keyed Fisher–Yates shuffle that orders units and strata.
//!
//! Hand-written because it must be O(1) per value, allocation-free and fixed forever (a
//! change would change every user's shuffled order); the crates that offer format-preserving
//! permutations either allocate a table, need a power-of-two domain, or do not promise a
//! stable output across versions.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// Rounds of the network: six, beyond the four Luby–Rackoff needs for a pseudorandom
/// permutation, so that a cheap round function still mixes well.
const ROUNDS: u64 = 6;

/// A bijection on `0..n` chosen by `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    /// Bits of each half.
    half: u32,
    mask: u64,
    /// Each round's key: what the right half is XORed with, and an odd multiplier.
    keys: [(u64, u64); ROUNDS as usize],
}

impl Permutation {
    /// The permutation of `0..n` for `key` (`n` may be 0).
    pub fn new(n: u64, key: u64) -> Self {
        // Bits to cover 0..n, at least 2 and even, so that the domain is at most 4n and
        // cycle-walking takes fewer than 4 tries on average (none for powers of four).
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let half = bits.div_ceil(2);
        let mut keys = [(0, 0); ROUNDS as usize];
        for (r, k) in keys.iter_mut().enumerate() {
            let round = mix(key ^ mix(r as u64 + 1));
            *k = (round, mix(round) | 1);
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
        // The round function is a multiply-shift hash (the top `half` bits of a product
        // with a random odd multiplier, which depend on every bit of the input): one
        // multiply a round where a full 64-bit finalizer took two and made placing each
        // row most of a shuffled reader's delivery cost.
        let shift = 64 - self.half;
        let (mut left, mut right) = (x >> self.half, x & self.mask);
        for (add, mul) in self.keys {
            let next = left ^ ((right ^ add).wrapping_mul(mul) >> shift);
            left = right;
            right = next;
        }
        (left << self.half) | right
    }
}

/// Fisher–Yates over `items`, drawn from a PCG generator seeded by `seed`: the unit order of
/// a shuffled epoch and a strided window's strata. Fixed here, draw included, so that
/// orders do not change with the `rand` version.
pub(crate) fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    for i in (1..items.len()).rev() {
        items.swap(i, below(&mut rng, i as u64 + 1) as usize);
    }
}

/// A draw in `0..n` (n > 0) by multiply-shift.
fn below(rng: &mut Pcg64Mcg, n: u64) -> u64 {
    ((rng.next_u64() as u128 * n as u128) >> 64) as u64
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
pub(super) mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The chi-square statistic of `counts` against `expected` in every cell, per cell:
    /// about 1 for counts spread uniformly.
    pub(in crate::delivery) fn chi_square_per_cell(counts: &[u64], expected: f64) -> f64 {
        counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum::<f64>()
            / counts.len() as f64
    }

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

    /// Over many keys, every input lands on every output about equally often (a
    /// chi-square per cell near 1): the round function leaves no position favoured, with
    /// cycle-walking (37) and without (64). Domains under about 16 values, where each half
    /// has two bits, are measurably uneven (chi-square 2–4 per cell at 10, with this
    /// round function or a full 64-bit one): only an epoch's last window can be that small.
    #[test]
    fn keys_spread_every_input_over_every_output() {
        const PER_CELL: u64 = 2_000;
        for n in [37u64, 64] {
            let mut count = vec![0u64; (n * n) as usize];
            for key in 0..PER_CELL * n {
                let p = Permutation::new(n, mix(key));
                for x in 0..n {
                    count[(x * n + p.apply(x)) as usize] += 1;
                }
            }
            let chi = chi_square_per_cell(&count, PER_CELL as f64);
            // About 1 ± 0.04 for a uniform spread over this many cells.
            assert!(chi < 1.25, "n {n}: chi-square per cell {chi:.2}");
        }
    }

    #[test]
    fn a_fixed_key_gives_a_fixed_order() {
        // Pinned: a change here changes every user's shuffled epochs.
        let p = Permutation::new(10, 42);
        let got: Vec<u64> = (0..10).map(|x| p.apply(x)).collect();
        assert_eq!(got, PINNED);
    }

    const PINNED: [u64; 10] = [3, 7, 1, 5, 8, 0, 9, 4, 6, 2];
}
