//! The embedded API: build a pipeline in code, run it on in-process ranks and take each
//! rank's [`TrainingBatch`]es in your own training loop.
//!
//! [`TrainingBatch`]: crate::loader::TrainingBatch

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow::datatypes::Schema;
use hydrant_operators::{FeatureGroup, FittedState, GroupKind, LabelSpec, Step};

use crate::delivery::{Delivery, EpochPlan, LastBatch, Ownership};
use crate::error::{Error, Result, one_line};
use crate::loader::{self, Loader, LoaderConfig};
use crate::runtime::{self, Cluster, Job, Output, Report};
use crate::source::Inputs;
use crate::spec::{DEFAULT_BATCH_ROWS, PipelineSpec};

/// How a run delivers: ranks, batch size, epochs, order and where to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Data-parallel ranks (world size).
    pub ranks: usize,
    /// Rows per rank per step.
    pub batch_size: usize,
    /// Epochs to deliver.
    pub epochs: u64,
    /// Seed of the shuffle.
    pub seed: u64,
    /// Shuffle window rows; `None` delivers in input order.
    pub shuffle: Option<u64>,
    /// What to do with a last step that is not full.
    pub last_batch: LastBatch,
    /// First epoch delivered (to resume).
    pub start_epoch: u64,
    /// First step delivered within `start_epoch` (to resume).
    pub start_step: u64,
    /// Loader prefetch and backend.
    pub loader: LoaderConfig,
    /// Where the dataflow runs: worker threads, and the processes of a cluster.
    pub cluster: Cluster,
    /// The most bytes one rank's batches in flight may take: batch size × bytes per
    /// delivered row × prefetch, checked before anything is allocated.
    pub max_batch_bytes: u64,
    /// Bytes of decoded input units kept in memory after their first read, so that later
    /// epochs do not read and decode them again (0: none). See [`Inputs::cache_units`].
    pub cache_bytes: u64,
}

/// The default of [`RunOptions::max_batch_bytes`]: 4 GiB.
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 4 << 30;

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            ranks: 1,
            batch_size: 4096,
            epochs: 1,
            seed: 0,
            shuffle: None,
            last_batch: LastBatch::Pad,
            start_epoch: 0,
            start_step: 0,
            loader: LoaderConfig::default(),
            cluster: Cluster::local(std::thread::available_parallelism().map_or(1, |n| n.get())),
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            cache_bytes: 0,
        }
    }
}

impl RunOptions {
    /// Options for a job that only fits (`hydrant fit`): it delivers no batches, so no
    /// bound on batches in flight applies (a pipeline too wide for the default batch size
    /// was refused by `fit`, which has no `--batch-size` to lower).
    pub fn fitting(cluster: Cluster) -> Self {
        RunOptions {
            cluster,
            batch_size: 1,
            max_batch_bytes: u64::MAX,
            ..RunOptions::default()
        }
    }

    /// The most ranks one process of the cluster owns (a block of `ranks / processes`,
    /// rounded up, as ownership deals them).
    pub fn most_local_ranks(&self) -> usize {
        self.ranks.div_ceil(self.cluster.processes.max(1))
    }

    /// Checks that a rank's batches in flight fit [`RunOptions::max_batch_bytes`], for
    /// batches of `output` (the featurized schema).
    pub fn check_memory(&self, output: &Schema) -> Result<()> {
        let row = row_bytes(output);
        let need = (self.batch_size as u128)
            .saturating_mul(row as u128)
            .saturating_mul(self.loader.prefetch.max(1) as u128);
        if need > self.max_batch_bytes as u128 {
            return Err(Error::Usage(format!(
                "--batch-size {} × {row} bytes per row × --prefetch {} is {need} bytes, more \
                 than --max-batch-bytes {}",
                self.batch_size,
                self.loader.prefetch.max(1),
                self.max_batch_bytes
            )));
        }
        // Every rank of this process holds that much at once: all of them together must
        // fit the machine, or the kernel's OOM killer ends the job with no line at all.
        let local = self.most_local_ranks();
        let total = need.saturating_mul(local as u128);
        if let Some(memory) = physical_memory()
            && total > memory as u128
        {
            return Err(Error::Usage(format!(
                "--ranks {} ({local} in this process) × --batch-size {} × {row} bytes per row \
                 × --prefetch {} is {total} bytes of batches in flight, more than this \
                 machine's {memory} bytes of memory (use fewer ranks a process, or smaller \
                 batches)",
                self.ranks,
                self.batch_size,
                self.loader.prefetch.max(1),
            )));
        }
        Ok(())
    }

    /// The delivery these options describe over `inputs`.
    pub fn delivery(&self, inputs: &Inputs) -> Result<Delivery> {
        let units = inputs.units().iter().map(|u| u.rows).collect();
        let plan = EpochPlan::new(
            units,
            self.ranks,
            self.batch_size,
            self.last_batch,
            self.seed,
            self.shuffle,
        )?;
        if self.epochs == 0 {
            // Found by a hostile run: `--epochs 0` ran, delivered nothing and exited 0.
            return Err(Error::Usage(
                "--epochs 0 delivers nothing: give at least 1".into(),
            ));
        }
        if self.start_epoch >= self.epochs {
            return Err(Error::Usage(format!(
                "--start-epoch {} is past the last epoch ({})",
                self.start_epoch,
                self.epochs - 1
            )));
        }
        if self.epochs > plan.max_epochs() {
            return Err(Error::Usage(format!(
                "--epochs {}: at most {} epochs of this input can be numbered (a row's place \
                 in the run, epoch × {} rows + its position, is a 64-bit number)",
                self.epochs,
                plan.max_epochs(),
                plan.rows()
            )));
        }
        if self.start_step > plan.steps() {
            return Err(Error::Usage(format!(
                "--start-step {} is past the end of the epoch ({} steps)",
                self.start_step,
                plan.steps()
            )));
        }
        Ok(Delivery {
            plan: Arc::new(plan),
            epochs: self.epochs,
            start_epoch: self.start_epoch,
            start_step: self.start_step,
            only: None,
        })
    }
}

/// Fails where the pipeline's `event_time` names a column the input lacks, or one that is
/// not a timestamp: files are not timed by it, but a followed folder of the same files
/// would be refused for it, and a mistyped name should not wait until then.
fn check_event_time(spec: &PipelineSpec, input: &arrow::datatypes::Schema) -> Result<()> {
    let Some(name) = &spec.event_time else {
        return Ok(());
    };
    let reason = match input.field_with_name(name) {
        Err(_) => format!("event_time names column `{name}`, which the input does not have"),
        Ok(f) if !matches!(f.data_type(), arrow::datatypes::DataType::Timestamp(..)) => {
            format!(
                "event_time column `{name}` is {}, not a timestamp",
                f.data_type()
            )
        }
        Ok(_) => return Ok(()),
    };
    Err(Error::Spec {
        file: spec.name.clone(),
        reason,
    })
}

/// The machine's physical memory in bytes, where the system says.
fn physical_memory() -> Option<u64> {
    // SAFETY: `sysconf` only reads system configuration values.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let (pages, size) = (u64::try_from(pages).ok()?, u64::try_from(size).ok()?);
    pages.checked_mul(size).filter(|&m| m > 0)
}

/// Builds a [`Pipeline`] in code. Steps are written as in pipeline files
/// (`"clip(-3, 3)"`); mistakes are reported by [`PipelineBuilder::build`].
#[derive(Debug, Clone)]
pub struct PipelineBuilder {
    name: String,
    inputs: Vec<PathBuf>,
    label: Option<LabelSpec>,
    groups: Vec<(String, GroupKind, Vec<String>, Vec<String>)>,
    batch_rows: usize,
    state: Option<FittedState>,
    options: RunOptions,
}

impl PipelineBuilder {
    /// Adds an input file or folder (rows are numbered in the order inputs are added).
    pub fn input(mut self, path: impl Into<PathBuf>) -> Self {
        self.inputs.push(path.into());
        self
    }

    /// Delivers column `column` as the float32 label.
    pub fn label(mut self, column: &str) -> Self {
        self.label = Some(LabelSpec {
            column: column.into(),
            dtype: Default::default(),
        });
        self
    }

    /// Adds a dense group: each column through `steps`, into one `[B, D]` f32 tensor.
    pub fn dense(self, name: &str, columns: &[impl AsRef<str>], steps: &[&str]) -> Self {
        self.group(name, GroupKind::Dense, columns, steps)
    }

    /// Adds an id group: each column through `steps` (ending in `vocab` or `hash_bucket`),
    /// into one `[B, K]` i64 tensor.
    pub fn ids(self, name: &str, columns: &[impl AsRef<str>], steps: &[&str]) -> Self {
        self.group(name, GroupKind::Ids, columns, steps)
    }

    fn group(
        mut self,
        name: &str,
        kind: GroupKind,
        columns: &[impl AsRef<str>],
        steps: &[&str],
    ) -> Self {
        self.groups.push((
            name.into(),
            kind,
            columns.iter().map(|c| c.as_ref().to_string()).collect(),
            steps.iter().map(|s| s.to_string()).collect(),
        ));
        self
    }

    /// Rows per batch read from the input.
    pub fn batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = rows;
        self
    }

    /// Uses a fitted state instead of fitting when the run starts.
    pub fn state(mut self, state: FittedState) -> Self {
        self.state = Some(state);
        self
    }

    /// Data-parallel ranks.
    pub fn ranks(mut self, ranks: usize) -> Self {
        self.options.ranks = ranks;
        self
    }

    /// Rows per rank per step.
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.options.batch_size = rows;
        self
    }

    /// Epochs to deliver.
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.options.epochs = epochs;
        self
    }

    /// Shuffles with `seed`: units permuted per epoch, rows within windows of
    /// `window_rows` consecutive rows.
    pub fn shuffle(mut self, seed: u64, window_rows: u64) -> Self {
        self.options.seed = seed;
        self.options.shuffle = Some(window_rows);
        self
    }

    /// Runs as process `process` of `processes` (addresses in `hostfile`, one `host:port`
    /// per line; default localhost from port 2101), with `workers` threads each. Each
    /// process delivers only its own ranks ([`Running::local_ranks`]).
    pub fn cluster(mut self, cluster: Cluster) -> Self {
        self.options.cluster = cluster;
        self
    }

    /// Keeps up to `bytes` of decoded input in memory after its first read, so that later
    /// epochs neither read nor decode it again ([`RunOptions::cache_bytes`]).
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.options.cache_bytes = bytes;
        self
    }

    /// Starts delivery at `step` of `epoch` (to resume a trainer).
    pub fn start_at(mut self, epoch: u64, step: u64) -> Self {
        self.options.start_epoch = epoch;
        self.options.start_step = step;
        self
    }

    /// Sets every run option at once.
    pub fn options(mut self, options: RunOptions) -> Self {
        self.options = options;
        self
    }

    /// Checks the pipeline against the inputs' schemas (reading only footers).
    pub fn build(self) -> Result<Pipeline> {
        let origin = format!("<builder {}>", self.name);
        let mut groups = Vec::new();
        for (name, kind, columns, steps) in self.groups {
            let steps = steps
                .iter()
                .map(|s| {
                    Step::parse(s).map_err(|e| Error::Spec {
                        file: origin.clone(),
                        reason: format!("group `{name}`: {e}"),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let cols: Vec<&str> = columns.iter().map(String::as_str).collect();
            groups.push(FeatureGroup::new(&name, kind, &cols, steps));
        }
        let spec = PipelineSpec::new(&self.name, &origin, self.label, groups, self.batch_rows)?;
        Pipeline::new(spec, &self.inputs, self.state, self.options)
    }
}

/// A pipeline checked against its inputs, ready to run.
pub struct Pipeline {
    spec: PipelineSpec,
    inputs: Arc<Inputs>,
    plan: Arc<hydrant_operators::FeaturePlan>,
    state: Option<FittedState>,
    bound: Option<hydrant_operators::Transformer>,
    delivery: Delivery,
    cluster: Cluster,
    loader: LoaderConfig,
    state_load: Duration,
}

impl Pipeline {
    /// Starts building a pipeline called `name`.
    pub fn builder(name: &str) -> PipelineBuilder {
        PipelineBuilder {
            name: name.into(),
            inputs: Vec::new(),
            label: None,
            groups: Vec::new(),
            batch_rows: DEFAULT_BATCH_ROWS,
            state: None,
            options: RunOptions::default(),
        }
    }

    /// A pipeline from a parsed spec over `inputs`.
    pub fn new(
        spec: PipelineSpec,
        inputs: &[PathBuf],
        state: Option<FittedState>,
        options: RunOptions,
    ) -> Result<Self> {
        let mut opened = Inputs::open(inputs, spec.batch_rows)?;
        let plan = spec.plan(&opened.schema())?;
        check_event_time(&spec, &opened.schema())?;
        opened.prepare(&plan, |s| spec.plan(s), &[])?;
        opened.cache_units(options.cache_bytes);
        let bound = match &state {
            Some(state) => Some(plan.transformer(state)?),
            None => None,
        };
        // Planned now, so that a bad option fails before anything starts.
        let delivery = options.delivery(&opened)?;
        options.check_memory(&plan.output_schema())?;
        let mut cluster = options.cluster;
        cluster.workers = cluster.workers.min(useful_workers(
            opened.units().len(),
            options.ranks,
            cluster.processes,
        ));
        Ok(Pipeline {
            spec,
            inputs: Arc::new(opened),
            plan: Arc::new(plan),
            state,
            bound,
            delivery,
            cluster,
            loader: options.loader,
            state_load: Duration::ZERO,
        })
    }

    /// A pipeline served by `hydrant serve` at `uri`, read rank by rank over Arrow Flight
    /// through the same loaders as a pipeline run here (see [`crate::remote`]).
    pub fn connect(uri: &str, pipeline: &str) -> Result<crate::Remote> {
        crate::Remote::connect(uri, pipeline)
    }

    /// A pipeline from a pipeline file over `inputs`, with the fitted state in `state`
    /// (read, checked and bound before any data is read), or fitted when it starts.
    pub fn from_files(
        pipeline: &Path,
        inputs: &[PathBuf],
        state: Option<&Path>,
        options: RunOptions,
    ) -> Result<Self> {
        let spec = PipelineSpec::from_file(pipeline)?;
        if inputs.is_empty() && spec.input == crate::InputKind::Flight {
            return Err(Error::Usage(format!(
                "pipeline `{}` takes pushed input (input = \"flight\"): serve it with \
                 `hydrant serve`, which takes its rows over DoPut, or give --input files",
                spec.name
            )));
        }
        let loaded = Instant::now();
        let fitted = state.map(read_state).transpose()?;
        let mut p = Pipeline::new(spec, inputs, fitted, options).map_err(|e| match (e, state) {
            (Error::Op(op), Some(path)) => Error::State {
                path: path.to_path_buf(),
                reason: op.to_string(),
            },
            (e, _) => e,
        })?;
        p.state_load = loaded.elapsed();
        Ok(p)
    }

    /// The pipeline as specified.
    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    /// The delivery plan (steps per epoch, padding, ...).
    pub fn epoch_plan(&self) -> &EpochPlan {
        &self.delivery.plan
    }

    /// Where it runs.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The loaders' prefetch and backend.
    pub fn loader(&self) -> LoaderConfig {
        self.loader
    }

    /// Time spent reading and binding the state given to [`Pipeline::from_files`].
    pub fn state_load(&self) -> Duration {
        self.state_load
    }

    /// The dataflow job, for a caller that runs it itself ([`runtime::execute`]).
    pub fn into_job(self) -> Job {
        Job::new(
            self.inputs,
            self.plan,
            self.state,
            self.bound,
            self.delivery,
        )
    }

    /// Starts the dataflow and one loader per rank of this process; fits first if no
    /// state was given.
    pub fn start(self) -> Result<Running> {
        let (cluster, loader) = (self.cluster.clone(), self.loader);
        start(self.into_job(), cluster, loader)
    }
}

/// Bytes one delivered row takes: tensors and primitives at their width, 16 for anything
/// of variable width, and the padding flag.
fn row_bytes(output: &Schema) -> u64 {
    use arrow::datatypes::DataType;
    fn width(t: &DataType) -> u64 {
        match t {
            DataType::FixedSizeList(f, n) => (*n).max(0) as u64 * width(f.data_type()),
            DataType::Boolean => 1,
            t => t.primitive_width().map_or(16, |w| w as u64),
        }
    }
    1 + output
        .fields()
        .iter()
        .map(|f| width(f.data_type()))
        .sum::<u64>()
}

/// Worker threads per process that have something to do: one per unit of input (its
/// reader) or per rank (its owner), shared among the processes. More would only idle,
/// and timely's all-to-all channels make idle workers cost memory and start-up time that
/// grow with their square.
pub fn useful_workers(units: usize, ranks: usize, processes: usize) -> usize {
    let processes = processes.max(1);
    units
        .div_ceil(processes)
        .max(ranks.div_ceil(processes))
        .max(1)
}

/// Reads a fitted state file: a regular file of at most 4 GiB, read (not
/// mapped, so that a file truncated meanwhile is an error rather than SIGBUS).
pub fn read_state(path: &Path) -> Result<FittedState> {
    use std::io::Read;
    let err = |reason: String| Error::State {
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(one_line(e)))?;
    if !meta.is_file() {
        return Err(err("is not a regular file".into()));
    }
    if meta.len() > MAX_STATE_BYTES {
        return Err(err(format!(
            "is {} bytes, more than a fitted state may be ({MAX_STATE_BYTES})",
            meta.len()
        )));
    }
    let mut text = String::with_capacity(meta.len() as usize);
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_STATE_BYTES).read_to_string(&mut text))
        .map_err(|e| err(one_line(e)))?;
    FittedState::from_json(&text).map_err(|e| err(one_line(e)))
}

/// The largest fitted state file read (vocabularies of millions of values fit easily).
pub(crate) const MAX_STATE_BYTES: u64 = 4 << 30;

/// Starts `job` on `cluster` with the rank batches of this process's ranks going to one
/// loader per rank (see [`loader::spawn`]). An error here comes before this process has
/// joined its cluster: a caller of several processes may tell the peers waiting for it
/// with [`Cluster::give_up`].
pub fn start(mut job: Job, cluster: Cluster, config: LoaderConfig) -> Result<Running> {
    let world = job.delivery.plan.world_size();
    let ownership = Ownership {
        world_size: world,
        processes: cluster.processes,
        workers: cluster.workers,
    };
    let local = ownership.ranks(cluster.process);
    let mut feeds: Vec<_> = (0..world).map(|_| None).collect();
    let mut loaders = Vec::new();
    let mut actors = Vec::new();
    for rank in local.clone() {
        let (feed, loader, actor) = loader::spawn(rank, config, job.errors.clone())?;
        feeds[rank] = Some(feed);
        loaders.push(loader);
        actors.extend(actor);
    }
    job.output = Some(Output::Loaders(feeds));
    let progress = job.progress.clone();
    let dataflow = std::thread::Builder::new()
        .name("hydrant-dataflow".into())
        .spawn(move || runtime::execute(job, &cluster, || {}))
        .map_err(|e| Error::Dataflow(format!("cannot start the dataflow: {e}")))?;
    Ok(Running {
        local,
        world,
        loaders,
        actors,
        dataflow,
        progress,
    })
}

/// A running pipeline: one [`Loader`] per rank of this process, and the dataflow feeding
/// them.
pub struct Running {
    local: std::ops::Range<usize>,
    world: usize,
    loaders: Vec<Loader>,
    actors: Vec<JoinHandle<()>>,
    dataflow: JoinHandle<Result<Report>>,
    progress: Arc<AtomicU64>,
}

impl Running {
    /// Rank `r`'s batches. Consume all ranks together (as the trainers of one job do):
    /// a rank left unread stalls the others once its queue is full. A rank that another
    /// process of the cluster owns is an error.
    pub fn rank(&self, r: usize) -> Result<&Loader> {
        if !self.local.contains(&r) {
            return Err(Error::Usage(if r >= self.world {
                format!("rank {r} does not exist (world size {})", self.world)
            } else {
                format!(
                    "rank {r} is delivered by another process of the cluster (this one has \
                     ranks {:?})",
                    self.local
                )
            }));
        }
        Ok(&self.loaders[r - self.local.start])
    }

    /// The ranks this process delivers (all of them in one process).
    pub fn local_ranks(&self) -> std::ops::Range<usize> {
        self.local.clone()
    }

    /// Real rows delivered so far by this process.
    pub fn delivered(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// The loaders of this process's ranks, in rank order.
    pub fn ranks(&self) -> &[Loader] {
        &self.loaders
    }

    /// Waits for the dataflow to finish and returns what it did. Drop or drain the
    /// loaders first: the dataflow waits for ranks that are not read.
    pub fn join(self) -> Result<Report> {
        drop(self.loaders);
        let report = self
            .dataflow
            .join()
            .map_err(|_| Error::Dataflow("the dataflow thread panicked".into()))?;
        for a in self.actors {
            let _ = a.join();
        }
        report
    }
}
