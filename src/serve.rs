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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use crossbeam_channel::{Receiver, bounded};
use hydrant_flight::{BatchMeta, RankStream, ServeError, Served};
use hydrant_operators::{ErrorSlot, FeaturePlan, FittedState, Transformer};

use crate::dataflow::{self, Cluster, Job, Output};
use crate::rebatch::{RankBatch, delivery_schema};
use crate::route::Delivery;
use crate::source::Inputs;

/// Bytes of sent batches each rank keeps for a reconnecting trainer: more than a stream
/// can have in flight (the HTTP/2 stream window and the encoder's queue).
pub const REPLAY_BYTES: usize = 24 << 20;

/// Batches queued per rank between the dataflow and its stream.
const QUEUE: usize = 2;

/// A pipeline ready to serve: inputs opened, state fitted or given.
pub struct ServedPipeline {
    name: String,
    inputs: Arc<Inputs>,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ServedPipeline {
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
            inputs,
            plan,
            state,
            bound,
            delivery,
            workers,
            sessions: Mutex::new(BTreeMap::new()),
        })
    }

    /// Starts a dataflow delivering `epoch` from `start_step`, all ranks or only `only`.
    fn start(&self, epoch: u64, start_step: u64, only: Option<usize>) -> Arc<Session> {
        let world = self.delivery.plan.world_size();
        let mut senders = Vec::with_capacity(world);
        let mut ranks = Vec::with_capacity(world);
        for r in 0..world {
            let (tx, rx) = bounded(QUEUE);
            let serve = only.is_none_or(|o| o == r);
            senders.push(serve.then_some(tx));
            ranks.push(Mutex::new(Slot {
                rx: serve.then_some(rx),
                receiving: Arc::default(),
                generation: 0,
                attached: false,
                pending: VecDeque::new(),
                sent: VecDeque::new(),
                sent_bytes: 0,
                next_step: start_step,
            }));
        }
        let errors = ErrorSlot::default();
        let done = Arc::new(AtomicBool::new(false));
        let job = Job {
            inputs: self.inputs.clone(),
            plan: self.plan.clone(),
            state: Some(self.state.clone()),
            bound: Some(self.bound.clone()),
            delivery: Delivery {
                plan: self.delivery.plan.clone(),
                epochs: epoch + 1,
                start_epoch: epoch,
                start_step,
            },
            output: Some(Output::Channels(senders)),
            started: Instant::now(),
            progress: Default::default(),
            errors: errors.clone(),
        };
        let cluster = Cluster::local(self.workers);
        let (done2, errors2) = (done.clone(), errors.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("hydrant-session-{epoch}"))
            .spawn(move || {
                if let Err(e) = dataflow::execute(job, &cluster, || {}) {
                    errors2.set("session", e);
                }
                done2.store(true, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            errors.set("session", format!("cannot start: {e}"));
            done.store(true, Ordering::SeqCst);
        }
        Arc::new(Session {
            epoch,
            first_step: start_step,
            only,
            ranks,
            done,
            errors,
        })
    }

    /// Attaches a stream to `rank` of `session` from `start_step` (taking the rank over
    /// from an earlier stream), if the session still holds that step.
    fn attach(session: &Arc<Session>, rank: usize, start_step: u64) -> Option<RankStream> {
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
        }))
    }
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
}

fn meta(rb: &RankBatch) -> BatchMeta {
    BatchMeta {
        epoch: rb.meta.epoch,
        step: rb.meta.step,
        rank: rb.meta.rank as u32,
        rows: rb.data().num_rows() as u64,
        padded_rows: rb.meta.padded_rows as u64,
        state_version: rb.meta.state_version,
    }
}

/// The bytes of a batch's rows (not of buffers a slice shares with others).
fn bytes(rb: &RankBatch) -> usize {
    rb.data()
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
        .sum()
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
        slot.sent_bytes += bytes(&rb);
        slot.sent.push_back(rb.clone());
        while slot.sent_bytes > REPLAY_BYTES && slot.sent.len() > 1 {
            if let Some(old) = slot.sent.pop_front() {
                slot.sent_bytes -= bytes(&old);
            }
        }
        Some(rb)
    }
}

impl Iterator for Reader {
    type Item = Result<(BatchMeta, arrow::array::RecordBatch), ServeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(rb) = self.replay.pop_front() {
            return Some(Ok((meta(&rb), rb.batch.data)));
        }
        loop {
            {
                let mut slot = lock(&self.session.ranks[self.rank]);
                if slot.generation != self.generation {
                    return None; // replaced by a reconnect
                }
                while let Some(rb) = slot.pending.pop_front() {
                    if let Some(rb) = self.deliver(&mut slot, rb) {
                        return Some(Ok((meta(&rb), rb.batch.data)));
                    }
                }
            }
            let receiving = lock(&self.receiving);
            let got = self.rx.recv_timeout(POLL);
            let mut slot = lock(&self.session.ranks[self.rank]);
            drop(receiving);
            match got {
                Ok(rb) if slot.generation != self.generation => {
                    slot.pending.push_back(rb);
                    return None;
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
        self.delivery.plan.steps()
    }

    fn open(&self, rank: u32, epoch: u64, start_step: u64) -> Result<RankStream, ServeError> {
        let rank = rank as usize;
        let mut sessions = lock(&self.sessions);
        if let Some(s) = sessions.get(&epoch) {
            if let Some(stream) = Self::attach(s, rank, start_step) {
                return Ok(stream);
            }
            // The shared session is past this step. Once it is done, the next reader of
            // an earlier step starts a new shared session; while it runs, a private one.
            if !s.done.load(Ordering::SeqCst) {
                // The other ranks must not wait on this one in the shared session: drain
                // it there (a later reconnect within its replay can still take it over).
                if let Some(drain) = Self::attach(s, rank, u64::MAX) {
                    let spawned = std::thread::Builder::new()
                        .name(format!("hydrant-drain-{rank}"))
                        .spawn(move || drain.for_each(drop));
                    if spawned.is_err() {
                        return Err(ServeError::Internal("cannot start a drain thread".into()));
                    }
                }
                drop(sessions);
                let private = self.start(epoch, start_step, Some(rank));
                return Self::attach(&private, rank, start_step)
                    .ok_or_else(|| ServeError::Internal("a new session refused its rank".into()));
            }
        }
        let session = self.start(epoch, start_step, None);
        sessions.insert(epoch, session.clone());
        Self::attach(&session, rank, start_step)
            .ok_or_else(|| ServeError::Internal("a new session refused its rank".into()))
    }

    fn status(&self) -> serde_json::Value {
        let sessions = lock(&self.sessions);
        serde_json::json!({
            "name": self.name,
            "world_size": self.delivery.plan.world_size(),
            "epochs": self.delivery.epochs,
            "steps_per_epoch": self.delivery.plan.steps(),
            "rows_per_epoch": self.delivery.plan.rows(),
            "state_version": self.state.version,
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
