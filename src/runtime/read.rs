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

use super::dataflow::{Job, PARK};
use crate::delivery::{Delivery, EpochPlan, Ownership, Read, rank_rows};
use crate::error::{Error, Result};
use crate::source::{Inputs, Unit};

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
                Err(e) => return errors.set("source", e),
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
                    Err(e) => return errors.set("source", e),
                }
            }
            b.seq = epoch.saturating_mul(d.plan.rows()).saturating_add(first);
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
            while probe.less_than(&time.saturating_sub(slack)) {
                worker.step_or_park(Some(PARK));
                super::fate::abandon_if_failed();
            }
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
                self.open.push(Reading::new(read, unit, inputs.read(unit)?));
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
}

impl Reading {
    fn new(
        read: Read,
        unit: &Unit,
        batches: Box<dyn Iterator<Item = Result<Batch>> + Send>,
    ) -> Self {
        Reading {
            batches,
            read,
            skip: read.skip,
            left: read.rows,
            to_end: read.skip + read.rows == unit.rows,
        }
    }

    /// What the merge orders by: the time, then the position, of the next row.
    fn key(&self) -> (u64, u64) {
        (self.read.time, self.read.pos)
    }

    /// The next batch of the read's rows, with its first position; `None` at the end.
    fn next(&mut self, plan: &EpochPlan) -> Result<Option<(u64, Batch)>> {
        while self.left > 0 {
            let Some(batch) = self.batches.next() else {
                return Err(Error::Dataflow(format!(
                    "unit {} ended {} rows short of what the plan was made for",
                    self.read.unit, self.left
                )));
            };
            let mut b = batch?;
            let n = b.data.num_rows() as u64;
            if self.skip >= n {
                self.skip -= n;
                continue;
            }
            let take = (n - self.skip).min(self.left);
            if take < n {
                b.data = b.data.slice(self.skip as usize, take as usize);
            }
            let first = self.read.pos;
            (self.skip, self.left) = (0, self.left - take);
            self.read.pos += take;
            self.read.time = plan.placement().time_of(self.read.pos, plan.rows());
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
        d.plan.rows(),
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
