//! Files written whole: a failure part-way (a full disk, a kill) leaves the file as it was
//! before, never cut short. `fit --out` used to truncate its state file and write it in
//! place, so a refit onto a full disk destroyed the state every later run needs.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` atomically and durably: a synced temporary file beside it
/// (`NAME.tmp`) renamed into place, then its folder synced. On failure the temporary file
/// is removed and `path` is as it was.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_through(path, bytes, ".tmp")
}

/// [`replace_file`] through a temporary file named for this process (`NAME.PID.tmp`):
/// for a file that several processes may write at once, each the same bytes (every
/// process of a cluster writes the fitted state, and on a shared folder one path).
pub fn replace_file_from_each_process(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_through(path, bytes, &format!(".{}.tmp", std::process::id()))
}

fn replace_through(path: &Path, bytes: &[u8], suffix: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(suffix);
    let tmp = PathBuf::from(tmp);
    let written = File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.and_then(|()| sync_dir(path.parent().unwrap_or(Path::new("."))))
}

/// Makes the directory's entries (a file created, renamed or removed) durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file replaced whole: the new bytes, no temporary file left; and one that cannot be
    /// written (its temporary name is taken by a folder) is left as it was.
    #[test]
    fn a_file_is_replaced_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, b"old").unwrap();
        replace_file(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert!(!dir.path().join("state.json.tmp").exists());
        std::fs::create_dir(dir.path().join("state.json.tmp")).unwrap();
        assert!(replace_file(&path, b"newer").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        replace_file(Path::new("relative-in-cwd-never-made/x"), b"").unwrap_err();
    }
}
