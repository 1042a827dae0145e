//! A consumer of one rank of a [`Run`], as an async stream: the batches kept for replay
//! from its start step, then what a superseded consumer left, then the queue. Nothing
//! blocks: waiting for the queue (or for the consumer before it to let go) is a pending
//! poll, and a newer consumer of the rank wakes it to end with ABORTED.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hydrant_flight::{BatchMeta, RankStream, ServeError, batch_bytes};

use super::fresh::Freshness;
use super::run::{Attached, Run, lock};
use crate::delivery::RankBatch;
use crate::runtime::Signals;

/// How long a trainer's stream waits for its next batch, by default (`--absent-after`),
/// before the ranks no one reads are let go ([`let_unread_go`]): long
/// enough for trainers that start a little apart, short enough that reading one rank alone
/// is not a hang.
pub(super) const ABSENT_AFTER: Duration = Duration::from_secs(3);

/// How long a stream whose cluster-fed queue ended short waits for the failure behind it
/// to be recorded (see [`Run::failure_may_follow`]); a lost peer is recorded within a
/// second of the queues' end.
const FAILURE_SETTLES: Duration = Duration::from_secs(2);

/// The runs a pipeline keeps; a consumer that takes a run's last batch removes it.
pub(super) type Runs = Mutex<Vec<Arc<Run>>>;

/// When a waiting stream lets go of the ranks no one reads, and whom else it tells.
#[derive(Clone)]
pub(super) struct LetGo {
    /// How long it waits for a batch first (and between looks).
    pub after: Duration,
    /// The other processes of a serving cluster, told the epoch it waits on: the rank
    /// that holds it back may be theirs.
    pub peers: Option<Signals>,
}

/// Drains the ranks that no stream reads of every shared run of file input in `runs` of
/// `epoch` or before, since a trainer (`waiter`, for the log) waits for its next step of
/// `epoch` and may be waiting on a rank whose queue is full because no one reads it (one
/// rank read alone, a trainer that has not come, or one that went away). Runs of earlier
/// epochs too: the rank holding the dataflow back may be a step behind, in an epoch the
/// waiting trainer has finished. Only file input: a rank that comes later catches up on
/// a run of its own, which pushed rows cannot.
pub(super) fn let_unread_go(runs: &Weak<Runs>, epoch: u64, waiter: &str) {
    for run in shared_runs(runs, |e| e <= epoch) {
        for rank in 0..run.ranks() {
            if let Some(attached) = run.drain_if_unread(rank) {
                hydrant_operators::log_line!(
                    "hydrant: rank {rank} of epoch {} has had no reader while {waiter}: its \
                     batches are let go (it catches up on a run of its own when it is read)",
                    run.epoch
                );
                // A drain never waits for a batch long enough to let anything go.
                let drain = LetGo {
                    after: ABSENT_AFTER,
                    peers: None,
                };
                Consumer::new(
                    run.clone(),
                    runs.clone(),
                    rank,
                    u64::MAX,
                    attached,
                    None,
                    drain,
                )
                .drain();
            }
        }
    }
}

/// The shared runs of file input in `runs` (not a rank's catch-up run, nor pushed input)
/// whose epoch `of` takes.
fn shared_runs(runs: &Weak<Runs>, of: impl Fn(u64) -> bool) -> Vec<Arc<Run>> {
    let Some(all) = runs.upgrade() else {
        return Vec::new();
    };
    lock(&all)
        .iter()
        .filter(|r| r.only.is_none() && r.steps.is_some() && of(r.epoch))
        .cloned()
        .collect()
}

/// Ends the streams of shared runs of epochs before `epoch` that have taken no batch for
/// `stalled` while their rank's queue is full (a stale trainer that holds its connection
/// but does not read): one dataflow feeds an epoch's run after the one before, so such a
/// stream holds every later epoch back, whoever reads it (`waiter`, for the log). Its
/// trainer can resume on a run of its own. A trainer reading the same epoch is waited for,
/// as all-reduce would.
fn end_stalled_readers(runs: &Weak<Runs>, epoch: u64, stalled: Duration, waiter: &str) {
    for run in shared_runs(runs, |e| e < epoch) {
        for rank in 0..run.ranks() {
            if run.end_stalled_reader(rank, stalled) {
                hydrant_operators::log_line!(
                    "hydrant: rank {rank} of epoch {} took no batch for {} s while {waiter} \
                     on epoch {epoch}: its stream is ended (it resumes on a run of its own)",
                    run.epoch,
                    stalled.as_secs()
                );
            }
        }
    }
}

pub(super) struct Consumer {
    run: Arc<Run>,
    runs: Weak<Runs>,
    rank: usize,
    /// `rank` as the metrics' label, made once rather than per batch.
    label: String,
    start_step: u64,
    attached: Attached,
    /// Set once the stream has ended (with its last batch or an error).
    ended: bool,
    /// The next step this stream owes its reader.
    next: u64,
    /// A stream's freshness, told of each delivered batch.
    fresh: Option<Arc<Freshness>>,
    /// When, while it waits for a batch, the ranks no one reads are let go.
    let_go: LetGo,
}

impl Consumer {
    pub fn new(
        run: Arc<Run>,
        runs: Weak<Runs>,
        rank: usize,
        start_step: u64,
        attached: Attached,
        fresh: Option<Arc<Freshness>>,
        let_go: LetGo,
    ) -> Self {
        Consumer {
            run,
            runs,
            rank,
            label: rank.to_string(),
            start_step,
            attached,
            ended: false,
            next: start_step,
            fresh,
            let_go,
        }
    }

    /// The stream a DoGet sends.
    pub fn into_stream(self) -> RankStream {
        futures::stream::unfold(self, |mut c| async move {
            let item = c.next().await?;
            Some((item, c))
        })
        .boxed()
    }

    /// Takes the rank's queue until it ends or a newer consumer comes, sending nothing
    /// (so that a rank read elsewhere does not hold the other ranks back).
    pub fn drain(mut self) {
        tokio::spawn(async move {
            self.start_step = u64::MAX;
            while let Some(Ok(_)) = self.next_batch().await {}
        });
    }

    /// Lets go of the ranks no one reads that may hold this stream's shared run back,
    /// here and, on a serving cluster, on the other processes (off this task: a socket
    /// write each).
    fn let_unread_ranks_go(&self) {
        if self.run.only.is_some() {
            return;
        }
        let epoch = self.run.epoch;
        let waiter = format!(
            "rank {} waited {} s",
            self.rank,
            self.let_go.after.as_secs()
        );
        end_stalled_readers(&self.runs, epoch, self.let_go.after, &waiter);
        let_unread_go(&self.runs, epoch, &waiter);
        if let Some(peers) = self.let_go.peers.clone() {
            drop(tokio::task::spawn_blocking(move || peers.send(epoch)));
        }
    }

    fn superseded(&self) -> ServeError {
        if self.run.ended_stalled(self.rank, self.attached.generation) {
            return ServeError::Aborted(format!(
                "rank {} of epoch {} took no batch for {} s while a trainer of a later epoch \
                 waited behind it: reconnect with start_step {} (a run of its own)",
                self.rank,
                self.run.epoch,
                self.let_go.after.as_secs(),
                self.next
            ));
        }
        ServeError::Aborted(format!(
            "superseded by a newer reader for rank {}",
            self.rank
        ))
    }

    /// A batch a superseded consumer left, if any; an error if this one was superseded.
    fn take_pending(&self) -> Result<Option<RankBatch>, ServeError> {
        let mut slot = self.run.slot(self.rank);
        if slot.generation != self.attached.generation {
            return Err(self.superseded());
        }
        while let Some(rb) = slot.pending.pop_front() {
            if let Some(rb) = self.run.deliver(&mut slot, rb, self.start_step) {
                return Ok(Some(rb));
            }
        }
        Ok(None)
    }

    /// The next batch to send; `None` once the run has sent its last.
    async fn next_batch(&mut self) -> Option<Result<RankBatch, ServeError>> {
        if let Some(rb) = self.attached.replay.pop_front() {
            return Some(Ok(rb));
        }
        let cancel = self.attached.cancel.clone();
        let broken = self.run.broken.clone();
        loop {
            if let Some(rb) = self.take_pending().transpose() {
                return Some(rb);
            }
            // One consumer receives at a time; the one before may still hold the queue
            // for a moment after it was superseded.
            let mut queue = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Some(Err(self.superseded())),
                q = self.attached.queue.clone().lock_owned() => q,
            };
            if let Some(rb) = self.take_pending().transpose() {
                return Some(rb);
            }
            let waited = Instant::now();
            let absent = self.start_step != u64::MAX && self.run.steps.is_some();
            let got = loop {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Some(Err(self.superseded())),
                    got = queue.recv() => break got,
                    // What was queued before the run failed still goes; then the failure.
                    _ = broken.cancelled() => break queue.try_recv().ok(),
                    // Looked at again every `absent_after` while this stream waits: a rank
                    // whose trainer goes away later (killed mid-epoch) is let go then.
                    _ = tokio::time::sleep(self.let_go.after), if absent => {
                        self.let_unread_ranks_go();
                    }
                }
            };
            metrics::histogram!(crate::metrics::RANK_STALL_SECONDS, "rank" => self.label.clone())
                .record(waited.elapsed().as_secs_f64());
            metrics::gauge!(crate::metrics::RANK_QUEUE_DEPTH, "rank" => self.label.clone())
                .set(queue.len() as f64);
            let mut slot = self.run.slot(self.rank);
            match got {
                // Superseded between the wait and now: the batch goes to the next one.
                Some(rb) if slot.generation != self.attached.generation => {
                    slot.pending.push_back(rb);
                    return Some(Err(self.superseded()));
                }
                Some(rb) => {
                    let delivered = self.run.deliver(&mut slot, rb, self.start_step);
                    if slot.exhausted {
                        drop(slot);
                        self.release_if_exhausted();
                    }
                    if let Some(rb) = delivered {
                        return Some(Ok(rb));
                    }
                }
                None => {
                    // The run ended: all sent, or failed.
                    slot.exhausted = true;
                    let superseded = slot.generation != self.attached.generation;
                    drop(slot);
                    self.release_if_exhausted();
                    if superseded {
                        return Some(Err(self.superseded()));
                    }
                    // A rank that has its whole epoch ends cleanly, whatever became of the
                    // run after (another rank's worker failing, say).
                    if self.run.steps.is_some_and(|n| self.next >= n) {
                        return None;
                    }
                    break;
                }
            }
        }
        // The queue ended short. A cluster's workers may drop the queues a moment before
        // the failure that ended them is recorded: waited for, so that the trainer is told
        // it (a lost peer), not only where to resume.
        if self.run.failure_may_follow() {
            let broken = self.run.broken.cancelled();
            let _ = tokio::time::timeout(FAILURE_SETTLES, broken).await;
        }
        self.run.failure_status().map(Err)
    }

    /// Forgets the run once nothing more can come from it. Pushed input's one run is kept:
    /// a rank that reconnects after its end gets a clean end, not an error.
    fn release_if_exhausted(&self) {
        if let Some(runs) = self.runs.upgrade()
            && self.run.steps.is_some()
            && self.run.exhausted()
        {
            lock(&runs).retain(|r| !Arc::ptr_eq(r, &self.run));
        }
    }

    /// The next item of the stream; a stream of a known-length epoch never ends cleanly
    /// before its last step (it ends with an error saying where to resume instead).
    async fn next(&mut self) -> Option<Result<(BatchMeta, arrow::array::RecordBatch), ServeError>> {
        if self.ended {
            return None;
        }
        let steps = self.run.steps;
        match self.next_batch().await {
            // Steps come in order from `start_step`; a gap would be rows lost unseen.
            Some(Ok(rb)) if rb.meta.step != self.next => {
                self.ended = true;
                Some(Err(ServeError::Internal(format!(
                    "rank {}'s stream skipped from step {} to {}; reconnect with start_step {}",
                    self.rank, self.next, rb.meta.step, self.next
                ))))
            }
            Some(Ok(rb)) => {
                self.next = rb.meta.step + 1;
                metrics::counter!(crate::metrics::RANK_BATCHES, "rank" => self.label.clone())
                    .increment(1);
                metrics::counter!(crate::metrics::RANK_BYTES, "rank" => self.label.clone())
                    .increment(batch_bytes(rb.data()) as u64);
                if let (Some(fresh), Some([_, end])) = (&self.fresh, rb.meta.positions) {
                    fresh.delivered(end);
                }
                let mut meta = meta(&rb);
                meta.last = steps == Some(self.next);
                Some(Ok((meta, rb.batch.data)))
            }
            Some(Err(e)) => {
                self.ended = true;
                Some(Err(e))
            }
            None => {
                self.ended = true;
                let steps = steps.filter(|&n| self.next < n && self.start_step < n)?;
                Some(Err(ServeError::Internal(format!(
                    "rank {}'s stream ended at step {} of {steps}; reconnect with start_step {}",
                    self.rank, self.next, self.next
                ))))
            }
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.run.detach(self.rank, self.attached.generation);
    }
}

fn meta(rb: &RankBatch) -> BatchMeta {
    BatchMeta {
        epoch: rb.meta.epoch,
        step: rb.meta.step,
        rank: rb.meta.rank as u32,
        rows: rb.data().num_rows() as u64,
        padded_rows: rb.meta.padded_rows as u64,
        state_version: rb.meta.state_version,
        positions: rb.meta.positions,
        last: false,
        // Stamped by the encoder, for every stream of the pipeline.
        job: None,
    }
}
