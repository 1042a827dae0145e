//! A Parquet file's footer, kept small for as long as the run reads the file.
//!
//! parquet-rs keeps a footer as one `ColumnChunkMetaData` of ~420 bytes per column of every
//! row group, most of it options reading never uses (statistics, bloom filters, page indexes,
//! histograms): 2.6 MB for 10M Criteo rows in 153 row groups, which made peak memory grow
//! with the file. [`ParquetFooter`] keeps, per column chunk, only where its pages lie and how
//! they are compressed (~64 bytes), and rebuilds one row group's metadata when a worker reads
//! it, which costs microseconds against the milliseconds of decoding the row group.
//!
//! The rest of a footer — the file's schema, as Parquet and as Arrow, and its key-value
//! metadata — is the same for every file of one kind. Decoded per file it held ~45 KB, so
//! a folder of 6,000 small files took 300 MB; [`Shells`] keeps one per kind of file.

use std::collections::HashMap;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::basic::{Compression, EncodingMask};
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{
    ColumnChunkMetaData, FileMetaData, ParquetMetaData, ParquetMetaDataReader,
    ParquetStatisticsPolicy, RowGroupMetaData,
};

/// What reading a row group needs of its footer entry.
struct Group {
    rows: i64,
    byte_size: i64,
    columns: Box<[Chunk]>,
}

/// What reading one column chunk needs: where its pages lie and how they are encoded.
#[derive(Clone, Copy)]
struct Chunk {
    compression: Compression,
    encodings: EncodingMask,
    values: i64,
    data_page: i64,
    dictionary_page: Option<i64>,
    compressed: i64,
    uncompressed: i64,
}

/// A Parquet file's footer without what hydrant does not read.
pub(super) struct ParquetFooter {
    /// The footer with no row groups: the file's schema and key-value metadata, read as
    /// Arrow with `options`.
    shell: ArrowReaderMetadata,
    options: ArrowReaderOptions,
    groups: Vec<Group>,
}

impl ParquetFooter {
    /// Reads `file`'s footer, sharing its shell with the files of its kind in `shells`.
    /// Column statistics (min, max, null counts and sizes) are for pruning, which hydrant
    /// does not do, so they are not even decoded.
    pub(super) fn load(file: &File, shells: &mut Shells) -> Result<Self> {
        let options = ArrowReaderOptions::new()
            .with_column_stats_policy(ParquetStatisticsPolicy::SkipAll)
            .with_size_stats_policy(ParquetStatisticsPolicy::SkipAll);
        let full = ParquetMetaDataReader::new()
            .with_metadata_options(Some(options.metadata_options().clone()))
            .parse_and_finish(file)?;
        let groups = full
            .row_groups()
            .iter()
            .enumerate()
            .map(|(g, group)| Group::of(g, group))
            .collect::<Result<_>>()?;
        Ok(Self {
            shell: shells.shell_of(full.file_metadata(), &options)?,
            options,
            groups,
        })
    }

    /// The file's columns as Arrow reads them.
    pub(super) fn schema(&self) -> &SchemaRef {
        self.shell.schema()
    }

    /// Column chunks the footer described: what decoding it whole allocated, at ~420
    /// bytes each.
    pub(super) fn chunks(&self) -> usize {
        self.groups.iter().map(|g| g.columns.len()).sum()
    }

    /// Rows of each row group, in file order.
    pub(super) fn group_rows(&self) -> impl Iterator<Item = u64> + '_ {
        self.groups.iter().map(|g| g.rows.max(0) as u64)
    }

    /// Reads the file as `schema` from now on: the file's own types, except where a hint
    /// asks for another encoding of the same values (strings as dictionaries). Files of one
    /// kind given one hint keep sharing a shell through `shells`.
    pub(super) fn hint(&mut self, schema: SchemaRef, shells: &mut Shells) -> Result<()> {
        (self.shell, self.options) = shells.hinted(&self.shell, schema, &self.options)?;
        Ok(())
    }

    /// The bytes of the file row group `g`'s column chunks lie in, first to last (`None`
    /// for a group of no columns, or none such).
    pub(super) fn group_bytes(&self, g: usize) -> Option<std::ops::Range<u64>> {
        let chunks = self.groups.get(g)?.columns.iter();
        let spans = chunks.map(|c| {
            let start = c.dictionary_page.unwrap_or(c.data_page) as u64; // checked ≥ 0
            (start, start.saturating_add(c.compressed as u64))
        });
        spans
            .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
            .map(|(a, b)| a..b)
    }

    /// The metadata of a file holding row group `g` alone, to read that row group as row
    /// group 0.
    pub(super) fn row_group(&self, g: usize) -> Result<ArrowReaderMetadata> {
        let group = self
            .groups
            .get(g)
            .ok_or_else(|| ParquetError::General(format!("no row group {g}")))?;
        let file = self.shell.metadata().file_metadata();
        let schema = file.schema_descr_ptr();
        let columns = group
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| c.rebuild(schema.column(i)))
            .collect::<Result<_>>()?;
        let group = RowGroupMetaData::builder(schema)
            .set_num_rows(group.rows)
            .set_total_byte_size(group.byte_size)
            .set_column_metadata(columns)
            .build()?;
        let metadata = ParquetMetaData::new(with_rows(file, group.num_rows()), vec![group]);
        ArrowReaderMetadata::try_new(Arc::new(metadata), self.options.clone())
    }
}

/// Footer shells (a footer without its row groups, read as Arrow) by kind of file: files
/// whose Parquet schema, key-value metadata (where Arrow's schema is kept), writer and
/// column orders are the same share one, whatever order the kinds come in. Memory then
/// grows with the kinds of file, not with the files.
#[derive(Default)]
pub(super) struct Shells {
    /// The shells as read, by [`kind_hash`] (kinds of one hash side by side).
    read: HashMap<u64, Vec<ArrowReaderMetadata>>,
    /// Hinted shells, by the address of the footer each was made from (kept alive in
    /// each [`Hinted`], so never another footer's).
    hinted: HashMap<usize, Vec<Hinted>>,
}

impl Shells {
    /// The shell of a file whose footer says `file`: a known one of its kind, or a new one.
    fn shell_of(
        &mut self,
        file: &FileMetaData,
        options: &ArrowReaderOptions,
    ) -> Result<ArrowReaderMetadata> {
        let kinds = self.read.entry(kind_hash(file)).or_default();
        if let Some(shell) = kinds
            .iter()
            .find(|s| same_kind(s.metadata().file_metadata(), file))
        {
            return Ok(shell.clone());
        }
        // The row count is each file's own: [`ParquetFooter::row_group`] gives its own.
        let kind = ParquetMetaData::new(with_rows(file, 0), Vec::new());
        let shell = ArrowReaderMetadata::try_new(Arc::new(kind), options.clone())?;
        kinds.push(shell.clone());
        Ok(shell)
    }

    /// `shell` read as `schema`, and `options` given that schema.
    fn hinted(
        &mut self,
        shell: &ArrowReaderMetadata,
        schema: SchemaRef,
        options: &ArrowReaderOptions,
    ) -> Result<(ArrowReaderMetadata, ArrowReaderOptions)> {
        let made = self
            .hinted
            .entry(Arc::as_ptr(shell.metadata()) as usize)
            .or_default();
        if let Some(h) = made.iter().find(|h| h.schema == schema) {
            return Ok((h.shell.clone(), h.options.clone()));
        }
        let options = options.clone().with_schema(schema.clone());
        let hinted = Hinted {
            _from: shell.metadata().clone(),
            schema,
            shell: ArrowReaderMetadata::try_new(shell.metadata().clone(), options.clone())?,
            options,
        };
        let out = (hinted.shell.clone(), hinted.options.clone());
        made.push(hinted);
        Ok(out)
    }
}

/// A shell given a schema to read as.
struct Hinted {
    /// Kept so that its address, the key it is found by, is not another footer's.
    _from: Arc<ParquetMetaData>,
    schema: SchemaRef,
    shell: ArrowReaderMetadata,
    options: ArrowReaderOptions,
}

/// `file` stating `rows` rows (parquet-rs reads no more than that many rows a batch).
fn with_rows(file: &FileMetaData, rows: i64) -> FileMetaData {
    FileMetaData::new(
        file.version(),
        rows,
        file.created_by().map(str::to_owned),
        file.key_value_metadata().cloned(),
        file.schema_descr_ptr(),
        file.column_orders().cloned(),
    )
}

/// A hash of what [`same_kind`] compares, but for the schema's types (the key-value
/// metadata holds Arrow's schema, where a file has one): files of one kind hash alike.
fn kind_hash(file: &FileMetaData) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (file.version(), file.created_by()).hash(&mut h);
    for kv in file.key_value_metadata().into_iter().flatten() {
        (&kv.key, &kv.value).hash(&mut h);
    }
    for column in file.schema_descr().columns() {
        (column.path().string(), column.physical_type() as i32).hash(&mut h);
    }
    h.finish()
}

/// Whether two files' footers read alike, whatever rows they hold.
fn same_kind(a: &FileMetaData, b: &FileMetaData) -> bool {
    a.version() == b.version()
        && a.created_by() == b.created_by()
        && a.key_value_metadata() == b.key_value_metadata()
        && a.column_orders() == b.column_orders()
        && a.schema_descr() == b.schema_descr()
}

impl Group {
    /// Row group `g`'s entry. Its row count must be each flat column's value count (a
    /// flat column has a value, or a null, per row): parquet-rs reads as many rows as the
    /// group states, so a footer stating fewer rows than its columns hold would lose the
    /// rest without a word.
    fn of(g: usize, group: &RowGroupMetaData) -> Result<Self> {
        let flat = group
            .columns()
            .iter()
            .filter(|c| c.column_descr().max_rep_level() == 0);
        if let Some(c) = flat
            .into_iter()
            .find(|c| c.num_values() != group.num_rows())
        {
            return Err(ParquetError::General(format!(
                "row group {g} states {} rows, but its column {} holds {} values",
                group.num_rows(),
                c.column_path(),
                c.num_values()
            )));
        }
        Ok(Self {
            rows: group.num_rows(),
            byte_size: group.total_byte_size(),
            columns: group
                .columns()
                .iter()
                .map(Chunk::of)
                .collect::<Result<_>>()?,
        })
    }
}

impl Chunk {
    fn of(c: &ColumnChunkMetaData) -> Result<Self> {
        // parquet-rs asserts these when it reads the chunk; a footer is anyone's bytes, so
        // they are refused here, with the column's name, instead.
        let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
        if start < 0 || c.compressed_size() < 0 {
            return Err(ParquetError::General(format!(
                "column {} of a row group lies at a negative offset or size",
                c.column_path()
            )));
        }
        Ok(Self {
            compression: c.compression(),
            encodings: *c.encodings_mask(),
            values: c.num_values(),
            data_page: c.data_page_offset(),
            dictionary_page: c.dictionary_page_offset(),
            compressed: c.compressed_size(),
            uncompressed: c.uncompressed_size(),
        })
    }

    fn rebuild(
        &self,
        column: parquet::schema::types::ColumnDescPtr,
    ) -> Result<ColumnChunkMetaData> {
        ColumnChunkMetaData::builder(column)
            .set_compression(self.compression)
            .set_encodings_mask(self.encodings)
            .set_num_values(self.values)
            .set_data_page_offset(self.data_page)
            .set_dictionary_page_offset(self.dictionary_page)
            .set_total_compressed_size(self.compressed)
            .set_total_uncompressed_size(self.uncompressed)
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::properties::WriterProperties;

    /// A file of `groups` row groups of 100 rows: an integer and a string column.
    fn write(groups: usize, compression: Compression) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let props = WriterProperties::builder()
            .set_compression(compression)
            .set_max_row_group_row_count(Some(100))
            .build();
        let batch = |g: usize| {
            let ids: Vec<i64> = (g as i64 * 100..(g as i64 + 1) * 100).collect();
            let names: Vec<String> = ids.iter().map(|i| format!("v{}", i % 7)).collect();
            RecordBatch::try_from_iter([
                ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
                ("name", Arc::new(StringArray::from(names)) as ArrayRef),
            ])
            .unwrap()
        };
        let mut w =
            ArrowWriter::try_new(file.reopen().unwrap(), batch(0).schema(), Some(props)).unwrap();
        for g in 0..groups {
            w.write(&batch(g)).unwrap();
        }
        w.close().unwrap();
        file
    }

    fn read(file: &File, metadata: ArrowReaderMetadata, g: usize) -> Vec<RecordBatch> {
        ParquetRecordBatchReaderBuilder::new_with_metadata(file.try_clone().unwrap(), metadata)
            .with_row_groups(vec![g])
            .build()
            .unwrap()
            .collect::<std::result::Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn a_rebuilt_row_group_reads_as_the_full_footer_does() {
        for compression in [Compression::UNCOMPRESSED, Compression::SNAPPY] {
            let path = write(5, compression);
            let file = File::open(path.path()).unwrap();
            let full = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).unwrap();
            let footer = ParquetFooter::load(&file, &mut Shells::default()).unwrap();
            assert_eq!(footer.group_rows().collect::<Vec<_>>(), vec![100; 5]);
            assert_eq!(footer.schema(), full.schema());
            for g in 0..5 {
                let alone = read(&file, footer.row_group(g).unwrap(), 0);
                assert_eq!(alone, read(&file, full.clone(), g), "row group {g}");
            }
            assert!(footer.row_group(5).is_err());
        }
    }

    /// Files of one kind share one shell, and one hinted shell, yet each reads its own
    /// rows; a file of another kind gets its own.
    #[test]
    fn files_of_one_kind_share_a_shell_and_read_their_own_rows() {
        use arrow::datatypes::{DataType, Field, Schema};
        let (five, two) = (write(5, Compression::SNAPPY), write(2, Compression::SNAPPY));
        let mut shells = Shells::default();
        let mut footers: Vec<_> = [&five, &two]
            .iter()
            .map(|p| ParquetFooter::load(&File::open(p.path()).unwrap(), &mut shells).unwrap())
            .collect();
        assert!(Arc::ptr_eq(footers[0].schema(), footers[1].schema()));
        assert_eq!(kinds(&shells), 1);
        let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let hinted = Arc::new(Schema::new(vec![
            footers[0].schema().field(0).clone(),
            Field::new("name", dictionary, false),
        ]));
        for f in &mut footers {
            // Equal schemas, not one `Arc`: each file's hint is made apart.
            f.hint(Arc::new(hinted.as_ref().clone()), &mut shells)
                .unwrap();
        }
        assert!(Arc::ptr_eq(
            footers[0].shell.metadata(),
            footers[1].shell.metadata()
        ));
        assert_eq!(shells.hinted.values().map(Vec::len).sum::<usize>(), 1);
        for (path, footer, groups) in [(&five, &footers[0], 5), (&two, &footers[1], 2)] {
            let file = File::open(path.path()).unwrap();
            for g in 0..groups {
                let batches = read(&file, footer.row_group(g).unwrap(), 0);
                let ids = batches[0].column(0).as_any().downcast_ref::<Int64Array>();
                assert_eq!(ids.unwrap().value(0), g as i64 * 100, "group {g}");
                assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 100);
            }
            assert!(footer.row_group(groups).is_err());
        }

        let other = tempfile::NamedTempFile::new().unwrap();
        let batch = RecordBatch::try_from_iter([(
            "other",
            Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef,
        )])
        .unwrap();
        let mut w = ArrowWriter::try_new(other.reopen().unwrap(), batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let third = ParquetFooter::load(&File::open(other.path()).unwrap(), &mut shells).unwrap();
        assert!(!Arc::ptr_eq(third.schema(), footers[0].schema()));
        assert_eq!(kinds(&shells), 2);
    }

    fn kinds(shells: &Shells) -> usize {
        shells.read.values().map(Vec::len).sum()
    }

    /// Ten kinds of file (each its own key-value metadata), read in turn twice: the second
    /// round shares the first's shells, whatever the order.
    #[test]
    fn kinds_interleaved_share_their_shells() {
        let files: Vec<_> = (0..10)
            .map(|k| {
                let file = tempfile::NamedTempFile::new().unwrap();
                let batch = RecordBatch::try_from_iter([(
                    "id",
                    Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef,
                )])
                .unwrap();
                let props = WriterProperties::builder()
                    .set_key_value_metadata(Some(vec![parquet::file::metadata::KeyValue::new(
                        "kind".into(),
                        k.to_string(),
                    )]))
                    .build();
                let mut w =
                    ArrowWriter::try_new(file.reopen().unwrap(), batch.schema(), Some(props))
                        .unwrap();
                w.write(&batch).unwrap();
                w.close().unwrap();
                file
            })
            .collect();
        let mut shells = Shells::default();
        let mut load = |f: &tempfile::NamedTempFile| {
            ParquetFooter::load(&File::open(f.path()).unwrap(), &mut shells).unwrap()
        };
        let first: Vec<_> = files.iter().map(&mut load).collect();
        let again: Vec<_> = files.iter().map(&mut load).collect();
        for (a, b) in first.iter().zip(&again) {
            assert!(Arc::ptr_eq(a.shell.metadata(), b.shell.metadata()));
        }
        assert!(!Arc::ptr_eq(first[0].schema(), first[1].schema()));
        assert_eq!(kinds(&shells), 10);
    }

    /// A footer stating fewer rows for a row group than its columns hold is refused: read
    /// as stated, the rows past it would be lost without a word.
    #[test]
    fn a_row_group_stating_other_rows_than_its_columns_hold_is_refused() {
        let path = write(1, Compression::UNCOMPRESSED);
        let mut bytes = std::fs::read(path.path()).unwrap();
        // RowGroup.num_rows (field 3, i64, compact protocol): 100 rows, zigzag 200.
        let at = bytes
            .windows(3)
            .rposition(|w| w == [0x16, 0xc8, 0x01])
            .unwrap();
        bytes[at + 1] = 0xc6; // 99 rows
        std::fs::write(path.path(), bytes).unwrap();
        let file = File::open(path.path()).unwrap();
        let err = ParquetFooter::load(&file, &mut Shells::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("row group 0 states 99 rows, but its column \"id\" holds 100 values"),
            "{err}"
        );
    }

    #[test]
    fn a_hint_reads_strings_as_dictionaries() {
        use arrow::datatypes::{DataType, Field, Schema};
        let path = write(2, Compression::UNCOMPRESSED);
        let file = File::open(path.path()).unwrap();
        let mut footer = ParquetFooter::load(&file, &mut Shells::default()).unwrap();
        let dictionary = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let hinted = Schema::new(vec![
            footer.schema().field(0).clone(),
            Field::new("name", dictionary.clone(), false),
        ]);
        footer
            .hint(Arc::new(hinted), &mut Shells::default())
            .unwrap();
        let batches = read(&file, footer.row_group(1).unwrap(), 0);
        assert_eq!(batches[0].column(1).data_type(), &dictionary);
        let ids = batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(ids.value(0), 100);
    }

    #[test]
    fn a_chunk_at_a_negative_offset_is_refused_with_its_column() {
        let path = write(1, Compression::UNCOMPRESSED);
        let full = ArrowReaderMetadata::load(&File::open(path.path()).unwrap(), Default::default())
            .unwrap();
        let column = full.metadata().file_metadata().schema_descr().column(1);
        let chunk = ColumnChunkMetaData::builder(column)
            .set_data_page_offset(-4)
            .build()
            .unwrap();
        let err = Chunk::of(&chunk).err().unwrap().to_string();
        assert!(err.contains("column \"name\""), "{err}");
    }
}
