//! # hydrant
//!
//! hydrant streams Arrow record batches through vectorized feature transforms and
//! straight into data-parallel training: a timely dataflow reads Parquet or Arrow IPC,
//! featurizes batches as they arrive, places every row by an [`delivery::EpochPlan`] (every
//! rank the same number of steps, every row once per epoch, a deterministic windowed
//! shuffle, resumable mid-epoch), assembles each rank's steps on the worker that owns the
//! rank, and hands them to one [`loader::Loader`] per rank while the next batches are
//! still being featurized. The same dataflow runs as threads of one process or as the
//! processes of a timely cluster, each process serving its own block of ranks.
//!
//! ## Embedded use
//!
//! Build a pipeline in code, start it, and take each rank's [`loader::TrainingBatch`]es in
//! your own training loop (one thread per rank, as the trainers of a data-parallel job):
//!
//! ```
//! use hydrant::Pipeline;
//!
//! # let dir = tempfile::tempdir()?;
//! # let data = dir.path().join("clicks.parquet");
//! # hydrant::demo::criteo(20_000, &data, 7)?;
//! let numeric: Vec<String> = (0..13).map(|i| format!("i{i}")).collect();
//! let categorical: Vec<String> = (0..26).map(|i| format!("c{i}")).collect();
//! let pipeline = Pipeline::builder("clicks")
//!     .input(&data)
//!     .label("label")
//!     .dense("dense", &numeric, &["fill_null(0)", "log1p", "standardize", "clip(-3, 3)"])
//!     .ids("ids", &categorical, &["hash_bucket(65536)"])
//!     .ranks(2)
//!     .batch_size(1024)
//!     .shuffle(42, 8192)
//!     .build()?;
//! let running = pipeline.start()?;
//! std::thread::scope(|s| {
//!     for loader in running.ranks() {
//!         s.spawn(move || {
//!             for batch in loader.batches() {
//!                 let batch = batch?;
//!                 assert_eq!(batch.dense.shape, [1024, 13]);
//!                 assert_eq!(batch.ids.shape, [1024, 26]);
//!                 // ... forward, backward, all-reduce, step ...
//!             }
//!             Ok::<(), hydrant::Error>(())
//!         });
//!     }
//! });
//! let report = running.join()?;
//! assert_eq!(report.rows, 20_000);
//! assert_eq!(report.steps_per_rank[0], report.steps_per_rank[1]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The same runs from the command line with a pipeline file: `hydrant run --pipeline
//! examples/criteo.toml --input DATA --ranks 2 --sink train:logreg`. The pieces are public
//! too: pipeline files ([`PipelineSpec`]), inputs ([`source::Inputs`]), the dataflow
//! ([`runtime::execute`]), delivery ([`delivery`]: plan, placement, assembly) and sinks.

pub mod delivery;
pub mod demo;
mod error;
pub mod loader;
pub mod metrics;
mod pipeline;
mod recycle;
pub mod remote;
pub mod runtime;
pub mod serve;
pub mod sink;
pub mod source;
mod spec;
pub mod write;

pub use delivery::{EpochPlan, LastBatch, ORDER_VERSION, Placement};
pub use error::{Error, Result, error_line};
pub use hydrant_operators as operators;
pub use loader::{Backend, Loader, LoaderConfig, TrainingBatch};
pub use pipeline::{
    DEFAULT_MAX_BATCH_BYTES, Pipeline, PipelineBuilder, RunOptions, Running, read_state, start,
    useful_workers,
};
pub use remote::{Remote, RemoteRank};
pub use runtime::{Cluster, ClusterSecret};
pub use spec::{DEFAULT_BATCH_ROWS, InputKind, PipelineSpec, StatsMode, StatsSpec};
