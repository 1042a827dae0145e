//! Following a folder: Parquet and Arrow IPC files that appear in it are admitted to one
//! endless epoch, as pushed batches are, in a deterministic order. Names starting with `_`
//! or `.` are ignored (Spark's committers write temporary files that way and rename them
//! into place), and so are other extensions; a file written in place is admitted once it
//! is complete (`settle.rs`).
//!
//! With a state directory, each admission is recorded in an append-only manifest
//! (`follow.manifest`, one JSON line per event, synced before the file's rows go
//! anywhere): a `begin` line with the file and the stream row its rows start at, an `end`
//! line with the rows admitted (and why the rest were skipped, for a bad file). A
//! restarted server admits the recorded files again in the recorded order — the same rows
//! at the same positions — from the last commit's row on, then follows new ones. Files
//! are the user's: they are never deleted.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use hydrant_flight::ServeError;

use super::push::Pushed;
use super::run::lock;
use super::spark_log::SparkLog;
use super::stream::Runs;
use crate::error::{Error, Result};
mod manifest;
mod read;
mod settle;
pub(super) use manifest::{Admission, Line, Manifest};
use read::Read;
pub(super) use read::Reader;
pub(super) use settle::Settle;

/// The manifest's file name in the state directory.
pub const MANIFEST_FILE: &str = "follow.manifest";

/// How often the folder is listed.
pub const POLL: Duration = Duration::from_millis(20);

/// The xxHash64 of the file at `path`, read in blocks.
fn checksum(path: &Path) -> std::io::Result<u64> {
    let mut file = hydrant_operators::open_regular(path)?;
    let mut hasher = xxhash_rust::xxh64::Xxh64::new(0);
    let mut block = vec![0u8; 1 << 20];
    loop {
        match std::io::Read::read(&mut file, &mut block) {
            Ok(0) => return Ok(hasher.digest()),
            Ok(n) => hasher.update(&block[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Skipped files `status` lists, the latest last.
const SKIPPED_SHOWN: usize = 16;

/// What `status` reports of a followed folder.
#[derive(Default)]
pub(super) struct FollowCounts {
    pub files: AtomicU64,
    pub skipped_files: AtomicU64,
    /// The latest skipped files and why.
    pub skipped: Mutex<Vec<(String, String)>>,
    /// Why the folder cannot be listed now (deleted, renamed away, no permission).
    pub unreadable: Mutex<Option<String>>,
    /// Why admissions cannot be recorded now (the state directory's disk is full).
    pub unrecorded: Mutex<Option<String>>,
}

impl FollowCounts {
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "files": self.files.load(Ordering::Relaxed),
            "skipped_files": self.skipped_files.load(Ordering::Relaxed),
            "skipped": lock(&self.skipped).iter().map(|(file, error)| {
                serde_json::json!({"file": file, "error": error})
            }).collect::<Vec<_>>(),
            "folder_error": *lock(&self.unreadable),
            "record_error": *lock(&self.unrecorded),
        })
    }

    /// Records whether admissions can be recorded (`error` says why not), telling the log
    /// once when they cannot, and once when they can again: nothing new is admitted
    /// meanwhile.
    fn recorded(&self, error: Option<String>) {
        let mut unrecorded = lock(&self.unrecorded);
        match (error, unrecorded.is_some()) {
            (Some(why), false) => {
                hydrant_operators::log_line!(
                    "hydrant: {why}; no file is admitted until there is room"
                );
                *unrecorded = Some(why);
            }
            (None, true) => {
                hydrant_operators::log_line!("hydrant: admissions are recorded again");
                *unrecorded = None;
            }
            _ => {}
        }
    }

    /// Records whether the folder could be listed (`error` says why not), telling the log
    /// once when it stops being readable, and once when it is again: nothing new is
    /// admitted meanwhile. The error names no path: the server's paths are not shown.
    fn listed(&self, error: Option<&std::io::Error>) {
        let mut unreadable = lock(&self.unreadable);
        match (error, unreadable.is_some()) {
            (Some(e), false) => {
                let why = format!("the followed folder cannot be listed: {e}");
                hydrant_operators::log_line!("hydrant: {why}; no file is admitted until it can");
                *unreadable = Some(why);
            }
            (None, true) => {
                hydrant_operators::log_line!("hydrant: the followed folder can be listed again");
                *unreadable = None;
            }
            _ => {}
        }
    }

    fn skip(&self, file: &str, error: &str) {
        hydrant_operators::log_line!("hydrant: skipping the rest of followed file {file}: {error}");
        metrics::counter!(crate::metrics::FOLLOW_SKIPPED).increment(1);
        self.list_skipped(file, error);
    }

    /// Counts and lists the files a server before a restart skipped (from the rows its
    /// manifest records) that are not read again: those wholly before the commit's row.
    pub fn skipped_before(&self, admissions: &[Admission]) {
        for a in admissions {
            if let Some(error) = &a.error {
                self.list_skipped(&a.file, error);
            }
        }
    }

    fn list_skipped(&self, file: &str, error: &str) {
        self.skipped_files.fetch_add(1, Ordering::Relaxed);
        let mut skipped = lock(&self.skipped);
        skipped.push((file.to_string(), error.to_string()));
        let over = skipped.len().saturating_sub(SKIPPED_SHOWN);
        skipped.drain(..over);
    }
}

/// The names of the files listed so far, with the inode each had when first listed
/// (`None`: recorded before a restart, not listed yet).
type Seen = HashMap<String, Option<u64>>;

/// Admits the files of a folder as they appear, on a thread of its own.
pub(super) struct Follower {
    pub pushed: Weak<Pushed>,
    /// Shared with `end_ingest`, which records the input's end in it.
    pub manifest: Option<Arc<Mutex<Manifest>>>,
    pub counts: Arc<FollowCounts>,
    /// The log of a Spark file sink writing into the folder, once one is seen: then only
    /// the files of its committed batches are admitted.
    pub spark: Option<SparkLog>,
    /// How the files are decoded (ahead of their admission, on a thread of its own).
    pub read: Reader,
    /// The manifest says the input was ended: after the replay it ends there again (these
    /// are the runs to tell), and no new file is followed.
    pub end_after_replay: Option<Weak<Runs>>,
    /// New files not yet complete (written in place), looked at again each poll.
    pub settle: Settle,
    /// Names that are not UTF-8, reported as skipped once.
    pub odd_names: HashSet<std::ffi::OsString>,
    /// A file's end that could not be recorded (a full disk): recorded before anything
    /// else is admitted.
    pub pending_end: Option<Line>,
    /// Files not admitted because an admission could not be recorded: listed again.
    pub relist: Vec<String>,
}

/// Batches decoded ahead of their admission.
const READ_AHEAD: usize = 2;

/// Why following stopped.
enum Stop {
    /// The pipeline is gone or its input was ended.
    Over,
    /// The manifest could not be written: nothing more may be admitted.
    Failed(String),
    /// The manifest's disk is full: nothing more is admitted until a line can be
    /// appended; `admitted` says whether the file's rows went in already (its end is
    /// still to be recorded) or not (it is listed again).
    Full { why: String, admitted: bool },
}

/// A manifest append's failure: a full disk waits for room, anything else stops.
fn append_failed(e: Error, admitted: bool) -> Stop {
    match full(&e) {
        Some(why) => Stop::Full { why, admitted },
        None => Stop::Failed(e.to_string()),
    }
}

/// Why an append found the disk full, naming the manifest in the state directory rather
/// than by the server's path (it is shown in `status`); `None` for another failure.
fn full(e: &Error) -> Option<String> {
    let Error::StateFull { path, reason } = e else {
        return None;
    };
    Some(format!("{}: {reason}", super::spool::in_state_dir(path)))
}

impl Follower {
    /// Admits `replay` (from the manifest) again, then every new file, until the pipeline
    /// goes or its input is ended.
    /// (`seen` holds the files recorded before, `replay` those of them to admit again.)
    pub fn run(mut self, seen: HashSet<String>, replay: Vec<Admission>) {
        let mut seen: Seen = seen.into_iter().map(|n| (n, None)).collect();
        let mut todo: Vec<(Admission, bool)> = replay.into_iter().map(|a| (a, true)).collect();
        loop {
            match self.admit_all(std::mem::take(&mut todo)) {
                Ok(()) => self.counts.recorded(None),
                Err(Stop::Over) => return,
                Err(Stop::Full { why, .. }) => {
                    // Listed again once a line can be recorded: their rows went nowhere.
                    for file in self.relist.drain(..) {
                        seen.remove(&file);
                    }
                    self.counts.recorded(Some(why));
                }
                Err(Stop::Failed(e)) => return self.stop(e),
            }
            if let Some(runs) = self.end_after_replay.take() {
                // Ended before the restart: it ends at the same row again.
                if let (Some(p), Some(runs)) = (self.pushed.upgrade(), runs.upgrade())
                    && let Err(e) = p.end_replayed(&runs)
                {
                    hydrant_operators::log_line!(
                        "hydrant: ending the followed input again failed: {e}"
                    );
                }
                return;
            }
            std::thread::sleep(POLL);
            let Some(pushed) = self.pushed.upgrade() else {
                return;
            };
            drop(pushed);
            if let Some(end) = self.pending_end.take() {
                let appended = self.manifest.as_ref().map(|m| lock(m).append(&end));
                match appended.map(|r| r.map_err(|e| full(&e).ok_or(e))) {
                    Some(Err(Ok(why))) => {
                        self.pending_end = Some(end);
                        self.counts.recorded(Some(why));
                        continue;
                    }
                    Some(Err(Err(e))) => return self.stop(e.to_string()),
                    _ => {
                        self.counts.files.fetch_add(1, Ordering::Relaxed);
                        self.counts.recorded(None);
                    }
                }
            }
            // New files in name order; each takes its rows from where the last ended.
            todo = self
                .new_files(&mut seen)
                .into_iter()
                .map(|file| {
                    let a = Admission {
                        file,
                        row: 0,
                        rows: None,
                        bytes: None,
                        sum: None,
                        error: None,
                    };
                    (a, false)
                })
                .collect();
        }
    }

    /// Stops following for good: the input fails with `why`, told in the log; unless the
    /// server is shutting down (or its pipeline is gone already), which is why an
    /// admission fails then.
    fn stop(&self, why: String) {
        let Some(pushed) = self.pushed.upgrade() else {
            return;
        };
        if pushed.counts.closing.load(Ordering::SeqCst) {
            return;
        }
        hydrant_operators::log_line!(
            "hydrant: following {} stopped: {why}",
            self.read.dir.display()
        );
        pushed.fail(why);
    }

    /// Eligible files not seen yet: in name order, or as a Spark file sink's log commits
    /// them. A file seen before that is now another file (its inode changed: one renamed
    /// over it, or the folder made again) is told once: its rows are not read.
    fn new_files(&mut self, seen: &mut Seen) -> Vec<String> {
        let entries = std::fs::read_dir(&self.read.dir);
        self.counts.listed(entries.as_ref().err());
        let Ok(entries) = entries else {
            return Vec::new();
        };
        if self.spark.is_none() {
            self.spark = SparkLog::find(&self.read.dir);
        }
        if let Some(log) = &mut self.spark {
            let mut names = Vec::new();
            for file in log.new_files() {
                match file {
                    Ok(f) if !eligible(&f) => {
                        self.counts.skip(&f, "not a .parquet, .arrow or .ipc file");
                    }
                    Ok(f) => {
                        if seen.insert(f.clone(), None).is_none() {
                            names.push(f);
                        }
                    }
                    Err(e) => self.counts.skip(super::spark_log::LOG_DIR, &e),
                }
            }
            return names;
        }
        let (mut names, mut inodes) = (Vec::new(), HashMap::new());
        for entry in entries.filter_map(|e| e.ok()) {
            let folder = entry.file_type().is_ok_and(|t| t.is_dir());
            match entry.file_name().into_string() {
                // Told once, never admitted: a folder is not read (see `Reader::file`),
                // and an admission would be recorded, and checked at a restart.
                Ok(n) if folder && eligible(&n) && seen.insert(n.clone(), None).is_none() => {
                    let why = format!(
                        "{n} is a folder: a followed folder's own files are read, not its \
                         sub-folders' (move the part files in, or follow the sub-folder)"
                    );
                    self.counts.skip(&n, &why);
                }
                Ok(n) if !folder && eligible(&n) => {
                    let inode = std::os::unix::fs::DirEntryExt::ino(&entry);
                    match seen.get_mut(&n) {
                        None => {
                            inodes.insert(n.clone(), inode);
                            names.push(n);
                        }
                        // Recorded before a restart: known from its first listing on.
                        Some(known @ None) => *known = Some(inode),
                        Some(Some(known)) if *known != inode => {
                            *known = inode;
                            let why = "another file was put in its place after it was \
                                       admitted: its rows are not read (write each new file \
                                       under a new name)";
                            self.counts.skip(&n, why);
                        }
                        Some(Some(_)) => {}
                    }
                }
                Ok(_) => {}
                // Told once, not taken: the manifest and the clients name files in UTF-8.
                Err(odd) => {
                    let shown = odd.to_string_lossy().into_owned();
                    if eligible(&shown) && self.odd_names.insert(odd) {
                        self.counts
                            .skip(&shown, "its name is not UTF-8; rename it to be admitted");
                    }
                }
            }
        }
        names.sort();
        let names = self.settle.ready(&self.read.dir, names, Instant::now());
        seen.extend(names.iter().map(|n| (n.clone(), inodes.get(n).copied())));
        names
    }

    /// Admits `todo` in order, decoded ahead on a thread of its own.
    fn admit_all(&mut self, todo: Vec<(Admission, bool)>) -> std::result::Result<(), Stop> {
        if todo.is_empty() {
            return Ok(());
        }
        let files: Vec<String> = todo.iter().map(|(a, _)| a.file.clone()).collect();
        let reader = self.read.clone();
        std::thread::scope(|scope| {
            let (tx, rx) = crossbeam_channel::bounded(READ_AHEAD);
            scope.spawn(move || reader.run(&files, tx));
            // An early return drops `rx`: the reader's next send fails and it ends.
            for (i, (a, replayed)) in todo.iter().enumerate() {
                if let Err(stop) = self.admit(a, *replayed, &rx) {
                    if let Stop::Full { admitted, .. } = &stop {
                        let next = i + usize::from(*admitted);
                        self.relist = todo[next..].iter().map(|(a, _)| a.file.clone()).collect();
                    }
                    return Err(stop);
                }
            }
            Ok(())
        })
    }

    /// Admits one file, whose batches `rx` brings next: recorded (unless `replayed` from
    /// the manifest), then its rows (as many as recorded, when they were).
    fn admit(
        &mut self,
        a: &Admission,
        replayed: bool,
        rx: &Receiver<Read>,
    ) -> std::result::Result<(), Stop> {
        let pushed = self.pushed.upgrade().ok_or(Stop::Over)?;
        if pushed.counts.ended.load(Ordering::SeqCst) {
            return Err(Stop::Over); // nothing is admitted after `end_ingest`
        }
        let since = Instant::now();
        let row = pushed.next_row();
        if replayed && a.row != row {
            let why = format!(
                "the manifest puts {} at row {}, but the files before it end at row {row}",
                a.file, a.row
            );
            return Err(Stop::Failed(why));
        }
        let bytes = std::fs::metadata(self.read.dir.join(&a.file)).map(|m| m.len());
        if replayed
            && let Some(was) = a.bytes
            && bytes.as_ref().ok() != Some(&was)
        {
            let why = match &bytes {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => format!(
                    "{} is gone; it was {was} bytes when first admitted, so the stream \
                     cannot be admitted again (a followed file must stay until every \
                     trainer has committed past it; or --follow names another folder than \
                     the one the stream was recorded from)",
                    a.file
                ),
                now => format!(
                    "{} {}; it was {was} bytes when first admitted: it was changed or \
                     replaced since, so the stream cannot be admitted again (a followed \
                     file must not be written over)",
                    a.file,
                    match now {
                        Ok(n) => format!("is {n} bytes"),
                        Err(e) => format!("cannot be read ({})", crate::error::one_line(e)),
                    }
                ),
            };
            return Err(Stop::Failed(why));
        }
        // Only with a manifest to check it against: a whole extra read of the file, most
        // often still in the page cache (it was just written, and is read next).
        // (Not on replay of an admission recorded without one: nothing to check it with.)
        let sum = match &self.manifest {
            Some(_) if !replayed || a.sum.is_some() => checksum(&self.read.dir.join(&a.file)).ok(),
            _ => None,
        };
        if replayed
            && let Some(was) = a.sum
            && sum != Some(was)
        {
            let why = format!(
                "{} holds other bytes than when first admitted (at the same length): it was \
                 changed or replaced since, so the stream cannot be admitted again (a \
                 followed file must not be written over)",
                a.file
            );
            return Err(Stop::Failed(why));
        }
        if let Some(m) = &self.manifest
            && !replayed
        {
            let begin = Line::Begin {
                file: a.file.clone(),
                row,
                bytes: bytes.ok(),
                sum,
            };
            lock(m)
                .append(&begin)
                .map_err(|e| append_failed(e, false))?;
        }
        let (rows, error) = self.admit_rows(&pushed, rx, a.rows, since, &a.file)?;
        // Clients are told the file's name in the folder, not the server's path.
        let path = self.read.dir.join(&a.file).display().to_string();
        let mut error = error.map(|e| e.replace(&path, &a.file));
        if self.settle.unfinished(&a.file) && error.is_none() {
            // Read to its last whole message without an error: the rest never came.
            error = Some(format!(
                "{} was not whole {} s after it last changed (no footer or end-of-stream \
                 marker); its rows up to there were admitted",
                a.file,
                settle::SETTLE.as_secs()
            ));
        }
        if let Some(e) = &error {
            self.counts.skip(&a.file, e);
        }
        if let Some(want) = a.rows
            && rows != want
        {
            let why = format!("{} gave {rows} rows, {want} when first admitted", a.file);
            return Err(Stop::Failed(why));
        }
        if let Some(m) = &self.manifest
            && a.rows.is_none()
        {
            let end = Line::End {
                file: a.file.clone(),
                rows,
                error,
            };
            if let Err(e) = lock(m).append(&end) {
                self.pending_end = Some(end);
                return Err(append_failed(e, true));
            }
        }
        self.counts.files.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Admits the rows of `file`, which `rx` brings next (at most `limit`), whose admission
    /// began at `since`; returns how many, and why it stopped short, if it did. A file
    /// that cannot be read from some batch on is skipped from there (the rows before it
    /// stay admitted, as they were delivered).
    fn admit_rows(
        &self,
        pushed: &Pushed,
        rx: &Receiver<Read>,
        limit: Option<u64>,
        since: Instant,
        file: &str,
    ) -> std::result::Result<(u64, Option<String>), Stop> {
        let (mut rows, mut first, mut error, mut open) = (0u64, true, None, true);
        loop {
            let read = rx
                .recv()
                .map_err(|_| Stop::Failed("the reader of the followed files stopped".into()))?;
            let mut data = match read {
                Read::Done => return Ok((rows, error)),
                Read::Failed(e) => {
                    if open {
                        error = Some(e);
                    }
                    open = false;
                    continue;
                }
                // The rest of a file that stopped short is let go.
                Read::Batch(_) if !open => continue,
                Read::Batch(data) => data,
            };
            if let Some(limit) = limit {
                let left = limit.saturating_sub(rows) as usize;
                if left == 0 {
                    open = false;
                    continue;
                }
                data = data.slice(0, left.min(data.num_rows()));
            }
            let n = data.num_rows() as u64;
            match pushed.admit_followed(data, since, std::mem::take(&mut first)) {
                Ok(()) => rows += n,
                Err(ServeError::InvalidArgument(e)) => (error, open) = (Some(e), false),
                // Ended (`end_ingest`, a signal to `run --follow`) part-way through the
                // file: said, as a hostile run found the rest of a file left out without a
                // word. Or failed, and said so already.
                Err(_) if pushed.counts.ended.load(Ordering::SeqCst) => {
                    let why = format!(
                        "the input was ended while it was being admitted: its first {rows} \
                         rows were admitted, and the rest will not be"
                    );
                    self.counts.skip(file, &why);
                    return Err(Stop::Over);
                }
                Err(_) if pushed.replay_failed().is_some() => return Err(Stop::Over),
                // The stream cannot go on (its first statistics cannot be fitted, the
                // dataflow failed): said in the log and to every trainer, not let go.
                Err(e) => return Err(Stop::Failed(e.to_string())),
            }
        }
    }
}

/// Whether a file name in the followed folder is one to admit.
fn eligible(name: &str) -> bool {
    let ext = Path::new(name).extension().and_then(|e| e.to_str());
    !name.starts_with(['_', '.']) && matches!(ext, Some("parquet" | "arrow" | "ipc"))
}

/// The error `follow` gives for a folder it cannot follow.
pub(super) fn check_folder(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "--follow {}: not a folder",
            dir.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::io::Write;

    use super::manifest::Recorded;
    use super::*;

    #[test]
    fn only_complete_data_files_are_eligible() {
        for name in ["part-0.parquet", "b.arrow", "c.ipc"] {
            assert!(eligible(name), "{name}");
        }
        for name in [
            "_temporary",
            "_SUCCESS",
            ".part-0.parquet.crc",
            "x.csv",
            "part-0",
        ] {
            assert!(!eligible(name), "{name}");
        }
    }

    #[test]
    fn an_ended_input_replays_only_the_rows_before_its_end() {
        let a = |row, rows| Admission {
            file: format!("f{row}"),
            row,
            rows,
            bytes: None,
            sum: None,
            error: None,
        };
        let ended = Recorded {
            admissions: vec![a(0, Some(10)), a(10, None), a(25, None)],
            ended: Some(20),
        };
        let got: Vec<_> = ended
            .into_replay()
            .iter()
            .map(|a| (a.row, a.rows))
            .collect();
        assert_eq!(got, [(0, Some(10)), (10, Some(10))]);
        let open = Recorded {
            admissions: vec![a(0, None)],
            ended: None,
        };
        assert_eq!(open.into_replay()[0].rows, None);
    }

    #[test]
    fn the_manifest_reads_back_and_a_torn_line_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut m, read) = Manifest::open(dir.path()).unwrap();
            assert_eq!(read, Recorded::default());
            for line in [
                Line::Begin {
                    file: "a.parquet".into(),
                    row: 0,
                    bytes: Some(7),
                    sum: None,
                },
                Line::End {
                    file: "a.parquet".into(),
                    rows: 10,
                    error: None,
                },
                Line::Begin {
                    file: "b.parquet".into(),
                    row: 10,
                    bytes: None,
                    sum: None,
                },
            ] {
                m.append(&line).unwrap();
            }
        }
        let path = dir.path().join(MANIFEST_FILE);
        let whole = std::fs::metadata(&path).unwrap().len();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"event":"end","file":"b.parq"#).unwrap();
        drop(f);
        let (mut m, read) = Manifest::open(dir.path()).unwrap();
        assert_eq!(read.ended, None);
        assert_eq!(
            read.admissions,
            [
                Admission {
                    file: "a.parquet".into(),
                    row: 0,
                    rows: Some(10),
                    bytes: Some(7),
                    sum: None,
                    error: None,
                },
                Admission {
                    file: "b.parquet".into(),
                    row: 10,
                    rows: None,
                    bytes: None,
                    sum: None,
                    error: None,
                },
            ]
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
        // Ended at row 14: b is replayed only that far.
        m.record_end(14).unwrap();
        drop(m);
        let (_, read) = Manifest::open(dir.path()).unwrap();
        assert_eq!(read.ended, Some(14));
        let rows: Vec<_> = read.into_replay().iter().map(|a| a.rows).collect();
        assert_eq!(rows, [Some(10), Some(4)]);
        // A whole line that is not one is damage, not a torn tail.
        std::fs::write(&path, "{\"event\":\"end\",\"file\":\"z\",\"rows\":1}\n").unwrap();
        let err = Manifest::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("has no `begin`"), "{err}");
    }
}
