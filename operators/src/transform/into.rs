//! Featurizing straight into rows of buffers that are not a batch of their own
//! ([`Transformer::apply_into`]): a shuffled step's slots.
//!
//! A shuffled step draws its rows from many batches, so it cannot be a slice of one
//! featurized batch the way an in-order step is. Featurized first, every row was then
//! copied into its step, and the featurized batch — fresh memory each time — was faulted
//! in, zeroed, written, read back and freed: on 1M Criteo rows the copy alone was ~13% of
//! a shuffled run's CPU, and the fresh batches most of the page faults it added. Here each
//! kernel's output goes to the row's slot in its step: an ids column's values one by one,
//! a dense group's block of rows from a small tensor kept in cache.

use arrow::array::{Array, AsArray, RecordBatch, UInt64Array};
use arrow::buffer::Buffer;
use arrow::compute::cast;
use arrow::datatypes::DataType;
use arrow::datatypes::ToByteSlice;

use super::{
    Bound, BoundColumn, Transformer, check_label, dense_values, ids_values, index_column,
    tensor_column,
};
use crate::bind::column;
use crate::error::{OpError, Result};
use crate::group::GroupKind;
use crate::plan::ROW_ID;

/// Where [`Transformer::apply_into`] writes each featurized row: row `i` of a batch goes to
/// slot `rows[i].1` of target `rows[i].0`, and column `c` of target `t` (the plan's output
/// columns, in order) starts at `bases[c][t]`, a slot of it taking [`row_bytes`] of the
/// column's type.
#[derive(Debug)]
pub struct RowTargets<'a> {
    bases: &'a [Vec<*mut u8>],
    rows: &'a [(u32, u32)],
}

impl<'a> RowTargets<'a> {
    /// Targets for a batch of `rows.len()` rows (see the type).
    ///
    /// # Safety
    /// For every output column `c` and row `i`, slot `rows[i].1` of column `c` of target
    /// `rows[i].0` — its [`row_bytes`] from `bases[c][rows[i].0]` on — lies inside one
    /// allocation, is valid for writes, and is neither read nor written by anything else
    /// while the targets live; and no two rows name the same slot of the same target.
    pub unsafe fn new(bases: &'a [Vec<*mut u8>], rows: &'a [(u32, u32)]) -> Self {
        RowTargets { bases, rows }
    }

    /// Where row `row`'s slot of column `column` (of `n` bytes a slot) starts.
    #[inline]
    fn at(&self, column: usize, row: usize, n: usize) -> *mut u8 {
        let (target, slot) = self.rows[row];
        let base = self.bases[column][target as usize];
        // SAFETY: `new`'s caller promised that this slot lies inside `base`'s allocation.
        unsafe { base.add(slot as usize * n) }
    }
}

/// Bytes a value of `data_type` takes in a row, when that is fixed: a primitive, or a
/// fixed-size list of primitives (every column a plan outputs). `None` otherwise.
pub fn row_bytes(data_type: &DataType) -> Option<usize> {
    match data_type {
        DataType::FixedSizeList(item, width) => {
            let width = usize::try_from(*width).ok()?;
            Some(item.data_type().primitive_width()? * width)
        }
        DataType::Boolean => None,
        other => other.primitive_width(),
    }
}

/// The bytes of `array`'s values, `row_bytes` a row (see [`row_bytes`]): a primitive
/// array's values, or a fixed-size list's items, which must have no nulls. `None` for
/// another layout.
pub fn value_bytes(array: &dyn Array, row_bytes: usize) -> Option<Buffer> {
    let values = match array.data_type() {
        DataType::FixedSizeList(..) => {
            let items = array.as_fixed_size_list_opt()?.values();
            if items.null_count() > 0 {
                return None;
            }
            items.to_data()
        }
        _ => array.to_data(),
    };
    let width = values.data_type().primitive_width()?;
    let buffer = values.buffers().first()?;
    let (start, len) = (values.offset() * width, array.len() * row_bytes);
    if values.len() * width != len || start + len > buffer.len() {
        return None;
    }
    Some(buffer.slice_with_length(start, len))
}

impl Transformer {
    /// Featurizes `batch` as [`Transformer::apply`] does, writing row `i`'s values into
    /// its slot of `to` instead of into a new batch. Every slot of every row is written
    /// (no nulls: every output column is non-null), unless it fails: then some may be, and
    /// none should be read.
    pub fn apply_into(&mut self, batch: &RecordBatch, to: &RowTargets<'_>) -> Result<()> {
        let rows = batch.num_rows();
        let schema = self.plan.output_schema();
        let widths = schema
            .fields()
            .iter()
            .map(|f| row_bytes(f.data_type()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| OpError::Schema("an output column is not of fixed width".into()))?;
        let targets = to.rows.iter().map(|&(t, _)| t as usize + 1).max();
        if to.rows.len() != rows
            || to.bases.len() != widths.len()
            || to.bases.iter().any(|b| b.len() < targets.unwrap_or(0))
        {
            return Err(OpError::Schema(format!(
                "{rows} rows were given {} targets of {} columns, for {} output columns",
                to.rows.len(),
                to.bases.len(),
                widths.len()
            )));
        }
        let row_id = batch
            .column_by_name(ROW_ID)
            .filter(|c| c.data_type() == &DataType::UInt64)
            .ok_or_else(|| OpError::Schema(format!("no UInt64 `{ROW_ID}` column")))?;
        let row_ids: &UInt64Array = row_id.as_primitive();
        write_rows(to, 0, widths[0], row_ids.values()[..].to_byte_slice());
        let mut at = 1;
        if let Some(label) = &self.plan.label {
            let values = cast(
                column(batch, "label", &label.column)?,
                &label.dtype.data_type(),
            )?;
            check_label(&label.column, &values, |k| row_ids.value(k))?;
            write_array(to, at, widths[at], values.as_ref())?;
            at += 1;
        }
        for (g, cols) in self.plan.groups.iter().zip(&mut self.columns) {
            let (width, name, n) = (g.width, &g.spec.name, widths[at]);
            if let [c] = cols.as_slice()
                && matches!(c.bound, Bound::Tensor)
            {
                let tensor = tensor_column(batch, name, &c.name, g.spec.kind)?;
                write_array(to, at, n, tensor.as_ref())?;
            } else if g.spec.kind == GroupKind::Dense {
                self.dense.clear();
                self.dense.resize(rows * width, 0.0);
                dense_values(batch, name, cols, width, &mut self.scratch, &mut self.dense)?;
                write_rows(to, at, n, self.dense[..].to_byte_slice());
            } else if cols.iter().any(|c| matches!(c.bound, Bound::Tensor)) {
                self.ids.clear();
                self.ids.resize(rows * width, 0);
                ids_values(batch, name, cols, width, &mut self.scratch, &mut self.ids)?;
                write_rows(to, at, n, self.ids[..].to_byte_slice());
            } else {
                ids_into(batch, name, cols, &mut self.scratch, to, at, n)?;
            }
            at += 1;
        }
        Ok(())
    }
}

/// An ids group's values, column by column, each straight into its place in every row's
/// slot: the same writes [`ids_values`] makes into a batch's tensor, only elsewhere.
fn ids_into(
    batch: &RecordBatch,
    name: &str,
    cols: &mut [BoundColumn],
    scratch: &mut Vec<i64>,
    to: &RowTargets<'_>,
    at: usize,
    n: usize,
) -> Result<()> {
    let width = n / size_of::<i64>();
    for c in cols.iter_mut() {
        scratch.resize(batch.num_rows(), 0);
        index_column(batch, name, c, scratch)?;
        if c.offset >= width {
            return Err(OpError::Schema(format!(
                "group `{name}` is narrower than its columns"
            )));
        }
        for (row, &v) in scratch.iter().enumerate() {
            let slot = to.at(at, row, n).cast::<i64>();
            // SAFETY: `RowTargets::new`'s caller promised `n` writable bytes at the slot,
            // and `c.offset < width = n / 8`.
            unsafe { slot.add(c.offset).write_unaligned(v) };
        }
    }
    Ok(())
}

/// Writes `array`'s values (see [`value_bytes`]) into column `at`'s slots.
fn write_array(to: &RowTargets<'_>, at: usize, n: usize, array: &dyn Array) -> Result<()> {
    let bytes = value_bytes(array, n).ok_or_else(|| {
        OpError::Schema(format!(
            "a featurized {} column is not of fixed width",
            array.data_type()
        ))
    })?;
    write_rows(to, at, n, bytes.as_slice());
    Ok(())
}

/// Copies `src`, rows of `n` bytes (as many as `to` has), into column `at`'s slots.
fn write_rows(to: &RowTargets<'_>, at: usize, n: usize, src: &[u8]) {
    assert_eq!(
        src.len(),
        to.rows.len() * n,
        "a column's rows are not all there"
    );
    // Rows of the widths featurized columns have are moved as arrays of a known size
    // (a few vector moves): a `memcpy` call a row cost more than the row.
    macro_rules! fixed {
        ($($k:literal)*) => {
            match n {
                $($k => {
                    for (row, from) in src.as_chunks::<$k>().0.iter().enumerate() {
                        // SAFETY: `RowTargets::new`'s caller promised `n` writable bytes
                        // at the slot.
                        unsafe { to.at(at, row, n).cast::<[u8; $k]>().write_unaligned(*from) };
                    }
                })*
                _ => {
                    for (row, from) in src.chunks_exact(n.max(1)).enumerate() {
                        // SAFETY: as above.
                        unsafe {
                            std::ptr::copy_nonoverlapping(from.as_ptr(), to.at(at, row, n), n)
                        };
                    }
                }
            }
        };
    }
    fixed!(4 8 12 16 20 24 28 32 36 40 44 48 52 56 60 64);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float64Array, StringArray};

    use super::*;
    use crate::group::{FeatureGroup, LabelSpec, LabelType};
    use crate::plan::FeaturePlan;
    use crate::state::FittedState;
    use crate::step::Step;

    /// A batch of `n` rows with a label, two numeric columns (one with nulls) and two
    /// string columns.
    fn batch(n: usize) -> RecordBatch {
        let x = (0..n).map(|i| (i % 7 != 3).then_some(i as f64 * 0.5 - 3.0));
        let s = |k: usize| {
            (0..n)
                .map(move |i| format!("v{}", (i * k) % 11))
                .collect::<Vec<_>>()
        };
        RecordBatch::try_from_iter([
            (
                "row_id",
                Arc::new(UInt64Array::from_iter_values(100..100 + n as u64)) as ArrayRef,
            ),
            (
                "y",
                Arc::new(Float64Array::from_iter_values(
                    (0..n).map(|i| (i % 2) as f64),
                )),
            ),
            ("x", Arc::new(Float64Array::from_iter(x))),
            (
                "z",
                Arc::new(Float64Array::from_iter_values((0..n).map(|i| i as f64))),
            ),
            ("a", Arc::new(StringArray::from(s(3)))),
            ("b", Arc::new(StringArray::from(s(5)))),
        ])
        .unwrap()
    }

    fn transformer(batch: &RecordBatch) -> Transformer {
        let groups = [
            FeatureGroup::new(
                "dense",
                GroupKind::Dense,
                &["x", "z"],
                vec![Step::FillNull(1.5), Step::Log1p],
            ),
            FeatureGroup::new(
                "ids",
                GroupKind::Ids,
                &["a", "b"],
                vec![Step::HashBucket(97)],
            ),
            FeatureGroup::new(
                "hot",
                GroupKind::Dense,
                &["a"],
                vec![Step::HashBucket(5), Step::OneHot(5)],
            ),
        ];
        let label = LabelSpec {
            column: "y".into(),
            dtype: LabelType::Float32,
        };
        let plan = FeaturePlan::compile("p", &groups, Some(&label), &batch.schema()).unwrap();
        plan.transformer(&FittedState::empty("p")).unwrap()
    }

    /// Row `i` of a batch of `n` into target `i % 3`, slot `(n - 1 - i) / 3`, in buffers of
    /// `slots` rows a column; returns the buffers.
    fn write(t: &mut Transformer, batch: &RecordBatch, slots: usize) -> Result<Vec<Vec<Vec<u8>>>> {
        let n = batch.num_rows();
        let widths: Vec<usize> = t
            .plan()
            .output_schema()
            .fields()
            .iter()
            .map(|f| row_bytes(f.data_type()).unwrap())
            .collect();
        let mut buffers: Vec<Vec<Vec<u8>>> = widths
            .iter()
            .map(|w| vec![vec![0xAB; slots * w]; 3])
            .collect();
        let bases: Vec<Vec<*mut u8>> = buffers
            .iter_mut()
            .map(|c| c.iter_mut().map(|b| b.as_mut_ptr()).collect())
            .collect();
        let rows: Vec<(u32, u32)> = (0..n)
            .map(|i| ((i % 3) as u32, ((n - 1 - i) / 3) as u32))
            .collect();
        // SAFETY: every slot is inside its buffer (`(n - 1 - i) / 3 < slots`), the buffers
        // are borrowed by nothing else, and rows name distinct (target, slot) pairs.
        let to = unsafe { RowTargets::new(&bases, &rows) };
        t.apply_into(batch, &to)?;
        Ok(buffers)
    }

    #[test]
    fn writes_each_row_where_apply_puts_it() {
        for n in [1, 5, 700, 1500] {
            let input = batch(n);
            let mut t = transformer(&input);
            let want = t.apply(&input).unwrap();
            let slots = n.div_ceil(3);
            let got = write(&mut t, &input, slots).unwrap();
            for (c, column) in want.columns().iter().enumerate() {
                let w = row_bytes(column.data_type()).unwrap();
                let bytes = value_bytes(column.as_ref(), w).unwrap();
                for i in 0..n {
                    let (target, slot) = (i % 3, (n - 1 - i) / 3);
                    assert_eq!(
                        &got[c][target][slot * w..(slot + 1) * w],
                        &bytes[i * w..(i + 1) * w],
                        "{n} rows, column {c}, row {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn refuses_targets_of_another_shape_and_bad_labels() {
        let input = batch(30);
        let mut t = transformer(&input);
        let bases: Vec<Vec<*mut u8>> = vec![vec![]];
        let rows = vec![(0, 0); 30];
        // SAFETY: nothing is written: the shape is refused first.
        let to = unsafe { RowTargets::new(&bases, &rows) };
        assert!(t.apply_into(&input, &to).is_err());
        let mut bad = input.columns().to_vec();
        bad[1] = Arc::new(Float64Array::from_iter(
            (0..30).map(|i| (i != 4).then_some(1.0)),
        ));
        let schema = input.schema();
        let fields = schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true));
        let schema = Arc::new(arrow::datatypes::Schema::new(fields.collect::<Vec<_>>()));
        let bad = RecordBatch::try_new(schema, bad).unwrap();
        let err = write(&mut t, &bad, 10).unwrap_err().to_string();
        assert!(err.contains("is null at row_id 104"), "{err}");
    }
}
