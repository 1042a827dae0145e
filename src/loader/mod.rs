//! Loader actors: one per data-parallel rank. The dataflow pushes the rank's batches into
//! a [`LoaderFeed`]; the actor's own thread turns them into [`TrainingBatch`]es (on the
//! host, or in device memory with the `cuda` feature) and keeps `prefetch` of them ready;
//! the trainer pulls them from a [`Loader`] handle. Both channels are bounded, so a slow
//! trainer slows the dataflow instead of filling memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::buffer::{BooleanBuffer, ScalarBuffer};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float32Type, Int64Type, UInt64Type};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use hydrant_operators::{ErrorSlot, ROW_ID};

use crate::delivery::{IS_PADDING, RankBatch, StepMeta};

#[cfg(any(feature = "cuda", test))]
mod copy;
#[cfg(feature = "cuda")]
mod cuda;
use crate::error::{Error, Result};
#[cfg(feature = "cuda")]
pub use cuda::Uploader;

/// Where a loader puts its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// Host memory (zero-copy from the featurized Arrow buffers where possible).
    #[default]
    Host,
    /// Device memory of CUDA device `0..`; falls back to host when CUDA is unavailable.
    Cuda(usize),
}

impl std::str::FromStr for Backend {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "host" => Ok(Backend::Host),
            "cuda" => Ok(Backend::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(d)) => Ok(Backend::Cuda(d)),
                _ => Err(Error::Usage(format!(
                    "unknown loader backend `{s}` (expected `host`, `cuda` or `cuda:N`)"
                ))),
            },
        }
    }
}

/// Where a tensor's values live.
#[derive(Debug, Clone)]
pub enum Storage<T: arrow::datatypes::ArrowNativeType> {
    /// Host memory, shared with the Arrow batch it came from.
    Host(ScalarBuffer<T>),
    /// Device memory.
    #[cfg(feature = "cuda")]
    Device(cuda::DeviceBuffer<T>),
}

/// A row-major `[rows, cols]` tensor.
#[derive(Debug, Clone)]
pub struct Tensor<T: arrow::datatypes::ArrowNativeType> {
    /// `[rows, cols]`.
    pub shape: [usize; 2],
    /// The values.
    pub storage: Storage<T>,
}

impl<T: arrow::datatypes::ArrowNativeType> Tensor<T> {
    /// The values, when they are in host memory.
    pub fn host(&self) -> Option<&[T]> {
        match &self.storage {
            Storage::Host(b) => Some(b),
            #[cfg(feature = "cuda")]
            Storage::Device(_) => None,
        }
    }

    /// Row `i`, when in host memory.
    pub fn row(&self, i: usize) -> Option<&[T]> {
        let cols = self.shape[1];
        self.host().map(|v| &v[i * cols..(i + 1) * cols])
    }
}

/// What a trainer receives for one step.
#[derive(Debug, Clone)]
pub struct TrainingBatch {
    /// Dense features of all dense groups, `[B, D]`.
    pub dense: Tensor<f32>,
    /// Ids of all id groups, `[B, K]`.
    pub ids: Tensor<i64>,
    /// Labels `[B, 1]` as float (class labels are converted), if the pipeline has one.
    pub labels: Option<Tensor<f32>>,
    /// `row_id` of each row (`u64::MAX` for padding).
    pub row_ids: ScalarBuffer<u64>,
    /// Which rows are padding, to be masked out of the loss.
    pub is_padding: BooleanBuffer,
    /// Epoch, step, rank, world size, padding count and state version.
    pub meta: StepMeta,
}

impl TrainingBatch {
    /// Rows, padding included (always the batch size).
    pub fn rows(&self) -> usize {
        self.row_ids.len()
    }

    /// Rows that are real input rows.
    pub fn real_rows(&self) -> usize {
        self.rows() - self.is_padding.count_set_bits()
    }

    /// Builds the host form of a delivered batch: a zero-copy view when the batch has one
    /// dense and one id group, a row-major copy when groups must be joined.
    pub fn from_rank_batch(rb: &RankBatch) -> Result<Self> {
        let data = rb.data();
        let rows = data.num_rows();
        let column = |name: &str| data.column_by_name(name);
        let row_ids = column(ROW_ID)
            .and_then(|c| c.as_primitive_opt::<UInt64Type>())
            .ok_or_else(|| Error::Dataflow("delivered batch has no row_id".into()))?
            .values()
            .clone();
        let is_padding = column(IS_PADDING)
            .and_then(|c| c.as_boolean_opt())
            .ok_or_else(|| Error::Dataflow("delivered batch has no is_padding".into()))?
            .values()
            .clone();
        let labels = match column("label") {
            None => None,
            Some(c) => Some(Tensor {
                shape: [rows, 1],
                storage: Storage::Host(match c.data_type() {
                    DataType::Int64 => c
                        .as_primitive::<Int64Type>()
                        .values()
                        .iter()
                        .map(|&v| v as f32)
                        .collect(),
                    _ => c
                        .as_primitive_opt::<Float32Type>()
                        .ok_or_else(|| Error::Dataflow("label is not float32 or int64".into()))?
                        .values()
                        .clone(),
                }),
            }),
        };
        Ok(TrainingBatch {
            dense: join_groups::<Float32Type>(data, rows),
            ids: join_groups::<Int64Type>(data, rows),
            labels,
            row_ids,
            is_padding,
            meta: rb.meta,
        })
    }
}

/// The `FixedSizeList<T>` columns of `data` side by side as one `[rows, total width]`
/// tensor: the column's own buffer when there is one such column.
fn join_groups<T: ArrowPrimitiveType>(data: &RecordBatch, rows: usize) -> Tensor<T::Native> {
    let groups: Vec<(usize, ScalarBuffer<T::Native>)> = data
        .columns()
        .iter()
        .filter_map(|c| {
            let list = c.as_fixed_size_list_opt()?;
            let values = list.values().as_primitive_opt::<T>()?;
            Some((list.value_length() as usize, values.values().clone()))
        })
        .collect();
    let width: usize = groups.iter().map(|g| g.0).sum();
    let storage = match groups.as_slice() {
        [(_, only)] => only.clone(),
        _ => {
            let mut out = Vec::with_capacity(rows * width);
            for r in 0..rows {
                for (w, values) in &groups {
                    out.extend_from_slice(&values[r * w..(r + 1) * w]);
                }
            }
            out.into()
        }
    };
    Tensor {
        shape: [rows, width],
        storage: Storage::Host(storage),
    }
}

/// How the loaders of a run behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Training batches kept ready ahead of the trainer (at least 1).
    pub prefetch: usize,
    /// Where batches are put.
    pub backend: Backend,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            prefetch: 2,
            backend: Backend::Host,
        }
    }
}

/// The dataflow's end of one rank's loader.
#[derive(Debug, Clone)]
pub struct LoaderFeed {
    rank: usize,
    tx: Sender<RankBatch>,
}

impl LoaderFeed {
    /// Hands over a batch, waiting while the loader is full (backpressure).
    pub fn send(&self, batch: RankBatch) -> Result<()> {
        self.tx.send(batch).map_err(|_| stopped_reading(self.rank))
    }
}

/// The error when a rank's reader went away before its last batch.
pub(crate) fn stopped_reading(rank: usize) -> Error {
    Error::Dataflow(format!("rank {rank} stopped reading before its last batch"))
}

/// Per-rank counters, shared by a loader's handles.
#[derive(Debug, Default)]
struct RankStats {
    stall_ns: AtomicU64,
    batches: AtomicU64,
}

/// A trainer's handle on one rank's batches. Clones share the stream (each batch goes to
/// one of them) and the stall counter.
#[derive(Debug, Clone)]
pub struct Loader {
    rank: usize,
    rx: Receiver<Result<TrainingBatch>>,
    stats: Arc<RankStats>,
}

impl Loader {
    /// The rank this loader feeds.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The next batch, waiting for it if need be (that wait is the stall time); `None`
    /// when the rank has no more batches. A failed run ends with one `Err`.
    pub fn next_batch(&self) -> Option<Result<TrainingBatch>> {
        let t = Instant::now();
        let got = self.rx.recv().ok();
        self.stats
            .stall_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if matches!(got, Some(Ok(_))) {
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
        }
        got
    }

    /// The batches as an iterator.
    pub fn batches(&self) -> impl Iterator<Item = Result<TrainingBatch>> + '_ {
        std::iter::from_fn(|| self.next_batch())
    }

    /// Time spent waiting in [`Loader::next_batch`] so far.
    pub fn stall(&self) -> Duration {
        Duration::from_nanos(self.stats.stall_ns.load(Ordering::Relaxed))
    }

    /// Batches received so far.
    pub fn received(&self) -> u64 {
        self.stats.batches.load(Ordering::Relaxed)
    }
}

/// How often an idle loader looks whether the run has failed.
const WATCH: Duration = Duration::from_millis(50);

/// Starts the loader actor of `rank`. It ends when the feed is dropped (after passing on
/// the run's error, if `errors` holds one) or when every [`Loader`] handle is dropped.
pub fn spawn(
    rank: usize,
    config: LoaderConfig,
    errors: ErrorSlot,
) -> Result<(LoaderFeed, Loader, JoinHandle<()>)> {
    if config.prefetch == 0 {
        return Err(Error::Usage("--prefetch must be at least 1".into()));
    }
    let (feed_tx, feed_rx) = bounded::<RankBatch>(1);
    let (tx, rx) = bounded(config.prefetch);
    let mut convert = Converter::new(config.backend);
    let handle = std::thread::Builder::new()
        .name(format!("hydrant-loader-{rank}"))
        .spawn(move || {
            loop {
                let rb = match feed_rx.recv_timeout(WATCH) {
                    Ok(rb) => rb,
                    // A failed run may never close the feed (a worker that panicked, a
                    // lost peer): its error is passed on as soon as it is known.
                    Err(RecvTimeoutError::Timeout) if errors.get().is_none() => continue,
                    Err(_) => break,
                };
                let out = TrainingBatch::from_rank_batch(&rb).and_then(|b| convert.place(b));
                let failed = out.is_err();
                if tx.send(out).is_err() || failed {
                    return;
                }
            }
            if let Some(e) = errors.get() {
                let _ = tx.send(Err(Error::Dataflow(e)));
            }
        })
        .map_err(|e| Error::Dataflow(format!("cannot start loader {rank}: {e}")))?;
    let loader = Loader {
        rank,
        rx,
        stats: Arc::default(),
    };
    Ok((LoaderFeed { rank, tx: feed_tx }, loader, handle))
}

/// Puts host batches where the backend wants them.
enum Converter {
    Host,
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::Uploader>),
}

impl Converter {
    fn new(backend: Backend) -> Self {
        match backend {
            Backend::Host => Converter::Host,
            #[cfg(feature = "cuda")]
            Backend::Cuda(device) => match cuda::Uploader::new(device) {
                Ok(u) => Converter::Cuda(Box::new(u)),
                Err(why) => {
                    fall_back(&why);
                    Converter::Host
                }
            },
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(_) => {
                fall_back("built without the `cuda` feature");
                Converter::Host
            }
        }
    }

    fn place(&mut self, batch: TrainingBatch) -> Result<TrainingBatch> {
        match self {
            Converter::Host => Ok(batch),
            #[cfg(feature = "cuda")]
            Converter::Cuda(u) => u.upload(batch),
        }
    }
}

/// Says once per process why the cuda backend is not used.
fn fall_back(why: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| hydrant_operators::log_line!("hydrant: {why}; loaders use host memory"));
}
