//! Gathering rows from several batches into one: arrow's `interleave`, except for the
//! fixed-width columns without nulls (primitives, and the `FixedSizeList` tensors every
//! featurized batch has), whose rows are copied as fixed-size arrays with the source rows
//! a few picks ahead prefetched.
//!
//! Hand-written because it is most of what shuffled delivery costs: arrow's `interleave`
//! has no path for `FixedSizeList` (it falls back to a per-row `MutableArrayData::extend`)
//! and prefetches nothing, while the picks of a shuffled step are scattered over a window
//! of many megabytes, so each row is a cache miss the copy would otherwise wait on.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, PrimitiveArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::compute::interleave;
use arrow::datatypes::ArrowNativeType;
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Float32Type, Float64Type, Int32Type, Int64Type, SchemaRef,
    UInt32Type, UInt64Type,
};

use crate::error::Result;
use crate::recycle;
use hydrant_operators::kernels::prefetch;

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
            match fixed_width(&arrays, picks) {
                Some(array) => Ok(array),
                None => Ok(interleave(&arrays, picks)?),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// A fixed-width column gathered by [`copy_rows`]; `None` for other types and for
/// columns with nulls (those go through `interleave`).
fn fixed_width(arrays: &[&dyn Array], picks: &[(usize, usize)]) -> Option<ArrayRef> {
    macro_rules! by_type {
        ($data_type:expr, $f:ident $(, $arg:expr)*) => {
            match $data_type {
                DataType::Float32 => $f::<Float32Type>(arrays, picks $(, $arg)*),
                DataType::Float64 => $f::<Float64Type>(arrays, picks $(, $arg)*),
                DataType::Int32 => $f::<Int32Type>(arrays, picks $(, $arg)*),
                DataType::Int64 => $f::<Int64Type>(arrays, picks $(, $arg)*),
                DataType::UInt32 => $f::<UInt32Type>(arrays, picks $(, $arg)*),
                DataType::UInt64 => $f::<UInt64Type>(arrays, picks $(, $arg)*),
                _ => None,
            }
        };
    }
    match arrays.first()?.data_type() {
        DataType::FixedSizeList(item, width) => by_type!(item.data_type(), tensor, *width),
        other => by_type!(other, primitive),
    }
}

/// A primitive column without nulls.
fn primitive<T: ArrowPrimitiveType>(
    arrays: &[&dyn Array],
    picks: &[(usize, usize)],
) -> Option<ArrayRef> {
    let mut values = Vec::with_capacity(arrays.len());
    for a in arrays {
        let a = a.as_primitive_opt::<T>()?;
        if a.null_count() > 0 {
            return None;
        }
        values.push(&a.values()[..]);
    }
    let out = copy_rows(&values, picks, 1);
    let array = PrimitiveArray::<T>::new(out, None).with_data_type(arrays[0].data_type().clone());
    Some(Arc::new(array))
}

/// A tensor column (`FixedSizeList` of primitives) without nulls.
fn tensor<T: ArrowPrimitiveType>(
    arrays: &[&dyn Array],
    picks: &[(usize, usize)],
    width: i32,
) -> Option<ArrayRef> {
    let mut lists = Vec::with_capacity(arrays.len());
    let mut values = Vec::with_capacity(arrays.len());
    for a in arrays {
        let list = a.as_fixed_size_list_opt()?;
        let items = list.values().as_primitive_opt::<T>()?;
        if list.null_count() > 0 || items.null_count() > 0 {
            return None;
        }
        lists.push(list);
        values.push(&items.values()[..]);
    }
    let out = copy_rows(&values, picks, usize::try_from(width).ok()?);
    let DataType::FixedSizeList(field, _) = lists[0].data_type() else {
        return None;
    };
    let items = Arc::new(PrimitiveArray::<T>::new(out, None));
    FixedSizeListArray::try_new(field.clone(), width, items, None)
        .ok()
        .map(|a| Arc::new(a) as ArrayRef)
}

/// Rows `picks` of row-major `values` of `width` values a row, in a buffer from the
/// [`recycle`] pool. Widths up to 64 copy each row as one fixed-size array.
fn copy_rows<T: ArrowNativeType>(
    values: &[&[T]],
    picks: &[(usize, usize)],
    width: usize,
) -> ScalarBuffer<T> {
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
    let mut out = recycle::take(picks.len() * width * size_of::<T>());
    for &(b, row) in picks {
        out.extend_from_slice(&values[b][row * width..(row + 1) * width]);
    }
    ScalarBuffer::from(recycle::freeze(out))
}

/// Picks ahead whose source rows are prefetched: enough to cover a miss's latency with
/// the copies in between, few enough that the lines are still in cache when copied. A
/// shuffled step's fill (`fill.rs`) prefetches as far ahead.
pub(super) const AHEAD: usize = 12;

fn copy_fixed<T: ArrowNativeType, const W: usize>(
    values: &[&[T]],
    picks: &[(usize, usize)],
) -> ScalarBuffer<T> {
    let rows: Vec<&[[T; W]]> = values.iter().map(|v| v.as_chunks::<W>().0).collect();
    let mut out = recycle::take(picks.len() * W * size_of::<T>());
    for (k, &(b, row)) in picks.iter().enumerate() {
        if let Some(&(b, row)) = picks.get(k + AHEAD)
            && let Some(ahead) = rows.get(b).and_then(|r| r.get(row))
        {
            prefetch(ahead);
        }
        out.extend_from_slice(&rows[b][row]);
    }
    ScalarBuffer::from(recycle::freeze(out))
}

#[cfg(test)]
pub(super) mod tests {
    use arrow::array::{Float32Array, Int64Array, UInt64Array};
    use arrow::datatypes::{Field, Schema};

    use super::*;

    /// Rows `first..first + n`: `row` (the row), `ids` (three values a row) and `label`
    /// (every other one null with `nulls`).
    pub(in crate::delivery) fn batch(first: u64, n: u64, nulls: bool) -> RecordBatch {
        let item = Arc::new(Field::new("item", DataType::Int64, false));
        let ids: Vec<i64> = (first..first + n)
            .flat_map(|r| [r as i64, -(r as i64), 7])
            .collect();
        let tensor =
            FixedSizeListArray::try_new(item.clone(), 3, Arc::new(Int64Array::from(ids)), None)
                .unwrap();
        let labels: Float32Array = (first..first + n)
            .map(|r| (!nulls || r % 2 == 0).then_some(r as f32))
            .collect();
        let schema = Schema::new(vec![
            Field::new("row", DataType::UInt64, false),
            Field::new("ids", DataType::FixedSizeList(item, 3), false),
            Field::new("label", DataType::Float32, true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(UInt64Array::from_iter_values(first..first + n)),
                Arc::new(tensor),
                Arc::new(labels),
            ],
        )
        .unwrap()
    }

    /// The fast paths give what arrow's `interleave` gives, nulls or not.
    #[test]
    fn gathers_what_interleave_gathers() {
        for nulls in [false, true] {
            let sources = [batch(0, 40, nulls), batch(100, 30, nulls)];
            let refs: Vec<&RecordBatch> = sources.iter().collect();
            let picks: Vec<(usize, usize)> =
                (0..50).map(|k| ((k * 7) % 2, (k * 13) % 30)).collect();
            let got = gather(&sources[0].schema(), &refs, &picks).unwrap();
            for c in 0..3 {
                let arrays: Vec<&dyn Array> = refs.iter().map(|b| b.column(c).as_ref()).collect();
                let want = interleave(&arrays, &picks).unwrap();
                assert_eq!(
                    got.column(c).as_ref(),
                    want.as_ref(),
                    "column {c}, nulls {nulls}"
                );
            }
        }
    }
}
