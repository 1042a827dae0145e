//! What a pipeline gives the Flight service ([`Served`]): its rank streams, its pushed
//! input, and the errors it answers with.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use tonic::Status;

/// Each batch message's `app_metadata` (JSON): the step's, on every message of a step
/// that spans several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchMeta {
    /// Epoch.
    pub epoch: u64,
    /// Step within the epoch.
    pub step: u64,
    /// Rank.
    pub rank: u32,
    /// Rows in the step, padding included (the whole step's, also on a message that
    /// holds part of it).
    pub rows: u64,
    /// Padding rows at its end.
    pub padded_rows: u64,
    /// Version of the fitted state that featurized it.
    pub state_version: u64,
    /// For a stream (followed or pushed input): the stream positions `[first, end)` the
    /// batch's rows were drawn from — exactly its rows' positions when unshuffled, the
    /// shuffle windows holding them when shuffled. Absent for file epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub positions: Option<[u64; 2]>,
    /// Set on the epoch's last step (on each of its messages, when it spans several): a
    /// clean end without it is a cut, not completion.
    /// When the last step is not known in advance (pushed input, or a start past the end)
    /// the stream ends with a batch of no rows whose metadata says `rows` 0 and `last`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last: bool,
    /// The served job's fingerprint ([`Served::job`]), as 16 hex digits: a trainer that
    /// resumes names it in its ticket, so that a server restarted to serve another job
    /// refuses it rather than place other rows at the steps it asks for.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::ticket::hex"
    )]
    pub job: Option<u64>,
}

/// Who pushed a batch: the producer a DoPut names (descriptor path `["ingest", pipeline,
/// producer]`) and the batch's `seq` (its `app_metadata`, `{"seq": N}`), rising per
/// producer. A batch whose producer already had that `seq` admitted is not admitted again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The producer's name.
    pub producer: String,
    /// The batch's sequence number.
    pub seq: u64,
}

/// What DoPut acknowledges for one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The server's sequence number of the batch (`None` for a duplicate).
    pub seq: Option<u64>,
    /// Rows in the batch.
    pub rows: u64,
    /// The batch had been admitted before (its producer retried it): acknowledged again,
    /// not admitted twice.
    pub duplicate: bool,
}

/// Why a stream cannot be served; each maps to its gRPC status.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The request names something invalid (INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// No such pipeline (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// Valid, but not now (FAILED_PRECONDITION), e.g. a rank already being read.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The pipeline failed (INTERNAL).
    #[error("{0}")]
    Internal(String),
    /// The stream was ended by something newer, e.g. another reader of its rank (ABORTED).
    #[error("{0}")]
    Aborted(String),
    /// Too much is already running (RESOURCE_EXHAUSTED).
    #[error("{0}")]
    ResourceExhausted(String),
    /// Not now, but retrying later may work, e.g. a process of the cluster was lost and
    /// is to be restarted (UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
}

impl ServeError {
    /// A push (DoPut, `end_ingest`) to a pipeline that reads files.
    pub fn not_pushed(pipeline: &str) -> Self {
        ServeError::InvalidArgument(format!(
            "pipeline `{pipeline}` does not take pushed input (its file says no `input = \"flight\"`)"
        ))
    }
}

impl From<ServeError> for Status {
    fn from(e: ServeError) -> Status {
        match e {
            ServeError::InvalidArgument(m) => Status::invalid_argument(m),
            ServeError::NotFound(m) => Status::not_found(m),
            ServeError::FailedPrecondition(m) => Status::failed_precondition(m),
            ServeError::Internal(m) => Status::internal(m),
            ServeError::Aborted(m) => Status::aborted(m),
            ServeError::ResourceExhausted(m) => Status::resource_exhausted(m),
            ServeError::Unavailable(m) => Status::unavailable(m),
        }
    }
}

/// One rank's batches, in step order; dropping it means the reader went away.
///
/// It must not block the task that polls it: a batch not yet featurized is a pending
/// poll, not a wait.
pub type RankStream = BoxStream<'static, Result<(BatchMeta, RecordBatch), ServeError>>;

/// A pipeline as the server sees it.
pub trait Served: Send + Sync + 'static {
    /// Its name (the descriptor path and the ticket's `pipeline`).
    fn name(&self) -> &str;
    /// The schema of every batch it serves.
    fn schema(&self) -> SchemaRef;
    /// Ranks it serves.
    fn world_size(&self) -> u32;
    /// Epochs it serves.
    fn epochs(&self) -> u64;
    /// Steps per rank per epoch.
    fn steps(&self) -> u64;
    /// The version of the state batches are featurized with now (an end-of-stream
    /// message that follows no batch carries it).
    fn state_version(&self) -> u64;
    /// Rank `rank`'s batches of `epoch` from `start_step` on (arguments already checked
    /// against the above). Called on the server's runtime; must not block (starting a
    /// dataflow on threads of its own is fine).
    fn open(&self, rank: u32, epoch: u64, start_step: u64) -> Result<RankStream, ServeError>;
    /// What `DoAction("status")` reports for it.
    fn status(&self) -> serde_json::Value;

    /// A fingerprint of what decides which rows each (epoch, rank, step) holds and how
    /// they are featurized (the input, the state, the ranks, batch size and last batch,
    /// the shuffle and its seed, the plan's order), not of what may differ between two
    /// runs of one job (epochs, where a run starts, workers). `None`: not checked.
    fn job(&self) -> Option<u64> {
        None
    }

    /// Where `rank` is served, as a Flight location (`grpc://HOST:PORT`), when another
    /// server than this one serves it (a process of the same cluster); `None`: here.
    fn location(&self, _rank: u32) -> Option<String> {
        None
    }

    /// Whether this pipeline takes pushed input now: asked when a DoPut starts, so that a
    /// push to a pipeline that reads files is refused even when it sends no batch.
    fn takes_pushes(&self) -> Result<(), ServeError> {
        Err(ServeError::not_pushed(self.name()))
    }

    /// Takes one pushed input batch (DoPut), from `origin` when its producer named itself.
    /// May block while the ranks' queues are full (backpressure on the producer).
    fn accept(&self, _batch: RecordBatch, _origin: Option<Origin>) -> Result<Accepted, ServeError> {
        Err(ServeError::not_pushed(self.name()))
    }

    /// Closes pushed input: the last step is padded and the epoch ends (`end_ingest`).
    fn end_input(&self) -> Result<(), ServeError> {
        Err(ServeError::not_pushed(self.name()))
    }

    /// Records that the trainers' checkpoint holds every step before `step` (`commit`):
    /// pushed input resumes there after a restart, and what lies wholly before it may be
    /// deleted. Returns JSON saying what was done.
    fn commit(&self, _step: u64) -> Result<serde_json::Value, ServeError> {
        Err(ServeError::FailedPrecondition(format!(
            "pipeline `{}` takes no commits",
            self.name()
        )))
    }
    /// Steps every rank has been given so far, as a receiver that sees the count grow,
    /// for pipelines that take commits: `commit` waits on it a while for a step not given
    /// yet (see [`COMMIT_WAIT`](crate::COMMIT_WAIT)). `None`: commits are answered at once.
    fn steps_cut(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
    /// The fitted state whose version is `version` (what batches carry as
    /// `state_version`), as JSON (`state`). Called off the runtime's workers: it may
    /// read a file.
    fn state(&self, version: u64) -> Result<String, ServeError> {
        Err(ServeError::NotFound(format!(
            "pipeline `{}` has no state version {version}",
            self.name()
        )))
    }
}
