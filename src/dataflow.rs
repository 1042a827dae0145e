//! The timely dataflow: each worker reads its share of the input units, fitting (when no
//! state is given) and then featurizing, and hands batches to its sink.
//!
//! ```text
//! input (this worker's units) ─► featurize ─► exchange by batch seq ─► sink
//! ```
//!
//! The exchange spreads sink work evenly over all workers whatever the row-group layout;
//! between processes the batches travel as Arrow IPC inside timely's containers. Each
//! worker keeps at most [`IN_FLIGHT`] batches unfinished, so memory is bounded by the
//! batch size and worker count, not by the input.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hydrant_operators::{Batch, ErrorSlot, FeaturePlan, Featurize, FitPartial, FittedState};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::vec::{Broadcast, Input};
use timely::dataflow::operators::{Exchange, Inspect, Operator, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};
use timely::worker::Worker;

use crate::error::{Error, Result};
use crate::sink::SinkSpec;
use crate::source::Inputs;

/// Batches a worker may have sent but not yet seen through the sink.
pub const IN_FLIGHT: u64 = 4;

/// Where the dataflow runs: threads in this process, and optionally several processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// Worker threads per process.
    pub workers: usize,
    /// Processes in the computation.
    pub processes: usize,
    /// This process's index.
    pub process: usize,
    /// `host:port` per line, one per process (default: localhost from port 2101).
    pub hostfile: Option<PathBuf>,
}

impl Cluster {
    /// One process with `workers` threads.
    pub fn local(workers: usize) -> Self {
        Cluster {
            workers,
            processes: 1,
            process: 0,
            hostfile: None,
        }
    }

    fn config(&self) -> Result<timely::Config> {
        if self.workers == 0 || self.processes == 0 || self.process >= self.processes {
            return Err(Error::Usage(format!(
                "need --workers >= 1 and --process < --processes (got {}, {}, {})",
                self.workers, self.process, self.processes
            )));
        }
        let mut args = vec!["hydrant".to_string(), "-w".into(), self.workers.to_string()];
        if self.processes > 1 {
            args.extend([
                "-n".into(),
                self.processes.to_string(),
                "-p".into(),
                self.process.to_string(),
            ]);
            if let Some(h) = &self.hostfile {
                let text = std::fs::read_to_string(h)
                    .map_err(|e| Error::Usage(format!("hostfile {}: {e}", h.display())))?;
                if text.lines().filter(|l| !l.trim().is_empty()).count() < self.processes {
                    return Err(Error::Usage(format!(
                        "hostfile {} lists fewer than {} hosts",
                        h.display(),
                        self.processes
                    )));
                }
                args.extend(["-h".into(), h.display().to_string()]);
            }
        }
        timely::Config::from_args(args.into_iter()).map_err(Error::Dataflow)
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
    /// Where featurized batches go; `None` only fits.
    pub sink: Option<SinkSpec>,
    /// When the command started, for time-to-first-batch.
    pub started: Instant,
    /// Rows featurized so far in this process (for progress reporting).
    pub progress: Arc<AtomicU64>,
}

/// What the workers of this process did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The state used (fitted here or given).
    pub state: Option<FittedState>,
    /// Time spent fitting.
    pub fit: Duration,
    /// Rows delivered to this process's sinks.
    pub rows: u64,
    /// Batches delivered to this process's sinks.
    pub batches: u64,
    /// When the first featurized batch reached a sink, from the start.
    pub first_batch: Option<Duration>,
}

/// Runs the job on `cluster` and waits for it; `on_tick` is called about ten times a
/// second while it runs (for a progress bar).
pub fn execute(job: Job, cluster: &Cluster, mut on_tick: impl FnMut()) -> Result<Report> {
    let config = cluster.config()?;
    let process = cluster.process;
    let job = Arc::new(job);
    let errors = ErrorSlot::default();
    let done = Arc::new(AtomicU64::new(0));
    let (job2, errors2, done2) = (job.clone(), errors.clone(), done.clone());
    let guards = timely::execute(config, move |worker| {
        let result = run_worker(worker, &job2, process, &errors2);
        if let Err(e) = &result {
            errors2.set("worker", e);
        }
        done2.fetch_add(1, Ordering::SeqCst);
        result
    })
    .map_err(Error::Dataflow)?;
    while done.load(Ordering::SeqCst) < cluster.workers as u64 {
        on_tick();
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut total = Report::default();
    for r in guards.join() {
        let r = r.map_err(Error::Dataflow)??;
        total.rows += r.rows;
        total.batches += r.batches;
        total.fit = total.fit.max(r.fit);
        total.first_batch = match (total.first_batch, r.first_batch) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        total.state = total.state.or(r.state);
    }
    if let Some(e) = errors.get() {
        return Err(Error::Dataflow(e));
    }
    Ok(total)
}

fn run_worker(
    worker: &mut Worker,
    job: &Job,
    process: usize,
    errors: &ErrorSlot,
) -> Result<Report> {
    let t0 = Instant::now();
    let state = match &job.state {
        Some(s) => s.clone(),
        None => fit(worker, job, errors)?,
    };
    let fit_time = if job.state.is_some() {
        Duration::ZERO
    } else {
        t0.elapsed()
    };
    let mut report = Report {
        state: Some(state.clone()),
        fit: fit_time,
        ..Report::default()
    };
    let Some(sink) = &job.sink else {
        return Ok(report);
    };
    let transformer = job.plan.transformer(&state)?;

    let (index, peers) = (worker.index(), worker.peers());
    let out = Rc::new(RefCell::new(Report::default()));
    // Shared with the sink operator, so that the worker can finish it once the stream ends.
    // A failure to open is recorded, not returned: every worker must build the dataflow.
    let sink = match sink.open(process, index, job.plan.output_schema()) {
        Ok(s) => Some(s),
        Err(e) => {
            errors.set("sink", e);
            None
        }
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
    worker.dataflow::<u64, _, _>(|scope| {
        scope
            .input_from(&mut input)
            .featurize(transformer, errors.clone())
            .exchange(|b: &Batch| b.seq)
            .unary::<CapacityContainerBuilder<Vec<()>>, _, _, _>(Pipeline, "Sink", move |_, _| {
                move |input, _output| {
                    input.for_each(|_, data| {
                        for b in data.drain(..) {
                            let mut r = out2.borrow_mut();
                            r.first_batch.get_or_insert_with(|| started.elapsed());
                            r.rows += b.data.num_rows() as u64;
                            r.batches += 1;
                            progress.fetch_add(b.data.num_rows() as u64, Ordering::Relaxed);
                            if let Some(Err(e)) =
                                sink2.borrow_mut().as_mut().map(|s| s.write(&b.data))
                            {
                                errors2.set("sink", e);
                            }
                        }
                    })
                }
            })
            .probe_with(&probe);
    });

    let mut time = 0u64;
    'units: for unit in job.inputs.units().iter().skip(index).step_by(peers) {
        let batches = match job.inputs.read(unit) {
            Ok(b) => b,
            Err(e) => {
                errors.set("source", e);
                break;
            }
        };
        for batch in batches {
            match batch {
                Ok(b) => input.send(b),
                Err(e) => {
                    errors.set("source", e);
                    break 'units;
                }
            }
            time += 1;
            input.advance_to(time);
            while probe.less_than(&time.saturating_sub(IN_FLIGHT)) {
                worker.step();
            }
            if errors.get().is_some() {
                break 'units;
            }
        }
    }
    drop(input);
    while !probe.done() {
        worker.step();
    }
    if let Some(s) = sink.borrow_mut().as_mut() {
        s.finish()?;
    }
    let r = out.borrow();
    report.rows = r.rows;
    report.batches = r.batches;
    report.first_batch = r.first_batch;
    Ok(report)
}

/// Fits the plan: every worker reads its share, then all partial statistics are broadcast
/// so that every worker merges the same partials in the same order into the same state.
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
        'units: for unit in job.inputs.units().iter().skip(index).step_by(peers) {
            let batches = match job.inputs.read(unit) {
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
        }
        // Take part in the exchange even after a failure, so the other workers finish.
        let gathered = Rc::new(RefCell::new(
            Vec::<(usize, Result<FitPartial, String>)>::new(),
        ));
        let mut input = InputHandle::new();
        let probe = ProbeHandle::new();
        let g = gathered.clone();
        worker.dataflow::<u64, _, _>(|scope| {
            scope
                .input_from(&mut input)
                .broadcast()
                .inspect(move |p: &(usize, Result<FitPartial, String>)| {
                    g.borrow_mut().push(p.clone())
                })
                .probe_with(&probe);
        });
        let mine = match &failed {
            None => fitter.into_partial().map_err(|e| e.to_string()),
            Some(e) => Err(e.to_string()),
        };
        input.send((index, mine));
        input.advance_to(1);
        drop(input);
        while !probe.done() {
            worker.step();
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let mut parts = gathered.take();
        parts.sort_by_key(|(i, _)| *i);
        let mut merged = FitPartial::default();
        for (_, p) in parts {
            // Every worker sees every failure, so all of them stop here together.
            merged.merge(p.map_err(Error::Dataflow)?);
        }
        merged.finish(&mut params);
    }
    Ok(FittedState::new(plan.pipeline(), params))
}
