//! Pushed rows featurized: each batch checked against the pipeline (the columns its
//! groups read, with types its steps take), featurized with the state in effect, and the
//! result checked against the schema the server delivers.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use hydrant_flight::ServeError;
use hydrant_operators::{FittedState, Transformer};

use crate::serve::refresh::Piece;
use crate::source::with_row_id;
use crate::spec::PipelineSpec;

/// Featurizes `pieces` (rows a refreshed stream cut where its state changes), each with
/// its state. Pieces from rows before `admitting` (held for the first version) were
/// acknowledged already: a failure there fails the stream, not only this batch.
pub(super) fn featurize_pieces(
    featurizer: &mut PushFeaturizer,
    pieces: Vec<Piece>,
    admitting: u64,
) -> Result<Vec<(RecordBatch, u64)>, ServeError> {
    let mut out = Vec::with_capacity(pieces.len());
    for p in pieces {
        featurizer.set_state(&p.state);
        let featurized = featurizer.featurize(p.batch, p.first);
        let featurized = match featurized {
            Err(e) if p.first < admitting => {
                return Err(ServeError::Internal(format!(
                    "rows held for the first state version cannot be featurized with it: {e}"
                )));
            }
            other => other?,
        };
        out.push((featurized, p.state.version));
    }
    Ok(out)
}

/// Featurizes pushed batches for one pipeline, binding a transformer per input schema seen
/// (producers may differ in, say, integer widths).
pub struct PushFeaturizer {
    spec: PipelineSpec,
    state: Arc<FittedState>,
    output: SchemaRef,
    transformers: Vec<(SchemaRef, Transformer)>,
}

/// Input schemas bound at most; a producer that sends ever new schemas is refused beyond.
const MAX_SCHEMAS: usize = 64;

impl PushFeaturizer {
    /// A featurizer whose batches must come out as `output` (the served feature schema).
    pub fn new(spec: PipelineSpec, state: FittedState, output: SchemaRef) -> Self {
        PushFeaturizer {
            spec,
            state: Arc::new(state),
            output,
            transformers: Vec::new(),
        }
    }

    /// The pipeline it featurizes for.
    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    /// The version of the state it featurizes with.
    pub fn state_version(&self) -> u64 {
        self.state.version
    }

    /// Featurizes with `state` from now on (transformers are bound again when it changes).
    pub fn set_state(&mut self, state: &Arc<FittedState>) {
        if !Arc::ptr_eq(&self.state, state) {
            self.state = state.clone();
            self.transformers.clear();
        }
    }

    /// Checks that `batch`, its rows numbered from `first_row`, can be featurized and
    /// delivered whatever the state: its columns, its labels and its values (ids passed
    /// through, ready tensors). Rows held for a first version are checked so, before they
    /// are acknowledged (and before their statistics are counted): featurized only once
    /// the warmup is over, a bad one would fail a later batch, and the rows held with it
    /// would never be delivered.
    pub fn check(&self, batch: &RecordBatch, first_row: u64) -> Result<(), ServeError> {
        let invalid = |e: &dyn std::fmt::Display| ServeError::InvalidArgument(e.to_string());
        let schema = batch.schema();
        check_columns(&schema)?;
        let plan = self.spec.plan(&schema).map_err(|e| self.plan_error(e))?;
        check_output(&plan.output_schema(), &self.output).map_err(|e| invalid(&e))?;
        self.check_labels(batch, first_row)?;
        let batch = with_row_id(batch.clone(), first_row).map_err(|e| invalid(&e))?;
        plan.check_values(&batch).map_err(|e| invalid(&e))
    }

    /// Why a pushed schema does not fit the pipeline, as its producer is told: without the
    /// server's path of the pipeline file.
    fn plan_error(&self, e: crate::Error) -> ServeError {
        ServeError::InvalidArgument(match e {
            crate::Error::Spec { reason, .. } => {
                format!("pipeline `{}`: {reason}", self.spec.name)
            }
            other => other.to_string(),
        })
    }

    /// Checks the labels of `batch`, whose rows start at stream row `first_row`, as
    /// featurizing would.
    fn check_labels(&self, batch: &RecordBatch, first_row: u64) -> Result<(), ServeError> {
        match &self.spec.label {
            Some(label) => hydrant_operators::check_labels(label, batch, first_row)
                .map_err(|e| ServeError::InvalidArgument(e.to_string())),
            None => Ok(()),
        }
    }

    /// Featurizes `batch`, its rows numbered from `first_row`.
    pub fn featurize(
        &mut self,
        batch: RecordBatch,
        first_row: u64,
    ) -> Result<RecordBatch, ServeError> {
        let invalid = |e: &dyn std::fmt::Display| ServeError::InvalidArgument(e.to_string());
        let schema = batch.schema();
        check_columns(&schema)?;
        let at = match self.transformers.iter().position(|(s, _)| *s == schema) {
            Some(at) => at,
            None => {
                if self.transformers.len() >= MAX_SCHEMAS {
                    return Err(invalid(&format!(
                        "more than {MAX_SCHEMAS} different schemas pushed; push one schema"
                    )));
                }
                let plan = self.spec.plan(&schema).map_err(|e| self.plan_error(e))?;
                let t = plan.transformer(&self.state).map_err(|e| invalid(&e))?;
                self.transformers.push((schema, t));
                self.transformers.len() - 1
            }
        };
        let batch = with_row_id(batch, first_row).map_err(|e| invalid(&e))?;
        let out = self.transformers[at]
            .1
            .apply(&batch)
            .map_err(|e| invalid(&e))?;
        check_output(&out.schema(), &self.output).map_err(|e| invalid(&e))?;
        Ok(out)
    }
}

/// A pushed batch's columns, checked as an input file's are.
fn check_columns(schema: &Schema) -> Result<(), ServeError> {
    match crate::source::column_problem(schema) {
        Some(problem) => Err(ServeError::InvalidArgument(format!("the batch {problem}"))),
        None => Ok(()),
    }
}

/// Whether featurized batches of `got` can be delivered as `served`: the same columns with
/// the same types (a pass-through tensor of another width would break every rank's
/// stream at its next batch).
fn check_output(got: &Schema, served: &Schema) -> Result<(), String> {
    for f in served.fields() {
        let g = got
            .field_with_name(f.name())
            .map_err(|_| format!("column `{}` is missing from the featurized batch", f.name()))?;
        if g.data_type() != f.data_type() {
            return Err(format!(
                "column `{}` featurizes to {} but the server delivers {}",
                f.name(),
                g.data_type(),
                f.data_type()
            ));
        }
    }
    if got.fields().len() != served.fields().len() {
        return Err("the featurized batch has columns the server does not deliver".into());
    }
    Ok(())
}
