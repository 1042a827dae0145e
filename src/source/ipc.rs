//! Arrow IPC inputs: files, read a record batch (a unit) at a time through their footer,
//! and streams, which have no footer and are one unit.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamReader;
use hydrant_operators::open_regular;

use super::{Format, InputFile, MAX_ROWS, Schemas, check_columns};
use crate::error::{Error, Result, one_line};
use crate::recycle;

/// An Arrow IPC file (`stream`: false) or stream, opened: its schema, and the row count of
/// each record batch that holds rows (rows are numbered up front).
///
/// A file's footer is read once, and each batch's row count comes from its message header
/// alone: opening reads a few bytes per batch, not the data. A stream has no footer to
/// find its batches by, so it is read through once, one column, to count them. Files of
/// one schema share it through `schemas`.
pub(super) fn open_ipc(
    path: &Path,
    stream: bool,
    len: u64,
    schemas: &mut Schemas,
) -> Result<InputFile> {
    let what = if stream { "stream" } else { "file" };
    let bad = |e: ArrowError| Error::Input {
        path: path.into(),
        reason: format!("not a readable Arrow IPC {what}: {}", reason(e)),
    };
    let file = open_regular(path).map_err(|e| Error::Input {
        path: path.into(),
        reason: one_line(e),
    })?;
    let modified = file.metadata().and_then(|m| m.modified()).ok();
    let (schema, batches, footer) = if stream {
        // Counting decodes the stream, which may be corrupt: a panic in arrow is its error.
        let counted = hydrant_flight::decode_quietly(|| count_stream(path, file))
            .map_err(|panic| ArrowError::IpcError(format!("its data cannot be decoded: {panic}")));
        let (schema, batches) = counted.and_then(|c| c).map_err(bad)?;
        (schemas.intern(schema), batches, None)
    } else {
        let mut footer = ipc_footer(&file).map_err(bad)?;
        footer.schema = schemas.intern(footer.schema);
        let batches = batch_rows(&file, &footer).map_err(bad)?;
        (footer.schema.clone(), batches, Some(Arc::new(footer)))
    };
    check_columns(path, &schema)?;
    let batches = batches
        .into_iter()
        .enumerate()
        .filter(|&(_, rows)| rows > 0)
        .collect();
    Ok(InputFile {
        path: path.into(),
        len,
        modified,
        schema,
        format: Format::Ipc { batches, footer },
    })
}

/// What `e` says, without arrow's "Ipc error: " before this module's own messages.
pub(super) fn reason(e: ArrowError) -> String {
    match e {
        ArrowError::IpcError(m) => one_line(m),
        e => one_line(e),
    }
}

/// A stream's schema and the rows of each of its batches, counted by reading its first
/// column (`file` is open at its start; `path` opens it again for the count).
fn count_stream(path: &Path, file: File) -> std::result::Result<(SchemaRef, Vec<u64>), ArrowError> {
    let schema = StreamReader::try_new(std::io::BufReader::new(file), None)?.schema();
    let again = open_regular(path).map_err(|e| ArrowError::IpcError(one_line(e)))?;
    let projection = (!schema.fields().is_empty()).then(|| vec![0]);
    let counter = StreamReader::try_new(std::io::BufReader::new(again), projection)?;
    let rows = counter
        .map(|b| b.map(|b| b.num_rows() as u64))
        .collect::<std::result::Result<_, _>>()?;
    Ok((schema, rows))
}

/// The row count of each record batch of the file whose footer is `footer`, read from each
/// batch's message header (its flatbuffer metadata), not its body.
fn batch_rows(file: &File, footer: &IpcFooter) -> std::result::Result<Vec<u64>, ArrowError> {
    let bad = |i: usize, what: &str| {
        ArrowError::IpcError(format!("record batch {i} of the footer: {what}"))
    };
    footer
        .batches
        .iter()
        .enumerate()
        .map(|(i, block)| {
            let offset = u64::try_from(block.offset()).map_err(|_| bad(i, "bad offset"))?;
            let meta = usize::try_from(block.metaDataLength())
                .ok()
                .filter(|&m| m >= 8)
                .ok_or_else(|| bad(i, "bad metadata length"))?;
            if offset
                .checked_add(meta as u64)
                .is_none_or(|e| e > footer.end)
            {
                return Err(bad(i, "past the end of the file"));
            }
            let data = read_at(file, offset, meta)?;
            let message = arrow::ipc::root_as_message(flatbuffer(&data)?)
                .map_err(|e| bad(i, &format!("unreadable message header: {e}")))?;
            let batch = message
                .header_as_record_batch()
                .ok_or_else(|| bad(i, "not a record batch"))?;
            u64::try_from(batch.length()).map_err(|_| bad(i, "negative row count"))
        })
        .collect()
}

/// The flatbuffer of a message's metadata `meta`: after an optional continuation marker
/// and the length (the layout arrow's own reader parses).
fn flatbuffer(meta: &[u8]) -> std::result::Result<&[u8], ArrowError> {
    match meta {
        [0xff, 0xff, 0xff, 0xff, _, _, _, _, rest @ ..] => Ok(rest),
        [_, _, _, _, rest @ ..] => Ok(rest),
        _ => Err(ArrowError::IpcError(
            "a message shorter than its prefix".into(),
        )),
    }
}

/// What an Arrow IPC file's footer says, parsed when the file is opened: a unit (one record
/// batch) is then read without reading the footer again, which for a file of many small
/// batches would cost as much as the batch.
pub(super) struct IpcFooter {
    schema: SchemaRef,
    version: arrow::ipc::MetadataVersion,
    dictionaries: Vec<arrow::ipc::Block>,
    batches: Vec<arrow::ipc::Block>,
    /// Where the footer starts: every block ends before it.
    end: u64,
}

/// `file`'s footer, read and checked.
fn ipc_footer(file: &File) -> std::result::Result<IpcFooter, ArrowError> {
    use arrow::ipc::reader::read_footer_length;
    use arrow::ipc::{convert::try_fb_to_schema, root_as_footer};

    let bad = |what: &str| ArrowError::IpcError(what.into());
    let len = file
        .metadata()
        .map_err(|e| ArrowError::IpcError(e.to_string()))?
        .len();
    if len < 10 {
        return Err(bad("too short for one"));
    }
    let trailer: [u8; 10] = read_at(file, len - 10, 10)?
        .as_slice()
        .try_into()
        .map_err(|_| bad("no footer"))?;
    let footer_len = read_footer_length(trailer)? as u64;
    let end = (len - 10)
        .checked_sub(footer_len)
        .ok_or_else(|| bad("its footer is longer than the file"))?;
    let footer_bytes = read_at(file, end, footer_len as usize)?;
    let footer = root_as_footer(&footer_bytes).map_err(|e| ArrowError::IpcError(e.to_string()))?;
    let schema = try_fb_to_schema(
        footer
            .schema()
            .ok_or_else(|| bad("its footer has no schema"))?,
    )?;
    Ok(IpcFooter {
        schema: Arc::new(schema),
        version: footer.version(),
        dictionaries: footer
            .dictionaries()
            .map(|b| b.iter().copied().collect())
            .unwrap_or_default(),
        batches: footer
            .recordBatches()
            .map(|b| b.iter().copied().collect())
            .unwrap_or_default(),
        end,
    })
}

/// The record batches of an Arrow IPC file whose footer is `footer` (only the `only`-th,
/// where given), each block read into one 64-byte aligned buffer that the arrays point
/// into (arrow's `FileReader` reads each message into fresh buffers and copies again). The
/// file is read, not mapped: a file truncated while it is read gives an error here, where
/// a map would kill the process with SIGBUS.
pub(super) fn read_ipc_file(
    file: File,
    footer: &IpcFooter,
    projection: Option<Vec<usize>>,
    only: Option<usize>,
) -> std::result::Result<
    impl Iterator<Item = std::result::Result<RecordBatch, arrow::error::ArrowError>> + Send + use<>,
    arrow::error::ArrowError,
> {
    use arrow::ipc::reader::FileDecoder;

    let bad = |what: &str| ArrowError::IpcError(format!("not a readable Arrow IPC file: {what}"));
    let mut decoder = FileDecoder::new(footer.schema.clone(), footer.version);
    if let Some(p) = projection {
        decoder = decoder.with_projection(p);
    }
    let end = footer.end;
    let block_data = move |file: &File, b: &arrow::ipc::Block| {
        let offset = u64::try_from(b.offset()).map_err(|_| bad("block offset"))?;
        let len = u64::try_from(b.bodyLength())
            .ok()
            .zip(u64::try_from(b.metaDataLength()).ok())
            .and_then(|(body, meta)| body.checked_add(meta))
            .ok_or_else(|| bad("block length"))?;
        if offset.checked_add(len).is_none_or(|e| e > end) {
            return Err(bad("block past the end"));
        }
        let data = read_at(file, offset, len as usize)?;
        // Arrow's decoder trusts the header's buffer offsets and row counts: checked first,
        // as pushed messages are (a forged count could ask for any allocation).
        let (meta, body) = data.split_at(b.metaDataLength() as usize);
        hydrant_flight::check_ipc_message(flatbuffer(meta)?, body.len(), MAX_ROWS as i64)
            .map_err(|e| bad(&e))?;
        Ok(data)
    };
    for block in &footer.dictionaries {
        decoder.read_dictionary(block, &block_data(&file, block)?)?;
    }
    let blocks = match only {
        Some(b) => vec![
            *footer
                .batches
                .get(b)
                .ok_or_else(|| bad("fewer record batches than when it was opened"))?,
        ],
        None => footer.batches.clone(),
    };
    let mut blocks = blocks.into_iter();
    Ok(std::iter::from_fn(move || {
        let block = blocks.next()?;
        Some(block_data(&file, &block).and_then(|data| {
            decoder
                .read_record_batch(&block, &data)?
                .ok_or_else(|| bad("empty block"))
        }))
    }))
}

/// `len` bytes of `file` from `offset`, in a 64-byte aligned buffer; a file shorter than
/// that (truncated since its footer was read) is an error.
///
/// `pread` by hand, into memory that is not zeroed first: `read_exact_at` needs an
/// initialized slice, and zeroing a step-sized buffer only to overwrite it was a fifth of
/// the reading thread's time when serving an Arrow file.
fn read_at(
    file: &File,
    offset: u64,
    len: usize,
) -> std::result::Result<arrow::buffer::Buffer, arrow::error::ArrowError> {
    use std::os::fd::AsRawFd;
    let failed = |e: std::io::Error| arrow::error::ArrowError::IpcError(one_line(e));
    let mut buffer = recycle::take(len);
    let mut done = 0;
    while done < len {
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| failed(std::io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: `buffer` holds at least `len` bytes, so the `len - done` bytes from
        // `done` on are inside its allocation; `pread` only writes them, and the file
        // descriptor is `file`'s, open for as long as `file` is borrowed.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buffer.as_mut_ptr().add(done).cast(),
                len - done,
                at,
            )
        };
        match n {
            0 => {
                return Err(arrow::error::ArrowError::IpcError(format!(
                    "the file ends before byte {}: it was truncated or rewritten while read",
                    offset + len as u64
                )));
            }
            n if n > 0 => done += n as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(failed(e));
                }
            }
        }
    }
    // SAFETY: the loop wrote all `len` bytes, and `len` is within the capacity.
    unsafe { buffer.set_len(len) };
    Ok(recycle::freeze(buffer))
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{Int64Type, UInt64Type};
    use arrow::ipc::writer::{FileWriter, StreamWriter};

    use std::fs::File;

    use hydrant_operators::{Batch, ROW_ID};

    use super::*;
    use crate::source::Inputs;

    /// Batches of 3, 0, 5 and 2 rows whose values count up from 0.
    fn batches() -> Vec<RecordBatch> {
        let mut next = 0;
        [3, 0, 5, 2]
            .map(|n| {
                let values = Int64Array::from_iter_values(next..next + n);
                next += n;
                RecordBatch::try_from_iter([("x", Arc::new(values) as _)]).unwrap()
            })
            .to_vec()
    }

    /// Each record batch of an Arrow IPC file that holds rows is a unit, read without the
    /// others; a stream, which has no footer to find them by, is one unit.
    #[test]
    fn an_ipc_file_is_a_unit_per_record_batch_and_a_stream_one_unit() {
        let dir = tempfile::tempdir().unwrap();
        let (file, stream) = (dir.path().join("f.arrow"), dir.path().join("s.arrows"));
        let schema = batches()[0].schema();
        let mut w = FileWriter::try_new(File::create(&file).unwrap(), &schema).unwrap();
        let mut s = StreamWriter::try_new(File::create(&stream).unwrap(), &schema).unwrap();
        for b in batches() {
            w.write(&b).unwrap();
            s.write(&b).unwrap();
        }
        w.finish().unwrap();
        s.finish().unwrap();

        let inputs = Inputs::open(std::slice::from_ref(&file), 1024).unwrap();
        let units: Vec<_> = inputs
            .units()
            .iter()
            .map(|u| (u.row_group, u.first_row, u.rows, u.first_seq))
            .collect();
        let want = [(Some(0), 0, 3, 0), (Some(2), 3, 5, 1), (Some(3), 8, 2, 2)];
        assert_eq!(units, want);
        let read: Vec<Batch> = inputs
            .read(&inputs.units()[1])
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(read.len(), 1);
        let data = &read[0].data;
        let x = data
            .column_by_name("x")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert_eq!(x.values().to_vec(), vec![3, 4, 5, 6, 7]);
        let ids = data.column_by_name(ROW_ID).unwrap();
        assert_eq!(
            ids.as_primitive::<UInt64Type>().values().to_vec(),
            vec![3, 4, 5, 6, 7]
        );

        let inputs = Inputs::open(&[stream], 1024).unwrap();
        let units: Vec<_> = inputs
            .units()
            .iter()
            .map(|u| (u.row_group, u.rows))
            .collect();
        assert_eq!(units, [(None, 10)]);
    }

    /// Writes `batches` as an Arrow IPC file at `path`; returns its bytes.
    fn write_file(path: &Path, batches: &[RecordBatch]) -> Vec<u8> {
        let mut w = FileWriter::try_new(File::create(path).unwrap(), &batches[0].schema()).unwrap();
        for b in batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
        std::fs::read(path).unwrap()
    }

    /// Where record batch `k`'s message header lies in the IPC file at `path`.
    fn header(path: &Path, k: usize) -> std::ops::Range<usize> {
        let block = ipc_footer(&File::open(path).unwrap()).unwrap().batches[k];
        let at = block.offset() as usize;
        at..at + block.metaDataLength() as usize
    }

    /// Replaces every `from` in `bytes[range]` with `to` (as long); how many it replaced.
    fn patch(bytes: &mut [u8], range: std::ops::Range<usize>, from: &[u8], to: &[u8]) -> usize {
        let mut patched = 0;
        for i in range.start..range.end - from.len() {
            if bytes[i..i + from.len()] == *from {
                bytes[i..i + to.len()].copy_from_slice(to);
                patched += 1;
            }
        }
        patched
    }

    /// A footer whose batch holds no readable message header is refused when the file is
    /// opened, saying which batch.
    #[test]
    fn an_unreadable_batch_header_is_refused_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.arrow");
        let mut bytes = write_file(&path, &batches());
        let at = header(&path, 2);
        bytes[at.start + 8..at.end].fill(0xab);
        std::fs::write(&path, &bytes).unwrap();
        let err = Inputs::open(std::slice::from_ref(&path), 1024)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("bad.arrow"), "{err}");
        assert!(
            err.contains("not a readable Arrow IPC file: record batch 2 of the footer"),
            "{err}"
        );

        std::fs::write(&path, &bytes[..12]).unwrap();
        let err = Inputs::open(&[path], 1024).err().unwrap().to_string();
        assert!(err.contains("not a readable Arrow IPC file"), "{err}");
    }

    /// A file rewritten to the length it had when opened, but with fewer batches, fails
    /// every later read, those of the batches it kept too (its modification time says it
    /// was rewritten: what it holds now is another file's). Rows are never missing without
    /// an error.
    #[test]
    fn a_file_rewritten_with_fewer_batches_fails_every_later_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.arrow");
        let len = write_file(&path, &batches()).len();
        let inputs = Inputs::open(std::slice::from_ref(&path), 1024).unwrap();
        let mut fewer = write_file(&path, &batches()[..2]);
        fewer.resize(len, 0);
        std::fs::write(&path, &fewer).unwrap();
        // Set apart from the time it was opened at (a coarse clock could give both one).
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(at)
            .unwrap();
        for u in [0, 1, 2] {
            let err = inputs.read(&inputs.units()[u]).err().unwrap().to_string();
            assert!(err.contains("f.arrow"), "{err}");
            assert!(err.contains("was modified after it was opened"), "{err}");
        }
    }

    /// A batch header may state any row count: one past what hydrant numbers is refused at
    /// open, never summed into an overflow.
    #[test]
    fn a_header_stating_too_many_rows_is_refused_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.arrow");
        let rows = 12_345;
        let values = arrow::array::Int8Array::from(vec![1; rows]);
        let batch = RecordBatch::try_from_iter([("x", Arc::new(values) as _)]).unwrap();
        let mut bytes = write_file(&path, &[batch]);
        // The row count is in the header twice (the batch's and its column's), as i64s.
        let (from, to) = ((rows as i64).to_le_bytes(), (1i64 << 62).to_le_bytes());
        assert!(patch(&mut bytes, header(&path, 0), &from, &to) > 0);
        std::fs::write(&path, &bytes).unwrap();
        let err = Inputs::open(&[path], 1024).err().unwrap().to_string();
        assert!(err.contains("huge.arrow"), "{err}");
        assert!(err.contains("rows hydrant numbers"), "{err}");
    }

    /// A batch whose header puts a buffer past its body (which made arrow's decoder panic,
    /// and with it the worker reading the file) is an error naming the file: a file's batch
    /// is checked before it is decoded, a stream's decoding is guarded.
    #[test]
    fn a_buffer_past_its_body_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let values = Int64Array::from_iter_values(0..1000);
        let batch = RecordBatch::try_from_iter([("x", Arc::new(values) as _)]).unwrap();

        let file = dir.path().join("forged.arrow");
        let mut bytes = write_file(&file, std::slice::from_ref(&batch));
        // The values buffer (offset 0, length 8000) made 2^40 bytes long; the message's
        // body length, 8000 too, is left alone.
        let buffer = [0i64.to_le_bytes(), 8000i64.to_le_bytes()].concat();
        let forged = [0i64.to_le_bytes(), (1i64 << 40).to_le_bytes()].concat();
        assert!(patch(&mut bytes, header(&file, 0), &buffer, &forged) > 0);
        std::fs::write(&file, &bytes).unwrap();
        let inputs = Inputs::open(std::slice::from_ref(&file), 1024).unwrap();
        let err = inputs
            .read(&inputs.units()[0])
            .unwrap()
            .find_map(|b| b.err());
        let err = err.expect("the forged batch is refused").to_string();
        assert!(
            err.contains("forged.arrow") && err.contains("a buffer at bytes"),
            "{err}"
        );

        let stream = dir.path().join("forged.arrows");
        let mut w = StreamWriter::try_new(File::create(&stream).unwrap(), &batch.schema()).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        let mut bytes = std::fs::read(&stream).unwrap();
        let all = 0..bytes.len();
        assert!(patch(&mut bytes, all, &buffer, &forged) > 0);
        std::fs::write(&stream, &bytes).unwrap();
        let err = Inputs::open(&[stream], 1024).err().unwrap().to_string();
        assert!(
            err.contains("forged.arrows") && err.contains("cannot be decoded"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }

    /// Two columns of one name: which one a pipeline reads would be anyone's guess.
    #[test]
    fn an_input_with_two_columns_of_one_name_is_refused_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("twice.arrow");
        let x: arrow::array::ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        let batch = RecordBatch::try_from_iter([("x", x.clone()), ("y", x.clone()), ("x", x)]);
        write_file(&path, &[batch.unwrap()]);
        let err = Inputs::open(&[path], 1024).err().unwrap().to_string();
        assert!(
            err.contains("twice.arrow") && err.contains("two columns named `x`"),
            "{err}"
        );
    }
}
