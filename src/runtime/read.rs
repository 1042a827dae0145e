//! Readers: each worker's part of an epoch — the reads ([`EpochPlan::reads`]) of the ranks
//! its process owns (or of the one rank caught up), dealt to the process's workers by
//! share — merged by time, so that a worker's batches' times never go back, and sent no
//! further ahead of the slowest owner than the plan's slack.

use std::iter::Peekable;
use std::ops::Range;
use std::sync::atomic::Ordering;

use hydrant_operators::{Batch, ErrorSlot};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::{InputHandle, ProbeHandle};
use timely::worker::Worker;

use super::dataflow::{Job, wait_on_progress};
use crate::delivery::{Delivery, EpochPlan, Ownership, Read, rank_rows};
use crate::error::{Error, Result};
use crate::source::Inputs;

/// Reads this worker's part of each epoch (see the module), stamping each batch with the
/// time of its first row; stays within a bounded distance of the slowest owner.
pub(super) fn read_epochs(
    worker: &mut Worker,
    job: &Job,
    (ownership, process): (Ownership, usize),
    input: &mut InputHandle<u64, CapacityContainerBuilder<Vec<Batch>>>,
    probe: &ProbeHandle<u64>,
    errors: &ErrorSlot,
) {
    let (local, workers) = (worker.index() % ownership.workers, ownership.workers);
    let d = &job.delivery;
    let units = job.inputs.units();
    let biggest = units.iter().map(|u| u.rows).max().unwrap_or(0);
    let (ranks, tail) = match d.only {
        Some(r) => (r..r + 1, d.plan.tail_ranks().contains(&r)),
        // The tail's rows are few (less than a step): process 0 reads them all.
        None => (ownership.ranks(process), process == 0),
    };
    let batch_rows = job.inputs.batch_rows() as u64;
    let slack = d.reader_slack(workers, ranks.len(), biggest, batch_rows);
    for epoch in d.start_epoch..d.epochs {
        let reads = d
            .plan
            .reads(epoch, ranks.clone(), tail, d.first_step(epoch));
        let mut merge = Merge::new(deal(reads, ranks.clone(), local, workers));
        loop {
            let next = {
                let _running = hydrant_operators::running::enter("source");
                merge.next(&job.inputs, &d.plan)
            };
            let (mut first, mut b, read) = match next {
                Ok(Some(next)) => next,
                Ok(None) => break,
                Err(e) => return e.record_in(errors, crate::error::origin::SOURCE),
            };
            // Stamped with the time of the batch's first row before any is left out, the
            // one the merge went by: a worker's times never go back.
            let time = d.epoch_time(epoch).saturating_add(read.time);
            // A catch-up run featurizes only its rank's rows from its first step on. A
            // batch of its share whose window starts at that step or later holds nothing
            // else; the tail holds every rank's rows, and the first window earlier steps'.
            if let Some(rank) = d.only
                && (read.rank.is_none() || read.time < d.first_step(epoch))
            {
                let _running = hydrant_operators::running::enter("source");
                match rows_of(d, epoch, first, rank, b.data) {
                    Ok(Some((skipped, data))) => (first, b.data) = (first + skipped, data),
                    Ok(None) => continue,
                    Err(e) => return e.record_in(errors, crate::error::origin::SOURCE),
                }
            }
            b.seq = epoch
                .saturating_mul(d.plan.positions())
                .saturating_add(first);
            job.featurized
                .fetch_add(b.data.num_rows() as u64, Ordering::Relaxed);
            // The worker moves on to the batch's time before it waits to send it: owners
            // see every row before that time read, and let their steps out, without the
            // batch (a shuffled window's rows all carry its first step, so a reader that
            // waited at the old time would hold the owners, and them it, a window back).
            input.advance_to(time);
            // Step at least once per batch: this worker may own ranks, and assembling
            // them must not wait for the slack to fill.
            worker.step();
            wait_on_progress(worker, || probe.less_than(&time.saturating_sub(slack)));
            if errors.get().is_some() {
                return;
            }
            input.send(b);
        }
    }
}

/// The reads (in time order) that worker `local` of `workers` takes: each share is read
/// by as few workers as can share the work — share `j` of the `L` by workers `j`, `j + L`,
/// … taking its reads in turn when there are more workers than shares, by worker
/// `j mod T` alone when there are fewer — so that a worker has as few units open at once
/// as it can (each holds its row group's pages, and a reader alternating between units
/// keeps more of them), and reads only the shares of ranks it owns (see `own.rs`). The
/// tail goes to worker 0.
fn deal(reads: Vec<Read>, ranks: Range<usize>, local: usize, workers: usize) -> Vec<Read> {
    let shares = ranks.len().max(1);
    let mut taken = vec![0usize; shares];
    reads
        .into_iter()
        .filter(|read| {
            let Some(rank) = read.rank else {
                return local == 0;
            };
            let j = rank - ranks.start;
            if workers <= shares {
                return j % workers == local;
            }
            // Workers j, j + L, ... (at least one: j < L < T).
            let readers = (workers - j).div_ceil(shares);
            let k = taken[j];
            taken[j] += 1;
            j + shares * (k % readers) == local
        })
        .collect()
}

/// A worker's reads, merged by time: a read is opened when its first row is the earliest
/// still to come.
struct Merge {
    pending: Peekable<std::vec::IntoIter<Read>>,
    open: Vec<Reading>,
}

impl Merge {
    fn new(reads: Vec<Read>) -> Self {
        Merge {
            pending: reads.into_iter().peekable(),
            open: Vec::new(),
        }
    }

    /// The next batch in time order, with its first position and the read it came from
    /// (`time`: that first row's); `None` once every read is done.
    fn next(&mut self, inputs: &Inputs, plan: &EpochPlan) -> Result<Option<(u64, Batch, Read)>> {
        loop {
            let earliest = (0..self.open.len()).min_by_key(|&k| self.open[k].key());
            let opens = match (self.pending.peek(), earliest) {
                (Some(r), Some(k)) => (r.time, r.pos) < self.open[k].key(),
                (next, _) => next.is_some(),
            };
            if opens && let Some(read) = self.pending.next() {
                let unit = &inputs.units()[read.unit];
                let (batches, skipped) =
                    inputs.read_rows(unit, read.skip..read.skip + read.rows)?;
                self.open
                    .push(Reading::new(read, unit.rows, batches, skipped));
                continue;
            }
            let Some(k) = earliest else {
                return Ok(None);
            };
            let at = self.open[k].read;
            match self.open[k].next(plan)? {
                Some((first, batch)) => return Ok(Some((first, batch, at))),
                None => {
                    self.open.swap_remove(k);
                }
            }
        }
    }
}

/// One read being read: its unit's batches, cut to the read's rows.
struct Reading {
    batches: Box<dyn Iterator<Item = Result<Batch>> + Send>,
    /// The read, its `pos` and `time` moved on to the next row still to come.
    read: Read,
    /// Rows of the unit still to skip, and still to take.
    skip: u64,
    left: u64,
    /// Whether the read runs to the unit's end: the unit's batches are then read to their
    /// end, so that a whole unit is cached.
    to_end: bool,
    /// The rest of a batch cut at a step's end (see [`Reading::next`]).
    rest: Option<Batch>,
}

impl Reading {
    /// `read` of a unit of `unit_rows` rows from `batches`, which start `skipped` rows
    /// into the unit.
    fn new(
        read: Read,
        unit_rows: u64,
        batches: Box<dyn Iterator<Item = Result<Batch>> + Send>,
        skipped: u64,
    ) -> Self {
        Reading {
            batches,
            read,
            skip: read.skip - skipped,
            left: read.rows,
            to_end: read.skip + read.rows == unit_rows,
            rest: None,
        }
    }

    /// What the merge orders by: the time, then the position, of the next row.
    fn key(&self) -> (u64, u64) {
        (self.read.time, self.read.pos)
    }

    /// The next batch of the read's rows, with its first position; `None` at the end.
    ///
    /// In order, a batch that ends inside a step is cut at that step's start, and its last
    /// rows come as a batch of their own. The owner holds a step's rows until the step is
    /// whole; had it held the batch they came in, every batch of a unit whose rows start
    /// inside a step (after a unit of rows not a multiple of `B`) would stay alive until
    /// the next one came: twice the featurized batches alive at once (a 10M-row Criteo
    /// file written in 1M-row parts peaked 10% higher than one written whole).
    ///
    /// Shuffled, a batch that runs into a shuffle window it does not fill to its end is cut
    /// at that window's start. Whole, its one put into the arena made the next window's steps before the
    /// owner took out the steps it had just completed, so their buffers had not come back
    /// to the pool yet: a second window of step buffers for every rank whose share is not
    /// in line with the row groups (`examples/criteo_hash.toml`, 2 ranks, a 10M-row file
    /// with a 16,960-row group every 1M rows: peak 155 MB whole, 117 MB cut).
    fn next(&mut self, plan: &EpochPlan) -> Result<Option<(u64, Batch)>> {
        let placement = plan.placement();
        while self.left > 0 {
            let mut b = match self.rest.take() {
                Some(rest) => rest,
                None => match self.batches.next() {
                    Some(batch) => batch?,
                    None => {
                        return Err(Error::Dataflow(format!(
                            "unit {} ended {} rows short of what the plan was made for",
                            self.read.unit, self.left
                        )));
                    }
                },
            };
            let n = b.data.num_rows() as u64;
            if self.skip >= n {
                self.skip -= n;
                continue;
            }
            let mut take = (n - self.skip).min(self.left);
            // Rows of a rank's share past where this batch must end (see above) come as
            // a batch of their own.
            let keep = match (self.read.rank, placement.shuffled()) {
                (None, _) => take,
                (Some(_), false) => {
                    let over = (self.read.pos + take) % placement.batch_size() as u64;
                    if over < take { take - over } else { take }
                }
                (Some(_), true) => {
                    // Cut before the window the batch ends inside, if it started in an
                    // earlier one: windows smaller than a batch stay whole windows a batch
                    // (cut at every window, a 16-row window took 1.84 s against 0.39 s).
                    // A batch that ends exactly at its share's end (a short last window)
                    // is not cut: every window it holds is then whole.
                    let w = placement.window_at(self.read.pos + take - 1, plan.positions());
                    if w.start > self.read.pos && w.start + w.len > self.read.pos + take {
                        w.start - self.read.pos
                    } else {
                        take
                    }
                }
            };
            if 0 < keep && keep < take {
                let cut = self.skip + keep;
                self.rest = Some(Batch {
                    seq: b.seq,
                    data: b.data.slice(cut as usize, (n - cut) as usize),
                });
                take = keep;
            }
            if take < n {
                b.data = b.data.slice(self.skip as usize, take as usize);
            }
            let first = self.read.pos;
            (self.skip, self.left) = (0, self.left - take);
            self.read.pos += take;
            self.read.time = placement.time_of(self.read.pos, plan.positions());
            return Ok(Some((first, b)));
        }
        if std::mem::take(&mut self.to_end)
            && let Some(extra) = self.batches.next()
            && extra?.data.num_rows() > 0
        {
            return Err(Error::Dataflow(format!(
                "unit {} has more rows than the plan was made for",
                self.read.unit
            )));
        }
        Ok(None)
    }
}

/// Only `rank`'s rows of `data` (positions `first..` of `epoch`), and how many rows before
/// the first of them were left out; `None` if it has none.
fn rows_of(
    d: &Delivery,
    epoch: u64,
    first: u64,
    rank: usize,
    data: arrow::array::RecordBatch,
) -> Result<Option<(u64, arrow::array::RecordBatch)>> {
    let (placement, n) = (d.plan.placement(), data.num_rows());
    let keep = rank_rows(
        placement,
        epoch,
        d.plan.positions(),
        first,
        n,
        &d.indices(epoch),
        rank,
    );
    Ok(match keep.first() {
        None => None,
        Some(_) if keep.len() == n => Some((0, data)),
        Some(&skipped) => {
            let keep = arrow::array::UInt32Array::from(keep);
            let data = arrow::compute::take_record_batch(&data, &keep)?;
            Some((skipped as u64, data))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In order, a rank's batches are cut where a step ends inside them, so that no batch
    /// holds the start of a step it does not finish; shuffled, where a shuffle window
    /// starts that the batch does not finish, so that no batch runs into the next window,
    /// while windows smaller than a batch come whole windows to a batch, not one a batch.
    /// Either way every row comes once, in order, at its position.
    #[test]
    fn a_ranks_batches_are_cut_where_a_step_or_a_window_ends() {
        use arrow::array::{AsArray, RecordBatch, UInt64Array};
        use arrow::datatypes::UInt64Type;

        use crate::delivery::LastBatch;

        let b = 4;
        for window in [None, Some(8), Some(3)] {
            // A unit of 6 rows puts the next one's rows out of step with B.
            let plan = EpochPlan::new(vec![6, 30], 1, b, LastBatch::Pad, 0, window).unwrap();
            let mut got = Vec::new();
            for read in plan.reads(0, 0..1, true, 0) {
                let rows = [6, 30][read.unit];
                let batches = (0..rows).step_by(8).map(move |at| {
                    let n = (rows - at).min(8);
                    let x = UInt64Array::from_iter_values(at..at + n);
                    Ok(Batch {
                        seq: 0,
                        data: RecordBatch::try_from_iter([("x", std::sync::Arc::new(x) as _)])
                            .unwrap(),
                    })
                });
                let mut reading = Reading::new(read, rows, Box::new(batches), 0);
                while let Some((first, batch)) = reading.next(&plan).unwrap() {
                    let x = batch.data.column(0).as_primitive::<UInt64Type>();
                    let n = x.len() as u64;
                    let unit_first = read.pos - read.skip;
                    assert!(
                        x.values()
                            .iter()
                            .enumerate()
                            .all(|(k, &v)| v + unit_first == first + k as u64)
                    );
                    let (last_step, end_step) =
                        ((first + n - 1) / b as u64, (first + n) / b as u64);
                    if window.is_none() && first / b as u64 != last_step {
                        assert_eq!(
                            end_step,
                            last_step + 1,
                            "rows {first}..{} end inside a step",
                            first + n
                        );
                    }
                    if let Some(k) = window {
                        // The one share starts at position 0: windows at multiples of k.
                        // A batch that ends inside a window (the last ends at 36) started
                        // in it.
                        let last = (first + n - 1) / k;
                        assert!(
                            (first + n).is_multiple_of(k) || first + n == 36 || first / k == last,
                            "rows {first}..{}",
                            first + n
                        );
                    }
                    got.push((first, n));
                }
            }
            let ends: Vec<u64> = got.iter().map(|(f, n)| f + n).collect();
            let starts: Vec<u64> = got.iter().skip(1).map(|(f, _)| *f).collect();
            assert_eq!(&ends[..ends.len() - 1], &starts[..], "{window:?}: {got:?}");
            assert_eq!((got[0].0, ends[ends.len() - 1]), (0, 36));
            // Whichever unit comes first, one of them starts inside a step and a window;
            // a batch is cut once at most.
            let cut = got.len() > 1 + 30usize.div_ceil(8);
            assert!(cut, "{window:?}: {got:?}");
            assert!(
                got.len() <= 2 * (1 + 30usize.div_ceil(8)),
                "{window:?}: {got:?}"
            );
        }
    }

    /// Every read goes to exactly one worker, in time order, and a worker reads as few
    /// shares as the numbers allow.
    #[test]
    fn reads_are_dealt_once_by_share() {
        let read = |k: u64, rank: Option<usize>| Read {
            unit: k as usize,
            skip: 0,
            rows: 10,
            pos: k * 10,
            time: k,
            rank,
        };
        for (shares, workers) in [
            (1, 1),
            (1, 3),
            (2, 1),
            (2, 2),
            (2, 3),
            (3, 2),
            (4, 2),
            (2, 5),
        ] {
            let ranks = 3..3 + shares;
            let mut reads: Vec<Read> = (0..40)
                .map(|k| read(k, Some(3 + (k as usize * 7 / 3) % shares)))
                .collect();
            reads.push(read(40, None));
            let dealt: Vec<Vec<Read>> = (0..workers)
                .map(|w| deal(reads.clone(), ranks.clone(), w, workers))
                .collect();
            let mut all: Vec<u64> = dealt.iter().flatten().map(|r| r.time).collect();
            all.sort_unstable();
            assert_eq!(
                all,
                (0..41).collect::<Vec<_>>(),
                "{shares} shares, {workers} workers"
            );
            for (w, mine) in dealt.iter().enumerate() {
                assert!(mine.windows(2).all(|x| x[0].time < x[1].time));
                let mut read_shares: Vec<usize> = mine.iter().filter_map(|r| r.rank).collect();
                read_shares.sort_unstable();
                read_shares.dedup();
                assert!(
                    read_shares.len() <= shares.div_ceil(workers),
                    "worker {w} of {workers} reads shares {read_shares:?} of {shares}"
                );
                if workers <= shares || w < shares {
                    assert!(!mine.is_empty(), "worker {w} of {workers} reads nothing");
                }
            }
        }
    }

    /// A worker reads only the shares of ranks it owns, or owns none: blocked on one of
    /// its ranks' full loaders, it holds back no rows another worker's rank needs.
    #[test]
    fn a_worker_reads_only_its_own_ranks_shares() {
        for (processes, ranks, workers) in [(1, 2, 1), (1, 2, 2), (1, 3, 2), (2, 4, 3), (2, 5, 2)] {
            let o = Ownership {
                world_size: ranks,
                processes,
                workers,
            };
            for process in 0..processes {
                let mine = o.ranks(process);
                let reads: Vec<Read> = (0..60)
                    .map(|k| Read {
                        unit: k,
                        skip: 0,
                        rows: 1,
                        pos: k as u64,
                        time: k as u64,
                        rank: Some(mine.start + k % mine.len()),
                    })
                    .collect();
                for local in 0..workers {
                    let index = process * workers + local;
                    let owned: Vec<usize> =
                        mine.clone().filter(|&r| o.worker(r) == index).collect();
                    for read in deal(reads.clone(), mine.clone(), local, workers) {
                        let rank = read.rank.unwrap();
                        assert!(
                            owned.is_empty() || owned.contains(&rank),
                            "worker {index} owns {owned:?} and reads rank {rank}'s share"
                        );
                    }
                }
            }
        }
    }
}
