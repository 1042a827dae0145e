//! The rebatcher: featurized batches in, in epoch order, and per-rank training batches
//! out, as the [`EpochPlan`] places them.
//!
//! Rows are not copied until a rank batch is cut: the rebatcher holds the featurized
//! batches and passes *handles* (batch, row) through the shuffle buffer. A rank batch that
//! is one run of one batch is a zero-copy slice; otherwise its rows are gathered.
//!
//! A held batch stays alive while any of its rows is in the shuffle buffer, and a few rows
//! linger long, so with shuffling the rebatcher compacts: once the held batches hold more
//! than three times the rows still referenced, those rows are gathered into one batch.
//! Memory stays near three times the buffer; measured, 3× gathers 2.3× faster than 2×
//! (fewer compactions) for 12% more peak memory at 1M rows.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, UInt64Array,
    new_empty_array,
};
use arrow::compute::{concat_batches, interleave_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use hydrant_operators::{Batch, ROW_ID};
use serde::{Deserialize, Serialize};

use crate::epoch::{EpochPlan, Shuffler};
use crate::error::{Error, Result};

/// Name of the Boolean column that marks padding rows.
pub const IS_PADDING: &str = "is_padding";

/// Where a rank batch belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepMeta {
    /// Epoch.
    pub epoch: u64,
    /// Step within the epoch.
    pub step: u64,
    /// Data-parallel rank.
    pub rank: usize,
    /// Ranks in the job.
    pub world_size: usize,
    /// Padding rows at the end of the batch.
    pub padded_rows: usize,
    /// Version of the fitted state that featurized it.
    pub state_version: u64,
}

/// One rank's batch of one step: the plan's output columns plus `is_padding`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankBatch {
    /// Where it belongs.
    pub meta: StepMeta,
    /// The rows (between processes as Arrow IPC).
    pub batch: Batch,
}

impl RankBatch {
    /// The rows.
    pub fn data(&self) -> &RecordBatch {
        &self.batch.data
    }
}

/// The schema of delivered batches: the plan's output and `is_padding`.
pub fn delivery_schema(output: &Schema) -> SchemaRef {
    let mut fields: Vec<_> = output.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(IS_PADDING, DataType::Boolean, false)));
    Arc::new(Schema::new(fields))
}

#[derive(Debug, Clone, Copy)]
enum Handle {
    Row {
        slot: u32,
        row: u32,
    },
    /// A row of a unit that was not read because all of it lies before the start step.
    Skipped,
}

struct Held {
    batch: RecordBatch,
    live: usize,
}

/// Cuts an epoch's rows into rank batches. Feed it each epoch's batches in unit order.
pub struct Rebatcher {
    plan: Arc<EpochPlan>,
    schema: SchemaRef,
    padding: RecordBatch,
    epoch: u64,
    skip: u64,
    emitted: u64,
    shuffler: Shuffler<Handle>,
    held: Vec<Option<Held>>,
    /// Rows of all held batches, referenced or not.
    held_total: usize,
    free: Vec<usize>,
    step: Vec<Handle>,
    seq: u64,
    state_version: u64,
    /// Rows arrive without a known total (pushed input): every row is placed until
    /// [`Rebatcher::finish_stream`].
    streaming: bool,
}

impl Rebatcher {
    /// A rebatcher for batches of schema `output` (the plan's output schema), featurized
    /// with state `state_version`.
    pub fn new(plan: Arc<EpochPlan>, output: &Schema, state_version: u64) -> Result<Self> {
        let padding = padding_batch(output, plan.batch_size())?;
        Ok(Rebatcher {
            schema: delivery_schema(output),
            shuffler: plan.shuffler(0),
            padding,
            epoch: 0,
            skip: 0,
            emitted: 0,
            held: Vec::new(),
            held_total: 0,
            free: Vec::new(),
            step: Vec::with_capacity(plan.step_rows().min(1 << 20) as usize),
            seq: 0,
            state_version,
            streaming: false,
            plan,
        })
    }

    /// Starts epoch `epoch`, delivering from step `start_step` on.
    pub fn start_epoch(&mut self, epoch: u64, start_step: u64) {
        self.epoch = epoch;
        self.skip = start_step.saturating_mul(self.plan.step_rows());
        self.emitted = 0;
        self.shuffler = self.plan.shuffler(epoch);
        self.step.clear();
    }

    /// Rows held (in the shuffle buffer or waiting for a step to fill).
    pub fn held_rows(&self) -> usize {
        self.held.iter().flatten().map(|h| h.live).sum()
    }

    /// Takes the next featurized batch of the epoch.
    pub fn push(&mut self, batch: RecordBatch, out: &mut Vec<RankBatch>) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.held.push(None);
                self.held.len() - 1
            }
        };
        self.held[slot] = Some(Held { batch, live: rows });
        self.held_total += rows;
        for row in 0..rows {
            let h = Handle::Row {
                slot: slot as u32,
                row: row as u32,
            };
            if let Some(h) = self.shuffler.push(h) {
                self.emit(h, out)?;
            }
        }
        if self.plan.shuffled()
            && self.held_total > 3 * (self.shuffler.len() + self.step.len()) + rows
        {
            self.compact()?;
        }
        Ok(())
    }

    /// Gathers every row still referenced into one batch and lets the old batches go.
    fn compact(&mut self) -> Result<()> {
        let mut handles: Vec<Handle> = self.shuffler.held_mut().to_vec();
        handles.extend_from_slice(&self.step);
        let rows: Vec<Handle> = handles
            .into_iter()
            .filter(|h| matches!(h, Handle::Row { .. }))
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        let batch = self.gather(&rows)?;
        let mut next = 0u32;
        let mut renumber = |h: &mut Handle| {
            if let Handle::Row { slot, row } = h {
                *slot = 0;
                *row = next;
                next += 1;
            }
        };
        // Same order as `rows` above: buffer first, then the step.
        self.shuffler.held_mut().iter_mut().for_each(&mut renumber);
        self.step.iter_mut().for_each(&mut renumber);
        self.held_total = batch.num_rows();
        self.held = vec![Some(Held {
            live: batch.num_rows(),
            batch,
        })];
        self.free.clear();
        Ok(())
    }

    /// Takes the place of `rows` rows that were not read (see [`EpochPlan::skippable`]).
    pub fn push_skipped(&mut self, rows: u64, out: &mut Vec<RankBatch>) -> Result<()> {
        for _ in 0..rows {
            if let Some(h) = self.shuffler.push(Handle::Skipped) {
                self.emit(h, out)?;
            }
        }
        Ok(())
    }

    /// A rebatcher for rows whose total is not known in advance (pushed input): the
    /// plan's rows are ignored, and [`Rebatcher::finish_stream`] ends the epoch.
    pub fn streaming(plan: Arc<EpochPlan>, output: &Schema, state_version: u64) -> Result<Self> {
        let mut r = Self::new(plan, output, state_version)?;
        r.streaming = true;
        Ok(r)
    }

    /// Ends a streamed epoch: empties the shuffle buffer, then pads the last step or
    /// drops it (as the plan's `last_batch` says). Returns the rows dropped.
    pub fn finish_stream(&mut self, out: &mut Vec<RankBatch>) -> Result<u64> {
        self.drain_shuffler(out)?;
        if self.step.is_empty() {
            return Ok(0);
        }
        if self.plan.last_batch() == crate::epoch::LastBatch::Pad {
            self.cut_step(out)?;
            return Ok(0);
        }
        let handles = std::mem::take(&mut self.step);
        for h in &handles {
            self.release(*h);
        }
        Ok(handles.len() as u64)
    }

    /// Emits every row still in the shuffle buffer, in the order it lets them go.
    fn drain_shuffler(&mut self, out: &mut Vec<RankBatch>) -> Result<()> {
        let shuffler = std::mem::replace(&mut self.shuffler, self.plan.shuffler(self.epoch));
        for h in shuffler.drain() {
            self.emit(h, out)?;
        }
        Ok(())
    }

    /// Ends the epoch: empties the shuffle buffer and pads or drops the last step.
    pub fn finish_epoch(&mut self, out: &mut Vec<RankBatch>) -> Result<()> {
        self.drain_shuffler(out)?;
        if self.emitted != self.plan.rows() {
            return Err(Error::Dataflow(format!(
                "epoch {} delivered {} of {} rows",
                self.epoch,
                self.emitted,
                self.plan.rows()
            )));
        }
        if !self.step.is_empty() {
            // Only `pad` leaves rows here: `drop` never places the remainder.
            self.cut_step(out)?;
        }
        Ok(())
    }

    fn emit(&mut self, h: Handle, out: &mut Vec<RankBatch>) -> Result<()> {
        let pos = self.emitted;
        self.emitted += 1;
        if pos < self.skip || !self.streaming && self.plan.place(pos).is_none() {
            self.release(h);
            return Ok(());
        }
        if let Handle::Skipped = h {
            return Err(Error::Dataflow(format!(
                "row at position {pos} of epoch {} was skipped but is delivered",
                self.epoch
            )));
        }
        self.step.push(h);
        if self.step.len() as u64 == self.plan.step_rows() {
            self.cut_step(out)?;
        }
        Ok(())
    }

    fn release(&mut self, h: Handle) {
        if let Handle::Row { slot, .. } = h {
            let slot = slot as usize;
            if let Some(held) = &mut self.held[slot] {
                held.live -= 1;
                if held.live == 0 {
                    self.held_total -= held.batch.num_rows();
                    self.held[slot] = None;
                    self.free.push(slot);
                }
            }
        }
    }

    /// Cuts the rows of one global step (all of them, or the real ones of a padded last
    /// step) into one batch per rank.
    fn cut_step(&mut self, out: &mut Vec<RankBatch>) -> Result<()> {
        let b = self.plan.batch_size();
        let step_rows = self.plan.step_rows();
        let step = (self.emitted - 1) / step_rows;
        let handles = std::mem::take(&mut self.step);
        for rank in 0..self.plan.world_size() {
            let lo = (rank * b).min(handles.len());
            let hi = ((rank + 1) * b).min(handles.len());
            let real = self.gather(&handles[lo..hi])?;
            let padded = b - (hi - lo);
            let data = self.with_padding(real, padded)?;
            out.push(RankBatch {
                meta: StepMeta {
                    epoch: self.epoch,
                    step,
                    rank,
                    world_size: self.plan.world_size(),
                    padded_rows: padded,
                    state_version: self.state_version,
                },
                batch: Batch {
                    seq: self.seq,
                    data,
                },
            });
            self.seq += 1;
        }
        for h in &handles {
            self.release(*h);
        }
        self.step = handles;
        self.step.clear();
        Ok(())
    }

    /// The rows behind `handles`: a zero-copy slice when they are one run of one batch.
    fn gather(&self, handles: &[Handle]) -> Result<RecordBatch> {
        let rows = |h: &Handle| match *h {
            Handle::Row { slot, row } => (slot as usize, row as usize),
            Handle::Skipped => unreachable!("skipped rows are never placed"),
        };
        let Some(first) = handles.first() else {
            return Ok(self.padding.slice(0, 0));
        };
        let (slot, start) = rows(first);
        let batch = |slot: usize| &self.held[slot].as_ref().expect("held while placed").batch;
        let one_run = handles
            .iter()
            .enumerate()
            .all(|(i, h)| rows(h) == (slot, start + i));
        if one_run {
            return Ok(batch(slot).slice(start, handles.len()));
        }
        let mut index = vec![usize::MAX; self.held.len()];
        let mut sources: Vec<&RecordBatch> = Vec::new();
        let picks: Vec<(usize, usize)> = handles
            .iter()
            .map(|h| {
                let (slot, row) = rows(h);
                if index[slot] == usize::MAX {
                    index[slot] = sources.len();
                    sources.push(batch(slot));
                }
                (index[slot], row)
            })
            .collect();
        Ok(interleave_record_batch(&sources, &picks)?)
    }

    fn with_padding(&self, real: RecordBatch, padded: usize) -> Result<RecordBatch> {
        let real = with_flag(&self.schema, real, false)?;
        if padded == 0 {
            return Ok(real);
        }
        let pad = with_flag(&self.schema, self.padding.slice(0, padded), true)?;
        if real.num_rows() == 0 {
            return Ok(pad);
        }
        Ok(concat_batches(&self.schema, &[real, pad])?)
    }
}

fn with_flag(schema: &SchemaRef, batch: RecordBatch, padding: bool) -> Result<RecordBatch> {
    let flag = BooleanArray::from(vec![padding; batch.num_rows()]);
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(flag));
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// `rows` padding rows of `schema`: zero features and labels, `row_id` = `u64::MAX`.
fn padding_batch(schema: &Schema, rows: usize) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            if f.name() == ROW_ID {
                return Ok(Arc::new(UInt64Array::from(vec![u64::MAX; rows])) as ArrayRef);
            }
            zeros(f.data_type(), rows)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::new(schema.clone()), columns)?)
}

fn zeros(dtype: &DataType, rows: usize) -> Result<ArrayRef> {
    Ok(match dtype {
        DataType::Float32 => Arc::new(Float32Array::from(vec![0.0; rows])),
        DataType::Int64 => Arc::new(Int64Array::from(vec![0; rows])),
        DataType::UInt64 => Arc::new(UInt64Array::from(vec![0; rows])),
        DataType::FixedSizeList(field, size) => {
            let values = zeros(field.data_type(), rows * *size as usize)?;
            Arc::new(FixedSizeListArray::try_new(
                field.clone(),
                *size,
                values,
                None,
            )?)
        }
        DataType::Null => new_empty_array(dtype),
        other => {
            return Err(Error::Dataflow(format!(
                "cannot pad a column of type {other}"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use arrow::datatypes::{Float32Type, UInt64Type};
    use proptest::prelude::*;

    use super::*;
    use crate::epoch::LastBatch;

    fn schema() -> Schema {
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        Schema::new(vec![
            Field::new(ROW_ID, DataType::UInt64, false),
            Field::new("dense", DataType::FixedSizeList(item, 2), false),
        ])
    }

    /// Rows `first..first+n`, with features (row, -row).
    fn rows(first: u64, n: usize) -> RecordBatch {
        let ids: Vec<u64> = (first..first + n as u64).collect();
        let values: Vec<f32> = ids.iter().flat_map(|&r| [r as f32, -(r as f32)]).collect();
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let dense =
            FixedSizeListArray::try_new(item, 2, Arc::new(Float32Array::from(values)), None)
                .unwrap();
        RecordBatch::try_new(
            Arc::new(schema()),
            vec![Arc::new(UInt64Array::from(ids)), Arc::new(dense)],
        )
        .unwrap()
    }

    /// Runs one epoch through a rebatcher the way the dataflow does, reading units in
    /// plan order in pieces of `chunk` rows, skipping what the plan says may be skipped.
    fn deliver(plan: &Arc<EpochPlan>, epoch: u64, start: u64, chunk: usize) -> Vec<RankBatch> {
        let mut r = Rebatcher::new(plan.clone(), &schema(), 1).unwrap();
        r.start_epoch(epoch, start);
        let skip = plan.skippable(epoch, start);
        let mut out = Vec::new();
        for (u, _, n) in plan.unit_positions(epoch) {
            if skip[u] {
                r.push_skipped(n, &mut out).unwrap();
                continue;
            }
            // Row ids of unit u start where the units before it (in input order) end.
            let first: u64 = (0..u).map(|v| plan.unit_rows(v)).sum();
            let mut at = 0;
            while at < n {
                let k = (n - at).min(chunk as u64) as usize;
                r.push(rows(first + at, k), &mut out).unwrap();
                at += k as u64;
            }
        }
        r.finish_epoch(&mut out).unwrap();
        assert_eq!(r.held_rows(), 0);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(150))]

        /// Every delivered row is where the plan places it, with its own features; padding
        /// is flagged; nothing before the start step is delivered.
        #[test]
        fn batches_follow_the_plan(
            units in prop::collection::vec(0u64..70, 0..6),
            w in 1usize..4, b in 1usize..20, pad: bool,
            shuffle in prop_oneof![Just(None), (1usize..50).prop_map(Some)],
            chunk in 1usize..30, epoch in 0u64..2, start in 0u64..3,
        ) {
            let last = if pad { LastBatch::Pad } else { LastBatch::Drop };
            let plan = Arc::new(EpochPlan::new(units, w, b, last, 3, shuffle).unwrap());
            let order: Vec<u64> = plan.order(epoch).collect();
            let out = deliver(&plan, epoch, start, chunk);
            let steps = plan.steps().saturating_sub(start);
            prop_assert_eq!(out.len() as u64, steps * w as u64);
            for (i, rb) in out.iter().enumerate() {
                let m = rb.meta;
                prop_assert_eq!((m.step, m.rank), (start + i as u64 / w as u64, i % w));
                let d = rb.data();
                prop_assert_eq!(d.num_rows(), b);
                let ids = d.column(0).as_primitive::<UInt64Type>();
                let dense = d.column(1).as_fixed_size_list();
                let flags = d.column(2).as_boolean();
                for slot in 0..b {
                    let pos = m.step * plan.step_rows() + (m.rank * b + slot) as u64;
                    let is_pad = pos >= plan.delivered_rows();
                    prop_assert_eq!(flags.value(slot), is_pad);
                    prop_assert_eq!(slot >= b - m.padded_rows, is_pad);
                    let v = dense.value(slot);
                    let v = v.as_primitive::<Float32Type>();
                    if is_pad {
                        prop_assert_eq!(ids.value(slot), u64::MAX);
                        prop_assert_eq!(v.values().to_vec(), vec![0.0, 0.0]);
                    } else {
                        let want = order[pos as usize];
                        prop_assert_eq!(ids.value(slot), want);
                        prop_assert_eq!(v.values().to_vec(), vec![want as f32, -(want as f32)]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_single_run_is_a_zero_copy_slice() {
        let plan = Arc::new(EpochPlan::new(vec![64], 2, 16, LastBatch::Pad, 0, None).unwrap());
        let mut r = Rebatcher::new(plan, &schema(), 1).unwrap();
        r.start_epoch(0, 0);
        let input = rows(0, 64);
        let mut out = Vec::new();
        r.push(input.clone(), &mut out).unwrap();
        let src = input.column(1).as_fixed_size_list().values().to_data();
        // Rank 1 of step 0 is rows 16..32: 32 floats into the input's buffer.
        let got = out[1]
            .data()
            .column(1)
            .as_fixed_size_list()
            .values()
            .to_data();
        let offset = got.buffers()[0].as_ptr() as usize - src.buffers()[0].as_ptr() as usize;
        assert_eq!(offset, 32 * 4);
    }
}
