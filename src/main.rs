//! The `hydrant` command line: generate data, fit a pipeline, run it.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use hydrant::dataflow::{self, Cluster, Job, Report};
use hydrant::operators::FittedState;
use hydrant::sink::SinkSpec;
use hydrant::source::Inputs;
use hydrant::{Error, PipelineSpec, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

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
    Run(RunArgs),
    /// Generate a Criteo-like dataset (once), then fit and featurize it, reporting throughput.
    Demo {
        /// Rows to generate.
        #[arg(long, default_value_t = 1_000_000)]
        rows: u64,
        /// Folder for the generated data.
        #[arg(long, default_value = "data")]
        dir: PathBuf,
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
    },
}

#[derive(Args, Clone)]
struct Common {
    /// The pipeline file (TOML).
    #[arg(long)]
    pipeline: PathBuf,
    /// Input Parquet or Arrow IPC files, or folders of them; rows are numbered in this order.
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// Worker threads per process (default: the number of cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Processes in a timely cluster.
    #[arg(long, default_value_t = 1)]
    processes: usize,
    /// This process's index in the cluster.
    #[arg(long, default_value_t = 0)]
    process: usize,
    /// host:port per line, one per process.
    #[arg(long)]
    hostfile: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// A fitted state from `hydrant fit`; without it, the run fits first.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Where batches go: `null` (count them) or `parquet:DIR`.
    #[arg(long, default_value = "null")]
    sink: String,
    /// Also write the summary JSON to this file.
    #[arg(long)]
    summary: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hydrant: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Gen {
            kind: GenKind::Criteo { rows, out, seed },
        } => {
            let t0 = Instant::now();
            hydrant::generate::criteo(rows, &out, seed)?;
            println!(
                "{}",
                json!({"rows": rows, "out": out, "seconds": round3(t0.elapsed().as_secs_f64())})
            );
            Ok(())
        }
        Command::Fit { common, out } => {
            let started = Instant::now();
            let (spec, job, cluster) = prepare(&common, None, None, started)?;
            let report = dataflow::execute(job, &cluster, || {})?;
            let state = report
                .state
                .ok_or_else(|| Error::Dataflow("no worker fitted".into()))?;
            if cluster.process == 0 {
                std::fs::write(&out, state.to_json()).map_err(|e| Error::State {
                    path: out.clone(),
                    reason: e.to_string(),
                })?;
            }
            let summary = json!({
                "pipeline": spec.name, "out": out, "version": state.version,
                "params": state.params.len(), "fit_s": round3(report.fit.as_secs_f64()),
            });
            println!("{summary}");
            Ok(())
        }
        Command::Run(args) => run(&args).map(|_| ()),
        Command::Demo { rows, dir } => demo(rows, &dir),
    }
}

fn demo(rows: u64, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Usage(format!("{}: {e}", dir.display())))?;
    let data = dir.join(format!("criteo-{rows}.parquet"));
    if !data.exists() {
        eprintln!(
            "hydrant: generating {rows} Criteo-like rows into {}",
            data.display()
        );
        let partial = data.with_extension("parquet.partial");
        hydrant::generate::criteo(rows, &partial, 42)?;
        std::fs::rename(&partial, &data)
            .map_err(|e| Error::Usage(format!("{}: {e}", data.display())))?;
    }
    let pipeline = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/criteo.toml");
    eprintln!(
        "hydrant: fitting and featurizing {} with {}",
        data.display(),
        pipeline.display()
    );
    let common = Common {
        pipeline,
        input: vec![data],
        workers: None,
        processes: 1,
        process: 0,
        hostfile: None,
    };
    run(&RunArgs {
        common,
        state: None,
        sink: "null".into(),
        summary: None,
    })
    .map(|_| ())
}

fn prepare(
    common: &Common,
    state: Option<&Path>,
    sink: Option<SinkSpec>,
    started: Instant,
) -> Result<(PipelineSpec, Job, Cluster)> {
    let spec = PipelineSpec::from_file(&common.pipeline)?;
    let mut inputs = Inputs::open(&common.input, spec.batch_rows)?;
    let plan = spec.plan(&inputs.schema())?;
    inputs.prepare(&plan, |s| spec.plan(s))?;
    let state = match state {
        None => None,
        Some(path) => {
            let err = |reason: String| Error::State {
                path: path.to_path_buf(),
                reason,
            };
            let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
            let state = FittedState::from_json(&text).map_err(|e| err(e.to_string()))?;
            // Bind once here so that a state that does not fit fails before any data is read.
            plan.transformer(&state).map_err(|e| err(e.to_string()))?;
            Some(state)
        }
    };
    let workers = common
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cluster = Cluster {
        workers,
        processes: common.processes,
        process: common.process,
        hostfile: common.hostfile.clone(),
    };
    if let Some(s) = &sink {
        s.prepare(cluster.process)?;
    }
    let job = Job {
        inputs: Arc::new(inputs),
        plan: Arc::new(plan),
        state,
        sink,
        started,
        progress: Default::default(),
    };
    Ok((spec, job, cluster))
}

fn run(args: &RunArgs) -> Result<Report> {
    let started = Instant::now();
    let sink: SinkSpec = args.sink.parse()?;
    let (spec, job, cluster) = prepare(
        &args.common,
        args.state.as_deref(),
        Some(sink.clone()),
        started,
    )?;
    let total_rows = job.inputs.total_rows();
    let progress: Arc<AtomicU64> = job.progress.clone();
    let bar = progress_bar(total_rows);
    let report = dataflow::execute(job, &cluster, || {
        bar.set_position(progress.load(Ordering::Relaxed))
    })?;
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let summary = json!({
        "pipeline": spec.name,
        "rows": report.rows,
        "batches": report.batches,
        "input_rows": total_rows,
        "fit_s": round3(report.fit.as_secs_f64()),
        "seconds": round3(seconds),
        "rows_per_s": (report.rows as f64 / seconds).round(),
        "first_batch_s": report.first_batch.map(|d| round3(d.as_secs_f64())),
        "workers": cluster.workers,
        "processes": cluster.processes,
        "process": cluster.process,
        "sink": sink.to_string(),
        "state_version": report.state.as_ref().map(|s| s.version),
        "peak_rss_mb": peak_rss_mb(),
    });
    if let Some(path) = &args.summary {
        std::fs::write(path, format!("{summary}\n"))
            .map_err(|e| Error::Usage(format!("--summary {}: {e}", path.display())))?;
    }
    println!("{summary}");
    Ok(report)
}

fn progress_bar(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
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

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
