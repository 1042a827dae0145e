//! The records of the spool's segments: how one is written, checked and read back.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
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

/// What a segment's records came to ([`whole_records`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Scanned {
    /// Where its whole records end.
    pub whole: u64,
    /// What follows the first bad record, if anything does.
    pub after: After,
}

/// What follows a segment's first bad record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    /// Nothing: the segment ends with its whole records.
    Nothing,
    /// A record cut short by a crash mid-append: no whole record follows.
    Torn,
    /// A whole record: the bad one is damage (a flipped byte, a broken length), not a
    /// crash's last record.
    Whole,
    /// Too many bytes that look like records to tell (see [`whole_record_after`]).
    Unknown,
}

/// Where a segment's whole records end, scanning from the start: a record cut short or
/// whose checksum fails ends them. Every record is synced before the next is appended, so
/// a crash can tear only the last one; a bad record with a whole one after it is damage
/// (a flipped byte, a broken length) and is reported as such rather than cut off with
/// every acknowledged record behind it.
pub(super) fn whole_records(file: &File) -> std::io::Result<Scanned> {
    let len = file.metadata()?.len();
    let (mut at, mut body) = (0u64, Vec::new());
    while let Some(n) = whole_at(file, at, len, &mut body)? {
        at += n;
    }
    let after = if at == len {
        After::Nothing
    } else {
        let budget = (len - at).saturating_mul(4).saturating_add(64 << 20);
        whole_record_after(file, at, len, budget)?
    };
    Ok(Scanned { whole: at, after })
}

/// Whether a whole record (its checksum holding) starts anywhere after byte `from` of a
/// segment of `len` bytes. Every record's body begins with its header's length (a few
/// bytes' worth) and the header's JSON, `{"end":`: only where those are is a record
/// tried. Pushed data may hold such bytes too; past `budget` bytes checked (four times what
/// follows `from`, and 64 MiB), the answer is [`After::Unknown`]. Holes (a segment
/// extended sparsely) read as zeros, which hold no mark: they are skipped, not read.
fn whole_record_after(file: &File, from: u64, len: u64, mut budget: u64) -> std::io::Result<After> {
    const MARK: &[u8] = b"{\"end\":";
    // The head (12 bytes) and the header's length (4) come before the mark.
    const BEFORE: u64 = 16;
    const CHUNK: u64 = 1 << 20;
    /// The longest header a record has (its producer's name is at most a few hundred
    /// bytes).
    const HEADER: u64 = 64 << 10;
    let marks = memchr::memmem::Finder::new(MARK);
    let (mut chunk, mut body) = (vec![0u8; CHUNK as usize], Vec::new());
    let mut start = from + 1 + BEFORE;
    while let Some(data) = next_data(file, start, len) {
        start = data;
        let n = (len - start).min(CHUNK) as usize;
        file.read_exact_at(&mut chunk[..n], start)?;
        for i in marks.find_iter(&chunk[..n]) {
            let at = start + i as u64 - BEFORE;
            let mut head = [0u8; 16];
            file.read_exact_at(&mut head, at)?;
            let (size, _) = split_head(head[..12].try_into().unwrap_or(&[0; 12]));
            let header = u32::from_le_bytes([head[12], head[13], head[14], head[15]]) as u64;
            let size = size as u64;
            if !(MARK.len() as u64..=HEADER).contains(&header)
                || size < 4 + header
                || size > len - at - 12
            {
                continue;
            }
            if size > budget {
                return Ok(After::Unknown);
            }
            budget -= size;
            if whole_at(file, at, len, &mut body)?.is_some() {
                return Ok(After::Whole);
            }
        }
        // The next chunk overlaps this one's last bytes, so that no mark is split.
        start += (n as u64).saturating_sub(MARK.len() as u64 - 1).max(1);
    }
    Ok(After::Torn)
}

/// Where the first byte at or after `at` (and before `len`) that is not in a hole is, if
/// there is one.
#[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
fn next_data(file: &File, at: u64, len: u64) -> Option<u64> {
    if at >= len {
        return None;
    }
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(at)) {
        Ok(data) => Some(data).filter(|&d| d < len),
        // No data from `at` on.
        Err(rustix::io::Errno::NXIO) => None,
        // Holes cannot be asked about here: every byte counts as data.
        Err(_) => Some(at),
    }
}

/// Where holes cannot be asked about, every byte counts as data.
#[cfg(not(any(target_os = "linux", target_os = "macos", target_os = "freebsd")))]
fn next_data(_file: &File, at: u64, len: u64) -> Option<u64> {
    (at < len).then_some(at)
}

/// The bytes of the whole record at byte `at` of a segment of `len` bytes (its checksum
/// holding), if one is there; its body is read into `body`.
fn whole_at(file: &File, at: u64, len: u64, body: &mut Vec<u8>) -> std::io::Result<Option<u64>> {
    if len - at < 12 {
        return Ok(None);
    }
    let mut head = [0u8; 12];
    file.read_exact_at(&mut head, at)?;
    let (n, sum) = split_head(&head);
    // A broken length must not allocate what the file does not hold.
    if n as u64 > len - at - 12 {
        return Ok(None);
    }
    body.resize(n, 0);
    file.read_exact_at(body, at + 12)?;
    Ok((xxhash_rust::xxh64::xxh64(body, 0) == sum).then_some(12 + n as u64))
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A record's bytes: length, checksum, then a body of the header `{"end":false}` and
    /// `payload` (as encoded, with a batch's IPC stream in place of the payload).
    fn record(payload: &[u8]) -> Vec<u8> {
        let header = br#"{"end":false}"#;
        let mut body = (header.len() as u32).to_le_bytes().to_vec();
        body.extend_from_slice(header);
        body.extend_from_slice(payload);
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&xxhash_rust::xxh64::xxh64(&body, 0).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// After a bad record: nothing, a torn one, a whole one, or bytes that look like
    /// records (a plausible head whose checksum fails) past the budget.
    #[test]
    fn what_follows_a_bad_record_is_told_apart() {
        let good = record(b"rows");
        let mut bad = record(&[7u8; 100]);
        bad[30] ^= 0xff;
        // A head that looks whole (its header length and size fit) but does not check out.
        let mut lookalike = record(&[9u8; 1000]);
        lookalike[100] ^= 0xff;
        let cases: [(Vec<Vec<u8>>, u64, After); 5] = [
            (vec![good.clone(), good.clone()], u64::MAX, After::Nothing),
            (
                vec![good.clone(), bad[..50].to_vec()],
                u64::MAX,
                After::Torn,
            ),
            (
                vec![good.clone(), bad.clone(), good.clone()],
                u64::MAX,
                After::Whole,
            ),
            (
                vec![good.clone(), bad.clone(), lookalike.clone()],
                u64::MAX,
                After::Torn,
            ),
            (
                vec![good.clone(), bad.clone(), lookalike, good.clone()],
                500,
                After::Unknown,
            ),
        ];
        for (k, (parts, budget, want)) in cases.into_iter().enumerate() {
            let mut file = tempfile::tempfile().unwrap();
            file.write_all(&parts.concat()).unwrap();
            std::io::Seek::rewind(&mut file).unwrap();
            let len = file.metadata().unwrap().len();
            let scanned = whole_records(&file).unwrap();
            let whole = if want == After::Nothing {
                len
            } else {
                good.len() as u64
            };
            assert_eq!(scanned.whole, whole, "case {k}");
            let after = match want {
                After::Nothing => scanned.after,
                _ => whole_record_after(&file, scanned.whole, len, budget).unwrap(),
            };
            assert_eq!(after, want, "case {k}");
        }
    }

    /// A segment extended sparsely past a torn record: the hole is skipped, not read, and
    /// a whole record after a hole is still found.
    #[test]
    fn holes_after_a_bad_record_are_skipped_but_not_what_follows_them() {
        let good = record(b"rows");
        let torn = &record(&[7u8; 100])[..50];
        let hole = 256u64 << 20;
        for whole_after in [false, true] {
            let mut file = tempfile::tempfile().unwrap();
            file.write_all(&[good.clone(), torn.to_vec()].concat())
                .unwrap();
            let end = file.metadata().unwrap().len() + hole;
            file.set_len(end).unwrap();
            if whole_after {
                file.write_all_at(&good, end).unwrap();
            }
            let scanned = whole_records(&file).unwrap();
            assert_eq!(scanned.whole, good.len() as u64);
            let want = if whole_after {
                After::Whole
            } else {
                After::Torn
            };
            assert_eq!(
                scanned.after, want,
                "a whole record after the hole: {whole_after}"
            );
        }
    }
}
