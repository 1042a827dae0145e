//! The records of the spool's segments: how one is written, checked and read back.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::path::PathBuf;

use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use serde::{Deserialize, Serialize};

use hydrant_flight::Origin;

use super::state_error;
use crate::error::{Error, Result};

/// A record of the log.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// An admitted batch (raw, as pushed).
    Batch(Option<Origin>, RecordBatch),
    /// `end_ingest`.
    End,
}

impl Record {
    pub(super) fn rows(&self) -> u64 {
        match self {
            Record::Batch(_, b) => b.num_rows() as u64,
            Record::End => 0,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    end: bool,
    #[serde(default)]
    origin: Option<Origin>,
}

pub(super) fn encode(record: &Record) -> Result<Vec<u8>> {
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

/// Where a segment's whole records end. A record cut short or whose checksum fails ends
/// the segment (a crash mid-append).
pub(super) fn whole_records(file: &File) -> std::io::Result<u64> {
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

/// The whole records of the log's segments, read one at a time. A whole record that does
/// not decode, or a segment that does not start where the one before ended, is an error
/// (the folder is not a spool, or it was damaged); nothing is read after one.
pub struct Replay {
    /// Segments still to read: first row, path, bytes of whole records.
    segments: VecDeque<(u64, PathBuf, u64)>,
    reading: Option<Segment>,
    /// The row the next record starts at.
    row: u64,
    first_row: u64,
    failed: bool,
}

struct Segment {
    reader: std::io::Take<std::io::BufReader<File>>,
    path: PathBuf,
    at: u64,
}

impl Replay {
    pub(super) fn new(segments: Vec<(u64, PathBuf, u64)>) -> Self {
        let first_row = segments.first().map_or(0, |s| s.0);
        Replay {
            segments: segments.into(),
            reading: None,
            row: first_row,
            first_row,
            failed: false,
        }
    }

    /// Whether the log holds no record.
    pub fn is_empty(&self) -> bool {
        self.segments.iter().all(|s| s.2 == 0)
    }

    /// The stream row the first record starts at.
    pub fn first_row(&self) -> u64 {
        self.first_row
    }

    fn read(&mut self) -> Option<Result<Record>> {
        loop {
            if self.reading.is_none() {
                let (first, path, whole) = self.segments.pop_front()?;
                if first != self.row {
                    let why = format!(
                        "the segment starts at row {first}, but the one before ends at row {}",
                        self.row
                    );
                    return Some(Err(state_error(&path, &why)));
                }
                let file = match File::open(&path) {
                    Ok(f) => f,
                    Err(e) => return Some(Err(state_error(&path, &e))),
                };
                self.reading = Some(Segment {
                    reader: std::io::BufReader::new(file).take(whole),
                    path,
                    at: 0,
                });
            }
            let s = self.reading.as_mut()?;
            let mut head = [0u8; 12];
            if s.reader.read_exact(&mut head).is_err() {
                self.reading = None;
                continue;
            }
            let (len, _) = split_head(&head);
            let mut body = vec![0; len];
            let read = s.reader.read_exact(&mut body).map_err(|e| e.to_string());
            let at = s.at;
            s.at += 12 + len as u64;
            let record = read.and_then(|()| decode(&body)).map_err(|e| Error::State {
                path: s.path.clone(),
                reason: format!("record at byte {at}: {e}"),
            });
            if let Ok(r) = &record {
                self.row += r.rows();
            }
            return Some(record);
        }
    }
}

impl Iterator for Replay {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        if self.failed {
            return None;
        }
        let record = self.read()?;
        self.failed = record.is_err();
        Some(record)
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
