//! Loaders: one per data-parallel rank. The dataflow pushes the rank's batches into a
//! [`LoaderFeed`], which keeps `prefetch` [`TrainingBatch`]es ready; the trainer pulls
//! them from a [`Loader`] handle. In host memory a training batch is a view of the
//! delivered Arrow buffers (a copy only where several groups are joined into one tensor),
//! made on the dataflow's thread as it is handed over; in device
//! memory (the `cuda` feature) an actor thread of the rank's own uploads each batch, so
//! that the copy does not hold up the dataflow. Every channel is bounded, so a slow
//! trainer slows the dataflow instead of filling memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::buffer::{BooleanBuffer, ScalarBuffer};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float32Type, Int64Type, UInt64Type};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, bounded};
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
    tx: FeedTx,
}

/// Where a feed hands its batches.
#[derive(Debug, Clone)]
enum FeedTx {
    /// Host memory: straight into the trainer's queue, as a view of the batch. (An actor
    /// thread here only added a hand-over per batch: with 32-row batches, channel waits
    /// and thread switches were most of a run's CPU.)
    Direct(Sender<Result<TrainingBatch>>),
    /// Device memory: to the actor thread that uploads.
    #[cfg(feature = "cuda")]
    Actor(Sender<RankBatch>),
}

impl LoaderFeed {
    /// Hands over a batch, waiting while the loader is full (backpressure).
    pub fn send(&self, batch: RankBatch) -> Result<()> {
        match &self.tx {
            FeedTx::Direct(tx) => match TrainingBatch::from_rank_batch(&batch) {
                Ok(b) => tx.send(Ok(b)).map_err(|_| stopped_reading(self.rank)),
                Err(e) => {
                    let line = format!("rank {}: {e}", self.rank);
                    let _ = tx.send(Err(e));
                    Err(Error::Dataflow(line))
                }
            },
            #[cfg(feature = "cuda")]
            FeedTx::Actor(tx) => tx.send(batch).map_err(|_| stopped_reading(self.rank)),
        }
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
    /// The run's errors, passed on once the queue is empty or closed.
    errors: ErrorSlot,
    /// Whether an error ended the stream already (it is passed on once).
    failed: Arc<AtomicBool>,
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
        let got = loop {
            match self.rx.recv_timeout(WATCH) {
                Ok(got) => {
                    if got.is_err() {
                        self.failed.store(true, Ordering::Relaxed);
                    }
                    break Some(got);
                }
                // A failed run may never close the feed (a worker that panicked, a lost
                // peer): its error is passed on as soon as it is known.
                Err(RecvTimeoutError::Timeout) => match self.errors.get() {
                    Some(e) => break self.fail(e),
                    None => continue,
                },
                Err(RecvTimeoutError::Disconnected) => {
                    break self.errors.get().and_then(|e| self.fail(e));
                }
            }
        };
        self.stats
            .stall_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if matches!(got, Some(Ok(_))) {
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
        }
        got
    }

    /// The next batch if one is ready, without waiting: for a reader that takes turns
    /// over several ranks, which must not wait on one rank while another has a batch (the
    /// dataflow may be waiting for room in any rank's queue). Not counted as stall time:
    /// such a reader counts it ([`drain`] does).
    pub fn try_next_batch(&self) -> Ready {
        match self.rx.try_recv() {
            Ok(got) => {
                match &got {
                    Ok(_) => drop(self.stats.batches.fetch_add(1, Ordering::Relaxed)),
                    Err(_) => self.failed.store(true, Ordering::Relaxed),
                }
                Ready::Batch(got)
            }
            Err(TryRecvError::Empty) => match self.errors.get() {
                None => Ready::Waiting,
                Some(e) => self.fail(e).map_or(Ready::Done, Ready::Batch),
            },
            Err(TryRecvError::Disconnected) => self
                .errors
                .get()
                .and_then(|e| self.fail(e))
                .map_or(Ready::Done, Ready::Batch),
        }
    }

    /// The run's error `e`, for the first caller only.
    fn fail(&self, e: String) -> Option<Result<TrainingBatch>> {
        (!self.failed.swap(true, Ordering::Relaxed)).then(|| Err(Error::Dataflow(e)))
    }

    /// The batches as an iterator.
    pub fn batches(&self) -> impl Iterator<Item = Result<TrainingBatch>> + '_ {
        std::iter::from_fn(|| self.next_batch())
    }

    /// Adds `waited` to the rank's stall time.
    fn stalled(&self, waited: Duration) {
        let ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.stats.stall_ns.fetch_add(ns, Ordering::Relaxed);
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

/// The most threads the null sink drains ranks from: one a rank up to this many, and
/// beyond it each thread takes turns over a share of the ranks (a thread a rank could not
/// be had at 100,000 ranks).
const DRAINERS: usize = 64;

/// Reads every rank's batches to the end and drops them (the null sink), calling `tick`
/// every 64 of rank 0's; the first error.
pub fn drain(loaders: &[Loader], tick: &(dyn Fn() + Sync)) -> Result<()> {
    let threads = loaders.len().min(DRAINERS);
    let share = |t: usize| -> Vec<&Loader> { loaders.iter().skip(t).step_by(threads).collect() };
    std::thread::scope(|s| {
        let started: Vec<_> = (0..threads)
            .map(|t| {
                let thread = std::thread::Builder::new().name("hydrant-drain".into());
                (
                    t,
                    thread.spawn_scoped(s, move || drain_share(&share(t), tick)),
                )
            })
            .collect();
        // The shares no thread could be had for are read here, before the others are
        // waited for: the dataflow may be waiting for room in one of their queues.
        let here: Vec<&Loader> = started
            .iter()
            .filter(|(_, thread)| thread.is_err())
            .flat_map(|(t, _)| share(*t))
            .collect();
        let here = drain_share(&here, tick);
        started
            .into_iter()
            .filter_map(|(_, thread)| thread.ok())
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(Error::Dataflow("a reader panicked".into())))
            })
            .fold(here, Result::and)
    })
}

/// Reads `loaders` to the end: waiting on the one, or taking turns over several without
/// waiting on any (see [`Loader::try_next_batch`]).
fn drain_share(loaders: &[&Loader], tick: &(dyn Fn() + Sync)) -> Result<()> {
    let mut read = 0u64;
    let mut got = |l: &Loader| {
        if l.rank() == 0 {
            if read.is_multiple_of(64) {
                tick();
            }
            read += 1;
        }
    };
    if let [l] = loaders {
        for b in l.batches() {
            b?;
            got(l);
        }
        return Ok(());
    }
    // Each rank with when a turn first found it waiting: its stall lasts until a turn
    // finds its next batch (or its end), as a reader waiting on it alone would count it.
    let mut live: Vec<(&Loader, Option<Instant>)> = loaders.iter().map(|&l| (l, None)).collect();
    // Idle turns wait longer and longer (up to 2 ms), so that a thousand ranks waiting on
    // the dataflow cost little CPU; a batch brings the wait back down.
    let mut idle = Duration::from_micros(50);
    while !live.is_empty() {
        let (mut any, mut failed) = (false, None);
        live.retain_mut(|(l, waiting)| {
            let ready = l.try_next_batch();
            if !matches!(ready, Ready::Waiting)
                && let Some(since) = waiting.take()
            {
                l.stalled(since.elapsed());
            }
            match ready {
                Ready::Batch(Ok(_)) => {
                    got(l);
                    any = true;
                    true
                }
                Ready::Batch(Err(e)) => {
                    failed = Some(e);
                    false
                }
                Ready::Waiting => {
                    waiting.get_or_insert_with(Instant::now);
                    true
                }
                Ready::Done => false,
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if any {
            idle = Duration::from_micros(50);
        } else {
            std::thread::sleep(idle);
            idle = (idle * 2).min(Duration::from_millis(2));
        }
    }
    Ok(())
}

/// What [`Loader::try_next_batch`] found.
// Moved out at once, as `next_batch`'s `Option<Result<TrainingBatch>>` is, which is as
// large: boxing the batch would allocate once a batch for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Ready {
    /// The next batch, or the run's error (once).
    Batch(Result<TrainingBatch>),
    /// No batch yet.
    Waiting,
    /// The rank has no more batches.
    Done,
}

/// How often a waiting loader (or actor) looks whether the run has failed.
const WATCH: Duration = Duration::from_millis(50);

/// Starts the loader of `rank`, and its actor thread when batches go to a device (`None`
/// in host memory). The stream ends when every feed is dropped, with the run's error if
/// `errors` holds one; an actor ends then, or when every [`Loader`] handle is dropped.
pub fn spawn(
    rank: usize,
    config: LoaderConfig,
    errors: ErrorSlot,
) -> Result<(LoaderFeed, Loader, Option<JoinHandle<()>>)> {
    if config.prefetch == 0 {
        return Err(Error::Usage("--prefetch must be at least 1".into()));
    }
    let (tx, rx) = bounded(config.prefetch);
    let loader = Loader {
        rank,
        rx,
        stats: Arc::default(),
        errors: errors.clone(),
        failed: Arc::default(),
    };
    match Converter::new(config.backend) {
        Converter::Host => {
            let feed = LoaderFeed {
                rank,
                tx: FeedTx::Direct(tx),
            };
            Ok((feed, loader, None))
        }
        #[cfg(feature = "cuda")]
        Converter::Cuda(uploader) => {
            let (feed, actor) = spawn_actor(rank, uploader, tx, errors)?;
            Ok((feed, loader, Some(actor)))
        }
    }
}

/// Starts the thread that uploads `rank`'s batches and hands them on to `tx`. It ends when
/// the feed is dropped, the run has failed (the [`Loader`] passes the error on), or every
/// [`Loader`] handle is dropped.
#[cfg(feature = "cuda")]
fn spawn_actor(
    rank: usize,
    mut uploader: Box<cuda::Uploader>,
    tx: Sender<Result<TrainingBatch>>,
    errors: ErrorSlot,
) -> Result<(LoaderFeed, JoinHandle<()>)> {
    let (feed_tx, feed_rx) = bounded::<RankBatch>(1);
    let handle = std::thread::Builder::new()
        .name(format!("hydrant-loader-{rank}"))
        .spawn(move || {
            loop {
                let rb = match feed_rx.recv_timeout(WATCH) {
                    Ok(rb) => rb,
                    // A failed run may never close the feed (a worker that panicked, a
                    // lost peer): the actor ends, and the loader passes the error on.
                    Err(RecvTimeoutError::Timeout) if errors.get().is_none() => continue,
                    Err(_) => return,
                };
                let out = TrainingBatch::from_rank_batch(&rb).and_then(|b| uploader.upload(b));
                let failed = out.is_err();
                if tx.send(out).is_err() || failed {
                    return;
                }
            }
        })
        .map_err(|e| Error::Dataflow(format!("cannot start loader {rank}: {e}")))?;
    let feed = LoaderFeed {
        rank,
        tx: FeedTx::Actor(feed_tx),
    };
    Ok((feed, handle))
}

/// Where a rank's batches are put: host memory, or a device's through its uploader.
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
}

/// Says once per process why the cuda backend is not used.
fn fall_back(why: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| hydrant_operators::log_line!("hydrant: {why}; loaders use host memory"));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{BooleanArray, FixedSizeListArray, Float32Array, Int64Array, UInt64Array};
    use arrow::datatypes::{Field, Schema};
    use hydrant_operators::Batch;

    use super::*;

    /// Step `step`'s batch of two rows (`row_id` 2·step and 2·step + 1), or one without
    /// `row_id` when `broken`.
    fn batch(step: u64, broken: bool) -> RankBatch {
        let list = |item: DataType, values: Arc<dyn Array>, width: i32| {
            let field = Arc::new(Field::new("item", item, false));
            Arc::new(FixedSizeListArray::new(field, width, values, None)) as Arc<dyn Array>
        };
        let mut fields = vec![
            Field::new(ROW_ID, DataType::UInt64, false),
            Field::new(
                "dense",
                DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), 2),
                false,
            ),
            Field::new(
                "ids",
                DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Int64, false)), 1),
                false,
            ),
            Field::new(IS_PADDING, DataType::Boolean, false),
        ];
        let mut columns: Vec<Arc<dyn Array>> = vec![
            Arc::new(UInt64Array::from(vec![2 * step, 2 * step + 1])),
            list(
                DataType::Float32,
                Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0, 4.0])),
                2,
            ),
            list(DataType::Int64, Arc::new(Int64Array::from(vec![5, 6])), 1),
            Arc::new(BooleanArray::from(vec![false, false])),
        ];
        if broken {
            fields.remove(0);
            columns.remove(0);
        }
        let data = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        RankBatch {
            meta: StepMeta::at_step(step),
            batch: Batch { seq: step, data },
        }
    }

    fn host(prefetch: usize) -> (LoaderFeed, Loader, ErrorSlot) {
        let errors = ErrorSlot::default();
        let config = LoaderConfig {
            prefetch,
            backend: Backend::Host,
        };
        let (feed, loader, actor) = spawn(0, config, errors.clone()).unwrap();
        assert!(actor.is_none(), "host loaders need no thread");
        (feed, loader, errors)
    }

    /// Drained by one thread taking turns over two ranks, the rank whose batch comes late
    /// counts the wait as its stall, and the one whose batches were there does not.
    #[test]
    fn a_reader_taking_turns_counts_each_ranks_stall() {
        let (late_feed, late, _) = host(2);
        let (ready_feed, ready, _) = host(2);
        ready_feed.send(batch(0, false)).unwrap();
        drop(ready_feed);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            late_feed.send(batch(0, false)).unwrap();
        });
        drain_share(&[&late, &ready], &|| {}).unwrap();
        sender.join().unwrap();
        assert!(
            late.stall() >= Duration::from_millis(250),
            "{:?}",
            late.stall()
        );
        assert!(
            ready.stall() < Duration::from_millis(100),
            "{:?}",
            ready.stall()
        );
        assert_eq!((late.received(), ready.received()), (1, 1));
    }

    #[test]
    fn batches_arrive_in_order_as_views_and_the_feed_waits_for_room() {
        let (feed, loader, _) = host(2);
        let sender = std::thread::spawn(move || {
            for step in 0..5 {
                feed.send(batch(step, false)).unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        // Two are ready; the third waits for room (the sender is not done).
        assert!(!sender.is_finished());
        let got: Vec<TrainingBatch> = loader.batches().map(Result::unwrap).collect();
        sender.join().unwrap();
        let steps: Vec<u64> = got.iter().map(|b| b.meta.step).collect();
        assert_eq!(steps, [0, 1, 2, 3, 4]);
        assert_eq!(got[3].row_ids.as_ref(), [6, 7]);
        assert_eq!(got[3].dense.row(1), Some(&[3.0, 4.0][..]));
        assert_eq!(got[3].ids.shape, [2, 1]);
        assert_eq!(loader.received(), 5);
    }

    #[test]
    fn a_failed_run_ends_every_handle_once_whether_or_not_the_feed_is_open() {
        // The run fails with the feed still open (a worker panicked): the queued batch
        // first, then the error, once across the clones; then the end.
        let (feed, loader, errors) = host(2);
        feed.send(batch(0, false)).unwrap();
        errors.set_message("boom");
        let clone = loader.clone();
        assert!(matches!(loader.next_batch(), Some(Ok(_))));
        let err = clone.next_batch().unwrap().err().unwrap().to_string();
        assert!(err.contains("boom"), "{err}");
        assert!(loader.next_batch().is_none());
        assert!(clone.next_batch().is_none());
        drop(feed);

        // The run fails and closes the feed.
        let (feed, loader, errors) = host(2);
        errors.set_message("lost");
        drop(feed);
        assert!(loader.next_batch().unwrap().is_err());
        assert!(loader.next_batch().is_none());

        // A clean end.
        let (feed, loader, _) = host(1);
        drop(feed);
        assert!(loader.next_batch().is_none());
    }

    #[test]
    fn a_batch_a_trainer_cannot_take_fails_both_ends() {
        let (feed, loader, _) = host(2);
        feed.send(batch(0, false)).unwrap();
        let err = feed.send(batch(1, true)).unwrap_err().to_string();
        assert!(err.contains("row_id"), "{err}");
        drop(feed);
        assert!(matches!(loader.next_batch(), Some(Ok(_))));
        let err = loader.next_batch().unwrap().err().unwrap().to_string();
        assert!(err.contains("row_id"), "{err}");
        assert!(loader.next_batch().is_none());
    }

    #[test]
    fn a_trainer_gone_is_an_error_for_the_dataflow() {
        let (feed, loader, _) = host(1);
        drop(loader);
        let err = feed.send(batch(0, false)).unwrap_err().to_string();
        assert!(err.contains("stopped reading"), "{err}");
    }
}
