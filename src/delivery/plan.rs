//! `EpochPlan`: where every row of an epoch goes — (step, rank, slot) — as a pure function
//! of its position, computed wherever the row is read.
//!
//! An epoch's *positions* are its rows in the order it reads them: the input's units (row
//! groups, files) in input order, or permuted per epoch with `--shuffle`, their rows in
//! turn. Output index `i` is global step `i / (W·B)`, rank `(i mod W·B) / B`, slot
//! `i mod B`, so every rank takes the same number of steps and every batch has exactly `B`
//! rows: the last, short global step is filled with padding rows (`pad`) or left out
//! (`drop`).
//!
//! **Rank-major shares.** An epoch of `N` rows has `F = ⌊N / (W·B)⌋` full steps. Its first
//! `W·F·B` positions are cut into `W` *shares* of `F·B` consecutive positions: share `r`
//! is all of rank `r`'s rows of the full steps, in step order. The remaining positions
//! (fewer than `W·B`, the *tail*) are the last step, laid out across ranks as output
//! indices are (`pad`), or left out (`drop`). So a rank's rows are one contiguous run of
//! positions, and a process reads only the units that feed its own ranks: rows cross
//! processes only in the tail (see `EpochPlan::reads`).
//!
//! Shuffled, positions are permuted inside windows of `K` consecutive positions of a share
//! (or of the tail) by a keyed bijection, so rows mix with their window and a window is
//! all anyone must hold (a block shuffle, as MosaicML's StreamingDataset does); the unit
//! order, permuted per epoch, decides which rows each share holds.
//!
//! A window's bijection (`WindowOrder`, in `window.rs`) is *strided* when the window is
//! `m·B` rows and `K` a multiple of `B`: its `B` strata of `m` consecutive positions each
//! give one row to each of the window's `m` batches — which row to which batch drawn per
//! stratum (keyed by seed, epoch, window and stratum) — and a batch keeps its rows in
//! position order. The rows one featurized batch gives a rank's batch are then one run of
//! slots, so delivery moves runs, not rows. Other windows (a share's short last one, the
//! tail, or `K` not a multiple of `B`) are permuted whole by a Feistel network
//! ([`Permutation`]).
//!
//! Pushed input, whose length is only known at its end, has no shares: its positions are
//! its output indices, windows of `K` permuted as above ([`Placement::new`] without
//! [`Placement::over`]).
//!
//! The order is versioned ([`ORDER_VERSION`]): batches and summaries say which order they
//! follow, and a change to this file that changes an order must bump it.

use std::str::FromStr;

use super::permute::{Permutation, mix, shuffle};
use super::window::WindowOrder;
use crate::error::{Error, Result};

/// The version of the order this plan produces: 5 gives each rank a contiguous share of an
/// epoch's positions (see the module; pushed input is laid out as in 4); 4 laid positions
/// out step-major with strided windows; 3 permuted every window whole with a
/// multiply-shift Feistel network (2 had a splitmix round function, 1 was a sequential
/// shuffle buffer).
pub const ORDER_VERSION: u32 = 5;

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

/// Where one output index of an epoch is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Step within the epoch.
    pub step: u64,
    /// Data-parallel rank.
    pub rank: usize,
    /// Row within that rank's batch.
    pub slot: usize,
}

/// How rows are placed, whatever the number of rows: ranks, batch size, last step, seed and
/// shuffle window. [`EpochPlan`] adds an input's layout; pushed input, whose length is only
/// known at its end, uses this alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    world_size: usize,
    batch_size: usize,
    last_batch: LastBatch,
    seed: u64,
    /// Shuffle window rows; `None` keeps input order.
    window: Option<u64>,
    /// The epoch's rows when known ([`Placement::over`]): positions then fall in rank
    /// shares. `None` for a stream.
    shares_of: Option<u64>,
}

/// A shuffle window: `len` positions from `start`, in the segment (a rank's share, or the
/// tail) that starts at `segment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// First position.
    pub start: u64,
    /// Positions in the window.
    pub len: u64,
    /// First position of its segment.
    segment: u64,
    /// The rank whose share holds it; `None` in the tail or a stream (indices follow
    /// positions there).
    rank: Option<usize>,
    /// What keys its bijection.
    id: u64,
}

impl Placement {
    /// Checks and makes a placement.
    pub fn new(
        world_size: usize,
        batch_size: usize,
        last_batch: LastBatch,
        seed: u64,
        window: Option<u64>,
    ) -> Result<Self> {
        if world_size == 0 || batch_size == 0 {
            return Err(Error::Usage(format!(
                "need --ranks >= 1 and --batch-size >= 1 (got {world_size} and {batch_size})"
            )));
        }
        if (world_size as u64).checked_mul(batch_size as u64).is_none() {
            return Err(Error::Usage(format!(
                "--ranks {world_size} x --batch-size {batch_size} overflows"
            )));
        }
        if window == Some(0) {
            return Err(Error::Usage("--shuffle-window must be at least 1".into()));
        }
        Ok(Placement {
            world_size,
            batch_size,
            last_batch,
            seed,
            window,
            shares_of: None,
        })
    }

    /// This placement for epochs of `rows` rows: each rank's rows of the full steps are one
    /// share of consecutive positions (see the module).
    pub fn over(self, rows: u64) -> Self {
        Placement {
            shares_of: Some(rows),
            ..self
        }
    }

    /// This placement for a stream of unknown length: positions are output indices.
    pub fn stream(self) -> Self {
        Placement {
            shares_of: None,
            ..self
        }
    }

    /// Positions in each rank's share (0 for a stream): its rows of the full steps.
    pub fn share_rows(&self) -> u64 {
        self.shares_of
            .map_or(0, |n| n / self.step_rows() * self.batch_size as u64)
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

    /// Whether rows are shuffled.
    pub fn shuffled(&self) -> bool {
        self.window.is_some()
    }

    /// The shuffle window (1 when unshuffled: each position is its own window).
    pub fn window(&self) -> u64 {
        self.window.unwrap_or(1)
    }

    /// The first position of a stream's window holding position (or output index) `x`
    /// (an epoch's windows start at its shares' starts: [`Placement::time_of`]).
    pub fn window_start(&self, x: u64) -> u64 {
        x - x % self.window()
    }

    /// Steps each rank takes in an epoch of `rows` rows.
    pub fn steps(&self, rows: u64) -> u64 {
        match self.last_batch {
            LastBatch::Pad => rows.div_ceil(self.step_rows()),
            LastBatch::Drop => rows / self.step_rows(),
        }
    }

    /// The output index of position `pos` in epoch `epoch` of `rows` rows. Pass
    /// `u64::MAX` for `rows` while the total of a stream is unknown: only its last window
    /// depends on it, so that is right for every window that is full.
    pub fn index(&self, epoch: u64, pos: u64, rows: u64) -> u64 {
        let w = self.window_at(pos, rows);
        let offset = match self.window {
            None => 0,
            Some(_) => self.window_order(epoch, &w).apply(pos - w.start),
        };
        self.index_in(&w, offset)
    }

    /// The window holding position `pos` of an epoch (or stream) of `rows` rows.
    #[inline]
    pub(crate) fn window_at(&self, pos: u64, rows: u64) -> Window {
        let k = self.window();
        let share = self.share_rows();
        let (segment, end, rank) = match self.shares_of {
            Some(_) if pos < share * self.world_size as u64 => {
                let r = pos / share;
                (r * share, (r + 1) * share, Some(r as usize))
            }
            Some(n) => (share * self.world_size as u64, n.max(pos + 1), None),
            None => (0, rows.max(pos + 1), None),
        };
        let start = pos - (pos - segment) % k;
        Window {
            start,
            len: (end - start).min(k),
            segment,
            rank,
            // A stream keys windows by number (as order 4 did); shares by first position.
            id: if self.shares_of.is_some() {
                start
            } else {
                start / k
            },
        }
    }

    /// The output index of the row that window `w`'s bijection sends to `offset` in it.
    #[inline]
    pub(crate) fn index_in(&self, w: &Window, offset: u64) -> u64 {
        let o = w.start - w.segment + offset;
        match w.rank {
            Some(r) => {
                let b = self.batch_size as u64;
                (o / b) * self.step_rows() + r as u64 * b + o % b
            }
            None => w.segment + o,
        }
    }

    /// The bijection of window `w` in epoch `epoch`, from offsets in the window to
    /// offsets in its output indices. Callers that place many rows of one window make it
    /// once.
    pub(crate) fn window_order(&self, epoch: u64, w: &Window) -> WindowOrder {
        let key = mix(mix(self.seed ^ mix(epoch)) ^ w.id);
        let b = self.batch_size as u64;
        if self.window().is_multiple_of(b) && w.len.is_multiple_of(b) && w.len > 0 {
            WindowOrder::strided(w.len / b, b, key)
        } else {
            WindowOrder::Keyed(Permutation::new(w.len, key))
        }
    }

    /// Positions from `pos` that go, in order, to consecutive output indices of one rank
    /// when unshuffled (at least 1), with the index of `pos`: a rank's rows in a batch
    /// are then runs, moved without placing each row.
    #[inline]
    pub(crate) fn run_at(&self, pos: u64, rows: u64) -> (u64, u64) {
        let w = self.window_at(pos, rows);
        let i = self.index_in(&w, 0);
        let b = self.batch_size as u64;
        let to_boundary = b - i % b;
        let in_segment = match (self.shares_of, w.rank) {
            (Some(_), Some(r)) => (r as u64 + 1) * self.share_rows() - pos,
            _ => u64::MAX,
        };
        (i, to_boundary.min(in_segment))
    }

    /// The time of position `pos` within an epoch of `rows` rows: the step of the first
    /// index of its window (no row of it lands in an earlier step), or the last step in
    /// the tail. Readers stamp rows with it.
    pub fn time_of(&self, pos: u64, rows: u64) -> u64 {
        let w = self.window_at(pos, rows);
        match w.rank {
            Some(_) => (w.start - w.segment) / self.batch_size as u64,
            None => self.index_in(&w, 0) / self.step_rows(),
        }
    }

    /// The earliest time (see [`Placement::time_of`]) a row of step `step` can carry:
    /// every rank's share has the same windows, so it is the same for every rank.
    pub fn step_time(&self, step: u64) -> u64 {
        let full = self.share_rows() / self.batch_size as u64;
        if self.shares_of.is_none() {
            let first = step.saturating_mul(self.step_rows());
            return self.window_start(first) / self.step_rows();
        }
        if step >= full {
            return full;
        }
        let first = step * self.batch_size as u64;
        (first - first % self.window()) / self.batch_size as u64
    }

    /// Whether every full window is strided (see the module): the rows a featurized batch
    /// gives one rank's step are then one run of its slots.
    pub fn strided(&self) -> bool {
        self.window
            .is_some_and(|k| k.is_multiple_of(self.batch_size as u64))
    }

    /// Where output index `i` goes (the step may be past the last for `drop`).
    #[inline]
    pub fn place(&self, i: u64) -> Place {
        let within = i % self.step_rows();
        Place {
            step: i / self.step_rows(),
            rank: (within / self.batch_size as u64) as usize,
            slot: (within % self.batch_size as u64) as usize,
        }
    }

    /// The stream positions that rank `rank`'s rows of step `step` are drawn from: exactly
    /// its output indices when unshuffled, the windows holding them when shuffled (rows
    /// move only within their window). Callers clamp it to the rows there are.
    pub fn positions(&self, step: u64, rank: usize) -> std::ops::Range<u64> {
        let b = self.batch_size as u64;
        let first = step
            .saturating_mul(self.step_rows())
            .saturating_add(rank as u64 * b);
        let last = first.saturating_add(b - 1);
        self.window_start(first)..self.window_start(last).saturating_add(self.window())
    }

    /// The rank output index `i` goes to (what [`Placement::place`] says, cheaper).
    #[inline]
    pub fn rank_of(&self, i: u64) -> usize {
        ((i % self.step_rows()) / self.batch_size as u64) as usize
    }

    /// Real rows rank `rank` receives at step `step` of an epoch of `rows` rows (0 for a
    /// step past the end).
    pub fn real_rows(&self, rows: u64, step: u64, rank: usize) -> usize {
        if step >= self.steps(rows) {
            return 0;
        }
        let first = step * self.step_rows() + (rank * self.batch_size) as u64;
        rows.saturating_sub(first).min(self.batch_size as u64) as usize
    }

    /// The units of an epoch in the order it reads them: `units` in input order, or
    /// permuted (Fisher–Yates from the seed and epoch) when shuffled.
    pub fn unit_order(&self, epoch: u64, units: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..units).collect();
        if self.shuffled() {
            let mix = xxhash_rust::xxh64::xxh64(
                &[self.seed.to_le_bytes(), epoch.to_le_bytes()].concat(),
                0,
            );
            shuffle(&mut order, mix);
        }
        order
    }
}

/// Which process, and which worker, owns a rank: rank `r` belongs to process
/// `⌊r·P/W⌋` (the block of local ranks torchrun gives each node) and, inside it, to
/// worker `(r - first local rank) mod T`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// Ranks (world size).
    pub world_size: usize,
    /// Processes in the cluster.
    pub processes: usize,
    /// Worker threads per process.
    pub workers: usize,
}

impl Ownership {
    /// The process that owns `rank`.
    pub fn process(&self, rank: usize) -> usize {
        rank * self.processes / self.world_size
    }

    /// The ranks process `process` owns (a contiguous block, maybe empty).
    pub fn ranks(&self, process: usize) -> std::ops::Range<usize> {
        // The first rank r with r·P/W >= process is ceil(process·W/P).
        let first = |p: usize| (p * self.world_size).div_ceil(self.processes);
        first(process)..first(process + 1).min(self.world_size)
    }

    /// The global index of the worker that owns `rank` (timely numbers workers
    /// process by process).
    pub fn worker(&self, rank: usize) -> usize {
        let p = self.process(rank);
        p * self.workers + (rank - self.ranks(p).start) % self.workers
    }
}

/// The delivery plan of a run over an input's units: fixed before any data is read and
/// the same on every worker and process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    placement: Placement,
    unit_rows: Vec<u64>,
    rows: u64,
}

impl EpochPlan {
    /// A plan over units holding `unit_rows` rows each (in input order).
    pub fn new(
        unit_rows: Vec<u64>,
        world_size: usize,
        batch_size: usize,
        last_batch: LastBatch,
        seed: u64,
        shuffle_window: Option<u64>,
    ) -> Result<Self> {
        let rows = unit_rows.iter().sum();
        let placement =
            Placement::new(world_size, batch_size, last_batch, seed, shuffle_window)?.over(rows);
        Ok(EpochPlan {
            placement,
            unit_rows,
            rows,
        })
    }

    /// How rows are placed.
    pub fn placement(&self) -> &Placement {
        &self.placement
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
        self.placement.world_size
    }

    /// Rows per rank per step.
    pub fn batch_size(&self) -> usize {
        self.placement.batch_size
    }

    /// What happens to a last step that is not full.
    pub fn last_batch(&self) -> LastBatch {
        self.placement.last_batch
    }

    /// Rows of one global step (all ranks).
    pub fn step_rows(&self) -> u64 {
        self.placement.step_rows()
    }

    /// Steps each rank takes per epoch.
    pub fn steps(&self) -> u64 {
        self.placement.steps(self.rows)
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

    /// Whether rows are shuffled.
    pub fn shuffled(&self) -> bool {
        self.placement.shuffled()
    }

    /// The output index of position `pos` of epoch `epoch`.
    pub fn index(&self, epoch: u64, pos: u64) -> u64 {
        self.placement.index(epoch, pos, self.rows)
    }

    /// Where position `pos` of epoch `epoch` goes; `None` when it is dropped.
    pub fn place(&self, epoch: u64, pos: u64) -> Option<Place> {
        let i = self.index(epoch, pos);
        (i < self.delivered_rows()).then(|| self.placement.place(i))
    }

    /// Units in the order epoch `epoch` reads them, as `(unit, first position, rows)`,
    /// empty ones left out.
    pub fn unit_positions(&self, epoch: u64) -> Vec<(usize, u64, u64)> {
        let mut pos = 0;
        let mut out = Vec::new();
        for u in self.placement.unit_order(epoch, self.unit_rows.len()) {
            let rows = self.unit_rows[u];
            if rows > 0 {
                out.push((u, pos, rows));
            }
            pos += rows;
        }
        out
    }

    /// The `row_id`s of epoch `epoch` in output order (before dropping and padding): for
    /// tests and tools, O(rows) memory.
    pub fn order(&self, epoch: u64) -> Vec<u64> {
        let mut first = Vec::with_capacity(self.unit_rows.len());
        let mut row = 0;
        for &n in &self.unit_rows {
            first.push(row);
            row += n;
        }
        let mut out = vec![u64::MAX; self.rows as usize];
        for (u, pos, rows) in self.unit_positions(epoch) {
            for k in 0..rows {
                out[self.index(epoch, pos + k) as usize] = first[u] + k;
            }
        }
        out
    }

    /// The ranks that receive rows of the tail (the last step's rows when it is not full):
    /// a catch-up run for one of them reads the tail too.
    pub fn tail_ranks(&self) -> std::ops::Range<usize> {
        let body = self.placement.share_rows() * self.world_size() as u64;
        let tail = self.delivered_rows().saturating_sub(body);
        0..tail.div_ceil(self.batch_size() as u64) as usize
    }

    /// What a reader of `ranks` must read of epoch `epoch` to deliver its steps from
    /// `start_step` on: the part of each rank's share from the window holding the start
    /// step's first row, and with `tail`, the delivered tail. Cut at unit boundaries and in
    /// time order (ties in position order), so that readers merging them advance through
    /// the steps of every rank together.
    pub fn reads(
        &self,
        epoch: u64,
        ranks: std::ops::Range<usize>,
        tail: bool,
        start_step: u64,
    ) -> Vec<Read> {
        let p = &self.placement;
        let (b, share) = (self.batch_size() as u64, p.share_rows());
        let mut wanted = Vec::new();
        if start_step.saturating_mul(b) < share {
            let first = start_step * b;
            let from = first - first % p.window();
            wanted
                .extend(ranks.map(|r| (Some(r), r as u64 * share + from..(r as u64 + 1) * share)));
        }
        let body = share * self.world_size() as u64;
        if tail && body < self.delivered_rows() && start_step <= share / b {
            wanted.push((None, body..self.delivered_rows()));
        }
        let mut reads = Vec::new();
        for (unit, first, rows) in self.unit_positions(epoch) {
            for (rank, range) in &wanted {
                let (lo, hi) = (range.start.max(first), range.end.min(first + rows));
                if lo < hi {
                    reads.push(Read {
                        unit,
                        skip: lo - first,
                        rows: hi - lo,
                        pos: lo,
                        time: p.time_of(lo, self.rows),
                        rank: *rank,
                    });
                }
            }
        }
        reads.sort_by_key(|r| (r.time, r.pos));
        reads
    }
}

/// Rows of one unit a reader reads: `rows` rows from the unit's row `skip`, at positions
/// `pos..` of the epoch; the first has time `time` ([`Placement::time_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// The unit (its index in the input).
    pub unit: usize,
    /// Rows of the unit before the first read.
    pub skip: u64,
    /// Rows read.
    pub rows: u64,
    /// Position of the first.
    pub pos: u64,
    /// Time of the first.
    pub time: u64,
    /// The rank whose share it is (`None`: the tail).
    pub rank: Option<usize>,
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
        window: Option<u64>,
    ) -> EpochPlan {
        EpochPlan::new(units, w, b, last, 7, window).unwrap()
    }

    type Layout = (Vec<u64>, usize, usize, bool, Option<u64>, u64);

    fn layouts() -> impl Strategy<Value = Layout> {
        (
            prop::collection::vec(prop_oneof![Just(0u64), 1u64..40, 100u64..300], 0..12),
            prop_oneof![Just(1usize), 2usize..8],
            prop_oneof![Just(1usize), 2usize..50, Just(1000)],
            any::<bool>(),
            prop_oneof![Just(None), (1u64..200).prop_map(Some), Just(Some(1 << 20))],
            0u64..3,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Each epoch is a bijection of its positions; every rank takes the same number of
        /// full steps; each real row lands in exactly one (step, rank, slot), and the slots
        /// left over are exactly the padding.
        #[test]
        fn every_row_once_and_equal_steps((units, w, b, pad, window, epoch) in layouts()) {
            let last = if pad { LastBatch::Pad } else { LastBatch::Drop };
            let p = plan(units, w, b, last, window);
            let mut indices = HashSet::new();
            let mut slots = HashSet::new();
            let mut per_rank = vec![0u64; w];
            for pos in 0..p.rows() {
                let i = p.index(epoch, pos);
                prop_assert!(i < p.rows());
                prop_assert!(indices.insert(i));
                match p.place(epoch, pos) {
                    Some(pl) => {
                        prop_assert!(pl.step < p.steps() && pl.rank < w && pl.slot < b);
                        prop_assert!(slots.insert((pl.step, pl.rank, pl.slot)));
                        per_rank[pl.rank] += 1;
                    }
                    None => prop_assert!(i >= p.delivered_rows()),
                }
            }
            let wb = (w * b) as u64;
            prop_assert_eq!(slots.len() as u64, p.delivered_rows());
            prop_assert_eq!(p.delivered_rows() + p.padded_rows(), p.steps() * wb);
            prop_assert_eq!(p.delivered_rows() + p.dropped_rows(), p.rows());
            for (r, &n) in per_rank.iter().enumerate() {
                let real: u64 = (0..p.steps())
                    .map(|s| p.placement().real_rows(p.rows(), s, r) as u64)
                    .sum();
                prop_assert_eq!(real, n);
            }
            match last {
                LastBatch::Pad => {
                    prop_assert_eq!(p.dropped_rows(), 0);
                    prop_assert!(p.padded_rows() < wb);
                    prop_assert_eq!(p.steps(), p.rows().div_ceil(wb));
                }
                LastBatch::Drop => {
                    prop_assert_eq!(p.padded_rows(), 0);
                    prop_assert!(p.dropped_rows() < wb);
                    prop_assert!(per_rank.iter().all(|&n| n == p.steps() * b as u64));
                }
            }
            // The order lists every row once.
            let order = p.order(epoch);
            prop_assert_eq!(order.iter().copied().collect::<HashSet<_>>().len() as u64, p.rows());
        }

        /// A row moves only within its window, which lies in one rank's share (or the
        /// tail).
        #[test]
        fn rows_stay_in_their_window((units, w, b, _pad, window, epoch) in layouts()) {
            let p = plan(units, w, b, LastBatch::Pad, window);
            let pl = p.placement();
            for pos in 0..p.rows() {
                let win = pl.window_at(pos, p.rows());
                let i = p.index(epoch, pos);
                let hit = (0..win.len).any(|o| pl.index_in(&win, o) == i);
                prop_assert!(hit, "position {} went to {} outside {:?}", pos, i, win);
                let share = pl.share_rows();
                if pos < share * w as u64 {
                    prop_assert_eq!(win.rank, Some((pos / share) as usize));
                    prop_assert!(win.start + win.len <= (pos / share + 1) * share);
                }
            }
        }

        /// Each rank's rows of the full steps come from its share, in step order: a row's
        /// time is no later than its step, and no earlier than the step's time.
        #[test]
        fn ranks_take_their_share_and_times_lead_steps((units, w, b, pad, window, epoch) in layouts()) {
            let last = if pad { LastBatch::Pad } else { LastBatch::Drop };
            let p = plan(units, w, b, last, window);
            let pl = p.placement();
            let (share, full) = (pl.share_rows(), p.rows() / p.step_rows());
            prop_assert_eq!(share, full * b as u64);
            for pos in 0..p.rows() {
                let Some(place) = p.place(epoch, pos) else { continue };
                let t = pl.time_of(pos, p.rows());
                prop_assert!(pl.step_time(place.step) <= t && t <= place.step);
                if pos < share * w as u64 {
                    prop_assert_eq!(place.rank as u64, pos / share);
                    prop_assert!(place.step < full);
                } else {
                    prop_assert_eq!(place.step, full);
                }
            }
        }

        /// A strided window (`m·B` rows, `K` a multiple of `B`) gives each of its `m`
        /// batches one row of each stratum of `m` consecutive positions, at the stratum's
        /// slot: a batch's rows keep their order.
        #[test]
        fn strided_windows_take_one_row_per_stratum(
            units in prop::collection::vec(prop_oneof![Just(0u64), 1u64..40, 100u64..300], 0..12),
            (w, b, m) in (1usize..5, 1usize..20, 1u64..20),
            epoch in 0u64..3,
        ) {
            let p = plan(units, w, b, LastBatch::Pad, Some(m * b as u64));
            let pl = p.placement();
            let b = b as u64;
            prop_assert!(pl.strided());
            for pos in 0..pl.share_rows() * w as u64 {
                let win = pl.window_at(pos, p.rows());
                prop_assert_eq!(win.len % b, 0);
                let m = win.len / b;
                let i = p.index(epoch, pos);
                // The index's offset in the share, then in the window.
                let at = (i / p.step_rows()) * b + i % b - (win.start - win.segment);
                prop_assert_eq!(at % b, (pos - win.start) / m);
            }
        }

        /// The reads of a set of ranks cover, once each and in time order, every position
        /// whose row those ranks receive from the start step on, and only positions of
        /// their shares (and the tail, when asked): split between processes, every needed
        /// row is read exactly once.
        #[test]
        fn reads_cover_what_ranks_need_once(
            (units, w, b, pad, window, epoch) in layouts(),
            start in 0u64..6,
            cut in 0usize..8,
        ) {
            let last = if pad { LastBatch::Pad } else { LastBatch::Drop };
            let p = plan(units, w, b, last, window);
            let cut = cut.min(w);
            let parts = [p.reads(epoch, 0..cut, true, start), p.reads(epoch, cut..w, false, start)];
            let share = p.placement().share_rows();
            let mut seen = vec![0u32; p.rows() as usize];
            for (k, reads) in parts.iter().enumerate() {
                let keys: Vec<_> = reads.iter().map(|r| (r.time, r.pos)).collect();
                prop_assert!(keys.windows(2).all(|x| x[0] <= x[1]));
                for r in reads {
                    prop_assert!(r.skip + r.rows <= p.unit_rows(r.unit));
                    prop_assert_eq!(r.time, p.placement().time_of(r.pos, p.rows()));
                    for pos in r.pos..r.pos + r.rows {
                        seen[pos as usize] += 1;
                        let owner = if pos < share * w as u64 { (pos / share) as usize } else { usize::MAX };
                        match k {
                            0 => prop_assert!(owner < cut || owner == usize::MAX),
                            _ => prop_assert!((cut..w).contains(&owner)),
                        }
                    }
                }
            }
            for pos in 0..p.rows() {
                let needed = p.place(epoch, pos).is_some_and(|pl| pl.step >= start);
                prop_assert!(seen[pos as usize] <= 1);
                if needed {
                    prop_assert_eq!(seen[pos as usize], 1, "position {} is not read", pos);
                }
            }
        }

        /// A stream's placement (total unknown) places its full windows as it does once
        /// the total is known.
        #[test]
        fn a_stream_places_full_windows_alike((units, w, b, _pad, window, epoch) in layouts()) {
            let p = plan(units, w, b, LastBatch::Pad, window);
            let stream = p.placement().stream();
            let k = stream.window();
            let full = p.rows() - p.rows() % k;
            for pos in 0..full {
                prop_assert_eq!(stream.index(epoch, pos, u64::MAX), stream.index(epoch, pos, p.rows()));
            }
        }

        /// Every rank has exactly one owner; a process owns a contiguous block; the owning
        /// worker lives in the owning process.
        #[test]
        fn every_rank_has_one_owner(w in 1usize..40, procs in 1usize..9, threads in 1usize..5) {
            let o = Ownership { world_size: w, processes: procs, workers: threads };
            let mut owned = vec![0; w];
            for p in 0..procs {
                for r in o.ranks(p) {
                    owned[r] += 1;
                    prop_assert_eq!(o.process(r), p);
                    prop_assert_eq!(o.worker(r) / threads, p);
                }
            }
            prop_assert!(owned.iter().all(|&n| n == 1));
        }
    }

    #[test]
    fn the_seed_and_epoch_decide_the_order() {
        let units = vec![1000; 20];
        let p = plan(units.clone(), 2, 32, LastBatch::Pad, Some(500));
        let e0 = p.order(0);
        assert_eq!(e0, p.order(0));
        assert_ne!(e0, p.order(1));
        assert_ne!(e0, (0..20_000).collect::<Vec<_>>());
        let other = EpochPlan::new(units.clone(), 2, 32, LastBatch::Pad, 8, Some(500)).unwrap();
        assert_ne!(e0, other.order(0));
        // Without shuffle each rank's share is input order, every epoch: 312 full steps
        // of 2 x 32, rank 0 rows 0..9984, rank 1 rows 9984..19968, the tail in order.
        let plain = plan(units, 2, 32, LastBatch::Pad, None);
        let order = plain.order(3);
        let rank = |r: u64| -> Vec<u64> {
            (0..312 * 32)
                .map(|k| order[((k / 32) * 64 + r * 32 + k % 32) as usize])
                .collect()
        };
        assert_eq!(rank(0), (0..9984).collect::<Vec<_>>());
        assert_eq!(rank(1), (9984..19_968).collect::<Vec<_>>());
        assert_eq!(order[19_968..], (19_968..20_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_fixed_seed_gives_a_fixed_order() {
        // Pinned: a change here changes every user's shuffled epochs (bump ORDER_VERSION).
        let p = plan(vec![4, 4], 1, 1, LastBatch::Pad, Some(3));
        assert_eq!(p.order(0), PINNED);
    }

    const PINNED: [u64; 8] = [2, 1, 0, 4, 3, 5, 7, 6];

    #[test]
    fn a_fixed_seed_gives_a_fixed_strided_order() {
        // Pinned as above: 2 ranks of 2, windows of 8 (a rank's share: four batches, each
        // taking one row of each stratum of 4).
        let p = plan(vec![8, 8], 2, 2, LastBatch::Pad, Some(8));
        assert_eq!(p.order(0), PINNED_STRIDED);
    }

    const PINNED_STRIDED: [u64; 16] = [3, 7, 9, 12, 1, 4, 11, 15, 2, 5, 8, 13, 0, 6, 10, 14];

    /// Over the strata of Criteo-sized windows (m = 16 batches), each row of a stratum
    /// goes to each batch about equally often (a chi-square per cell near 1).
    #[test]
    fn strata_spread_their_rows_over_every_batch() {
        let (k, b) = (65_536u64, 4_096u64);
        let m = k / b;
        let placement = Placement::new(2, b as usize, LastBatch::Pad, 3, Some(k)).unwrap();
        let mut count = vec![0u64; (m * m) as usize];
        for window in 0..8 {
            let mut order = placement.window_order(0, &placement.window_at(window * k, u64::MAX));
            for o in 0..k {
                let j = order.apply(o) / b;
                count[((o % m) * m + j) as usize] += 1;
            }
        }
        let expected = (8 * k / (m * m)) as f64;
        let chi: f64 = count
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum::<f64>()
            / count.len() as f64;
        assert!(chi < 1.3, "chi-square per cell {chi:.2}");
    }

    #[test]
    fn bad_plans_are_usage_errors() {
        assert!(EpochPlan::new(vec![1], 0, 1, LastBatch::Pad, 0, None).is_err());
        assert!(EpochPlan::new(vec![1], 1, 0, LastBatch::Pad, 0, None).is_err());
        assert!(EpochPlan::new(vec![1], 1, 1, LastBatch::Pad, 0, Some(0)).is_err());
        assert!(EpochPlan::new(vec![1], usize::MAX, 2, LastBatch::Pad, 0, None).is_err());
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
        let at = |step, rank, slot| Some(Place { step, rank, slot });
        assert_eq!(p.place(0, 7), at(1, 0, 1));
        assert_eq!(p.place(0, 9), at(1, 1, 1));
        assert_eq!(p.placement().real_rows(10, 1, 1), 2);
        assert_eq!(p.placement().real_rows(10, 1, 2), 0);
        let p = plan(vec![10], 3, 2, LastBatch::Drop, None);
        assert_eq!((p.steps(), p.padded_rows(), p.dropped_rows()), (1, 0, 4));
        assert_eq!(p.place(0, 6), None);
        // Fewer rows than one step, and no rows at all.
        let p = plan(vec![2], 2, 4, LastBatch::Pad, None);
        assert_eq!((p.steps(), p.padded_rows()), (1, 6));
        let p = plan(vec![2], 2, 4, LastBatch::Drop, None);
        assert_eq!((p.steps(), p.dropped_rows()), (0, 2));
        let p = plan(vec![], 2, 4, LastBatch::Pad, None);
        assert_eq!((p.steps(), p.padded_rows(), p.order(0).len()), (0, 0, 0));
        // Ownership: 4 ranks on 2 processes of 2 workers, 3 ranks on 2 processes of 1.
        let o = Ownership {
            world_size: 4,
            processes: 2,
            workers: 2,
        };
        assert_eq!((o.ranks(0), o.ranks(1)), (0..2, 2..4));
        assert_eq!(
            (0..4).map(|r| o.worker(r)).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        let o = Ownership {
            world_size: 3,
            processes: 2,
            workers: 1,
        };
        assert_eq!((o.ranks(0), o.ranks(1)), (0..2, 2..3));
        let o = Ownership {
            world_size: 1,
            processes: 2,
            workers: 2,
        };
        assert_eq!((o.ranks(0), o.ranks(1)), (0..1, 1..1));
    }
}
