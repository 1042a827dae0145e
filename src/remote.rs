//! A remote source for the embedded API: a rank's batches read from `hydrant serve` over
//! Arrow Flight, through the same loaders (host or cuda backend, read-ahead, stall
//! time) as the in-process path, so a Rust trainer in another process gets the same
//! [`TrainingBatch`]es.
//!
//! ```no_run
//! use hydrant::Pipeline;
//!
//! let remote = Pipeline::connect("grpc://127.0.0.1:50051", "criteo")?;
//! let rank = remote.rank(0)?;
//! for batch in rank.batches() {
//!     let batch = batch?; // batch.dense, batch.ids, batch.labels, batch.is_padding
//! }
//! # Ok::<(), hydrant::Error>(())
//! ```

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hydrant_flight::{Client, Connect, StepBatch, Ticket};
use hydrant_operators::{Batch, ErrorSlot};
use tokio::sync::Notify;

use crate::delivery::{RankBatch, StepMeta};
use crate::error::{Error, Result};
use crate::loader::{self, Loader, LoaderConfig, TrainingBatch};

/// A pipeline served by `hydrant serve`, as a source of ranks.
#[derive(Debug, Clone)]
pub struct Remote {
    uri: String,
    pipeline: String,
    credentials: Option<(String, String)>,
    config: LoaderConfig,
    /// Seconds of silence before the connection pings the server (see
    /// [`hydrant_flight::KEEPALIVE`]).
    keepalive: Option<Duration>,
    /// Where each rank is served when a process of a cluster other than `uri` serves it;
    /// one entry per rank.
    locations: Vec<Option<String>>,
}

impl Remote {
    /// Connects to `uri` and looks `pipeline` up (its ranks).
    pub fn connect(uri: &str, pipeline: &str) -> Result<Remote> {
        Self::new(uri, pipeline, None)
    }

    /// Connects to a server started with `--token-file`, authenticating as `user`.
    pub fn connect_with_credentials(
        uri: &str,
        pipeline: &str,
        user: &str,
        password: &str,
    ) -> Result<Remote> {
        Self::new(
            uri,
            pipeline,
            Some((user.to_string(), password.to_string())),
        )
    }

    fn new(uri: &str, pipeline: &str, credentials: Option<(String, String)>) -> Result<Remote> {
        let mut remote = Remote {
            uri: uri.to_string(),
            pipeline: pipeline.to_string(),
            credentials,
            config: LoaderConfig::default(),
            keepalive: Some(hydrant_flight::KEEPALIVE),
            locations: Vec::new(),
        };
        remote.locations = remote.look_up()?;
        Ok(remote)
    }

    /// The loaders' read-ahead and backend (default: 2 batches, host memory).
    pub fn with_loader(mut self, config: LoaderConfig) -> Remote {
        self.config = config;
        self
    }

    /// How long a rank's stream may be silent before its connection pings the server, and
    /// how long it then waits for the answer before the read fails (default
    /// [`hydrant_flight::KEEPALIVE`]): a frozen server or a dropped network ends the
    /// rank's batches with an error rather than a hang. A trainer may pause for longer
    /// (a checkpoint): the pings are answered meanwhile. `None` sends none; a zero
    /// duration is refused.
    pub fn with_keepalive(mut self, keepalive: Option<Duration>) -> Result<Remote> {
        if keepalive == Some(Duration::ZERO) {
            return Err(Error::Usage(
                "a keep-alive of 0 seconds: give a positive duration, or none".into(),
            ));
        }
        self.keepalive = keepalive;
        Ok(self)
    }

    /// Ranks the pipeline is served to.
    pub fn world_size(&self) -> usize {
        self.locations.len()
    }

    /// Where `rank` is served: the location its endpoint names (a process of a serving
    /// cluster), or the uri connected to.
    pub fn location(&self, rank: usize) -> &str {
        match self.locations.get(rank) {
            Some(Some(at)) => at,
            _ => &self.uri,
        }
    }

    /// Rank `rank`'s batches of epoch 0 from its first step.
    pub fn rank(&self, rank: usize) -> Result<RemoteRank> {
        self.open(rank, 0, 0)
    }

    /// Rank `rank`'s batches of `epoch` from `start_step` (a trainer resuming after step
    /// S passes S + 1).
    pub fn open(&self, rank: usize, epoch: u64, start_step: u64) -> Result<RemoteRank> {
        if rank >= self.world_size() {
            return Err(Error::Usage(format!(
                "rank {rank} is not below the {} ranks `{}` is served to",
                self.world_size(),
                self.pipeline
            )));
        }
        let ticket = Ticket {
            pipeline: self.pipeline.clone(),
            epoch,
            rank: rank as u32,
            world_size: self.world_size() as u32,
            start_step,
            job: None,
        };
        let errors = ErrorSlot::default();
        let (feed, loader, actor) = loader::spawn(rank, self.config, errors.clone())?;
        let cancel = Arc::new(Notify::new());
        let (remote, stop) = (self.clone(), cancel.clone());
        let reader = std::thread::Builder::new()
            .name(format!("hydrant-remote-{rank}"))
            .spawn(move || {
                if let Err(e) = remote.read(&ticket, &stop, &feed) {
                    errors.set_message(&format!("remote rank {rank}: {e}"));
                }
                // Dropping the feed ends the rank's stream, with the error.
            })
            .map_err(|e| Error::Dataflow(format!("cannot start remote reader {rank}: {e}")))?;
        Ok(RemoteRank {
            loader,
            cancel,
            threads: std::iter::once(reader).chain(actor).collect(),
        })
    }

    /// A runtime with a worker of its own, so that the connection's task (keep-alive pings
    /// and their answers, the server's pings) runs while the reader waits on the loader's
    /// feed, not only inside `block_on`. (A current-thread runtime also kept a slow
    /// trainer's stream in `a_trainer_slower_than_the_keepalive_keeps_its_stream`, and
    /// through a 58 s pause: the worker is there so as not to depend on when hyper reads
    /// a ping's answer.)
    fn runtime() -> Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("hydrant-remote-io")
            .enable_all()
            .build()
            .map_err(|e| Error::Dataflow(format!("cannot start a runtime: {e}")))
    }

    /// A client of the server at `uri`, authenticated if need be.
    async fn client(&self, uri: &str) -> Result<Client> {
        let how = Connect {
            keepalive: self.keepalive,
            ..Connect::default()
        };
        let mut client = Client::connect_with(uri, &how)
            .await
            .map_err(remote_error)?;
        if let Some((user, password)) = &self.credentials {
            client
                .authenticate(user, password)
                .await
                .map_err(remote_error)?;
        }
        Ok(client)
    }

    /// Each rank's location (`None`: served at `uri`), from the pipeline's endpoints.
    fn look_up(&self) -> Result<Vec<Option<String>>> {
        Self::runtime()?.block_on(async {
            let endpoints = self
                .client(&self.uri)
                .await?
                .endpoints(&self.pipeline)
                .await
                .map_err(remote_error)?;
            Ok(endpoints.into_iter().map(|(_, at)| at).collect())
        })
    }

    /// Reads the stream into the loader's feed until it ends, fails or is cancelled.
    fn read(&self, ticket: &Ticket, cancel: &Notify, feed: &loader::LoaderFeed) -> Result<()> {
        let runtime = Self::runtime()?;
        // A cluster's process serves its own ranks: read each where its endpoint says.
        let at = self.location(ticket.rank as usize);
        let mut steps = runtime.block_on(async {
            self.client(at)
                .await?
                .steps(ticket)
                .await
                .map_err(remote_error)
        })?;
        loop {
            let next = runtime.block_on(async {
                tokio::select! {
                    step = steps.next_step() => Some(step),
                    _ = cancel.notified() => None,
                }
            });
            match next {
                None | Some(None) => return Ok(()),
                Some(Some(step)) => {
                    let step = step.map_err(remote_error)?;
                    // A trainer that dropped its loader is not an error.
                    if feed.send(rank_batch(step, ticket.world_size)).is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

fn rank_batch(step: StepBatch, world_size: u32) -> RankBatch {
    RankBatch {
        meta: StepMeta {
            epoch: step.meta.epoch,
            step: step.meta.step,
            rank: step.meta.rank as usize,
            world_size: world_size as usize,
            padded_rows: step.meta.padded_rows as usize,
            state_version: step.meta.state_version,
            positions: step.meta.positions,
        },
        batch: Batch {
            seq: step.meta.step,
            data: step.batch,
        },
    }
}

fn remote_error(e: hydrant_flight::ClientError) -> Error {
    Error::Dataflow(e.to_string())
}

/// One rank of a [`Remote`] pipeline: its loader, fed by a reader thread. Dropping it
/// stops both.
pub struct RemoteRank {
    loader: Loader,
    cancel: Arc<Notify>,
    threads: Vec<JoinHandle<()>>,
}

impl RemoteRank {
    /// The rank's loader handle (the same type as an in-process rank's).
    pub fn loader(&self) -> &Loader {
        &self.loader
    }

    /// The batches, one per step, in step order; a failed stream ends with one `Err`.
    pub fn batches(&self) -> impl Iterator<Item = Result<TrainingBatch>> + '_ {
        self.loader.batches()
    }

    /// Time spent waiting for batches so far.
    pub fn stall(&self) -> Duration {
        self.loader.stall()
    }

    /// Whether the reader and loader threads have ended (after the last batch, an error,
    /// or [`Drop`]).
    pub fn finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }
}

impl Drop for RemoteRank {
    /// Cancels the read; dropping the loader handle next ends the loader, whose feed then
    /// ends the reader. Nothing is joined: a clone of the loader still held elsewhere keeps
    /// both running until it is dropped too.
    fn drop(&mut self) {
        self.cancel.notify_one();
    }
}
