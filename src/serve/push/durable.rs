//! What makes pushed input durable: commits (the trainers' checkpoints, and which spool
//! segments they let go) and the replay of the spool after a restart.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hydrant_flight::ServeError;

use super::{Ingest, Pushed, fail_locked};
use crate::serve::run::lock;
use crate::serve::spool::{COMMIT_FILE, Commit, Committer, Record, Replay, Spool};
use crate::serve::stream::Runs;

impl Pushed {
    /// Makes commits durable in a state directory that holds no spool (a followed folder).
    pub fn commit_to(&self, committer: Committer) {
        self.counts.durable.store(true, Ordering::Relaxed);
        lock(&self.commits).committer = Some(committer);
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
        st.committed_in = commit.rows_in.map(|rows| (rows, commit.batches_in));
        if let Some(committed) = st.committed_in {
            *lock(&self.counts.committed_in) = committed;
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
            // A step past the rows of an ended input (the trainers' resume step after its
            // padded last one) starts past every row admitted: only those were spooled.
            let ended = self.counts.ended.load(Ordering::Acquire);
            let (admitted_rows, admitted_batches) = *lock(&self.counts.admitted);
            let spooled = if ended { row.min(admitted_rows) } else { row };
            // Never more than is durable: `admitted` is stored once a batch is spooled and
            // synced, the last commit's count was durable, and the rows before `spooled`
            // were given to the ranks, so spooled first. Never fewer either: a replay
            // after a restart counts again from the oldest segment kept. Each count goes
            // with the batches it was reached in (unknown for a step's row past both).
            let was = *lock(&self.counts.committed_in);
            // (The last of equals is the greatest: the admitted count, whose batches are
            // known.)
            let (rows_in, batches_in) = [was, (admitted_rows, Some(admitted_batches))]
                .into_iter()
                .max_by_key(|&(rows, _)| rows)
                .filter(|&(rows, _)| rows >= spooled)
                .unwrap_or((spooled, None));
            // Every batch whose rows lie before `row` has its sequence number here.
            let admitted = lock(&self.admitted).clone().into_iter().collect();
            // Refreshed statistics count rows again from their last refresh point.
            let counts_from = self.counts.counts_from.load(Ordering::Relaxed);
            let commit = Commit {
                step,
                row,
                admitted,
                keep: (counts_from < row).then_some(counts_from),
                rows_in: Some(rows_in),
                batches_in,
            };
            deleted = committer
                .commit(&commit)
                .map_err(|e| ServeError::Internal(e.to_string()))?;
            *lock(&self.counts.committed_in) = (rows_in, batches_in);
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
            self.count_from_commit(&mut st);
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
                this.count_from_commit(&mut st);
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

    /// Numbers admitted batches on from the last commit's count, not from the oldest batch
    /// the spool still holds: once the replay reaches the rows that commit saw admitted,
    /// the batches admitted are the ones it saw (those of deleted segments included).
    fn count_from_commit(&self, st: &mut Ingest) {
        if let Some((rows, Some(batches))) = st.committed_in
            && st.next_row == rows
            && st.seq < batches
        {
            st.seq = batches;
            *lock(&self.counts.admitted) = (st.next_row, st.seq);
        }
    }

    /// Fails the input if the spool replayed fewer rows than the last commit saw admitted:
    /// a segment was cut short or replaced after it was synced (a torn last record is
    /// only ever one that was not acknowledged). Producers' retries of the lost batches
    /// would otherwise be answered as duplicates, and the rows never delivered.
    fn check_replayed(&self, st: &mut Ingest) {
        let Some((want, _)) = st.committed_in else {
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
}
