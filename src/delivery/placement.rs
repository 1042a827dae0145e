//! `Placement`: where every row of an epoch goes — (step, rank, slot) — as a pure function
//! of its position, computed wherever the row is read.
//!
//! An epoch's *positions* are its rows in the order it reads them: the input's units (Parquet
//! row groups, record batches of Arrow IPC files, whole Arrow IPC streams) in input order, or permuted per epoch with `--shuffle`, their rows in
//! turn. Output index `i` is global step `i / (W·B)`, rank `(i mod W·B) / B`, slot
//! `i mod B`, so every rank takes the same number of steps and every batch has exactly `B`
//! rows: the last, short global step is filled with padding rows (`pad`) or left out
//! (`drop`).
//!
//! **Rank-major shares.** An epoch of `N` rows has `F = ⌊N / (W·B)⌋` full steps. Its first
//! `W·F·B` positions are cut into `W` *shares* of `F·B` consecutive positions: share `r`
//! is all of rank `r`'s rows of the full steps, in step order. The remaining positions
//! (fewer than `W·B`, the *tail*) are the last step, laid out across ranks as output
//! indices are (`pad`), or left out (`drop`). A shuffled epoch that drops leaves those rows
//! out before it places any, as a run of the rows it reads that starts at an offset drawn
//! per epoch, so that other rows are left out each epoch (see `EpochPlan::hole_at`); its
//! positions are then the other rows'. So a rank's rows are one contiguous run of
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
//! slots, so delivery moves runs, not rows. A share's short last window is strided too
//! (a share is whole batches). A window whose length is not a multiple of `B` (the tail's
//! or a stream's last, usually), and every window when `K` is not, is permuted whole by a
//! Feistel network ([`Permutation`]).
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

/// The version of the order this plan produces: 8 leaves out, of a shuffled epoch that drops
/// its last short step, a run of rows drawn per epoch (`EpochPlan::hole_at`) rather than
/// its last rows, which with one unit were the same rows every epoch; 7 rounds the default
/// shuffle window to a
/// multiple of the batch size ([`Placement::default_window`]; 65,536 rows before), so that
/// windows are strided whatever `B`; 6 makes each record batch of an Arrow IPC
/// file a unit of its own (in 5 a file was one unit, so a shuffled epoch of one file never
/// moved its batches); 5 gives each rank a contiguous share of an epoch's positions (see
/// the module; pushed input is laid out as in 4); 4 laid positions
/// out step-major with strided windows; 3 permuted every window whole with a
/// multiply-shift Feistel network (2 had a splitmix round function, 1 was a sequential
/// shuffle buffer).
pub const ORDER_VERSION: u32 = 8;

/// The order version a stream (pushed or followed input) is placed by, which a stream's
/// state directory records: versions since changed only how epochs of files are placed (8:
/// which rows a shuffled epoch that drops leaves out), so a stream recorded under 7 is
/// served on after an upgrade.
pub const STREAM_ORDER_VERSION: u32 = 7;

/// About how many rows a shuffle window holds unless asked otherwise (see
/// [`Placement::default_window`]).
pub const DEFAULT_WINDOW_ROWS: u64 = 65_536;

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
/// shuffle window. [`EpochPlan`](super::EpochPlan) adds an input's layout; pushed input, whose length is only
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
    pub segment: u64,
    /// The rank whose share holds it; `None` in the tail or a stream (indices follow
    /// positions there).
    pub rank: Option<usize>,
    /// What keys its bijection.
    id: u64,
}

impl Placement {
    /// The shuffle window used when none is given: the multiple of `batch_size` nearest
    /// [`DEFAULT_WINDOW_ROWS`], and at least two batches. A multiple of `B` makes every
    /// window of a share strided, the order whose rows are featurized straight into their
    /// steps (1M Criteo rows, `B = 1000`: +46% CPU over in order with a 65,536-row window,
    /// +26% with 64,000); two batches at least, so that a window mixes rows across batches
    /// (a window of one batch keeps its rows in order).
    pub fn default_window(batch_size: usize) -> u64 {
        let b = (batch_size as u64).max(1);
        let batches = DEFAULT_WINDOW_ROWS.saturating_add(b / 2) / b;
        batches.max(2).saturating_mul(b)
    }

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

    /// The seed of the shuffle.
    pub fn seed(&self) -> u64 {
        self.seed
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

    /// The first stream position step `step` of a stream needs: rows move only within
    /// their shuffle window, so it is the start of the window holding the step's first
    /// position (where a stream resumed at `step` starts taking rows).
    pub fn stream_start(&self, step: u64) -> u64 {
        self.window_start(step.saturating_mul(self.step_rows()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::permute::tests::chi_square_per_cell;

    #[test]
    fn the_default_window_is_a_multiple_of_b_near_65536_of_two_batches_at_least() {
        for (b, window) in [
            (1, 65_536),
            (3, 65_535),
            (1_000, 66_000),
            (4_096, 65_536),
            (40_000, 80_000),
            (65_536, 131_072),
            (100_000, 200_000),
        ] {
            let k = Placement::default_window(b);
            assert_eq!(k, window, "B = {b}");
            let placement = Placement::new(3, b, LastBatch::Pad, 7, Some(k)).unwrap();
            assert!(
                placement.strided(),
                "B = {b}: the default window is not strided"
            );
        }
    }

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
        let chi = chi_square_per_cell(&count, (8 * k / (m * m)) as f64);
        assert!(chi < 1.3, "chi-square per cell {chi:.2}");
    }
}
