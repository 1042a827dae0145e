//! The state directory's files as the spool names, writes and reads them: segments by
//! their first row, files replaced atomically and durably, the commit and the spool's
//! head read back, and what a failed write is.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{COMMIT_FILE, Commit};
use crate::error::{Error, Result};

/// The file naming the newest segment begun (`{"newest": ROW}`), written before a record
/// in that segment is acknowledged: a newest segment that is gone (deleted by hand, a
/// clean-up script) is then an error at restart, where it looked like a spool that simply
/// ended there and its acknowledged rows were lost without a word.
pub(in crate::serve) const HEAD_FILE: &str = "spool-head.json";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Head {
    newest: u64,
}

/// A file of the state directory as clients and `status` are told it: by its name there,
/// not by the server's path.
pub(in crate::serve) fn in_state_dir(path: &Path) -> String {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    format!("--state-dir/{name}")
}

pub(in crate::serve) fn state_error(path: &Path, e: &dyn std::fmt::Display) -> Error {
    Error::State {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

pub(super) fn segment_path(dir: &Path, first_row: u64) -> PathBuf {
    dir.join(format!("pushed-{first_row:020}.spool"))
}

/// The first row a segment's file name gives, if it names a segment.
pub(super) fn segment_row(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("pushed-")?.strip_suffix(".spool")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Makes the directory's entries (a file created, renamed or removed) durable.
pub(in crate::serve) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    crate::write::sync_dir(dir)
}

/// Writes `bytes` to `path` atomically and durably (see [`crate::write::replace_file`]).
pub(in crate::serve) fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    crate::write::replace_file(path, bytes)
}

/// What a failed append of the segment at `path` is (`e`, and whether undoing it worked):
/// a full disk, when it was undone, is [`Error::StateFull`] (a retry once there is room
/// works); anything else [`Error::State`]. With it, why the spool must take no more, when
/// the undo failed too.
pub(super) fn append_failed(
    path: PathBuf,
    e: &std::io::Error,
    undone: std::io::Result<()>,
) -> (Error, Option<String>) {
    match undone {
        Ok(()) => {
            let reason = format!("cannot spool a pushed batch: {e}");
            match is_full(e) {
                true => (Error::StateFull { path, reason }, None),
                false => (Error::State { path, reason }, None),
            }
        }
        Err(u) => {
            let why = format!("a failed append ({e}) could not be undone ({u})");
            let reason = format!("cannot spool a pushed batch: {why}");
            (Error::State { path, reason }, Some(why))
        }
    }
}

/// A failed write of `path`: [`Error::StateFull`] when the disk is full, else
/// [`Error::State`].
pub(super) fn write_error(path: &Path, e: &std::io::Error) -> Error {
    match is_full(e) {
        true => Error::StateFull {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
        false => state_error(path, e),
    }
}

/// Whether `e` says the file system is full or the user's quota spent.
pub(in crate::serve) fn is_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// The newest segment [`HEAD_FILE`] names, if the file is there (a server before it
/// wrote none).
pub(super) fn read_head(dir: &Path) -> Result<Option<u64>> {
    Ok(read_json::<Head>(&dir.join(HEAD_FILE))?.map(|h| h.newest))
}

/// Records `newest` as the newest segment begun, durably.
pub(super) fn write_head(dir: &Path, newest: u64) -> Result<()> {
    let path = dir.join(HEAD_FILE);
    let json = serde_json::to_vec(&Head { newest }).map_err(|e| state_error(&path, &e))?;
    write_synced(&path, &json).map_err(|e| write_error(&path, &e))
}

/// The last commit made in `dir`, if any.
pub fn read_commit(dir: &Path) -> Result<Option<Commit>> {
    read_json(&dir.join(COMMIT_FILE))
}

/// The largest state JSON file read (`commit.json` names every producer).
const MAX_JSON_BYTES: u64 = 256 << 20;

/// The JSON file at `path` read as a `T`, if it is there: a regular file (a FIFO put in
/// its place would block the start forever, `/dev/zero` fill the memory).
pub(super) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match hydrant_operators::read_small_file(path, MAX_JSON_BYTES) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| state_error(path, &e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(state_error(path, &e)),
    }
}

/// The segments in `dir`, oldest first.
pub(super) fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| state_error(dir, &e))? {
        let entry = entry.map_err(|e| state_error(dir, &e))?;
        if let Some(row) = entry.file_name().to_str().and_then(segment_row) {
            segments.push((row, entry.path()));
        }
    }
    segments.sort();
    Ok(segments)
}

/// Deletes the segments whose rows all lie before `row` (the next one starts at or before
/// it); the last segment stays. Returns how many went.
pub(super) fn trim(segments: &mut Vec<(u64, PathBuf)>, row: u64) -> Result<usize> {
    let before = segments.partition_point(|s| s.0 <= row).saturating_sub(1);
    for (_, path) in segments.drain(..before) {
        std::fs::remove_file(&path).map_err(|e| state_error(&path, &e))?;
    }
    Ok(before)
}
