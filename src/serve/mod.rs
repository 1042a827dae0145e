//! A pipeline served over Flight ([`hydrant_flight::Served`]): each epoch is delivered by
//! a *session*, a dataflow run whose ranks are read by DoGet streams.
//!
//! A session starts with the first DoGet for its epoch, at that ticket's `start_step`.
//! Each rank keeps a ring of the last batches it sent, so a trainer that reconnects with
//! `start_step = last finished + 1` continues exactly where it stopped. A request the
//! shared session cannot serve (a step already gone) gets a private session that delivers
//! only that rank from that step: correct, at the cost of featurizing the epoch's rest.
//!
//! A reconnect may arrive before the server has noticed the old stream is gone; the new
//! stream then takes the rank over. Only one stream receives from a rank's queue at a
//! time (the `receiving` lock), and a stream that finds itself replaced hands the batch
//! it holds back (`pending`), so nothing is lost or reordered.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use crossbeam_channel::{Receiver, Sender, bounded};
use hydrant_flight::{BatchMeta, RankStream, ServeError, Served, batch_bytes};
use hydrant_operators::{ErrorSlot, FeaturePlan, FittedState, Transformer};

use crate::delivery::{Delivery, RankBatch, StreamCutter, delivery_schema};
use crate::runtime::{self, Cluster, Job, Output};
use crate::source::Inputs;
use crate::spec::PipelineSpec;

mod push;

pub use push::PushFeaturizer;

/// Bytes of sent batches each rank keeps for a reconnecting trainer: more than a stream
/// can have in flight (the HTTP/2 stream window and the encoder's queue).
pub const REPLAY_BYTES: usize = 24 << 20;

/// Batches queued per rank between the dataflow and its stream.
const QUEUE: usize = 2;

/// A pipeline ready to serve: inputs opened, state fitted or given.
pub struct ServedPipeline {
    name: String,
    /// The input files; `None` for pushed input.
    inputs: Option<Arc<Inputs>>,
    /// Pushed input's state; `None` for files.
    ingest: Option<Mutex<Ingest>>,
    /// Bytes of sent batches each rank keeps for reconnects.
    replay_bytes: usize,
    /// Pushed input's counts, readable while a producer holds `ingest` (it may wait there
    /// for queue space as long as no trainer reads: `status` must not).
    pushed: PushCounts,
    plan: Arc<FeaturePlan>,
    state: FittedState,
    bound: Transformer,
    delivery: Delivery,
    workers: usize,
    schema: SchemaRef,
    sessions: Mutex<BTreeMap<u64, Arc<Session>>>,
}

struct Session {
    epoch: u64,
    first_step: u64,
    /// Rank served, when the session serves only one.
    only: Option<usize>,
    ranks: Vec<Mutex<Slot>>,
    done: Arc<AtomicBool>,
    errors: ErrorSlot,
    /// Bytes of sent batches each rank keeps for reconnects.
    replay_bytes: usize,
}

impl Session {
    /// A session whose ranks' queues are fed by the returned senders; with `only`, the
    /// other ranks get no queue (the dataflow discards their batches).
    fn with_queues(
        epoch: u64,
        first_step: u64,
        only: Option<usize>,
        world: usize,
        replay_bytes: usize,
    ) -> (Vec<Option<Sender<RankBatch>>>, Arc<Session>) {
        let (senders, ranks) = (0..world)
            .map(|r| {
                let (tx, rx) = bounded(QUEUE);
                let mut slot = Slot::new(rx, first_step);
                if only.is_some_and(|o| o != r) {
                    slot.rx = None;
                    return (None, Mutex::new(slot));
                }
                (Some(tx), Mutex::new(slot))
            })
            .unzip();
        let session = Arc::new(Session {
            epoch,
            first_step,
            only,
            ranks,
            done: Arc::default(),
            errors: ErrorSlot::default(),
            replay_bytes,
        });
        (senders, session)
    }
}

/// Pushed input: how batches are featurized and cut as they arrive.
struct Ingest {
    featurizer: PushFeaturizer,
    cutter: StreamCutter,
    /// `None` once the input is ended.
    senders: Option<Vec<Sender<RankBatch>>>,
    next_row: u64,
    seq: u64,
    dropped: u64,
}

/// What `status` reports of pushed input.
#[derive(Default)]
struct PushCounts {
    rows_in: AtomicU64,
    batches_in: AtomicU64,
    dropped: AtomicU64,
    ended: AtomicBool,
}

struct Slot {
    /// The rank's queue (`None` for ranks a private session does not serve).
    rx: Option<Receiver<RankBatch>>,
    /// Held while a stream waits on `rx`, so that one stream receives at a time.
    receiving: Arc<Mutex<()>>,
    /// Which stream reads the rank now; older streams stop.
    generation: u64,
    /// Whether a stream is attached.
    attached: bool,
    /// Batches received by a replaced stream and not sent, to go first.
    pending: VecDeque<RankBatch>,
    /// The last batches sent, oldest first, and their bytes.
    sent: VecDeque<RankBatch>,
    sent_bytes: usize,
    /// The step the queue yields next.
    next_step: u64,
}

impl Slot {
    fn new(rx: Receiver<RankBatch>, next_step: u64) -> Self {
        Slot {
            rx: Some(rx),
            receiving: Arc::default(),
            generation: 0,
            attached: false,
            pending: VecDeque::new(),
            sent: VecDeque::new(),
            sent_bytes: 0,
            next_step,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ServedPipeline {
    /// Keeps `bytes` of sent batches per rank (default [`REPLAY_BYTES`]) for trainers that
    /// reconnect; an older step is served by a new run.
    pub fn with_replay_bytes(mut self, bytes: usize) -> Self {
        self.replay_bytes = bytes;
        self
    }

    /// A pipeline over `inputs` with `state` (already fitted), delivered as `delivery`
    /// says, each session running on `workers` threads.
    pub fn new(
        name: &str,
        inputs: Arc<Inputs>,
        plan: Arc<FeaturePlan>,
        state: FittedState,
        delivery: Delivery,
        workers: usize,
    ) -> crate::Result<Self> {
        let bound = plan.transformer(&state)?;
        Ok(ServedPipeline {
            name: name.to_string(),
            schema: delivery_schema(&plan.output_schema()),
            inputs: Some(inputs),
            ingest: None,
            pushed: PushCounts::default(),
            replay_bytes: REPLAY_BYTES,
            plan,
            state,
            bound,
            delivery,
            workers,
            sessions: Mutex::new(BTreeMap::new()),
        })
    }

    /// A pipeline whose rows are pushed by producers (DoPut) until `end_ingest`: one
    /// epoch, fed as batches arrive. `delivery`'s row counts are ignored.
    pub fn ingest(
        spec: PipelineSpec,
        state: FittedState,
        delivery: Delivery,
    ) -> crate::Result<Self> {
        let plan = Arc::new(spec.plan(&spec.nominal_schema())?);
        let bound = plan.transformer(&state)?;
        let cutter = StreamCutter::new(
            *delivery.plan.placement(),
            &plan.output_schema(),
            state.version,
        )?;
        let (senders, session) =
            Session::with_queues(0, 0, None, delivery.plan.world_size(), REPLAY_BYTES);
        let senders = senders.into_iter().flatten().collect();
        let mut sessions = BTreeMap::new();
        sessions.insert(0, session);
        Ok(ServedPipeline {
            name: spec.name.clone(),
            schema: delivery_schema(&plan.output_schema()),
            inputs: None,
            pushed: PushCounts::default(),
            replay_bytes: REPLAY_BYTES,
            ingest: Some(Mutex::new(Ingest {
                featurizer: PushFeaturizer::new(spec, state.clone(), plan.output_schema()),
                cutter,
                senders: Some(senders),
                next_row: 0,
                seq: 0,
                dropped: 0,
            })),
            plan,
            state,
            bound,
            delivery: Delivery {
                epochs: 1,
                start_epoch: 0,
                start_step: 0,
                ..delivery
            },
            workers: 1,
            sessions: Mutex::new(sessions),
        })
    }

    /// Starts a dataflow delivering `epoch` from `start_step`, all ranks or only `only`.
    fn start(&self, epoch: u64, start_step: u64, only: Option<usize>) -> Arc<Session> {
        let Some(inputs) = &self.inputs else {
            unreachable!("sessions of pushed input are made at start");
        };
        let (senders, session) = Session::with_queues(
            epoch,
            start_step,
            only,
            self.delivery.plan.world_size(),
            self.replay_bytes,
        );
        let mut job = Job::new(
            inputs.clone(),
            self.plan.clone(),
            Some(self.state.clone()),
            Some(self.bound.clone()),
            Delivery {
                plan: self.delivery.plan.clone(),
                epochs: epoch + 1,
                start_epoch: epoch,
                start_step,
            },
        );
        job.output = Some(Output::Channels(senders));
        job.errors = session.errors.clone();
        let cluster = Cluster::local(self.workers);
        let (done, errors) = (session.done.clone(), session.errors.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("hydrant-session-{epoch}"))
            .spawn(move || {
                if let Err(e) = runtime::execute(job, &cluster, || {}) {
                    errors.set("session", e);
                }
                done.store(true, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            session.errors.set("session", format!("cannot start: {e}"));
            session.done.store(true, Ordering::SeqCst);
        }
        session
    }

    /// Attaches a stream to `rank` of `session` from `start_step` (taking the rank over
    /// from an earlier stream), if the session still holds that step; `steps` is the
    /// epoch's length when it is known (file input).
    fn attach(
        session: &Arc<Session>,
        rank: usize,
        start_step: u64,
        steps: Option<u64>,
    ) -> Option<RankStream> {
        let mut slot = lock(&session.ranks[rank]);
        let rx = slot.rx.clone()?;
        let oldest = slot
            .sent
            .front()
            .or(slot.pending.front())
            .map_or(slot.next_step, |b| b.meta.step);
        if start_step < oldest {
            return None;
        }
        slot.generation += 1;
        slot.attached = true;
        let replay: VecDeque<RankBatch> = slot
            .sent
            .iter()
            .filter(|b| b.meta.step >= start_step)
            .cloned()
            .collect();
        Some(Box::new(Reader {
            session: session.clone(),
            rank,
            generation: slot.generation,
            start_step,
            replay,
            receiving: slot.receiving.clone(),
            rx,
            ended: false,
            steps,
            next: start_step,
        }))
    }
}

/// Hands each rank batch to its rank's queue, waiting while it is full.
fn send_all(senders: &[Sender<RankBatch>], ranked: Vec<RankBatch>) -> Result<(), ServeError> {
    for rb in ranked {
        let rank = rb.meta.rank;
        senders[rank]
            .send(rb)
            .map_err(|_| ServeError::Internal(format!("rank {rank}'s queue is closed")))?;
    }
    Ok(())
}

/// One DoGet's view of a rank: the replayed batches, then what a replaced stream left,
/// then the queue.
struct Reader {
    session: Arc<Session>,
    rank: usize,
    generation: u64,
    start_step: u64,
    replay: VecDeque<RankBatch>,
    receiving: Arc<Mutex<()>>,
    rx: Receiver<RankBatch>,
    /// Set once the stream has ended (with its last batch or an error).
    ended: bool,
    /// Steps in the epoch, when known (file input).
    steps: Option<u64>,
    /// The next step this stream owes its reader.
    next: u64,
}

fn meta(rb: &RankBatch) -> BatchMeta {
    BatchMeta {
        epoch: rb.meta.epoch,
        step: rb.meta.step,
        rank: rb.meta.rank as u32,
        rows: rb.data().num_rows() as u64,
        padded_rows: rb.meta.padded_rows as u64,
        state_version: rb.meta.state_version,
        last: false,
    }
}

/// How long a stream waits on its queue before looking whether it was replaced.
const POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl Reader {
    /// Sends `rb` if it is at or past the start step (recording it for replay).
    fn deliver(&self, slot: &mut Slot, rb: RankBatch) -> Option<RankBatch> {
        slot.next_step = slot.next_step.max(rb.meta.step + 1);
        if rb.meta.step < self.start_step {
            return None;
        }
        let rank = self.rank.to_string();
        metrics::counter!(crate::metrics::RANK_BATCHES, "rank" => rank.clone()).increment(1);
        metrics::counter!(crate::metrics::RANK_BYTES, "rank" => rank.clone())
            .increment(batch_bytes(rb.data()) as u64);
        metrics::gauge!(crate::metrics::RANK_QUEUE_DEPTH, "rank" => rank).set(self.rx.len() as f64);
        slot.sent_bytes += batch_bytes(rb.data());
        slot.sent.push_back(rb.clone());
        while slot.sent_bytes > self.session.replay_bytes && slot.sent.len() > 1 {
            if let Some(old) = slot.sent.pop_front() {
                slot.sent_bytes -= batch_bytes(old.data());
            }
        }
        Some(rb)
    }

    /// Ends this stream because a newer reader took its rank: ABORTED, never a clean end,
    /// so that the stale reader cannot mistake it for the end of the epoch.
    fn superseded(&self) -> Option<<Self as Iterator>::Item> {
        Some(Err(ServeError::Aborted(format!(
            "superseded by a newer reader for rank {}",
            self.rank
        ))))
    }

    /// The next batch from the replay, the held-back batches or the queue.
    fn next_batch(&mut self) -> Option<<Self as Iterator>::Item> {
        if let Some(rb) = self.replay.pop_front() {
            return Some(Ok((meta(&rb), rb.batch.data)));
        }
        loop {
            {
                let mut slot = lock(&self.session.ranks[self.rank]);
                if slot.generation != self.generation {
                    return self.superseded();
                }
                while let Some(rb) = slot.pending.pop_front() {
                    if let Some(rb) = self.deliver(&mut slot, rb) {
                        return Some(Ok((meta(&rb), rb.batch.data)));
                    }
                }
            }
            let receiving = lock(&self.receiving);
            let waited = Instant::now();
            let got = self.rx.recv_timeout(POLL);
            metrics::gauge!(crate::metrics::RANK_STALL_SECONDS, "rank" => self.rank.to_string())
                .increment(waited.elapsed().as_secs_f64());
            let mut slot = lock(&self.session.ranks[self.rank]);
            drop(receiving);
            match got {
                Ok(rb) if slot.generation != self.generation => {
                    slot.pending.push_back(rb);
                    return self.superseded();
                }
                Ok(rb) => {
                    // A replaced stream may have left earlier batches: they go first.
                    slot.pending.push_back(rb);
                    while let Some(rb) = slot.pending.pop_front() {
                        if let Some(rb) = self.deliver(&mut slot, rb) {
                            return Some(Ok((meta(&rb), rb.batch.data)));
                        }
                    }
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    // The dataflow ended: all sent, or failed.
                    return self
                        .session
                        .errors
                        .get()
                        .map(|e| Err(ServeError::Internal(format!("pipeline failed: {e}"))));
                }
            }
        }
    }
}

impl Iterator for Reader {
    type Item = Result<(BatchMeta, arrow::array::RecordBatch), ServeError>;

    /// The next batch; a stream of a known-length epoch never ends cleanly before its last
    /// step (it ends with an error saying where to resume instead).
    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        let mut item = self.next_batch();
        match &mut item {
            // Steps come in order from `start_step`; a gap would be rows lost unseen.
            Some(Ok((meta, _))) if meta.step != self.next && self.start_step != u64::MAX => {
                self.ended = true;
                return Some(Err(ServeError::Internal(format!(
                    "rank {}'s stream skipped from step {} to {}; reconnect with start_step {}",
                    self.rank, self.next, meta.step, self.next
                ))));
            }
            Some(Ok((meta, _))) => {
                self.next = meta.step + 1;
                meta.last = self.steps == Some(self.next);
            }
            Some(Err(_)) => self.ended = true,
            None => {
                self.ended = true;
                if let Some(steps) = self.steps.filter(|&n| self.next < n && self.start_step < n) {
                    return Some(Err(ServeError::Internal(format!(
                        "rank {}'s stream ended at step {} of {steps}; reconnect with \
                         start_step {}",
                        self.rank, self.next, self.next
                    ))));
                }
            }
        }
        item
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut slot = lock(&self.session.ranks[self.rank]);
        if slot.generation == self.generation {
            slot.attached = false;
        }
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
        self.delivery.plan.world_size() as u32
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

    fn accept(&self, batch: arrow::array::RecordBatch) -> Result<(u64, u64), ServeError> {
        let Some(ingest) = &self.ingest else {
            return Err(ServeError::not_pushed(&self.name));
        };
        // Featurized under the lock, so that rows keep the order they were accepted in and
        // a full rank queue holds every producer back.
        let mut guard = lock(ingest);
        let st = &mut *guard;
        let Some(senders) = &st.senders else {
            return Err(ServeError::FailedPrecondition(format!(
                "the input of `{}` was ended",
                self.name
            )));
        };
        let rows = batch.num_rows() as u64;
        let featurized = st
            .featurizer
            .featurize(batch, st.next_row)
            .inspect_err(|_| {
                metrics::counter!(crate::metrics::PUSH_REJECTED, "reason" => "invalid").increment(1)
            })?;
        let mut ranked = Vec::new();
        st.cutter
            .push(featurized, &mut ranked)
            .map_err(|e| ServeError::Internal(e.to_string()))?;
        send_all(senders, ranked)?;
        st.next_row += rows;
        st.seq += 1;
        self.pushed.rows_in.store(st.next_row, Ordering::Relaxed);
        self.pushed.batches_in.store(st.seq, Ordering::Relaxed);
        metrics::counter!(crate::metrics::PUSHED_ROWS).increment(rows);
        Ok((st.seq - 1, rows))
    }

    fn end_input(&self) -> Result<(), ServeError> {
        let Some(ingest) = &self.ingest else {
            return Err(ServeError::not_pushed(&self.name));
        };
        let mut st = lock(ingest);
        let Some(senders) = st.senders.take() else {
            return Ok(()); // ended already
        };
        let mut ranked = Vec::new();
        st.dropped = st
            .cutter
            .end(&mut ranked)
            .map_err(|e| ServeError::Internal(e.to_string()))?;
        send_all(&senders, ranked)?;
        self.pushed.dropped.store(st.dropped, Ordering::Relaxed);
        self.pushed.ended.store(true, Ordering::Relaxed);
        if let Some(s) = lock(&self.sessions).get(&0) {
            s.done.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    fn open(&self, rank: u32, epoch: u64, start_step: u64) -> Result<RankStream, ServeError> {
        let rank = rank as usize;
        let steps = self.inputs.as_ref().map(|_| self.delivery.plan.steps());
        let mut sessions = lock(&self.sessions);
        if let Some(s) = sessions.get(&epoch) {
            if let Some(stream) = Self::attach(s, rank, start_step, steps) {
                return Ok(stream);
            }
            if self.ingest.is_some() {
                return Err(ServeError::FailedPrecondition(format!(
                    "step {start_step} of rank {rank} is no longer held (pushed input is \
                     delivered once; the last {} MiB per rank are kept for reconnects)",
                    self.replay_bytes >> 20
                )));
            }
            // The shared session is past this step. Once it is done, the next reader of
            // an earlier step starts a new shared session; while it runs, a private one.
            if !s.done.load(Ordering::SeqCst) {
                // The other ranks must not wait on this one in the shared session: drain
                // it there (a later reconnect within its replay can still take it over).
                if let Some(drain) = Self::attach(s, rank, u64::MAX, None) {
                    let spawned = std::thread::Builder::new()
                        .name(format!("hydrant-drain-{rank}"))
                        .spawn(move || drain.for_each(drop));
                    if spawned.is_err() {
                        return Err(ServeError::Internal("cannot start a drain thread".into()));
                    }
                }
                drop(sessions);
                let private = self.start(epoch, start_step, Some(rank));
                return Self::attach(&private, rank, start_step, steps)
                    .ok_or_else(|| ServeError::Internal("a new session refused its rank".into()));
            }
        }
        let session = self.start(epoch, start_step, None);
        sessions.insert(epoch, session.clone());
        Self::attach(&session, rank, start_step, steps)
            .ok_or_else(|| ServeError::Internal("a new session refused its rank".into()))
    }

    fn status(&self) -> serde_json::Value {
        let sessions = lock(&self.sessions);
        serde_json::json!({
            "name": self.name,
            "world_size": self.delivery.plan.world_size(),
            "epochs": self.delivery.epochs,
            // Unknown for pushed input until it ends.
            "steps_per_epoch": self.inputs.as_ref().map(|_| self.delivery.plan.steps()),
            "rows_per_epoch": self.inputs.as_ref().map(|_| self.delivery.plan.rows()),
            "state_version": self.state.version,
            "pushed": self.ingest.as_ref().map(|_| {
                let p = &self.pushed;
                serde_json::json!({
                    "rows_in": p.rows_in.load(Ordering::Relaxed),
                    "batches_in": p.batches_in.load(Ordering::Relaxed),
                    "ended": p.ended.load(Ordering::Relaxed),
                    "dropped_rows": p.dropped.load(Ordering::Relaxed),
                })
            }),
            "sessions": sessions.values().map(|s| serde_json::json!({
                "epoch": s.epoch,
                "first_step": s.first_step,
                "only_rank": s.only,
                "done": s.done.load(Ordering::SeqCst),
                "ranks": s.ranks.iter().enumerate().map(|(r, slot)| {
                    let slot = lock(slot);
                    serde_json::json!({
                        "rank": r,
                        "connected": slot.attached,
                        "next_step": slot.next_step,
                        "queue_depth": slot.rx.as_ref().map_or(0, |rx| rx.len()),
                    })
                }).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::StepMeta;
    use arrow::array::RecordBatch;
    use arrow::datatypes::Schema;

    fn step(step: u64) -> RankBatch {
        RankBatch {
            meta: StepMeta {
                epoch: 0,
                step,
                rank: 0,
                world_size: 1,
                padded_rows: 0,
                state_version: 0,
            },
            batch: hydrant_operators::Batch {
                seq: step,
                data: RecordBatch::new_empty(Arc::new(Schema::empty())),
            },
        }
    }

    /// A session of one rank fed `steps`, then ended; its stream from step 0 of an epoch
    /// of `len` steps.
    fn stream(steps: &[u64], len: u64) -> RankStream {
        let (senders, session) = Session::with_queues(0, 0, None, 1, REPLAY_BYTES);
        let tx = senders.into_iter().flatten().next().unwrap();
        let stream = ServedPipeline::attach(&session, 0, 0, Some(len)).unwrap();
        // The queue is bounded: the stream's reads make room.
        let steps = steps.to_vec();
        std::thread::spawn(move || steps.into_iter().for_each(|s| tx.send(step(s)).unwrap()));
        stream
    }

    #[test]
    fn a_stream_that_skips_or_ends_short_says_where_to_resume() {
        let mut s = stream(&[0, 2], 3);
        assert_eq!(s.next().unwrap().unwrap().0.step, 0);
        let err = s.next().unwrap().unwrap_err().to_string();
        assert!(
            err.contains("skipped from step 1 to 2") && err.contains("start_step 1"),
            "{err}"
        );
        assert!(s.next().is_none());

        let mut s = stream(&[0, 1], 3);
        assert_eq!(s.by_ref().take(2).filter(|b| b.is_ok()).count(), 2);
        let err = s.next().unwrap().unwrap_err().to_string();
        assert!(
            err.contains("ended at step 2 of 3") && err.contains("start_step 2"),
            "{err}"
        );
        assert!(s.next().is_none());

        let s = stream(&[0, 1, 2], 3);
        assert_eq!(s.map(|b| b.unwrap().0.step).collect::<Vec<_>>(), [0, 1, 2]);
    }
}
