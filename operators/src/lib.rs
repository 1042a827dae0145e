//! # hydrant-operators
//!
//! The vectorized half of hydrant: feature steps, the kernels that run them over Arrow
//! arrays, the statistics that fitting learns, and the timely operator that applies them
//! to a stream of batches.
//!
//! A pipeline's feature groups are checked against the input schema once
//! ([`FeaturePlan::compile`]), fitted in one pass per fitted step ([`FeaturePlan::fitter`],
//! mergeable across workers) and then applied batch by batch ([`Transformer::apply`]).
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Float64Array, RecordBatch, StringArray, UInt64Array};
//! use hydrant_operators::{FeatureGroup, FeaturePlan, FittedState, GroupKind, Step};
//!
//! let batch = RecordBatch::try_from_iter([
//!     ("row_id", Arc::new(UInt64Array::from(vec![0, 1, 2])) as _),
//!     ("x", Arc::new(Float64Array::from(vec![Some(1.0), None, Some(3.0)])) as _),
//!     ("s", Arc::new(StringArray::from(vec!["a", "b", "a"])) as _),
//! ])?;
//! let groups = [
//!     FeatureGroup::new("dense", GroupKind::Dense, &["x"], vec![Step::FillNull(0.0), Step::Standardize]),
//!     FeatureGroup::new("ids", GroupKind::Ids, &["s"], vec![Step::parse("vocab")?]),
//! ];
//! let plan = FeaturePlan::compile("demo", &groups, None, &batch.schema())?;
//!
//! // Fit (one pass here), then transform.
//! let mut fitter = plan.fitter(0, &FittedState::empty("demo"))?;
//! fitter.update(&batch)?;
//! let mut params = Default::default();
//! fitter.into_partial()?.finish(&mut params);
//! let state = FittedState::new("demo", params);
//!
//! let out = plan.transformer(&state)?.apply(&batch)?;
//! assert_eq!(out.num_rows(), 3);
//! assert_eq!(out.schema().field(1).name(), "dense");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod batch;
mod bind;
mod error;
mod files;
mod fit;
mod group;
pub mod kernels;
mod operator;
mod plan;
#[cfg(test)]
mod reference;
pub mod running;
mod state;
mod stats;
mod step;
mod transform;
mod vocabulary;

pub use batch::Batch;
pub use error::{OpError, QUOTED_CHARS, Result, quoted};
pub use files::{check_regular, open_regular, read_small_file, read_small_text};
pub use fit::{FitPartial, Fitter};
pub use group::{FeatureGroup, GroupKind, LabelSpec, LabelType};
pub use operator::{ErrorSlot, Featurize};
pub use plan::{FeaturePlan, MAX_GROUP_NAME, RESERVED_NAMES, ROW_ID, check_group_names};
pub use state::{FittedParam, FittedState, STATE_FORMAT};
pub use stats::{Moments, Partial};
pub use step::Step;
pub use transform::{Featurized, RowTargets, Transformer, check_labels, row_bytes, value_bytes};
pub use vocabulary::Vocabulary;
