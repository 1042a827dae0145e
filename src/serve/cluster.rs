//! A pipeline served by the processes of a timely cluster: each process serves the ranks
//! it owns, and one dataflow spanning every process delivers all epochs, each process's
//! owners feeding the shared run of each epoch here.
//!
//! - A shared run of an epoch is made when the dataflow reaches the epoch or when a
//!   trainer asks for it first, whichever comes first; the dataflow's owner of a rank
//!   takes that rank's queue then ([`Feed::open`]).
//! - A rank that asks for a step its shared run no longer holds (or an epoch before the
//!   dataflow's first) catches up on a one-process run of its own, as with one process:
//!   the input files are replayable and placement is a pure function, so any process can
//!   make any rank's batches alone.
//! - A shared run that is forgotten (nobody read it for the idle timeout) stops taking
//!   batches: the dataflow discards them rather than end, since every process shares its
//!   fate.
//! - When a peer process is lost, the dataflow fails and the server ends with one line
//!   (see `hydrant serve`): the trainers resume from their steps on a restarted cluster.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use super::run::{Redact, Run, lock};
use super::stream::Runs;
use crate::delivery::Ownership;
use crate::runtime::RankQueue;

/// What a process of a serving cluster knows of it.
pub(super) struct Serving {
    /// This process's index.
    pub process: usize,
    /// Every process's Flight location (`grpc://HOST:PORT`), by process.
    pub locations: Vec<String>,
    /// Which process owns which rank.
    pub ownership: Ownership,
    /// Makes and hands out the shared runs the dataflow feeds.
    pub feed: Arc<Feed>,
    /// Why the cluster's dataflow failed, once it has.
    pub failed: watch::Receiver<Option<String>>,
}

impl Serving {
    /// Where `rank` is served.
    pub fn location(&self, rank: usize) -> &str {
        &self.locations[self.ownership.process(rank)]
    }
}

/// The shared runs of a cluster's dataflow.
pub(super) struct Feed {
    pub runs: Weak<Runs>,
    /// Epochs that have had a shared run (shared with the pipeline's own).
    pub shared_epochs: Arc<Mutex<BTreeSet<u64>>>,
    /// The ranks this process serves.
    pub local: Range<usize>,
    /// Steps per epoch.
    pub steps: u64,
    /// Bytes of sent batches each rank keeps.
    pub replay_bytes: usize,
    pub redact: Redact,
    /// The epoch and step the dataflow starts at; it ends before epoch `end`.
    pub start: (u64, u64),
    pub end: u64,
}

impl Feed {
    /// The shared run of `epoch` in `runs`, made now if the dataflow has yet to feed the
    /// epoch; `None` if the dataflow never feeds it, or fed a run of it already that is
    /// gone.
    pub fn run(&self, runs: &mut Vec<Arc<Run>>, epoch: u64) -> Option<Arc<Run>> {
        if let Some(run) = runs.iter().find(|r| r.epoch == epoch && r.only.is_none()) {
            return Some(run.clone());
        }
        let (start_epoch, start_step) = self.start;
        if epoch < start_epoch || epoch >= self.end || !lock(&self.shared_epochs).insert(epoch) {
            return None;
        }
        let first = if epoch == start_epoch { start_step } else { 0 };
        let (senders, run) = Run::new(
            epoch,
            first,
            None,
            self.local.clone(),
            Some(self.steps),
            self.replay_bytes,
            self.redact.clone(),
        );
        let run = run.fed_later(senders);
        runs.push(run.clone());
        Some(run)
    }

    /// The queue the dataflow's owner of `rank` sends `epoch`'s batches to (`None`:
    /// discard them; no one will read them here).
    pub fn open(&self, epoch: u64, rank: usize) -> Option<RankQueue> {
        let runs = self.runs.upgrade()?;
        let run = self.run(&mut lock(&runs), epoch)?;
        Some(RankQueue {
            tx: run.take_sender(rank)?,
            stop: run.stop.clone(),
        })
    }
}
