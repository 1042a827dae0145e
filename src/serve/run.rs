//! One *run* of an epoch: a dataflow (or pushed input) that fills a bounded queue per
//! rank from a first step on, and per rank a *slot*: which consumer receives from the
//! queue now, and the last batches sent, for a stream that takes the rank over.
//!
//! At most one consumer receives from a rank's queue: attaching a new one (a trainer's
//! stream, or a drain that keeps the other ranks going) supersedes the old. A consumer
//! that finds it was superseded while it held a batch hands it back (`pending`), so
//! nothing is lost or reordered.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hydrant_flight::{ServeError, batch_bytes};
use hydrant_operators::ErrorSlot;
use tokio::sync::mpsc::{Receiver, Sender, channel};
use tokio_util::sync::CancellationToken;

use crate::delivery::RankBatch;

/// Batches queued per rank between the dataflow and its stream.
const QUEUE: usize = 2;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A rank's queue, shared by the consumers that take turns on it.
pub(super) type Queue = Arc<tokio::sync::Mutex<Receiver<RankBatch>>>;

pub(super) struct Run {
    pub epoch: u64,
    pub first_step: u64,
    /// The rank served, when the run serves only one (a rank catching up).
    pub only: Option<usize>,
    /// Steps in the epoch, when known (file input).
    pub steps: Option<u64>,
    slots: Vec<Mutex<Slot>>,
    /// Each served rank's queue; `None` for ranks the run does not serve.
    queues: Vec<Option<Queue>>,
    pub errors: ErrorSlot,
    /// Why pushed or followed input failed, once it has: told to the streams once their
    /// queues end, after the dataflow has delivered every step it could complete.
    pub input_failed: Arc<std::sync::OnceLock<String>>,
    /// Cancelled once the dataflow (or pushed input) has ended.
    pub ended: CancellationToken,
    /// Bytes of sent batches each rank keeps.
    replay_bytes: usize,
    /// The server's input paths and how a client is told them (see [`Run::failure`]).
    redact: Redact,
    /// Stops the dataflow feeding the queues (when the run is forgotten).
    pub stop: CancellationToken,
    /// Cancelled when the run failed from outside ([`Run::fail`]): its streams end with
    /// the failure once they have sent what is queued.
    pub broken: CancellationToken,
    /// The queues' senders until a dataflow takes them, each rank's once (a served
    /// cluster's run is made before its dataflow reaches its epoch).
    feed: Mutex<Vec<Option<Sender<RankBatch>>>>,
    /// Made ahead of its trainers (at start, or by a cluster's dataflow).
    ahead: AtomicBool,
    /// Fed by a served cluster's dataflow ([`Run::fed_later`]), whose failure is recorded
    /// ([`Run::fail`]) only after its workers may have dropped the queues.
    fed_later: AtomicBool,
    /// The (rank, generation) of readers ended for holding later epochs back
    /// ([`Run::end_stalled_reader`]), so that they are told why.
    stalled: Mutex<Vec<(usize, u64)>>,
}

/// Each input's path on the server and the name clients see instead, longest path first.
pub(super) type Redact = Arc<[(String, String)]>;

pub(super) struct Slot {
    /// Counts consumers: the one whose number this is receives, older ones stop.
    pub generation: u64,
    /// Cancels the current consumer's wait.
    holder: Option<CancellationToken>,
    /// Whether the current consumer is a trainer's stream (not a drain).
    reading: bool,
    /// Batches a superseded consumer received and did not send: they go first.
    pub pending: VecDeque<RankBatch>,
    /// The last batches taken from the queue (sent, or skipped by a consumer that started
    /// past them), oldest first, and their bytes.
    sent: VecDeque<RankBatch>,
    sent_bytes: usize,
    /// The step the queue yields next.
    pub next_step: u64,
    /// The queue has ended: every batch of this rank was taken.
    pub exhausted: bool,
    /// Since when no stream reads the rank.
    idle_since: Instant,
    /// When the current consumer attached or last took a batch.
    taken_at: Instant,
}

/// What a consumer needs once attached to a slot.
pub(super) struct Attached {
    pub generation: u64,
    pub cancel: CancellationToken,
    pub queue: Queue,
    /// Sent batches from the start step on, to send again first.
    pub replay: VecDeque<RankBatch>,
}

impl Run {
    /// A run of `epoch` from `first_step` whose queues, one per rank of `ranks` (the
    /// ranks served here), are fed by the returned senders; with `only`, the other ranks
    /// get no queue (the dataflow discards them).
    pub fn new(
        epoch: u64,
        first_step: u64,
        only: Option<usize>,
        ranks: Range<usize>,
        steps: Option<u64>,
        replay_bytes: usize,
        redact: Redact,
    ) -> (Vec<Option<Sender<RankBatch>>>, Arc<Run>) {
        let (senders, queues) = (0..ranks.end)
            .map(|r| {
                if !ranks.contains(&r) || only.is_some_and(|o| o != r) {
                    return (None, None);
                }
                let (tx, rx) = channel(QUEUE);
                (Some(tx), Some(Arc::new(tokio::sync::Mutex::new(rx))))
            })
            .unzip();
        let now = Instant::now();
        let slots = (0..ranks.end)
            .map(|_| {
                Mutex::new(Slot {
                    generation: 0,
                    holder: None,
                    reading: false,
                    pending: VecDeque::new(),
                    sent: VecDeque::new(),
                    sent_bytes: 0,
                    next_step: first_step,
                    exhausted: false,
                    idle_since: now,
                    taken_at: now,
                })
            })
            .collect();
        let run = Arc::new(Run {
            epoch,
            first_step,
            only,
            steps,
            slots,
            queues,
            errors: ErrorSlot::default(),
            input_failed: Arc::default(),
            ended: CancellationToken::new(),
            replay_bytes,
            redact,
            stop: CancellationToken::new(),
            broken: CancellationToken::new(),
            feed: Mutex::default(),
            ahead: AtomicBool::new(false),
            fed_later: AtomicBool::new(false),
            stalled: Mutex::default(),
        });
        (senders, run)
    }

    /// A run whose dataflow comes later and takes each rank's sender with
    /// [`Run::take_sender`].
    pub fn fed_later(self: Arc<Self>, senders: Vec<Option<Sender<RankBatch>>>) -> Arc<Self> {
        *lock(&self.feed) = senders;
        self.fed_later.store(true, Ordering::SeqCst);
        self.ahead()
    }

    /// Marks the run as made ahead of its trainers: until one attaches it is not idle
    /// (see [`Run::untouched`]).
    pub fn ahead(self: Arc<Self>) -> Arc<Self> {
        self.ahead.store(true, Ordering::SeqCst);
        self
    }

    /// Made ahead of its trainers, and no stream has attached to it yet.
    pub fn untouched(&self) -> bool {
        self.ahead.load(Ordering::SeqCst) && self.slots.iter().all(|s| lock(s).generation == 0)
    }

    /// `rank`'s sender of a run made with [`Run::fed_later`], the first time only.
    pub fn take_sender(&self, rank: usize) -> Option<Sender<RankBatch>> {
        lock(&self.feed).get_mut(rank)?.take()
    }

    /// Why the run failed, if it did, naming inputs as the pipeline does, not by the
    /// server's paths.
    pub fn failure(&self) -> Option<String> {
        let mut text = self.errors.get()?;
        for (path, name) in self.redact.iter() {
            text = text.replace(path.as_str(), name);
        }
        Some(text)
    }

    /// Fails the run from outside, as `why` from `origin` (see [`Run::failure_status`]): a
    /// served cluster's one dataflow feeds every epoch's run, and its queues are not
    /// closed when it fails. Streams waiting on the run end with the failure.
    pub fn fail(&self, origin: Option<&str>, why: &str) {
        match origin {
            Some(origin) => self.errors.set_from(origin, why),
            None => self.errors.set_message(why),
        }
        self.broken.cancel();
    }

    /// Whether a queue that ended short may yet be explained by a failure still to be
    /// recorded: the run is fed by a cluster's dataflow, has not failed yet, and was not let
    /// go on purpose.
    pub fn failure_may_follow(&self) -> bool {
        self.fed_later.load(Ordering::SeqCst)
            && self.errors.get().is_none()
            && !self.stop.is_cancelled()
    }

    /// The run's failure as its trainers are told it, by where it came from: input that
    /// cannot be read or replayed is FAILED_PRECONDITION (retrying will not help until it
    /// is mended), a lost process of the cluster UNAVAILABLE (restart it, then resume), and
    /// anything else INTERNAL.
    pub fn failure_status(&self) -> Option<ServeError> {
        use crate::error::origin;
        let Some(failure) = self.failure() else {
            let why = self.input_failed.get()?;
            return Some(ServeError::FailedPrecondition(format!(
                "pipeline failed: input: {why}"
            )));
        };
        let text = format!("pipeline failed: {failure}");
        Some(match self.errors.origin().as_deref() {
            // Out of file descriptors or memory while reading: the input is fine, and a
            // new run (the trainer's retry) can read it once the server has them again.
            Some(origin::INPUT | origin::SOURCE) if out_of_resources(&failure) => {
                ServeError::Unavailable(format!(
                    "{text} (the server ran short of file descriptors or memory: retry)"
                ))
            }
            Some(origin::INPUT | origin::SOURCE) => ServeError::FailedPrecondition(text),
            Some(origin::CLUSTER) => ServeError::Unavailable(text),
            _ => ServeError::Internal(text),
        })
    }

    pub fn serves(&self, rank: usize) -> bool {
        self.queues.get(rank).is_some_and(Option::is_some)
    }

    /// The end of the ranks the run has slots for.
    pub fn ranks(&self) -> usize {
        self.slots.len()
    }

    /// Rank `rank`'s slot; `rank` must be below the run's ranks' end.
    pub fn slot(&self, rank: usize) -> MutexGuard<'_, Slot> {
        lock(&self.slots[rank])
    }

    /// Attaches a consumer to `rank` from `start_step`, superseding the current one, if
    /// the run still holds that step (sent and kept, pending, or still to come).
    pub fn attach(&self, rank: usize, start_step: u64, reading: bool) -> Option<Attached> {
        self.attach_when(rank, start_step, reading, |_| true)
    }

    /// Attaches a drain to `rank` if no consumer holds it (no trainer has come, or the
    /// last one went away) and it has batches still to come, so that its batches are let
    /// go; a trainer that asks for the rank later catches up on a run of its own.
    pub fn drain_if_unread(&self, rank: usize) -> Option<Attached> {
        self.attach_when(rank, u64::MAX, false, |s| {
            s.holder.is_none() && !s.exhausted
        })
    }

    /// [`Run::attach`] if `free` holds for the slot, checked under its lock.
    fn attach_when(
        &self,
        rank: usize,
        start_step: u64,
        reading: bool,
        free: impl Fn(&Slot) -> bool,
    ) -> Option<Attached> {
        let queue = self.queues.get(rank)?.clone()?;
        let mut slot = self.slot(rank);
        if !free(&slot) {
            return None;
        }
        let oldest = slot
            .sent
            .front()
            .or(slot.pending.front())
            .map_or(slot.next_step, |b| b.meta.step);
        if start_step < oldest {
            return None;
        }
        slot.supersede();
        let cancel = CancellationToken::new();
        slot.holder = Some(cancel.clone());
        slot.reading = reading;
        slot.taken_at = Instant::now();
        let replay = slot
            .sent
            .iter()
            .filter(|b| b.meta.step >= start_step)
            .cloned()
            .collect();
        Some(Attached {
            generation: slot.generation,
            cancel,
            queue,
            replay,
        })
    }

    /// The step `rank`'s queue (or what a superseded consumer left) yields next.
    pub fn next_step(&self, rank: usize) -> u64 {
        let slot = self.slot(rank);
        slot.pending.front().map_or(slot.next_step, |b| b.meta.step)
    }

    /// Ends the stream that reads `rank`, if one does (a drain stays). Returns whether
    /// the rank is now without a consumer.
    pub fn supersede_reader(&self, rank: usize) -> bool {
        if !self.serves(rank) {
            return false;
        }
        let mut slot = self.slot(rank);
        if slot.reading {
            slot.supersede();
        }
        slot.holder.is_none() && !slot.exhausted
    }

    /// Ends the trainer's stream that reads `rank` if it has taken no batch for `stalled`
    /// while the rank's queue is full, so that it holds the dataflow (and with it every
    /// later epoch) back; returns whether it did. Its trainer is told why, and can resume
    /// on a run of its own.
    pub fn end_stalled_reader(&self, rank: usize, stalled: Duration) -> bool {
        let Some(Some(queue)) = self.queues.get(rank) else {
            return false;
        };
        let full = queue.try_lock().is_ok_and(|q| q.capacity() == 0);
        let mut slot = self.slot(rank);
        if !full || !slot.reading || slot.exhausted || slot.taken_at.elapsed() < stalled {
            return false;
        }
        lock(&self.stalled).push((rank, slot.generation));
        slot.supersede();
        true
    }

    /// Whether consumer `generation` of `rank` was ended by [`Run::end_stalled_reader`].
    pub fn ended_stalled(&self, rank: usize, generation: u64) -> bool {
        lock(&self.stalled).contains(&(rank, generation))
    }

    /// Marks consumer `generation` of `rank` gone, if it is still the current one.
    pub fn detach(&self, rank: usize, generation: u64) {
        let mut slot = self.slot(rank);
        if slot.generation == generation {
            slot.holder = None;
            slot.reading = false;
            slot.idle_since = Instant::now();
        }
    }

    /// Records `rb` as taken from the queue and keeps it for replay; returns it if it is at
    /// or past `start_step`, `None` if the consumer skips it.
    pub fn deliver(&self, slot: &mut Slot, rb: RankBatch, start_step: u64) -> Option<RankBatch> {
        slot.next_step = slot.next_step.max(rb.meta.step + 1);
        slot.taken_at = Instant::now();
        // The epoch's last step: nothing more will come for this rank.
        slot.exhausted |= self.steps == Some(slot.next_step);
        // A step skipped by a consumer that started past it is kept as a sent one is: a
        // stray reader of a later step must not take earlier ones from the trainer that
        // asks for them next (pushed input has them nowhere else). What is kept then runs
        // without a gap up to `next_step`.
        slot.sent_bytes += batch_bytes(rb.data());
        slot.sent.push_back(rb.clone());
        while slot.sent_bytes > self.replay_bytes && slot.sent.len() > 1 {
            if let Some(old) = slot.sent.pop_front() {
                slot.sent_bytes -= batch_bytes(old.data());
            }
        }
        (rb.meta.step >= start_step).then_some(rb)
    }

    /// Every served rank's queue has ended: nothing more can be sent from this run.
    pub fn exhausted(&self) -> bool {
        (0..self.slots.len())
            .filter(|&r| self.serves(r))
            .all(|r| self.slot(r).exhausted)
    }

    /// No stream has read any rank for `timeout`. A run made ahead of its trainers that
    /// none has reached yet is not idle (a cluster's next epoch during an epoch longer
    /// than the timeout, or the first epoch before the trainers start): it holds no more
    /// than its queues.
    pub fn idle_for(&self, timeout: Duration) -> bool {
        !self.untouched()
            && self.slots.iter().all(|s| {
                let s = lock(s);
                !s.reading && s.idle_since.elapsed() >= timeout
            })
    }

    /// Ends every consumer and the dataflow (the run is being forgotten).
    pub fn close(&self) {
        self.stop.cancel();
        for slot in &self.slots {
            lock(slot).supersede();
        }
    }

    /// Whether a trainer's stream reads some rank.
    pub fn read(&self) -> bool {
        self.slots.iter().any(|s| lock(s).reading)
    }

    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "epoch": self.epoch,
            "first_step": self.first_step,
            "only_rank": self.only,
            "done": self.ended.is_cancelled(),
            "ranks": (0..self.slots.len()).filter(|&r| self.serves(r)).map(|r| {
                let slot = self.slot(r);
                serde_json::json!({
                    "rank": r,
                    "connected": slot.reading,
                    "next_step": slot.next_step,
                    "finished": slot.exhausted,
                })
            }).collect::<Vec<_>>(),
        })
    }
}

/// Whether `failure` says an OS call ran out of file descriptors or memory (std's
/// `io::Error` ends its text with `(os error N)`; by then the error has been made text by
/// the Parquet and Arrow readers it came through).
pub(super) fn out_of_resources(failure: &str) -> bool {
    [libc::EMFILE, libc::ENFILE, libc::ENOMEM]
        .iter()
        .any(|code| failure.contains(&format!("(os error {code})")))
}

impl Drop for Run {
    fn drop(&mut self) {
        self.stop.cancel();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(crate::recycle::release_freed_memory)),
            Err(_) => crate::recycle::release_freed_memory(),
        }
    }
}

impl Slot {
    /// Ends the current consumer: a newer one (or none) takes its place.
    fn supersede(&mut self) {
        self.generation += 1;
        if let Some(old) = self.holder.take() {
            old.cancel();
        }
        if self.reading {
            self.reading = false;
            self.idle_since = Instant::now();
        }
    }
}
