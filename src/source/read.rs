//! Reading one unit: how a Parquet row group is read ([`GroupRead`]), and a unit's batches
//! numbered with `row_id` and checked against what its file said when it was opened
//! ([`Numbered`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use arrow::array::{RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use hydrant_operators::{Batch, ROW_ID};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::file::reader::ChunkReader;

use super::ipc;
use crate::error::{Error, Result, one_line};

/// How a Parquet row group is read: in batches of `batch_rows`, `part` of its
/// `unit_rows` rows (all when `None`), `projection`'s root columns (all when `None`).
pub(super) struct GroupRead<'a> {
    pub(super) batch_rows: usize,
    pub(super) unit_rows: u64,
    pub(super) part: Option<std::ops::Range<u64>>,
    pub(super) projection: Option<&'a [usize]>,
}

impl GroupRead<'_> {
    /// A reader of the row group `group` describes (as a file's only one), from `source`.
    pub(super) fn parquet<T: ChunkReader + 'static>(
        &self,
        source: T,
        group: ArrowReaderMetadata,
    ) -> parquet::errors::Result<ParquetRecordBatchReader> {
        let mut b = ParquetRecordBatchReaderBuilder::new_with_metadata(source, group)
            .with_batch_size(self.batch_rows)
            .with_row_groups(vec![0]);
        if let Some(part) = &self.part {
            let rows = part.end.min(self.unit_rows).saturating_sub(part.start);
            b = b
                .with_batch_size(self.batch_rows.min(rows.max(1) as usize))
                .with_row_selection(RowSelection::from(vec![
                    RowSelector::skip(part.start as usize),
                    RowSelector::select(rows as usize),
                ]));
        }
        if let Some(p) = self.projection {
            let mask = ProjectionMask::roots(b.parquet_schema(), p.iter().copied());
            b = b.with_projection(mask);
        }
        b.build()
    }
}

/// A unit's batches, numbered with `row_id` and sequence numbers, checked against the row
/// count the file's footer gave when it was opened: a file that changed since then ends
/// with an error, never with rows missing or extra.
pub(super) struct Numbered {
    pub(super) batches:
        Box<dyn Iterator<Item = std::result::Result<RecordBatch, arrow::error::ArrowError>> + Send>,
    pub(super) first: u64,
    pub(super) row: u64,
    pub(super) seq: u64,
    pub(super) end: u64,
    pub(super) path: PathBuf,
    /// The file's length and modification time when it was opened, and the file, whose
    /// metadata is checked after each batch is decoded: a write updates the modification
    /// time before it changes any byte, so a batch that could hold rewritten bytes is
    /// never handed on.
    pub(super) len: u64,
    pub(super) modified: Option<SystemTime>,
    pub(super) watch: Option<std::fs::File>,
    pub(super) done: bool,
}

impl Numbered {
    /// Whether the file changed since it was opened (as far as its metadata tells).
    /// Why the file is not as it was opened, if it is not: another length (truncated, as a
    /// rewrite begins, or grown), or a newer modification time.
    fn changed(&self) -> Option<String> {
        let meta = self.watch.as_ref().and_then(|f| f.metadata().ok())?;
        if meta.len() != self.len {
            return Some(format!(
                "is {} bytes, {} when it was opened: it was truncated or rewritten while it \
                 was read, and its rows could mix two versions",
                meta.len(),
                self.len
            ));
        }
        modified_otherwise(&meta, self.modified)
            .then(|| "changed while it was read: its rows could mix two versions".into())
    }

    /// Ends the unit with `reason`, and why the file may have failed so: its length or
    /// modification time is not what it was when it was opened.
    fn fail(&mut self, reason: String) -> Option<Result<Batch>> {
        let len = std::fs::metadata(&self.path).map(|m| m.len());
        let since = match len {
            // A decoder failing on a file cut short says so in its own words.
            Ok(len) if len != self.len => format!(
                " (it is {len} bytes, {} when it was opened: it was truncated or rewritten \
                 since)",
                self.len
            ),
            _ => modified_since(&self.path, self.modified).to_string(),
        };
        self.fail_as_is(format!("{reason}{since}"))
    }

    fn fail_as_is(&mut self, reason: String) -> Option<Result<Batch>> {
        self.done = true;
        Some(Err(Error::Input {
            reason,
            path: self.path.clone(),
        }))
    }
}

/// Whether `meta` says its file was modified after `opened` (when that is known).
pub(super) fn modified_otherwise(meta: &std::fs::Metadata, opened: Option<SystemTime>) -> bool {
    opened.is_some() && meta.modified().ok() != opened
}

/// What to say beside an error reading `path`: that it was modified after it was opened
/// (at `opened`), when it was — a file rewritten in place at its old length fails as
/// whatever its new bytes are, which alone would not say why.
pub(super) fn modified_since(path: &Path, opened: Option<SystemTime>) -> &'static str {
    let now = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    if opened.is_some() && now != opened {
        " (it was modified after it was opened)"
    } else {
        ""
    }
}

impl Iterator for Numbered {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.done {
            return None;
        }
        let b = loop {
            // A corrupt file can make arrow's or parquet's decoder panic: that is this
            // read's error, naming the file, not a panic of the worker that read it.
            let next = hydrant_flight::decode_quietly(|| self.batches.next());
            let next = match next {
                Ok(next) => next,
                Err(panic) => return self.fail(format!("its data cannot be decoded: {panic}")),
            };
            match next {
                Some(Ok(b)) if b.num_rows() == 0 => continue,
                Some(Ok(b)) => break b,
                Some(Err(e)) => return self.fail(ipc::reason(e)),
                None if self.row < self.end => {
                    return self.fail(format!(
                        "holds fewer rows than its footer said when it was opened ({} of {}): \
                         it changed while read",
                        self.row - self.first,
                        self.end - self.first
                    ));
                }
                None => {
                    self.done = true;
                    return None;
                }
            }
        };
        if let Some(why) = self.changed() {
            return self.fail_as_is(why);
        }
        let n = b.num_rows() as u64;
        if self.row + n > self.end {
            return self.fail("holds more rows than its footer says".into());
        }
        let data = match with_row_id(b, self.row) {
            Ok(data) => data,
            Err(e) => return self.fail(one_line(e)),
        };
        let out = Batch {
            seq: self.seq,
            data,
        };
        self.row += n;
        self.seq += 1;
        Some(Ok(out))
    }
}

pub(crate) fn with_row_id(
    batch: RecordBatch,
    first: u64,
) -> std::result::Result<RecordBatch, arrow::error::ArrowError> {
    let ids = UInt64Array::from_iter_values(first..first + batch.num_rows() as u64);
    let mut fields: Vec<_> = batch.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(ROW_ID, DataType::UInt64, false)));
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(ids));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}
