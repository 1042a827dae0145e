//! Which new files of a followed folder are complete. A writer that renames its files into
//! place (Spark's committers, `mv`) only ever shows complete ones; one that writes in place
//! (pandas' `to_parquet`, `cp`) shows a file while it grows, and a file admitted then was
//! unreadable and skipped for good. A file is now taken once it ends as its format ends —
//! Parquet's `PAR1`, an Arrow IPC file's `ARROW1`, an IPC stream's end-of-stream marker —
//! or, without that, once it has not changed for [`SETTLE`] (it is then admitted, and
//! skipped with its error if it cannot be read, as before). A complete file waits for
//! nothing.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// How long a file that does not end as its format ends must stay unchanged before it is
/// admitted anyway.
pub(in crate::serve) const SETTLE: Duration = Duration::from_secs(2);

/// The files seen incomplete: their size and modification time when last looked at, and
/// since when they have been so.
#[derive(Default)]
pub(in crate::serve) struct Settle {
    waiting: HashMap<String, (u64, Option<SystemTime>, Instant)>,
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

    fn is_ready(&mut self, dir: &Path, name: &str, now: Instant) -> bool {
        let path = dir.join(name);
        // Gone, or not a regular file (which must not be opened: a FIFO blocks): admitted
        // now, and the reader names what is wrong with it.
        let meta = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => meta,
            _ => return true,
        };
        if closed(&path, meta.len()) {
            self.waiting.remove(name);
            return true;
        }
        let looks = (meta.len(), meta.modified().ok());
        match self.waiting.get(name) {
            Some(&(len, modified, since)) if (len, modified) == looks => {
                let settled = now.duration_since(since) >= SETTLE;
                if settled {
                    self.waiting.remove(name);
                }
                settled
            }
            _ => {
                self.waiting
                    .insert(name.to_string(), (looks.0, looks.1, now));
                false
            }
        }
    }
}

/// Whether the file at `path`, `len` bytes long, ends as a complete Parquet file, Arrow IPC
/// file or IPC stream does.
fn closed(path: &Path, len: u64) -> bool {
    let mut tail = [0u8; 8];
    let read = len >= 8
        && std::fs::File::open(path)
            .and_then(|f| f.read_exact_at(&mut tail, len - 8))
            .is_ok();
    read && (tail[4..] == *b"PAR1"
        || tail[2..] == *b"ARROW1"
        || tail == [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0])
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_file_is_taken_once_it_ends_as_its_format_ends_or_stops_changing() {
        let dir = tempfile::tempdir().unwrap();
        let names = || vec!["a.parquet".to_string(), "b.arrow".to_string()];
        let mut a = std::fs::File::create(dir.path().join("a.parquet")).unwrap();
        a.write_all(b"PAR1 half a row group").unwrap();
        let mut b = std::fs::File::create(dir.path().join("b.arrow")).unwrap();
        b.write_all(b"ARROW1\0\0 a batch").unwrap();
        let mut settle = Settle::default();
        let t0 = Instant::now();
        assert!(settle.ready(dir.path(), names(), t0).is_empty());

        // The Parquet file is finished: taken at once. The IPC file grows: it waits again.
        a.write_all(b" the footer PAR1").unwrap();
        b.write_all(b" another batch").unwrap();
        let t1 = t0 + SETTLE;
        assert_eq!(settle.ready(dir.path(), names(), t1), ["a.parquet"]);
        let names = || vec!["b.arrow".to_string()];
        assert!(
            settle
                .ready(dir.path(), names(), t1 + SETTLE / 2)
                .is_empty()
        );
        // Unchanged for SETTLE since it was last seen changing: taken, complete or not.
        assert_eq!(settle.ready(dir.path(), names(), t1 + SETTLE), ["b.arrow"]);
        assert!(settle.waiting.is_empty());

        // An IPC stream's end-of-stream marker; a file gone is forgotten.
        std::fs::write(
            dir.path().join("c.arrow"),
            [1, 2, 255, 255, 255, 255, 0, 0, 0, 0],
        )
        .unwrap();
        assert_eq!(
            settle.ready(dir.path(), vec!["c.arrow".into()], t0),
            ["c.arrow"]
        );
        std::fs::write(dir.path().join("d.parquet"), b"PAR1").unwrap();
        assert!(
            settle
                .ready(dir.path(), vec!["d.parquet".into()], t0)
                .is_empty()
        );
        assert!(settle.ready(dir.path(), vec![], t0).is_empty());
        assert!(settle.waiting.is_empty());
    }
}
