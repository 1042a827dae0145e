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
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hydrant_operators::{ErrorSlot, FeaturePlan, FitPartial, FittedState, Transformer};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::Input;
use timely::dataflow::operators::{Exchange, Operator, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};
use timely::worker::Worker;

use super::cluster::Cluster;
use super::fate::{self, Fate};
use super::gather::all_to_all;
use super::heartbeat::Signals;
use super::read;
use crate::delivery::{
    Arena, Delivery, Ownership, Owning, Piece, PlaceRows, RankBatch, delivery_schema, own,
};
use crate::error::{Error, Result};
use crate::loader::LoaderFeed;
use crate::sink::{BatchSink, SinkSpec};
use crate::source::Inputs;

/// Longest a waiting worker sleeps between looks (it wakes early when data arrives), so a
/// worker held up by a full loader does not spin.
pub(super) const PARK: Duration = Duration::from_millis(1);

/// Longest a worker waiting on the others' progress parks, its park doubling from [`PARK`]
/// while it waits: their messages wake it at once, so this bounds only how late it sees
/// what no message brings (a failure elsewhere). A reader held back by a rank no trainer
/// read woke a thousand times a second at [`PARK`] (2.5% of a core, for as long as a
/// server waited for its trainers).
const PARK_MAX: Duration = Duration::from_millis(100);

/// Steps `worker` while `waiting()`, parking between steps from [`PARK`] up to
/// [`PARK_MAX`]; a failure elsewhere ends the wait (see [`fate`]).
pub(super) fn wait_on_progress(worker: &mut Worker, mut waiting: impl FnMut() -> bool) {
    let mut park = PARK;
    while waiting() {
        worker.step_or_park(Some(park));
        park = (park * 2).min(PARK_MAX);
        fate::abandon_if_failed();
    }
}

/// How often `execute` calls its `on_tick` while the job runs.
const TICK: Duration = Duration::from_millis(100);

/// A failure the job cannot finish after: a worker panicked, or (while `waiting` for
/// workers of this process) a peer process is lost.
fn fatal(fate: &Fate, cluster: &Cluster, waiting: bool) -> Option<String> {
    if let Some(f) = fate.failure() {
        return Some(f.to_string());
    }
    let (peer, seen) = fate::lost_peer().filter(|_| waiting && cluster.processes > 1)?;
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
    pub(super) fn send(&self, rb: RankBatch) -> Result<()> {
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
    /// What the processes of a cluster may signal each other while the job runs.
    pub signals: Option<Signals>,
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
            signals: None,
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
pub fn execute(job: Job, cluster: &Cluster, on_tick: impl FnMut()) -> Result<Report> {
    if cluster.processes > 1 {
        super::agree::same_job(&job, cluster)?;
    }
    let layout = (cluster.process, cluster.workers);
    let errors = job.errors.clone();
    let job = Arc::new(job);
    let (errors2, signals) = (errors.clone(), job.signals.clone());
    let reports = supervise(cluster, &errors, signals.as_ref(), on_tick, move |worker| {
        run_worker(worker, &job, layout, &errors2)
    })?;
    let mut total = Report::default();
    for r in reports {
        total.add(r);
    }
    if let Some(e) = errors.get() {
        return Err(Error::Dataflow(e));
    }
    Ok(total)
}

/// Runs `work` on every worker of this process and waits for them; `on_tick` is called
/// about ten times a second meanwhile. A worker's error goes to `errors`; a worker's
/// panic (in `errors` as it happens: [`Fate`]) or a lost peer process ends the wait with
/// one line, without joining the others. A peer lost once every worker here is done
/// (it finished, or stopped, first) does not fail this process's part.
pub(super) fn supervise<T: Send + 'static>(
    cluster: &Cluster,
    errors: &ErrorSlot,
    signals: Option<&Signals>,
    mut on_tick: impl FnMut(),
    work: impl Fn(&mut Worker) -> Result<T> + Send + Sync + 'static,
) -> Result<Vec<T>> {
    // Each worker hands over its result when it is done, so the job ends the moment the
    // last one does (a sleep-and-check loop here once added 50 ms to every run on
    // average), and the results do not depend on joining timely's threads.
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<Result<T>>(cluster.workers);
    let fate = Fate::new(errors.clone());
    let (errors2, fate2) = (errors.clone(), fate.clone());
    let done_tx = std::sync::Mutex::new(done_tx);
    fate::install_hook();
    let guards = cluster.execute(signals, move |worker| {
        fate::register_worker(&fate2);
        let result = work(worker);
        if let Err(e) = &result {
            // As from where it came: an unreadable input is the input's, not the server's.
            e.record_in(&errors2, e.origin());
        }
        let _ = done_tx.lock().map(|tx| tx.send(result));
    })?;
    let mut results = Vec::new();
    let mut failure = None;
    while results.len() < cluster.workers && failure.is_none() {
        match done_rx.recv_timeout(TICK) {
            Ok(result) => results.push(result),
            Err(RecvTimeoutError::Timeout) => on_tick(),
            // Every worker's sender is gone: they have all returned (or panicked).
            Err(RecvTimeoutError::Disconnected) => break,
        }
        failure = fatal(&fate, cluster, results.len() < cluster.workers);
    }
    let done = results.len() == cluster.workers;
    if let Some(failure) = failure.or_else(|| fatal(&fate, cluster, !done)) {
        // The other workers would wait for the failed one forever, and joining timely's
        // threads after a failure panics: let them be (a command exits; an embedded
        // caller's loaders get the error).
        // A worker's panic is in the slot already (`Fate::fail`): what is left is a lost peer.
        errors.set_from(crate::error::origin::CLUSTER, &failure);
        guards.abandon();
        return Err(Error::Dataflow(failure));
    }
    // Joins the network threads too, so that what this process sent has left it. Their
    // failure is not this job's (a peer that finished first closed its connections).
    let _ = guards.join();
    results.into_iter().collect()
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
            .place_rows(
                transformer,
                delivery.clone(),
                job.arena.clone().map(|a| (a, ownership, process)),
                errors.clone(),
            )
            .exchange(move |p: &Piece| ownership.worker(p.rank) as u64);
        own(
            pieces,
            Owning::Epochs(delivery.clone()),
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

    read::read_epochs(
        worker,
        job,
        (ownership, process),
        &mut input,
        &probe,
        errors,
    );
    drop(input);
    wait_on_progress(worker, || !probe.done());
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
    let state = FittedState::new(plan.pipeline(), params).with_chains(plan.fitted_chains());
    // Values whose sums or spread overflow f64 (±1e308) fit infinite statistics, which
    // would scale every value to infinity and which no state file can hold (JSON has no
    // infinity: it was written as `null`, and then refused when read).
    state.check().map_err(|e| {
        Error::Dataflow(format!(
            "fit: {e}: the column's values are too large to fit (clip or rescale them)"
        ))
    })?;
    Ok(state)
}
