//! The reader's half of delivery: each featurized batch is placed row by row and split
//! into [`Piece`]s, one per destination rank, which travel to the rank's owner; or, when
//! its rows lie in strided windows of the process's own ranks, placed as it is walked and
//! put straight into the process's arena ([`strided_picks`]), its pieces only counting
//! the rows.

use std::ops::Range;
use std::sync::OnceLock;

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;

use super::fill::Pick;
use super::placement::{Placement, Window};
use super::window::WindowOrder;
use super::wire::Wire;
use crate::error::Result;

/// Consecutive rows of a [`Piece`]: rows `row..row + len` of its batch, at output indices
/// `index..index + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    /// Output index (in the epoch) of the run's first row.
    pub index: u64,
    /// The batch row of the run's first row.
    pub row: u32,
    /// Rows in the run.
    pub len: u32,
}

/// Appends `run` to `runs`, joining it to the last run when it goes on from it.
fn push_run(runs: &mut Vec<Run>, run: Run) {
    if let Some(last) = runs.last_mut()
        && last.index.checked_add(u64::from(last.len)) == Some(run.index)
        && last.row.checked_add(last.len) == Some(run.row)
        && let Some(len) = last.len.checked_add(run.len)
    {
        last.len = len;
        return;
    }
    runs.push(run);
}

/// Rows of one featurized batch bound for one rank, with their output indices.
///
/// Inside a process a piece shares the featurized batch (no copy); between processes only
/// its own rows travel, as Arrow IPC. Its rows are held as runs: in order, a piece is a
/// run or two whatever its rows, and the owner places it run by run.
#[derive(Debug, Clone)]
pub struct Piece {
    /// Epoch of the rows.
    pub epoch: u64,
    /// Destination rank.
    pub rank: usize,
    /// The rows and their output indices, grouped by step in ascending step order
    /// (ascending within a step too unless shuffled: a step's slots say where rows go).
    runs: Vec<Run>,
    batch: RecordBatch,
    /// For rows the reader put in the process's [`Arena`](super::arena::Arena) already:
    /// how many went into each step, steps ascending. Such a piece only counts its rows
    /// (it has no runs) and never leaves the process.
    counts: Option<Vec<(u64, usize)>>,
    /// This piece's rows as Arrow IPC, made the first time it is serialized: timely
    /// serializes a message twice (once to size it, once to write it), and the rows
    /// must be taken and encoded only once.
    wire: OnceLock<std::result::Result<Wire, String>>,
}

impl Piece {
    /// A piece of all of `batch`'s rows, in order, at `indices`.
    pub fn new(epoch: u64, rank: usize, indices: Vec<u64>, batch: RecordBatch) -> Self {
        let mut runs = Vec::new();
        for (row, i) in indices.into_iter().enumerate() {
            push_run(
                &mut runs,
                Run {
                    index: i,
                    row: row as u32,
                    len: 1,
                },
            );
        }
        Piece::of_runs(epoch, rank, runs, batch)
    }

    fn of_runs(epoch: u64, rank: usize, runs: Vec<Run>, batch: RecordBatch) -> Self {
        Piece {
            epoch,
            rank,
            runs,
            batch,
            counts: None,
            wire: OnceLock::new(),
        }
    }

    /// A piece for rows of `rank` that a reader put into the arena: `counts` says how many
    /// went into each step (steps ascending), for the owner to count.
    pub(crate) fn filled(
        epoch: u64,
        rank: usize,
        counts: Vec<(u64, usize)>,
        schema: SchemaRef,
    ) -> Self {
        Piece {
            counts: Some(counts),
            ..Piece::of_runs(epoch, rank, Vec::new(), RecordBatch::new_empty(schema))
        }
    }

    /// For a piece whose rows are in the arena, the rows in each of its steps.
    pub(crate) fn counts(&self) -> Option<&[(u64, usize)]> {
        self.counts.as_deref()
    }

    /// The piece's rows run by run, grouped by step in ascending step order.
    pub(crate) fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// Rows in the piece's runs.
    pub fn len(&self) -> usize {
        self.runs.iter().map(|r| r.len as usize).sum()
    }

    /// Whether the piece has no runs (a piece whose rows are in the arena has none).
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The output index of each row, in run order.
    pub fn indices(&self) -> impl Iterator<Item = u64> + '_ {
        self.runs
            .iter()
            .flat_map(|r| r.index..r.index.saturating_add(u64::from(r.len)))
    }

    /// The batch row of each index, in run order.
    fn rows(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().flat_map(|r| r.row..r.row + r.len)
    }

    /// The batch the rows are taken from (it may hold other ranks' rows too).
    pub fn batch(&self) -> &RecordBatch {
        &self.batch
    }

    /// This piece's rows as they cross processes (made once: timely sizes a message, then
    /// writes it).
    pub(super) fn wire(&self) -> &std::result::Result<Wire, String> {
        self.wire.get_or_init(|| {
            if self.counts.is_some() {
                return Err(
                    "a piece whose rows are in one process's arena was sent to another".into(),
                );
            }
            Wire::encode(&self.own_rows().map_err(|e| e.to_string())?)
        })
    }

    /// Only this piece's rows, in index order: a slice when they are one run of the
    /// batch (rows in order), taken otherwise.
    pub(super) fn own_rows(&self) -> Result<RecordBatch> {
        let one_run = self
            .runs
            .windows(2)
            .all(|w| w[0].row.checked_add(w[0].len) == Some(w[1].row));
        Ok(if one_run {
            let first = self.runs.first().map_or(0, |r| r.row as usize);
            self.batch.slice(first, self.len())
        } else {
            let rows = UInt32Array::from_iter_values(self.rows());
            take_record_batch(&self.batch, &rows)?
        })
    }
}

/// Places the rows of `batch` — positions `first_pos..` of epoch `epoch`, of `rows` rows
/// (`u64::MAX` while unknown) — and appends one piece per rank that receives any of them.
/// Only output indices in `deliver` are kept (a resumed epoch starts past 0; `drop`
/// leaves out the last step).
pub fn split(
    placement: &Placement,
    epoch: u64,
    rows: u64,
    first_pos: u64,
    deliver: Range<u64>,
    batch: &RecordBatch,
    out: &mut Vec<Piece>,
) {
    if !placement.shuffled() {
        return split_in_order(placement, epoch, rows, first_pos, &deliver, batch, out);
    }
    let positions = first_pos..first_pos + batch.num_rows() as u64;
    split_at(placement, epoch, rows, positions, &deliver, batch, out);
}

/// [`split`] for rows in order: runs of positions go to runs of a rank's indices (up to
/// a step's end, or a share's), so pieces are made run by run instead of placing each row
/// (placing was most of a reader's time when it featurizes nothing).
fn split_in_order(
    placement: &Placement,
    epoch: u64,
    rows: u64,
    first_pos: u64,
    deliver: &Range<u64>,
    batch: &RecordBatch,
    out: &mut Vec<Piece>,
) {
    let end = first_pos + batch.num_rows() as u64;
    let mut by_rank: Vec<Vec<Run>> = vec![Vec::new(); placement.world_size()];
    let mut p = first_pos;
    while p < end {
        let (i, run) = placement.run_at(p, rows);
        let run = run.min(end - p);
        // The part of the run's indices `i..i + run` that is delivered.
        let (lo, hi) = (i.max(deliver.start), (i + run).min(deliver.end));
        if lo < hi {
            let row = (p - first_pos + (lo - i)) as u32;
            let len = (hi - lo) as u32;
            push_run(
                &mut by_rank[placement.rank_of(lo)],
                Run {
                    index: lo,
                    row,
                    len,
                },
            );
        }
        p += run;
    }
    for (rank, runs) in by_rank.into_iter().enumerate() {
        if !runs.is_empty() {
            out.push(Piece::of_runs(epoch, rank, runs, batch.clone()));
        }
    }
}

/// [`split`] for a batch whose rows sit at `positions` (ascending, one per row), not
/// necessarily next to each other: a catch-up run reads on only its rank's rows.
pub fn split_at(
    placement: &Placement,
    epoch: u64,
    rows: u64,
    positions: impl Iterator<Item = u64>,
    deliver: &Range<u64>,
    batch: &RecordBatch,
    out: &mut Vec<Piece>,
) {
    let mut by_rank: Vec<Vec<(u64, u32)>> = vec![Vec::new(); placement.world_size()];
    place_each(placement, epoch, rows, positions, deliver, |i, row| {
        by_rank[placement.rank_of(i)].push((i, row as u32));
    });
    let mut scratch = Vec::new();
    for (rank, mut picks) in by_rank.into_iter().enumerate() {
        if picks.is_empty() {
            continue;
        }
        if placement.shuffled() {
            group_by_step(&mut picks, placement.step_rows(), &mut scratch);
        }
        let mut runs = Vec::new();
        for (i, row) in picks {
            push_run(
                &mut runs,
                Run {
                    index: i,
                    row,
                    len: 1,
                },
            );
        }
        out.push(Piece::of_runs(epoch, rank, runs, batch.clone()));
    }
}

/// Puts `picks` (`(index, row)`) in ascending step order, each step's picks together in
/// any order: a counting sort over the few steps a batch's windows span (a comparison
/// sort of every pick was a tenth of a shuffled reader's delivery cost).
fn group_by_step(picks: &mut Vec<(u64, u32)>, step_rows: u64, scratch: &mut Vec<(u64, u32)>) {
    let (first, last) = picks
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), &(i, _)| (lo.min(i), hi.max(i)));
    let (lo, hi) = (first / step_rows, last / step_rows);
    let span = hi.saturating_sub(lo).saturating_add(1);
    if span > picks.len() as u64 {
        // Sparse steps (tiny steps or a huge window): a plain sort costs less.
        return picks.sort_unstable_by_key(|&(i, _)| i);
    }
    // Each pick's step, worked out once: a 64-bit division is most of what a pick costs.
    let steps: Vec<u32> = picks
        .iter()
        .map(|&(i, _)| (i / step_rows - lo) as u32)
        .collect();
    let mut start = vec![0usize; span as usize + 1];
    for &s in &steps {
        start[s as usize + 1] += 1;
    }
    for s in 1..start.len() {
        start[s] += start[s - 1];
    }
    scratch.clear();
    scratch.resize(picks.len(), (0, 0));
    for (&pick, &s) in picks.iter().zip(&steps) {
        let at = &mut start[s as usize];
        scratch[*at] = pick;
        *at += 1;
    }
    std::mem::swap(picks, scratch);
}

/// The rows (of a batch at positions `first_pos..first_pos + n` of `epoch`) that go to
/// `rank`, in batch order: what a catch-up run for `rank` featurizes.
pub fn rank_rows(
    placement: &Placement,
    epoch: u64,
    rows: u64,
    first_pos: u64,
    n: usize,
    deliver: &Range<u64>,
    rank: usize,
) -> Vec<u32> {
    let mut mine = Vec::new();
    let positions = first_pos..first_pos + n as u64;
    place_each(placement, epoch, rows, positions, deliver, |i, row| {
        if placement.rank_of(i) == rank {
            mine.push(row as u32);
        }
    });
    mine
}

/// Where the rows of a batch at positions `first_pos..first_pos + n` of `epoch` (of `rows`
/// rows) go in the arena, when every row lies in a strided window of a rank's share (see
/// `placement.rs`) that `local` says is this process's: each delivered row's
/// `(row, fill, slot)` in row order into `picks`, fill `k` being step `steps[k]` =
/// `(step, rank)`. `false` otherwise, the caller then splitting the batch (and ignoring
/// `steps` and `picks`).
///
/// A strided window sends row `c` of stratum `a` to slot `a` of the window's batch
/// `π_a(c)`, all of one rank: walking the positions in order, a row's step and slot come
/// without dividing, grouping by step or cutting runs (placing, grouping and cutting were
/// ~6% of a shuffled run's CPU).
#[allow(clippy::too_many_arguments)]
pub(crate) fn strided_picks(
    placement: &Placement,
    epoch: u64,
    rows: u64,
    (first_pos, n): (u64, usize),
    deliver: &Range<u64>,
    local: impl Fn(usize) -> bool,
    steps: &mut Vec<(u64, usize)>,
    picks: &mut Vec<Pick>,
) -> bool {
    steps.clear();
    picks.clear();
    if !placement.strided() {
        return false;
    }
    // Each window the batch touches names its `m` steps; past a few per row that is more
    // work than the rows (a window of many tiny batches), and placing row by row is left.
    let most_steps = (n as u64).max(64);
    let (b, step_rows) = (placement.batch_size() as u64, placement.step_rows());
    let end = first_pos + n as u64;
    let mut p = first_pos;
    while p < end {
        let w = placement.window_at(p, rows);
        let mut order = placement.window_order(epoch, &w);
        let (Some(rank), WindowOrder::Strided(strided)) = (w.rank, &mut order) else {
            return false;
        };
        if !local(rank) {
            return false;
        }
        let m = strided.batches();
        if m > most_steps {
            return false;
        }
        let (first_step, first_fill) = ((w.start - w.segment) / b, steps.len() as u64);
        steps.extend((0..m).map(|j| (first_step + j, rank)));
        let first_index = first_step * step_rows + rank as u64 * b;
        let last = end.min(w.start + w.len);
        let (mut a, mut c) = ((p - w.start) / m, (p - w.start) % m);
        for pos in p..last {
            let j = strided.batch_of(a, c);
            let i = first_index + j * step_rows + a;
            if deliver.contains(&i) {
                picks.push(((pos - first_pos) as u32, (first_fill + j) as u32, a as u32));
            }
            c += 1;
            if c == m {
                (a, c) = (a + 1, 0);
            }
        }
        p = last;
    }
    true
}

/// Calls `f(index, row)` for each row (the `row`-th of `positions`, which ascend) whose
/// output index is in `deliver`. A window's permutation is made once for its run of rows.
fn place_each(
    placement: &Placement,
    epoch: u64,
    rows: u64,
    positions: impl Iterator<Item = u64>,
    deliver: &Range<u64>,
    mut f: impl FnMut(u64, usize),
) {
    // The window being placed, with its bijection: positions ascend, so a new window is
    // found by comparing with its end, not by working out the window of each row.
    let mut window: Option<(Window, Option<WindowOrder>)> = None;
    for (row, p) in positions.enumerate() {
        let (w, order) = match &mut window {
            Some((w, order)) if (w.start..w.start + w.len).contains(&p) => (*w, order),
            _ => {
                let w = placement.window_at(p, rows);
                let order = placement
                    .shuffled()
                    .then(|| placement.window_order(epoch, &w));
                let (w, order) = window.insert((w, order));
                (*w, order)
            }
        };
        let i = placement.index_in(&w, order.as_mut().map_or(0, |o| o.apply(p - w.start)));
        if deliver.contains(&i) {
            f(i, row);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::UInt64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::delivery::placement::{LastBatch, Placement};

    /// A piece whose rows are in its process's arena cannot be sent to another process.
    #[test]
    fn a_filled_piece_does_not_cross_processes() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::UInt64, false)]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(UInt64Array::from(vec![1, 2]))]);
        let batch = batch.unwrap();
        let piece = Piece::new(0, 0, vec![0, 1], batch.clone());
        assert!(piece.wire().is_ok());
        let filled = Piece::filled(0, 0, vec![(0, 2)], batch.schema());
        assert!(filled.wire().is_err());
        assert_eq!(filled.counts(), Some(&[(0, 2)][..]));
    }

    /// A window of many more steps than a batch has rows is left to `split`: naming every
    /// step of it would cost more than placing the rows.
    #[test]
    fn strided_picks_leave_windows_of_many_tiny_steps() {
        let placement = Placement::new(1, 1, LastBatch::Pad, 0, Some(1000))
            .unwrap()
            .over(5000);
        let (mut steps, mut picks) = (Vec::new(), Vec::new());
        let placed = strided_picks(
            &placement,
            0,
            5000,
            (0, 10),
            &(0..5000),
            |_| true,
            &mut steps,
            &mut picks,
        );
        assert!(!placed && steps.is_empty() && picks.is_empty());
        let placement = Placement::new(1, 20, LastBatch::Pad, 0, Some(1000))
            .unwrap()
            .over(5000);
        let placed = strided_picks(
            &placement,
            0,
            5000,
            (0, 10),
            &(0..5000),
            |_| true,
            &mut steps,
            &mut picks,
        );
        assert!(placed && steps.len() == 50 && picks.len() == 10);
    }

    proptest::proptest! {
        /// Rows placed window by window for the arena go where placing each row sends
        /// them, every delivered row once; a batch touching the tail, a rank of another
        /// process or an unstrided window is left to `split`.
        #[test]
        fn strided_picks_are_where_each_row_is_placed(
            world in 1usize..4,
            b in 1usize..9,
            m in 1u64..6,
            rows in 1u64..400,
            first_pos in 0u64..400,
            n in 0usize..120,
            cut in (0u64..400, 0u64..400),
            epoch in 0u64..3,
            remote in proptest::option::of(0usize..4),
        ) {
            let window = m * b as u64;
            let placement = Placement::new(world, b, LastBatch::Pad, 7, Some(window))
                .unwrap()
                .over(rows);
            let first_pos = first_pos.min(rows);
            let n = n.min((rows - first_pos) as usize);
            let deliver = cut.0.min(cut.1)..cut.0.max(cut.1);
            let (mut steps, mut picks) = (Vec::new(), Vec::new());
            let local = |r: usize| Some(r) != remote;
            let placed = strided_picks(
                &placement, epoch, rows, (first_pos, n), &deliver, local, &mut steps, &mut picks,
            );
            let share_end = rows / placement.step_rows() * placement.step_rows();
            let ranks: Vec<usize> = (first_pos..first_pos + n as u64)
                .map(|p| placement.window_at(p, rows).rank.unwrap_or(usize::MAX))
                .collect();
            let expected =
                n == 0 || (first_pos + n as u64 <= share_end && ranks.iter().all(|&r| local(r)));
            proptest::prop_assert_eq!(placed, expected);
            if !placed {
                return Ok(());
            }
            let step_rows = placement.step_rows();
            let mut want = Vec::new();
            for (row, p) in (first_pos..first_pos + n as u64).enumerate() {
                let i = placement.index(epoch, p, rows);
                if deliver.contains(&i) {
                    want.push((row as u32, i));
                }
            }
            let got: Vec<(u32, u64)> = picks
                .iter()
                .map(|&(row, fill, slot)| {
                    let (step, rank) = steps[fill as usize];
                    (row, step * step_rows + (rank * b) as u64 + u64::from(slot))
                })
                .collect();
            proptest::prop_assert_eq!(got, want);
        }
    }

    proptest::proptest! {
        /// Splitting rows in order run by run gives the pieces placing each row gives.
        #[test]
        fn in_order_pieces_are_those_of_placing_each_row(
            world in 1usize..5,
            b in 1usize..9,
            first_pos in 0u64..60,
            n in 0usize..40,
            cut in (0u64..100, 0u64..100),
        ) {
            let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::UInt64, false)]));
            let values = UInt64Array::from_iter_values(0..n as u64);
            let batch = RecordBatch::try_new(schema, vec![Arc::new(values)]).unwrap();
            let placement = Placement::new(world, b, LastBatch::Pad, 0, None).unwrap();
            let deliver = cut.0.min(cut.1)..cut.0.max(cut.1);
            let (mut fast, mut each) = (Vec::new(), Vec::new());
            split(&placement, 3, 200, first_pos, deliver.clone(), &batch, &mut fast);
            let positions = first_pos..first_pos + n as u64;
            split_at(&placement, 3, 200, positions, &deliver, &batch, &mut each);
            let view = |ps: &[Piece]| -> Vec<(usize, Vec<u64>, Vec<u32>)> {
                ps.iter()
                    .map(|p| (p.rank, p.indices().collect(), p.rows().collect()))
                    .collect()
            };
            proptest::prop_assert_eq!(view(&fast), view(&each));
            for p in &fast {
                let own = p.own_rows().unwrap();
                let x = own.column(0).as_any().downcast_ref::<UInt64Array>().unwrap();
                let want: Vec<u64> = p.rows().map(u64::from).collect();
                proptest::prop_assert_eq!(x.values().to_vec(), want);
            }
        }
    }

    proptest::proptest! {
        /// Grouping by step keeps every pick, puts steps in ascending order and each
        /// step's picks together, dense steps (counting sort) or sparse ones.
        #[test]
        fn picks_are_grouped_by_ascending_step(
            indices in proptest::collection::vec(0u64..5_000, 0..300),
            step_rows in 1u64..400,
        ) {
            let mut picks: Vec<(u64, u32)> =
                indices.iter().enumerate().map(|(r, &i)| (i, r as u32)).collect();
            let mut want = picks.clone();
            group_by_step(&mut picks, step_rows, &mut Vec::new());
            let steps: Vec<u64> = picks.iter().map(|&(i, _)| i / step_rows).collect();
            proptest::prop_assert!(steps.windows(2).all(|w| w[0] <= w[1]));
            let mut got = picks.clone();
            got.sort_unstable();
            want.sort_unstable();
            proptest::prop_assert_eq!(got, want);
        }
    }
}
