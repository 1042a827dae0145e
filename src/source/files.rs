//! Which files an `--input` names (a file, or a folder's data files), and a sample of a
//! file's contents that tells it from another of the same size.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result, one_line};

/// Whether a folder given as `--input` reads the file at `path`: a `.parquet`, `.arrow`,
/// `.ipc` or `.feather` file that is neither hidden nor `_`-prefixed (`.part-0.crc`,
/// `_SUCCESS` and `_metadata` are not data, as Spark and pyarrow.dataset treat them).
pub fn is_data_file(path: &Path) -> bool {
    is_data(path)
        && path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "parquet" | "arrow" | "ipc" | "feather"))
}

/// Whether `path`'s name is not hidden or `_`-prefixed, as data's are.
fn is_data(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str());
    name.is_some_and(|n| !n.starts_with('.') && !n.starts_with('_'))
}

/// A path as the files it names: itself, or a folder's data files in name order.
pub(super) fn expand(path: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::Input {
        path: path.into(),
        reason: one_line(e),
    })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| Error::Input {
            path: path.into(),
            reason: one_line(e),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    // In name order: the order rows are numbered in, and the first of several faults.
    entries.sort();
    // A folder is read one level deep. Its sub-folders' rows (a partitioned layout, say)
    // would otherwise be left out without a word.
    if let Some(folder) = entries.iter().find(|p| p.is_dir() && is_data(p)) {
        let name = folder.file_name().unwrap_or_default().to_string_lossy();
        return Err(Error::Input {
            path: path.into(),
            reason: format!(
                "holds a sub-folder, {name:?}, and a folder is read one level deep: give \
                 each folder of data files as an --input (hidden and `_` folders are skipped)"
            ),
        });
    }
    let mut files = Vec::new();
    for entry in entries.into_iter().filter(|p| is_data_file(p)) {
        // A data file's name on something that is not a readable file (a dangling link, a
        // link loop, a pipe) is an error, as it is when given by name: skipped, its rows
        // would be missing without a word.
        let reason = match std::fs::metadata(&entry) {
            Ok(m) if m.is_file() => {
                files.push(entry);
                continue;
            }
            Ok(_) => "not a regular file".to_string(),
            Err(e) => one_line(e),
        };
        return Err(Error::Input {
            path: entry,
            reason,
        });
    }
    if files.is_empty() {
        return Err(Error::Input {
            path: path.into(),
            reason: "folder holds no .parquet, .arrow, .ipc or .feather files (hidden and \
                     `_` files are skipped)"
                .into(),
        });
    }
    Ok(files)
}

/// Blocks [`sample_hash`] reads from a file, and their size: 64 KiB a file at most.
const SAMPLES: u64 = 16;
const SAMPLE_BYTES: u64 = 4 << 10;

/// A hash of [`SAMPLES`] blocks of [`SAMPLE_BYTES`] spread evenly over `file` (`len`
/// bytes) from its first byte to its last; a smaller file is hashed whole. Reading every
/// file whole would read the input once more on every process before a cluster starts;
/// blocks tell files apart that differ in their data anywhere but in a few narrow gaps
/// (other files, of a size by chance the same). Hand-written: a few lines over `pread`.
pub(super) fn sample_hash(file: &std::fs::File, len: u64) -> std::io::Result<u64> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::FileExt;
    let mut hash = std::collections::hash_map::DefaultHasher::new();
    let mut block = vec![0u8; SAMPLE_BYTES as usize];
    let span = len.saturating_sub(SAMPLE_BYTES);
    for k in 0..SAMPLES {
        let at = span * k / (SAMPLES - 1);
        let n = (len - at).min(SAMPLE_BYTES) as usize;
        file.read_exact_at(&mut block[..n], at)?;
        block[..n].hash(&mut hash);
        if span == 0 {
            break;
        }
    }
    Ok(hash.finish())
}
