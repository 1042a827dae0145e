//! Pushed input: rows arrive with no known total, are placed as they come (a window at a
//! time when shuffled: a window's order is fixed once it is full) and every rank is
//! assembled here, by the same [`split`] and [`Assembler`] as the dataflow uses.

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;

use super::assemble::Assembler;
use super::batch::RankBatch;
use super::piece::{Piece, split};
use super::placement::Placement;
use crate::error::Result;

/// Places and assembles one endless epoch (epoch 0) of pushed rows.
pub struct StreamCutter {
    placement: Placement,
    owners: Vec<Assembler>,
    /// Featurized rows whose window is not full yet, with their first position.
    held: Vec<(u64, RecordBatch)>,
    /// Rows taken so far (stream positions: a cutter resumed at a step starts past 0).
    rows: u64,
    /// The first output index delivered (a resumed cutter drops the steps before).
    deliver_from: u64,
    pieces: Vec<Piece>,
    /// The state versions batches are stamped with: each from its first step on (a
    /// version takes effect at a step boundary).
    versions: Vec<(u64, u64)>,
}

impl StreamCutter {
    /// A cutter of batches of schema `output` (the plan's output), featurized with state
    /// `state_version`.
    pub fn new(placement: Placement, output: &Schema, state_version: u64) -> Result<Self> {
        Self::from_step(placement, output, state_version, 0)
    }

    /// A cutter whose first step is `step`: it takes rows from stream position
    /// [`StreamCutter::first_row`]`(step)` on, and the steps before are not delivered.
    pub fn from_step(
        placement: Placement,
        output: &Schema,
        state_version: u64,
        step: u64,
    ) -> Result<Self> {
        let placement = placement.stream();
        let owners = (0..placement.world_size())
            .map(|r| Assembler::new(placement, r, output, state_version, None, (0, step)))
            .collect::<Result<_>>()?;
        let deliver_from = step.saturating_mul(placement.step_rows());
        Ok(StreamCutter {
            placement,
            owners,
            held: Vec::new(),
            rows: placement.window_start(deliver_from),
            deliver_from,
            pieces: Vec::new(),
            versions: vec![(0, state_version)],
        })
    }

    /// The first stream position step `step` needs: rows move only within their shuffle
    /// window, so it is the start of the window holding the step's first position.
    pub fn first_row(&self, step: u64) -> u64 {
        let placement = &self.placement;
        placement.window_start(step.saturating_mul(placement.step_rows()))
    }

    /// Steps every rank has been given (the first step no rank has yet).
    pub fn steps_cut(&self) -> u64 {
        self.owners.iter().map(|o| o.next().1).min().unwrap_or(0)
    }

    /// Rows taken so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Takes the next featurized batch, featurized with state `version`; a version other
    /// than the last one's takes effect from the step of the batch's first row, which must
    /// be that step's first row (and its shuffle window's). Appends the steps it completes.
    pub fn push_as(
        &mut self,
        batch: RecordBatch,
        version: u64,
        out: &mut Vec<RankBatch>,
    ) -> Result<()> {
        if self.versions.last().is_some_and(|&(_, v)| v != version) {
            let step = self.rows / self.placement.step_rows();
            self.versions.retain(|&(first, _)| first < step);
            self.versions.push((step, version));
        }
        self.push(batch, out)
    }

    /// Takes the next featurized batch; appends the steps it completes, in step order.
    pub fn push(&mut self, batch: RecordBatch, out: &mut Vec<RankBatch>) -> Result<()> {
        let first = self.rows;
        self.rows += batch.num_rows() as u64;
        self.held.push((first, batch));
        // Every position before `full` lies in a full window.
        let full = self.placement.window_start(self.rows);
        let mut keep = Vec::new();
        for (first, batch) in std::mem::take(&mut self.held) {
            let ready = full.saturating_sub(first).min(batch.num_rows() as u64) as usize;
            if ready > 0 {
                self.place(first, &batch.slice(0, ready), u64::MAX)?;
            }
            if ready < batch.num_rows() {
                keep.push((
                    first + ready as u64,
                    batch.slice(ready, batch.num_rows() - ready),
                ));
            }
        }
        self.held = keep;
        self.ready(out)
    }

    /// Ends the stream: places what is held and pads the last step (or drops it, as the
    /// placement says). Returns the rows dropped.
    pub fn end(&mut self, out: &mut Vec<RankBatch>) -> Result<u64> {
        let rows = self.rows;
        for (first, batch) in std::mem::take(&mut self.held) {
            self.place(first, &batch, rows)?;
        }
        for o in &mut self.owners {
            o.end_stream(rows);
        }
        self.ready(out)?;
        let delivered = rows.min(self.placement.steps(rows) * self.placement.step_rows());
        Ok(rows - delivered)
    }

    fn place(&mut self, first: u64, batch: &RecordBatch, rows: u64) -> Result<()> {
        split(
            &self.placement,
            0,
            rows,
            first,
            self.deliver_from..u64::MAX,
            batch,
            &mut self.pieces,
        );
        for piece in self.pieces.drain(..) {
            self.owners[piece.rank].push(&piece)?;
        }
        Ok(())
    }

    fn ready(&mut self, out: &mut Vec<RankBatch>) -> Result<()> {
        let at = out.len();
        for o in &mut self.owners {
            o.ready(out)?;
        }
        // Step by step across ranks, as trainers that step together read them.
        out[at..].sort_by_key(|rb| (rb.meta.step, rb.meta.rank));
        // Versions of steps every rank has been given are not needed again.
        let cut = self.steps_cut();
        let done = self.versions.partition_point(|&(first, _)| first <= cut);
        self.versions.drain(..done.saturating_sub(1));
        for rb in &mut out[at..] {
            let step = rb.meta.step;
            let since = self.versions.partition_point(|&(first, _)| first <= step);
            if let Some(&(_, version)) = self.versions.get(since.wrapping_sub(1)) {
                rb.meta.state_version = version;
            }
            let span = self.placement.positions(rb.meta.step, rb.meta.rank);
            rb.meta.positions = Some([span.start.min(self.rows), span.end.min(self.rows)]);
        }
        Ok(())
    }
}
