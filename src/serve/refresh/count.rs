//! Counting a stream's rows into statistics on a thread of its own: the ingest thread
//! featurizes (with the version in effect) while the rows are counted beside it, and
//! waits for the count only at a refresh point.

use std::sync::Arc;
use std::thread::JoinHandle;

use arrow::array::RecordBatch;
use crossbeam_channel::{Receiver, Sender, bounded};
use hydrant_operators::{FeaturePlan, FitPartial, FittedState};

use crate::error::{Error, Result};

/// Slices sent ahead of the counting: what the channel holds (they share the pushed
/// batches' buffers).
const AHEAD: usize = 16;

enum Job {
    Rows(RecordBatch),
    /// Stop gathering these statistics.
    Drop(Vec<String>),
    /// Send back what was counted since the last cut, and start over.
    Cut,
}

/// A counter of rows, on its thread.
pub(super) struct Counter {
    jobs: Option<Sender<Job>>,
    counted: Receiver<Result<FitPartial>>,
    thread: Option<JoinHandle<()>>,
}

impl Counter {
    /// Counts rows into statistics for `plan`'s first fit pass (pipeline `pipeline`).
    pub fn start(plan: Arc<FeaturePlan>, pipeline: &str) -> Result<Self> {
        let empty = FittedState::empty(pipeline);
        let mut fitter = plan.fitter(0, &empty)?;
        let (jobs, take) = bounded::<Job>(AHEAD);
        let (give, counted) = bounded(1);
        let count = move || {
            // The first failure is kept until the next cut (the rows were checked
            // against the pipeline before they came: one is a bug, reported there).
            let mut failed: Option<Error> = None;
            let mut dropped: Vec<String> = Vec::new();
            for job in take {
                match job {
                    Job::Rows(rows) => {
                        if failed.is_none()
                            && let Err(e) = fitter.update(&rows)
                        {
                            failed = Some(e.into());
                        }
                    }
                    Job::Drop(keys) => {
                        fitter.drop_statistics(&keys);
                        dropped.extend(keys);
                    }
                    Job::Cut => {
                        let fresh = match plan.fitter(0, &empty) {
                            Ok(mut f) => {
                                f.drop_statistics(&dropped);
                                f
                            }
                            Err(e) => {
                                let _ = give.send(Err(e.into()));
                                return;
                            }
                        };
                        let done = std::mem::replace(&mut fitter, fresh).into_partial();
                        let reply = match failed.take() {
                            Some(e) => Err(e),
                            None => done.map_err(Error::from),
                        };
                        if give.send(reply).is_err() {
                            return;
                        }
                    }
                }
            }
        };
        let thread = std::thread::Builder::new()
            .name("hydrant-count".into())
            .spawn(count)
            .map_err(|e| Error::Usage(format!("cannot start the statistics' counter: {e}")))?;
        Ok(Counter {
            jobs: Some(jobs),
            counted,
            thread: Some(thread),
        })
    }

    /// Counts `rows` (soon).
    pub fn count(&self, rows: RecordBatch) -> Result<()> {
        self.send(Job::Rows(rows))
    }

    /// Stops gathering the statistics of `keys`, from the rows sent next on.
    pub fn drop_statistics(&self, keys: Vec<String>) -> Result<()> {
        self.send(Job::Drop(keys))
    }

    /// What was counted since the last cut, once it is all counted.
    pub fn cut(&self) -> Result<FitPartial> {
        self.send(Job::Cut)?;
        self.counted.recv().map_err(|_| stopped())?
    }

    fn send(&self, job: Job) -> Result<()> {
        let jobs = self.jobs.as_ref().ok_or_else(stopped)?;
        jobs.send(job).map_err(|_| stopped())
    }
}

fn stopped() -> Error {
    Error::Dataflow("the statistics' counter stopped".into())
}

impl Drop for Counter {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
