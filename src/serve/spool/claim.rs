//! What a server holds of its state directory: the directory itself, locked (two servers
//! appending to one spool would interleave their records, and a second server would cut
//! the first one's "torn" tail), and the stream geometry it was written with: a restarted
//! server must cut the stream into the same steps, or a trainer resuming at its last
//! step + 1 gets rows it had, or misses some (a server that came back with half the batch
//! size redelivered half of what had been read).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;

use rustix::fs::{FlockOperation, flock};

use serde::{Deserialize, Serialize};

use super::{read_json, state_error, write_synced};
use crate::delivery::{LastBatch, Placement, STREAM_ORDER_VERSION};
use crate::error::Result;

/// The file in a state directory that records its stream's geometry.
pub const GEOMETRY_FILE: &str = "stream.json";

/// What feeds a state directory's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Batches pushed over Flight (DoPut), spooled there.
    Pushed,
    /// Files admitted from a followed folder, recorded in its manifest.
    Followed,
}

/// The stream a state directory holds: its pipeline and source, and what featurizes it.
#[derive(Debug, Clone, Copy)]
pub struct Stream<'a> {
    /// The pipeline's name.
    pub pipeline: &'a str,
    /// What feeds it.
    pub source: Source,
    /// A hash of the pipeline's groups and label (`FeaturePlan::features_hash`).
    pub features: u64,
    /// The version of the state it is served with; `None` where its statistics refresh
    /// (the versions it made are checked against `--state` by themselves).
    pub state_version: Option<u64>,
}

/// What decides which stream rows each step holds, and whose stream it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Geometry {
    order_version: u32,
    world_size: usize,
    batch_size: usize,
    /// The shuffle window and seed; `None` in input order.
    shuffle_window: Option<u64>,
    seed: Option<u64>,
    /// The pipeline and its source (a followed folder's state taken for pushed input's
    /// would serve one stream's commit over the other's rows); `None` in a file written
    /// before they were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pipeline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<Source>,
    /// What the stream's steps hold and how the last is cut: a restart with another
    /// pipeline chain, state or `--last-batch` would deliver other contents under the
    /// same steps. `None` in a file written before they were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_batch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    features: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state_version: Option<u64>,
}

impl Geometry {
    fn of(placement: &Placement, stream: Stream<'_>) -> Self {
        Geometry {
            order_version: STREAM_ORDER_VERSION,
            world_size: placement.world_size(),
            batch_size: placement.batch_size(),
            shuffle_window: placement.shuffled().then(|| placement.window()),
            // In input order the seed places nothing.
            seed: placement.shuffled().then(|| placement.seed()),
            pipeline: Some(stream.pipeline.to_string()),
            source: Some(stream.source),
            last_batch: Some(match placement.last_batch() {
                LastBatch::Pad => "pad".into(),
                LastBatch::Drop => "drop".into(),
            }),
            features: Some(stream.features),
            state_version: stream.state_version,
        }
    }

    /// What differs from `now`, as `name was A, is B`: the options that cut the stream,
    /// and the pipeline and source where both files record them.
    fn differences(&self, now: &Geometry) -> Vec<String> {
        let or_none = |w: Option<u64>| w.map_or("none".to_string(), |w| w.to_string());
        [
            (
                "order version",
                self.order_version.to_string(),
                now.order_version.to_string(),
            ),
            (
                "--ranks",
                self.world_size.to_string(),
                now.world_size.to_string(),
            ),
            (
                "--batch-size",
                self.batch_size.to_string(),
                now.batch_size.to_string(),
            ),
            (
                "--shuffle-window",
                or_none(self.shuffle_window),
                or_none(now.shuffle_window),
            ),
            ("--seed", or_none(self.seed), or_none(now.seed)),
        ]
        .into_iter()
        .chain(recorded_in_both(
            "the pipeline",
            self.pipeline.clone(),
            now.pipeline.clone(),
        ))
        .chain(recorded_in_both(
            "the input",
            self.source.map(source_name),
            now.source.map(source_name),
        ))
        .chain(recorded_in_both(
            "--last-batch",
            self.last_batch.clone(),
            now.last_batch.clone(),
        ))
        .chain(recorded_in_both(
            "the hash of the pipeline's groups, steps and label",
            self.features,
            now.features,
        ))
        .chain(recorded_in_both(
            "the --state version",
            self.state_version,
            now.state_version,
        ))
        .filter(|(_, was, is)| was != is)
        .map(|(name, was, is)| format!("{name} was {was}, is {is}"))
        .collect()
    }
}

/// `(name, was, is)` where both files record the value: a file written before it was
/// recorded fits any.
fn recorded_in_both<T: ToString>(
    name: &'static str,
    was: Option<T>,
    is: Option<T>,
) -> Option<(&'static str, String, String)> {
    Some((name, was?.to_string(), is?.to_string()))
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::Pushed => "pushed",
        Source::Followed => "a followed folder",
    }
}

/// The lock file in a state directory, holding its server's process id.
pub const LOCK_FILE: &str = ".lock";

/// A state directory held by this server until it is dropped (or the process ends, however
/// it ends: the lock is the kernel's).
#[derive(Debug)]
pub struct Claim {
    _lock: File,
    dir: std::path::PathBuf,
}

impl Claim {
    /// The state directory held.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Takes `dir` (creating it) for this server: refused while another server holds it,
/// if it was written with another stream geometry than `placement`'s, and if it holds
/// something else than a server's state (see [`check_is_state`]) or a commit that cannot
/// be read, before anything is written there.
pub fn claim(dir: &Path, placement: &Placement, stream: Stream<'_>) -> Result<Claim> {
    check_is_state(dir)?;
    // A damaged commit is refused again once the directory is held; read here too, it
    // leaves no lock or geometry file behind in a directory that cannot be served.
    super::read_commit(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| state_error(dir, &e))?;
    let path = dir.join(LOCK_FILE);
    // Whether a server that records the geometry held this directory before (it takes
    // the lock before it writes anything else).
    let held_before = path.exists();
    let mut lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| state_error(&path, &e))?;
    match flock(&lock, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            let holder = holder.trim();
            let by = if holder.chars().all(|c| c.is_ascii_digit()) && !holder.is_empty() {
                format!(" (process {holder})")
            } else {
                String::new()
            };
            return Err(state_error(
                dir,
                &format!("is in use by another server{by}: one server per --state-dir"),
            ));
        }
        // A file system without locks (some NFS or FUSE mounts): said as it is.
        Err(e) => return Err(state_error(&path, &format!("cannot be locked: {e}"))),
    }
    let pid = std::process::id().to_string();
    lock.set_len(0)
        .and_then(|()| lock.rewind())
        .and_then(|()| lock.write_all(pid.as_bytes()))
        .map_err(|e| state_error(&path, &e))?;
    check_geometry(dir, placement, stream, held_before)?;
    Ok(Claim {
        _lock: lock,
        dir: dir.to_path_buf(),
    })
}

/// Refuses a `dir` that holds files but none a server writes: a mistyped `--state-dir`
/// naming a data folder or a home directory would otherwise get a lock, a geometry file
/// and a spool segment among the user's files. A new, missing or empty folder is fine;
/// hidden entries and `lost+found` (a fresh mount point) do not count.
fn check_is_state(dir: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(state_error(dir, &e)),
    };
    let mut foreign = None;
    for entry in entries {
        let name = entry.map_err(|e| state_error(dir, &e))?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "lost+found" {
            continue;
        }
        if is_state_file(&name) {
            return Ok(());
        }
        foreign.get_or_insert_with(|| name.into_owned());
    }
    match foreign {
        None => Ok(()),
        Some(name) => Err(state_error(
            dir,
            &format!(
                "holds files but no server state ({name:?}, for one): give --state-dir a new \
                 or empty folder, or the one an earlier server wrote"
            ),
        )),
    }
}

/// A file of a server's state in `dir` other than the geometry file, if there is one.
fn state_beside(dir: &Path) -> Result<Option<String>> {
    for entry in std::fs::read_dir(dir).map_err(|e| state_error(dir, &e))? {
        let name = entry.map_err(|e| state_error(dir, &e))?.file_name();
        let name = name.to_string_lossy();
        if is_state_file(&name) && name.strip_suffix(".tmp").unwrap_or(&name) != GEOMETRY_FILE {
            return Ok(Some(name.into_owned()));
        }
    }
    Ok(None)
}

/// Whether `name` is a file a server writes in its state directory (or its temporary
/// file while it is written).
fn is_state_file(name: &str) -> bool {
    use super::COMMIT_FILE;
    use crate::serve::MANIFEST_FILE;
    use crate::serve::refresh::VERSIONS_FILE;
    let name = name.strip_suffix(".tmp").unwrap_or(name);
    let numbered = |prefix: &str, suffix: &str| {
        name.strip_prefix(prefix)
            .and_then(|n| n.strip_suffix(suffix))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    [
        GEOMETRY_FILE,
        COMMIT_FILE,
        MANIFEST_FILE,
        VERSIONS_FILE,
        super::HEAD_FILE,
    ]
    .contains(&name)
        || super::files::segment_row(name).is_some()
        || numbered("state-", ".json")
        || numbered("stats-", ".json")
}

/// Checks that `dir` was written with `placement`'s stream geometry, or records it there
/// if the directory has none yet (a new one, or one an older server wrote). `held_before`:
/// the directory has a lock file from an earlier server, which recorded its geometry.
fn check_geometry(
    dir: &Path,
    placement: &Placement,
    stream: Stream<'_>,
    held_before: bool,
) -> Result<()> {
    let path = dir.join(GEOMETRY_FILE);
    let now = Geometry::of(placement, stream);
    match read_json::<Geometry>(&path)? {
        Some(was) => {
            let differ = was.differences(&now);
            if differ.is_empty() {
                return Ok(());
            }
            Err(state_error(
                &path,
                &format!(
                    "it was written for another stream ({}): serve with what it was written \
                     with, or start with an empty --state-dir",
                    differ.join(", ")
                ),
            ))
        }
        // A server that writes the spool's head file wrote this one before it: gone, it
        // was deleted, and whatever geometry the spool was cut with is unknown.
        None if dir.join(super::HEAD_FILE).exists() => Err(state_error(
            &path,
            &format!(
                "is missing, but {} is there, which a server writes after it: the options \
                 the spool was cut with are unknown; restore the file, or start with an \
                 empty --state-dir (its spooled rows are then not served)",
                super::HEAD_FILE
            ),
        )),
        // A server that took the lock recorded the geometry before it wrote any state
        // (a followed folder's manifest, a commit): gone, it was deleted.
        None if held_before && let Some(name) = state_beside(dir)? => Err(state_error(
            &path,
            &format!(
                "is missing, but an earlier server that writes it held this directory \
                 ({LOCK_FILE} is there) and left its state ({name:?}, for one): the options \
                 its steps were cut with are unknown; restore the file, or start with an \
                 empty --state-dir"
            ),
        )),
        None => {
            let json = serde_json::to_vec(&now).map_err(|e| state_error(&path, &e))?;
            write_synced(&path, &json).map_err(|e| state_error(&path, &e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUSHED: Stream<'static> = Stream {
        pipeline: "p",
        source: Source::Pushed,
        features: 11,
        state_version: Some(21),
    };

    #[test]
    fn a_directory_is_held_by_one_server_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let placement = Placement::new(2, 100, LastBatch::Pad, 0, None).unwrap();
        let held = claim(dir.path(), &placement, PUSHED).unwrap();
        let err = claim(dir.path(), &placement, PUSHED)
            .unwrap_err()
            .to_string();
        let me = format!("in use by another server (process {})", std::process::id());
        assert!(err.contains(&me), "{err}");
        drop(held);
        claim(dir.path(), &placement, PUSHED).unwrap();
    }

    /// A folder of someone else's files is refused before anything is written there; a
    /// new, empty or server-written one is taken.
    #[test]
    fn a_folder_of_other_files_is_not_taken_for_state() {
        let placement = Placement::new(2, 100, LastBatch::Pad, 0, None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train.parquet"), b"data").unwrap();
        std::fs::write(dir.path().join(".hidden"), b"").unwrap();
        let err = claim(dir.path(), &placement, PUSHED)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no server state") && err.contains("train.parquet"),
            "{err}"
        );
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [".hidden", "train.parquet"], "something was written");

        let commit = br#"{"step":0,"row":0,"admitted":{}}"#;
        for (ours, bytes) in [
            ("pushed-00000000000000004096.spool", &b""[..]),
            ("commit.json", commit),
            ("state-3.json", b""),
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("notes.txt"), b"").unwrap();
            std::fs::write(dir.path().join(ours), bytes).unwrap();
            claim(dir.path(), &placement, PUSHED).unwrap();
        }
        // A damaged commit is refused with nothing written beside it.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("commit.json"), b"{\"step\": -1").unwrap();
        let err = claim(dir.path(), &placement, PUSHED)
            .unwrap_err()
            .to_string();
        assert!(err.contains("commit.json"), "{err}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["commit.json"], "something was written");
        for lookalike in [
            "pushed-x.spool",
            "pushed-1.spool",
            "state-.json",
            "commit.json.bak",
        ] {
            assert!(!is_state_file(lookalike), "{lookalike}");
        }
        let fresh = tempfile::tempdir().unwrap();
        claim(&fresh.path().join("new"), &placement, PUSHED).unwrap();
        let mount = tempfile::tempdir().unwrap();
        std::fs::create_dir(mount.path().join("lost+found")).unwrap();
        claim(mount.path(), &placement, PUSHED).unwrap();
    }

    #[test]
    fn a_directory_keeps_the_geometry_it_was_first_written_with() {
        let dir = tempfile::tempdir().unwrap();
        let stream = |ranks, b, window, seed| {
            Placement::new(ranks, b, LastBatch::Pad, seed, window)
                .unwrap()
                .stream()
        };
        check_geometry(dir.path(), &stream(2, 100, Some(1000), 7), PUSHED, false).unwrap();
        check_geometry(dir.path(), &stream(2, 100, Some(1000), 7), PUSHED, false).unwrap();
        for (other, named) in [
            (stream(2, 50, Some(1000), 7), "--batch-size was 100, is 50"),
            (stream(4, 100, Some(1000), 7), "--ranks was 2, is 4"),
            (
                stream(2, 100, None, 7),
                "--shuffle-window was 1000, is none",
            ),
            (stream(2, 100, Some(1000), 8), "--seed was 7, is 8"),
        ] {
            let err = check_geometry(dir.path(), &other, PUSHED, false)
                .unwrap_err()
                .to_string();
            assert!(err.contains(named) && err.contains(GEOMETRY_FILE), "{err}");
        }
        // In input order the seed places nothing: another one is no other geometry.
        let dir = tempfile::tempdir().unwrap();
        check_geometry(dir.path(), &stream(2, 100, None, 7), PUSHED, false).unwrap();
        check_geometry(dir.path(), &stream(2, 100, None, 8), PUSHED, false).unwrap();
        let err = check_geometry(dir.path(), &stream(2, 100, Some(1000), 8), PUSHED, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--shuffle-window was none, is 1000"), "{err}");

        // Another pipeline's, or a followed folder's state taken for pushed input's.
        let placement = stream(2, 100, None, 7);
        let followed = Stream {
            source: Source::Followed,
            ..PUSHED
        };
        let other = Stream {
            pipeline: "q",
            ..PUSHED
        };
        // Or one featurized otherwise: the same steps would hold other values.
        let chain = Stream {
            features: 12,
            ..PUSHED
        };
        let state = Stream {
            state_version: Some(22),
            ..PUSHED
        };
        for (stream, named) in [
            (followed, "the input was pushed, is a followed folder"),
            (other, "the pipeline was p, is q"),
            (chain, "groups, steps and label was 11, is 12"),
            (state, "the --state version was 21, is 22"),
        ] {
            let err = check_geometry(dir.path(), &placement, stream, false)
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{err}");
        }
        // Refreshed statistics are checked by their own log; a last step cut otherwise.
        let refreshed = Stream {
            state_version: None,
            ..PUSHED
        };
        check_geometry(dir.path(), &placement, refreshed, false).unwrap();
        let dropped = Placement::new(2, 100, LastBatch::Drop, 7, None)
            .unwrap()
            .stream();
        let err = check_geometry(dir.path(), &dropped, PUSHED, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--last-batch was pad, is drop"), "{err}");
        // Deleted from a directory whose spool records the newest segment (a server that
        // wrote it wrote this file first): refused, not taken for any geometry.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(super::super::HEAD_FILE), br#"{"newest":0}"#).unwrap();
        let err = check_geometry(dir.path(), &placement, PUSHED, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("stream.json") && err.contains("is missing"),
            "{err}"
        );
        assert!(!dir.path().join(GEOMETRY_FILE).exists());
        // A file written before the stream was recorded fits any; one of another stream
        // order does not, and one of order 7 is this one's (8 changed only epochs).
        let other = r#"{"order_version":6,"world_size":2,"batch_size":100,"shuffle_window":null,"seed":null}"#;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(GEOMETRY_FILE), other).unwrap();
        let err = check_geometry(dir.path(), &placement, followed, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("order version was 6, is 7"), "{err}");
        let old = r#"{"order_version":7,"world_size":2,"batch_size":100,"shuffle_window":null,"seed":null}"#;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(GEOMETRY_FILE), old).unwrap();
        check_geometry(dir.path(), &placement, followed, false).unwrap();
    }

    /// `stream.json` deleted from a followed folder's state, which has a manifest and no
    /// spool head: the lock file shows that a server which records the geometry held it,
    /// so it is refused under any options, changing nothing. The same state from a server
    /// older than the lock file is taken, and the geometry recorded.
    #[test]
    fn a_deleted_geometry_is_refused_where_a_server_that_writes_it_held_the_directory() {
        use crate::serve::MANIFEST_FILE;
        let placement = Placement::new(2, 100, LastBatch::Pad, 7, Some(1000)).unwrap();
        let followed = Stream {
            source: Source::Followed,
            ..PUSHED
        };
        let dir = tempfile::tempdir().unwrap();
        drop(claim(dir.path(), &placement, followed).unwrap());
        std::fs::write(dir.path().join(MANIFEST_FILE), b"").unwrap();
        std::fs::remove_file(dir.path().join(GEOMETRY_FILE)).unwrap();
        let other = Placement::new(2, 50, LastBatch::Pad, 7, Some(1000)).unwrap();
        for placement in [&placement, &other] {
            let err = claim(dir.path(), placement, followed)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("stream.json")
                    && err.contains("is missing")
                    && err.contains(MANIFEST_FILE),
                "{err}"
            );
            assert!(!dir.path().join(GEOMETRY_FILE).exists());
        }
        // A crash between the lock and the geometry left no state: taken.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), b"1").unwrap();
        std::fs::write(dir.path().join(format!("{GEOMETRY_FILE}.tmp")), b"{").unwrap();
        drop(claim(dir.path(), &other, followed).unwrap());
        // An older server's: no lock file.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(MANIFEST_FILE), b"").unwrap();
        drop(claim(dir.path(), &other, followed).unwrap());
        assert!(dir.path().join(GEOMETRY_FILE).exists());
        claim(dir.path(), &placement, followed).unwrap_err();
    }
}
