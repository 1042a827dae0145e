//! What a rank receives: [`RankBatch`] — one step's `B` rows of the plan's output columns
//! plus `is_padding` — and how padding rows are made.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch, UInt64Array,
    new_empty_array,
};
use arrow::buffer::BooleanBuffer;
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use hydrant_operators::{Batch, ROW_ID};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Name of the Boolean column that marks padding rows.
pub const IS_PADDING: &str = "is_padding";

/// Where a rank batch belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepMeta {
    /// Epoch.
    pub epoch: u64,
    /// Step within the epoch.
    pub step: u64,
    /// Data-parallel rank.
    pub rank: usize,
    /// Ranks in the job.
    pub world_size: usize,
    /// Padding rows at the end of the batch.
    pub padded_rows: usize,
    /// Version of the fitted state that featurized it.
    pub state_version: u64,
    /// For a stream (followed or pushed input): the stream positions `[first, end)` its
    /// rows were drawn from (see [`Placement::positions`](super::Placement::positions)).
    #[serde(default)]
    pub positions: Option<[u64; 2]>,
}

/// One rank's batch of one step: the plan's output columns plus `is_padding`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankBatch {
    /// Where it belongs.
    pub meta: StepMeta,
    /// The rows (between processes as Arrow IPC).
    pub batch: Batch,
}

#[cfg(test)]
impl StepMeta {
    /// Step `step` of epoch 0, rank 0 of 1, no padding: for tests.
    pub(crate) fn at_step(step: u64) -> Self {
        StepMeta {
            epoch: 0,
            step,
            rank: 0,
            world_size: 1,
            padded_rows: 0,
            state_version: 0,
            positions: None,
        }
    }
}

impl RankBatch {
    /// The rows.
    pub fn data(&self) -> &RecordBatch {
        &self.batch.data
    }
}

/// The schema of delivered batches: the plan's output and `is_padding`.
pub fn delivery_schema(output: &Schema) -> SchemaRef {
    let mut fields: Vec<_> = output.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(IS_PADDING, DataType::Boolean, false)));
    Arc::new(Schema::new(fields))
}

/// Adds `is_padding` to real rows (of the output schema) and appends `padded` padding
/// rows, made here: most runs pad one step, and a whole step of zeros made per rank and run
/// was a tenth of a served epoch's page faults.
pub(crate) fn with_padding(
    schema: &SchemaRef,
    real: RecordBatch,
    padded: usize,
) -> Result<RecordBatch> {
    if padded == 0 {
        return with_flag(schema, real, false);
    }
    let pad = with_flag(schema, padding_batch(real.schema_ref(), padded)?, true)?;
    let real = with_flag(schema, real, false)?;
    if real.num_rows() == 0 {
        return Ok(pad);
    }
    Ok(concat_batches(schema, &[real, pad])?)
}

fn with_flag(schema: &SchemaRef, batch: RecordBatch, padding: bool) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let flag = match padding {
        true => BooleanBuffer::new_set(n),
        false => BooleanBuffer::new_unset(n),
    };
    let flag = BooleanArray::new(flag, None);
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(flag));
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// `rows` padding rows of `schema`: zero features and labels, `row_id` = `u64::MAX`.
pub(crate) fn padding_batch(schema: &Schema, rows: usize) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            if f.name() == ROW_ID {
                return Ok(Arc::new(UInt64Array::from(vec![u64::MAX; rows])) as ArrayRef);
            }
            zeros(f.data_type(), rows)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::new(schema.clone()), columns)?)
}

fn zeros(dtype: &DataType, rows: usize) -> Result<ArrayRef> {
    Ok(match dtype {
        DataType::Float32 => Arc::new(Float32Array::from(vec![0.0; rows])),
        DataType::Int64 => Arc::new(Int64Array::from(vec![0; rows])),
        DataType::UInt64 => Arc::new(UInt64Array::from(vec![0; rows])),
        DataType::FixedSizeList(field, size) => {
            let values = zeros(field.data_type(), rows * *size as usize)?;
            Arc::new(FixedSizeListArray::try_new(
                field.clone(),
                *size,
                values,
                None,
            )?)
        }
        DataType::Null => new_empty_array(dtype),
        other => {
            return Err(Error::Dataflow(format!(
                "cannot pad a column of type {other}"
            )));
        }
    })
}
