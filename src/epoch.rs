//! `EpochPlan`: which row goes to which rank at which step, as a pure function of the
//! input's layout, the world size, the batch size and the seed.
//!
//! An epoch's *order* is the sequence of all input rows: units (row groups, files) in
//! input order, or permuted per epoch with `--shuffle`, their rows in turn mixed through a
//! bounded shuffle buffer. Global step `g` is rows `[g·W·B, (g+1)·W·B)` of the order, and
//! rank `r` gets rows `[r·B, (r+1)·B)` of each global step. So every rank takes the same
//! number of steps and every batch has exactly `B` rows: the last, short global step is
//! filled with padding rows (`pad`) or left out (`drop`).

use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::error::{Error, Result};

/// What happens to the rows of a last global step that is not full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LastBatch {
    /// Fill it up with padding rows marked `is_padding = true`.
    #[default]
    Pad,
    /// Leave those rows out of the epoch (counted as dropped).
    Drop,
}

impl FromStr for LastBatch {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "pad" => Ok(LastBatch::Pad),
            "drop" => Ok(LastBatch::Drop),
            _ => Err(Error::Usage(format!(
                "unknown last-batch policy `{s}` (expected `pad` or `drop`)"
            ))),
        }
    }
}

/// Where one position of an epoch's order is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Step within the epoch.
    pub step: u64,
    /// Data-parallel rank.
    pub rank: usize,
    /// Row within that rank's batch.
    pub slot: usize,
}

/// The delivery plan of a run: fixed before any data is read and the same on every worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    unit_rows: Vec<u64>,
    /// `row_id` of each unit's first row.
    unit_first: Vec<u64>,
    rows: u64,
    world_size: usize,
    batch_size: usize,
    last_batch: LastBatch,
    seed: u64,
    /// Shuffle buffer rows; `None` keeps input order.
    shuffle: Option<usize>,
}

impl EpochPlan {
    /// A plan over units holding `unit_rows` rows each (in input order).
    pub fn new(
        unit_rows: Vec<u64>,
        world_size: usize,
        batch_size: usize,
        last_batch: LastBatch,
        seed: u64,
        shuffle: Option<usize>,
    ) -> Result<Self> {
        if world_size == 0 || batch_size == 0 {
            return Err(Error::Usage(format!(
                "need --ranks >= 1 and --batch-size >= 1 (got {world_size} and {batch_size})"
            )));
        }
        if shuffle == Some(0) {
            return Err(Error::Usage("--shuffle-buffer must be at least 1".into()));
        }
        let mut unit_first = Vec::with_capacity(unit_rows.len());
        let mut rows = 0u64;
        for &n in &unit_rows {
            unit_first.push(rows);
            rows += n;
        }
        Ok(EpochPlan {
            unit_rows,
            unit_first,
            rows,
            world_size,
            batch_size,
            last_batch,
            seed,
            shuffle,
        })
    }

    /// Input rows per epoch.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Rows of unit `u`.
    pub fn unit_rows(&self, u: usize) -> u64 {
        self.unit_rows[u]
    }

    /// Data-parallel ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Rows per rank per step.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// What happens to a last step that is not full.
    pub fn last_batch(&self) -> LastBatch {
        self.last_batch
    }

    /// Rows of one global step (all ranks).
    pub fn step_rows(&self) -> u64 {
        (self.world_size * self.batch_size) as u64
    }

    /// Steps each rank takes per epoch.
    pub fn steps(&self) -> u64 {
        match self.last_batch {
            LastBatch::Pad => self.rows.div_ceil(self.step_rows()),
            LastBatch::Drop => self.rows / self.step_rows(),
        }
    }

    /// Padding rows added per epoch.
    pub fn padded_rows(&self) -> u64 {
        self.steps() * self.step_rows() - self.delivered_rows()
    }

    /// Input rows left out per epoch.
    pub fn dropped_rows(&self) -> u64 {
        self.rows - self.delivered_rows()
    }

    /// Real rows delivered per epoch.
    pub fn delivered_rows(&self) -> u64 {
        self.rows.min(self.steps() * self.step_rows())
    }

    /// Where position `pos` of an epoch's order goes; `None` when it is dropped.
    pub fn place(&self, pos: u64) -> Option<Place> {
        if pos >= self.delivered_rows() {
            return None;
        }
        let within = (pos % self.step_rows()) as usize;
        Some(Place {
            step: pos / self.step_rows(),
            rank: within / self.batch_size,
            slot: within % self.batch_size,
        })
    }

    /// Whether rows are shuffled.
    pub fn shuffled(&self) -> bool {
        self.shuffle.is_some()
    }

    /// The units in the order epoch `epoch` reads them.
    pub fn unit_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.unit_rows.len()).collect();
        if self.shuffle.is_some() {
            let mut rng = self.rng(epoch, 0);
            // Fisher–Yates with a bounded draw that is the same in every version.
            for i in (1..order.len()).rev() {
                order.swap(i, below(&mut rng, i as u64 + 1) as usize);
            }
        }
        order
    }

    /// Units in `unit_order(epoch)` order as `(unit, first position, rows)`, empty ones
    /// left out.
    pub fn unit_positions(&self, epoch: u64) -> Vec<(usize, u64, u64)> {
        let mut pos = 0;
        let mut out = Vec::new();
        for u in self.unit_order(epoch) {
            let rows = self.unit_rows[u];
            if rows > 0 {
                out.push((u, pos, rows));
            }
            pos += rows;
        }
        out
    }

    /// The shuffle buffer of epoch `epoch`: rows go in in unit order and come out in the
    /// epoch's order. Generic so that the plan (row ids) and the dataflow (rows of batches)
    /// run the very same sequence of draws.
    pub fn shuffler<T>(&self, epoch: u64) -> Shuffler<T> {
        Shuffler {
            buffer: Vec::with_capacity(self.shuffle.unwrap_or(0).min(1 << 20)),
            capacity: self.shuffle.unwrap_or(0),
            rng: self.rng(epoch, 1),
        }
    }

    /// The `row_id`s of epoch `epoch` in delivery order (before dropping and padding).
    pub fn order(&self, epoch: u64) -> impl Iterator<Item = u64> + '_ {
        let mut shuffler = Some(self.shuffler(epoch));
        let units = self.unit_order(epoch);
        let rows = units.into_iter().flat_map(move |u| {
            let first = self.unit_first[u];
            first..first + self.unit_rows[u]
        });
        let mut tail = None::<std::vec::IntoIter<u64>>;
        let mut rows = rows.fuse();
        std::iter::from_fn(move || {
            loop {
                if let Some(t) = &mut tail {
                    return t.next();
                }
                match rows.next() {
                    Some(r) => {
                        if let Some(out) = shuffler.as_mut().and_then(|s| s.push(r)) {
                            return Some(out);
                        }
                    }
                    None => {
                        tail = Some(
                            shuffler
                                .take()
                                .map(Shuffler::drain)
                                .unwrap_or_default()
                                .into_iter(),
                        )
                    }
                }
            }
        })
    }

    /// Which units of epoch `epoch` need not be read when delivery starts at `start_step`:
    /// all their rows fall in the steps before it. Indexed by unit.
    pub fn skippable(&self, epoch: u64, start_step: u64) -> Vec<bool> {
        let skip_rows = start_step.saturating_mul(self.step_rows()).min(self.rows);
        if skip_rows == 0 {
            return vec![false; self.unit_rows.len()];
        }
        let mut seen = vec![0u64; self.unit_rows.len()];
        for row in self.order(epoch).take(skip_rows as usize) {
            let u = self.unit_first.partition_point(|&f| f <= row) - 1;
            // Skip empty units that share a first row with this one.
            let u = (u..self.unit_rows.len())
                .find(|&u| self.unit_first[u] + self.unit_rows[u] > row)
                .unwrap_or(u);
            seen[u] += 1;
        }
        (0..self.unit_rows.len())
            .map(|u| self.unit_rows[u] > 0 && seen[u] == self.unit_rows[u])
            .collect()
    }

    fn rng(&self, epoch: u64, stream: u64) -> Pcg64Mcg {
        // Distinct, well-mixed seeds per (seed, epoch, stream).
        let mix = xxhash_rust::xxh64::xxh64(
            &[
                self.seed.to_le_bytes(),
                epoch.to_le_bytes(),
                stream.to_le_bytes(),
            ]
            .concat(),
            0,
        );
        Pcg64Mcg::seed_from_u64(mix)
    }
}

/// A bounded shuffle buffer: once full, each row pushed in displaces a uniformly drawn
/// row, which comes out. Memory is the buffer's capacity, whatever the dataset.
#[derive(Debug)]
pub struct Shuffler<T> {
    buffer: Vec<T>,
    capacity: usize,
    rng: Pcg64Mcg,
}

impl<T> Shuffler<T> {
    /// Takes a row in; returns the row that leaves the buffer, if one does.
    pub fn push(&mut self, item: T) -> Option<T> {
        if self.buffer.len() < self.capacity {
            self.buffer.push(item);
            return None;
        }
        if self.capacity == 0 {
            return Some(item);
        }
        let j = below(&mut self.rng, self.capacity as u64) as usize;
        Some(std::mem::replace(&mut self.buffer[j], item))
    }

    /// Rows still held, in the order they leave at the end of the epoch.
    pub fn drain(mut self) -> Vec<T> {
        for i in (1..self.buffer.len()).rev() {
            let j = below(&mut self.rng, i as u64 + 1) as usize;
            self.buffer.swap(i, j);
        }
        self.buffer
    }

    /// The rows held, to rewrite in place (their order in the buffer is kept).
    pub fn held_mut(&mut self) -> &mut [T] {
        &mut self.buffer
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether no rows are held.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

/// A draw in `0..n` (n > 0) by multiply-shift, fixed here so that orders do not change
/// with the `rand` version.
fn below(rng: &mut Pcg64Mcg, n: u64) -> u64 {
    ((rng.next_u64() as u128 * n as u128) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    fn plan(
        units: Vec<u64>,
        w: usize,
        b: usize,
        last: LastBatch,
        shuffle: Option<usize>,
    ) -> EpochPlan {
        EpochPlan::new(units, w, b, last, 7, shuffle).unwrap()
    }

    fn layouts() -> impl Strategy<Value = (Vec<u64>, usize, usize, bool, Option<usize>, u64)> {
        (
            prop::collection::vec(prop_oneof![Just(0u64), 1u64..40, 100u64..300], 0..12),
            prop_oneof![Just(1usize), 2usize..8],
            prop_oneof![Just(1usize), 2usize..50, Just(1000)],
            any::<bool>(),
            prop_oneof![Just(None), (1usize..200).prop_map(Some)],
            0u64..3,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Each epoch is a permutation of the input; every rank takes the same number of
        /// full steps; each real row lands in exactly one (step, rank, slot), and the
        /// slots left over are exactly the padding.
        #[test]
        fn every_row_once_and_equal_steps((units, w, b, pad, shuffle, epoch) in layouts()) {
            let last = if pad { LastBatch::Pad } else { LastBatch::Drop };
            let p = plan(units, w, b, last, shuffle);
            let order: Vec<u64> = p.order(epoch).collect();
            prop_assert_eq!(order.len() as u64, p.rows());
            let distinct: HashSet<u64> = order.iter().copied().collect();
            prop_assert_eq!(distinct.len() as u64, p.rows());
            prop_assert!(order.iter().all(|&r| r < p.rows()));

            let mut slots = HashSet::new();
            let mut per_rank = vec![0u64; w];
            for pos in 0..p.rows() {
                match p.place(pos) {
                    Some(pl) => {
                        prop_assert!(pl.step < p.steps() && pl.rank < w && pl.slot < b);
                        prop_assert!(slots.insert((pl.step, pl.rank, pl.slot)));
                        per_rank[pl.rank] += 1;
                    }
                    None => prop_assert!(pos >= p.delivered_rows()),
                }
            }
            let wb = (w * b) as u64;
            prop_assert_eq!(slots.len() as u64, p.delivered_rows());
            prop_assert_eq!(p.delivered_rows() + p.padded_rows(), p.steps() * wb);
            prop_assert_eq!(p.delivered_rows() + p.dropped_rows(), p.rows());
            match last {
                LastBatch::Pad => {
                    prop_assert_eq!(p.dropped_rows(), 0);
                    prop_assert!(p.padded_rows() < wb);
                    prop_assert_eq!(p.steps(), p.rows().div_ceil(wb));
                }
                LastBatch::Drop => {
                    prop_assert_eq!(p.padded_rows(), 0);
                    prop_assert!(p.dropped_rows() < wb);
                    // Every rank's real rows fill its batches exactly.
                    prop_assert!(per_rank.iter().all(|&n| n == p.steps() * b as u64));
                }
            }
        }

        /// Units said to be skippable at a start step hold only rows delivered before it.
        #[test]
        fn skippable_units_lie_before_the_start((units, w, b, _pad, shuffle, epoch) in layouts(), start in 0u64..6) {
            let p = plan(units, w, b, LastBatch::Pad, shuffle);
            let order: Vec<u64> = p.order(epoch).collect();
            let before = (start * p.step_rows()).min(p.rows()) as usize;
            let early: HashSet<u64> = order[..before].iter().copied().collect();
            let skip = p.skippable(epoch, start);
            for (u, &skipped) in skip.iter().enumerate() {
                let rows = p.unit_first[u]..p.unit_first[u] + p.unit_rows[u];
                if skipped {
                    prop_assert!(rows.clone().all(|r| early.contains(&r)));
                } else if p.unit_rows[u] > 0 {
                    prop_assert!(!rows.clone().all(|r| early.contains(&r)));
                }
            }
        }

        /// The shuffle buffer never holds more than its capacity.
        #[test]
        fn shuffle_buffer_is_bounded(cap in 1usize..64, n in 0usize..500) {
            let p = plan(vec![n as u64], 1, 1, LastBatch::Pad, Some(cap));
            let mut s = p.shuffler::<usize>(0);
            let mut out = 0;
            for i in 0..n {
                out += s.push(i).is_some() as usize;
                prop_assert!(s.len() <= cap);
            }
            prop_assert_eq!(out + s.drain().len(), n);
        }
    }

    #[test]
    fn the_seed_and_epoch_decide_the_order() {
        let units = vec![1000; 20];
        let p = plan(units.clone(), 2, 32, LastBatch::Pad, Some(500));
        let e0: Vec<u64> = p.order(0).collect();
        assert_eq!(e0, p.order(0).collect::<Vec<_>>());
        assert_ne!(e0, p.order(1).collect::<Vec<_>>());
        assert_ne!(e0, (0..20_000).collect::<Vec<_>>());
        let other = EpochPlan::new(units.clone(), 2, 32, LastBatch::Pad, 8, Some(500)).unwrap();
        assert_ne!(e0, other.order(0).collect::<Vec<_>>());
        // Without shuffle the order is the input order, every epoch.
        let plain = plan(units, 2, 32, LastBatch::Pad, None);
        assert_eq!(
            plain.order(3).collect::<Vec<_>>(),
            (0..20_000).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_fixed_seed_gives_a_fixed_order() {
        // Pinned: a change here changes every user's shuffled epochs.
        let p = plan(vec![4, 4], 1, 1, LastBatch::Pad, Some(3));
        assert_eq!(p.order(0).collect::<Vec<_>>(), PINNED);
    }

    const PINNED: [u64; 8] = [4, 7, 0, 1, 5, 2, 6, 3];

    #[test]
    fn bad_plans_are_usage_errors() {
        assert!(EpochPlan::new(vec![1], 0, 1, LastBatch::Pad, 0, None).is_err());
        assert!(EpochPlan::new(vec![1], 1, 0, LastBatch::Pad, 0, None).is_err());
        assert!(EpochPlan::new(vec![1], 1, 1, LastBatch::Pad, 0, Some(0)).is_err());
        assert!("pad".parse::<LastBatch>().is_ok());
        assert!(
            "keep"
                .parse::<LastBatch>()
                .unwrap_err()
                .to_string()
                .contains("pad")
        );
    }

    #[test]
    fn small_cases_by_hand() {
        // 10 rows, 3 ranks of 2: one full step of 6, a last step of 4 real + 2 padding.
        let p = plan(vec![10], 3, 2, LastBatch::Pad, None);
        assert_eq!((p.steps(), p.padded_rows(), p.dropped_rows()), (2, 2, 0));
        assert_eq!(
            p.place(7),
            Some(Place {
                step: 1,
                rank: 0,
                slot: 1
            })
        );
        assert_eq!(
            p.place(9),
            Some(Place {
                step: 1,
                rank: 1,
                slot: 1
            })
        );
        let p = plan(vec![10], 3, 2, LastBatch::Drop, None);
        assert_eq!((p.steps(), p.padded_rows(), p.dropped_rows()), (1, 0, 4));
        assert_eq!(p.place(6), None);
        // Fewer rows than one step, and no rows at all.
        let p = plan(vec![2], 2, 4, LastBatch::Pad, None);
        assert_eq!((p.steps(), p.padded_rows()), (1, 6));
        let p = plan(vec![2], 2, 4, LastBatch::Drop, None);
        assert_eq!((p.steps(), p.dropped_rows()), (0, 2));
        let p = plan(vec![], 2, 4, LastBatch::Pad, None);
        assert_eq!((p.steps(), p.padded_rows(), p.order(0).count()), (0, 0, 0));
    }
}
