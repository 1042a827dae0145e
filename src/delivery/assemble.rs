//! The owner's half of delivery: an [`Assembler`] takes a rank's [`Piece`]s in any order
//! and emits the rank's steps in step order, each with exactly `B` rows (the last padded).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use hydrant_operators::Batch;

use super::arena::Arena;
use super::batch::{RankBatch, StepMeta, delivery_schema, padding_batch, with_padding};
use super::gather::gather;
use super::piece::Piece;
use super::placement::Placement;
use crate::error::{Error, Result};

/// The rows of one step that have arrived: how many, and the batch and its [`SlotRun`]s
/// per piece (none when the step is filled in the arena).
#[derive(Default)]
struct Parts {
    rows: usize,
    parts: Vec<(RecordBatch, Vec<SlotRun>)>,
}

/// Assembles one rank's steps.
pub struct Assembler {
    placement: Placement,
    rank: usize,
    schema: SchemaRef,
    /// No rows of the plan's output schema.
    empty: RecordBatch,
    state_version: u64,
    /// Rows of each epoch; `None` while unknown (a stream, until it ends).
    rows: Option<u64>,
    epoch: u64,
    next_step: u64,
    pending: BTreeMap<(u64, u64), Parts>,
    /// Where shuffled steps of fixed-width columns are filled as their rows arrive: the
    /// assembler's own, or its process's, which the readers fill too.
    arena: Option<Arc<Arena>>,
}

impl Assembler {
    /// An assembler of `rank`'s batches of schema `output` (the plan's output schema),
    /// featurized with state `state_version`, for epochs of `rows` rows (`None`: unknown
    /// until [`Assembler::end_stream`]), starting at `step` of `epoch`.
    pub fn new(
        placement: Placement,
        rank: usize,
        output: &Schema,
        state_version: u64,
        rows: Option<u64>,
        (epoch, step): (u64, u64),
    ) -> Result<Self> {
        Ok(Assembler {
            // Made now so that an output type without padding is an error here.
            empty: padding_batch(output, 0)?,
            schema: delivery_schema(output),
            arena: Arena::new(output, &placement),
            placement,
            rank,
            state_version,
            rows,
            epoch,
            next_step: step,
            pending: BTreeMap::new(),
        })
    }

    /// Fills shuffled steps in `arena`, which this process's readers fill too (see
    /// [`Arena`]), instead of its own.
    pub fn with_arena(mut self, arena: Option<Arc<Arena>>) -> Self {
        if self.arena.is_some() && arena.is_some() {
            self.arena = arena;
        }
        self
    }

    /// The rank assembled.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The next step to emit, as `(epoch, step)`.
    pub fn next(&self) -> (u64, u64) {
        (self.epoch, self.next_step)
    }

    /// Whether every step of the current epoch has been emitted.
    pub fn epoch_done(&self) -> bool {
        self.rows
            .is_some_and(|rows| self.next_step >= self.placement.steps(rows))
    }

    /// Moves on to `step` of `epoch` (after [`Assembler::epoch_done`]).
    pub fn start_epoch(&mut self, epoch: u64, step: u64) {
        self.epoch = epoch;
        self.next_step = step;
    }

    /// Rows held, waiting for their steps to fill.
    pub fn held_rows(&self) -> usize {
        self.pending.values().map(|p| p.rows).sum()
    }

    /// Ends a stream of `rows` rows: its last step can now be padded (or dropped).
    pub fn end_stream(&mut self, rows: u64) {
        self.rows = Some(rows);
    }

    /// Takes a piece of this rank's rows.
    pub fn push(&mut self, piece: &Piece) -> Result<()> {
        if let Some(counts) = piece.counts() {
            if self.arena.is_none() {
                return Err(Error::Dataflow(
                    "a step filled in an arena reached an owner without one".into(),
                ));
            }
            // The reader put the rows in the arena: they are only counted.
            for &(step, rows) in counts {
                self.count(piece.epoch, step, rows)?;
            }
            return Ok(());
        }
        let (mut filled, in_arena) = (Vec::new(), self.arena.is_some());
        for (step, runs) in step_runs(&self.placement, self.rank, piece)? {
            let parts = self.count(piece.epoch, step, slot_rows(&runs))?;
            match in_arena {
                true => filled.push((step, runs)),
                false => parts.parts.push((piece.batch().clone(), runs)),
            }
        }
        match &self.arena {
            Some(arena) => arena.put_runs((piece.epoch, self.rank), piece.batch(), &filled),
            None => Ok(()),
        }
    }

    /// Counts `rows` more rows of `step` of `epoch` in: an error if the step was emitted
    /// already or would hold more than `B`.
    fn count(&mut self, epoch: u64, step: u64, rows: usize) -> Result<&mut Parts> {
        let b = self.placement.batch_size();
        if (epoch, step) < (self.epoch, self.next_step) {
            return Err(self.duplicate(epoch, step));
        }
        let have = self.pending.get(&(epoch, step)).map_or(0, |p| p.rows);
        if have + rows > b {
            return Err(self.duplicate(epoch, step));
        }
        let parts = self.pending.entry((epoch, step)).or_default();
        parts.rows += rows;
        Ok(parts)
    }

    fn duplicate(&self, epoch: u64, step: u64) -> Error {
        Error::Dataflow(format!(
            "rank {} received a row of step {step} of epoch {epoch} twice",
            self.rank
        ))
    }

    /// Emits every step that is complete and next in order.
    pub fn ready(&mut self, out: &mut Vec<RankBatch>) -> Result<()> {
        let b = self.placement.batch_size();
        while !self.epoch_done() {
            let key = (self.epoch, self.next_step);
            let real = match self.rows {
                Some(rows) => self.placement.real_rows(rows, self.next_step, self.rank),
                None => b,
            };
            let have = self.pending.get(&key).map_or(0, |p| p.rows);
            if have < real {
                return Ok(());
            }
            if have > real {
                return Err(self.duplicate(key.0, key.1));
            }
            let parts = self.pending.remove(&key).unwrap_or_default();
            let rows = self.cut(parts, real)?;
            let data = with_padding(&self.schema, rows, b - real)?;
            out.push(RankBatch {
                meta: StepMeta {
                    epoch: self.epoch,
                    step: self.next_step,
                    rank: self.rank,
                    world_size: self.placement.world_size(),
                    padded_rows: b - real,
                    state_version: self.state_version,
                    positions: None,
                },
                batch: Batch {
                    seq: self.next_step,
                    data,
                },
            });
            self.next_step += 1;
        }
        // A dropped last step's rows (pushed input only) are let go.
        let epoch = self.epoch;
        self.pending.retain(|&(e, _), _| e != epoch);
        if let Some(arena) = &self.arena {
            arena.forget(epoch, self.rank);
        }
        Ok(())
    }

    /// The `real` rows of a step in slot order: the step filled in the arena, a zero-copy
    /// slice when they are one run of one batch, gathered otherwise.
    fn cut(&self, parts: Parts, real: usize) -> Result<RecordBatch> {
        if let Some(arena) = &self.arena
            && real > 0
        {
            let key = (self.epoch, self.next_step, self.rank);
            return arena.take(key)?.finish(self.empty.schema_ref(), real);
        }
        if let [(batch, runs)] = parts.parts.as_slice()
            && let [(0, row, len)] = runs.as_slice()
            && *len as usize == real
        {
            return Ok(batch.slice(*row as usize, real));
        }
        if real == 0 {
            return Ok(self.empty.clone());
        }
        let mut picks = vec![(usize::MAX, 0); real];
        let mut sources = Vec::with_capacity(parts.parts.len());
        for (p, (batch, runs)) in parts.parts.iter().enumerate() {
            sources.push(batch);
            for &(slot, row, len) in runs {
                let (slot, row) = (slot as usize, row as usize);
                let to = picks.get_mut(slot..slot + len as usize);
                let Some(to) = to.filter(|to| to.iter().all(|x| x.0 == usize::MAX)) else {
                    return Err(self.duplicate(self.epoch, self.next_step));
                };
                for (k, pick) in to.iter_mut().enumerate() {
                    *pick = (p, row + k);
                }
            }
        }
        gather(self.empty.schema_ref(), &sources, &picks)
    }
}

/// Rows of a piece in one step: `(slot, row, len)`, rows `row..row + len` of its batch into
/// slots `slot..slot + len`.
pub(crate) type SlotRun = (u32, u32, u32);

/// The rows in `runs`.
pub(crate) fn slot_rows(runs: &[SlotRun]) -> usize {
    runs.iter().map(|&(_, _, len)| len as usize).sum()
}

/// One step's rows of a piece: the step, and its [`SlotRun`]s.
pub(crate) type StepRun = (u64, Vec<SlotRun>);

/// The rows of `piece` (for `rank`) step by step, in step order: what an owner, or a
/// reader filling the arena, puts where. Runs are cut where steps end, and joined where
/// slots and rows go on together: rows in order make a run or two a step, whatever `B`.
pub(crate) fn step_runs(placement: &Placement, rank: usize, piece: &Piece) -> Result<Vec<StepRun>> {
    let b = placement.batch_size() as u64;
    let step_rows = placement.step_rows();
    let mut out: Vec<StepRun> = Vec::new();
    // The step of the last row placed, and where its slots for `rank` begin: rows of one
    // step come together, so a division finds a new step, not every row (a division a row
    // was 3% of a serving process's CPU).
    let (mut step, mut first) = (u64::MAX, 0u64);
    for run in piece.runs() {
        let (mut index, mut row, mut left) = (run.index, run.row, u64::from(run.len));
        while left > 0 {
            let mut slot = index.wrapping_sub(first);
            if step == u64::MAX || slot >= b {
                step = index / step_rows;
                first = (step * step_rows).saturating_add(rank as u64 * b);
                slot = index.wrapping_sub(first);
            }
            if slot >= b {
                return Err(Error::Dataflow(format!(
                    "rank {rank} received row {index} of epoch {}, which is another rank's",
                    piece.epoch
                )));
            }
            let n = left.min(b - slot);
            let run = (slot as u32, row, n as u32);
            match out.last_mut() {
                Some((s, runs)) if *s == step => push_slot_run(runs, run),
                _ => out.push((step, vec![run])),
            }
            // Saturating: indices from another process are not trusted to stay in range.
            (index, row, left) = (
                index.saturating_add(n),
                row.saturating_add(n as u32),
                left - n,
            );
        }
    }
    Ok(out)
}

/// Appends `run` to `runs`, joining it to the last when its slots and rows go on from it.
fn push_slot_run(runs: &mut Vec<SlotRun>, run: SlotRun) {
    if let Some((slot, row, len)) = runs.last_mut()
        && *slot + *len == run.0
        && *row + *len == run.1
    {
        *len += run.2;
        return;
    }
    runs.push(run);
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, FixedSizeListArray, Float32Array, UInt64Array};
    use arrow::datatypes::{DataType, Field, Float32Type, UInt64Type};
    use hydrant_operators::ROW_ID;
    use proptest::prelude::*;

    use super::*;
    use crate::delivery::piece::split;
    use crate::delivery::placement::LastBatch;
    use crate::delivery::plan::EpochPlan;

    pub(crate) fn schema() -> Schema {
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        Schema::new(vec![
            Field::new(ROW_ID, DataType::UInt64, false),
            Field::new("dense", DataType::FixedSizeList(item, 2), false),
        ])
    }

    /// Rows `first..first+n`, with features (row, -row).
    pub(crate) fn rows(first: u64, n: usize) -> RecordBatch {
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

    /// One epoch the way the dataflow runs it: the plan's reads of every rank read in
    /// chunks of `chunk` rows, split by rank, the pieces reaching the
    /// owners in an order scrambled by `scramble`, assembled and emitted per rank.
    fn deliver(
        plan: &EpochPlan,
        epoch: u64,
        start: u64,
        chunk: usize,
        scramble: u64,
    ) -> Vec<Vec<RankBatch>> {
        let rows_total = plan.positions();
        let deliver = (start * plan.step_rows()).min(plan.delivered_rows())..plan.delivered_rows();
        let mut pieces = Vec::new();
        for read in plan.reads(epoch, 0..plan.world_size(), true, start) {
            let (pos, n) = (read.pos, read.rows);
            let first_row: u64 = (0..read.unit).map(|v| plan.unit_rows(v)).sum::<u64>() + read.skip;
            let mut at = 0;
            while at < n {
                let k = (n - at).min(chunk as u64) as usize;
                let batch = rows(first_row + at, k);
                split(
                    plan.placement(),
                    epoch,
                    rows_total,
                    pos + at,
                    deliver.clone(),
                    &batch,
                    &mut pieces,
                );
                at += k as u64;
            }
        }
        // Readers on other workers deliver out of order.
        let len = pieces.len();
        for i in (1..len).rev() {
            let j = (crate::delivery::permute::mix(scramble ^ i as u64) % (i as u64 + 1)) as usize;
            pieces.swap(i, j);
        }
        let mut owners: Vec<Assembler> = (0..plan.world_size())
            .map(|r| {
                Assembler::new(
                    *plan.placement(),
                    r,
                    &schema(),
                    1,
                    Some(rows_total),
                    (epoch, start),
                )
                .unwrap()
            })
            .collect();
        let mut out = vec![Vec::new(); plan.world_size()];
        for p in &pieces {
            owners[p.rank].push(p).unwrap();
            owners[p.rank].ready(&mut out[p.rank]).unwrap();
        }
        for (r, o) in owners.iter_mut().enumerate() {
            o.ready(&mut out[r]).unwrap();
            assert!(o.epoch_done(), "rank {r} is not done: {:?}", o.next());
            assert_eq!(o.held_rows(), 0);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Every delivered row is where the plan places it, with its own features, in
        /// step order whatever order the pieces came in; padding is flagged; nothing before
        /// the start step is delivered.
        #[test]
        fn batches_follow_the_plan(
            units in prop::collection::vec(0u64..70, 0..6),
            w in 1usize..4, b in 1usize..20, pad: bool,
            window in prop_oneof![Just(None), (1u64..50).prop_map(Some)],
            chunk in 1usize..30, epoch in 0u64..2, start in 0u64..3, scramble: u64,
        ) {
            let last = if pad { LastBatch::Pad } else { LastBatch::Drop };
            let plan = EpochPlan::new(units, w, b, last, 3, window).unwrap();
            let order = plan.order(epoch);
            let out = deliver(&plan, epoch, start, chunk, scramble);
            let steps = plan.steps().saturating_sub(start);
            for (rank, batches) in out.iter().enumerate() {
                prop_assert_eq!(batches.len() as u64, steps);
                for (i, rb) in batches.iter().enumerate() {
                    let m = rb.meta;
                    prop_assert_eq!((m.step, m.rank), (start + i as u64, rank));
                    let d = rb.data();
                    prop_assert_eq!(d.num_rows(), b);
                    let ids = d.column(0).as_primitive::<UInt64Type>();
                    let dense = d.column(1).as_fixed_size_list();
                    let flags = d.column(2).as_boolean();
                    for slot in 0..b {
                        let idx = m.step * plan.step_rows() + (rank * b + slot) as u64;
                        let is_pad = idx >= plan.delivered_rows();
                        prop_assert_eq!(flags.value(slot), is_pad);
                        prop_assert_eq!(slot >= b - m.padded_rows, is_pad);
                        let v = dense.value(slot);
                        let v = v.as_primitive::<Float32Type>();
                        if is_pad {
                            prop_assert_eq!(ids.value(slot), u64::MAX);
                            prop_assert_eq!(v.values().to_vec(), vec![0.0, 0.0]);
                        } else {
                            let want = order[idx as usize];
                            prop_assert_eq!(ids.value(slot), want);
                            prop_assert_eq!(v.values().to_vec(), vec![want as f32, -(want as f32)]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_single_run_is_a_zero_copy_slice() {
        let plan = EpochPlan::new(vec![64], 2, 16, LastBatch::Pad, 0, None).unwrap();
        let input = rows(0, 64);
        let mut pieces = Vec::new();
        split(plan.placement(), 0, 64, 0, 0..64, &input, &mut pieces);
        let mut owner =
            Assembler::new(*plan.placement(), 1, &schema(), 1, Some(64), (0, 0)).unwrap();
        owner.push(&pieces[1]).unwrap();
        let mut out = Vec::new();
        owner.ready(&mut out).unwrap();
        let src = input.column(1).as_fixed_size_list().values().to_data();
        // Rank 1's share is rows 32..64, its step 0 rows 32..48: 64 floats into the input's
        // buffer.
        let got = out[0]
            .data()
            .column(1)
            .as_fixed_size_list()
            .values()
            .to_data();
        let offset = got.buffers()[0].as_ptr() as usize - src.buffers()[0].as_ptr() as usize;
        assert_eq!(offset, 64 * 4);
    }

    #[test]
    fn a_row_sent_twice_is_an_error() {
        let plan = EpochPlan::new(vec![8], 1, 4, LastBatch::Pad, 0, None).unwrap();
        let mut pieces = Vec::new();
        split(plan.placement(), 0, 8, 0, 0..8, &rows(0, 8), &mut pieces);
        let mut owner =
            Assembler::new(*plan.placement(), 0, &schema(), 1, Some(8), (0, 0)).unwrap();
        owner.push(&pieces[0]).unwrap();
        let err = owner.push(&pieces[0]).unwrap_err().to_string();
        assert!(err.contains("twice"), "{err}");
    }
}
