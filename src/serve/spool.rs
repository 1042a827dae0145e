//! Durable pushed input: every batch DoPut accepts is appended to a log in the state
//! directory and synced to disk before it is acknowledged, so that an acknowledgement
//! means the rows will be delivered, after a crash too. A restarted server reads the log
//! back and admits its batches again, in the same order: rows get the same ids and the
//! same places, so a trainer resumes at its last step + 1 exactly.
//!
//! The log is a sequence of records `[len u32][xxh64 u64][body]` (little-endian), the body
//! `[header len u32][header JSON][Arrow IPC stream of the batch]`. A crash mid-append
//! leaves a torn last record, never acknowledged: reading stops there and cuts it off.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use serde::{Deserialize, Serialize};

use hydrant_flight::Origin;

use crate::error::{Error, Result};

/// The log's file name in the state directory.
pub const SPOOL_FILE: &str = "pushed.spool";

/// A record of the log.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// An admitted batch (raw, as pushed).
    Batch(Option<Origin>, RecordBatch),
    /// `end_ingest`.
    End,
}

#[derive(Serialize, Deserialize)]
struct Header {
    end: bool,
    #[serde(default)]
    origin: Option<Origin>,
}

/// The open log, appended to.
pub struct Spool {
    file: File,
    path: PathBuf,
}

impl Spool {
    /// Opens the log in `dir` (creating both), and returns it with a reader of every
    /// whole record it holds, in order (read as replayed: memory does not grow with the
    /// log). A torn last record is cut off.
    pub fn open(dir: &Path) -> Result<(Spool, Replay)> {
        let path = dir.join(SPOOL_FILE);
        let failed = |e: &dyn std::fmt::Display| Error::State {
            path: path.clone(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(|e| failed(&e))?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| failed(&e))?;
        let whole = whole_records(&file).map_err(|e| failed(&e))?;
        if whole < file.metadata().map_err(|e| failed(&e))?.len() {
            file.set_len(whole).map_err(|e| failed(&e))?;
            file.sync_all().map_err(|e| failed(&e))?;
        }
        file.seek(SeekFrom::End(0)).map_err(|e| failed(&e))?;
        let reader = File::open(&path).map_err(|e| failed(&e))?;
        let replay = Replay {
            reader: std::io::BufReader::new(reader).take(whole),
            path: path.clone(),
            at: 0,
        };
        Ok((Spool { file, path }, replay))
    }

    /// Appends a record and syncs it to disk. A failed append (a full disk) is undone,
    /// so that no torn record sits before the ones appended after it.
    pub fn append(&mut self, record: &Record) -> Result<()> {
        let bytes = encode(record)?;
        let failed = |e: std::io::Error| Error::State {
            path: self.path.clone(),
            reason: format!("cannot spool a pushed batch: {e}"),
        };
        let end = self.file.stream_position().map_err(failed)?;
        let written = self
            .file
            .write_all(&bytes)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            let undone = self
                .file
                .set_len(end)
                .and_then(|()| self.file.seek(SeekFrom::Start(end)));
            return Err(failed(match undone {
                Ok(_) => e,
                Err(u) => std::io::Error::other(format!("{e}; undoing it failed too: {u}")),
            }));
        }
        Ok(())
    }
}

fn encode(record: &Record) -> Result<Vec<u8>> {
    let (header, batch) = match record {
        Record::Batch(origin, batch) => (
            Header {
                end: false,
                origin: origin.clone(),
            },
            Some(batch),
        ),
        Record::End => (
            Header {
                end: true,
                origin: None,
            },
            None,
        ),
    };
    let header = serde_json::to_vec(&header).map_err(|e| Error::Dataflow(e.to_string()))?;
    let mut body = Vec::new();
    body.extend_from_slice(&(header.len() as u32).to_le_bytes());
    body.extend_from_slice(&header);
    if let Some(batch) = batch {
        let mut w = StreamWriter::try_new(&mut body, &batch.schema())?;
        w.write(batch)?;
        w.finish()?;
    }
    let len = u32::try_from(body.len())
        .map_err(|_| Error::Usage("a pushed batch over 4 GiB cannot be spooled".into()))?;
    let mut out = Vec::with_capacity(12 + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&xxhash_rust::xxh64::xxh64(&body, 0).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Where the log's whole records end. A record cut short or whose checksum fails ends
/// the log (a crash mid-append).
fn whole_records(file: &File) -> std::io::Result<u64> {
    let mut r = std::io::BufReader::new(file);
    let (mut at, mut body) = (0u64, Vec::new());
    loop {
        let mut head = [0u8; 12];
        if r.read_exact(&mut head).is_err() {
            return Ok(at);
        }
        let (len, sum) = split_head(&head);
        body.resize(len, 0);
        if r.read_exact(&mut body).is_err() || xxhash_rust::xxh64::xxh64(&body, 0) != sum {
            return Ok(at);
        }
        at += 12 + len as u64;
    }
}

fn split_head(head: &[u8; 12]) -> (usize, u64) {
    let [a, b, c, d, s @ ..] = *head;
    (
        u32::from_le_bytes([a, b, c, d]) as usize,
        u64::from_le_bytes(s),
    )
}

/// The whole records of a log, read one at a time. A whole record that does not decode
/// is an error (the file is not a spool, or it was damaged).
pub struct Replay {
    reader: std::io::Take<std::io::BufReader<File>>,
    path: PathBuf,
    at: u64,
}

impl Replay {
    /// Whether the log holds no record.
    pub fn is_empty(&self) -> bool {
        self.reader.limit() == 0
    }
}

impl Iterator for Replay {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        let mut head = [0u8; 12];
        self.reader.read_exact(&mut head).ok()?;
        let (len, _) = split_head(&head);
        let mut body = vec![0; len];
        let read = self.reader.read_exact(&mut body).map_err(|e| e.to_string());
        let at = self.at;
        self.at += 12 + len as u64;
        Some(read.and_then(|()| decode(&body)).map_err(|e| Error::State {
            path: self.path.clone(),
            reason: format!("record at byte {at}: {e}"),
        }))
    }
}

fn decode(body: &[u8]) -> std::result::Result<Record, String> {
    let n = u32::from_le_bytes(body.get(..4).ok_or("short")?.try_into().unwrap_or_default());
    let header = body.get(4..4 + n as usize).ok_or("short header")?;
    let header: Header = serde_json::from_slice(header).map_err(|e| e.to_string())?;
    if header.end {
        return Ok(Record::End);
    }
    let ipc = &body[4 + n as usize..];
    let mut reader = StreamReader::try_new(ipc, None).map_err(|e| e.to_string())?;
    let batch = reader
        .next()
        .ok_or("no batch")?
        .map_err(|e| e.to_string())?;
    Ok(Record::Batch(header.origin, batch))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(first: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(first..first + 3))],
        )
        .unwrap()
    }

    fn origin(producer: &str, seq: u64) -> Option<Origin> {
        Some(Origin {
            producer: producer.into(),
            seq,
        })
    }

    #[test]
    fn records_come_back_in_order_and_a_torn_tail_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let written = vec![
            Record::Batch(origin("a", 0), batch(0)),
            Record::Batch(None, batch(10)),
            Record::Batch(origin("a", 1), batch(20)),
            Record::End,
        ];
        {
            let (mut spool, read) = Spool::open(dir.path()).unwrap();
            assert!(read.is_empty());
            assert_eq!(read.count(), 0);
            for r in &written {
                spool.append(r).unwrap();
            }
        }
        let path = dir.path().join(SPOOL_FILE);
        let whole = std::fs::metadata(&path).unwrap().len();
        // A crash mid-append: part of a record after the whole ones.
        let torn = encode(&Record::Batch(origin("b", 7), batch(30))).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&torn[..torn.len() - 5]).unwrap();
        drop(f);
        let (mut spool, read) = Spool::open(dir.path()).unwrap();
        assert_eq!(read.map(Result::unwrap).collect::<Vec<_>>(), written);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
        // Appends go after the whole records.
        spool
            .append(&Record::Batch(origin("b", 7), batch(30)))
            .unwrap();
        let (_, read) = Spool::open(dir.path()).unwrap();
        assert_eq!(read.count(), 5);
    }

    #[test]
    fn a_damaged_record_that_checks_out_is_an_error_when_replayed_not_a_silent_cut() {
        let dir = tempfile::tempdir().unwrap();
        let body = b"\x02\x00\x00\x00{}garbage";
        let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&xxhash_rust::xxh64::xxh64(body, 0).to_le_bytes());
        bytes.extend_from_slice(body);
        std::fs::write(dir.path().join(SPOOL_FILE), bytes).unwrap();
        let (_, mut read) = Spool::open(dir.path()).unwrap();
        let err = read.next().unwrap().unwrap_err().to_string();
        assert!(
            err.contains(SPOOL_FILE) && err.contains("record at byte 0"),
            "{err}"
        );
    }
}
