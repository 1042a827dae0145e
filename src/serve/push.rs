//! Pushed batches featurized as DoPut accepts them: checked against the pipeline (the
//! columns its groups read, with types its steps take), featurized, and the result checked
//! against the schema the server delivers — so a batch that would break the ranks' streams
//! is refused whole, before it is acknowledged, and never affects the batches before it.

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use hydrant_flight::ServeError;
use hydrant_operators::{FittedState, ROW_ID, Transformer};

use crate::source::with_row_id;
use crate::spec::PipelineSpec;

/// Featurizes pushed batches for one pipeline, binding a transformer per input schema seen
/// (producers may differ in, say, integer widths).
pub struct PushFeaturizer {
    spec: PipelineSpec,
    state: FittedState,
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
            state,
            output,
            transformers: Vec::new(),
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
        if schema.index_of(ROW_ID).is_ok() {
            return Err(invalid(&format!(
                "column `{ROW_ID}` is added by hydrant; do not push it"
            )));
        }
        let at = match self.transformers.iter().position(|(s, _)| *s == schema) {
            Some(at) => at,
            None => {
                if self.transformers.len() >= MAX_SCHEMAS {
                    return Err(invalid(&format!(
                        "more than {MAX_SCHEMAS} different schemas pushed; push one schema"
                    )));
                }
                let plan = self.spec.plan(&schema).map_err(|e| invalid(&e))?;
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
