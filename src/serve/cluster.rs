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
//! - A trainer that waits on a rank no one reads lets it go here and tells the other
//!   processes, which let go of theirs: the rank that holds the dataflow back may be
//!   served anywhere (see [`let_unread_go`]).
//! - A shared run that is forgotten (nobody read it for the idle timeout) stops taking
//!   batches: the dataflow discards them rather than end, since every process shares its
//!   fate.
//! - When a peer process is lost, the dataflow fails and the server ends with one line
//!   (see `hydrant serve`): the trainers resume from their steps on a restarted cluster.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use super::ServedPipeline;
use super::run::{Redact, Run, lock};
use super::stream::{Runs, let_unread_go};
use crate::delivery::{Delivery, Ownership};
use crate::runtime::{self, Cluster, Job, Output, RankQueue, Signals};

impl ServedPipeline {
    /// Serves this process's ranks of `cluster` (process ⌊r·P/W⌋ owns rank r), whose
    /// processes serve Flight at `locations` (by process, `grpc://HOST:PORT`): starts the
    /// dataflow that spans every process and delivers all epochs, and tells each rank's
    /// location in `GetFlightInfo`. Call it last, inside the tokio runtime that serves
    /// (the ranks let go at another process's word are drained there): the runs it makes
    /// keep what the pipeline was set to then. A trainer that asks this process for
    /// another's rank is told where it is served.
    pub fn on_cluster(mut self, cluster: Cluster, locations: Vec<String>) -> crate::Result<Self> {
        let Ok(serving) = tokio::runtime::Handle::try_current() else {
            return Err(crate::Error::Usage(
                "a serving cluster is set up inside the tokio runtime that serves it".into(),
            ));
        };
        let Some(inputs) = self.inputs.clone() else {
            return Err(crate::Error::Usage(format!(
                "pipeline `{}` takes pushed or followed input, which one process serves \
                 (give --processes 1)",
                self.name
            )));
        };
        if locations.len() != cluster.processes {
            return Err(crate::Error::Usage(format!(
                "{} locations for a cluster of {} processes",
                locations.len(),
                cluster.processes
            )));
        }
        let ownership = Ownership {
            world_size: self.world(),
            processes: cluster.processes,
            workers: cluster.workers,
        };
        self.local = ownership.ranks(cluster.process);
        let d = &self.delivery;
        let feed = Arc::new(Feed {
            runs: Arc::downgrade(&self.runs),
            shared_epochs: self.shared_epochs.clone(),
            local: self.local.clone(),
            steps: d.plan.steps(),
            replay_bytes: self.replay_bytes,
            redact: self.redact.clone(),
            start: (d.start_epoch, d.start_step),
            end: d.epochs,
            made: Mutex::default(),
        });
        let mut job = Job::new(
            inputs,
            self.plan.clone(),
            Some(self.state.clone()),
            self.bound.clone(),
            Delivery {
                only: None,
                ..self.delivery.clone()
            },
        );
        let open = feed.clone();
        job.output = Some(Output::Epochs(Arc::new(move |epoch, rank| {
            open.open(epoch, rank)
        })));
        job.featurized = self.featurized.clone();
        // A peer's trainer waits on `epoch`: the ranks of it (or before) no one reads here
        // may be what holds it.
        let runs = Arc::downgrade(&self.runs);
        let signals = Signals::new(move |peer, epoch| {
            let _inside = serving.enter();
            let_unread_go(&runs, epoch, &format!("a trainer on process {peer} waited"));
        });
        job.signals = Some(signals.clone());
        let (tell, failed) = tokio::sync::watch::channel(None);
        let process = cluster.process;
        let (errors, fed) = (job.errors.clone(), feed.clone());
        std::thread::Builder::new()
            .name("hydrant-cluster".into())
            .spawn(move || {
                if let Err(e) = runtime::execute(job, &cluster, || {}) {
                    let origin = errors.origin().unwrap_or_else(|| e.origin().into());
                    let why = match e {
                        crate::Error::Dataflow(why) => why,
                        other => other.to_string(),
                    };
                    // Every epoch's trainers are told why (a lost peer: UNAVAILABLE), rather
                    // than wait on queues the failed dataflow no longer feeds.
                    fed.fail(&origin, &why);
                    let _ = tell.send(Some(why));
                }
            })
            .map_err(|e| crate::Error::Usage(format!("cannot start the dataflow: {e}")))?;
        self.cluster = Some(Serving {
            process,
            locations,
            ownership,
            feed,
            failed,
            signals,
        });
        Ok(self)
    }

    /// Resolves with why the cluster's dataflow failed (a peer process is lost, a worker
    /// panicked), if this pipeline is served by a cluster; pending forever otherwise.
    pub async fn cluster_failed(&self) -> String {
        let Some(c) = &self.cluster else {
            return std::future::pending().await;
        };
        let mut failed = c.failed.clone();
        let why = failed
            .wait_for(Option::is_some)
            .await
            .map(|why| why.clone().unwrap_or_default());
        match why {
            Ok(why) => why,
            // The dataflow's thread is gone without a word: it ended (all epochs sent).
            Err(_) => std::future::pending().await,
        }
    }
}

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
    /// Tells the other processes which epoch a trainer here waits on.
    pub signals: Signals,
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
    /// Every run made here that is still alive, whether or not `runs` still lists it (a
    /// run whose ranks all saw their queues end is let go from there at once).
    pub made: Mutex<Vec<Weak<Run>>>,
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
        let mut made = lock(&self.made);
        made.retain(|r| r.strong_count() > 0);
        made.push(Arc::downgrade(&run));
        Some(run)
    }

    /// Fails every run made here that is still alive: the dataflow feeding them failed.
    pub fn fail(&self, origin: &str, why: &str) {
        let made: Vec<Arc<Run>> = lock(&self.made).iter().filter_map(Weak::upgrade).collect();
        for run in made {
            run.fail(Some(origin), why);
        }
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
