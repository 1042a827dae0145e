//! A shuffled step filled as its rows arrive: each batch's rows are written into the
//! step's own buffers as the batch is featurized, not gathered once the step is complete.
//!
//! A shuffled step draws its rows from every featurized batch of a window (16 of them for
//! Criteo rows, `--shuffle-window 65536` and `B = 4096`). Gathered at the end, each row
//! was read long after it left the cache. Now a reader whose batch goes wholly to its own
//! process's ranks featurizes it and writes its rows straight into their steps
//! ([`Fill::write_many`], through the [`Arena`](super::arena::Arena)); the rows of other
//! batches are copied in from the featurized batch while it is in the reader's cache, and
//! an owner copies rows that came from another process when they arrive. A piece's rows
//! are copied in batch order, each into its own step ([`Fill::put_many`]); with strided
//! windows (see `placement.rs`) a piece's rows of one step fill consecutive slots, so the
//! writes into each step run forward too.
//!
//! Only columns of fixed width (primitives, and `FixedSizeList`s of primitives without
//! null items: every featurized column) can be filled; a plan with other columns keeps
//! gathering ([`Fill::supports`]).

use arrow::array::{Array, ArrayData, ArrayRef, RecordBatch, make_array};
use arrow::buffer::{Buffer, MutableBuffer, NullBuffer};
use arrow::datatypes::{DataType, Schema, SchemaRef};

use super::gather::AHEAD;
use crate::error::{Error, Result};
use crate::recycle;
use hydrant_operators::kernels::prefetch;
use hydrant_operators::kernels::rows::store_fence;
use hydrant_operators::{Featurized, RowTargets, row_bytes, value_bytes};

/// One step's rows, filled slot by slot.
pub(crate) struct Fill {
    columns: Vec<Column>,
    /// Which slots hold a row.
    filled: Vec<bool>,
}

/// A piece's columns as rows of bytes, with their nulls: made once a piece, for
/// [`Fill::put_many`].
pub(crate) struct Sources {
    columns: Vec<(Buffer, Option<NullBuffer>)>,
    rows: usize,
}

impl Sources {
    /// Rows of the piece's batch.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// `batch`'s columns, laid out as `schema`'s (which [`Fill::supports`]). Fails on a
    /// column of another layout.
    pub(crate) fn of(schema: &Schema, batch: &RecordBatch) -> Result<Self> {
        let widths = schema.fields().iter().map(|f| row_bytes(f.data_type()));
        Sources::new(batch, widths)
    }

    /// `batch`'s columns, each of `widths` bytes a row (`None`: not of fixed width).
    fn new(
        batch: &RecordBatch,
        widths: impl ExactSizeIterator<Item = Option<usize>>,
    ) -> Result<Self> {
        if batch.num_columns() != widths.len() {
            return Err(layout("a piece has other columns than its step"));
        }
        let columns = batch
            .columns()
            .iter()
            .zip(widths)
            .map(|(array, width)| {
                width
                    .and_then(|n| source(array.as_ref(), n))
                    .ok_or_else(|| layout("a piece's column is not of fixed width"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sources {
            columns,
            rows: batch.num_rows(),
        })
    }
}

/// One column of a step: `B` rows of `row_bytes` bytes, written as they arrive.
struct Column {
    row_bytes: usize,
    /// Room for `B` rows; its length stays 0 until [`Fill::finish`], and bytes are only
    /// written through its pointer, into slots below `B` claimed first.
    values: MutableBuffer,
    /// Which rows are valid, once a piece brought a null.
    validity: Option<Vec<bool>>,
}

impl Fill {
    /// Whether every column of `schema` can be filled.
    pub(crate) fn supports(schema: &Schema) -> bool {
        schema
            .fields()
            .iter()
            .all(|f| row_bytes(f.data_type()).is_some())
    }

    /// An empty step of `b` slots for the columns of `schema` (which [`Fill::supports`]).
    pub(crate) fn new(schema: &Schema, b: usize) -> Self {
        let columns = schema
            .fields()
            .iter()
            .map(|f| {
                let row_bytes = row_bytes(f.data_type()).unwrap_or(0);
                Column {
                    row_bytes,
                    values: recycle::take(b * row_bytes),
                    validity: None,
                }
            })
            .collect();
        Fill {
            columns,
            filled: vec![false; b],
        }
    }

    /// Copies rows of `batch` into their slots: `picks` are `(slot, row)`. Fails, copying
    /// nothing, on a slot already filled or past `B`, or a column of another layout.
    #[cfg(test)]
    pub(crate) fn put(&mut self, batch: &RecordBatch, picks: &[(u32, u32)]) -> Result<()> {
        let widths = self.columns.iter().map(|c| Some(c.row_bytes));
        let sources = Sources::new(batch, widths)?;
        let picks: Vec<Pick> = picks.iter().map(|&(slot, row)| (row, 0, slot)).collect();
        Fill::put_many(&mut [self], &sources, &picks)
    }

    /// Copies rows of `sources` into several steps of this schema and size at once:
    /// `picks` are `(row, fill, slot)`, best in ascending row order. Fails, copying
    /// nothing, on a slot already filled or past `B`, a row past the batch or a fill not
    /// in `fills`.
    ///
    /// One pass over the batch's rows, each written to whichever step it belongs to, costs
    /// about two thirds of a pass per step: a step takes one row in 16 of a batch (see
    /// `placement.rs`), so step by step the batch was read 16 times out of order.
    pub(crate) fn put_many(
        fills: &mut [&mut Fill],
        sources: &Sources,
        picks: &[Pick],
    ) -> Result<()> {
        let Some(first) = fills.first() else {
            return match picks.is_empty() {
                true => Ok(()),
                false => Err(layout("rows were put into no step")),
            };
        };
        let (b, widths) = (first.filled.len(), first.widths().collect::<Vec<_>>());
        if fills
            .iter()
            .any(|f| f.filled.len() != b || !f.widths().eq(widths.iter().copied()))
            || sources.columns.len() != widths.len()
        {
            return Err(layout("a piece has other columns than its step"));
        }
        for (&width, (bytes, _)) in widths.iter().zip(&sources.columns) {
            if bytes.len() != sources.rows * width {
                return Err(layout("a piece's column is not of its step's width"));
            }
        }
        claim(fills, picks, sources.rows)?;
        for (c, (bytes, nulls)) in sources.columns.iter().enumerate() {
            let dsts: Vec<*mut u8> = fills
                .iter_mut()
                .map(|f| {
                    let column = &mut f.columns[c];
                    let room = column.values.capacity() >= b * column.row_bytes;
                    assert!(room, "made so by Fill::new");
                    column.values.as_mut_ptr()
                })
                .collect();
            copy_rows(widths[c], bytes.as_slice(), &dsts, picks);
            if let Some(nulls) = nulls.as_ref().filter(|n| n.null_count() > 0) {
                for &(row, fill, slot) in picks {
                    let column = &mut fills[fill as usize].columns[c];
                    let validity = column.validity.get_or_insert_with(|| vec![true; b]);
                    validity[slot as usize] = nulls.is_valid(row as usize);
                }
            }
        }
        Ok(())
    }

    /// Writes a featurized batch's rows into several steps of this schema and size at
    /// once ([`Featurized::write_into`]): `picks` are `(row, fill, slot)`, one for every
    /// row of the batch, in row order. Fails, filling nothing, as [`Fill::put_many`] does,
    /// and on rows of other columns than the steps'.
    pub(crate) fn write_many(
        fills: &mut [&mut Fill],
        featurized: &Featurized<'_>,
        picks: &[Pick],
    ) -> Result<()> {
        if fills.iter().any(|f| !f.widths().eq(featurized.row_bytes())) {
            return Err(layout("a step has other columns than the featurized rows"));
        }
        let rows = featurized.rows();
        if picks.len() != rows || picks.iter().enumerate().any(|(k, p)| p.0 as usize != k) {
            return Err(layout("not every row of a batch was placed, in order"));
        }
        claim(fills, picks, rows)?;
        let columns = fills.first().map_or(0, |f| f.columns.len());
        let bases: Vec<Vec<*mut u8>> = (0..columns)
            .map(|c| {
                fills
                    .iter_mut()
                    .map(|f| {
                        let column = &mut f.columns[c];
                        let room = column.values.capacity() >= f.filled.len() * column.row_bytes;
                        assert!(room, "made so by Fill::new");
                        column.values.as_mut_ptr()
                    })
                    .collect()
            })
            .collect();
        let targets: Vec<(u32, u32)> = picks.iter().map(|&(_, fill, slot)| (fill, slot)).collect();
        // SAFETY: `claim` checked that every pick's fill is one of `fills` and its slot is
        // below `B` and was free, and it marked each taken, so no two rows name one slot.
        // Every column of a fill has room for `B` slots of its width (checked just above),
        // which is the featurized column's (checked first), and `fills` are borrowed
        // mutably, so nothing else reads or writes them while the rows are written.
        let to = unsafe { RowTargets::new(&bases, &targets) };
        // A panic while writing leaves the slots claimed and partly written: harmless, as
        // the owner is never told of these rows, so it never lets their steps out (and the
        // worker's panic ends the job).
        featurized.write_into(&to).map_err(|e| {
            unclaim(fills, picks);
            Error::from(e)
        })
    }

    /// Bytes a row of each column takes.
    fn widths(&self) -> impl Iterator<Item = usize> + '_ {
        self.columns.iter().map(|c| c.row_bytes)
    }

    /// Slots filled so far.
    fn rows(&self) -> usize {
        self.filled.iter().filter(|&&f| f).count()
    }

    /// The first `real` slots, every one filled, as a batch of `schema`.
    pub(crate) fn finish(self, schema: &SchemaRef, real: usize) -> Result<RecordBatch> {
        if real > self.filled.len() || self.filled[..real].iter().any(|f| !f) {
            return Err(Error::Dataflow(format!(
                "a step was emitted with {} of its {real} rows",
                self.rows()
            )));
        }
        let columns = self
            .columns
            .into_iter()
            .zip(schema.fields())
            .map(|(column, field)| column.finish(field.data_type(), real))
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

impl Column {
    fn finish(mut self, data_type: &DataType, real: usize) -> Result<ArrayRef> {
        // SAFETY: `Fill::finish` checked that slots `0..real` were all written, each of
        // `row_bytes` bytes by `Fill::put_many` or `Fill::write_many`, and the buffer has
        // room for them.
        unsafe { self.values.set_len(real * self.row_bytes) };
        let values = recycle::freeze(self.values);
        let nulls = self
            .validity
            .map(|v| NullBuffer::from(v[..real].to_vec()))
            .filter(|n| n.null_count() > 0);
        let data = match data_type {
            DataType::FixedSizeList(item, width) => {
                let items = ArrayData::builder(item.data_type().clone())
                    .len(real * *width as usize)
                    .add_buffer(values)
                    .build()?;
                ArrayData::builder(data_type.clone())
                    .len(real)
                    .nulls(nulls)
                    .add_child_data(items)
                    .build()?
            }
            _ => ArrayData::builder(data_type.clone())
                .len(real)
                .nulls(nulls)
                .add_buffer(values)
                .build()?,
        };
        Ok(make_array(data))
    }
}

/// A row of a batch and where it goes: `(row, fill, slot)`.
pub(crate) type Pick = (u32, u32, u32);

/// Marks the slots of `picks` taken in `fills`. Fails, marking none, on a fill not in
/// `fills`, a slot past `B` or already taken, or a row past `rows`.
fn claim(fills: &mut [&mut Fill], picks: &[Pick], rows: usize) -> Result<()> {
    for (k, &(row, fill, slot)) in picks.iter().enumerate() {
        let free = fills
            .get(fill as usize)
            .and_then(|f| f.filled.get(slot as usize))
            .is_some_and(|f| !f);
        if !free || row as usize >= rows {
            unclaim(fills, &picks[..k]);
            return Err(Error::Dataflow(format!(
                "slot {slot} of a step was filled twice or is out of range"
            )));
        }
        fills[fill as usize].filled[slot as usize] = true;
    }
    Ok(())
}

/// Marks the slots of `picks`, which [`claim`] took, free again.
fn unclaim(fills: &mut [&mut Fill], picks: &[Pick]) {
    for &(_, fill, slot) in picks {
        fills[fill as usize].filled[slot as usize] = false;
    }
}

/// Copies rows `picks` of `src`, `n` bytes a row, to their slots: slot `slot` of fill
/// `fill` is at `dsts[fill] + slot · n`. [`Fill::put_many`] checked every fill, slot
/// and row, and each `dsts[fill]` has room for `B` rows (made so by [`Fill::new`]).
fn copy_rows(n: usize, src: &[u8], dsts: &[*mut u8], picks: &[Pick]) {
    // Rows of the sizes featurized columns have are copied as fixed-size arrays (a few
    // vector moves each): a `memcpy` call per row and column was most of the copy.
    macro_rules! fixed {
        ($($n:literal)*) => {
            match n {
                $($n => copy_fixed::<$n>(src, dsts, picks),)*
                n => copy_any(src, dsts, picks, n),
            }
        };
    }
    fixed!(1 2 4 8 12 16 20 24 28 32 36 40 44 48 52 56 60 64 72 80 88 96 104 112 120 128
        136 144 152 160 168 176 184 192 200 208 216 224 232 240 248 256);
}

/// [`copy_rows`] for rows of `N` bytes.
fn copy_fixed<const N: usize>(src: &[u8], dsts: &[*mut u8], picks: &[Pick]) {
    let rows = src.as_chunks::<N>().0;
    #[cfg(target_arch = "x86_64")]
    if N.is_multiple_of(16) && dsts.iter().all(|d| d.align_offset(16) == 0) {
        // SAFETY: as below; every slot's address is 16-byte aligned (each `dsts[fill]`
        // is, and `N` is a multiple of 16).
        return unsafe { stream_rows::<N>(rows, dsts, picks) };
    }
    for (k, &(row, fill, slot)) in picks.iter().enumerate() {
        prefetch_ahead(rows, picks, k);
        let from: &[u8; N] = &rows[row as usize];
        let to = slot as usize * N;
        let dst = dsts[fill as usize];
        // Sixteen bytes at a time, unrolled (N is a constant): one array move of a long
        // row compiles to a `memcpy` call.
        let (chunks, tail) = from.as_chunks::<16>();
        for (c, chunk) in chunks.iter().enumerate() {
            // SAFETY: `copy_rows`' caller checked that slot `slot` of `N` bytes is inside
            // `dst`'s allocation, which nothing else reads or writes while this runs.
            unsafe {
                dst.add(to + 16 * c)
                    .cast::<[u8; 16]>()
                    .write_unaligned(*chunk)
            };
        }
        for (t, &byte) in tail.iter().enumerate() {
            // SAFETY: as above.
            unsafe { dst.add(to + 16 * chunks.len() + t).write(byte) };
        }
    }
}

/// [`copy_fixed`] with non-temporal (streaming) stores, for rows of a multiple of 16
/// bytes: a step's buffers are written once and read only when the step goes out, after
/// its whole window (tens of MB later), so the cache lines a plain store would first read
/// in are traffic for nothing, and the rows would evict the featurized batch being read.
///
/// # Safety
/// Every slot of `picks` is inside its `dsts[fill]`'s allocation, which nothing else reads
/// or writes while this runs, and every `dsts[fill]` is 16-byte aligned.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_rows<const N: usize>(rows: &[[u8; N]], dsts: &[*mut u8], picks: &[Pick]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    for (k, &(row, fill, slot)) in picks.iter().enumerate() {
        prefetch_ahead(rows, picks, k);
        let from = rows[row as usize].as_ptr();
        let to = slot as usize * N;
        let dst = dsts[fill as usize];
        for c in 0..N / 16 {
            // SAFETY: the caller's contract: `to + 16·c` lies in the slot, 16-byte aligned;
            // the load reads 16 of the row's `N` bytes. SSE2 is part of x86_64.
            unsafe {
                let v = _mm_loadu_si128(from.add(16 * c).cast::<__m128i>());
                _mm_stream_si128(dst.add(to + 16 * c).cast::<__m128i>(), v);
            }
        }
    }
    // Streamed stores are weakly ordered: they must be visible before the step is handed
    // to another thread.
    store_fence();
}

/// Prefetches the source row of the pick [`AHEAD`] after the `k`-th. Picks ascend by row
/// now, but one rank's rows of a batch (an owner's, or the general path's) skip a random
/// part of every stratum; with rows put step by step (a random row of every 16) this
/// prefetch was worth 10–20% of the copy, and in row order it measured no worse.
#[inline]
fn prefetch_ahead<const N: usize>(rows: &[[u8; N]], picks: &[Pick], k: usize) {
    if let Some(&(ahead, _, _)) = picks.get(k + AHEAD) {
        prefetch(&rows[ahead as usize]);
    }
}

/// [`copy_fixed`] for any row size.
fn copy_any(src: &[u8], dsts: &[*mut u8], picks: &[Pick], n: usize) {
    for &(row, fill, slot) in picks {
        let from = &src[row as usize * n..(row as usize + 1) * n];
        // SAFETY: as in `copy_fixed`; `from` is another buffer's bytes (no overlap).
        unsafe {
            std::ptr::copy_nonoverlapping(
                from.as_ptr(),
                dsts[fill as usize].add(slot as usize * n),
                n,
            )
        };
    }
}

/// A fixed-width column's rows as bytes, `row_bytes` a row, and its nulls; `None` for
/// another layout (or null items in a list, which a row copy would lose).
fn source(array: &dyn Array, row_bytes: usize) -> Option<(Buffer, Option<NullBuffer>)> {
    let values = value_bytes(array, row_bytes)?;
    Some((values, array.nulls().cloned()))
}

fn layout(what: &str) -> Error {
    Error::Dataflow(what.to_string())
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::Field;

    use super::*;
    use crate::delivery::gather::tests::batch;

    /// Rows put into their slots come out as `take` would give them, nulls or not, from
    /// sliced sources too.
    #[test]
    fn fills_what_take_gives() {
        for nulls in [false, true] {
            let sources = [batch(0, 40, nulls), batch(100, 30, nulls).slice(5, 20)];
            let schema = sources[0].schema();
            assert!(Fill::supports(&schema));
            // Slots 0..24: even slots from the first source, odd from the second.
            let mut fill = Fill::new(&schema, 24);
            let firsts: Vec<(u32, u32)> = (0..12).map(|k| (2 * k, 39 - 3 * k)).collect();
            let seconds: Vec<(u32, u32)> = (0..12).map(|k| (2 * k + 1, 19 - k)).collect();
            fill.put(&sources[0], &firsts).unwrap();
            fill.put(&sources[1], &seconds).unwrap();
            assert_eq!(fill.rows(), 24);
            let got = fill.finish(&schema, 24).unwrap();
            for slot in 0..24 {
                let (src, row) = if slot % 2 == 0 {
                    (&sources[0], 39 - 3 * (slot / 2))
                } else {
                    (&sources[1], 19 - slot / 2)
                };
                let want = src.slice(row, 1);
                assert_eq!(got.slice(slot, 1), want, "slot {slot}, nulls {nulls}");
            }
        }
    }

    /// Rows of a multiple of 16 bytes (streamed stores) land as `take` gives them, in any
    /// slot order.
    #[test]
    fn streams_wide_rows_where_take_puts_them() {
        use std::sync::Arc;

        use arrow::array::{FixedSizeListArray, Int64Array};
        let item = Arc::new(Field::new("item", DataType::Int64, false));
        let column = |width: i32, n: i64| {
            let values = Int64Array::from_iter_values(0..n * width as i64);
            let list = FixedSizeListArray::try_new(item.clone(), width, Arc::new(values), None);
            Arc::new(list.unwrap()) as ArrayRef
        };
        let source = RecordBatch::try_from_iter([("two", column(2, 50)), ("wide", column(26, 50))])
            .unwrap()
            .slice(3, 40);
        let schema = source.schema();
        let mut fill = Fill::new(&schema, 40);
        // Slot k takes row (17·k mod 40): every slot once, rows out of order.
        let picks: Vec<(u32, u32)> = (0..40).map(|k| (k, (17 * k) % 40)).collect();
        fill.put(&source, &picks).unwrap();
        let got = fill.finish(&schema, 40).unwrap();
        for &(slot, row) in &picks {
            let want = source.slice(row as usize, 1);
            assert_eq!(got.slice(slot as usize, 1), want, "slot {slot}");
        }
    }

    /// One pass puts a batch's rows into three steps, as `take` would give each, nulls or
    /// not; a pass with one bad pick (a slot taken, a fill or row out of range) copies
    /// and marks nothing in any step.
    #[test]
    fn fills_several_steps_in_one_pass() {
        for nulls in [false, true] {
            let source = batch(0, 30, nulls);
            let schema = source.schema();
            let sources = Sources::of(&schema, &source).unwrap();
            let mut steps: Vec<Fill> = (0..3).map(|_| Fill::new(&schema, 10)).collect();
            // Row r goes to step (7·r mod 3), slot r / 3: every slot of every step once.
            let picks: Vec<Pick> = (0..30).map(|r| (r, (7 * r) % 3, r / 3)).collect();
            for bad in [(0, 1, 0), (0, 3, 9), (30, 0, 9)] {
                let mut fills: Vec<&mut Fill> = steps.iter_mut().collect();
                let mut with_bad = picks.clone();
                with_bad.push(bad);
                assert!(Fill::put_many(&mut fills, &sources, &with_bad).is_err());
                assert!(fills.iter().all(|f| f.rows() == 0), "{bad:?}");
            }
            let mut fills: Vec<&mut Fill> = steps.iter_mut().collect();
            Fill::put_many(&mut fills, &sources, &picks).unwrap();
            for (s, fill) in steps.into_iter().enumerate() {
                let got = fill.finish(&schema, 10).unwrap();
                for &(row, _, slot) in picks.iter().filter(|p| p.1 as usize == s) {
                    let want = source.slice(row as usize, 1);
                    assert_eq!(got.slice(slot as usize, 1), want, "step {s} slot {slot}");
                }
            }
        }
    }

    #[test]
    fn writes_featurized_rows_into_steps_and_refuses_what_put_refuses() {
        use std::sync::Arc;

        use arrow::array::{Float64Array, UInt64Array};
        use hydrant_operators::{FeatureGroup, FeaturePlan, FittedState, GroupKind, Step};
        let input = RecordBatch::try_from_iter([
            (
                "row_id",
                Arc::new(UInt64Array::from_iter_values(0..12)) as ArrayRef,
            ),
            (
                "x",
                Arc::new(Float64Array::from_iter_values((0..12).map(f64::from))),
            ),
        ])
        .unwrap();
        let groups = [FeatureGroup::new(
            "d",
            GroupKind::Dense,
            &["x"],
            vec![Step::Log1p],
        )];
        let plan = FeaturePlan::compile("p", &groups, None, &input.schema()).unwrap();
        let mut t = plan.transformer(&FittedState::empty("p")).unwrap();
        let want = t.apply(&input).unwrap();
        let schema = plan.output_schema();
        let featurized = t.featurize_rows(&input).unwrap();
        // Row r into step r % 2, slots descending.
        let picks: Vec<Pick> = (0..12).map(|r| (r, r % 2, 5 - r / 2)).collect();
        let mut steps: Vec<Fill> = (0..2).map(|_| Fill::new(&schema, 6)).collect();
        let mut twice = picks.clone();
        twice[3].2 = twice[1].2;
        let mut past = picks.clone();
        past[11].1 = 2;
        let mut swapped = picks.clone();
        swapped.swap(4, 5);
        for bad in [twice, past, swapped, picks[..11].to_vec()] {
            let mut fills: Vec<&mut Fill> = steps.iter_mut().collect();
            assert!(Fill::write_many(&mut fills, &featurized, &bad).is_err());
            assert!(fills.iter().all(|f| f.rows() == 0), "{bad:?}");
        }
        let ids = Schema::new(vec![Field::new("row_id", DataType::UInt64, false)]);
        let mut other = [Fill::new(&schema, 6), Fill::new(&ids, 6)];
        let mut fills: Vec<&mut Fill> = other.iter_mut().collect();
        assert!(Fill::write_many(&mut fills, &featurized, &picks).is_err());
        let mut fills: Vec<&mut Fill> = steps.iter_mut().collect();
        Fill::write_many(&mut fills, &featurized, &picks).unwrap();
        for (s, fill) in steps.into_iter().enumerate() {
            let got = fill.finish(&schema, 6).unwrap();
            for &(row, _, slot) in picks.iter().filter(|p| p.1 as usize == s) {
                let want = want.slice(row as usize, 1);
                assert_eq!(got.slice(slot as usize, 1), want, "step {s} slot {slot}");
            }
        }
    }

    /// A slot filled twice, one past the end and a step emitted short are errors.
    #[test]
    fn refuses_duplicates_overflow_and_gaps() {
        let source = batch(0, 10, false);
        let schema = source.schema();
        let mut fill = Fill::new(&schema, 4);
        fill.put(&source, &[(0, 0), (1, 1)]).unwrap();
        assert!(fill.put(&source, &[(2, 2), (1, 3)]).is_err());
        assert!(fill.put(&source, &[(4, 4)]).is_err());
        assert!(fill.put(&source, &[(2, 10)]).is_err());
        assert_eq!(fill.rows(), 2);
        assert!(fill.finish(&schema, 3).is_err());
    }

    /// Strings and Booleans are not filled: a plan with them keeps gathering.
    #[test]
    fn only_fixed_width_columns_are_supported() {
        let strings = Schema::new(vec![Field::new("s", DataType::Utf8, false)]);
        let flags = Schema::new(vec![Field::new("f", DataType::Boolean, false)]);
        assert!(!Fill::supports(&strings));
        assert!(!Fill::supports(&flags));
    }
}
