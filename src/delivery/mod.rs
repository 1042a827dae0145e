//! Delivery: where every row goes and how each rank's steps are put together.
//!
//! ```text
//! featurized batch ─► place (reader, any worker) ─► pieces by rank ─► own (the rank's worker) ─► rank batches in step order
//! ```
//!
//! [`Placement`] places a row from its position alone (`placement.rs`); readers split each
//! featurized batch into [`Piece`]s by destination rank ([`split`], the `place` operator);
//! the worker that owns a rank ([`Ownership`]) assembles its steps ([`Assembler`], the
//! `own` operator). Nothing is sequential across ranks and no worker sees every row.

mod arena;
mod assemble;
mod batch;
mod fill;
mod gather;
mod own;
mod permute;
mod piece;
mod place;
mod placement;
mod plan;
mod window;
mod wire;

use std::ops::Range;
use std::sync::Arc;

pub use arena::Arena;
pub use assemble::Assembler;
#[cfg(test)]
pub(crate) use assemble::tests as assemble_tests;
pub use batch::{IS_PADDING, RankBatch, StepMeta, delivery_schema};
pub use own::{Owning, own};
pub use permute::Permutation;
pub use piece::{Piece, rank_rows, split, split_at};
pub use place::PlaceRows;
pub use placement::{
    DEFAULT_WINDOW_ROWS, LastBatch, ORDER_VERSION, Place, Placement, STREAM_ORDER_VERSION,
};
pub use plan::{EpochPlan, Ownership, Read};
pub use wire::Pieces;

/// What to deliver: epochs `start_epoch..epochs`, the first from `start_step` on.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Rows to ranks and steps.
    pub plan: Arc<EpochPlan>,
    /// Epochs in the run (the last is `epochs - 1`).
    pub epochs: u64,
    /// First epoch delivered.
    pub start_epoch: u64,
    /// First step delivered in `start_epoch`.
    pub start_step: u64,
    /// Deliver only this rank (a rank catching up alone): readers drop the other ranks'
    /// rows before featurizing, and no worker assembles the other ranks.
    pub only: Option<usize>,
}

impl Delivery {
    /// The timestamp of step 0 of `epoch`: the epoch's steps on one clock, a row at the
    /// step its window starts in ([`Placement::time_of`]), so that readers of every
    /// rank's share, on any worker, advance together.
    pub fn epoch_time(&self, epoch: u64) -> u64 {
        epoch.saturating_mul(self.plan.steps())
    }

    /// The step delivery starts at in `epoch`.
    pub fn first_step(&self, epoch: u64) -> u64 {
        if epoch == self.start_epoch {
            self.start_step
        } else {
            0
        }
    }

    /// The output indices of `epoch` that are delivered.
    pub fn indices(&self, epoch: u64) -> Range<u64> {
        let first = self.first_step(epoch).saturating_mul(self.plan.step_rows());
        first.min(self.plan.delivered_rows())..self.plan.delivered_rows()
    }

    /// The earliest time a row of step `step` of `epoch` can carry (the step its first
    /// row's window starts in). An owner waiting for that step holds it.
    pub fn step_time(&self, epoch: u64, step: u64) -> u64 {
        let t = self.plan.placement().step_time(step);
        self.epoch_time(epoch).saturating_add(t)
    }

    /// How far (in steps) a reader may run ahead of the slowest owner's next step: far
    /// enough that the rows that step needs are read whatever the reader order, and no
    /// further, which bounds what owners hold (and so peak memory) to this many steps of
    /// each rank.
    ///
    /// The slowest reader never waits: it moves on to its next batch's time before it
    /// waits, so every row before that time is read, and owners let out every step before
    /// it. The first they still hold starts no earlier than that time when rows carry
    /// their window's first step and windows start on steps (in order, or a window that
    /// is a multiple of `B`); otherwise up to a window and two steps earlier. Shuffled,
    /// readers may also fill the next window while the last one goes out (10M rows, 2
    /// ranks: 1.55 s against 1.77 s, for ~15 MB more at the peak). The other
    /// `readers - 1` of a process may each be a unit further on so that all of them read
    /// at once, and a few batches more are in flight. Readers take turns over the
    /// `shares` they read, in time order, so a unit of `U` rows moves the time on by about
    /// `U / (B · shares)` steps.
    pub fn reader_slack(
        &self,
        readers: usize,
        shares: usize,
        biggest_unit: u64,
        batch_rows: u64,
    ) -> u64 {
        let placement = self.plan.placement();
        let (k, b) = (placement.window(), placement.batch_size() as u64);
        let windows = match (placement.shuffled(), k % b) {
            (false, _) => 0,
            (true, 0) => k / b,
            (true, _) => k / b + 2,
        };
        let steps = |rows: u64| rows.div_ceil(b.saturating_mul(shares.max(1) as u64));
        let others = (readers as u64)
            .saturating_sub(1)
            .saturating_mul(biggest_unit);
        1u64.saturating_add(windows)
            .saturating_add(steps(others))
            .saturating_add(steps(IN_FLIGHT.saturating_mul(batch_rows)))
    }
}

/// Batches a reader may have in flight beyond what the plan needs.
pub const IN_FLIGHT: u64 = 4;
