//! `Transformer`: a [`FeaturePlan`] bound to fitted parameters, applied batch by batch.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
    UInt64Array,
};
use arrow::datatypes::{DataType, Field, Int64Type};

use crate::bind::{bind_numeric, column, numeric_values, param, wrong_param};
use crate::error::{OpError, Result};
use crate::group::GroupKind;
use crate::kernels::categorical::{DictCache, Lookup, VocabIndex, one_hot, strings_to_index};
use crate::kernels::numeric::{NumOp, chain_to_bucket, chain_to_f32};
use crate::plan::{FeaturePlan, ROW_ID, Source};
use crate::state::{FittedParam, FittedState};
use crate::step::Step;
use crate::vocabulary::Vocabulary;

mod into;
mod label;
mod values;

pub use label::check_labels;
use label::label_values;

pub use into::{Featurized, RowTargets, row_bytes, value_bytes};
use values::{checked_ints, passes_ints, ready_list, tensor_column};

/// How one column becomes tensor values.
#[derive(Debug, Clone)]
enum Bound {
    /// Float steps into float32 slots.
    Float(Vec<NumOp>),
    /// Float steps, then a bucket index.
    Bucket(Vec<NumOp>, Arc<[f64]>),
    /// An integer column taken as an index (null becomes -1).
    IntPass,
    /// A string looked up in a vocabulary or hashed.
    Str(Arc<Lookup>, DictCache),
    /// A ready tensor column copied into its slots.
    Tensor,
}

#[derive(Debug, Clone)]
struct BoundColumn {
    name: String,
    offset: usize,
    bound: Bound,
    one_hot: Option<usize>,
}

/// A plan with its parameters, ready to featurize batches. Cheap to clone: one per worker.
#[derive(Debug, Clone)]
pub struct Transformer {
    plan: Arc<FeaturePlan>,
    columns: Vec<Vec<BoundColumn>>,
    state_version: u64,
    // Scratch space reused across batches, so the hot path does not allocate per column.
    scratch: Vec<i64>,
    // Each group's tensor for `featurize_rows`, which leaves it here to be written on into
    // rows elsewhere.
    kept: Vec<into::Kept>,
}

impl FeaturePlan {
    /// Binds the plan to `state`, failing if a fitted step has no parameters in it.
    pub fn transformer(&self, state: &FittedState) -> Result<Transformer> {
        self.check_fitted_for(state)?;
        // Vocabularies are the slow part (a hash-map entry per value): built on every core
        // first, then taken in the same column order below.
        let mut vocabs = self.build_vocabs(state).into_iter();
        let mut columns = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let steps = &g.spec.steps;
            let mut bound = Vec::with_capacity(g.columns.len());
            for c in &g.columns {
                let (name, col) = (&g.spec.name, &c.name);
                let one_hot = match steps.last() {
                    Some(Step::OneHot(n)) => Some(*n),
                    _ => None,
                };
                let chain = &steps[..steps.len() - one_hot.is_some() as usize];
                let b = match (c.source, chain.last()) {
                    (Source::Str, Some(step @ Step::Vocab { .. })) => {
                        match param(state, name, col, 0, step)?.vocabulary() {
                            Some((values, unknown)) => Bound::Str(
                                Arc::new(Lookup::Vocab(
                                    vocabs.next().unwrap_or_else(|| VocabIndex::new(values)),
                                    unknown.map_or(values.len() as i64, |u| u as i64),
                                )),
                                DictCache::default(),
                            ),
                            None => return Err(wrong_param(name, col, step)),
                        }
                    }
                    (Source::Str, Some(Step::HashBucket(n))) => {
                        Bound::Str(Arc::new(Lookup::Hash(*n)), DictCache::default())
                    }
                    (Source::Numeric { .. }, Some(Step::Bucketize(b))) => Bound::Bucket(
                        bind_numeric(name, col, &chain[..chain.len() - 1], chain.len(), state)?,
                        b.clone().into(),
                    ),
                    (Source::Numeric { .. }, Some(step @ Step::QuantileBucketize(_))) => {
                        let at = chain.len() - 1;
                        let boundaries = match param(state, name, col, at, step)? {
                            FittedParam::Quantiles { boundaries } => boundaries.clone().into(),
                            _ => return Err(wrong_param(name, col, step)),
                        };
                        Bound::Bucket(
                            bind_numeric(name, col, &chain[..at], at, state)?,
                            boundaries,
                        )
                    }
                    (source, None) if passes_ints(source, one_hot.is_some(), g.spec.kind) => {
                        Bound::IntPass
                    }
                    (Source::Numeric { .. }, _) => {
                        Bound::Float(bind_numeric(name, col, chain, chain.len(), state)?)
                    }
                    (Source::Tensor { .. }, _) => Bound::Tensor,
                    (Source::Str, _) => unreachable!("the plan checked string chains"),
                };
                bound.push(BoundColumn {
                    name: c.name.clone(),
                    offset: c.offset,
                    bound: b,
                    one_hot,
                });
            }
            columns.push(bound);
        }
        Ok(Transformer {
            plan: Arc::new(self.clone()),
            columns,
            state_version: state.version,
            scratch: Vec::new(),
            kept: Vec::new(),
        })
    }
}

impl FeaturePlan {
    /// The vocabulary indexes of the plan's vocab columns, in column order, built in
    /// parallel. Stops at the first column whose parameter is missing or wrong (binding
    /// reports it).
    fn build_vocabs(&self, state: &FittedState) -> Vec<VocabIndex> {
        let mut lists: Vec<&Vocabulary> = Vec::new();
        'groups: for g in &self.groups {
            let steps = &g.spec.steps;
            let chain_end = match steps.last() {
                Some(Step::OneHot(_)) => steps.len().checked_sub(2).map(|i| &steps[i]),
                other => other,
            };
            let Some(step @ Step::Vocab { .. }) = chain_end else {
                continue;
            };
            for c in g.columns.iter().filter(|c| c.source == Source::Str) {
                match param(state, &g.spec.name, &c.name, 0, step).map(|p| p.vocabulary()) {
                    Ok(Some((values, _))) => lists.push(values),
                    _ => break 'groups,
                }
            }
        }
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, lists.len().max(1));
        // Largest first, each thread taking the next from a shared counter: a few large
        // vocabularies are most of the work (Criteo: 5 of 26 hold 80% of the values), and
        // equal shares of columns left one thread with three of them.
        let mut order: Vec<usize> = (0..lists.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(lists[i].len()));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut built: Vec<(usize, VocabIndex)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                            mine.push((i, VocabIndex::new(lists[i])));
                        }
                        mine
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        built.sort_unstable_by_key(|&(i, _)| i);
        built.into_iter().map(|(_, index)| index).collect()
    }
}

impl Transformer {
    /// The plan this transformer applies.
    pub fn plan(&self) -> &FeaturePlan {
        &self.plan
    }

    /// The version of the fitted state it uses.
    pub fn state_version(&self) -> u64 {
        self.state_version
    }

    /// Featurizes one batch, which must hold `row_id` and the plan's input columns.
    pub fn apply(&mut self, batch: &RecordBatch) -> Result<RecordBatch> {
        let rows = batch.num_rows();
        let row_id = batch
            .column_by_name(ROW_ID)
            .filter(|c| c.data_type() == &DataType::UInt64)
            .ok_or_else(|| OpError::Schema(format!("no UInt64 `{ROW_ID}` column")))?;
        let mut out: Vec<ArrayRef> = vec![row_id.clone()];
        if let Some(label) = &self.plan.label {
            let row_ids: &UInt64Array = row_id.as_primitive();
            out.push(label_values(batch, label, |k| row_ids.value(k))?);
        }
        for (g, cols) in self.plan.groups.iter().zip(&mut self.columns) {
            let width = g.width;
            let name = &g.spec.name;
            // A group that is one ready tensor passes it through without a copy.
            if let [c] = cols.as_slice()
                && matches!(c.bound, Bound::Tensor)
            {
                out.push(tensor_column(batch, name, &c.name, g.spec.kind)?);
                continue;
            }
            let tensor: ArrayRef = match g.spec.kind {
                GroupKind::Dense => {
                    let mut values = vec![0f32; rows * width];
                    dense_values(batch, name, cols, width, &mut self.scratch, &mut values)?;
                    let item = Arc::new(Field::new_list_field(DataType::Float32, false));
                    Arc::new(FixedSizeListArray::try_new(
                        item,
                        width as i32,
                        Arc::new(Float32Array::from(values)),
                        None,
                    )?)
                }
                GroupKind::Ids => {
                    // Not cut into blocks: a column's ids come from one lookup over the
                    // whole batch, whose per-call cost outweighed the cache misses.
                    let mut values = vec![0i64; rows * width];
                    ids_values(batch, name, cols, width, &mut self.scratch, &mut values)?;
                    let item = Arc::new(Field::new_list_field(DataType::Int64, false));
                    Arc::new(FixedSizeListArray::try_new(
                        item,
                        width as i32,
                        Arc::new(Int64Array::from(values)),
                        None,
                    )?)
                }
            };
            out.push(tensor);
        }
        Ok(RecordBatch::try_new(self.plan.output_schema(), out)?)
    }
}

/// Writes a dense group's `[rows, width]` tensor of `batch` into `values` (zeroed).
fn dense_values(
    batch: &RecordBatch,
    name: &str,
    cols: &mut [BoundColumn],
    width: usize,
    scratch: &mut Vec<i64>,
    values: &mut [f32],
) -> Result<()> {
    for (part, out) in row_blocks(batch, cols, width, values)? {
        for c in cols.iter_mut() {
            dense_column(&part, name, c, width, scratch, out)?;
        }
    }
    Ok(())
}

/// Writes an ids group's `[rows, width]` tensor of `batch` into `values`.
fn ids_values(
    batch: &RecordBatch,
    name: &str,
    cols: &mut [BoundColumn],
    width: usize,
    scratch: &mut Vec<i64>,
    values: &mut [i64],
) -> Result<()> {
    for c in cols.iter_mut() {
        if let Bound::Tensor = c.bound {
            tensor_into::<Int64Type>(batch, name, c, width, values)?;
            continue;
        }
        scratch.resize(batch.num_rows(), 0);
        index_column(batch, name, c, scratch)?;
        scatter(scratch, width, c.offset, values);
    }
    Ok(())
}

/// Rows per block when a group's tensor is assembled: every column of the group writes
/// its slots of one block before the next block starts, so the block's part of the tensor
/// (at most 512 × width values) stays in cache while the columns interleave into it;
/// column after column over the whole batch streamed the tensor through memory once per
/// column (13 columns into `[65536, 13]`: 252 M values/s, against 572 M/s for one column).
const BLOCK_ROWS: usize = 512;

/// The batch cut into blocks of `BLOCK_ROWS` rows (zero-copy slices), each with its rows of
/// the row-major `[rows, width]` tensor `values`.
/// A batch of at most `BLOCK_ROWS` rows is its one block, as it is; a larger one is first
/// cut down to the group's columns (slicing costs an allocation or two per column).
fn row_blocks<'a, T>(
    batch: &'a RecordBatch,
    cols: &[BoundColumn],
    width: usize,
    values: &'a mut [T],
) -> Result<impl Iterator<Item = (Cow<'a, RecordBatch>, &'a mut [T])> + 'a> {
    let group = if batch.num_rows() <= BLOCK_ROWS {
        None
    } else {
        // With `row_id`, so that an error can say which row it was.
        let indices = cols
            .iter()
            .map(|c| c.name.as_str())
            .chain([ROW_ID])
            .filter_map(|name| batch.schema_ref().index_of(name).ok())
            .collect::<Vec<_>>();
        Some(batch.project(&indices)?)
    };
    Ok(values
        .chunks_mut(BLOCK_ROWS * width.max(1))
        .enumerate()
        .map(move |(b, out)| match &group {
            None => (Cow::Borrowed(batch), out),
            Some(g) => (
                Cow::Owned(g.slice(b * BLOCK_ROWS, out.len() / width.max(1))),
                out,
            ),
        }))
}

/// Copies a ready tensor column into its slots of a wider tensor.
fn tensor_into<T: arrow::datatypes::ArrowPrimitiveType>(
    batch: &RecordBatch,
    group: &str,
    c: &BoundColumn,
    width: usize,
    out: &mut [T::Native],
) -> Result<()> {
    // Without a null: the values under a null row are whatever its buffer holds.
    let list = ready_list(batch, group, &c.name, &T::DATA_TYPE)?;
    let w = list.value_length() as usize;
    let values = list.values().as_primitive::<T>();
    for (r, row) in values.values().chunks_exact(w).enumerate() {
        out[r * width + c.offset..r * width + c.offset + w].copy_from_slice(row);
    }
    Ok(())
}

/// Writes one column's slots of a dense tensor.
fn dense_column(
    batch: &RecordBatch,
    group: &str,
    c: &mut BoundColumn,
    width: usize,
    scratch: &mut Vec<i64>,
    out: &mut [f32],
) -> Result<()> {
    if let Bound::Float(ops) = &c.bound {
        let values = numeric_values(column(batch, group, &c.name)?, group, &c.name)?;
        chain_to_f32(values.values(), values.nulls(), ops, out, width, c.offset);
        return Ok(());
    }
    if let Bound::Tensor = c.bound {
        return tensor_into::<arrow::datatypes::Float32Type>(batch, group, c, width, out);
    }
    scratch.resize(batch.num_rows(), 0);
    index_column(batch, group, c, scratch)?;
    match c.one_hot {
        Some(n) => one_hot(scratch, n, width, c.offset, out),
        None => {
            for (r, &i) in scratch.iter().enumerate() {
                out[r * width + c.offset] = i as f32;
            }
        }
    }
    Ok(())
}

/// Computes one column's integer index per row.
fn index_column(
    batch: &RecordBatch,
    group: &str,
    c: &mut BoundColumn,
    out: &mut [i64],
) -> Result<()> {
    let array = column(batch, group, &c.name)?;
    match &mut c.bound {
        Bound::Bucket(ops, boundaries) => {
            let values = numeric_values(array, group, &c.name)?;
            chain_to_bucket(values.values(), values.nulls(), ops, boundaries, out);
        }
        Bound::IntPass => {
            let ints = checked_ints(batch, group, &c.name)?;
            let ints = ints.as_primitive::<Int64Type>();
            out.copy_from_slice(ints.values());
            if let Some(nulls) = ints.nulls() {
                out.iter_mut()
                    .zip(nulls.iter())
                    .for_each(|(o, valid)| *o = if valid { *o } else { -1 });
            }
        }
        Bound::Str(lookup, cache) => {
            if !crate::kernels::categorical::is_string_type(array.data_type()) {
                return Err(OpError::Schema(format!(
                    "group `{group}`: column `{}` is {}, expected strings",
                    c.name,
                    array.data_type()
                )));
            }
            strings_to_index(array.as_ref(), lookup, cache, out)?;
        }
        Bound::Float(_) | Bound::Tensor => unreachable!("float and tensor columns have no index"),
    }
    Ok(())
}

fn scatter(column: &[i64], width: usize, offset: usize, out: &mut [i64]) {
    if width == 1 {
        out.copy_from_slice(column);
    } else {
        for (r, &v) in column.iter().enumerate() {
            out[r * width + offset] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Float64Array, Int32Array};
    use arrow::datatypes::Schema;

    use super::*;
    use crate::group::{LabelSpec, LabelType};
    use crate::state::FittedState;
    use arrow::datatypes::Float32Type;

    /// A transformer of a label alone, of `dtype`, over a batch of rows 10, 11, ...
    fn labelled(label: ArrayRef, dtype: LabelType) -> Result<RecordBatch> {
        let n = label.len() as u64;
        let schema = Schema::new(vec![
            Field::new(ROW_ID, DataType::UInt64, false),
            Field::new("y", label.data_type().clone(), true),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(UInt64Array::from_iter_values(10..10 + n)), label],
        )
        .unwrap();
        let spec = LabelSpec {
            column: "y".into(),
            dtype,
        };
        let plan = FeaturePlan::compile("p", &[], Some(&spec), &batch.schema()).unwrap();
        plan.transformer(&FittedState::empty("p"))?.apply(&batch)
    }

    #[test]
    fn labels_a_trainer_cannot_use_are_named_by_row_id() {
        for (label, dtype, needle) in [
            (
                Arc::new(Float64Array::from(vec![Some(1.0), None, Some(0.0)])) as ArrayRef,
                LabelType::Float32,
                "is null at row_id 11",
            ),
            (
                Arc::new(Float64Array::from(vec![0.0, 1.0, f64::NAN])),
                LabelType::Float32,
                "is NaN at row_id 12",
            ),
            (
                Arc::new(Float64Array::from(vec![f64::NEG_INFINITY])),
                LabelType::Float32,
                "is -inf at row_id 10",
            ),
            // Too big for float32: the cast made it infinite, and it was named "inf".
            (
                Arc::new(Float64Array::from(vec![0.0, 1e300])),
                LabelType::Float32,
                "is 1e300, beyond the range of float32 labels at row_id 11",
            ),
            // A class index with a fraction: the cast dropped it, silently.
            (
                Arc::new(Float64Array::from(vec![1.0, 0.9, -2.7])),
                LabelType::Int64,
                "is 0.9, not a whole number, as int64 labels (class indices) must be at row_id 11",
            ),
            // Values int64 cannot hold: the cast made them null, and they were named so.
            (
                Arc::new(Float64Array::from(vec![2.0, f64::NAN])),
                LabelType::Int64,
                "is NaN, which int64 labels cannot hold at row_id 11",
            ),
            (
                Arc::new(UInt64Array::from(vec![3, (1 << 63) + 5])),
                LabelType::Int64,
                "is 9223372036854775813, which int64 labels cannot hold at row_id 11",
            ),
            (
                Arc::new(Int32Array::from(vec![Some(1), Some(0), None])),
                LabelType::Int64,
                "is null at row_id 12",
            ),
        ] {
            let err = labelled(label, dtype).unwrap_err().to_string();
            assert!(
                err.contains(&format!("label column `y` {needle}")),
                "{needle}: {err}"
            );
        }
        let ok = labelled(
            Arc::new(Int32Array::from(vec![1, 0, 7])),
            LabelType::Float32,
        )
        .unwrap();
        let label = ok.column(1).as_primitive::<Float32Type>();
        assert_eq!(label.values().as_ref(), [1.0, 0.0, 7.0]);
    }
}
