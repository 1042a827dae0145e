//! A pipeline served over Flight ([`hydrant_flight::Served`]): each epoch is delivered by
//! *runs*, dataflows whose ranks are read by DoGet streams (`run.rs`, `stream.rs`).
//!
//! - The first DoGet of an epoch starts its *shared* run at that ticket's `start_step`;
//!   the other ranks join it. Each rank keeps the last [`REPLAY_BYTES`] of batches it
//!   sent, so a trainer that reconnects with `start_step = last finished + 1` continues
//!   exactly where it stopped.
//! - A rank that asks for a step the shared run no longer holds catches up on a run of its
//!   own (it reads only the units its remaining steps need); the shared run drains that
//!   rank meanwhile so that the other ranks do not wait on it. A rank has at most one such
//!   run, and goes back to the shared run when a reconnect finds its step there.
//! - At most one stream reads an (epoch, rank): a new DoGet supersedes the stream before
//!   it, which ends with ABORTED, never with a clean end.
//! - A run is forgotten once every rank took its last batch, or once no one has read it
//!   for [`IDLE_TIMEOUT`] ([`ServedPipeline::sweep`], which the server calls every few
//!   seconds); at most [`max_runs`] live at once.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use hydrant_flight::{RankStream, ServeError, Served};
use hydrant_operators::{FeaturePlan, FittedState, Transformer};

use crate::delivery::{Delivery, delivery_schema};
use crate::runtime::{Channels, Delivering, PushedRows};
use crate::source::Inputs;
use crate::spec::PipelineSpec;

mod cluster;
mod follow;
mod fresh;
mod push;
mod refresh;
mod run;
mod runs;
use runs::{forget, redaction};
mod spark_log;
mod spool;
mod stream;

use follow::FollowCounts;
pub use follow::MANIFEST_FILE;
pub use push::PushFeaturizer;
use push::{Ingest, Pushed};
use run::{Run, lock};
use spool::Spool;
pub use spool::{COMMIT_FILE, SEGMENT_BYTES};
use stream::{ABSENT_AFTER, Consumer, LetGo, Runs};

/// Rows per batch read from a followed folder's files, at most.
const FOLLOW_READ_ROWS: usize = 16_384;

/// Bytes of sent batches each rank keeps for a reconnecting trainer: more than a stream
/// can have in flight (the HTTP/2 stream window and the encoder's queue).
pub const REPLAY_BYTES: usize = 24 << 20;

/// A run no stream has read for this long is forgotten (default of
/// [`ServedPipeline::with_idle_timeout`]).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Pooled read buffers (`source`'s) that no read took for this long are freed by the
/// sweep: in a busy server they are taken again within milliseconds.
const READ_BUFFER_IDLE: Duration = Duration::from_secs(1);

/// Runs kept at once for `world` ranks: two epochs' shared runs and a catch-up run per
/// rank in each.
pub fn max_runs(world: usize) -> usize {
    2 * (world + 1)
}

/// A pipeline ready to serve: inputs opened, state fitted or given.
pub struct ServedPipeline {
    name: String,
    /// The input files; `None` for pushed input.
    inputs: Option<Arc<Inputs>>,
    /// Pushed input's state; `None` for files.
    ingest: Option<Arc<Pushed>>,
    /// Bytes of sent batches each rank keeps for reconnects.
    replay_bytes: usize,
    /// How long a run no one reads is kept.
    idle_timeout: Duration,
    /// How long a trainer's stream waits before the ranks no one reads are let go.
    absent_after: Duration,
    plan: Arc<FeaturePlan>,
    state: FittedState,
    /// The state bound to the plan (file input; pushed input binds per schema).
    bound: Option<Transformer>,
    delivery: Delivery,
    workers: usize,
    schema: SchemaRef,
    /// The runs alive, of every epoch.
    runs: Arc<Runs>,
    /// How errors name the input files (not by the server's paths).
    redact: run::Redact,
    /// Epochs that have had a shared run: later runs of them serve one rank each.
    shared_epochs: Arc<Mutex<std::collections::BTreeSet<u64>>>,
    /// The ranks served here: all of them, or a cluster process's own.
    local: std::ops::Range<usize>,
    /// When this process is one of a serving cluster's.
    cluster: Option<cluster::Serving>,
    /// Rows the file runs have featurized, all runs together (a catch-up run adds only
    /// its rank's rows).
    featurized: Arc<std::sync::atomic::AtomicU64>,
    /// Rows per batch read from a followed folder's files.
    read_rows: usize,
    /// What `status` reports of a followed folder.
    follow: Option<Arc<FollowCounts>>,
    /// The job's fingerprint ([`Served::job`]), made at the first DoGet: what it is made
    /// of is fixed by then.
    job: std::sync::OnceLock<u64>,
}

impl ServedPipeline {
    /// Keeps `bytes` of sent batches per rank (default [`REPLAY_BYTES`]) for trainers that
    /// reconnect; an older step is served by a new run.
    pub fn with_replay_bytes(mut self, bytes: usize) -> Self {
        self.replay_bytes = bytes;
        if let Some(ingest) = &self.ingest {
            // Nothing was pushed yet: the run of pushed input starts over with the new size.
            let first = ingest.counts.steps_cut.get();
            self.new_pushed_run(ingest, first);
        }
        self
    }

    /// Makes the one run of pushed input anew, from step `first`.
    fn new_pushed_run(&self, ingest: &Pushed, first: u64) {
        let (senders, run) = Run::new(
            0,
            first,
            None,
            0..self.world(),
            None,
            self.replay_bytes,
            Arc::from([]),
        );
        let to = Delivering {
            output: self.plan.output_schema(),
            state_version: self.state.version,
            channels: Channels {
                senders,
                stop: run.stop.clone(),
            },
            errors: run.errors.clone(),
            workers: self.workers,
        };
        let placement = *self.delivery.plan.placement();
        let steps_cut = ingest.counts.steps_cut.clone();
        let mut st = ingest.lock();
        // `PushedRows` places rows by the placement's stream form.
        st.rows_out = Some(PushedRows::new(placement, first, steps_cut, to));
        st.input_failed = run.input_failed.clone();
        drop(st);
        *lock(&self.runs) = vec![run];
    }

    /// Makes pushed input durable: each accepted batch is spooled to `dir` (in segments
    /// of `segment_bytes`) and synced before it is acknowledged, and what an earlier
    /// server spooled there is admitted again first, in the same order, from its last
    /// commit's step on (on a thread of its own; pushes wait until it is over). Files are
    /// replayable already: for them this does nothing.
    pub fn with_state_dir(self, dir: &std::path::Path, segment_bytes: u64) -> crate::Result<Self> {
        if let Some(ingest) = &self.ingest {
            let stream = spool::Stream {
                source: spool::Source::Pushed,
                ..self.stream(ingest)
            };
            let claim = spool::claim(dir, self.delivery.plan.placement(), stream)?;
            let opened = Spool::open(dir, segment_bytes)?;
            if let Some(commit) = &opened.commit {
                self.resume(ingest, commit, dir)?;
            }
            let deliver_from = opened.commit.as_ref().map_or(0, |c| c.row);
            ingest.keep_versions(dir, deliver_from, opened.replay.first_row())?;
            ingest.hold(claim);
            ingest.replay(opened.spool, opened.replay, self.runs.clone());
        }
        Ok(self)
    }

    /// The stream a state directory records for `ingest` (its source set by the caller).
    fn stream(&self, ingest: &Pushed) -> spool::Stream<'_> {
        let refreshed = ingest.lock().refresh.is_some();
        spool::Stream {
            pipeline: &self.name,
            source: spool::Source::Pushed,
            features: self.plan.features_hash(),
            state_version: (!refreshed).then_some(self.state.version),
        }
    }

    /// Starts pushed (or followed) input at `commit`, read from `state_dir`.
    fn resume(
        &self,
        ingest: &Pushed,
        commit: &spool::Commit,
        state_dir: &std::path::Path,
    ) -> crate::Result<()> {
        ingest.resume(commit).map_err(|e| crate::Error::State {
            path: state_dir.join(COMMIT_FILE),
            reason: e.to_string(),
        })?;
        self.new_pushed_run(ingest, commit.step);
        Ok(())
    }

    /// Takes the rows of the Parquet and Arrow IPC files that appear in `dir` instead of
    /// pushes: one endless epoch, files admitted in name order as they appear (names
    /// starting with `_` or `.` are not data). With `state_dir`, each admission is
    /// recorded there before its rows go anywhere, and a restarted server admits the
    /// recorded files again, in the same order, from the last commit on.
    pub fn follow(
        mut self,
        dir: &std::path::Path,
        state_dir: Option<&std::path::Path>,
    ) -> crate::Result<Self> {
        let Some(ingest) = self.ingest.clone() else {
            return Err(crate::Error::Usage(format!(
                "pipeline `{}` reads files given at start; it cannot follow a folder",
                self.name
            )));
        };
        follow::check_folder(dir)?;
        ingest.follow_only();
        let (mut manifest, mut recorded, mut ended) = (None, Vec::new(), None);
        let (mut replay_from, mut deliver_from) = (0, 0);
        if let Some(sd) = state_dir {
            let stream = spool::Stream {
                source: spool::Source::Followed,
                ..self.stream(&ingest)
            };
            ingest.hold(spool::claim(sd, self.delivery.plan.placement(), stream)?);
            let (m, rec) = follow::Manifest::open(sd)?;
            ended = rec.ended;
            if let Some(rows) = ended {
                // Said, since nothing else would show it: a restart after SIGTERM (or
                // `end_ingest`) replays the stream it ended and follows no new file.
                hydrant_operators::log_line!(
                    "hydrant: {}: the followed input recorded here was ended after {rows} \
                     rows; they are replayed as they were and no new file is admitted (a \
                     new --state-dir starts a new stream)",
                    sd.display()
                );
            }
            recorded = rec.into_replay();
            let m = Arc::new(Mutex::new(m));
            let writer = m.clone();
            ingest.lock().end_record = Some(Box::new(move |rows| lock(&writer).record_end(rows)));
            manifest = Some(m);
            if let Some(commit) = spool::read_commit(sd)? {
                self.resume(&ingest, &commit, sd)?;
                replay_from = commit.keep_from();
                deliver_from = commit.row;
            }
            ingest.commit_to(spool::Committer::standalone(sd));
        }
        // Files wholly before the commit's row are not read again.
        let seen = recorded.iter().map(|a| a.file.clone()).collect();
        let first = recorded
            .iter()
            .position(|a| a.rows.is_none_or(|r| a.row + r > replay_from))
            .unwrap_or(recorded.len());
        let next_row = match recorded.get(first) {
            Some(a) => a.row,
            None => recorded.last().map_or(0, |a| a.row + a.rows.unwrap_or(0)),
        };
        ingest.set_next_row(next_row);
        if let Some(sd) = state_dir {
            ingest.keep_versions(sd, deliver_from, next_row)?;
        }
        let counts = Arc::new(FollowCounts::default());
        // Files admitted before (and not read again) count as admitted, and those of
        // them skipped as skipped.
        counts.files.store(first as u64, Ordering::Relaxed);
        counts.skipped_before(&recorded[..first]);
        self.follow = Some(counts.clone());
        let follower = follow::Follower {
            pushed: Arc::downgrade(&ingest),
            manifest,
            counts,
            spark: None,
            read: follow::Reader {
                dir: dir.to_path_buf(),
                batch_rows: self.read_rows,
                plan: self.plan.clone(),
                spec: ingest.lock().featurizer.spec().clone(),
            },
            end_after_replay: ended.map(|_| Arc::downgrade(&self.runs)),
            settle: follow::Settle::default(),
            odd_names: Default::default(),
            pending_end: None,
            relist: Vec::new(),
        };
        let replay = recorded.split_off(first);
        std::thread::Builder::new()
            .name("hydrant-follow".into())
            .spawn(move || follower.run(seen, replay))
            .map_err(|e| crate::Error::Usage(format!("cannot follow {}: {e}", dir.display())))?;
        Ok(self)
    }

    /// Forgets a run once no stream has read it for `timeout` (default [`IDLE_TIMEOUT`]).
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Lets the ranks of a file run that no stream reads go once a trainer's stream has
    /// waited `after` for its next batch (default 3 s), so that one rank
    /// read alone does not wait forever on the others' full queues; such a rank, read
    /// later, catches up on a run of its own.
    pub fn with_absent_after(mut self, after: Duration) -> Self {
        self.absent_after = after;
        self
    }

    /// Marks the pipeline as shutting down, before its streams are closed: its followed
    /// folder then stops without a word when its rows can no longer be delivered.
    pub fn shutting_down(&self) {
        if let Some(ingest) = &self.ingest {
            ingest.counts.closing.store(true, Ordering::SeqCst);
        }
    }

    /// Forgets the runs no stream has read for the idle timeout, and returns how many:
    /// a trainer that went away mid-epoch leaves its run's batches and threads behind
    /// until then. (Pushed input's one run is never forgotten.)
    pub fn sweep(&self) -> usize {
        crate::source::release_idle_read_buffers(READ_BUFFER_IDLE);
        if self.ingest.is_some() {
            return 0;
        }
        let mut runs = lock(&self.runs);
        let before = runs.len();
        forget(&mut runs, |r| r.idle_for(self.idle_timeout));
        before - runs.len()
    }

    /// How often [`ServedPipeline::sweep`] should run: often enough that an idle run
    /// outlives its timeout by a fraction of it.
    pub fn sweep_every(&self) -> Duration {
        (self.idle_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(30))
    }

    /// A pipeline over `inputs` with `state` (already fitted), delivered as `delivery`
    /// says, each run on `workers` threads.
    pub fn new(
        name: &str,
        inputs: Arc<Inputs>,
        plan: Arc<FeaturePlan>,
        state: FittedState,
        delivery: Delivery,
        workers: usize,
    ) -> crate::Result<Self> {
        let bound = plan.transformer(&state)?;
        let redact = redaction(&inputs);
        Ok(ServedPipeline {
            redact,
            shared_epochs: Arc::default(),
            local: 0..delivery.plan.world_size(),
            cluster: None,
            featurized: Default::default(),
            read_rows: 0,
            follow: None,
            job: std::sync::OnceLock::new(),
            name: name.to_string(),
            schema: delivery_schema(&plan.output_schema()),
            inputs: Some(inputs),
            ingest: None,
            replay_bytes: REPLAY_BYTES,
            idle_timeout: IDLE_TIMEOUT,
            absent_after: ABSENT_AFTER,
            plan,
            state,
            bound: Some(bound),
            delivery,
            workers,
            runs: Arc::default(),
        })
    }

    /// A pipeline whose rows are pushed by producers (DoPut) until `end_ingest`: one
    /// epoch, fed as batches arrive, placed and assembled on `workers` threads (each DoPut
    /// featurizes its own batches). `delivery`'s row counts are ignored. The state is
    /// `state`; a pipeline whose `[stats]` refresh may start without one (its first
    /// version is fitted on the first rows).
    pub fn ingest(
        spec: PipelineSpec,
        state: Option<FittedState>,
        delivery: Delivery,
        workers: usize,
    ) -> crate::Result<Self> {
        let plan = Arc::new(spec.plan(&spec.nominal_schema())?);
        // Checked now, as a file pipeline's state is bound at start: otherwise every pushed
        // batch and followed file would be refused one by one, and the stream go on empty.
        if let Some(state) = &state {
            plan.check_fitted_for(state)?;
        }
        // Pushed rows have no known total: positions are output indices (no rank shares).
        let placement = delivery.plan.placement().stream();
        let refresh = match spec.stats.refreshes() {
            true => Some(refresh::Refresh::new(
                &spec,
                plan.clone(),
                state.clone(),
                &placement,
            )?),
            false => None,
        };
        let state = match state {
            Some(state) => state,
            None if refresh.is_some() => FittedState::empty(&spec.name),
            None => {
                return Err(crate::Error::Usage(format!(
                    "pipeline `{}` has no state: give one, or refresh its statistics \
                     ([stats] mode = \"refresh\")",
                    spec.name
                )));
            }
        };
        let bound = plan.transformer(&state).ok();
        let event_time = spec.event_time.clone();
        let world = delivery.plan.world_size();
        let served = ServedPipeline {
            // Smaller than a file pipeline's reads: a new file's first rows go out sooner.
            read_rows: spec.batch_rows.min(FOLLOW_READ_ROWS),
            follow: None,
            job: std::sync::OnceLock::new(),
            name: spec.name.clone(),
            schema: delivery_schema(&plan.output_schema()),
            inputs: None,
            replay_bytes: REPLAY_BYTES,
            idle_timeout: IDLE_TIMEOUT,
            absent_after: ABSENT_AFTER,
            ingest: Some(Arc::new(Pushed::new(
                Ingest {
                    featurizer: PushFeaturizer::new(spec, state.clone(), plan.output_schema()),
                    rows_out: None,
                    next_row: 0,
                    seq: 0,
                    dropped: 0,
                    spool: None,
                    replaying: false,
                    skip_below: 0,
                    replay_failed: None,
                    committed_in: None,
                    input_failed: Arc::default(),
                    end_record: None,
                    refresh,
                },
                placement,
                event_time,
            ))),
            plan,
            state,
            bound,
            delivery: Delivery {
                epochs: 1,
                start_epoch: 0,
                start_step: 0,
                ..delivery
            },
            workers: workers.max(1),
            runs: Arc::default(),
            redact: Arc::from([]),
            shared_epochs: Arc::default(),
            local: 0..world,
            cluster: None,
            featurized: Default::default(),
        };
        if let Some(ingest) = &served.ingest {
            served.new_pushed_run(ingest, 0);
        }
        Ok(served)
    }

    fn world(&self) -> usize {
        self.delivery.plan.world_size()
    }

    /// A stream of `rank` of `run` from `start_step`, once attached.
    fn consumer(
        &self,
        run: &Arc<Run>,
        rank: usize,
        start_step: u64,
        reading: bool,
    ) -> Option<Consumer> {
        let attached = run.attach(rank, start_step, reading)?;
        Some(Consumer::new(
            run.clone(),
            Arc::downgrade(&self.runs),
            rank,
            start_step,
            attached,
            self.ingest.as_ref().map(|i| i.fresh.clone()),
            LetGo {
                after: self.absent_after,
                peers: self.cluster.as_ref().map(|c| c.signals.clone()),
            },
        ))
    }
}

impl Served for ServedPipeline {
    fn name(&self) -> &str {
        &self.name
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn world_size(&self) -> u32 {
        self.world() as u32
    }

    /// The version of the state delivered batches use now (a refreshed stream's changes).
    fn state_version(&self) -> u64 {
        let known = self.ingest.as_ref().and_then(|i| i.known.as_ref());
        known.map_or(self.state.version, |k| lock(k).in_effect)
    }

    fn job(&self) -> Option<u64> {
        Some(*self.job.get_or_init(|| {
            let inputs = self.inputs.as_deref();
            let job = (inputs, &*self.plan, Some(&self.state), &self.delivery);
            crate::runtime::job_fingerprint(job)
        }))
    }

    fn epochs(&self) -> u64 {
        self.delivery.epochs
    }

    fn steps(&self) -> u64 {
        match self.ingest {
            // Unknown until the input ends.
            Some(_) => u64::MAX,
            None => self.delivery.plan.steps(),
        }
    }

    fn takes_pushes(&self) -> Result<(), ServeError> {
        match &self.ingest {
            Some(ingest) => ingest.takes_pushes(),
            None => Err(ServeError::not_pushed(&self.name)),
        }
    }

    fn accept(
        &self,
        batch: arrow::array::RecordBatch,
        origin: Option<hydrant_flight::Origin>,
    ) -> Result<hydrant_flight::Accepted, ServeError> {
        match &self.ingest {
            // Called off the runtime's workers: it may wait for queue space.
            Some(ingest) => ingest.accept(batch, origin),
            None => Err(ServeError::not_pushed(&self.name)),
        }
    }

    fn end_input(&self) -> Result<(), ServeError> {
        match &self.ingest {
            Some(ingest) => ingest.end(&self.runs),
            None => Err(ServeError::not_pushed(&self.name)),
        }
    }

    fn state(&self, version: u64) -> Result<String, ServeError> {
        let known = self.ingest.as_ref().and_then(|i| i.known.as_ref());
        let json = match known {
            Some(known) => lock(known).json(version),
            None => (version == self.state.version).then(|| self.state.to_json()),
        };
        json.ok_or_else(|| {
            ServeError::NotFound(format!(
                "pipeline `{}` has no state version {version} (batches carry the versions it \
                 has as state_version)",
                self.name
            ))
        })
    }

    fn commit(&self, step: u64) -> Result<serde_json::Value, ServeError> {
        match &self.ingest {
            Some(ingest) => ingest.commit(step),
            None => Err(ServeError::FailedPrecondition(format!(
                "pipeline `{}` reads files, whose epochs replay from any step: there is \
                 nothing to commit",
                self.name
            ))),
        }
    }

    fn steps_cut(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.ingest.as_ref().map(|i| i.counts.steps_cut.watch())
    }

    fn open(&self, rank: u32, epoch: u64, start_step: u64) -> Result<RankStream, ServeError> {
        let rank = rank as usize;
        if let Some(c) = &self.cluster
            && !self.local.contains(&rank)
        {
            return Err(ServeError::FailedPrecondition(format!(
                "rank {rank} is served by process {} of the cluster, at {}; this is process \
                 {} (GetFlightInfo names each rank's location)",
                c.ownership.process(rank),
                c.location(rank),
                c.process
            )));
        }
        let mut runs = lock(&self.runs);
        // Trainers go forward: a run started ahead for an earlier epoch, which none of
        // them read, will not be.
        self.give_up(&mut runs, |r| r.epoch < epoch);
        // One stream per (epoch, rank): a new reader ends the one before, on any run.
        for run in runs.iter().filter(|r| r.epoch == epoch) {
            run.supersede_reader(rank);
        }
        let of_epoch = |only: Option<usize>| {
            runs.iter()
                .find(|r| r.epoch == epoch && r.only == only)
                .cloned()
        };
        let (mut shared, private) = (of_epoch(None), of_epoch(Some(rank)));
        // The run started ahead of the trainers, untouched yet, gives way to one from the
        // step the first of them asks for, rather than featurize steps no one wants.
        if shared.as_ref().is_some_and(|s| s.first_step != start_step)
            && self.give_up(&mut runs, |r| r.epoch == epoch && r.only.is_none())
        {
            shared = None;
        }
        if let Some(s) = &shared
            && let Some(c) = self.consumer(s, rank, start_step, true)
        {
            // Back on the shared run: the rank's own run is no longer needed.
            if let Some(p) = &private {
                forget(&mut runs, |r| std::ptr::eq(r, &**p));
            }
            self.warm_next(&mut runs, s);
            return Ok(c.into_stream());
        }
        if let Some(p) = &private
            && let Some(c) = self.consumer(p, rank, start_step, true)
        {
            return Ok(c.into_stream());
        }
        if self.ingest.is_some() {
            let next = shared.as_ref().map_or(0, |s| s.next_step(rank));
            return Err(ServeError::FailedPrecondition(if start_step > next {
                format!(
                    "step {start_step} of rank {rank} is not pushed yet (the next is {next}); \
                     reconnect with start_step {next}"
                )
            } else {
                format!(
                    "step {start_step} of rank {rank} is no longer held (pushed or followed \
                     input is delivered once; the last {} MiB per rank are kept for \
                     reconnects)",
                    self.replay_bytes >> 20
                )
            }));
        }
        // Past the last step: nothing to run, the stream just says the epoch is over.
        if start_step >= self.delivery.plan.steps() {
            return Ok(Box::pin(futures::stream::empty()));
        }
        // A cluster's dataflow has yet to reach this epoch: its shared run is made now.
        if let Some(c) = &self.cluster
            && shared.is_none()
            && let Some(run) = c.feed.run(&mut runs, epoch)
            && let Some(consumer) = self.consumer(&run, rank, start_step, true)
        {
            return Ok(consumer.into_stream());
        }
        // The shared run is past this step (or over): the rank catches up on a run of its
        // own. A second shared run of an epoch would wait on ranks that finished it (and a
        // cluster's shared runs are its dataflow's).
        let first = lock(&self.shared_epochs).insert(epoch);
        let only = (!first || shared.is_some() || self.cluster.is_some()).then_some(rank);
        self.make_room(&mut runs)?;
        let run = self.start(epoch, start_step, only, None)?;
        runs.push(run.clone());
        self.warm_next(&mut runs, &run);
        let c = self
            .consumer(&run, rank, start_step, true)
            .ok_or_else(|| ServeError::Internal("a new run refused its rank".into()))?;
        if let Some(p) = &private {
            forget(&mut runs, |r| std::ptr::eq(r, &**p));
        }
        // The shared run lets this rank's batches go meanwhile, so that the other ranks do
        // not wait on it (a later reconnect within what it still holds can take it back).
        if let Some(s) = &shared
            && let Some(drain) = self.consumer(s, rank, u64::MAX, false)
        {
            drain.drain();
        }
        Ok(c.into_stream())
    }

    fn location(&self, rank: u32) -> Option<String> {
        let c = self.cluster.as_ref()?;
        Some(c.location(rank as usize).to_string())
    }

    fn status(&self) -> serde_json::Value {
        let runs = lock(&self.runs).clone();
        serde_json::json!({
            "name": self.name,
            "world_size": self.world(),
            "process": self.cluster.as_ref().map(|c| c.process),
            "local_ranks": self.local.clone().collect::<Vec<_>>(),
            "epochs": self.delivery.epochs,
            // Unknown for pushed input until it ends.
            "steps_per_epoch": self.inputs.as_ref().map(|_| self.delivery.plan.steps()),
            "rows_per_epoch": self.inputs.as_ref().map(|_| self.delivery.plan.rows()),
            "state_version": self.state_version(),
            "state_versions": self.ingest.as_ref().and_then(|i| i.known.as_ref()).map(|k| lock(k).made),
            "rows_featurized": self.featurized.load(Ordering::Relaxed),
            // Decoded input kept in memory (`--cache-mib`).
            "cached_input_bytes": self.inputs.as_ref().map(|i| i.cached_bytes()),
            "pushed": self.ingest.as_ref().map(|i| i.status(self.follow.as_ref().map(|f| f.status()))),
            "runs": runs.iter().map(|r| r.status()).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests;
