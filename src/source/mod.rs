//! Inputs: Parquet files (or folders of them) and Arrow IPC files, cut into units of work
//! (a Parquet row group, an IPC file) that workers read independently. Every batch read
//! gets `row_id`: the row's ordinal in the input, counting files in the order given.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use hydrant_operators::{Batch, FeaturePlan, ROW_ID, open_regular};

use crate::error::{Error, Result, one_line};

mod cache;
mod chunk;
mod files;
mod footer;
mod ipc;
mod read;
use cache::UnitCache;
pub use files::is_data_file;
use files::{expand, sample_hash};
use footer::{ParquetFooter, Shells};
use ipc::{IpcFooter, open_ipc, read_ipc_file};
pub(crate) use read::with_row_id;
use read::{GroupRead, Numbered, modified_otherwise, modified_since};

pub use crate::recycle::release_idle as release_idle_read_buffers;

enum Format {
    /// Footer metadata, read once, given type hints by `prepare`.
    Parquet { footer: ParquetFooter },
    /// An Arrow IPC file, or a stream (no footer): its record batches that hold rows, as
    /// (index among the file's record batches, rows), counted when it was opened.
    Ipc {
        batches: Vec<(usize, u64)>,
        /// A file's footer, parsed once; `None` for a stream.
        footer: Option<Arc<IpcFooter>>,
    },
}

struct InputFile {
    path: PathBuf,
    /// Its size when opened: a later read of another size means it changed.
    len: u64,
    /// When it was last modified, as of its opening (said beside an error reading it).
    modified: Option<SystemTime>,
    format: Format,
    schema: SchemaRef,
}

/// A piece of input one worker reads: a Parquet row group, a record batch of an Arrow IPC
/// file (its footer says where each lies, so one is read without the others), or a whole
/// Arrow IPC stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    file: usize,
    /// Its row group (Parquet) or record batch (IPC file); `None` for a stream.
    row_group: Option<usize>,
    /// `row_id` of its first row.
    pub first_row: u64,
    /// Rows it holds.
    pub rows: u64,
    /// Sequence number of its first batch among all the input's batches.
    pub first_seq: u64,
}

/// A unit's batches, as read.
pub type UnitBatches = Box<dyn Iterator<Item = Result<Batch>> + Send>;

/// The inputs of a run, opened and checked.
pub struct Inputs {
    files: Vec<InputFile>,
    units: Vec<Unit>,
    batch_rows: usize,
    /// Root column indices to read, per file (all when `None`).
    projection: Vec<Option<Vec<usize>>>,
    /// Units kept after their first read (`--cache-mib`).
    cache: Option<Arc<UnitCache>>,
    /// [`Inputs::file_samples`], read once.
    samples: std::sync::OnceLock<Vec<u64>>,
}

impl Inputs {
    /// Opens `paths` (files, or folders whose `.parquet`/`.arrow`/`.ipc` files are taken in
    /// name order), reading only their footers.
    pub fn open(paths: &[PathBuf], batch_rows: usize) -> Result<Self> {
        if paths.is_empty() {
            return Err(Error::Usage("no --input given".into()));
        }
        let (mut files, mut shells, mut schemas) =
            (Vec::new(), Shells::default(), Schemas::default());
        for p in paths {
            for path in expand(p)? {
                files.push(open_file(&path, &mut shells, &mut schemas)?);
            }
        }
        let mut units = Vec::new();
        let (mut row, mut seq) = (0u64, 0u64);
        for (i, f) in files.iter().enumerate() {
            match &f.format {
                Format::Parquet { footer } => {
                    for (g, rows) in footer.group_rows().enumerate() {
                        units.push(Unit {
                            file: i,
                            row_group: Some(g),
                            first_row: row,
                            rows,
                            first_seq: seq,
                        });
                        row = count(row, rows, f)?;
                        seq += rows.div_ceil(batch_rows as u64);
                    }
                }
                Format::Ipc {
                    batches,
                    footer: Some(_),
                } => {
                    for &(b, rows) in batches {
                        units.push(Unit {
                            file: i,
                            row_group: Some(b),
                            first_row: row,
                            rows,
                            first_seq: seq,
                        });
                        row = count(row, rows, f)?;
                        seq += 1;
                    }
                }
                Format::Ipc {
                    batches,
                    footer: None,
                } => {
                    // A stream's batches were counted as read: their sum is bounded by its size.
                    let rows = batches.iter().map(|&(_, rows)| rows).sum();
                    units.push(Unit {
                        file: i,
                        row_group: None,
                        first_row: row,
                        rows,
                        first_seq: seq,
                    });
                    row = count(row, rows, f)?;
                    seq += batches.len() as u64;
                }
            }
        }
        let projection = vec![None; files.len()];
        // Decoding large footers whole took memory this thread will not use again (a
        // followed folder's small files are not worth a walk of every heap each).
        let chunks: usize = files
            .iter()
            .map(|f| match &f.format {
                Format::Parquet { footer } => footer.chunks(),
                Format::Ipc { .. } => 0,
            })
            .sum();
        if chunks >= TRIM_AFTER_CHUNKS {
            crate::recycle::release_freed_memory();
        }
        Ok(Inputs {
            files,
            units,
            batch_rows,
            projection,
            cache: None,
            samples: std::sync::OnceLock::new(),
        })
    }

    /// Keeps units in memory after their first whole read, up to `budget` bytes in all
    /// (0: none), so that they are not read and decoded again. See `cache.rs`.
    pub fn cache_units(&mut self, budget: u64) {
        self.cache = (budget > 0).then(|| Arc::new(UnitCache::new(budget)));
    }

    /// Bytes of units held in memory.
    pub fn cached_bytes(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.used())
    }

    /// Every input file's path, in input order.
    pub fn paths(&self) -> impl Iterator<Item = &std::path::Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// Every input file's size in bytes (as opened), in input order: with the units' row
    /// counts, what tells a copy of the same files from other data of the same shape.
    pub fn file_bytes(&self) -> impl Iterator<Item = u64> + '_ {
        self.files.iter().map(|f| f.len)
    }

    /// A hash of blocks spread over each input file (16 of 4 KiB, or the file whole when
    /// smaller), in input order: with the files' sizes, what tells the same files from others of
    /// the same sizes, or the same files in another order. A file that cannot be read
    /// now hashes as 0 (its read fails later, naming it). Read once, when first asked.
    pub fn file_samples(&self) -> &[u64] {
        self.samples.get_or_init(|| {
            let sample = |f: &InputFile| {
                let file = open_regular(&f.path).ok()?;
                sample_hash(&file, f.len).ok()
            };
            self.files.iter().map(|f| sample(f).unwrap_or(0)).collect()
        })
    }

    /// The schema of the first input file, which the pipeline is checked against.
    pub fn schema(&self) -> SchemaRef {
        self.files[0].schema.clone()
    }

    /// Rows in all inputs.
    pub fn total_rows(&self) -> u64 {
        self.units.iter().map(|u| u.rows).sum()
    }

    /// Rows per batch read.
    pub fn batch_rows(&self) -> usize {
        self.batch_rows
    }

    /// Units of work, in input order.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// Checks every file against the plan, and arranges to read only the columns it needs
    /// (and `extra` ones, where a file has them), with string columns dictionary-encoded
    /// (so each distinct value is mapped once).
    pub fn prepare(
        &mut self,
        plan: &FeaturePlan,
        check: impl Fn(&Schema) -> Result<FeaturePlan>,
        extra: &[String],
    ) -> Result<()> {
        let mut wanted = plan.input_columns();
        for c in extra {
            if !wanted.contains(c) {
                wanted.push(c.clone());
            }
        }
        let strings = plan.string_columns();
        let mut shells = Shells::default();
        // The last schema checked, and as hinted: files of one kind share their schema, so
        // thousands of small files are checked, and hinted, once.
        let mut last: Option<(SchemaRef, SchemaRef)> = None;
        for (i, f) in self.files.iter_mut().enumerate() {
            let hinted = match &last {
                Some((schema, hinted)) if Arc::ptr_eq(schema, &f.schema) => hinted.clone(),
                _ => {
                    check(&f.schema).map_err(|e| match e {
                        Error::Spec { reason, .. } => Error::Input {
                            path: f.path.clone(),
                            reason,
                        },
                        other => other,
                    })?;
                    let hinted = hint_strings(&f.schema, &strings);
                    last = Some((f.schema.clone(), hinted.clone()));
                    hinted
                }
            };
            let indices: Vec<usize> = wanted
                .iter()
                .filter_map(|c| f.schema.index_of(c).ok())
                .collect();
            if let Format::Parquet { footer } = &mut f.format {
                footer.hint(hinted, &mut shells).map_err(|e| Error::Input {
                    path: f.path.clone(),
                    reason: one_line(e),
                })?;
            }
            self.projection[i] = Some(indices);
        }
        Ok(())
    }

    /// Reads one unit as batches carrying `row_id`.
    pub fn read(&self, unit: &Unit) -> Result<UnitBatches> {
        let Some(cache) = &self.cache else {
            return self.read_columns(unit, None);
        };
        let key = (unit.file, unit.row_group.unwrap_or(0));
        if let Some(batches) = cache.get(key) {
            return Ok(Box::new(
                (0..batches.len()).map(move |i| Ok(batches[i].clone())),
            ));
        }
        Ok(cache.fill(key, self.read_columns(unit, None)?))
    }

    /// Reads rows `rows` (of the unit's own numbering, from 0) of one unit: its batches,
    /// and how many of the unit's first rows they start after — `rows.start` where the
    /// reader skipped them itself (a Parquet row group read without the cache, in batches
    /// of at most the rows wanted), 0 where the caller is to (a cached unit, an Arrow
    /// file). A unit shared by many ranks' reads (more ranks than row groups) was decoded
    /// whole by each, in full-sized batches: with 1,000 ranks a 20,000-row group was
    /// decoded 500 times a worker, with as many readers' buffers alive at once.
    pub fn read_rows(&self, unit: &Unit, rows: std::ops::Range<u64>) -> Result<(UnitBatches, u64)> {
        let whole = rows.start == 0 && rows.end >= unit.rows;
        if self.cache.is_some() || whole {
            return Ok((self.read(unit)?, 0));
        }
        match &self.files[unit.file].format {
            Format::Parquet { .. } => {
                let skipped = rows.start;
                Ok((self.read_columns_in(unit, None, Some(rows))?, skipped))
            }
            Format::Ipc { .. } => Ok((self.read(unit)?, 0)),
        }
    }

    /// Reads one unit as batches carrying `row_id` and, where `only` names some, just those
    /// of the prepared columns (fitting the mean of a few columns decodes only those).
    pub fn read_columns(&self, unit: &Unit, only: Option<&[String]>) -> Result<UnitBatches> {
        self.read_columns_in(unit, only, None)
    }

    /// [`Inputs::read_columns`], of a Parquet unit's rows `part` only where given.
    fn read_columns_in(
        &self,
        unit: &Unit,
        only: Option<&[String]>,
        part: Option<std::ops::Range<u64>>,
    ) -> Result<UnitBatches> {
        let f = &self.files[unit.file];
        let projection = match (&self.projection[unit.file], only) {
            (Some(p), Some(only)) => Some(
                p.iter()
                    .copied()
                    .filter(|&i| only.contains(f.schema.field(i).name()))
                    .collect(),
            ),
            (p, _) => p.clone(),
        };
        let (path, modified) = (f.path.clone(), f.modified);
        let input_err = move |e: &dyn std::fmt::Display| Error::Input {
            path: path.clone(),
            reason: format!("{}{}", one_line(e), modified_since(&path, modified)),
        };
        let file = open_regular(&f.path).map_err(|e| input_err(&e))?;
        let meta = file.metadata().map_err(|e| input_err(&e))?;
        if meta.len() != f.len {
            return Err(Error::Input {
                path: f.path.clone(),
                reason: format!(
                    "is {} bytes, {} when it was opened: it was truncated or rewritten since",
                    meta.len(),
                    f.len
                ),
            });
        }
        if modified_otherwise(&meta, f.modified) {
            return Err(Error::Input {
                path: f.path.clone(),
                reason: "was modified after it was opened: it was rewritten since".into(),
            });
        }
        // Watched while read: a rewrite in place at the same length would otherwise mix
        // its new rows with the old ones read before it.
        let watch = file.try_clone().ok();
        let batches: Box<
            dyn Iterator<Item = std::result::Result<RecordBatch, arrow::error::ArrowError>> + Send,
        > = match &f.format {
            Format::Parquet { footer } => {
                let g = unit.row_group.unwrap_or(0);
                let group = footer.row_group(g).map_err(|e| input_err(&e))?;
                let read = GroupRead {
                    batch_rows: self.batch_rows,
                    unit_rows: unit.rows,
                    part: part.clone(),
                    projection: projection.as_deref(),
                };
                let small = footer
                    .group_bytes(g)
                    .filter(|r| r.end - r.start <= chunk::IN_MEMORY_BYTES && r.end <= f.len);
                let reader = match small {
                    Some(range) => chunk::InMemory::read(&file, range, f.len)
                        .and_then(|bytes| read.parquet(bytes, group)),
                    None => read.parquet(file, group),
                };
                Box::new(reader.map_err(|e| input_err(&e))?)
            }
            Format::Ipc {
                footer: Some(footer),
                ..
            } => Box::new(
                read_ipc_file(file, footer, projection, unit.row_group)
                    .map_err(|e| input_err(&e))?,
            ),
            Format::Ipc { footer: None, .. } => Box::new(
                StreamReader::try_new(std::io::BufReader::new(file), projection)
                    .map_err(|e| input_err(&e))?,
            ),
        };
        let (first, end) = match &part {
            Some(part) => (
                unit.first_row + part.start,
                unit.first_row + part.end.min(unit.rows),
            ),
            None => (unit.first_row, unit.first_row + unit.rows),
        };
        Ok(Box::new(Numbered {
            batches,
            first,
            row: first,
            seq: unit.first_seq,
            end,
            path: f.path.clone(),
            len: f.len,
            modified: f.modified,
            watch,
            done: false,
        }))
    }
}

/// `schema` with the string columns in `strings` read as dictionaries (each distinct value
/// is then mapped once).
fn hint_strings(schema: &Schema, strings: &[String]) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|field| match field.data_type() {
            t @ (DataType::Utf8 | DataType::LargeUtf8) if strings.contains(field.name()) => {
                field.as_ref().clone().with_data_type(DataType::Dictionary(
                    Box::new(DataType::Int32),
                    Box::new(t.clone()),
                ))
            }
            _ => field.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// Arrow schemas met so far, one `Arc` each: Arrow IPC files of one schema share it (and
/// are checked once, see [`Inputs::prepare`]), as Parquet files of one kind share a
/// footer shell.
#[derive(Default)]
struct Schemas(std::collections::HashSet<SchemaRef>);

impl Schemas {
    /// `schema`, as the first file of it gave it.
    fn intern(&mut self, schema: SchemaRef) -> SchemaRef {
        if let Some(known) = self.0.get(&schema) {
            return known.clone();
        }
        self.0.insert(schema.clone());
        schema
    }
}

fn open_file(path: &Path, shells: &mut Shells, schemas: &mut Schemas) -> Result<InputFile> {
    let err = |reason: String| Error::Input {
        path: path.into(),
        reason,
    };
    let mut file = open_regular(path).map_err(|e| err(one_line(e)))?;
    let meta = file.metadata().map_err(|e| err(one_line(e)))?;
    let mut magic = [0u8; 6];
    let n = file.read(&mut magic).map_err(|e| err(one_line(e)))?;
    if n >= 4 && &magic[..4] == b"PAR1" {
        let footer = hydrant_flight::decode_quietly(|| ParquetFooter::load(&file, shells))
            .map_err(|panic| err(format!("not a readable Parquet file: {panic}")))?
            .map_err(|e| err(format!("not a readable Parquet file: {}", one_line(e))))?;
        let schema = footer.schema().clone();
        check_columns(path, &schema)?;
        return Ok(InputFile {
            path: path.into(),
            len: meta.len(),
            modified: meta.modified().ok(),
            schema,
            format: Format::Parquet { footer },
        });
    }
    if n == 6 && &magic == b"ARROW1" {
        return open_ipc(path, false, meta.len(), schemas);
    }
    if n >= 4 && magic[..4] == [0xff; 4] {
        return open_ipc(path, true, meta.len(), schemas);
    }
    Err(err("not a Parquet or Arrow IPC file".into()))
}

/// Parquet column chunks whose footers, decoded whole (~420 bytes each), are worth handing
/// back once the inputs are open: about 1 MB.
const TRIM_AFTER_CHUNKS: usize = 2500;

/// The most rows all inputs may hold together: row ids and positions stay far from `u64`'s
/// end in every sum and product placement makes of them. Footers state row counts, and a
/// footer is anyone's bytes.
const MAX_ROWS: u64 = 1 << 48;

/// Rows counted so far, `row`, plus a unit's `rows` of file `f`; an error past [`MAX_ROWS`].
fn count(row: u64, rows: u64, f: &InputFile) -> Result<u64> {
    row.checked_add(rows)
        .filter(|&n| n <= MAX_ROWS)
        .ok_or_else(|| Error::Input {
            path: f.path.clone(),
            reason: format!(
                "its footer states {rows} rows in one unit, which would take the inputs past \
                 the {MAX_ROWS} rows hydrant numbers"
            ),
        })
}

/// What is wrong with the columns of an input (a file's, or a pushed batch's), if
/// anything: it may not carry the column hydrant adds, nor two columns of one name (which
/// one a pipeline read would be anyone's guess).
pub(crate) fn column_problem(schema: &Schema) -> Option<String> {
    if schema.index_of(ROW_ID).is_ok() {
        return Some(format!(
            "has a column named `{ROW_ID}`, which hydrant adds itself"
        ));
    }
    let mut names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    names.sort_unstable();
    let twice = names.windows(2).find(|w| w[0] == w[1])?;
    Some(format!("has two columns named `{}`", one_line(twice[0])))
}

/// An input's columns, checked (see [`column_problem`]).
fn check_columns(path: &Path, schema: &Schema) -> Result<()> {
    match column_problem(schema) {
        Some(reason) => Err(Error::Input {
            path: path.into(),
            reason,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{Int64Type, UInt64Type};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;

    /// Files of one schema, Arrow IPC (files and streams) or Parquet, hold one `Arc` of
    /// it between them; files of another hold their own.
    #[test]
    fn files_of_one_schema_share_it() {
        use arrow::ipc::writer::{FileWriter, StreamWriter};
        let dir = tempfile::tempdir().unwrap();
        let batch = |name: &str| {
            let x = Int64Array::from_iter_values(0..10);
            RecordBatch::try_from_iter([(name, Arc::new(x) as _)]).unwrap()
        };
        let mut paths = Vec::new();
        for (i, name) in ["x", "x", "y", "x", "x"].into_iter().enumerate() {
            let b = batch(name);
            let path = dir.path().join(format!("{i}.arrow"));
            let file = std::fs::File::create(&path).unwrap();
            if i == 4 {
                let mut w = StreamWriter::try_new(file, &b.schema()).unwrap();
                w.write(&b).unwrap();
                w.finish().unwrap();
            } else {
                let mut w = FileWriter::try_new(file, &b.schema()).unwrap();
                w.write(&b).unwrap();
                w.finish().unwrap();
            }
            paths.push(path);
        }
        for i in 5..7 {
            let path = dir.path().join(format!("{i}.parquet"));
            let mut w = ArrowWriter::try_new(
                std::fs::File::create(&path).unwrap(),
                batch("x").schema(),
                None,
            )
            .unwrap();
            w.write(&batch("x")).unwrap();
            w.close().unwrap();
            paths.push(path);
        }
        let inputs = Inputs::open(&paths, 128).unwrap();
        let schema = |i: usize| &inputs.files[i].schema;
        for i in [1, 3, 4] {
            assert!(Arc::ptr_eq(schema(0), schema(i)), "file {i}");
        }
        assert!(!Arc::ptr_eq(schema(0), schema(2)));
        assert!(Arc::ptr_eq(schema(5), schema(6)));
        assert_eq!(inputs.total_rows(), 70);
    }

    /// A part of a row group read by the Parquet reader itself holds the same rows, with
    /// the same `row_id`s, as the whole group read and cut, in batches no larger than the
    /// part; the cache, or the whole group, is read whole.
    #[test]
    fn a_part_of_a_unit_is_the_same_rows_as_the_whole_unit_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.parquet");
        let x = Int64Array::from_iter_values((0..1000).map(|i| i * 7 % 1000));
        let batch = RecordBatch::try_from_iter([("x", Arc::new(x) as _)]).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(400))
            .set_data_page_row_count_limit(64)
            .set_write_batch_size(64)
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let inputs = Inputs::open(&[path], 128).unwrap();
        let unit = &inputs.units()[1];
        assert_eq!((unit.first_row, unit.rows), (400, 400));
        let rows = |batches: UnitBatches| {
            let mut got = Vec::new();
            for b in batches {
                let b = b.unwrap().data;
                assert!(b.num_rows() <= 128);
                let x = b.column_by_name("x").unwrap().as_primitive::<Int64Type>();
                let ids = b
                    .column_by_name(ROW_ID)
                    .unwrap()
                    .as_primitive::<UInt64Type>();
                got.extend(ids.values().iter().copied().zip(x.values().iter().copied()));
            }
            got
        };
        let whole = rows(inputs.read(unit).unwrap());
        for part in [0..400, 0..5, 5..17, 100..101, 63..300, 390..400, 350..1000] {
            let (batches, skipped) = inputs.read_rows(unit, part.clone()).unwrap();
            let mut got = rows(batches);
            if part == (0..400) {
                assert_eq!(skipped, 0);
            } else {
                assert_eq!(skipped, part.start, "{part:?}");
                assert!(got.len() as u64 <= part.end - part.start);
            }
            got.drain(..(part.start - skipped) as usize);
            got.truncate((part.end.min(400) - part.start) as usize);
            assert_eq!(
                got,
                whole[part.start as usize..part.end.min(400) as usize],
                "{part:?}"
            );
        }
    }
}
