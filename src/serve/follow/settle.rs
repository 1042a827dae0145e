//! Which new files of a followed folder are complete. A writer that renames its files into
//! place (Spark's committers, `mv`) only ever shows complete ones; one that writes in place
//! (pandas' `to_parquet`, `cp`) shows a file while it grows, and a file admitted then was
//! unreadable and skipped for good. A file is now taken once it is whole as its format
//! says — a Parquet footer that parses, an Arrow IPC file's footer that parses, an IPC
//! stream whose messages end with the end-of-stream marker exactly at the end of the file —
//! or, short of that, once it has not changed for [`SETTLE`] (it is then admitted, and
//! skipped with its error if it cannot be read, as before). A whole file waits for nothing.
//! A file is looked at again only when its size or modification time changed.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use hydrant_operators::open_regular;

/// How long a file that is not whole must stay unchanged before it is admitted anyway.
pub(in crate::serve) const SETTLE: Duration = Duration::from_secs(2);

/// The files seen incomplete: their size and modification time when last looked at, and
/// since when they have been so.
#[derive(Default)]
pub(in crate::serve) struct Settle {
    waiting: HashMap<String, (u64, Option<SystemTime>, Instant)>,
    /// Files taken after [`SETTLE`] without being whole, until [`Settle::unfinished`] asks.
    unfinished: std::collections::HashSet<String>,
}

impl Settle {
    /// The files of `names` (new files of `dir`, in order) that can be admitted now;
    /// the others are looked at again next time (files gone meanwhile are forgotten).
    pub fn ready(&mut self, dir: &Path, names: Vec<String>, now: Instant) -> Vec<String> {
        self.waiting.retain(|name, _| names.contains(name));
        names
            .into_iter()
            .filter(|name| self.is_ready(dir, name, now))
            .collect()
    }

    /// Whether `name` was taken without being whole (asked once, when it is admitted):
    /// an IPC stream cut at a message boundary reads without an error, and is then told as
    /// skipped from where it stops.
    pub fn unfinished(&mut self, name: &str) -> bool {
        self.unfinished.remove(name)
    }

    fn is_ready(&mut self, dir: &Path, name: &str, now: Instant) -> bool {
        // Gone, or not a regular file: admitted now, and the reader names what is wrong.
        let opened = open_regular(&dir.join(name)).and_then(|f| f.metadata().map(|m| (f, m)));
        let Ok((file, meta)) = opened else {
            return true;
        };
        let looks = (meta.len(), meta.modified().ok());
        if let Some(&(len, modified, since)) = self.waiting.get(name)
            && (len, modified) == looks
        {
            let settled = now.duration_since(since) >= SETTLE;
            if settled {
                self.waiting.remove(name);
                self.unfinished.insert(name.to_string());
            }
            return settled;
        }
        if whole(&file, meta.len()) {
            self.waiting.remove(name);
            return true;
        }
        self.waiting
            .insert(name.to_string(), (looks.0, looks.1, now));
        false
    }
}

/// Whether `file`, `len` bytes long, is a whole Parquet file, Arrow IPC file or IPC stream
/// (by its leading magic, as the reader tells them apart).
fn whole(file: &File, len: u64) -> bool {
    let mut magic = [0u8; 6];
    if len < 12 || file.read_exact_at(&mut magic, 0).is_err() {
        return false;
    }
    if magic[..4] == *b"PAR1" {
        let footer = parquet::file::metadata::ParquetMetaDataReader::new().parse_and_finish(file);
        return footer.is_ok();
    }
    if magic == *b"ARROW1" {
        return arrow::ipc::reader::FileReader::try_new(file, None).is_ok();
    }
    magic[..4] == [0xff; 4] && whole_stream(file, len)
}

/// The largest IPC message header read while walking a stream (they are a few hundred
/// bytes; a bigger length is not a header).
const MAX_HEADER: u64 = 16 << 20;

/// Whether the IPC stream in `file` is whole: its messages, walked by their headers, end
/// with the end-of-stream marker exactly at `len` (the marker's bytes inside a body, or a
/// file cut at a message's end, do not count).
fn whole_stream(file: &File, len: u64) -> bool {
    let mut at = 0u64;
    let mut prefix = [0u8; 8];
    while at.saturating_add(8) <= len && file.read_exact_at(&mut prefix, at).is_ok() {
        let [a, b, c, d, e, f, g, h] = prefix;
        if [a, b, c, d] != [0xff; 4] {
            return false;
        }
        let meta_len = u64::from(u32::from_le_bytes([e, f, g, h]));
        if meta_len == 0 {
            return at + 8 == len;
        }
        if meta_len > MAX_HEADER || at + 8 + meta_len > len {
            return false;
        }
        let mut meta = vec![0u8; meta_len as usize];
        if file.read_exact_at(&mut meta, at + 8).is_err() {
            return false;
        }
        let Ok(message) = arrow::ipc::root_as_message(&meta) else {
            return false;
        };
        let Ok(body) = u64::try_from(message.bodyLength()) else {
            return false;
        };
        at = at.saturating_add(8 + meta_len).saturating_add(body);
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int32Array, RecordBatch};

    use super::*;

    /// Two batches; the first's last value, -1 in an int32 column of 15 (60 bytes, padded
    /// to 64), makes a stream cut after it end in the bytes of an end-of-stream marker.
    fn batches() -> Vec<RecordBatch> {
        let batch = |v: Vec<i32>| {
            RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(v)) as ArrayRef)]).unwrap()
        };
        let mut first = vec![3; 14];
        first.push(-1);
        vec![batch(first), batch(vec![7; 5])]
    }

    fn parquet() -> Vec<u8> {
        let mut out = Vec::new();
        let b = batches();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, b[0].schema(), None).unwrap();
        b.iter().for_each(|b| w.write(b).unwrap());
        w.close().unwrap();
        out
    }

    /// An IPC stream, and where its first batch's message ends.
    fn stream() -> (Vec<u8>, usize) {
        let (b, mut out) = (batches(), Vec::new());
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut out, &b[0].schema()).unwrap();
        w.write(&b[0]).unwrap();
        w.flush().unwrap();
        let first = w.get_ref().len();
        w.write(&b[1]).unwrap();
        w.finish().unwrap();
        (out, first)
    }

    /// An IPC file, and where its end-of-stream marker (before the footer) ends.
    fn ipc_file() -> (Vec<u8>, usize) {
        let (b, mut out) = (batches(), Vec::new());
        let mut w = arrow::ipc::writer::FileWriter::try_new(&mut out, &b[0].schema()).unwrap();
        b.iter().for_each(|b| w.write(b).unwrap());
        w.finish().unwrap();
        drop(w);
        let eos = out
            .windows(8)
            .rposition(|w| w == [255, 255, 255, 255, 0, 0, 0, 0]);
        (out, eos.unwrap() + 8)
    }

    fn looks_whole(bytes: &[u8]) -> bool {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, bytes).unwrap();
        let file = File::open(&path).unwrap();
        whole(&file, bytes.len() as u64)
    }

    #[test]
    fn whole_files_are_told_from_cut_ones_whatever_their_last_bytes() {
        let p = parquet();
        assert!(looks_whole(&p));
        assert!(!looks_whole(&p[..p.len() / 2]));
        // A cut file whose last bytes happen to read `PAR1`.
        let mut fake = p[..p.len() / 2].to_vec();
        fake.extend_from_slice(&[200, 0, 0, 0]);
        fake.extend_from_slice(b"PAR1");
        assert!(!looks_whole(&fake));

        let (s, first) = stream();
        assert!(looks_whole(&s));
        assert!(s[..first].ends_with(&[255, 255, 255, 255, 0, 0, 0, 0]));
        assert!(
            !looks_whole(&s[..first]),
            "a stream cut after a batch ending in -1"
        );
        assert!(
            !looks_whole(&s[..s.len() - 8]),
            "a stream without its marker"
        );

        let (f, eos) = ipc_file();
        assert!(looks_whole(&f));
        assert!(
            !looks_whole(&f[..eos]),
            "an IPC file cut after its end-of-stream marker"
        );
        assert!(!looks_whole(&f[..f.len() - 1]));
        assert!(!looks_whole(b"just some text, not data"));
    }

    #[test]
    fn a_file_is_taken_once_whole_or_unchanged_for_the_settling_time() {
        let dir = tempfile::tempdir().unwrap();
        let (p, (s, first)) = (parquet(), stream());
        std::fs::write(dir.path().join("a.parquet"), &p[..p.len() / 2]).unwrap();
        std::fs::write(dir.path().join("b.arrow"), &s[..first]).unwrap();
        let names = || vec!["a.parquet".to_string(), "b.arrow".to_string()];
        let mut settle = Settle::default();
        let t0 = Instant::now();
        assert!(settle.ready(dir.path(), names(), t0).is_empty());

        // The Parquet file is finished: taken at once. The stream grows: it waits again.
        std::fs::write(dir.path().join("a.parquet"), &p).unwrap();
        std::fs::write(dir.path().join("b.arrow"), &s[..s.len() - 8]).unwrap();
        let t1 = t0 + SETTLE;
        assert_eq!(settle.ready(dir.path(), names(), t1), ["a.parquet"]);
        let names = || vec!["b.arrow".to_string()];
        assert!(
            settle
                .ready(dir.path(), names(), t1 + SETTLE / 2)
                .is_empty()
        );
        // Unchanged for SETTLE since it was last seen changing: taken, whole or not, and
        // said to be unfinished (once).
        assert_eq!(settle.ready(dir.path(), names(), t1 + SETTLE), ["b.arrow"]);
        assert!(settle.waiting.is_empty());
        assert!(!settle.unfinished("a.parquet"));
        assert!(settle.unfinished("b.arrow") && !settle.unfinished("b.arrow"));

        // A file gone is forgotten; a FIFO is taken at once (the reader refuses it), and
        // looking at it does not block.
        std::fs::write(dir.path().join("c.parquet"), &p[..100]).unwrap();
        assert!(
            settle
                .ready(dir.path(), vec!["c.parquet".into()], t0)
                .is_empty()
        );
        assert!(settle.ready(dir.path(), vec![], t0).is_empty());
        assert!(settle.waiting.is_empty());
        let fifo = dir.path().join("d.parquet");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert_eq!(
            settle.ready(dir.path(), vec!["d.parquet".into()], t0),
            ["d.parquet"]
        );
    }
}
