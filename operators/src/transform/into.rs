//! Featurizing straight into rows of buffers that are not a batch of their own
//! ([`Transformer::apply_into`]): a shuffled step's slots.
//!
//! A shuffled step draws its rows from many batches, so it cannot be a slice of one
//! featurized batch the way an in-order step is. Featurized first, every row was then
//! copied into its step, and the featurized batch — fresh memory each time — was faulted
//! in, zeroed, written, read back and freed: on 1M Criteo rows the copy alone was ~13% of
//! a shuffled run's CPU, and the fresh batches most of the page faults it added.
//!
//! Here a group's tensor is made in a buffer the transformer keeps (so it stays in cache
//! and is never faulted in again), and its rows go from there to their slots, gathered a
//! run of consecutive slots at a time and written with streaming stores ([`write_rows`]).
//! Writing each id column's values straight into the slots, one column after another,
//! was slower (10M Criteo rows: +29% CPU over in order, against +24%): every column
//! touched every row's cache lines in memory a step's slots leave cold.

use arrow::array::{Array, AsArray, RecordBatch, UInt64Array};
use arrow::buffer::Buffer;
use arrow::compute::cast;
use arrow::datatypes::DataType;
use arrow::datatypes::ToByteSlice;

use super::{Bound, Transformer, check_label, dense_values, ids_values, tensor_column};
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
        let runs = to.runs();
        write_rows(
            to,
            &runs,
            0,
            widths[0],
            row_ids.values()[..].to_byte_slice(),
        );
        let mut at = 1;
        if let Some(label) = &self.plan.label {
            let values = cast(
                column(batch, "label", &label.column)?,
                &label.dtype.data_type(),
            )?;
            check_label(&label.column, &values, |k| row_ids.value(k))?;
            write_array(to, &runs, at, widths[at], values.as_ref())?;
            at += 1;
        }
        for (g, cols) in self.plan.groups.iter().zip(&mut self.columns) {
            let (width, name, n) = (g.width, &g.spec.name, widths[at]);
            if let [c] = cols.as_slice()
                && matches!(c.bound, Bound::Tensor)
            {
                let tensor = tensor_column(batch, name, &c.name, g.spec.kind)?;
                write_array(to, &runs, at, n, tensor.as_ref())?;
            } else if g.spec.kind == GroupKind::Dense {
                self.dense.clear();
                self.dense.resize(rows * width, 0.0);
                dense_values(batch, name, cols, width, &mut self.scratch, &mut self.dense)?;
                write_rows(to, &runs, at, n, self.dense[..].to_byte_slice());
            } else {
                self.ids.clear();
                self.ids.resize(rows * width, 0);
                ids_values(batch, name, cols, width, &mut self.scratch, &mut self.ids)?;
                write_rows(to, &runs, at, n, self.ids[..].to_byte_slice());
            }
            at += 1;
        }
        Ok(())
    }
}

/// Writes `array`'s values (see [`value_bytes`]) into column `at`'s slots.
fn write_array(
    to: &RowTargets<'_>,
    runs: &Runs,
    at: usize,
    n: usize,
    array: &dyn Array,
) -> Result<()> {
    let bytes = value_bytes(array, n).ok_or_else(|| {
        OpError::Schema(format!(
            "a featurized {} column is not of fixed width",
            array.data_type()
        ))
    })?;
    write_rows(to, runs, at, n, bytes.as_slice());
    Ok(())
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
/// cannot do well either.
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
                // A row wider than the staging buffer: copied as it is.
                let from = &src[rows[0] as usize * n..][..n];
                // SAFETY: as above.
                unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), dst, n) };
                continue;
            }
            gather(src, rows, n, &mut staging[..bytes]);
            // SAFETY: `bytes` bytes from `dst` are these rows' slots (as above).
            unsafe { stream_out(dst, &staging[..bytes]) };
        }
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a fence has no preconditions; it orders the streaming stores above before
    // whatever this thread does next (releasing the steps' lock).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Rows `rows` of `src` (`n` bytes each), one after another into `out`.
fn gather(src: &[u8], rows: &[u32], n: usize, out: &mut [u8]) {
    // Rows of the widths featurized columns have are moved as arrays of a known size
    // (a few vector moves): a `memcpy` call a row cost more than the row.
    macro_rules! fixed {
        ($($k:literal)*) => {
            match n {
                $($k => {
                    let from = src.as_chunks::<$k>().0;
                    for (to, &r) in out.as_chunks_mut::<$k>().0.iter_mut().zip(rows) {
                        *to = from[r as usize];
                    }
                })*
                _ => {
                    for (to, &r) in out.chunks_exact_mut(n.max(1)).zip(rows) {
                        to.copy_from_slice(&src[r as usize * n..][..n]);
                    }
                }
            }
        };
    }
    fixed!(4 8 12 16 20 24 28 32 36 40 44 48 52 56 60 64 128 208 256);
}

/// Writes `src` to `dst`, with streaming stores where the target allows.
///
/// # Safety
/// `src.len()` bytes from `dst` are valid for writes and overlap nothing `src` holds.
unsafe fn stream_out(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let head = dst.align_offset(16).min(src.len());
        let body = (src.len() - head) / 16 * 16;
        // SAFETY: every write below stays inside `dst[..src.len()]` (the caller's
        // promise); the streaming stores are to 16-byte aligned addresses.
        unsafe {
            // The ends (under 16 bytes each) byte by byte: a `memcpy` call of a length
            // not known here cost more than they do.
            for k in (0..head).chain(head + body..src.len()) {
                dst.add(k).write(src[k]);
            }
            for k in (head..head + body).step_by(16) {
                let v = _mm_loadu_si128(src.as_ptr().add(k).cast::<__m128i>());
                _mm_stream_si128(dst.add(k).cast::<__m128i>(), v);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's promise.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
    };
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

    /// Where row `i` of `n` goes: `(target, slot)` among 3 targets.
    type Place = fn(usize, usize) -> (usize, usize);

    /// Rows in slots descending, one target after another (sorted into runs).
    const DESCENDING: Place = |i, n| (i % 3, (n - 1 - i) / 3);
    /// As a shuffled batch's rows go into its steps: each target's slots ascend, in runs
    /// with a gap between (slot 2 of every 5 left alone).
    const STRIDED: Place = |i, _| (i % 3, i / 3 + i / 3 / 2);

    /// The slots each target needs for `n` rows placed by `place`.
    fn slots(n: usize, place: Place) -> usize {
        (0..n).map(|i| place(i, n).1 + 1).max().unwrap_or(0)
    }

    /// `batch` featurized into 3 targets as `place` says, in buffers of `0xAB`; returns
    /// the buffers, `[column][target]`.
    fn write(t: &mut Transformer, batch: &RecordBatch, place: Place) -> Result<Vec<Vec<Vec<u8>>>> {
        let n = batch.num_rows();
        let slots = slots(n, place);
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
        // SAFETY: every slot is inside its buffer (`slots` is past every row's), the
        // buffers are borrowed by nothing else, and rows name distinct (target, slot)
        // pairs.
        let to = unsafe { RowTargets::new(&bases, &rows) };
        t.apply_into(batch, &to)?;
        Ok(buffers
            .into_iter()
            .map(|c| c.into_iter().map(|b| b[1..].to_vec()).collect())
            .collect())
    }

    #[test]
    fn writes_each_row_where_apply_puts_it_and_nothing_else() {
        for (n, place) in [1, 5, 700, 1500]
            .into_iter()
            .flat_map(|n| [(n, DESCENDING), (n, STRIDED)])
        {
            let input = batch(n);
            let mut t = transformer(&input);
            let want = t.apply(&input).unwrap();
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
        let err = write(&mut t, &bad, STRIDED).unwrap_err().to_string();
        assert!(err.contains("is null at row_id 104"), "{err}");
    }
}
