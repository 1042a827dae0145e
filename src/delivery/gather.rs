//! Gathering rows from several batches into one: arrow's `interleave`, except for the
//! tensor columns (`FixedSizeList` of f32 or i64 without nulls) that every featurized
//! batch has, whose rows are copied as slices.
//!
//! Hand-written because arrow's `interleave` has no path for `FixedSizeList`: it falls
//! back to a per-row `MutableArrayData::extend`, which made a shuffled step's gather the
//! largest cost of shuffled delivery (a Criteo-like row is 13 + 26 tensor values).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, PrimitiveArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::compute::interleave;
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float32Type, Int64Type, SchemaRef};

use crate::error::Result;

/// The rows `picks` (`(batch, row)`) of `sources`, in that order, as one batch of
/// `schema` (the sources' schema).
pub(crate) fn gather(
    schema: &SchemaRef,
    sources: &[&RecordBatch],
    picks: &[(usize, usize)],
) -> Result<RecordBatch> {
    let columns = (0..schema.fields().len())
        .map(|c| {
            let arrays: Vec<&dyn Array> = sources.iter().map(|b| b.column(c).as_ref()).collect();
            let fast = match arrays[0].data_type() {
                DataType::FixedSizeList(item, width) => match item.data_type() {
                    DataType::Float32 => tensor::<Float32Type>(&arrays, picks, *width),
                    DataType::Int64 => tensor::<Int64Type>(&arrays, picks, *width),
                    _ => None,
                },
                _ => None,
            };
            match fast {
                Some(array) => Ok(array),
                None => Ok(interleave(&arrays, picks)?),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// A tensor column gathered by copying each row's `width` values; `None` when some source
/// has nulls (those go through `interleave`).
fn tensor<T: ArrowPrimitiveType>(
    arrays: &[&dyn Array],
    picks: &[(usize, usize)],
    width: i32,
) -> Option<ArrayRef> {
    let w = width as usize;
    let mut lists = Vec::with_capacity(arrays.len());
    for a in arrays {
        let list = a.as_fixed_size_list_opt()?;
        let values = list.values().as_primitive_opt::<T>()?;
        if list.null_count() > 0 || values.null_count() > 0 {
            return None;
        }
        lists.push((list, values.values()));
    }
    let values: Vec<&[T::Native]> = lists.iter().map(|(_, v)| &v[..]).collect();
    let out = copy_rows(&values, picks, w);
    let field = match lists[0].0.data_type() {
        DataType::FixedSizeList(field, _) => field.clone(),
        _ => return None,
    };
    let values = Arc::new(PrimitiveArray::<T>::new(ScalarBuffer::from(out), None));
    FixedSizeListArray::try_new(field, width, values, None)
        .ok()
        .map(|a| Arc::new(a) as ArrayRef)
}

/// Rows `picks` of row-major `values` of `width` values a row. Widths up to 64 copy each
/// row as one fixed-size array (moves the compiler inlines) instead of a `memcpy` call
/// per row, which was most of a shuffled step's gather.
fn copy_rows<T: Copy + Default>(values: &[&[T]], picks: &[(usize, usize)], width: usize) -> Vec<T> {
    macro_rules! fixed {
        ($($w:literal)*) => {
            match width {
                $($w => return copy_fixed::<T, $w>(values, picks),)*
                _ => {}
            }
        };
    }
    fixed!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30
        31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58
        59 60 61 62 63 64);
    let mut out = Vec::with_capacity(picks.len() * width);
    for &(b, row) in picks {
        out.extend_from_slice(&values[b][row * width..(row + 1) * width]);
    }
    out
}

fn copy_fixed<T: Copy + Default, const W: usize>(
    values: &[&[T]],
    picks: &[(usize, usize)],
) -> Vec<T> {
    let rows: Vec<&[[T; W]]> = values.iter().map(|v| v.as_chunks::<W>().0).collect();
    let out: Vec<[T; W]> = picks.iter().map(|&(b, row)| rows[b][row]).collect();
    out.into_flattened()
}
