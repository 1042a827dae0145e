//! Pushed batches featurized as DoPut accepts them: checked against the pipeline (the
//! columns its groups read, with types its steps take), featurized, and the result checked
//! against the schema the server delivers — so a batch that would break the ranks' streams
//! is refused whole, before it is acknowledged, and never affects the batches before it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use hydrant_flight::{Accepted, Origin, ServeError};
use hydrant_operators::{FittedState, Transformer};

use super::fresh::Freshness;
use super::refresh::{Known, Piece, Refresh};
use super::run::lock;
use super::spool::{COMMIT_FILE, Commit, Committer, Record, Replay, Spool};
use super::stream::Runs;
use crate::delivery::Placement;
use crate::runtime::{PushedRows, StepsCut};
use crate::source::with_row_id;
use crate::spec::PipelineSpec;

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
    /// The rows the last commit saw admitted ([`Commit::rows_in`]): the spool's replay
    /// must reach them.
    pub committed_rows_in: Option<u64>,
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
    pub rows_in: AtomicU64,
    pub batches_in: AtomicU64,
    pub dropped: AtomicU64,
    pub ended: AtomicBool,
    pub duplicates: AtomicU64,
    pub replayed: AtomicU64,
    /// Whether admitted batches are spooled (`--state-dir`).
    pub durable: AtomicBool,
    /// The last committed step, plus one (0: none yet).
    pub committed: AtomicU64,
    /// Rows the last commit saw admitted (durable): a commit made while the spool is
    /// replayed records no fewer, or a segment cut short later would go unnoticed.
    pub committed_rows_in: AtomicU64,
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

    /// Admits a pushed batch: checked and featurized, made durable (with a spool), cut
    /// and handed to the ranks' queues (waiting while they are full). A batch its
    /// producer had admitted already is acknowledged again, not admitted twice.
    pub fn accept(
        &self,
        batch: RecordBatch,
        origin: Option<Origin>,
    ) -> Result<Accepted, ServeError> {
        if self.followed.load(Ordering::Relaxed) {
            return Err(ServeError::FailedPrecondition(
                "this pipeline follows a folder; it takes no pushed input".into(),
            ));
        }
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

    /// Makes commits durable in a state directory that holds no spool (a followed folder).
    pub fn commit_to(&self, committer: Committer) {
        self.counts.durable.store(true, Ordering::Relaxed);
        lock(&self.commits).committer = Some(committer);
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
        let featurized = match &mut st.refresh {
            // Rows wholly before the commit's row go nowhere: nothing to featurize.
            None if rows == 0 || skip < rows as usize => {
                let featurized = st.featurizer.featurize(batch.clone(), st.next_row);
                let featurized = featurized.inspect_err(rejected)?;
                let version = st.featurizer.state_version();
                vec![(featurized.slice(skip, rows as usize - skip), version)]
            }
            None => Vec::new(),
            Some(refresh) => {
                // Checked before its rows are counted: a refused batch changes nothing.
                st.featurizer.check(&batch.schema()).inspect_err(rejected)?;
                let labels = st.featurizer.check_labels(&batch, st.next_row);
                labels.inspect_err(rejected)?;
                let pieces = refresh.take(&batch, st.next_row, st.skip_below)?;
                let counts_from = refresh.counts_from();
                self.counts
                    .counts_from
                    .store(counts_from, Ordering::Relaxed);
                featurize_pieces(&mut st.featurizer, pieces, st.next_row).inspect_err(rejected)?
            }
        };
        if live && let Some(spool) = &mut st.spool {
            // Synced before the rows go anywhere: an acknowledged batch is on disk.
            spool
                .append(&Record::Batch(origin.clone(), batch), st.next_row)
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
        if !featurized.is_empty() {
            // Known before any of its rows can be delivered.
            let first = st.next_row + skip as u64;
            self.fresh.admitted(first, arrived.at, arrived.unit, newest);
            st.deliver(featurized)?;
        }
        st.next_row += rows;
        st.seq += 1;
        self.counts.rows_in.store(st.next_row, Ordering::Relaxed);
        self.counts.batches_in.store(st.seq, Ordering::Relaxed);
        metrics::counter!(crate::metrics::ADMITTED_ROWS).increment(rows);
        Ok(Accepted {
            seq: Some(st.seq - 1),
            rows,
            duplicate: false,
        })
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
            record(st.next_row).map_err(|e| ServeError::Internal(e.to_string()))?;
        }
        if let Some(refresh) = &mut st.refresh {
            // Input shorter than the warmup: the first version is fitted on what came.
            let pieces = refresh.finish(st.skip_below)?;
            let featurized = featurize_pieces(&mut st.featurizer, pieces, st.next_row)?;
            st.deliver(featurized)?;
        }
        let mut out = st.rows_out.take();
        st.dropped = out
            .as_mut()
            .map_or(Ok(0), PushedRows::end)
            .map_err(internal)?;
        self.counts.dropped.store(st.dropped, Ordering::Relaxed);
        self.counts.ended.store(true, Ordering::Relaxed);
        for run in lock(runs).iter() {
            run.ended.cancel();
        }
        Ok(())
    }

    /// Admits `records` (read back from the spool) again, on a thread of its own: they
    /// wait for trainers like any push. New pushes wait until it is over.
    pub fn replay(self: &Arc<Self>, spool: Spool, records: Replay, runs: Arc<Runs>) {
        self.counts.durable.store(true, Ordering::Relaxed);
        let segments = spool.segments() as u64;
        self.counts.segments.store(segments, Ordering::Relaxed);
        lock(&self.commits).committer = Some(spool.committer());
        {
            let mut st = lock(&self.state);
            st.spool = Some(spool);
            st.next_row = records.first_row();
            if records.is_empty() {
                self.check_replayed(&mut st);
                return;
            }
            st.replaying = true;
        }
        let this = self.clone();
        let replay = move || {
            let mut st = lock(&this.state);
            for r in records {
                let admitted = match r {
                    Ok(Record::Batch(origin, batch)) => {
                        this.admit(&mut st, batch, origin, None).map(|_| ())
                    }
                    Ok(Record::End) => this.end_locked(&mut st, &runs, false),
                    Err(e) => Err(ServeError::Internal(e.to_string())),
                };
                if let Err(e) = admitted {
                    // The spool's batches were checked when pushed; a pipeline changed
                    // since may refuse them. Serve what came before, take nothing more
                    // (it would go after rows never delivered), and say why.
                    hydrant_operators::log_line!("hydrant: replaying the spool stopped: {e}");
                    fail_locked(&mut st, &this.counts, this.told(&e.to_string()));
                    break;
                }
                this.counts.replayed.fetch_add(1, Ordering::Relaxed);
            }
            this.check_replayed(&mut st);
            st.replaying = false;
            drop(st);
            this.replayed.notify_all();
        };
        if let Err(e) = std::thread::Builder::new()
            .name("hydrant-replay".into())
            .spawn(replay)
        {
            // The spool's rows would otherwise be skipped, and new pushes take their rows.
            let why = format!("cannot replay the spool: {e}");
            hydrant_operators::log_line!("hydrant: {why}");
            let mut st = lock(&self.state);
            fail_locked(&mut st, &self.counts, why);
            st.replaying = false;
            drop(st);
            self.replayed.notify_all();
        }
    }
}

impl Pushed {
    /// Fails the input if the spool replayed fewer rows than the last commit saw admitted:
    /// a segment was cut short or replaced after it was synced (a torn last record is
    /// only ever one that was not acknowledged). Producers' retries of the lost batches
    /// would otherwise be answered as duplicates, and the rows never delivered.
    fn check_replayed(&self, st: &mut Ingest) {
        let Some(want) = st.committed_rows_in else {
            return;
        };
        if st.replay_failed.is_some() || st.next_row >= want {
            return;
        }
        let why = format!(
            "the spool in --state-dir holds stream rows up to {}, but {COMMIT_FILE} was \
             written when {want} had been admitted: acknowledged rows are missing from its \
             newest segment (cut short or replaced); restore it, or start with an empty \
             --state-dir",
            st.next_row
        );
        hydrant_operators::log_line!("hydrant: {why}");
        fail_locked(st, &self.counts, why);
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
        serde_json::json!({
            "rows_in": p.rows_in.load(Ordering::Relaxed),
            "batches_in": p.batches_in.load(Ordering::Relaxed),
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

    /// Starts from `commit` (read back from the state directory) instead of row 0: the
    /// first step is the committed one, and producers' sequence numbers are known.
    pub fn resume(&self, commit: &Commit) -> Result<(), ServeError> {
        let start = self.placement.stream_start(commit.step);
        if start != commit.row {
            return Err(ServeError::FailedPrecondition(format!(
                "its step {} starts at stream row {start} here, but it records row {}: it was \
                 made with another batch size, world size or shuffle window (serve with \
                 those), or the file was changed (or start with an empty --state-dir)",
                commit.step, commit.row
            )));
        }
        let mut st = lock(&self.state);
        st.skip_below = commit.row;
        st.committed_rows_in = commit.rows_in;
        if let Some(rows) = commit.rows_in {
            self.counts.committed_rows_in.store(rows, Ordering::SeqCst);
        }
        *lock(&self.admitted) = commit.admitted.clone().into_iter().collect();
        lock(&self.commits).last = Some(commit.step);
        self.counts
            .committed
            .store(commit.step + 1, Ordering::Relaxed);
        self.counts.steps_cut.set(commit.step);
        Ok(())
    }

    /// Commits step `step` (the trainers' checkpoint holds every step before it): a
    /// restarted server delivers from there, and the spool segments wholly before the rows
    /// it needs are deleted. An older step than the last commit changes nothing.
    ///
    /// Takes no lock a producer holds while it waits for queue space, so a trainer that
    /// commits between steps cannot stall the producers that feed it (nor they it).
    pub fn commit(&self, step: u64) -> Result<serde_json::Value, ServeError> {
        // A failed input (acknowledged rows missing from the spool) keeps its last commit:
        // a new one would record the shorter spool as whole, and retries of the lost
        // batches would then be answered as duplicates.
        if let Some(why) = self.replay_failed() {
            return Err(ServeError::FailedPrecondition(format!(
                "the input failed, so nothing more is committed: {why}"
            )));
        }
        let cut = self.counts.steps_cut.get();
        if step > cut {
            return Err(ServeError::FailedPrecondition(format!(
                "step {step} is not delivered yet (every rank has steps up to {cut} only); \
                 commit the step the trainers will resume at"
            )));
        }
        let mut commits = lock(&self.commits);
        let step = commits.last.map_or(step, |last| last.max(step));
        let mut deleted = 0;
        if commits.last != Some(step)
            && let Some(committer) = &commits.committer
        {
            let row = self.placement.stream_start(step);
            // Every batch whose rows lie before `row` has its sequence number here.
            let admitted = lock(&self.admitted).clone().into_iter().collect();
            // Refreshed statistics count rows again from their last refresh point.
            let counts_from = self.counts.counts_from.load(Ordering::Relaxed);
            let commit = Commit {
                step,
                row,
                admitted,
                keep: (counts_from < row).then_some(counts_from),
                // Never more than is durable: `rows_in` is stored once a batch is spooled
                // and synced, the last commit's count was durable, and the rows before
                // `row` were given to the ranks, so spooled first. Never fewer either: a
                // replay after a restart counts again from the last commit's row.
                rows_in: Some(
                    (self.counts.rows_in.load(Ordering::SeqCst))
                        .max(self.counts.committed_rows_in.load(Ordering::SeqCst))
                        .max(row),
                ),
            };
            deleted = committer
                .commit(&commit)
                .map_err(|e| ServeError::Internal(e.to_string()))?;
            if let Some(rows) = commit.rows_in {
                self.counts.committed_rows_in.store(rows, Ordering::SeqCst);
            }
            let segments = committer.segments() as u64;
            self.counts.segments.store(segments, Ordering::Relaxed);
        }
        commits.last = Some(step);
        self.counts.committed.store(step + 1, Ordering::Relaxed);
        Ok(serde_json::json!({
            "committed": step,
            "durable": commits.committer.is_some(),
            "deleted_segments": deleted,
        }))
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
        crate::Error::StateFull { .. } => ServeError::ResourceExhausted(e.to_string()),
        e => internal(e),
    }
}

/// Featurizes `pieces` (rows a refreshed stream cut where its state changes), each with
/// its state. Pieces from rows before `admitting` (held for the first version) were
/// acknowledged already: a failure there fails the stream, not only this batch.
fn featurize_pieces(
    featurizer: &mut PushFeaturizer,
    pieces: Vec<Piece>,
    admitting: u64,
) -> Result<Vec<(RecordBatch, u64)>, ServeError> {
    let mut out = Vec::with_capacity(pieces.len());
    for p in pieces {
        featurizer.set_state(&p.state);
        let featurized = featurizer.featurize(p.batch, p.first);
        let featurized = match featurized {
            Err(e) if p.first < admitting => {
                return Err(ServeError::Internal(format!(
                    "rows held for the first state version cannot be featurized with it: {e}"
                )));
            }
            other => other?,
        };
        out.push((featurized, p.state.version));
    }
    Ok(out)
}

/// Featurizes pushed batches for one pipeline, binding a transformer per input schema seen
/// (producers may differ in, say, integer widths).
pub struct PushFeaturizer {
    spec: PipelineSpec,
    state: Arc<FittedState>,
    output: SchemaRef,
    transformers: Vec<(SchemaRef, Transformer)>,
}

/// Input schemas bound at most; a producer that sends ever new schemas is refused beyond.
const MAX_SCHEMAS: usize = 64;

impl PushFeaturizer {
    /// A featurizer whose batches must come out as `output` (the served feature schema).
    pub fn new(spec: PipelineSpec, state: FittedState, output: SchemaRef) -> Self {
        PushFeaturizer {
            spec,
            state: Arc::new(state),
            output,
            transformers: Vec::new(),
        }
    }

    /// The pipeline it featurizes for.
    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    /// The version of the state it featurizes with.
    pub fn state_version(&self) -> u64 {
        self.state.version
    }

    /// Featurizes with `state` from now on (transformers are bound again when it changes).
    pub fn set_state(&mut self, state: &Arc<FittedState>) {
        if !Arc::ptr_eq(&self.state, state) {
            self.state = state.clone();
            self.transformers.clear();
        }
    }

    /// Checks that batches of `schema` can be featurized and delivered, without a state
    /// (rows held for a first version are checked so, before they are acknowledged).
    pub fn check(&self, schema: &Schema) -> Result<(), ServeError> {
        let invalid = |e: &dyn std::fmt::Display| ServeError::InvalidArgument(e.to_string());
        check_columns(schema)?;
        let plan = self.spec.plan(schema).map_err(|e| self.plan_error(e))?;
        check_output(&plan.output_schema(), &self.output).map_err(|e| invalid(&e))
    }

    /// Why a pushed schema does not fit the pipeline, as its producer is told: without the
    /// server's path of the pipeline file.
    fn plan_error(&self, e: crate::Error) -> ServeError {
        ServeError::InvalidArgument(match e {
            crate::Error::Spec { reason, .. } => {
                format!("pipeline `{}`: {reason}", self.spec.name)
            }
            other => other.to_string(),
        })
    }

    /// Checks the labels of `batch`, whose rows start at stream row `first_row`, as
    /// featurizing would: rows held for a first state are acknowledged before that.
    pub fn check_labels(&self, batch: &RecordBatch, first_row: u64) -> Result<(), ServeError> {
        match &self.spec.label {
            Some(label) => hydrant_operators::check_labels(label, batch, first_row)
                .map_err(|e| ServeError::InvalidArgument(e.to_string())),
            None => Ok(()),
        }
    }

    /// Featurizes `batch`, its rows numbered from `first_row`.
    pub fn featurize(
        &mut self,
        batch: RecordBatch,
        first_row: u64,
    ) -> Result<RecordBatch, ServeError> {
        let invalid = |e: &dyn std::fmt::Display| ServeError::InvalidArgument(e.to_string());
        let schema = batch.schema();
        check_columns(&schema)?;
        let at = match self.transformers.iter().position(|(s, _)| *s == schema) {
            Some(at) => at,
            None => {
                if self.transformers.len() >= MAX_SCHEMAS {
                    return Err(invalid(&format!(
                        "more than {MAX_SCHEMAS} different schemas pushed; push one schema"
                    )));
                }
                let plan = self.spec.plan(&schema).map_err(|e| self.plan_error(e))?;
                let t = plan.transformer(&self.state).map_err(|e| invalid(&e))?;
                self.transformers.push((schema, t));
                self.transformers.len() - 1
            }
        };
        let batch = with_row_id(batch, first_row).map_err(|e| invalid(&e))?;
        let out = self.transformers[at]
            .1
            .apply(&batch)
            .map_err(|e| invalid(&e))?;
        check_output(&out.schema(), &self.output).map_err(|e| invalid(&e))?;
        Ok(out)
    }
}

/// A pushed batch's columns, checked as an input file's are.
fn check_columns(schema: &Schema) -> Result<(), ServeError> {
    match crate::source::column_problem(schema) {
        Some(problem) => Err(ServeError::InvalidArgument(format!("the batch {problem}"))),
        None => Ok(()),
    }
}

/// Whether featurized batches of `got` can be delivered as `served`: the same columns with
/// the same types (a pass-through tensor of another width would break every rank's
/// stream at its next batch).
fn check_output(got: &Schema, served: &Schema) -> Result<(), String> {
    for f in served.fields() {
        let g = got
            .field_with_name(f.name())
            .map_err(|_| format!("column `{}` is missing from the featurized batch", f.name()))?;
        if g.data_type() != f.data_type() {
            return Err(format!(
                "column `{}` featurizes to {} but the server delivers {}",
                f.name(),
                g.data_type(),
                f.data_type()
            ));
        }
    }
    if got.fields().len() != served.fields().len() {
        return Err("the featurized batch has columns the server does not deliver".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_resource_exhausted_and_other_spool_failures_internal() {
        let at = |full: bool| {
            let (path, reason) = ("/s/pushed.spool".into(), "cannot spool".to_string());
            match full {
                true => crate::Error::StateFull { path, reason },
                false => crate::Error::State { path, reason },
            }
        };
        assert!(
            matches!(spool_error(at(true)), ServeError::ResourceExhausted(m) if m.contains("cannot spool"))
        );
        assert!(matches!(spool_error(at(false)), ServeError::Internal(_)));
    }
}
