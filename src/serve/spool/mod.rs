//! Durable pushed input: every batch DoPut accepts is appended to a log in the state
//! directory and synced to disk before it is acknowledged, so that an acknowledgement
//! means the rows will be delivered, after a crash too. A restarted server reads the log
//! back and admits its batches again, in the same order: rows get the same ids and the
//! same places, so a trainer resumes at its last step + 1 exactly.
//!
//! The log is cut into *segments*, files `pushed-ROW.spool` named by the stream row their
//! first record starts at (20 digits, so that names sort as rows do); a new one is begun
//! once the last holds `segment_bytes`. A segment is a sequence of records
//! `[len u32][xxh64 u64][body]` (little-endian), the body `[header len u32][header JSON]
//! [Arrow IPC stream of the batch]`. A crash mid-append leaves a torn last record in the
//! last segment, never acknowledged: reading stops there and cuts it off.
//!
//! A trainer's *commit* (`commit.json`, replaced atomically) says from which step a
//! restarted server delivers: segments wholly before the first row that step needs are
//! deleted, and the producers' sequence numbers they held are kept in the commit.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::error::Result;

mod record;

use record::{After, encode, whole_records};
pub use record::{Record, Replay};

mod claim;
pub use claim::{Claim, Source, Stream, claim};

mod files;
pub use files::read_commit;
pub(in crate::serve) use files::{
    HEAD_FILE, in_state_dir, is_full, state_error, sync_dir, write_synced,
};
use files::{
    append_failed, list_segments, read_head, read_json, segment_path, trim, write_error, write_head,
};

/// Bytes a segment grows to before the next is begun (`--spool-segment-mib`).
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// The commit's file name in the state directory.
pub const COMMIT_FILE: &str = "commit.json";

/// What a trainer's commit keeps: where a restarted server starts delivering.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Commit {
    /// The step trainers resume at: every step before it is in their checkpoint.
    pub step: u64,
    /// The first stream row that step needs (the start of the shuffle window holding
    /// its first position): the rows before it are never delivered again.
    pub row: u64,
    /// Each named producer's highest admitted `seq` when the commit was made, so that
    /// retries of batches in deleted segments are still known as duplicates.
    pub admitted: BTreeMap<String, u64>,
    /// The first stream row kept, when it is before `row`: refreshed statistics count
    /// the rows from their last refresh point again after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u64>,
    /// The stream rows admitted (each made durable before it was acknowledged) when the
    /// commit was made: a spool that replays fewer has lost acknowledged rows. Commits
    /// written before this was recorded have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_in: Option<u64>,
    /// The batches admitted when `rows_in` rows were: a restarted server numbers the
    /// batches it admits on from there, though the segments holding the first ones were
    /// deleted. Unknown for commits written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches_in: Option<u64>,
}

impl Commit {
    /// The first stream row a restarted server reads again.
    pub fn keep_from(&self) -> u64 {
        self.keep.map_or(self.row, |k| k.min(self.row))
    }
}

/// Each segment's first row and path, oldest first; the last is the one appended to.
type Segments = Arc<Mutex<Vec<(u64, PathBuf)>>>;

/// The open log, appended to.
pub struct Spool {
    dir: PathBuf,
    segments: Segments,
    file: File,
    /// Bytes in `file`.
    len: u64,
    segment_bytes: u64,
    /// Whether [`HEAD_FILE`] names the segment appended to.
    head_written: bool,
    /// Why the segment appended to may end in part of a record: a failed append that
    /// could not be undone. Appending after it would leave that part between whole
    /// records, which a restart refuses as damage; as the last bytes it is a torn tail.
    damaged: Option<String>,
}

/// Makes commits durable and deletes the segments they leave behind, beside the
/// [`Spool`] that appends (commits do not wait for an append that waits for trainers).
pub struct Committer {
    dir: PathBuf,
    segments: Segments,
}

/// What [`Spool::open`] found in the state directory.
pub struct Opened {
    /// The log, ready for appends after its last whole record.
    pub spool: Spool,
    /// The last commit, if any was made.
    pub commit: Option<Commit>,
    /// The records from the commit's segment on (every record without one).
    pub replay: Replay,
}

impl Spool {
    /// Opens the log in `dir` (creating both), deletes the segments a commit left behind,
    /// cuts off a torn last record, and returns the log with the last commit and a reader
    /// of the records still to admit (read as replayed: memory does not grow with the
    /// log). Segments of `segment_bytes` are begun from now on.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<Opened> {
        std::fs::create_dir_all(dir).map_err(|e| state_error(dir, &e))?;
        let commit = read_commit(dir)?;
        let mut segments = list_segments(dir)?;
        let head = read_head(dir)?;
        if let Some(newest) = head.filter(|&n| segments.last().is_none_or(|s| s.0 < n)) {
            let path = segment_path(dir, newest);
            return Err(state_error(
                &path,
                &format!(
                    "the spool's newest segment is missing: the rows acknowledged in it cannot be \
                     replayed (nothing was changed; {HEAD_FILE} names it)"
                ),
            ));
        }
        if segments.is_empty() {
            let first = commit.as_ref().map_or(0, Commit::keep_from);
            let path = segment_path(dir, first);
            File::create(&path).map_err(|e| state_error(&path, &e))?;
            sync_dir(dir).map_err(|e| state_error(dir, &e))?;
            segments.push((first, path));
        }
        let keep = commit.as_ref().map_or(0, Commit::keep_from);
        let deleted = trim(&mut segments, keep)?;
        if deleted > 0 {
            sync_dir(dir).map_err(|e| state_error(dir, &e))?;
        }
        if segments[0].0 > keep {
            return Err(state_error(
                &segments[0].1,
                &format!(
                    "the commit needs rows from {keep} on, but the oldest segment starts at \
                     row {}: segments are missing",
                    segments[0].0
                ),
            ));
        }
        let mut replay = Vec::new();
        let last = segments.len() - 1;
        for (i, (first, path)) in segments.iter().enumerate() {
            let file = OpenOptions::new()
                .read(true)
                .write(i == last)
                .open(path)
                .map_err(|e| state_error(path, &e))?;
            // A FIFO would block the scan forever, `/dev/null` read as an empty log.
            hydrant_operators::check_regular(&file).map_err(|e| state_error(path, &e))?;
            let len = file.metadata().map_err(|e| state_error(path, &e))?.len();
            let scanned = whole_records(&file).map_err(|e| state_error(path, &e))?;
            let whole = scanned.whole;
            if whole < len {
                // Only the last segment is appended to, and only its last record can be
                // torn: a short segment before it, or a bad record with whole ones after
                // it, is damage. Cutting it off would drop acknowledged rows.
                let why = match scanned.after {
                    _ if i < last => Some(""),
                    After::Whole => Some(", and whole records follow it"),
                    After::Unknown => Some(", and what follows it cannot be told from records"),
                    After::Nothing | After::Torn => None,
                };
                if let Some(why) = why {
                    return Err(state_error(
                        path,
                        &format!(
                            "the record at byte {whole} is damaged{why}: the spool cannot be \
                             replayed past it (nothing was changed; truncating the file to \
                             {whole} bytes would drop every record from there on)"
                        ),
                    ));
                }
                // Said, not done silently: a file that was never a spool (the wrong folder)
                // would otherwise be emptied unseen.
                hydrant_operators::log_line!(
                    "hydrant: {}: cut off a torn last record ({} of {len} bytes, from byte \
                     {whole}), as a crash mid-write leaves it",
                    crate::error::one_line_path(path),
                    len - whole
                );
                file.set_len(whole).map_err(|e| state_error(path, &e))?;
                file.sync_all().map_err(|e| state_error(path, &e))?;
            }
            replay.push((*first, path.clone(), whole));
        }
        let (_, path) = &segments[last];
        let mut file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| state_error(path, &e))?;
        let len = file
            .seek(SeekFrom::End(0))
            .map_err(|e| state_error(path, &e))?;
        let head_written = head == Some(segments[last].0);
        Ok(Opened {
            spool: Spool {
                dir: dir.to_path_buf(),
                segments: Arc::new(Mutex::new(segments)),
                file,
                len,
                segment_bytes,
                head_written,
                damaged: None,
            },
            commit,
            replay: Replay::new(replay),
        })
    }

    /// Appends a record whose rows start at stream row `row`, and syncs it to disk. A
    /// failed append (a full disk) is undone, so that no torn record sits before the ones
    /// appended after it.
    pub fn append(&mut self, record: &Record, row: u64) -> Result<()> {
        if let Some(why) = &self.damaged {
            return Err(state_error(
                &self.dir,
                &format!("the spool takes no more batches: {why}; restart the server"),
            ));
        }
        let bytes = encode(record)?;
        let current = lock(&self.segments).last().map_or(0, |s| s.0);
        // A segment holding rows is full: the next begins at this record (never two
        // segments of one first row, which a run of empty batches could ask for).
        if self.len >= self.segment_bytes && row > current {
            self.begin_segment(row)?;
        }
        if !self.head_written {
            self.write_head()?;
        }
        let path = lock(&self.segments)
            .last()
            .map(|s| s.1.clone())
            .unwrap_or_default();
        let written = self
            .file
            .write_all(&bytes)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            let undone = self
                .file
                .set_len(self.len)
                .and_then(|()| self.file.seek(SeekFrom::Start(self.len)))
                .map(drop);
            let (failed, damaged) = append_failed(path, &e, undone);
            self.damaged = damaged;
            return Err(failed);
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    fn begin_segment(&mut self, row: u64) -> Result<()> {
        let path = segment_path(&self.dir, row);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| write_error(&path, &e))?;
        // The new name is durable before a record in it is acknowledged.
        sync_dir(&self.dir).map_err(|e| state_error(&self.dir, &e))?;
        self.file = file;
        self.len = 0;
        self.head_written = false;
        lock(&self.segments).push((row, path));
        Ok(())
    }

    /// Records the segment appended to as the newest ([`HEAD_FILE`]).
    fn write_head(&mut self) -> Result<()> {
        let newest = lock(&self.segments).last().map_or(0, |s| s.0);
        write_head(&self.dir, newest)?;
        self.head_written = true;
        Ok(())
    }

    /// Segments on disk.
    pub fn segments(&self) -> usize {
        lock(&self.segments).len()
    }

    /// What makes commits, beside this log.
    pub fn committer(&self) -> Committer {
        Committer {
            dir: self.dir.clone(),
            segments: self.segments.clone(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Committer {
    /// A committer for a state directory without a spool (a followed folder's).
    pub fn standalone(dir: &Path) -> Self {
        Committer {
            dir: dir.to_path_buf(),
            segments: Arc::default(),
        }
    }

    /// Makes `commit` durable (the old one is replaced atomically), then deletes the
    /// segments wholly before its row. Returns how many were deleted.
    pub fn commit(&self, commit: &Commit) -> Result<usize> {
        let path = self.dir.join(COMMIT_FILE);
        let json = serde_json::to_vec(commit).map_err(|e| state_error(&path, &e))?;
        write_synced(&path, &json)
            .map_err(|e| state_error(&path, &format!("cannot save the commit: {e}")))?;
        // The segment appended to is never deleted: appends need no lock of this.
        let deleted = trim(&mut lock(&self.segments), commit.keep_from())?;
        if deleted > 0 {
            sync_dir(&self.dir).map_err(|e| state_error(&self.dir, &e))?;
        }
        Ok(deleted)
    }

    /// Segments on disk.
    pub fn segments(&self) -> usize {
        lock(&self.segments).len()
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use hydrant_flight::Origin;

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

    /// Appends `records` from row `row` on; returns the row after them.
    fn append_all(spool: &mut Spool, records: &[Record], mut row: u64) -> u64 {
        for r in records {
            spool.append(r, row).unwrap();
            row += r.rows();
        }
        row
    }

    /// A spool of `n` records of 3 rows each, in segments of one record each.
    fn one_record_segments(n: u64) -> (tempfile::TempDir, Vec<Record>, Opened) {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<_> = (0..n)
            .map(|i| Record::Batch(origin("p", i), batch(3 * i as i64)))
            .collect();
        let mut opened = Spool::open(dir.path(), 1).unwrap();
        append_all(&mut opened.spool, &records, 0);
        (dir, records, opened)
    }

    fn segment_names(dir: &Path) -> Vec<u64> {
        list_segments(dir)
            .unwrap()
            .into_iter()
            .map(|s| s.0)
            .collect()
    }

    /// A full disk whose failed append was undone is told apart (a producer gets
    /// RESOURCE_EXHAUSTED and may retry); one that could not be undone is not, and the
    /// spool then takes nothing more.
    #[test]
    fn a_failed_append_is_a_full_disk_only_when_undone() {
        use std::io::Error as Io;
        let (full, quota, other) = (
            Io::from_raw_os_error(libc::ENOSPC),
            Io::from_raw_os_error(libc::EDQUOT),
            Io::from_raw_os_error(libc::EIO),
        );
        let at = || PathBuf::from("pushed.spool");
        let failed = |e: &Io, undone: std::io::Result<()>| append_failed(at(), e, undone);
        assert!(matches!(
            failed(&full, Ok(())),
            (Error::StateFull { .. }, None)
        ));
        assert!(matches!(
            failed(&quota, Ok(())),
            (Error::StateFull { .. }, None)
        ));
        assert!(matches!(
            failed(&other, Ok(())),
            (Error::State { .. }, None)
        ));
        let (e, damaged) = failed(&full, Err(Io::from_raw_os_error(libc::EINVAL)));
        assert!(
            matches!(e, Error::State { .. }) && damaged.is_some(),
            "{e:?}"
        );
    }

    /// A write to a full device whose undo fails too (`/dev/full` cannot be truncated):
    /// the spool refuses every later append, and what was appended before stays whole.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_spool_whose_failed_append_cannot_be_undone_takes_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let mut opened = Spool::open(dir.path(), SEGMENT_BYTES).unwrap();
        let first = Record::Batch(origin("a", 0), batch(0));
        append_all(&mut opened.spool, std::slice::from_ref(&first), 0);
        let segment = std::mem::replace(
            &mut opened.spool.file,
            OpenOptions::new().write(true).open("/dev/full").unwrap(),
        );
        let next = Record::Batch(origin("a", 1), batch(3));
        let err = opened.spool.append(&next, 3).unwrap_err();
        assert!(matches!(err, Error::State { .. }), "{err:?}");
        assert!(err.to_string().contains("could not be undone"), "{err}");
        opened.spool.file = segment;
        let err = opened.spool.append(&next, 3).unwrap_err().to_string();
        assert!(err.contains("takes no more batches"), "{err}");
        drop(opened);
        let opened = Spool::open(dir.path(), SEGMENT_BYTES).unwrap();
        let read: Vec<_> = opened.replay.map(Result::unwrap).collect();
        assert_eq!(read, [first]);
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
            let mut opened = Spool::open(dir.path(), SEGMENT_BYTES).unwrap();
            assert!(opened.replay.is_empty() && opened.commit.is_none());
            assert_eq!(opened.replay.count(), 0);
            append_all(&mut opened.spool, &written, 0);
        }
        let path = segment_path(dir.path(), 0);
        let whole = std::fs::metadata(&path).unwrap().len();
        // A crash mid-append: part of a record after the whole ones.
        let torn = encode(&Record::Batch(origin("b", 7), batch(30))).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&torn[..torn.len() - 5]).unwrap();
        drop(f);
        let mut opened = Spool::open(dir.path(), SEGMENT_BYTES).unwrap();
        let read: Vec<_> = opened.replay.map(Result::unwrap).collect();
        assert_eq!(read, written);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
        // Appends go after the whole records.
        let record = Record::Batch(origin("b", 7), batch(30));
        opened.spool.append(&record, 9).unwrap();
        let opened = Spool::open(dir.path(), SEGMENT_BYTES).unwrap();
        assert_eq!(opened.replay.count(), 5);
    }

    /// Found by a hostile run: a FIFO in place of a state file blocked the start forever,
    /// and `/dev/zero` as `commit.json` grew the process until the kernel killed it; a
    /// segment that is `/dev/null` was read as an empty log. Each is refused, naming it.
    #[test]
    fn state_files_that_are_not_regular_files_are_refused() {
        let fifo = |path: &Path| {
            let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: `name` is a NUL-terminated path that lives across the call.
            assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        };
        for (file, make) in [
            (COMMIT_FILE, "fifo"),
            (HEAD_FILE, "fifo"),
            (COMMIT_FILE, "/dev/zero"),
            ("pushed-00000000000000000000.spool", "fifo"),
            ("pushed-00000000000000000000.spool", "/dev/null"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(file);
            match make {
                "fifo" => fifo(&path),
                device => std::os::unix::fs::symlink(device, &path).unwrap(),
            }
            let err = Spool::open(dir.path(), SEGMENT_BYTES)
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains(file) && err.contains("not a regular file"),
                "{file} as {make}: {err}"
            );
        }
    }

    /// Only the last record can be torn: a bad record with whole ones after it (a flipped
    /// byte, a broken length) is an error that changes nothing, where it used to be cut off
    /// with every record after it. A torn tail of zeros (a file system that grew the file
    /// before the bytes reached it) is still cut.
    #[test]
    fn a_damaged_record_before_whole_ones_is_an_error_not_a_torn_tail() {
        let records: Vec<_> = (0..5)
            .map(|i| Record::Batch(origin("p", i), batch(3 * i as i64)))
            .collect();
        let sizes: Vec<u64> = records
            .iter()
            .map(|r| encode(r).unwrap().len() as u64)
            .collect();
        let third = sizes[..2].iter().sum::<u64>();
        // A byte of the third record's body flipped, or its length broken.
        for (at, bytes) in [
            (third + 40, vec![0xffu8]),
            (third, vec![0xf0, 0xff, 0xff, 0xff]),
        ] {
            let dir = tempfile::tempdir().unwrap();
            append_all(
                &mut Spool::open(dir.path(), SEGMENT_BYTES).unwrap().spool,
                &records,
                0,
            );
            let path = segment_path(dir.path(), 0);
            let len = std::fs::metadata(&path).unwrap().len();
            let f = OpenOptions::new().write(true).open(&path).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, &bytes, at).unwrap();
            let err = Spool::open(dir.path(), SEGMENT_BYTES)
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains(&format!(
                    "record at byte {third} is damaged, and whole records"
                )) && err.contains("pushed-00000000000000000000.spool"),
                "{err}"
            );
            assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
        }
        let dir = tempfile::tempdir().unwrap();
        append_all(
            &mut Spool::open(dir.path(), SEGMENT_BYTES).unwrap().spool,
            &records,
            0,
        );
        let path = segment_path(dir.path(), 0);
        let whole = std::fs::metadata(&path).unwrap().len();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&vec![0u8; sizes[0] as usize]).unwrap();
        drop(f);
        let opened = Spool::open(dir.path(), SEGMENT_BYTES).unwrap();
        assert_eq!(
            opened.replay.map(Result::unwrap).collect::<Vec<_>>(),
            records
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
    }

    #[test]
    fn a_damaged_record_that_checks_out_is_an_error_when_replayed_not_a_silent_cut() {
        let dir = tempfile::tempdir().unwrap();
        let body = b"\x02\x00\x00\x00{}garbage";
        let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&xxhash_rust::xxh64::xxh64(body, 0).to_le_bytes());
        bytes.extend_from_slice(body);
        std::fs::write(segment_path(dir.path(), 0), bytes).unwrap();
        let mut replay = Spool::open(dir.path(), SEGMENT_BYTES).unwrap().replay;
        let err = replay.next().unwrap().unwrap_err().to_string();
        assert!(
            err.contains("pushed-00000000000000000000.spool") && err.contains("record at byte 0"),
            "{err}"
        );
        assert!(replay.next().is_none(), "nothing is read after an error");
    }

    #[test]
    fn segments_roll_and_a_commit_deletes_only_those_wholly_before_its_row() {
        let (dir, records, opened) = one_record_segments(5);
        // Each segment filled at its first record: one per record.
        assert_eq!(segment_names(dir.path()), [0, 3, 6, 9, 12]);
        let commit = Commit {
            step: 1,
            row: 7,
            admitted: [("p".to_string(), 4)].into(),
            keep: None,
            rows_in: None,
            batches_in: None,
        };
        // Rows 0..6 are wholly before row 7; the segment holding it stays.
        assert_eq!(opened.spool.committer().commit(&commit).unwrap(), 2);
        assert_eq!(segment_names(dir.path()), [6, 9, 12]);
        // A commit at an earlier row deletes nothing more.
        assert_eq!(
            opened
                .spool
                .committer()
                .commit(&Commit {
                    row: 6,
                    ..commit.clone()
                })
                .unwrap(),
            0
        );
        opened.spool.committer().commit(&commit).unwrap();
        drop(opened);
        let opened = Spool::open(dir.path(), 1).unwrap();
        assert_eq!(opened.commit, Some(commit));
        assert_eq!(opened.replay.first_row(), 6);
        let read: Vec<_> = opened.replay.map(Result::unwrap).collect();
        assert_eq!(read, records[2..]);
    }

    /// The newest segment gone is an error naming it (it looked like a spool that ended
    /// there); a spool an older server wrote, without the head file, still opens.
    #[test]
    fn a_lost_newest_segment_is_an_error_not_a_shorter_spool() {
        let (dir, records, opened) = one_record_segments(3);
        drop(opened);
        assert_eq!(segment_names(dir.path()), [0, 3, 6]);
        let newest = segment_path(dir.path(), 6);
        let kept = std::fs::read(&newest).unwrap();
        std::fs::remove_file(&newest).unwrap();
        let err = Spool::open(dir.path(), 1).err().unwrap().to_string();
        assert!(
            err.contains("pushed-00000000000000000006.spool")
                && err.contains(
                    "newest segment is missing: the rows acknowledged in it cannot be replayed"
                ),
            "{err}"
        );
        assert_eq!(segment_names(dir.path()), [0, 3], "nothing was changed");
        // Every segment gone is the same loss.
        let all = tempfile::tempdir().unwrap();
        std::fs::copy(dir.path().join(HEAD_FILE), all.path().join(HEAD_FILE)).unwrap();
        assert!(Spool::open(all.path(), 1).is_err());
        // Put back, it replays whole; without the head file (an older server's), too.
        std::fs::write(&newest, kept).unwrap();
        assert_eq!(Spool::open(dir.path(), 1).unwrap().replay.count(), 3);
        std::fs::remove_file(dir.path().join(HEAD_FILE)).unwrap();
        let mut opened = Spool::open(dir.path(), 1).unwrap();
        assert_eq!(opened.replay.count(), 3);
        // The next append records the head again.
        opened.spool.append(&records[0], 9).unwrap();
        assert_eq!(read_head(dir.path()).unwrap(), Some(9));
    }

    #[test]
    fn missing_or_damaged_segments_are_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<_> = (0..4).map(|i| Record::Batch(None, batch(i))).collect();
        append_all(&mut Spool::open(dir.path(), 1).unwrap().spool, &records, 0);
        // A segment gone from the middle: the replay stops at the gap.
        std::fs::remove_file(segment_path(dir.path(), 6)).unwrap();
        let replay = Spool::open(dir.path(), 1).unwrap().replay;
        let read: Vec<_> = replay.collect();
        assert_eq!(read.len(), 3);
        let err = read[2].as_ref().unwrap_err().to_string();
        assert!(
            err.contains("starts at row 9") && err.contains("ends at row 6"),
            "{err}"
        );
        // A segment before the last cut short: damage, not a torn tail.
        let path = segment_path(dir.path(), 3);
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        let err = Spool::open(dir.path(), 1).err().unwrap().to_string();
        assert!(
            err.contains("pushed-00000000000000000003.spool") && err.contains("damaged"),
            "{err}"
        );
        // A commit that needs rows no segment holds.
        let dir = tempfile::tempdir().unwrap();
        let commit = Commit {
            step: 1,
            row: 8,
            admitted: Default::default(),
            keep: None,
            rows_in: None,
            batches_in: None,
        };
        std::fs::write(
            dir.path().join(COMMIT_FILE),
            serde_json::to_vec(&commit).unwrap(),
        )
        .unwrap();
        File::create(segment_path(dir.path(), 9)).unwrap();
        let err = Spool::open(dir.path(), 1).err().unwrap().to_string();
        assert!(err.contains("segments are missing"), "{err}");
        // A commit file that is not one.
        std::fs::write(dir.path().join(COMMIT_FILE), b"{\"step\": -1}").unwrap();
        let err = Spool::open(dir.path(), 1).err().unwrap().to_string();
        assert!(err.contains(COMMIT_FILE), "{err}");
    }
}
