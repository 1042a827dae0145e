//! The label column, as the pipeline's label type, checked row by row: a label a trainer
//! cannot use, or one the conversion would change, fails the batch naming its row id.

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float32Type, Float64Type};
use arrow::util::display::array_value_to_string;

use crate::bind::column;
use crate::error::{OpError, Result};
use crate::group::LabelSpec;

/// The label column of `batch` as `label`'s type, checked (see [`check_conversion`] and
/// [`check_label`]); `row_id(k)` names row `k`.
pub(super) fn label_values(
    batch: &RecordBatch,
    label: &LabelSpec,
    row_id: impl Fn(usize) -> u64,
) -> Result<ArrayRef> {
    let input = column(batch, "label", &label.column)?;
    let values = cast(input, &label.dtype.data_type())?;
    check_conversion(&label.column, input, &values, &row_id)?;
    check_label(&label.column, &values, row_id)?;
    Ok(values)
}

/// Checks the labels of `batch` (input rows, numbered from `first_row`) as
/// [`Transformer::apply`](super::Transformer::apply) does, without featurizing them: for
/// input that is acknowledged before it can be featurized (rows held until a first state
/// is fitted).
pub fn check_labels(label: &LabelSpec, batch: &RecordBatch, first_row: u64) -> Result<()> {
    label_values(batch, label, |k| first_row.saturating_add(k as u64)).map(drop)
}

/// Fails on the first label that converting `input` to `values` changed: a fraction an
/// int64 label would drop (0.9 became 0, silently), a value the type cannot hold (which
/// the conversion makes null, and which was reported as a null), or a float beyond
/// float32's range (which it makes infinite).
fn check_conversion(
    column: &str,
    input: &ArrayRef,
    values: &ArrayRef,
    row_id: impl Fn(usize) -> u64,
) -> Result<()> {
    let bad = |k: usize, what: String| {
        Err(OpError::BadLabel {
            column: column.to_string(),
            row_id: row_id(k),
            reason: format!(
                "is {}, {what}",
                array_value_to_string(input, k).unwrap_or_default()
            ),
        })
    };
    let (to, from) = (values.data_type(), input.data_type());
    if to == from {
        return Ok(());
    }
    let labels = format!("{to} labels").to_lowercase();
    if values.null_count() > input.null_count()
        && let Some(k) = (0..input.len()).find(|&k| input.is_valid(k) && values.is_null(k))
    {
        return bad(k, format!("which {labels} cannot hold"));
    }
    if to.is_integer() && from.is_floating() {
        let wide = cast(input, &DataType::Float64)?;
        let wide = wide.as_primitive::<Float64Type>();
        if let Some(k) = (0..wide.len()).find(|&k| wide.is_valid(k) && wide.value(k).fract() != 0.0)
        {
            return bad(
                k,
                format!("not a whole number, as {labels} (class indices) must be"),
            );
        }
    }
    if let Some(floats) = values.as_primitive_opt::<Float32Type>()
        && from.is_floating()
    {
        let wide = cast(input, &DataType::Float64)?;
        let wide = wide.as_primitive::<Float64Type>();
        if let Some(k) = (0..wide.len()).find(|&k| {
            wide.is_valid(k) && wide.value(k).is_finite() && !floats.value(k).is_finite()
        }) {
            return bad(k, format!("beyond the range of {labels}"));
        }
    }
    Ok(())
}

/// Fails on the first label a trainer could not use: a null, or (for float labels) NaN or
/// an infinity, which would turn every loss it reaches into NaN. Labels are not imputed:
/// a row without a usable label is the data's fault, and is named by its row id.
fn check_label(column: &str, values: &ArrayRef, row_id: impl Fn(usize) -> u64) -> Result<()> {
    let bad = |k: usize, what: &str| {
        Err(OpError::BadLabel {
            column: column.to_string(),
            row_id: row_id(k),
            reason: what.to_string(),
        })
    };
    if let Some(nulls) = values.logical_nulls().filter(|n| n.null_count() > 0)
        && let Some(k) = (0..nulls.len()).find(|&k| nulls.is_null(k))
    {
        return bad(k, "is null");
    }
    if let Some(floats) = values.as_primitive_opt::<Float32Type>()
        && let Some(k) = floats.values().iter().position(|v| !v.is_finite())
    {
        return bad(k, &format!("is {}", floats.value(k)));
    }
    Ok(())
}
