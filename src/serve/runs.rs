//! The runs of file input on one process: the first epoch's made when the server starts,
//! each next epoch's made ahead to start once the epoch before is featurized, a run
//! started for a DoGet, and the rules by which runs give way and make room.

use std::sync::Arc;

use hydrant_flight::ServeError;
use tokio_util::sync::CancellationToken;

use super::run::{self, Run, lock};
use super::{ServedPipeline, max_runs};
use crate::delivery::Delivery;
use crate::runtime::{self, Channels, Cluster, Job, Output};
use crate::source::Inputs;

impl ServedPipeline {
    /// Starts the shared run of the first epoch served (`--start-epoch/--start-step`) now,
    /// so that its first steps are featurized while the trainers connect rather than after
    /// their first DoGet. A trainer that asks for another step first (one resuming on a
    /// restarted server) gets a run from that step instead.
    pub fn warmed(self) -> crate::Result<Self> {
        if self.inputs.is_none() || self.cluster.is_some() {
            return Ok(self);
        }
        let (epoch, step) = (self.delivery.start_epoch, self.delivery.start_step);
        if epoch >= self.delivery.epochs || step >= self.delivery.plan.steps() {
            return Ok(self);
        }
        let run = self
            .start(epoch, step, None, None)
            .map_err(|e| crate::Error::Dataflow(e.to_string()))?;
        lock(&self.shared_epochs).insert(epoch);
        let mut runs = lock(&self.runs);
        self.warm_next(&mut runs, &run);
        runs.push(run.ahead());
        drop(runs);
        Ok(self)
    }

    /// Makes the shared run of the epoch after `run`'s ahead of the trainers, starting once
    /// `run`'s dataflow has ended: the next epoch's first steps are then featurized while
    /// the trainers take the last ones of this epoch, rather than after they ask for them
    /// (a trainer's first batch of each later epoch waited 22-38 ms for its run to start,
    /// 1M rows, 2 ranks). Only for a shared run, while the next epoch has no run and there
    /// is room for one: a run made ahead never displaces another, and gives way to any run
    /// that needs its room, or that starts at another step.
    pub(super) fn warm_next(&self, runs: &mut Vec<Arc<Run>>, run: &Run) {
        let next = run.epoch + 1;
        let wanted = self.inputs.is_some()
            && self.cluster.is_none()
            && run.only.is_none()
            && next < self.delivery.epochs
            && runs.len() + 1 < max_runs(self.world())
            && !runs.iter().any(|r| r.epoch == next);
        if !wanted || !lock(&self.shared_epochs).insert(next) {
            return;
        }
        match self.start(next, 0, None, Some(run.ended.clone())) {
            Ok(ahead) => runs.push(ahead.ahead()),
            // Only a head start lost: the epoch's first DoGet makes its run.
            Err(_) => {
                lock(&self.shared_epochs).remove(&next);
            }
        }
    }

    /// Starts a dataflow delivering `epoch` from `start_step`, all ranks or only `only`;
    /// with `after`, once that token is cancelled (the run before has ended).
    pub(super) fn start(
        &self,
        epoch: u64,
        start_step: u64,
        only: Option<usize>,
        after: Option<CancellationToken>,
    ) -> Result<Arc<Run>, ServeError> {
        let Some(inputs) = &self.inputs else {
            return Err(ServeError::Internal(
                "pushed input has one run, made at start".into(),
            ));
        };
        let steps = self.delivery.plan.steps();
        let (senders, run) = Run::new(
            epoch,
            start_step,
            only,
            self.local.clone(),
            Some(steps),
            self.replay_bytes,
            self.redact.clone(),
        );
        let mut job = Job::new(
            inputs.clone(),
            self.plan.clone(),
            Some(self.state.clone()),
            self.bound.clone(),
            Delivery {
                plan: self.delivery.plan.clone(),
                epochs: epoch + 1,
                start_epoch: epoch,
                start_step,
                only,
            },
        );
        job.output = Some(Output::Channels(Channels {
            senders: senders.clone(),
            stop: run.stop.clone(),
        }));
        job.errors = run.errors.clone();
        job.featurized = self.featurized.clone();
        let cluster = Cluster::local(self.workers);
        // The thread holds the run's error slot and flag, never the run: a run forgotten
        // drops its queues, and the dataflow stops at its next send.
        let (ended, errors, stop) = (run.ended.clone(), run.errors.clone(), run.stop.clone());
        std::thread::Builder::new()
            .name(format!("hydrant-run-{epoch}"))
            .spawn(move || {
                // A run made ahead waits for the one before it, so that the two do not
                // share the cores (a run forgotten meanwhile ends here).
                let go = after.is_none_or(|before| {
                    futures::executor::block_on(async {
                        tokio::select! {
                            biased;
                            _ = stop.cancelled() => false,
                            _ = before.cancelled() => true,
                        }
                    })
                });
                if go && let Err(e) = runtime::execute(job, &cluster, || {}) {
                    // A run let go (no one reads it) ends with its sends refused: not news.
                    if !stop.is_cancelled() {
                        let only = only.map(|r| format!(" (rank {r})")).unwrap_or_default();
                        hydrant_operators::log_line!(
                            "hydrant: the run of epoch {epoch}{only} failed: {e}"
                        );
                    }
                    e.record_in(&errors, e.origin());
                }
                ended.cancel();
                // The queues end only now, so that a stream that sees their end sees the
                // error too.
                drop(senders);
            })
            .map_err(|e| ServeError::ResourceExhausted(format!("cannot start a run: {e}")))?;
        Ok(run)
    }

    /// Forgets the runs `which` picks among those one process made ahead of its trainers
    /// and none has touched, so that their epochs may have a shared run again; returns
    /// whether it forgot any. (A cluster's are its dataflow's, fed once: they stay.)
    pub(super) fn give_up(&self, runs: &mut Vec<Arc<Run>>, which: impl Fn(&Run) -> bool) -> bool {
        if self.cluster.is_some() {
            return false;
        }
        let picked = |r: &Run| r.untouched() && which(r);
        let epochs: Vec<u64> = runs.iter().filter(|r| picked(r)).map(|r| r.epoch).collect();
        forget(runs, picked);
        let mut shared_epochs = lock(&self.shared_epochs);
        for epoch in &epochs {
            shared_epochs.remove(epoch);
        }
        !epochs.is_empty()
    }

    /// Forgets runs no one has read for the idle timeout; then, while there are too many,
    /// the unread ones, oldest first. Errs if every run is being read.
    pub(super) fn make_room(&self, runs: &mut Vec<Arc<Run>>) -> Result<(), ServeError> {
        let max = max_runs(self.world());
        forget(runs, |r| r.idle_for(self.idle_timeout));
        while runs.len() >= max {
            let Some(unread) = runs.iter().position(|r| !r.read()) else {
                return Err(ServeError::ResourceExhausted(format!(
                    "{} runs are being read; no room for another (reconnect at a recent step, \
                     or wait)",
                    runs.len()
                )));
            };
            runs.remove(unread).close();
        }
        Ok(())
    }
}

/// Each input file's server path and the name clients are told instead: its path below
/// the folder all inputs share (the file name, for one file).
pub(super) fn redaction(inputs: &Inputs) -> run::Redact {
    let paths: Vec<&std::path::Path> = inputs.paths().collect();
    let common = paths.iter().skip(1).fold(
        paths
            .first()
            .and_then(|p| p.parent())
            .map(std::path::Path::to_path_buf),
        |common, p| {
            let mut c = common?;
            while !p.starts_with(&c) {
                c = c.parent()?.to_path_buf();
            }
            Some(c)
        },
    );
    let mut pairs: Vec<(String, String)> = paths
        .iter()
        .map(|p| {
            let short = common
                .as_deref()
                .and_then(|c| p.strip_prefix(c).ok())
                .unwrap_or(p);
            (p.display().to_string(), short.display().to_string())
        })
        .collect();
    pairs.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
    pairs.into()
}

/// Removes the runs `which` picks, ending their consumers.
pub(super) fn forget(runs: &mut Vec<Arc<Run>>, which: impl Fn(&Run) -> bool) {
    runs.retain(|r| {
        let keep = !which(r);
        if !keep {
            r.close();
        }
        keep
    });
}
