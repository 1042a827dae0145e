//! `EpochPlan`: a [`Placement`] over an input's units — which rows an epoch has, in which
//! order its units are read, and what each reader must read ([`EpochPlan::reads`]) — and
//! [`Ownership`], which process and worker owns each rank.

use super::permute::mix;
use super::placement::{LastBatch, Place, Placement};
use crate::error::Result;

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
    /// Rows each epoch leaves out, as a run drawn per epoch ([`EpochPlan::hole_at`]):
    /// a shuffled epoch dropping its last, short step (`drop`) leaves out other rows each
    /// epoch, as a sampler that shuffles before it truncates does. Its positions are the
    /// other rows'. 0 otherwise: an unshuffled epoch drops its last rows.
    hole: u64,
}

/// A run of one unit's rows at consecutive positions of an epoch: `rows` rows from the
/// unit's row `skip`, at positions `pos..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The unit (its index in the input).
    pub unit: usize,
    /// Rows of the unit before the first.
    pub skip: u64,
    /// Position of the first.
    pub pos: u64,
    /// Rows in the run.
    pub rows: u64,
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
        let rows = unit_rows.iter().sum::<u64>();
        let placement = Placement::new(world_size, batch_size, last_batch, seed, shuffle_window)?;
        let hole = match (placement.shuffled(), last_batch) {
            (true, LastBatch::Drop) => rows % placement.step_rows(),
            _ => 0,
        };
        Ok(EpochPlan {
            placement: placement.over(rows - hole),
            unit_rows,
            rows,
            hole,
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

    /// Positions per epoch: its rows, less those a shuffled epoch leaves out before it
    /// places any ([`EpochPlan::hole_at`]). What the placement is over.
    pub fn positions(&self) -> u64 {
        self.rows - self.hole
    }

    /// Where epoch `epoch` leaves out its rows: the rows it reads (units in its order,
    /// their rows in turn) from this one on, as many as the last step would have held,
    /// are left out. Drawn from the seed and epoch; `positions()` (past the last row
    /// placed) when nothing is left out this way.
    pub fn hole_at(&self, epoch: u64) -> u64 {
        let positions = self.positions();
        match self.hole {
            0 => positions,
            _ => mix(mix(self.placement.seed() ^ mix(epoch)) ^ HOLE_KEY) % (positions + 1),
        }
    }

    /// Rows of unit `u`.
    pub fn unit_rows(&self, u: usize) -> u64 {
        self.unit_rows[u]
    }

    /// Data-parallel ranks.
    pub fn world_size(&self) -> usize {
        self.placement.world_size()
    }

    /// Rows per rank per step.
    pub fn batch_size(&self) -> usize {
        self.placement.batch_size()
    }

    /// What happens to a last step that is not full.
    pub fn last_batch(&self) -> LastBatch {
        self.placement.last_batch()
    }

    /// Rows of one global step (all ranks).
    pub fn step_rows(&self) -> u64 {
        self.placement.step_rows()
    }

    /// Steps each rank takes per epoch.
    pub fn steps(&self) -> u64 {
        self.placement.steps(self.positions())
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
        self.positions().min(self.steps() * self.step_rows())
    }

    /// How many epochs a run can number: every row's place in the run (`epoch · rows +
    /// position`) and every step's time (`epoch · steps + step`) fit in 64 bits.
    pub fn max_epochs(&self) -> u64 {
        u64::MAX / self.rows.max(self.steps()).max(1)
    }

    /// Whether rows are shuffled.
    pub fn shuffled(&self) -> bool {
        self.placement.shuffled()
    }

    /// The output index of position `pos` of epoch `epoch`.
    pub fn index(&self, epoch: u64, pos: u64) -> u64 {
        self.placement.index(epoch, pos, self.positions())
    }

    /// Where position `pos` of epoch `epoch` goes; `None` when it is dropped.
    pub fn place(&self, epoch: u64, pos: u64) -> Option<Place> {
        let i = self.index(epoch, pos);
        (i < self.delivered_rows()).then(|| self.placement.place(i))
    }

    /// The rows epoch `epoch` places, as runs of units in the order it reads them:
    /// whole units, but for those the rows it leaves out cut ([`EpochPlan::hole_at`]).
    pub fn unit_positions(&self, epoch: u64) -> Vec<Span> {
        self.spans(epoch).0
    }

    /// The runs epoch `epoch` places, and those it leaves out (at positions past
    /// `positions()`, in the order it reads them).
    fn spans(&self, epoch: u64) -> (Vec<Span>, Vec<Span>) {
        let (hole, positions) = (self.hole_at(epoch), self.positions());
        let (mut placed, mut left) = (Vec::new(), Vec::new());
        let mut read = 0; // rows read before the unit, left out ones included
        for u in self.placement.unit_order(epoch, self.unit_rows.len()) {
            let rows = self.unit_rows[u];
            // The unit's rows before the hole end at `a`; those in it at `z`.
            let a = hole.clamp(read, read + rows) - read;
            let z = (hole + self.hole).clamp(read, read + rows) - read;
            let run = |to: &mut Vec<Span>, skip: u64, end: u64, pos: u64| {
                if skip < end {
                    to.push(Span {
                        unit: u,
                        skip,
                        pos,
                        rows: end - skip,
                    });
                }
            };
            run(&mut placed, 0, a, read);
            run(&mut left, a, z, positions + read + a - hole);
            run(&mut placed, z, rows, (read + z).saturating_sub(self.hole));
            read += rows;
        }
        (placed, left)
    }

    /// The `row_id`s of epoch `epoch` in output order (before dropping and padding; rows
    /// left out before placing come last): for tests and tools, O(rows) memory.
    pub fn order(&self, epoch: u64) -> Vec<u64> {
        let mut first = Vec::with_capacity(self.unit_rows.len());
        let mut row = 0;
        for &n in &self.unit_rows {
            first.push(row);
            row += n;
        }
        let mut out = vec![u64::MAX; self.rows as usize];
        let (placed, left) = self.spans(epoch);
        for s in placed {
            for k in 0..s.rows {
                out[self.index(epoch, s.pos + k) as usize] = first[s.unit] + s.skip + k;
            }
        }
        for s in left {
            for k in 0..s.rows {
                out[(s.pos + k) as usize] = first[s.unit] + s.skip + k;
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
        for s in self.unit_positions(epoch) {
            for (rank, range) in &wanted {
                let (lo, hi) = (range.start.max(s.pos), range.end.min(s.pos + s.rows));
                if lo < hi {
                    reads.push(Read {
                        unit: s.unit,
                        skip: s.skip + lo - s.pos,
                        rows: hi - lo,
                        pos: lo,
                        time: p.time_of(lo, self.positions()),
                        rank: *rank,
                    });
                }
            }
        }
        reads.sort_by_key(|r| (r.time, r.pos));
        reads
    }
}

/// Keys where an epoch leaves its rows out (apart from the keys of its windows).
const HOLE_KEY: u64 = 0x686f_6c65; // "hole"

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
            for pos in 0..p.positions() {
                let i = p.index(epoch, pos);
                prop_assert!(i < p.positions());
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
                    .map(|s| p.placement().real_rows(p.positions(), s, r) as u64)
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

        /// A shuffled epoch that drops leaves out, of the rows it reads (units in its
        /// order, their rows in turn), the run of `rows mod W·B` rows from `hole_at`, and
        /// places the others at positions 0.. in turn; an unshuffled one leaves out none
        /// this way.
        #[test]
        fn a_shuffled_drop_leaves_out_one_run_of_rows((units, w, b, _pad, window, epoch) in layouts()) {
            let p = plan(units.clone(), w, b, LastBatch::Drop, window);
            let first: Vec<u64> = units
                .iter()
                .scan(0, |row, &n| { *row += n; Some(*row - n) })
                .collect();
            let read: Vec<u64> = p.placement().unit_order(epoch, units.len())
                .into_iter()
                .flat_map(|u| first[u]..first[u] + units[u])
                .collect();
            let h = if window.is_some() { p.rows() % p.step_rows() } else { 0 };
            prop_assert_eq!(p.positions(), p.rows() - h);
            let (d, h) = (p.hole_at(epoch) as usize, h as usize);
            prop_assert!(d as u64 <= p.positions());
            let mut placed = vec![u64::MAX; p.positions() as usize];
            for s in p.unit_positions(epoch) {
                prop_assert!(s.rows > 0 && s.skip + s.rows <= units[s.unit]);
                for k in 0..s.rows {
                    placed[(s.pos + k) as usize] = first[s.unit] + s.skip + k;
                }
            }
            let kept: Vec<u64> = read[..d].iter().chain(&read[d + h..]).copied().collect();
            prop_assert_eq!(placed, kept);
            if window.is_some() {
                let order = p.order(epoch);
                let dropped: HashSet<u64> = order[p.delivered_rows() as usize..].iter().copied().collect();
                prop_assert_eq!(dropped, read[d..d + h].iter().copied().collect::<HashSet<_>>());
            }
        }

        /// A row moves only within its window, which lies in one rank's share (or the
        /// tail).
        #[test]
        fn rows_stay_in_their_window((units, w, b, _pad, window, epoch) in layouts()) {
            let p = plan(units, w, b, LastBatch::Pad, window);
            let pl = p.placement();
            for pos in 0..p.positions() {
                let win = pl.window_at(pos, p.positions());
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
            let (share, full) = (pl.share_rows(), p.positions() / p.step_rows());
            prop_assert_eq!(share, full * b as u64);
            for pos in 0..p.positions() {
                let Some(place) = p.place(epoch, pos) else { continue };
                let t = pl.time_of(pos, p.positions());
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
                let win = pl.window_at(pos, p.positions());
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
            let mut seen = vec![0u32; p.positions() as usize];
            for (k, reads) in parts.iter().enumerate() {
                let keys: Vec<_> = reads.iter().map(|r| (r.time, r.pos)).collect();
                prop_assert!(keys.windows(2).all(|x| x[0] <= x[1]));
                for r in reads {
                    prop_assert!(r.skip + r.rows <= p.unit_rows(r.unit));
                    prop_assert_eq!(r.time, p.placement().time_of(r.pos, p.positions()));
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
            for pos in 0..p.positions() {
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
            let full = p.positions() - p.positions() % k;
            for pos in 0..full {
                prop_assert_eq!(stream.index(epoch, pos, u64::MAX), stream.index(epoch, pos, p.positions()));
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

    /// One unit, shuffled, dropping its last short step: the rows left out move from
    /// epoch to epoch, so that every row is trained on in some epoch (they were once
    /// always the unit's last rows).
    #[test]
    fn a_shuffled_drop_leaves_out_other_rows_each_epoch() {
        let p = plan(vec![1000], 2, 64, LastBatch::Drop, Some(256));
        assert_eq!((p.dropped_rows(), p.positions()), (1000 % 128, 896));
        let dropped = |epoch| -> HashSet<u64> {
            let order = p.order(epoch);
            order[p.delivered_rows() as usize..]
                .iter()
                .copied()
                .collect()
        };
        let epochs: Vec<_> = (0..8).map(dropped).collect();
        assert!(epochs.windows(2).all(|e| e[0] != e[1]), "{epochs:?}");
        let never: HashSet<u64> = epochs
            .iter()
            .fold((0..1000).collect(), |never, e| &never & e);
        assert!(
            never.is_empty(),
            "rows {never:?} are left out of all 8 epochs"
        );
        // Unshuffled, the last rows are left out, as before.
        let p = plan(vec![1000], 2, 64, LastBatch::Drop, None);
        assert_eq!(p.positions(), 1000);
        assert_eq!(p.order(0)[896..], (896..1000).collect::<Vec<u64>>()[..]);
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
    fn a_fixed_seed_leaves_out_fixed_rows() {
        // Pinned as above: 9 rows in steps of 2, one left out, where epoch 0 draws it.
        let p = plan(vec![5, 4], 1, 2, LastBatch::Drop, Some(4));
        assert_eq!((p.hole_at(0), &p.order(0)[..]), (1, &PINNED_HOLE[..]));
    }

    /// The row read second (row 1) is left out, last in the order.
    const PINNED_HOLE: [u64; 9] = [2, 4, 0, 3, 5, 7, 6, 8, 1];

    #[test]
    fn a_fixed_seed_gives_a_fixed_strided_order() {
        // Pinned as above: 2 ranks of 2, windows of 8 (a rank's share: four batches, each
        // taking one row of each stratum of 4).
        let p = plan(vec![8, 8], 2, 2, LastBatch::Pad, Some(8));
        assert_eq!(p.order(0), PINNED_STRIDED);
    }

    const PINNED_STRIDED: [u64; 16] = [3, 7, 9, 12, 1, 4, 11, 15, 2, 5, 8, 13, 0, 6, 10, 14];

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
