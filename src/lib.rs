//! # hydrant
//!
//! hydrant streams Arrow record batches through vectorized feature transforms and
//! straight into data-parallel training. This crate assembles the pieces: pipeline files
//! ([`PipelineSpec`]), inputs ([`source::Inputs`]), the timely dataflow
//! ([`dataflow::execute`]), sinks, and the `hydrant` command line.
//!
//! ```no_run
//! use std::sync::Arc;
//! use hydrant::{PipelineSpec, dataflow::{self, Cluster, Job}, sink::SinkSpec, source::Inputs};
//!
//! let spec = PipelineSpec::from_file("examples/criteo.toml".as_ref())?;
//! let mut inputs = Inputs::open(&["criteo.parquet".into()], spec.batch_rows)?;
//! let plan = spec.plan(&inputs.schema())?;
//! inputs.prepare(&plan, |s| spec.plan(s))?;
//! let job = Job {
//!     inputs: Arc::new(inputs),
//!     plan: Arc::new(plan),
//!     state: None, // fit first
//!     sink: Some(SinkSpec::Null),
//!     started: std::time::Instant::now(),
//!     progress: Default::default(),
//! };
//! let report = dataflow::execute(job, &Cluster::local(2), || {})?;
//! println!("{} rows", report.rows);
//! # Ok::<(), hydrant::Error>(())
//! ```

pub mod dataflow;
pub mod epoch;
mod error;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod generate;
pub mod loader;
pub mod pipeline;
pub mod rebatch;
pub mod route;
pub mod sink;
pub mod source;
pub mod train;
mod spec;

pub use error::{Error, Result};
pub use hydrant_operators as operators;
pub use spec::{DEFAULT_BATCH_ROWS, PipelineSpec};
