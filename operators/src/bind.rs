//! Turning a chain of steps plus fitted parameters into kernels' arguments, and reading
//! input columns in the types the kernels take. Shared by fitting and transforming.

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::DataType;

use crate::error::{OpError, Result};
use crate::kernels::numeric::NumOp;
use crate::state::{FittedParam, FittedState};
use crate::step::Step;

/// The fitted parameters of step `at` of a column's chain.
pub(crate) fn param<'a>(
    state: &'a FittedState,
    group: &str,
    column: &str,
    at: usize,
    step: &Step,
) -> Result<&'a FittedParam> {
    state.params.get(&FittedState::key(group, column, at)).ok_or_else(|| {
        OpError::State(format!(
            "nothing fitted for step `{step}` of group `{group}`, column `{column}`: fit this pipeline first"
        ))
    })
}

pub(crate) fn wrong_param(group: &str, column: &str, step: &Step) -> OpError {
    OpError::State(format!(
        "the parameters for step `{step}` of group `{group}`, column `{column}` are of another step"
    ))
}

/// The numeric steps `steps` (positions `0..end` of the chain) as kernel ops.
pub(crate) fn bind_numeric(
    group: &str,
    column: &str,
    steps: &[Step],
    end: usize,
    state: &FittedState,
) -> Result<Vec<NumOp>> {
    debug_assert!(steps.len() <= end);
    let mut ops = Vec::with_capacity(steps.len());
    for (at, step) in steps.iter().enumerate() {
        ops.push(match step {
            Step::FillNull(v) => NumOp::FillNull(*v),
            Step::Log1p => NumOp::Log1p,
            Step::Clip(lo, hi) => NumOp::Clip { lo: *lo, hi: *hi },
            Step::Standardize => match param(state, group, column, at, step)? {
                FittedParam::Standardize { mean, std } => NumOp::divide(*mean, *std),
                _ => return Err(wrong_param(group, column, step)),
            },
            Step::MinMax => match param(state, group, column, at, step)? {
                FittedParam::MinMax { min, max } => NumOp::divide(*min, max - min),
                _ => return Err(wrong_param(group, column, step)),
            },
            other => unreachable!("{other} is not a float step; the plan checked the chain"),
        });
    }
    Ok(ops)
}

/// A batch's column by name.
pub(crate) fn column<'a>(batch: &'a RecordBatch, group: &str, name: &str) -> Result<&'a ArrayRef> {
    batch.column_by_name(name).ok_or_else(|| {
        OpError::Schema(format!(
            "group `{group}`: column `{name}` is missing from the batch"
        ))
    })
}

/// A numeric column as float64 (cast when it is another numeric type).
pub(crate) fn numeric_values(array: &ArrayRef, group: &str, name: &str) -> Result<Float64Array> {
    if let Some(v) = array.as_primitive_opt::<arrow::datatypes::Float64Type>() {
        return Ok(v.clone());
    }
    let t = array.data_type();
    if !(t.is_numeric() || *t == DataType::Boolean) {
        return Err(OpError::Schema(format!(
            "group `{group}`: column `{name}` is {t}, expected a number"
        )));
    }
    Ok(cast(array, &DataType::Float64)?
        .as_primitive::<arrow::datatypes::Float64Type>()
        .clone())
}
