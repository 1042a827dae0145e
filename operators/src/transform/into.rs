//! Featurizing into rows of buffers that are not a batch of their own: a shuffled step's
//! slots. [`Transformer::featurize_rows`] makes a batch's columns in buffers the
//! transformer keeps; [`Featurized::write_into`] then writes each row into its slot.
//!
//! A shuffled step draws its rows from many batches, so it cannot be a slice of one
//! featurized batch the way an in-order step is. Featurized into a batch first, every row
//! was then copied into its step, and the batch — fresh memory each time — was faulted
//! in, zeroed, written, read back and freed: on 1M Criteo rows the copy alone was ~13% of
//! a shuffled run's CPU, and the fresh batches most of the page faults it added.
//!
//! Here a group's tensor is made in a buffer the transformer keeps (so it is never faulted
//! in again and is still in cache when it is written out), and its rows go from there to
//! their slots, gathered a run of consecutive slots at a time and written with streaming
//! stores ([`write_rows`]). Writing each id column's values straight into the slots, one
//! column after another, was slower (10M Criteo rows: +29% CPU over in order, against
//! +24%): every column touched every row's cache lines in memory a step's slots leave
//! cold. Making the columns apart from writing them also lets a caller featurize before it
//! takes the locks that the slots' buffers need.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, ToByteSlice};

use super::{Bound, Transformer, dense_values, ids_values, label_values, tensor_column};
use crate::error::{OpError, Result};
use crate::group::GroupKind;
use crate::kernels::rows::{gather, store_fence, stream_out};
use crate::plan::ROW_ID;

/// Where [`Featurized::write_into`] writes each row: row `i` of a batch goes to slot
/// `rows[i].1` of target `rows[i].0`, and column `c` of target `t` (the plan's output
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

/// A group's tensor, kept by the transformer from batch to batch: a dense group's or an
/// ids group's.
#[derive(Debug, Clone, Default)]
pub(super) struct Kept {
    dense: Vec<f32>,
    ids: Vec<i64>,
}

/// A batch's featurized columns, each as rows of bytes, ready to be written into rows
/// elsewhere ([`Featurized::write_into`]): the batch's own buffers where a column passes
/// through (row ids, labels, ready tensors), the transformer's kept buffers for the groups
/// it computes.
#[derive(Debug)]
pub struct Featurized<'t> {
    rows: usize,
    /// Each output column's bytes and bytes a row.
    columns: Vec<(Bytes<'t>, usize)>,
}

/// Where an output column of a batch being featurized is: the batch's own buffer, or
/// group `g`'s kept tensor.
enum Made {
    Shared(Buffer),
    Kept(usize),
}

impl Made {
    /// `array`'s values as rows of `n` bytes (see [`value_bytes`]).
    fn shared(array: &dyn Array, n: usize) -> Result<Made> {
        let bytes = value_bytes(array, n).ok_or_else(|| {
            OpError::Schema(format!(
                "a featurized {} column is not {n} bytes a row",
                array.data_type()
            ))
        })?;
        Ok(Made::Shared(bytes))
    }
}

#[derive(Debug)]
enum Bytes<'t> {
    Shared(Buffer),
    Kept(&'t [u8]),
}

impl Bytes<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Shared(b) => b.as_slice(),
            Bytes::Kept(k) => k,
        }
    }
}

impl Transformer {
    /// Featurizes `batch` as [`Transformer::apply`] does, failing where it fails, into
    /// buffers this transformer keeps (see [`Featurized`]) rather than a new batch.
    pub fn featurize_rows(&mut self, batch: &RecordBatch) -> Result<Featurized<'_>> {
        let rows = batch.num_rows();
        let schema = self.plan.output_schema();
        let widths = schema
            .fields()
            .iter()
            .map(|f| row_bytes(f.data_type()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| OpError::Schema("an output column is not of fixed width".into()))?;
        let row_id = batch
            .column_by_name(ROW_ID)
            .filter(|c| c.data_type() == &DataType::UInt64 && c.null_count() == 0)
            .ok_or_else(|| OpError::Schema(format!("no non-null UInt64 `{ROW_ID}` column")))?;
        let row_ids = row_id.as_primitive::<arrow::datatypes::UInt64Type>();
        let mut made = vec![Made::shared(row_id.as_ref(), widths[0])?];
        if let Some(label) = &self.plan.label {
            let values = label_values(batch, label, |k| row_ids.value(k))?;
            made.push(Made::shared(values.as_ref(), widths[made.len()])?);
        }
        self.kept.resize_with(self.plan.groups.len(), Kept::default);
        let columns = self.plan.groups.iter().zip(&mut self.columns);
        for (k, ((g, cols), kept)) in columns.zip(&mut self.kept).enumerate() {
            let (width, name) = (g.width, &g.spec.name);
            if let [c] = cols.as_slice()
                && matches!(c.bound, Bound::Tensor)
            {
                let tensor = tensor_column(batch, name, &c.name, g.spec.kind)?;
                made.push(Made::shared(tensor.as_ref(), widths[made.len()])?);
                continue;
            }
            made.push(Made::Kept(k));
            let scratch = &mut self.scratch;
            match g.spec.kind {
                GroupKind::Dense => {
                    kept.dense.clear();
                    kept.dense.resize(rows * width, 0.0);
                    dense_values(batch, name, cols, width, scratch, &mut kept.dense)?;
                }
                GroupKind::Ids => {
                    // Every column of an ids group writes its slots of every row (an index
                    // or a ready tensor; no one-hot), so what the last batch left here is
                    // overwritten and needs no zeroing first.
                    kept.ids.resize(rows * width, 0);
                    ids_values(batch, name, cols, width, scratch, &mut kept.ids)?;
                }
            }
        }
        let columns = made
            .into_iter()
            .zip(widths)
            .map(|(m, n)| {
                let bytes = match m {
                    Made::Shared(b) => Bytes::Shared(b),
                    Made::Kept(g) => Bytes::Kept(match self.plan.groups[g].spec.kind {
                        GroupKind::Dense => self.kept[g].dense[..].to_byte_slice(),
                        GroupKind::Ids => self.kept[g].ids[..].to_byte_slice(),
                    }),
                };
                (bytes, n)
            })
            .collect();
        Ok(Featurized { rows, columns })
    }
}

impl Featurized<'_> {
    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes a row of each column takes, in the plan's output order.
    pub fn row_bytes(&self) -> impl Iterator<Item = usize> + '_ {
        self.columns.iter().map(|&(_, n)| n)
    }

    /// Writes each row into its slot of `to`, every column of it (no column has nulls).
    /// Fails, writing nothing, when `to` is not for this many rows and columns.
    pub fn write_into(&self, to: &RowTargets<'_>) -> Result<()> {
        let targets = to.rows.iter().map(|&(t, _)| t as usize + 1).max();
        if to.rows.len() != self.rows
            || to.bases.len() != self.columns.len()
            || to.bases.iter().any(|b| b.len() < targets.unwrap_or(0))
        {
            return Err(OpError::Schema(format!(
                "{} rows were given {} targets of {} columns, for {} columns",
                self.rows,
                to.rows.len(),
                to.bases.len(),
                self.columns.len()
            )));
        }
        let runs = to.runs();
        for (at, (bytes, n)) in self.columns.iter().enumerate() {
            write_rows(to, &runs, at, *n, bytes.as_slice());
        }
        store_fence();
        Ok(())
    }
}

/// The rows of a batch in the order their slots lie in memory: by target, slots
/// ascending, cut into runs of consecutive slots of one target.
struct Runs {
    /// Row numbers, in slot order.
    order: Vec<u32>,
    /// `(target, first slot, first index into order, rows)`.
    runs: Vec<(u32, u32, usize, usize)>,
}

impl RowTargets<'_> {
    /// The rows as [`Runs`]. A shuffled batch's rows for one step fill one run of slots,
    /// so a batch is a few runs.
    fn runs(&self) -> Runs {
        let targets = self
            .rows
            .iter()
            .map(|&(t, _)| t as usize + 1)
            .max()
            .unwrap_or(0);
        // Counting sort by target: rows of a target keep their order, in which their slots
        // usually ascend already.
        let mut first = vec![0usize; targets + 1];
        for &(t, _) in self.rows {
            first[t as usize + 1] += 1;
        }
        for t in 0..targets {
            first[t + 1] += first[t];
        }
        let mut next = first.clone();
        let mut order = vec![0u32; self.rows.len()];
        for (row, &(t, _)) in self.rows.iter().enumerate() {
            order[next[t as usize]] = row as u32;
            next[t as usize] += 1;
        }
        let slot = |row: u32| self.rows[row as usize].1;
        for t in 0..targets {
            let rows = &mut order[first[t]..first[t + 1]];
            if !rows.is_sorted_by_key(|&r| slot(r)) {
                rows.sort_unstable_by_key(|&r| slot(r));
            }
        }
        let mut runs = Vec::new();
        let mut k = 0;
        while k < order.len() {
            let (t, s) = self.rows[order[k] as usize];
            let mut len = 1;
            while order
                .get(k + len)
                .is_some_and(|&r| self.rows[r as usize] == (t, s + len as u32))
            {
                len += 1;
            }
            runs.push((t, s, k, len));
            k += len;
        }
        Runs { order, runs }
    }
}

/// Bytes of rows gathered at a time before they are written out (in L1).
const STAGING: usize = 4096;

/// Copies `src`, rows of `n` bytes (as many as `to` has), into column `at`'s slots, run
/// by run of `runs`: rows are gathered (from `src`, in cache) into a small buffer, which
/// is then written to its consecutive slots with streaming stores. A step's slots are
/// read only when the step goes out, after its whole window, so reading their cache lines
/// in first (what a plain store does) was traffic for nothing; written row by row in
/// batch order, a row's lines were only partly written at a time, which streaming stores
/// cannot do well either. The caller fences ([`store_fence`]) once every column is out.
fn write_rows(to: &RowTargets<'_>, runs: &Runs, at: usize, n: usize, src: &[u8]) {
    assert_eq!(
        src.len(),
        to.rows.len() * n,
        "a column's rows are not all there"
    );
    let bases = &to.bases[at];
    let mut staging = [0u8; STAGING];
    let per = (STAGING / n.max(1)).max(1);
    for &(target, slot, start, len) in &runs.runs {
        // SAFETY: `RowTargets::new`'s caller promised that the slots of this target that
        // rows name lie in its allocation: this run's are `slot..slot + len`.
        let dst = unsafe { bases[target as usize].add(slot as usize * n) };
        for (k, rows) in runs.order[start..start + len].chunks(per).enumerate() {
            let bytes = rows.len() * n;
            // SAFETY: as above; these are slots `slot + k·per ..` of the run.
            let dst = unsafe { dst.add(k * per * n) };
            if bytes > STAGING {
                // A row wider than the staging buffer (`per` is 1): written as it is.
                let from = &src[rows[0] as usize * n..][..n];
                // SAFETY: as above; `from` is in `src`, apart from every target.
                unsafe { stream_out(dst, from) };
                continue;
            }
            gather(src, rows, n, &mut staging[..bytes]);
            // SAFETY: `bytes` bytes from `dst` are these rows' slots (as above).
            unsafe { stream_out(dst, &staging[..bytes]) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        ArrayRef, FixedSizeListArray, Float32Array, Float64Array, Int64Array, StringArray,
        UInt64Array,
    };
    use arrow::datatypes::{Field, Schema};

    use super::*;
    use crate::group::{FeatureGroup, LabelSpec, LabelType};
    use crate::plan::FeaturePlan;
    use crate::state::FittedState;
    use crate::step::Step;

    /// A tensor column of `n` rows of `width` values, row `i` holding `i·width..`.
    fn tensor<T>(n: usize, width: usize, item: DataType, value: impl Fn(usize) -> T) -> ArrayRef
    where
        T: Into<f64>,
    {
        let values: ArrayRef = match item {
            DataType::Float32 => Arc::new(Float32Array::from_iter_values(
                (0..n * width).map(|i| value(i).into() as f32),
            )),
            _ => Arc::new(Int64Array::from_iter_values(
                (0..n * width).map(|i| value(i).into() as i64),
            )),
        };
        let field = Arc::new(Field::new_list_field(item, false));
        Arc::new(FixedSizeListArray::try_new(field, width as i32, values, None).unwrap())
    }

    /// A batch of `n` rows of every kind of column a plan reads (labels, numbers with and
    /// without nulls, strings, integers, tensors of several widths), sliced from a larger
    /// one so that its arrays start at an offset.
    fn batch(n: usize) -> RecordBatch {
        let m = n + 5;
        let x = (0..m).map(|i| (i % 7 != 3).then_some(i as f64 * 0.5 - 3.0));
        let s = |k: usize| {
            (0..m)
                .map(move |i| format!("v{}", (i * k) % 11))
                .collect::<Vec<_>>()
        };
        RecordBatch::try_from_iter([
            (
                "row_id",
                Arc::new(UInt64Array::from_iter_values(95..95 + m as u64)) as ArrayRef,
            ),
            (
                "y",
                Arc::new(Float64Array::from_iter_values(
                    (0..m).map(|i| (i % 2) as f64),
                )),
            ),
            ("x", Arc::new(Float64Array::from_iter(x))),
            (
                "z",
                Arc::new(Float64Array::from_iter_values((0..m).map(|i| i as f64))),
            ),
            ("a", Arc::new(StringArray::from(s(3)))),
            ("b", Arc::new(StringArray::from(s(5)))),
            (
                "c",
                Arc::new(Int64Array::from_iter_values((0..m as i64).map(|i| i * 3))),
            ),
            ("t", tensor(m, 17, DataType::Float32, |i| i as f32 * 0.25)),
            ("u", tensor(m, 2, DataType::Float32, |i| i as f32)),
            ("k", tensor(m, 2, DataType::Int64, |i| i as i32)),
            (
                "w",
                tensor(m, 1100, DataType::Float32, |i| (i % 1000) as f32),
            ),
        ])
        .unwrap()
        .slice(5, n)
    }

    /// Dense and ids groups from numbers and strings, with a one-hot, and a float label.
    fn computed(batch: &RecordBatch) -> Transformer {
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
        transformer(batch, &groups, LabelType::Float32)
    }

    /// Ready tensors: passed through alone (17 floats; 1,100 floats, wider than the staging
    /// buffer), two in one dense group, and one beside an integer column in an ids group;
    /// an integer label.
    fn passed(batch: &RecordBatch) -> Transformer {
        let groups = [
            FeatureGroup::new("t", GroupKind::Dense, &["t"], vec![]),
            FeatureGroup::new("w", GroupKind::Dense, &["w"], vec![]),
            FeatureGroup::new("tu", GroupKind::Dense, &["t", "u"], vec![]),
            FeatureGroup::new("kc", GroupKind::Ids, &["k", "c"], vec![]),
        ];
        transformer(batch, &groups, LabelType::Int64)
    }

    fn transformer(batch: &RecordBatch, groups: &[FeatureGroup], label: LabelType) -> Transformer {
        let label = LabelSpec {
            column: "y".into(),
            dtype: label,
        };
        let plan = FeaturePlan::compile("p", groups, Some(&label), &batch.schema()).unwrap();
        plan.transformer(&FittedState::empty("p")).unwrap()
    }

    /// Where row `i` of `n` goes: `(target, slot)` among 3 targets.
    type Place = fn(usize, usize) -> (usize, usize);

    /// Rows in slots descending, one target after another (sorted into runs).
    const DESCENDING: Place = |i, n| (i % 3, (n - 1 - i) / 3);
    /// As a shuffled batch's rows go into its steps: each target's slots ascend, in runs
    /// with a gap between (slot 2 of every 3 left alone).
    const STRIDED: Place = |i, _| (i % 3, i / 3 + i / 3 / 2);

    /// `batch` featurized into 3 targets as `place` says, in buffers of `0xAB`; returns
    /// the buffers, `[column][target]`.
    fn write(t: &mut Transformer, batch: &RecordBatch, place: Place) -> Result<Vec<Vec<Vec<u8>>>> {
        let n = batch.num_rows();
        let slots = (0..n).map(|i| place(i, n).1 + 1).max().unwrap_or(0);
        let widths: Vec<usize> = t
            .plan()
            .output_schema()
            .fields()
            .iter()
            .map(|f| row_bytes(f.data_type()).unwrap())
            .collect();
        // One spare byte in front, so that slots start at odd addresses too.
        let mut buffers: Vec<Vec<Vec<u8>>> = widths
            .iter()
            .map(|w| vec![vec![0xAB; slots * w + 1]; 3])
            .collect();
        let bases: Vec<Vec<*mut u8>> = buffers
            .iter_mut()
            .map(|c| c.iter_mut().map(|b| b[1..].as_mut_ptr()).collect())
            .collect();
        let rows: Vec<(u32, u32)> = (0..n)
            .map(|i| place(i, n))
            .map(|(t, s)| (t as u32, s as u32))
            .collect();
        let featurized = t.featurize_rows(batch)?;
        assert!(featurized.row_bytes().eq(widths.iter().copied()));
        // SAFETY: every slot is inside its buffer (`slots` is past every row's), the
        // buffers are borrowed by nothing else, and rows name distinct (target, slot)
        // pairs.
        let to = unsafe { RowTargets::new(&bases, &rows) };
        featurized.write_into(&to)?;
        Ok(buffers
            .into_iter()
            .map(|c| c.into_iter().map(|b| b[1..].to_vec()).collect())
            .collect())
    }

    #[test]
    fn writes_each_row_where_apply_puts_it_and_nothing_else() {
        let makers: [fn(&RecordBatch) -> Transformer; 2] = [computed, passed];
        for (maker, n, place) in makers.into_iter().flat_map(|m| {
            [0, 1, 5, 700, 1500]
                .into_iter()
                .flat_map(move |n| [(m, n, DESCENDING), (m, n, STRIDED)])
        }) {
            let input = batch(n);
            let mut t = maker(&input);
            let want = t.apply(&input).unwrap();
            // Rows of other values first: the kept tensors hold them when `input` comes.
            t.featurize_rows(&batch(n + 40).slice(40, n)).unwrap();
            let got = write(&mut t, &input, place).unwrap();
            for (c, column) in want.columns().iter().enumerate() {
                let w = row_bytes(column.data_type()).unwrap();
                let bytes = value_bytes(column.as_ref(), w).unwrap();
                let mut untouched = got[c].clone();
                for i in 0..n {
                    let (target, slot) = place(i, n);
                    assert_eq!(
                        &got[c][target][slot * w..(slot + 1) * w],
                        &bytes[i * w..(i + 1) * w],
                        "{n} rows, column {c}, row {i}"
                    );
                    untouched[target][slot * w..(slot + 1) * w].fill(0xAB);
                }
                let all = untouched.iter().flatten().all(|&b| b == 0xAB);
                assert!(all, "{n} rows, column {c}: a slot no row names was written");
            }
        }
    }

    #[test]
    fn refuses_targets_of_another_shape_and_rows_apply_refuses() {
        let input = batch(30);
        let mut t = computed(&input);
        let featurized = t.featurize_rows(&input).unwrap();
        let bases: Vec<Vec<*mut u8>> = vec![vec![]];
        let rows: Vec<(u32, u32)> = (0..30).map(|i| (0, i)).collect();
        // SAFETY: nothing is written: the shape is refused first.
        let to = unsafe { RowTargets::new(&bases, &rows) };
        assert!(featurized.write_into(&to).is_err());
        let nullable = |input: &RecordBatch, column: usize, bad: ArrayRef| {
            let schema = input.schema();
            let fields = schema
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true));
            let schema = Arc::new(Schema::new(fields.collect::<Vec<_>>()));
            let mut columns = input.columns().to_vec();
            columns[column] = bad;
            RecordBatch::try_new(schema, columns).unwrap()
        };
        let label = Arc::new(Float64Array::from_iter(
            (0..30).map(|i| (i != 4).then_some(1.0)),
        ));
        let err = write(&mut t, &nullable(&input, 1, label), STRIDED).unwrap_err();
        assert!(err.to_string().contains("is null at row_id 104"), "{err}");
        let ids = Arc::new(UInt64Array::from_iter(
            (0..30).map(|i| (i != 7).then_some(i)),
        ));
        let err = write(&mut t, &nullable(&input, 0, ids), STRIDED).unwrap_err();
        assert!(err.to_string().contains("row_id"), "{err}");
    }
}
