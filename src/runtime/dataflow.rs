//! The timely dataflow: each worker reads its share of the input units, fitting (when no
//! state is given) and then featurizing; each featurized batch is placed row by row and
//! split by destination rank; the worker that owns a rank assembles its steps and hands
//! them to a sink or a loader of its process.
//!
//! ```text
//! input (this worker's units) ─► featurize ─► place ─► exchange to each rank's owner ─► own ─► sink / loader
//! ```
//!
//! Each process reads only the shares of the ranks it owns, so rows cross processes only in
//! an epoch's last, short step. Readers run at most a bounded distance (in steps) ahead of
//! the slowest owner's next step, seen through a probe, and sinks and loaders block when full, so memory is bounded
//! by that distance and the queues, not by the input, whatever the number of processes.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hydrant_operators::{
    Batch, ErrorSlot, FeaturePlan, Featurize, FitPartial, FittedState, Transformer,
};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::Input;
use timely::dataflow::operators::{Exchange, Operator, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};
use timely::worker::Worker;

use super::cluster::Cluster;
use super::fate::{self, Fate};
use super::gather::all_to_all;
use crate::delivery::{
    Arena, Delivery, EpochPlan, Ownership, Piece, PlaceRows, RankBatch, Read, delivery_schema, own,
    rank_rows,
};
use crate::error::{Error, Result};
use crate::loader::LoaderFeed;
use crate::sink::{BatchSink, SinkSpec};
use crate::source::Inputs;

/// Longest a waiting worker sleeps between looks (it wakes early when data arrives), so a
/// worker held up by a full loader does not spin.
const PARK: Duration = Duration::from_millis(1);

/// How often `execute` calls its `on_tick` while the job runs.
const TICK: Duration = Duration::from_millis(100);

/// A failure the job cannot finish after: a worker panicked, or a peer process is lost.
fn fatal(fate: &Fate, cluster: &Cluster) -> Option<String> {
    if let Some(f) = fate.failure() {
        return Some(f.to_string());
    }
    let (peer, seen) = fate::lost_peer().filter(|_| cluster.processes > 1)?;
    Some(format!(
        "lost process {peer} of the cluster ({}): {seen}",
        cluster.address(*peer)
    ))
}

/// Where rank batches go.
pub enum Output {
    /// Each worker writes the batches of the ranks it owns.
    Sink(SinkSpec),
    /// Rank `r`'s batches go to `feeds[r]`; ranks of other processes have none.
    Loaders(Vec<Option<LoaderFeed>>),
    /// Rank `r`'s batches go to `channels[r]` as they are (`None`: discarded), until the
    /// token is cancelled (then the run ends, whether or not anyone receives).
    Channels(Channels),
    /// Each epoch's batches of rank `r` go to the queue `open(epoch, r)` hands r's owner
    /// when the epoch's first batch of r comes (a served cluster's one dataflow feeds a
    /// run per epoch). `None`, or a queue whose run is stopped, discards them: the
    /// dataflow goes on, since the other processes share its fate.
    Epochs(OpenQueue),
}

/// Hands out the queue of (epoch, rank) once (see [`Output::Epochs`]).
pub type OpenQueue = Arc<dyn Fn(u64, usize) -> Option<RankQueue> + Send + Sync>;

/// One rank's queue of one run, and the token that stops the run.
pub struct RankQueue {
    /// Where the rank's batches go.
    pub tx: tokio::sync::mpsc::Sender<RankBatch>,
    /// Cancelled when no one will read the queue again.
    pub stop: tokio_util::sync::CancellationToken,
}

impl RankQueue {
    fn send(&self, rb: RankBatch) -> bool {
        send_unless_stopped(&self.tx, &self.stop, rb)
    }
}

/// Sends `rb` on `tx`, waiting for room; `false` if `stop` is cancelled or the reader gone.
fn send_unless_stopped(
    tx: &tokio::sync::mpsc::Sender<RankBatch>,
    stop: &tokio_util::sync::CancellationToken,
    rb: RankBatch,
) -> bool {
    // Dataflow workers are threads of their own, never a tokio worker: waiting here is the
    // backpressure. The wait also ends when the run is stopped, so that a run whose
    // readers are gone (or stuck on a dead connection) cannot block forever.
    futures::executor::block_on(async {
        tokio::select! {
            biased;
            _ = stop.cancelled() => false,
            sent = tx.send(rb) => sent.is_ok(),
        }
    })
}

/// Per-rank queues and the token that stops a run feeding them.
#[derive(Clone)]
pub struct Channels {
    /// Rank `r`'s queue, if this run serves it.
    pub senders: Vec<Option<tokio::sync::mpsc::Sender<RankBatch>>>,
    /// Cancelled when no one will read the queues again.
    pub stop: tokio_util::sync::CancellationToken,
}

impl Channels {
    /// Sends `rb` to its rank's queue, waiting for room, unless the run is stopped.
    fn send(&self, rb: RankBatch) -> Result<()> {
        let rank = rb.meta.rank;
        let Some(tx) = &self.senders[rank] else {
            return Ok(());
        };
        if send_unless_stopped(tx, &self.stop, rb) {
            Ok(())
        } else {
            Err(crate::loader::stopped_reading(rank))
        }
    }
}

/// What one run does.
pub struct Job {
    /// The inputs, opened and prepared for the plan.
    pub inputs: Arc<Inputs>,
    /// The checked pipeline.
    pub plan: Arc<FeaturePlan>,
    /// A fitted state to use; fit first when `None`.
    pub state: Option<FittedState>,
    /// `state` bound to `plan`, if the caller bound it already (each worker clones it
    /// instead of binding again).
    pub bound: Option<Transformer>,
    /// Which rows go to which rank, for which epochs.
    pub delivery: Delivery,
    /// Where rank batches go; `None` only fits.
    pub output: Option<Output>,
    /// When the command started, for time-to-first-batch.
    pub started: Instant,
    /// Rows featurized so far in this process (for progress reporting).
    pub progress: Arc<AtomicU64>,
    /// Rows read and handed to featurization so far in this process (a catch-up run
    /// featurizes only its rank's).
    pub featurized: Arc<AtomicU64>,
    /// Where the run's first error is left (loaders pass it on to their trainers).
    pub errors: ErrorSlot,
    /// The state this run fitted, bound once for every worker of the process (binding
    /// builds the vocabulary indexes, the slow part, on every core already).
    fitted_binding: Mutex<Option<Transformer>>,
    /// Shuffled steps being filled, shared by the process's workers.
    arena: Option<Arc<Arena>>,
}

impl Job {
    /// A job delivering `delivery` from `inputs` through `plan`, with `state` (fitted
    /// first when `None`) and, when the caller has bound it already, `bound`; its output
    /// is set by whoever runs it.
    pub fn new(
        inputs: Arc<Inputs>,
        plan: Arc<FeaturePlan>,
        state: Option<FittedState>,
        bound: Option<Transformer>,
        delivery: Delivery,
    ) -> Self {
        let arena = Arena::new(&plan.output_schema(), delivery.plan.placement());
        Job {
            inputs,
            plan,
            state,
            bound,
            delivery,
            output: None,
            started: Instant::now(),
            progress: Default::default(),
            featurized: Default::default(),
            errors: ErrorSlot::default(),
            fitted_binding: Mutex::default(),
            arena,
        }
    }

    /// `fitted` bound to the plan: by the first worker to ask, the others waiting for it
    /// and sharing its vocabulary indexes (a failure is met again by each).
    fn bind_fitted(&self, fitted: &FittedState) -> Result<Transformer> {
        let mut bound = self
            .fitted_binding
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(t) = bound.as_ref() {
            return Ok(t.clone());
        }
        let t = self.plan.transformer(fitted)?;
        *bound = Some(t.clone());
        Ok(t)
    }
}

/// What the workers of this process did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The state fitted by this run (`None` when one was given).
    pub state: Option<FittedState>,
    /// Version of the state used.
    pub state_version: Option<u64>,
    /// Time spent fitting.
    pub fit: Duration,
    /// Real rows delivered by this process's sinks.
    pub rows: u64,
    /// Padding rows delivered by this process's sinks.
    pub padded_rows: u64,
    /// Rank batches delivered by this process's sinks.
    pub batches: u64,
    /// Rank batches delivered per rank (by this process).
    pub steps_per_rank: Vec<u64>,
    /// When the first rank batch reached a sink, from the start.
    pub first_batch: Option<Duration>,
}

impl Report {
    fn add(&mut self, r: Report) {
        self.rows += r.rows;
        self.padded_rows += r.padded_rows;
        self.batches += r.batches;
        if self.steps_per_rank.len() < r.steps_per_rank.len() {
            self.steps_per_rank.resize(r.steps_per_rank.len(), 0);
        }
        for (a, b) in self.steps_per_rank.iter_mut().zip(&r.steps_per_rank) {
            *a += b;
        }
        self.fit = self.fit.max(r.fit);
        self.first_batch = match (self.first_batch, r.first_batch) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.state = self.state.take().or(r.state);
        self.state_version = self.state_version.or(r.state_version);
    }
}

/// Runs the job on `cluster` and waits for it; `on_tick` is called about ten times a
/// second while it runs (for a progress bar).
pub fn execute(job: Job, cluster: &Cluster, mut on_tick: impl FnMut()) -> Result<Report> {
    let layout = (cluster.process, cluster.workers);
    let errors = job.errors.clone();
    let fate = Fate::default();
    let job = Arc::new(job);
    // Each worker says when it is done, so the job ends the moment the last one does (a
    // sleep-and-check loop here once added 50 ms to every run on average).
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<()>(cluster.workers);
    let (job2, errors2, fate2) = (job.clone(), errors.clone(), fate.clone());
    let done_tx = std::sync::Mutex::new(done_tx);
    fate::install_hook();
    let guards = cluster.execute(move |worker| {
        fate::register_worker(&fate2);
        let result = run_worker(worker, &job2, layout, &errors2);
        if let Err(e) = &result {
            errors2.set("worker", e);
        }
        let _ = done_tx.lock().map(|tx| tx.send(()));
        result
    })?;
    let mut finished = 0;
    let mut failure = None;
    while finished < cluster.workers && failure.is_none() {
        match done_rx.recv_timeout(TICK) {
            Ok(()) => finished += 1,
            Err(RecvTimeoutError::Timeout) => on_tick(),
            // Every worker's sender is gone: they have all returned (or panicked).
            Err(RecvTimeoutError::Disconnected) => break,
        }
        failure = fatal(&fate, cluster);
    }
    if let Some(failure) = failure.or_else(|| fatal(&fate, cluster)) {
        // The other workers would wait for the failed one forever, and joining timely's
        // threads after a failure panics: let them be (a command exits; an embedded
        // caller's loaders get the error).
        errors.set_message(&failure);
        std::mem::forget(guards);
        return Err(Error::Dataflow(failure));
    }
    let mut total = Report::default();
    for r in guards.join() {
        total.add(r.map_err(Error::Dataflow)??);
    }
    if let Some(e) = errors.get() {
        return Err(Error::Dataflow(e));
    }
    Ok(total)
}

/// Where one worker's rank batches go.
enum WorkerSink {
    Batch(Box<dyn BatchSink>),
    Feeds(Vec<Option<LoaderFeed>>),
    Channels(Channels),
    /// The queue each owned rank's batches go to now, with its epoch.
    Epochs {
        open: OpenQueue,
        /// Steps per epoch: a rank's queue is let go after its last.
        steps: u64,
        queues: BTreeMap<usize, (u64, Option<RankQueue>)>,
    },
}

impl WorkerSink {
    fn write(&mut self, rb: RankBatch) -> Result<()> {
        match self {
            WorkerSink::Batch(s) => s.write(&rb),
            // Blocks while the rank's loader is full: this is the backpressure.
            WorkerSink::Feeds(f) => match &f[rb.meta.rank] {
                Some(feed) => feed.send(rb),
                None => Ok(()),
            },
            WorkerSink::Channels(c) => c.send(rb),
            WorkerSink::Epochs {
                open,
                steps,
                queues,
            } => {
                let (epoch, rank, step) = (rb.meta.epoch, rb.meta.rank, rb.meta.step);
                if queues.get(&rank).is_none_or(|(at, _)| *at != epoch) {
                    // The queue of the epoch before, if still held, ends here.
                    queues.insert(rank, (epoch, open(epoch, rank)));
                }
                if let Some((_, queue)) = queues.get_mut(&rank) {
                    let sent = queue.as_ref().is_some_and(|q| q.send(rb));
                    // After the rank's last step its consumer sees the queue end.
                    if !sent || step + 1 >= *steps {
                        *queue = None;
                    }
                }
                Ok(())
            }
        }
    }
}

fn run_worker(
    worker: &mut Worker,
    job: &Job,
    (process, workers): (usize, usize),
    errors: &ErrorSlot,
) -> Result<Report> {
    let t0 = Instant::now();
    // A given state is shared, not cloned: a vocabulary state can be large.
    let fitted = match &job.state {
        Some(_) => None,
        None => Some(fit(worker, job, errors)?),
    };
    let Some(state) = fitted.as_ref().or(job.state.as_ref()) else {
        unreachable!("fitted or given");
    };
    let mut report = Report {
        state_version: Some(state.version),
        fit: if fitted.is_some() {
            t0.elapsed()
        } else {
            Duration::ZERO
        },
        ..Report::default()
    };
    let transformer = match (&job.bound, &job.output) {
        (_, None) => None,
        (Some(t), _) => Some(t.clone()),
        (None, _) => Some(job.bind_fitted(state)?),
    };
    report.state = fitted;
    let (Some(output), Some(transformer)) = (&job.output, transformer) else {
        return Ok(report);
    };
    let delivery = job.delivery.clone();
    let world = delivery.plan.world_size();

    let index = worker.index();
    let out = Rc::new(RefCell::new(Report {
        steps_per_rank: vec![0; world],
        ..Report::default()
    }));
    // Shared with the sink operator, so that the worker can finish it once the stream ends.
    // A failure to open is recorded, not returned: every worker must build the dataflow.
    let schema = delivery_schema(&job.plan.output_schema());
    let sink = match output {
        Output::Sink(spec) => match spec.open(process, index, schema) {
            Ok(s) => Some(WorkerSink::Batch(s)),
            Err(e) => {
                errors.set("sink", e);
                None
            }
        },
        Output::Loaders(feeds) => Some(WorkerSink::Feeds(feeds.clone())),
        Output::Channels(c) => Some(WorkerSink::Channels(c.clone())),
        Output::Epochs(open) => Some(WorkerSink::Epochs {
            open: open.clone(),
            steps: delivery.plan.steps(),
            queues: BTreeMap::new(),
        }),
    };
    let sink = Rc::new(RefCell::new(sink));
    let sink2 = sink.clone();
    let mut input = InputHandle::new();
    let probe = ProbeHandle::new();
    let (out2, errors2, progress, started) = (
        out.clone(),
        errors.clone(),
        job.progress.clone(),
        job.started,
    );
    let output_schema = job.plan.output_schema();
    let version = transformer.state_version();
    let ownership = Ownership {
        world_size: world,
        processes: worker.peers() / workers,
        workers,
    };
    let mine: Vec<usize> = (0..world)
        .filter(|&r| ownership.worker(r) == index && delivery.only.is_none_or(|o| o == r))
        .collect();
    worker.dataflow::<u64, _, _>(|scope| {
        let pieces = scope
            .input_from(&mut input)
            .featurize(transformer, errors.clone())
            .place_rows(
                delivery.clone(),
                job.arena.clone().map(|a| (a, ownership, process)),
                errors.clone(),
            )
            .exchange(move |p: &Piece| ownership.worker(p.rank) as u64);
        own(
            pieces,
            delivery.clone(),
            job.arena.clone(),
            mine,
            output_schema,
            version,
            errors.clone(),
        )
        .unary::<CapacityContainerBuilder<Vec<()>>, _, _, _>(Pipeline, "Sink", move |_, _| {
            move |input, _output| {
                let _running = hydrant_operators::running::enter("sink");
                input.for_each(|_, data| {
                    for rb in data.drain(..) {
                        let mut r = out2.borrow_mut();
                        r.first_batch.get_or_insert_with(|| started.elapsed());
                        let real = (rb.data().num_rows() - rb.meta.padded_rows) as u64;
                        r.rows += real;
                        r.padded_rows += rb.meta.padded_rows as u64;
                        r.batches += 1;
                        r.steps_per_rank[rb.meta.rank] += 1;
                        progress.fetch_add(real, Ordering::Relaxed);
                        metrics::counter!(crate::metrics::ROWS_OUT, "stage" => "sink")
                            .increment(real);
                        if let Some(Err(e)) = sink2.borrow_mut().as_mut().map(|s| s.write(rb)) {
                            errors2.set("sink", e);
                        }
                    }
                })
            }
        })
        .probe_with(&probe);
    });

    read_epochs(
        worker,
        job,
        (ownership, process),
        &mut input,
        &probe,
        errors,
    );
    drop(input);
    while !probe.done() {
        worker.step_or_park(Some(PARK));
    }
    if let Some(WorkerSink::Batch(s)) = sink.borrow_mut().as_mut() {
        s.finish()?;
    }
    // Dropping the feeds (with the sink) ends the loaders' streams.
    sink.borrow_mut().take();
    let r = out.take();
    Ok(Report {
        rows: r.rows,
        padded_rows: r.padded_rows,
        batches: r.batches,
        steps_per_rank: r.steps_per_rank,
        first_batch: r.first_batch,
        ..report
    })
}

/// Reads this worker's part of each epoch: the reads ([`EpochPlan::reads`]) of the ranks
/// this process owns (or of the one rank caught up), dealt in turn to the process's
/// workers. A worker merges its reads by time, so its batches' times never go back, and
/// stays within a bounded distance of the slowest owner.
///
/// [`EpochPlan::reads`]: crate::delivery::EpochPlan::reads
fn read_epochs(
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
        let mut mine = deal(reads, ranks.clone(), local, workers)
            .into_iter()
            .peekable();
        let mut open: Vec<Reading> = Vec::new();
        loop {
            // The read whose next row is earliest: one not opened yet if it starts first.
            let earliest = (0..open.len()).min_by_key(|&k| (open[k].time, open[k].pos));
            let opens = match (mine.peek(), earliest) {
                (Some(r), Some(k)) => (r.time, r.pos) < (open[k].time, open[k].pos),
                (next, _) => next.is_some(),
            };
            if opens {
                let Some(read) = mine.next() else { break };
                let _running = hydrant_operators::running::enter("source");
                match job.inputs.read(&units[read.unit]) {
                    Ok(batches) => open.push(Reading::new(read, units[read.unit].rows, batches)),
                    Err(e) => return errors.set("source", e),
                }
                continue;
            }
            let Some(k) = earliest else { break };
            let next = {
                let _running = hydrant_operators::running::enter("source");
                open[k].next(&d.plan)
            };
            let (mut first, mut b) = match next {
                Ok(Some(next)) => next,
                Ok(None) => {
                    open.swap_remove(k);
                    continue;
                }
                Err(e) => return errors.set("source", e),
            };
            // Stamped with the time of the batch's first row before any is left out, the
            // one the merge went by: a worker's times never go back.
            let time = d.time(epoch, first);
            if let Some(rank) = d.only {
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
/// keeps more of them). The tail goes to worker 0.
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

/// One read being read: its unit's batches, cut to the read's rows.
struct Reading {
    batches: Box<dyn Iterator<Item = Result<Batch>> + Send>,
    /// Rows of the unit still to skip, and still to take.
    skip: u64,
    left: u64,
    /// Whether the read runs to the unit's end: the unit's batches are then read to their
    /// end, so that a whole unit is cached.
    to_end: bool,
    /// Position and time of the next row.
    pos: u64,
    time: u64,
    unit: usize,
}

impl Reading {
    fn new(
        read: Read,
        unit_rows: u64,
        batches: Box<dyn Iterator<Item = Result<Batch>> + Send>,
    ) -> Self {
        Reading {
            batches,
            skip: read.skip,
            left: read.rows,
            to_end: read.skip + read.rows == unit_rows,
            pos: read.pos,
            time: read.time,
            unit: read.unit,
        }
    }

    /// The next batch of the read's rows, with its first position; `None` at the end.
    fn next(&mut self, plan: &EpochPlan) -> Result<Option<(u64, Batch)>> {
        while self.left > 0 {
            let Some(batch) = self.batches.next() else {
                return Err(Error::Dataflow(format!(
                    "unit {} ended {} rows short of what the plan was made for",
                    self.unit, self.left
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
            let first = self.pos;
            (self.skip, self.left, self.pos) = (0, self.left - take, self.pos + take);
            self.time = plan.placement().time_of(self.pos, plan.rows());
            return Ok(Some((first, b)));
        }
        if std::mem::take(&mut self.to_end)
            && let Some(extra) = self.batches.next()
            && extra?.data.num_rows() > 0
        {
            return Err(Error::Dataflow(format!(
                "unit {} has more rows than the plan was made for",
                self.unit
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

/// Fits the plan: every worker reads its share; each statistic's partials go to one worker,
/// which merges them in worker order and finishes them; every worker gets every finished
/// parameter, so all of them hold the same state.
fn fit(worker: &mut Worker, job: &Job, errors: &ErrorSlot) -> Result<FittedState> {
    let plan = &job.plan;
    let (index, peers) = (worker.index(), worker.peers());
    let mut params = BTreeMap::new();
    for pass in 0..plan.fit_passes() {
        let state = FittedState::new(plan.pipeline(), params.clone());
        let mut fitter = plan.fitter(pass, &state)?;
        // A failure is held until after the exchange below: every worker must take part in
        // it, or the others would wait for this worker's statistics forever.
        let mut failed = None;
        let columns = fitter.columns();
        let running = hydrant_operators::running::enter("fit");
        let units = job.inputs.units().iter().enumerate();
        'units: for (u, unit) in units.skip(index).step_by(peers) {
            let batches = match job.inputs.read_columns(unit, Some(&columns)) {
                Ok(b) => b,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            for batch in batches {
                if let Err(e) = batch.and_then(|b| fitter.update(&b.data).map_err(Error::from)) {
                    failed = Some(e);
                    break 'units;
                }
                if errors.get().is_some() {
                    break 'units;
                }
            }
            fitter.end_unit(u as u64);
        }
        drop(running);
        // Take part in the exchanges even after a failure, so the other workers finish.
        // Each statistic is merged and finished by one worker, which then tells every
        // worker the parameters: the merging is shared, and a finished vocabulary is a
        // shared buffer, where every worker merging every partial copied them all.
        let sends = match (&failed, fitter.into_partial()) {
            (None, Ok(mine)) => mine.split(peers).into_iter().map(Ok).collect(),
            (Some(e), _) => vec![Err(e.to_string()); peers],
            (None, Err(e)) => vec![Err(e.to_string()); peers],
        };
        let finished = all_to_all(worker, sends)
            .into_iter()
            .try_fold(FitPartial::default(), |mut merged, part| {
                merged.merge(part?);
                Ok::<_, String>(merged)
            })
            .map(|merged| {
                let mut mine = BTreeMap::new();
                merged.finish(&mut mine);
                mine
            });
        let every = all_to_all(worker, vec![finished; peers]);
        if let Some(e) = failed {
            return Err(e);
        }
        for finished in every {
            // Every worker sees every failure, so all of them stop here together.
            params.extend(finished.map_err(Error::Dataflow)?);
        }
    }
    Ok(FittedState::new(plan.pipeline(), params))
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
