//! The `hydrant` command line: generate data, fit a pipeline, run it.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use hydrant::delivery::LastBatch;
use hydrant::demo::{TrainConfig, TrainReport};
use hydrant::loader::{Backend, LoaderConfig};
use hydrant::runtime::{self, Output};
use hydrant::sink::SinkSpec;
use hydrant::{Cluster, ClusterSecret, Pipeline, RunOptions};
use hydrant::{Error, Result};
use indicatif::{ProgressBar, ProgressStyle};
use outputs::{Written, check_output, check_outside};
use serde_json::json;
use serve::ServeArgs;

mod args;
mod demo;
mod follow;
mod outputs;
mod serve;

use args::{
    MAX_BATCH_SIZE, MAX_LOCAL_RANKS, MAX_PREFETCH, MAX_PROCESSES, MAX_RANKS, MAX_WORKERS, float_in,
    int_in,
};

#[derive(Parser)]
#[command(
    name = "hydrant",
    version,
    about = "Stream Arrow batches through vectorized feature transforms into training"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a synthetic dataset.
    Gen {
        #[command(subcommand)]
        kind: GenKind,
    },
    /// Fit a pipeline's statistics (means, vocabularies, ...) and save them as JSON.
    Fit {
        #[command(flatten)]
        common: Common,
        /// Where to write the fitted state.
        #[arg(long)]
        out: PathBuf,
    },
    /// Featurize the input and deliver it to a sink; fits first unless --state is given.
    Run(Box<RunArgs>),
    /// Serve the pipeline over Arrow Flight: one stream per rank, fetched with DoGet.
    Serve(Box<ServeArgs>),
    /// Generate a Criteo-like dataset (once), then fit, featurize and train on it with the
    /// stages overlapped, against the same job done featurize-then-train.
    Demo {
        /// Rows to generate.
        #[arg(long, default_value_t = 1_000_000)]
        rows: u64,
        /// Folder for the generated data.
        #[arg(long, default_value = "data")]
        dir: PathBuf,
        /// Simulated model time per training step (default: what the torch example's
        /// model takes for 4096 rows on one CPU core).
        #[arg(long, default_value_t = demo::STEP_MS, value_parser = float_in(0.0, 3.6e6))]
        step_ms: f64,
    },
}

#[derive(Subcommand)]
enum GenKind {
    /// A Criteo-like click log: label, i0..i12 (float64, ~10% null), c0..c25 (utf8, Zipf ids).
    Criteo {
        /// Rows to write.
        #[arg(long)]
        rows: u64,
        /// Output Parquet file.
        #[arg(long)]
        out: PathBuf,
        /// Random seed; the same seed writes the same file.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Rows per row group (each row group is a unit of the epoch plan); the rows are
        /// the same whatever this is.
        #[arg(long, default_value_t = hydrant::demo::ROW_GROUP as u32, value_parser = clap::value_parser!(u32).range(1..))]
        row_group_rows: u32,
    },
}

#[derive(Args, Clone)]
struct Common {
    /// The pipeline file (TOML).
    #[arg(long)]
    pipeline: PathBuf,
    /// Input Parquet or Arrow IPC files, or folders of them; rows are numbered in this order.
    /// (Not for a pipeline whose input is pushed over Flight.)
    #[arg(long, num_args = 1..)]
    input: Vec<PathBuf>,
    /// Worker threads per process (default: the number of cores; no more are started than
    /// there are units of input or ranks to keep busy). For pushed or followed input the
    /// workers place and assemble rows featurized as they were admitted; default one.
    #[arg(long, value_parser = int_in(1, MAX_WORKERS))]
    workers: Option<usize>,
    /// Processes in a timely cluster.
    #[arg(long, default_value_t = 1, value_parser = int_in(1, MAX_PROCESSES))]
    processes: usize,
    /// This process's index in the cluster.
    #[arg(long, default_value_t = 0, value_parser = int_in(0, MAX_PROCESSES - 1))]
    process: usize,
    /// host:port per line, one per process (the first --processes lines are used; `#`
    /// starts a comment). Without one, processes listen on localhost:2101, 2102, ….
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// A file holding the cluster's shared secret (at least 16 bytes; for example
    /// `openssl rand -hex 32`), the same for every process: the processes prove they hold
    /// it when they join, so that no one else on the network can pose as a peer.
    #[arg(long)]
    cluster_secret_file: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// A fitted state from `hydrant fit`; without it, the run fits first.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Where batches go: `null` (through the loaders, then discarded), `parquet:DIR`, or
    /// `train:logreg` (a data-parallel logistic regression, one trainer per rank).
    #[arg(long, default_value = "null")]
    sink: String,
    /// Also write the summary JSON to this file.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Stream the Parquet / Arrow IPC files that appear in DIR (instead of --input), as
    /// `serve --follow` does, until SIGINT or SIGTERM ends the input; sinks `null` and
    /// `parquet:DIR`. Needs --state, or [stats] mode = "refresh".
    #[arg(long, value_name = "DIR")]
    follow: Option<PathBuf>,
    /// With --follow: record admissions (and refreshed state versions) here, so that a
    /// restarted run streams the same rows in the same steps.
    #[arg(long, value_name = "DIR", requires = "follow")]
    state_dir: Option<PathBuf>,
    #[command(flatten)]
    delivery: DeliveryArgs,
}

#[derive(Args, Clone)]
struct DeliveryArgs {
    /// Data-parallel ranks (world size).
    #[arg(long, default_value_t = 1, value_parser = int_in(1, MAX_RANKS))]
    ranks: usize,
    /// Rows per rank per step.
    #[arg(long, default_value_t = 4096, value_parser = int_in(1, MAX_BATCH_SIZE))]
    batch_size: usize,
    /// The most bytes a rank's batches in flight may take (batch size × bytes per row ×
    /// prefetch); checked before anything is allocated.
    #[arg(long, default_value_t = hydrant::DEFAULT_MAX_BATCH_BYTES, value_parser = int_in(1u64, 1 << 48))]
    max_batch_bytes: u64,
    /// MiB of decoded input kept in memory after its first read, so that later epochs
    /// (and catch-up reads) neither read nor decode it again; units that do not fit are
    /// read each time. 0: none.
    #[arg(long, default_value_t = 0, value_parser = int_in(0u64, 1 << 30))]
    cache_mib: u64,
    /// Epochs to deliver.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Seed of the shuffle.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Shuffle: permute row groups per epoch, then rows within windows of
    /// --shuffle-window consecutive rows (a keyed permutation per window).
    #[arg(long)]
    shuffle: bool,
    /// Rows in a shuffle window (`--shuffle-buffer` is the old name of this option)
    /// [default: the multiple of --batch-size nearest 65,536, and at least two batches]
    #[arg(long, alias = "shuffle-buffer", requires = "shuffle",
          value_parser = int_in(1u64, 1 << 40))]
    shuffle_window: Option<u64>,
    /// A last step that is not full: `pad` (marked padding rows) or `drop`.
    #[arg(long, default_value = "pad")]
    last_batch: String,
    /// Resume: first epoch to deliver.
    #[arg(long, default_value_t = 0)]
    start_epoch: u64,
    /// Resume: first step to deliver within --start-epoch.
    #[arg(long, default_value_t = 0)]
    start_step: u64,
    /// Training batches each loader keeps ready.
    #[arg(long, default_value_t = 2, value_parser = int_in(1, MAX_PREFETCH))]
    prefetch: usize,
    /// Loader memory: `host`, or `cuda[:N]` (needs the `cuda` feature; falls back to host).
    #[arg(long, default_value = "host")]
    loader: String,
    /// train:logreg: extra milliseconds per step, standing in for a bigger model.
    #[arg(long, default_value_t = 0.0, value_parser = float_in(0.0, 3.6e6))]
    step_ms: f64,
    /// train:logreg: learning rate.
    #[arg(long, default_value_t = 0.05, value_parser = float_in(0.0, 1e6))]
    learning_rate: f64,
    /// train:logreg: print the loss every N steps to stderr (default: 10 on a terminal;
    /// 0: never).
    #[arg(long)]
    log_every: Option<u64>,
}

impl DeliveryArgs {
    fn options(&self, cluster: Cluster) -> Result<RunOptions> {
        let options = RunOptions {
            ranks: self.ranks,
            batch_size: self.batch_size,
            epochs: self.epochs,
            seed: self.seed,
            shuffle: self.shuffle.then(|| {
                self.shuffle_window
                    .unwrap_or_else(|| hydrant::Placement::default_window(self.batch_size))
            }),
            last_batch: self.last_batch.parse::<LastBatch>()?,
            start_epoch: self.start_epoch,
            start_step: self.start_step,
            loader: LoaderConfig {
                prefetch: self.prefetch,
                backend: self.loader.parse::<Backend>()?,
            },
            cluster,
            max_batch_bytes: self.max_batch_bytes,
            cache_bytes: self.cache_mib << 20,
        };
        // Each rank served here keeps its own queue, slot and step buffers (several KB
        // before any row): a total bound, where --max-batch-bytes bounds one rank.
        let local = options.most_local_ranks();
        if local > MAX_LOCAL_RANKS {
            return Err(Error::Usage(format!(
                "--ranks {} over --processes {} gives a process {local} ranks: at most \
                 {MAX_LOCAL_RANKS} a process (run more processes, one beside each node's \
                 trainers)",
                self.ranks, options.cluster.processes
            )));
        }
        Ok(options)
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    raise_open_files_limit();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version go out whole; a bad argument is one line (clap's first paragraph
        // joined, e.g. "required arguments were not provided: --tls-key <TLS_KEY>", without
        // the usage and the advice to try --help) and exit code 2.
        Err(e) if e.use_stderr() => {
            let text = e.to_string();
            let paragraph: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let line = match paragraph.join(" ") {
                l if l.is_empty() => "error: bad arguments".to_string(),
                l => l,
            };
            hydrant::operators::log_line!("hydrant: {line} (see --help)");
            if let Some(cluster) = cluster_of_refused(std::env::args_os().skip(1)) {
                cluster.give_up(&line);
            }
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            hydrant::operators::log_line!("hydrant: error: {e}");
            if let Some(cluster) = GIVE_UP.get() {
                cluster.give_up(&e.to_string());
            }
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Gen {
            kind:
                GenKind::Criteo {
                    rows,
                    out,
                    seed,
                    row_group_rows,
                },
        } => {
            let t0 = Instant::now();
            outputs::refuse_to_overwrite_other_than_parquet(&out)?;
            hydrant::demo::criteo_with_row_groups(rows, &out, seed, row_group_rows as usize)?;
            println!(
                "{}",
                json!({"rows": rows, "out": out, "seconds": round3(t0.elapsed().as_secs_f64())})
            );
            Ok(())
        }
        Command::Fit { common, out } => {
            let reads = files_read(&common, None, None);
            let shown = format!("--out {}", out.display());
            check_output(&shown, &out, Written::File, &reads)
                .map_err(|e| told_peers(&common, e))?;
            let pipeline = prepare(&common, None, None).map_err(|e| told_peers(&common, e))?;
            let (spec, cluster) = (pipeline.spec().clone(), pipeline.cluster().clone());
            let report = runtime::execute(pipeline.into_job(), &cluster, || {})?;
            let state = report
                .state
                .ok_or_else(|| Error::Dataflow("no worker fitted".into()))?;
            // Every process holds the same state, and writes it: the nodes of a cluster
            // may not share a folder, and each needs the state to run the job. (Only the
            // first did; found by a hostile run, which found no file where the second
            // process said it wrote one.)
            let json = state.to_json();
            hydrant::write::replace_file_from_each_process(&out, json.as_bytes()).map_err(|e| {
                Error::State {
                    path: out.clone(),
                    reason: e.to_string(),
                }
            })?;
            let summary = json!({
                "pipeline": spec.name, "out": out, "version": state.version,
                "params": state.params.len(), "fit_s": round3(report.fit.as_secs_f64()),
            });
            println!("{summary}");
            Ok(())
        }
        Command::Run(args) => run(&args).map(|s| println!("{s}")),
        Command::Serve(args) => serve::serve(&args),
        Command::Demo { rows, dir, step_ms } => demo::demo(rows, &dir, step_ms),
    }
}

/// On SIGINT or SIGTERM, removes the part files this process has not finished and exits
/// with one line (status 130 or 143, as a shell reports the signal). Found by a hostile
/// run: Ctrl-C left 95 MB `.tmp` files and said nothing, and the next run into the
/// folder was refused because of them. A signal before the handler is set up still ends
/// the run as before (the next run names the files).
fn remove_unfinished_on_signal(sink: &SinkSpec, process: usize) {
    use tokio::signal::unix::{SignalKind, signal};
    let sink = sink.clone();
    let watch = move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        let status = runtime.block_on(async {
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return None;
            };
            tokio::select! {
                _ = int.recv() => Some(130),
                _ = term.recv() => Some(143),
            }
        });
        if let Some(status) = status {
            let removed = sink.remove_unfinished(process);
            eprintln!(
                "hydrant: stopped by a signal before the run finished; {removed} unfinished \
                 part file(s) removed from {sink}"
            );
            std::process::exit(status);
        }
    };
    // Without the thread a signal ends the run as it did, leaving the files.
    let _ = std::thread::Builder::new()
        .name("hydrant-signals".into())
        .spawn(watch);
}

/// The timely workers of each process: `--workers`, or `default` (one a core if `None`).
pub(crate) fn workers(common: &Common, default: Option<usize>) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = common.workers.or(default).unwrap_or(cores);
    if workers > cores {
        hydrant::operators::log_line!(
            "hydrant: warning: --workers {workers} is more than the {cores} cores here; \
             workers will take turns on them"
        );
    }
    workers
}

/// The cluster to tell, once the error is printed, that this process stopped before it
/// joined (see [`told_peers`]).
static GIVE_UP: std::sync::OnceLock<Cluster> = std::sync::OnceLock::new();

/// `e`, a failure of this process before it joined its cluster, marked so that once it
/// is printed the other processes, which may be waiting for this one to join, are told
/// why ([`Cluster::give_up`]): they stop at once with one line naming this process, not
/// after the join's timeout. Nothing is told when this process runs alone, or when its
/// cluster secret cannot be read (the peers could not trust what it said).
pub(crate) fn told_peers(common: &Common, e: Error) -> Error {
    if common.processes < 2 {
        return e;
    }
    if let Ok(cluster) = cluster_of(common, 1) {
        let _ = GIVE_UP.set(cluster);
    }
    e
}

/// The cluster a command line that clap refused names, if it names one of two or more
/// processes, so that the peers waiting for this one to join are told why it stopped
/// rather than wait out the join's minute. Read by hand, leniently: clap stops at the
/// first bad argument and gives nothing back. Only `--processes`, `--process`, `--hostfile`
/// and `--cluster-secret-file` are looked for, as `--name value` or `--name=value`;
/// `None` when they do not make a cluster or the secret cannot be read (see
/// [`told_peers`]).
fn cluster_of_refused(args: impl Iterator<Item = std::ffi::OsString>) -> Option<Cluster> {
    let args: Vec<String> = args.filter_map(|a| a.into_string().ok()).collect();
    let value = |name: &str| {
        let flag = format!("--{name}");
        let inline = format!("{flag}=");
        args.iter()
            .enumerate()
            .find_map(|(i, a)| match a.strip_prefix(&inline) {
                Some(v) => Some(v.to_string()),
                None if *a == flag => args.get(i + 1).cloned(),
                None => None,
            })
    };
    let processes: usize = value("processes")?.parse().ok()?;
    let process: usize = value("process").map_or(Some(0), |p| p.parse().ok())?;
    if !(2..=MAX_PROCESSES).contains(&processes) || process >= processes {
        return None;
    }
    let common = Common {
        pipeline: PathBuf::new(),
        input: Vec::new(),
        workers: None,
        processes,
        process,
        hostfile: Some(PathBuf::from(value("hostfile")?)),
        cluster_secret_file: value("cluster-secret-file").map(PathBuf::from),
    };
    cluster_of(&common, 1).ok()
}

/// The cluster of `common`'s options, with `workers` threads a process; fails if its
/// secret file cannot be read.
fn cluster_of(common: &Common, workers: usize) -> Result<Cluster> {
    Ok(Cluster {
        workers,
        processes: common.processes,
        process: common.process,
        hostfile: common.hostfile.clone(),
        secret: common
            .cluster_secret_file
            .as_deref()
            .map(ClusterSecret::from_file)
            .transpose()?,
    })
}

/// The pipeline of a command, checked against its inputs (and its state, if given).
fn prepare(
    common: &Common,
    state: Option<&Path>,
    delivery: Option<&DeliveryArgs>,
) -> Result<Pipeline> {
    let cluster = cluster_of(common, workers(common, None))?;
    let options = match delivery {
        Some(d) => d.options(cluster)?,
        None => RunOptions::fitting(cluster),
    };
    let pipeline = Pipeline::from_files(&common.pipeline, &common.input, state, options)?;
    if pipeline.epoch_plan().rows() == 0 {
        hydrant::operators::log_line!(
            "hydrant: warning: the input holds no rows: what is fitted describes nothing, \
             and every epoch is empty"
        );
    }
    Ok(pipeline)
}

/// Warns, on one line, where most of what each epoch delivers would be padding: the
/// ranks' steps together are far larger than the input (`--ranks 100000` over 50,000
/// rows pads every epoch to 409,600,000), which the user most likely did not mean; or
/// where no step is left at all (`--last-batch drop` of an input under one step).
pub(crate) fn warn_padding(plan: &hydrant::EpochPlan) {
    if plan.steps() == 0 && plan.rows() > 0 {
        // Found by a hostile run: trainers looped over empty epochs without a word.
        hydrant::operators::log_line!(
            "hydrant: warning: every epoch is empty: --last-batch drop drops all {} input \
             rows, fewer than a step of --ranks {} × --batch-size {} ({} rows): lower \
             --batch-size, or use --last-batch pad",
            plan.rows(),
            plan.world_size(),
            plan.batch_size(),
            plan.step_rows()
        );
    }
    let (padded, delivered) = (plan.padded_rows(), plan.delivered_rows());
    if padded > delivered.max(PADDING_WARN_ROWS) {
        hydrant::operators::log_line!(
            "hydrant: warning: {padded} of the {} rows each epoch delivers are padding: \
             --ranks {} × --batch-size {} is {} rows a step, over {} input rows",
            padded + delivered,
            plan.world_size(),
            plan.batch_size(),
            plan.step_rows(),
            plan.rows()
        );
    }
}

/// Padding below this is never warned about, however small the input (tests and demos
/// run a few rows over several ranks on purpose).
const PADDING_WARN_ROWS: u64 = 1 << 20;

/// What the trainers (or the null consumers) saw.
#[derive(Default)]
struct Consumed {
    stall_s: Vec<f64>,
    wall_s: f64,
    train: Option<TrainReport>,
}

/// The files and folders a command reads, each with the flag that named it.
fn files_read<'a>(
    common: &'a Common,
    state: Option<&'a Path>,
    follow: Option<&'a Path>,
) -> Vec<(&'static str, &'a Path)> {
    let inputs = common.input.iter().map(|i| ("--input", i.as_path()));
    (inputs.chain([("--pipeline", common.pipeline.as_path())]))
        .chain(state.map(|s| ("--state", s)))
        .chain(follow.map(|f| ("--follow", f)))
        .chain(common.hostfile.as_deref().map(|h| ("--hostfile", h)))
        .chain((common.cluster_secret_file.as_deref()).map(|s| ("--cluster-secret-file", s)))
        .collect()
}

/// `run`'s outputs (`--summary`, a Parquet sink's folder), checked before anything runs.
fn check_run_outputs(args: &RunArgs) -> Result<()> {
    let reads = files_read(&args.common, args.state.as_deref(), args.follow.as_deref());
    if let Some(path) = &args.summary {
        let shown = format!("--summary {}", path.display());
        check_output(&shown, path, Written::File, &reads)?;
    }
    if let Ok(SinkSpec::Parquet(dir)) = args.sink.parse::<SinkSpec>() {
        let shown = format!("--sink parquet:{}", dir.display());
        check_output(&shown, &dir, Written::Folder, &reads)?;
        if let Some(path) = &args.summary {
            let summary = format!("--summary {}", path.display());
            check_outside(&summary, path, &shown, &dir)?;
        }
    }
    Ok(())
}

fn run(args: &RunArgs) -> Result<serde_json::Value> {
    check_run_outputs(args).map_err(|e| told_peers(&args.common, e))?;
    if let Some(folder) = &args.follow {
        let summary = follow::run_follow(args, folder)?;
        if let Some(path) = &args.summary {
            hydrant::write::replace_file(path, format!("{summary}\n").as_bytes())
                .map_err(|e| Error::Usage(format!("--summary {}: {e}", path.display())))?;
        }
        return Ok(summary);
    }
    let started = Instant::now();
    // Until this process has joined its cluster, a failure is told to the peers waiting
    // for it, so that they stop at once rather than after the join's timeout.
    let told = |e: Error| told_peers(&args.common, e);
    let sink: SinkSpec = args.sink.parse().map_err(told)?;
    let pipeline =
        prepare(&args.common, args.state.as_deref(), Some(&args.delivery)).map_err(told)?;
    let (spec, cluster, loader) = (
        pipeline.spec().clone(),
        pipeline.cluster().clone(),
        pipeline.loader(),
    );
    let state_load = pipeline.state_load();
    let mut job = pipeline.into_job();
    job.started = started;
    let plan = job.delivery.plan.clone();
    let epochs = job.delivery.epochs - job.delivery.start_epoch.min(job.delivery.epochs);
    let total_rows = plan.delivered_rows() * epochs;
    let progress: Arc<AtomicU64> = job.progress.clone();
    let featurized: Arc<AtomicU64> = job.featurized.clone();
    let bar = progress_bar(total_rows, matches!(sink, SinkSpec::Train));
    let tick = || bar.set_position(progress.load(Ordering::Relaxed));
    let use_loaders = match &sink {
        SinkSpec::Train | SinkSpec::Null => true,
        SinkSpec::Parquet(_) => false,
    };
    if matches!(sink, SinkSpec::Train) && cluster.processes > 1 {
        return Err(told(Error::Usage(
            "--sink train:logreg runs every rank in one process: its all-reduce is in memory \
             (use --processes 1, or a trainer of your own per process)"
                .into(),
        )));
    }
    if matches!(sink, SinkSpec::Train) && plan.world_size() > MAX_TRAIN_RANKS {
        return Err(told(Error::Usage(format!(
            "--sink train:logreg runs a trainer thread a rank: at most {MAX_TRAIN_RANKS} ranks \
             (got --ranks {})",
            plan.world_size()
        ))));
    }
    warn_padding(&plan);
    let mut consumed = Consumed::default();
    let report = if use_loaders {
        // `start` fails only before the dataflow joins (a loader's device, a thread).
        let running = hydrant::start(job, cluster.clone(), loader).map_err(told)?;
        let t0 = Instant::now();
        consumed.train = match &sink {
            SinkSpec::Train => Some(hydrant::demo::train(
                running.ranks(),
                TrainConfig {
                    learning_rate: args.delivery.learning_rate as f32,
                    step_time: Duration::from_secs_f64(args.delivery.step_ms / 1e3),
                    log_every: args.delivery.log_every.unwrap_or(
                        if std::io::stderr().is_terminal() {
                            10
                        } else {
                            0
                        },
                    ),
                    ..TrainConfig::default()
                },
            )?),
            _ => {
                hydrant::loader::drain(running.ranks(), &tick)?;
                None
            }
        };
        consumed.wall_s = t0.elapsed().as_secs_f64();
        consumed.stall_s = running
            .ranks()
            .iter()
            .map(|l| l.stall().as_secs_f64())
            .collect();
        running.join()?
    } else {
        sink.prepare(cluster.process).map_err(told)?;
        remove_unfinished_on_signal(&sink, cluster.process);
        job.output = Some(Output::Sink(sink.clone()));
        runtime::execute(job, &cluster, tick)?
    };
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    // From the stalls as measured, rounded only after: rounded first, a run of a few
    // milliseconds read a stall fraction above 1 (1.02, 1.05).
    let stall_fraction = (!consumed.stall_s.is_empty() && consumed.wall_s > 0.0).then(|| {
        let mean = consumed.stall_s.iter().sum::<f64>() / consumed.stall_s.len() as f64;
        round3(mean / consumed.wall_s)
    });
    let stall_s: Vec<f64> = consumed.stall_s.iter().copied().map(round3).collect();
    let losses = consumed.train.as_ref().map(|t| &t.losses);
    let summary = json!({
        "pipeline": spec.name,
        "rows": report.rows,
        "batches": report.batches,
        "input_rows": plan.rows(),
        "featurized_rows": featurized.load(Ordering::Relaxed),
        "ranks": plan.world_size(),
        "batch_size": plan.batch_size(),
        "epochs": epochs,
        "steps_per_rank": report.steps_per_rank,
        "padded_rows": report.padded_rows,
        "dropped_rows": plan.dropped_rows() * epochs,
        "order_version": hydrant::delivery::ORDER_VERSION,
        "fit_s": round3(report.fit.as_secs_f64()),
        "seconds": round3(seconds),
        "rows_per_s": (report.rows as f64 / seconds).round(),
        "first_batch_s": report.first_batch.map(|d| round3(d.as_secs_f64())),
        "state_load_s": round3(state_load.as_secs_f64()),
        "stall_s_per_rank": stall_s,
        "stall_fraction": stall_fraction,
        "consume_s": round3(consumed.wall_s),
        "logloss_first": losses.and_then(|l| l.first()).map(|x| round4(*x)),
        "logloss_last": losses.and_then(|l| l.last()).map(|x| round4(*x)),
        "train_steps": consumed.train.as_ref().map(|t| t.steps),
        "workers": cluster.workers,
        "processes": cluster.processes,
        "process": cluster.process,
        "sink": sink.to_string(),
        "state_version": report.state_version,
        "peak_rss_mb": peak_rss_mb(),
    });
    if let Some(path) = &args.summary {
        hydrant::write::replace_file(path, format!("{summary}\n").as_bytes())
            .map_err(|e| Error::Usage(format!("--summary {}: {e}", path.display())))?;
    }
    Ok(summary)
}

/// The most ranks `--sink train:logreg` trains: it runs a thread a rank, all meeting at a
/// barrier each step, so one that cannot be started would hold the others forever.
const MAX_TRAIN_RANKS: usize = 1024;

fn progress_bar(total: u64, training: bool) -> ProgressBar {
    // Training prints its own progress lines.
    if training || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} {wide_bar} {pos}/{len} rows ({per_sec}, {eta})")
    {
        bar.set_style(style);
    }
    bar
}

/// This process's peak resident memory (Linux `VmHWM`), in MiB.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(round3(kb / 1024.0))
}

fn round4(x: f64) -> f64 {
    (x * 10000.0).round() / 10000.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Raises this process's soft limit on open files to its hard limit, as servers do: a
/// server holds a socket per connection (Flight and metrics) and a file per input being
/// read, and the usual soft limit of 1,024 was reached by 1,100 idle connections while the
/// hard limit allowed 20 times as many. A limit that cannot be read or raised is left as
/// it is.
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}

/// Tells glibc's allocator to keep up to 32 MiB of freed memory at the top of a heap
/// rather than hand it back to the kernel at once, and to serve blocks up to 32 MiB from
/// its heaps. Every featurized batch is a few MiB that live for one step of the
/// dataflow; with the default (adaptive) thresholds a shuffled 10M-row run handed those
/// pages back and faulted them in again: 450,000 page faults against 80,000, 2.0 s against
/// 1.7 s (criteo_hash, 2 ranks). Keeping 256 MiB instead saved a little more time but let
/// the in-order peak grow with the input (+27% from 1M to 10M rows, against +13%).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; it is called first thing in
    // `main`, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}
