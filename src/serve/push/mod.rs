//! Pushed input: batches pushed by producers (DoPut) or read from a followed folder,
//! admitted in order behind one lock — checked and featurized (`featurize.rs`), made
//! durable in the spool, and handed to the dataflow that places them — so a batch that
//! would break the ranks' streams is refused whole, before it is acknowledged, and never
//! affects the batches before it. Commits and the spool's replay are in `durable.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use arrow::array::RecordBatch;
use hydrant_flight::{Accepted, Origin, ServeError};

use super::fresh::Freshness;
use super::refresh::{Checked, Known, Refresh};
use super::run::lock;
use super::spool::{Committer, Record, Spool};
use super::stream::Runs;
use crate::delivery::Placement;
use crate::runtime::{PushedRows, StepsCut};

mod durable;
mod featurize;

pub use featurize::PushFeaturizer;
use featurize::featurize_pieces;

/// Pushed input: its state behind one lock (rows keep the order they were accepted in, and
/// a full rank queue holds every producer back), and counts `status` reads without it.
pub(super) struct Pushed {
    state: Mutex<Ingest>,
    /// Each named producer's highest admitted `seq`: written under `state`, read by
    /// commits without it (a producer may hold `state` while it waits for queue space).
    admitted: Mutex<HashMap<String, u64>>,
    /// Commits, made without `state` for the same reason.
    commits: Mutex<Commits>,
    /// How rows are placed (where a committed step's rows start).
    placement: Placement,
    /// Rows come from a followed folder, not from producers.
    followed: AtomicBool,
    /// Signalled when the replay of the spool is over.
    replayed: Condvar,
    /// How long admitted rows take to reach trainers.
    pub fresh: Arc<Freshness>,
    /// The state versions a refreshed stream made.
    pub known: Option<Arc<Mutex<Known>>>,
    /// What `status` reports, readable while a producer holds the lock (it may wait there
    /// for queue space as long as no trainer reads: `status` must not).
    pub counts: PushCounts,
    /// The state directory, held as long as anything may write to it (the spool's replay,
    /// a follower, a DoPut under way hold this too).
    claim: Mutex<Option<super::spool::Claim>>,
}

/// How batches are featurized, spooled and cut as they arrive.
pub(super) struct Ingest {
    pub featurizer: PushFeaturizer,
    /// Where featurized rows go: the dataflow that places and assembles them into the
    /// ranks' queues; `None` once the input is ended (or failed).
    pub rows_out: Option<PushedRows>,
    pub next_row: u64,
    pub seq: u64,
    pub dropped: u64,
    /// Where admitted batches are made durable (with `--state-dir`).
    pub spool: Option<Spool>,
    /// The spool is being admitted again (after a restart): pushes wait.
    pub replaying: bool,
    /// Rows before this stream position are not delivered again (a commit's row).
    pub skip_below: u64,
    /// Why the spool could not be admitted again: nothing more is taken on top of it.
    pub replay_failed: Option<String>,
    /// The rows the last commit saw admitted ([`Commit::rows_in`]), which the spool's
    /// replay must reach, and the batches they came in ([`Commit::batches_in`]).
    pub committed_in: Option<(u64, Option<u64>)>,
    /// Where the run's streams learn that the input failed ([`Run::input_failed`]). Not the
    /// run's error slot: the dataflow would stop at once, and the complete steps it holds
    /// would be lost with it.
    ///
    /// [`Run::input_failed`]: super::run::Run::input_failed
    pub input_failed: Arc<std::sync::OnceLock<String>>,
    /// Makes the end durable where there is no spool (a followed folder's manifest):
    /// called with the rows admitted before the input ends.
    pub end_record: Option<EndRecord>,
    /// Statistics refreshed as rows arrive (`[stats] mode = "refresh"`).
    pub refresh: Option<Refresh>,
}

impl Ingest {
    /// Hands featurized rows, each piece with its state version, to the dataflow that
    /// delivers them (waiting while the ranks are behind); nothing once the input ended.
    fn deliver(&mut self, featurized: Vec<(RecordBatch, u64)>) -> Result<(), ServeError> {
        if let Some(out) = &mut self.rows_out {
            for (batch, version) in featurized {
                out.push_as(batch, version).map_err(internal)?;
            }
        }
        Ok(())
    }
}

/// Records durably that the input ends after the rows given.
pub(super) type EndRecord = Box<dyn FnMut(u64) -> crate::Result<()> + Send>;

/// What `status` reports of pushed input.
#[derive(Default)]
pub(super) struct PushCounts {
    pub dropped: AtomicU64,
    pub ended: AtomicBool,
    /// The server is shutting down: an admission that fails from here on fails because
    /// its streams are being closed, not because of the input.
    pub closing: AtomicBool,
    pub duplicates: AtomicU64,
    pub replayed: AtomicU64,
    /// Whether admitted batches are spooled (`--state-dir`).
    pub durable: AtomicBool,
    /// The last committed step, plus one (0: none yet).
    pub committed: AtomicU64,
    /// Rows and batches admitted, stored together so that a commit reads a pair that
    /// was true at once (it takes no lock a producer holds).
    pub admitted: Mutex<(u64, u64)>,
    /// Rows the last commit saw admitted (durable), with the batches they came in: a
    /// commit made while the spool is replayed records no fewer, or a segment cut short
    /// later would go unnoticed.
    pub committed_in: Mutex<(u64, Option<u64>)>,
    /// Spool segments on disk.
    pub segments: AtomicU64,
    /// Steps every rank has been given (kept by the dataflow).
    pub steps_cut: StepsCut,
    /// The first stream row refreshed statistics still count (a commit keeps the input
    /// from there on); `u64::MAX` when nothing is refreshed.
    pub counts_from: AtomicU64,
    /// Why replaying the spool stopped, if it did.
    replay_failed: Mutex<Option<String>>,
}

/// What commits need: where they are made durable, and the last one.
#[derive(Default)]
struct Commits {
    committer: Option<Committer>,
    last: Option<u64>,
}

impl Pushed {
    /// Pushed input cut by `ingest`, placed by `placement`; `event_time` names the column
    /// of its rows' event times, if the pipeline has one.
    pub fn new(ingest: Ingest, placement: Placement, event_time: Option<String>) -> Self {
        let counts = PushCounts::default();
        let counts_from = ingest
            .refresh
            .as_ref()
            .map_or(u64::MAX, |r| r.counts_from());
        counts.counts_from.store(counts_from, Ordering::Relaxed);
        Pushed {
            known: ingest.refresh.as_ref().map(|r| r.known.clone()),
            fresh: Arc::new(Freshness::new(event_time)),
            state: Mutex::new(ingest),
            admitted: Mutex::default(),
            commits: Mutex::default(),
            placement,
            followed: AtomicBool::new(false),
            replayed: Condvar::new(),
            counts,
            claim: Mutex::default(),
        }
    }

    /// Holds `claim` on the state directory for as long as this input lives.
    pub fn hold(&self, claim: super::spool::Claim) {
        *lock(&self.claim) = Some(claim);
    }

    /// The state, once no replay is running.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Ingest> {
        self.replayed
            .wait_while(lock(&self.state), |st| st.replaying)
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a producer may push now: not to a stream that follows a folder.
    pub fn takes_pushes(&self) -> Result<(), ServeError> {
        match self.followed.load(Ordering::Relaxed) {
            true => Err(ServeError::FailedPrecondition(
                "this pipeline follows a folder; it takes no pushed input".into(),
            )),
            false => Ok(()),
        }
    }

    /// Admits a pushed batch: checked and featurized, made durable (with a spool), cut
    /// and handed to the ranks' queues (waiting while they are full). A batch its
    /// producer had admitted already is acknowledged again, not admitted twice.
    pub fn accept(
        &self,
        batch: RecordBatch,
        origin: Option<Origin>,
    ) -> Result<Accepted, ServeError> {
        self.takes_pushes()?;
        let arrived = Arrival {
            at: Instant::now(),
            unit: true,
        };
        let mut guard = self.lock();
        self.admit(&mut guard, batch, origin, Some(arrived))
    }

    /// Admits a batch of a followed folder's file, whose admission began `at` (`first`:
    /// the file's first batch).
    pub fn admit_followed(
        &self,
        batch: RecordBatch,
        at: Instant,
        first: bool,
    ) -> Result<(), ServeError> {
        let arrived = Arrival { at, unit: first };
        let mut guard = self.lock();
        self.admit(&mut guard, batch, None, Some(arrived))
            .map(|_| ())
    }

    /// Rows come from a followed folder: producers are refused.
    pub fn follow_only(&self) {
        self.followed.store(true, Ordering::Relaxed);
    }

    /// The stream row the next admitted row takes.
    pub fn next_row(&self) -> u64 {
        self.lock().next_row
    }

    /// Makes the next admitted row take stream row `row` (a followed folder replayed from
    /// a commit starts past 0).
    pub fn set_next_row(&self, row: u64) {
        self.lock().next_row = row;
    }

    /// Takes no more input, saying why (the input could not be made durable, or admitted
    /// again after a restart).
    pub fn fail(&self, why: String) {
        let why = self.told(&why);
        let mut st = self.lock();
        fail_locked(&mut st, &self.counts, why);
    }

    /// `why` as clients are told it: the state directory named as `--state-dir`, not by
    /// the server's path.
    fn told(&self, why: &str) -> String {
        match lock(&self.claim).as_ref() {
            Some(claim) => why.replace(&*claim.dir().to_string_lossy(), "--state-dir"),
            None => why.to_string(),
        }
    }

    /// Admits `batch`: a producer's push or a followed file's rows (`live`, arrived as
    /// it says), or a record read back from the spool (neither spooled again nor checked
    /// for duplicates: it was admitted once).
    fn admit(
        &self,
        st: &mut Ingest,
        batch: RecordBatch,
        origin: Option<Origin>,
        live: Option<Arrival>,
    ) -> Result<Accepted, ServeError> {
        let arrived = live.unwrap_or(Arrival {
            at: Instant::now(),
            unit: true,
        });
        let live = live.is_some();
        let rows = batch.num_rows() as u64;
        if let Some(e) = &st.replay_failed {
            return Err(ServeError::FailedPrecondition(format!(
                "the input failed, so no more is taken: {e}"
            )));
        }
        if live
            && let Some(o) = &origin
            && lock(&self.admitted)
                .get(&o.producer)
                .is_some_and(|&seq| o.seq <= seq)
        {
            self.counts.duplicates.fetch_add(1, Ordering::Relaxed);
            return Ok(Accepted {
                seq: None,
                rows,
                duplicate: true,
            });
        }
        if st.rows_out.is_none() {
            return Err(ServeError::FailedPrecondition(
                "the pushed input was ended (end_ingest)".into(),
            ));
        }
        if live && let Some(o) = &origin {
            let admitted = lock(&self.admitted);
            if admitted.len() >= MAX_PRODUCERS && !admitted.contains_key(&o.producer) {
                return Err(ServeError::ResourceExhausted(format!(
                    "the stream has taken batches from {MAX_PRODUCERS} producers, the most whose \
                     sequence numbers it keeps: a producer is a process that pushes, and names \
                     every batch it pushes the same"
                )));
            }
        }
        // Rows before a commit's row (replayed from its segment) are not delivered again.
        let skip = st.skip_below.saturating_sub(st.next_row).min(rows) as usize;
        let rejected = |_: &ServeError| {
            metrics::counter!(crate::metrics::PUSH_REJECTED, "reason" => "invalid").increment(1)
        };
        let newest = self
            .fresh
            .newest_event(&batch)
            .map_err(ServeError::InvalidArgument)
            .inspect_err(rejected)?;
        // Refreshed statistics count a batch only once it is spooled: one refused for a
        // full disk changes nothing (the batch sent in its place may hold other rows).
        let ready = match &mut st.refresh {
            // Rows wholly before the commit's row go nowhere: nothing to featurize.
            None if rows == 0 || skip < rows as usize => {
                let featurized = st.featurizer.featurize(batch.clone(), st.next_row);
                let featurized = featurized.inspect_err(rejected)?;
                let version = st.featurizer.state_version();
                Ok(vec![(
                    featurized.slice(skip, rows as usize - skip),
                    version,
                )])
            }
            None => Ok(Vec::new()),
            Some(refresh) => {
                // Checked before its rows are counted: a refused batch changes nothing.
                st.featurizer
                    .check(&batch, st.next_row)
                    .inspect_err(rejected)?;
                // A batch whose values the first version could not be fitted with.
                let checked = refresh.check(&batch, st.next_row).inspect_err(|e| {
                    if matches!(e, ServeError::InvalidArgument(_)) {
                        rejected(e)
                    }
                })?;
                Err(checked)
            }
        };
        if live && let Some(spool) = &mut st.spool {
            // Synced before the rows go anywhere: an acknowledged batch is on disk.
            spool
                .append(&Record::Batch(origin.clone(), batch.clone()), st.next_row)
                .map_err(spool_error)?;
            let segments = spool.segments() as u64;
            self.counts.segments.store(segments, Ordering::Relaxed);
        }
        // Admitted once spooled: known before any of its rows can be committed.
        if let Some(o) = origin {
            let mut admitted = lock(&self.admitted);
            let seq = admitted.entry(o.producer).or_insert(o.seq);
            *seq = (*seq).max(o.seq);
        }
        // The batch is admitted: a failure from here on leaves it on disk but not in the
        // stream, so no more is taken (a restart replays it).
        let taken = self.deliver(st, &batch, ready, skip, arrived, newest);
        if let Err(e) = &taken {
            fail_locked(
                st,
                &self.counts,
                format!("an admitted batch was not taken: {e}"),
            );
        }
        taken?;
        st.next_row += rows;
        st.seq += 1;
        *lock(&self.counts.admitted) = (st.next_row, st.seq);
        metrics::counter!(crate::metrics::ADMITTED_ROWS).increment(rows);
        Ok(Accepted {
            seq: Some(st.seq - 1),
            rows,
            duplicate: false,
        })
    }

    /// Counts an admitted batch into refreshed statistics (`ready` is what their check
    /// found), featurizes it where that waited for the count, and delivers its rows.
    fn deliver(
        &self,
        st: &mut Ingest,
        batch: &RecordBatch,
        ready: Result<Vec<(RecordBatch, u64)>, Checked>,
        skip: usize,
        arrived: Arrival,
        newest: Option<i64>,
    ) -> Result<(), ServeError> {
        let featurized = match ready {
            Ok(featurized) => featurized,
            Err(checked) => {
                let refresh = st
                    .refresh
                    .as_mut()
                    .expect("checked by refreshed statistics");
                let pieces = refresh.take(batch, checked, st.skip_below)?;
                let counts_from = refresh.counts_from();
                self.counts
                    .counts_from
                    .store(counts_from, Ordering::Relaxed);
                featurize_pieces(&mut st.featurizer, pieces, st.next_row)?
            }
        };
        if !featurized.is_empty() {
            // Known before any of its rows can be delivered.
            let first = st.next_row + skip as u64;
            self.fresh.admitted(first, arrived.at, arrived.unit, newest);
            st.deliver(featurized)?;
        }
        Ok(())
    }

    /// Ends the input: the last step is padded (or dropped) and every rank's stream ends.
    pub fn end(&self, runs: &Runs) -> Result<(), ServeError> {
        let mut guard = self.lock();
        self.end_locked(&mut guard, runs, true)
    }

    /// Ends the input again after a restart, where it was recorded as ended.
    pub fn end_replayed(&self, runs: &Runs) -> Result<(), ServeError> {
        let mut guard = self.lock();
        self.end_locked(&mut guard, runs, false)
    }

    fn end_locked(&self, st: &mut Ingest, runs: &Runs, durable: bool) -> Result<(), ServeError> {
        // An input that failed is not ended: its end would be recorded at a row the
        // trainers may be past, and a restart would serve a shorter stream as complete.
        if let Some(why) = &st.replay_failed {
            return Err(ServeError::FailedPrecondition(format!(
                "the input failed, so it cannot be ended: {why}"
            )));
        }
        if st.rows_out.is_none() {
            return Ok(()); // ended already
        }
        if durable && let Some(spool) = &mut st.spool {
            spool
                .append(&Record::End, st.next_row)
                .map_err(spool_error)?;
        }
        if durable && let Some(record) = &mut st.end_record {
            // A full disk is RESOURCE_EXHAUSTED: the end can be asked again once there
            // is room (nothing was ended).
            record(st.next_row).map_err(spool_error)?;
        }
        if let Some(refresh) = &mut st.refresh {
            // Input shorter than the warmup: the first version is fitted on what came.
            let pieces = refresh.finish(st.skip_below)?;
            let featurized = featurize_pieces(&mut st.featurizer, pieces, st.next_row)?;
            st.deliver(featurized)?;
        }
        let mut out = st.rows_out.take();
        st.dropped = match out.as_mut().map_or(Ok(0), PushedRows::end) {
            Ok(dropped) => dropped,
            // The dataflow is gone: the input cannot be ended, and says why from now on
            // (to a follower too, which would otherwise take it for still open).
            Err(e) => {
                let e = internal(e);
                fail_locked(st, &self.counts, e.to_string());
                return Err(e);
            }
        };
        self.counts.dropped.store(st.dropped, Ordering::Relaxed);
        // Released: a commit that sees the end sees every row admitted before it.
        self.counts.ended.store(true, Ordering::Release);
        for run in lock(runs).iter() {
            run.ended.cancel();
        }
        Ok(())
    }

    /// Keeps refreshed statistics' versions in `dir` and takes up what an earlier server
    /// kept there (see [`Refresh::keep_in`]); nothing without `[stats]` refresh.
    pub fn keep_versions(
        &self,
        dir: &std::path::Path,
        deliver_from: u64,
        replay_from: u64,
    ) -> crate::Result<()> {
        let mut st = lock(&self.state);
        if let Some(refresh) = &mut st.refresh {
            refresh.keep_in(dir, deliver_from, replay_from)?;
            let counts_from = refresh.counts_from();
            self.counts
                .counts_from
                .store(counts_from, Ordering::Relaxed);
        }
        Ok(())
    }

    /// What `status` reports of pushed input; `follow`: a followed folder's own report.
    pub fn status(&self, follow: Option<serde_json::Value>) -> serde_json::Value {
        let p = &self.counts;
        let (rows_in, batches_in) = *lock(&p.admitted);
        serde_json::json!({
            "rows_in": rows_in,
            "batches_in": batches_in,
            "ended": p.ended.load(Ordering::Relaxed),
            "dropped_rows": p.dropped.load(Ordering::Relaxed),
            "duplicates": p.duplicates.load(Ordering::Relaxed),
            "durable": p.durable.load(Ordering::Relaxed),
            "replayed_records": p.replayed.load(Ordering::Relaxed),
            "replay_failed": self.replay_failed(),
            "steps_cut": p.steps_cut.get(),
            "committed_step": p.committed.load(Ordering::Relaxed).checked_sub(1),
            "spool_segments": p.segments.load(Ordering::Relaxed),
            "follow": follow,
            "freshness": self.fresh.status(),
        })
    }

    /// Why replaying the spool stopped, if it did (read without the state's lock).
    pub fn replay_failed(&self) -> Option<String> {
        lock(&self.counts.replay_failed).clone()
    }
}

/// The most producers a stream keeps sequence numbers for: every commit writes them all,
/// and a restart reads them back (a million names would outgrow the commit file).
pub const MAX_PRODUCERS: usize = 16_384;

/// Takes no more input, saying why: the ranks' streams end with the reason once they have
/// sent what was admitted, rather than wait for rows that will never come.
fn fail_locked(st: &mut Ingest, counts: &PushCounts, why: String) {
    *lock(&counts.replay_failed) = Some(why.clone());
    let _ = st.input_failed.set(why.clone());
    st.replay_failed = Some(why);
    st.rows_out = None;
}

/// When a batch arrived, and whether it begins a unit whose freshness is timed (a pushed
/// batch, or a followed file's first batch).
#[derive(Clone, Copy)]
struct Arrival {
    at: Instant,
    unit: bool,
}

/// A failure of the dataflow delivering the rows, as the producer is told it.
fn internal(e: crate::Error) -> ServeError {
    ServeError::Internal(e.to_string())
}

/// A batch that could not be spooled, as its producer is told it: a full disk is
/// RESOURCE_EXHAUSTED (the push can be retried once space is freed; nothing was
/// acknowledged), anything else INTERNAL.
fn spool_error(e: crate::Error) -> ServeError {
    match e {
        crate::Error::StateFull { .. } => ServeError::ResourceExhausted(state_told(&e)),
        e => ServeError::Internal(state_told(&e)),
    }
}

/// `e` as a client is told it: a state file named in the state directory, not by the
/// server's path.
fn state_told(e: &crate::Error) -> String {
    match e {
        crate::Error::State { path, reason } | crate::Error::StateFull { path, reason } => {
            format!("state {}: {reason}", super::spool::in_state_dir(path))
        }
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_resource_exhausted_and_other_spool_failures_internal() {
        let at = |full: bool| {
            let (path, reason) = ("/srv/sd/pushed.spool".into(), "cannot spool".to_string());
            match full {
                true => crate::Error::StateFull { path, reason },
                false => crate::Error::State { path, reason },
            }
        };
        // Named in the state directory, not by the server's path.
        let said = "state --state-dir/pushed.spool: cannot spool";
        assert!(matches!(spool_error(at(true)), ServeError::ResourceExhausted(m) if m == said));
        assert!(matches!(spool_error(at(false)), ServeError::Internal(m) if m == said));
    }
}
