//! A pipeline served over Flight ([`hydrant_flight::Served`]): each epoch is delivered by
//! a *session*, a dataflow run whose ranks are read by DoGet streams.
//!
//! A session starts with the first DoGet for its epoch, at that ticket's `start_step`.
//! Each rank keeps a ring of the last batches it sent, so a trainer that reconnects with
//! `start_step = last finished + 1` continues exactly where it stopped. A request the
//! shared session cannot serve (a step already gone) gets a private session that delivers
//! only that rank from that step: correct, at the cost of featurizing the epoch's rest.

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

/// Batches each rank keeps after sending them, for a reconnecting trainer.
pub const REPLAY: usize = 8;

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
    /// The rank's queue; `None` while a stream reads it.
    rx: Option<Receiver<RankBatch>>,
    /// The last batches sent, oldest first.
    sent: VecDeque<RankBatch>,
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
                sent: VecDeque::new(),
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

    /// Attaches a stream to `rank` of `session` from `start_step`, if the session still
    /// holds that step.
    fn attach(
        session: &Arc<Session>,
        rank: usize,
        start_step: u64,
    ) -> Result<Option<RankStream>, ServeError> {
        let mut slot = lock(&session.ranks[rank]);
        let oldest = slot.sent.front().map_or(slot.next_step, |b| b.meta.step);
        if start_step < oldest {
            return Ok(None);
        }
        let Some(rx) = slot.rx.take() else {
            return Err(ServeError::FailedPrecondition(format!(
                "rank {rank} of epoch {} is already being read by another stream",
                session.epoch
            )));
        };
        let replay: VecDeque<RankBatch> = slot
            .sent
            .iter()
            .filter(|b| b.meta.step >= start_step)
            .cloned()
            .collect();
        Ok(Some(Box::new(Reader {
            session: session.clone(),
            rank,
            start_step,
            replay,
            rx: Some(rx),
        })))
    }
}

/// One DoGet's view of a rank: first the replayed batches, then the queue.
struct Reader {
    session: Arc<Session>,
    rank: usize,
    start_step: u64,
    replay: VecDeque<RankBatch>,
    rx: Option<Receiver<RankBatch>>,
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

impl Iterator for Reader {
    type Item = Result<(BatchMeta, arrow::array::RecordBatch), ServeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(rb) = self.replay.pop_front() {
            return Some(Ok((meta(&rb), rb.batch.data)));
        }
        loop {
            let Ok(rb) = self.rx.as_ref()?.recv() else {
                // The dataflow ended: all sent, or failed.
                return self
                    .session
                    .errors
                    .get()
                    .map(|e| Err(ServeError::Internal(format!("pipeline failed: {e}"))));
            };
            let mut slot = lock(&self.session.ranks[self.rank]);
            slot.next_step = rb.meta.step + 1;
            if rb.meta.step < self.start_step {
                continue;
            }
            slot.sent.push_back(rb.clone());
            if slot.sent.len() > REPLAY {
                slot.sent.pop_front();
            }
            return Some(Ok((meta(&rb), rb.batch.data)));
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // Detach: the queue waits for the next stream of this rank (a reconnect).
        lock(&self.session.ranks[self.rank]).rx = self.rx.take();
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
            if let Some(stream) = Self::attach(s, rank, start_step)? {
                return Ok(stream);
            }
            // The shared session is past this step. Once it is done, the next reader of
            // an earlier step starts a new shared session; while it runs, a private one.
            if !s.done.load(Ordering::SeqCst) {
                drop(sessions);
                let private = self.start(epoch, start_step, Some(rank));
                return Self::attach(&private, rank, start_step)?
                    .ok_or_else(|| ServeError::Internal("a new session refused its rank".into()));
            }
        }
        let session = self.start(epoch, start_step, None);
        sessions.insert(epoch, session.clone());
        Self::attach(&session, rank, start_step)?
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
                        "connected": slot.rx.is_none(),
                        "next_step": slot.next_step,
                        "queue_depth": slot.rx.as_ref().map_or(0, |rx| rx.len()),
                    })
                }).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}
