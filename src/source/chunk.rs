//! A small Parquet row group read into memory with one read before it is decoded.
//!
//! parquet-rs reads a [`File`] column chunk by column chunk, each through a descriptor of
//! its own (`dup`, a seek, `fstat`, 8 KiB reads, `close`). For a folder of small files
//! that costs more than decoding them: 6,000 Criteo files of 50 rows spent a third of
//! their time in those calls. A row group of at most [`IN_MEMORY_BYTES`] is read whole
//! instead, and decoded from memory; a larger one is read as before (its calls are few
//! against its bytes), so the memory this takes stays small.

use std::fs::File;
use std::os::unix::fs::FileExt;

use bytes::{Buf, Bytes};
use parquet::errors::{ParquetError, Result};
use parquet::file::reader::{ChunkReader, Length};

/// Row groups of at most this many bytes (their column chunks, first to last) are read
/// into memory.
pub(super) const IN_MEMORY_BYTES: u64 = 2 << 20;

/// Bytes `start..` of a file of `len` bytes, read into memory: a [`ChunkReader`] for the
/// column chunks that lie there.
pub(super) struct InMemory {
    start: u64,
    bytes: Bytes,
    len: u64,
}

impl InMemory {
    /// Reads bytes `range` of `file`, which is `len` bytes long.
    pub(super) fn read(file: &File, range: std::ops::Range<u64>, len: u64) -> Result<Self> {
        let mut bytes = vec![0; range.end.saturating_sub(range.start) as usize];
        file.read_exact_at(&mut bytes, range.start)?;
        Ok(InMemory {
            start: range.start,
            bytes: bytes.into(),
            len,
        })
    }

    /// The bytes from file offset `start`: `length` of them, or all that were read.
    fn slice(&self, start: u64, length: Option<usize>) -> Result<Bytes> {
        let read = self.bytes.len();
        let from = start
            .checked_sub(self.start)
            .and_then(|o| usize::try_from(o).ok())
            .filter(|&o| o <= read);
        let to = from.and_then(|f| length.map_or(Some(read), |n| f.checked_add(n)));
        match (from, to) {
            (Some(from), Some(to)) if to <= read => Ok(self.bytes.slice(from..to)),
            _ => Err(ParquetError::General(format!(
                "a column chunk at bytes {start}.. lies outside its row group ({}..{})",
                self.start,
                self.start + read as u64
            ))),
        }
    }
}

impl Length for InMemory {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for InMemory {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> Result<Self::T> {
        Ok(self.slice(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        self.slice(start, Some(length))
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn reads_within_what_was_read_and_refuses_outside() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&(0..100u8).collect::<Vec<_>>()).unwrap();
        let chunk = InMemory::read(&file, 10..50, 100).unwrap();
        assert_eq!(chunk.len(), 100);
        assert_eq!(&chunk.get_bytes(10, 3).unwrap()[..], [10, 11, 12]);
        assert_eq!(&chunk.get_bytes(47, 3).unwrap()[..], [47, 48, 49]);
        let mut rest = Vec::new();
        chunk.get_read(45).unwrap().read_to_end(&mut rest).unwrap();
        assert_eq!(rest, [45, 46, 47, 48, 49]);
        for (start, length) in [(9, 1), (48, 3), (50, 1), (u64::MAX, 1), (10, usize::MAX)] {
            let err = chunk.get_bytes(start, length).unwrap_err().to_string();
            assert!(err.contains("outside its row group (10..50)"), "{err}");
        }
        assert!(chunk.get_read(51).is_err());
        // Past the file's end: an error, not a short read.
        assert!(InMemory::read(&file, 90..110, 100).is_err());
    }
}
