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
    let bad = |k: usize, reason: String| OpError::BadLabel {
        column: label.column.clone(),
        row_id: row_id(k),
        reason,
    };
    check_conversion(input, &values, &bad)?;
    check_label(input, &values, &bad)?;
    Ok(values)
}

/// Checks the labels of `batch` (input rows, numbered from `first_row`) as
/// [`Transformer::apply`](super::Transformer::apply) does, without featurizing them: for
/// input that is acknowledged before it can be featurized (rows held until a first state
/// is fitted).
pub fn check_labels(label: &LabelSpec, batch: &RecordBatch, first_row: u64) -> Result<()> {
    label_values(batch, label, |k| first_row.saturating_add(k as u64)).map(drop)
}

/// How row `k`'s label is wrong, as the error that names it.
type Bad<'a> = dyn Fn(usize, String) -> OpError + 'a;

/// `input`'s value at `k`, as a message quotes it.
fn shown(input: &ArrayRef, k: usize) -> String {
    array_value_to_string(input, k).unwrap_or_default()
}

/// Fails on the first label that converting `input` to `values` changed where the
/// conversion says nothing: a fraction an int64 label would drop (0.9 became 0,
/// silently), or a value the type cannot hold (which the conversion makes null, and which
/// was reported as a null). A float beyond float32's range, which the conversion makes
/// infinite, is told by [`check_label`], which looks at every float label anyway.
fn check_conversion(input: &ArrayRef, values: &ArrayRef, bad: &Bad) -> Result<()> {
    let (to, from) = (values.data_type(), input.data_type());
    if to == from {
        return Ok(());
    }
    let labels = format!("{to} labels").to_lowercase();
    if values.null_count() > input.null_count()
        && let Some(k) = (0..input.len()).find(|&k| input.is_valid(k) && values.is_null(k))
    {
        return Err(bad(
            k,
            format!("is {}, which {labels} cannot hold", shown(input, k)),
        ));
    }
    if to.is_integer() && from.is_floating() {
        let wide = cast(input, &DataType::Float64)?;
        let wide = wide.as_primitive::<Float64Type>();
        if let Some(k) = (0..wide.len()).find(|&k| wide.is_valid(k) && wide.value(k).fract() != 0.0)
        {
            let why = format!("not a whole number, as {labels} (class indices) must be");
            return Err(bad(k, format!("is {}, {why}", shown(input, k))));
        }
    }
    Ok(())
}

/// Fails on the first label a trainer could not use: a null, or (for float labels) NaN or
/// an infinity, which would turn every loss it reaches into NaN; an infinity the
/// conversion made of a finite input is named by that input. Labels are not imputed: a
/// row without a usable label is the data's fault, and is named by its row id.
fn check_label(input: &ArrayRef, values: &ArrayRef, bad: &Bad) -> Result<()> {
    if let Some(nulls) = values.logical_nulls().filter(|n| n.null_count() > 0)
        && let Some(k) = (0..nulls.len()).find(|&k| nulls.is_null(k))
    {
        return Err(bad(k, "is null".into()));
    }
    if let Some(floats) = values.as_primitive_opt::<Float32Type>()
        && let Some(k) = first_non_finite(floats.values())
    {
        let finite_input = input.data_type().is_floating()
            && cast(&input.slice(k, 1), &DataType::Float64)?
                .as_primitive::<Float64Type>()
                .value(0)
                .is_finite();
        return Err(bad(
            k,
            match finite_input {
                true => format!("is {}, beyond the range of float32 labels", shown(input, k)),
                false => format!("is {}", floats.value(k)),
            },
        ));
    }
    Ok(())
}

/// The first value that is NaN or an infinity. Checked 64 values at a time by a fold,
/// which vectorizes; a `position` over every value cannot, as it may stop at each (the
/// check was the largest item of the timely workers serving four Flight streams).
fn first_non_finite(values: &[f32]) -> Option<usize> {
    const LANES: usize = 64;
    let chunk = values
        .chunks(LANES)
        .position(|c| c.iter().fold(false, |bad, v| bad | !v.is_finite()))?;
    let at = chunk * LANES;
    values[at..]
        .iter()
        .position(|v| !v.is_finite())
        .map(|k| at + k)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::first_non_finite;

    proptest! {
        /// The first NaN or infinity is found wherever it is, as a plain search finds it.
        #[test]
        fn the_first_non_finite_label_is_found(
            mut values in prop::collection::vec(-1e6f32..1e6, 0..300),
            bad in prop::collection::vec((0usize..300, 0usize..3), 0..3),
        ) {
            for (at, kind) in bad {
                if let Some(v) = values.get_mut(at) {
                    *v = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][kind];
                }
            }
            let want = values.iter().position(|v| !v.is_finite());
            prop_assert_eq!(first_non_finite(&values), want);
        }
    }
}
