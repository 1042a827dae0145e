//! Paths a command writes, checked before it runs: none may be a file the same command
//! reads (its input, pipeline or state, or a data file of an input folder), a sink's
//! folder may not hold one, and a file's folder must exist, so that a mistyped flag
//! loses nothing and fails at once rather than after the job.

use std::path::{Path, PathBuf};

use hydrant::{Error, Result};

/// What an output path is: a file written whole, or a folder written into.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    File,
    Folder,
}

/// Refuses `out` (of kind `written`, shown as the option that gave it, e.g. `--summary
/// s.json`) where it is one of `reads` (each a flag and the path given to it), or, for a
/// folder, where it holds one; and a file whose folder does not exist or which is a
/// folder.
pub(crate) fn check_output(
    shown: &str,
    out: &Path,
    written: Written,
    reads: &[(&str, &Path)],
) -> Result<()> {
    let refuse = |why: String| Err(Error::Usage(format!("{shown}: {why}")));
    if written == Written::File && out.is_dir() {
        return refuse("is a folder".into());
    }
    let Some(target) = resolved(out) else {
        return refuse("its folder does not exist".into());
    };
    for (read_flag, read) in reads {
        let Ok(read_at) = read.canonicalize() else {
            continue;
        };
        if written == Written::File && read_at == target {
            return refuse(format!(
                "is the {read_flag} this command reads ({}): it would be overwritten",
                read.display()
            ));
        }
        if written == Written::File
            && read_at.is_dir()
            && target.parent() == Some(&read_at)
            && hydrant::source::is_data_file(&target)
        {
            return refuse(format!(
                "is a data file of the {read_flag} folder this command reads ({}): it would \
                 be overwritten, or read as input next time",
                read.display()
            ));
        }
        if written == Written::Folder && read_at.starts_with(&target) {
            let is = if read_at == target { "is" } else { "holds" };
            return refuse(format!(
                "{is} the {read_flag} {} this command reads: write the output elsewhere",
                read.display()
            ));
        }
    }
    Ok(())
}

/// Refuses a file written (`shown` as its option) inside the folder another option of
/// the same command writes into (`folder_shown`): the Parquet sink writes its shards there
/// (a `--summary` there replaced one, and the job still succeeded).
pub(crate) fn check_outside(
    shown: &str,
    file: &Path,
    folder_shown: &str,
    folder: &Path,
) -> Result<()> {
    let (Some(file_at), Some(folder_at)) = (resolved(file), resolved(folder)) else {
        return Ok(()); // a missing folder is refused by `check_output`
    };
    if file_at.starts_with(&folder_at) {
        return Err(Error::Usage(format!(
            "{shown}: is inside {folder_shown}, which this command writes: write it elsewhere"
        )));
    }
    Ok(())
}

/// `path` with its links and `..` resolved: itself where it exists, else its folder's
/// resolved path and its name (`None` where that folder does not exist).
fn resolved(path: &Path) -> Option<PathBuf> {
    if let Ok(at) = path.canonicalize() {
        return Some(at);
    }
    let name = path.file_name()?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(folder.canonicalize().ok()?.join(name))
}

/// Refuses `gen --out` onto an existing file that is not Parquet (a pipeline, a state,
/// anything else by a slip of the hand): found by a hostile run, which replaced its
/// pipeline file with generated rows. A Parquet file (or an empty one) is replaced, as it
/// was generated.
pub(crate) fn refuse_to_overwrite_other_than_parquet(out: &Path) -> Result<()> {
    use std::io::Read;
    let mut head = Vec::with_capacity(4);
    match std::fs::File::open(out).and_then(|f| f.take(4).read_to_end(&mut head)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Ok(_) if head.is_empty() || head == b"PAR1" => Ok(()),
        _ => Err(Error::Usage(format!(
            "--out {}: exists and is not a Parquet file; it would be overwritten (remove it \
             first, or give another path)",
            out.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_that_is_or_holds_what_is_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.parquet");
        std::fs::write(&input, b"PAR1").unwrap();
        let reads = [("--input", input.as_path())];
        let check = |out: &Path, written| check_output("--out", out, written, &reads);
        let shown = check_output("--summary in.parquet", &input, Written::File, &reads);
        assert!(
            shown
                .unwrap_err()
                .to_string()
                .starts_with("--summary in.parquet: is the --input"),
        );

        // The same file, under another spelling of its path.
        let same = dir.path().join(".").join("in.parquet");
        let err = check(&same, Written::File).unwrap_err().to_string();
        assert!(err.contains("is the --input this command reads"), "{err}");
        // A folder written into that holds it.
        let err = check(dir.path(), Written::Folder).unwrap_err().to_string();
        assert!(err.contains("holds the --input"), "{err}");
        let folder = [("--input", dir.path())];
        let err = check_output("--sink", dir.path(), Written::Folder, &folder).unwrap_err();
        assert!(err.to_string().contains("is the --input"), "{err}");
        // A file whose folder is missing, and a folder given for a file.
        let err = check(&dir.path().join("no/s.json"), Written::File)
            .unwrap_err()
            .to_string();
        assert!(err.contains("its folder does not exist"), "{err}");
        let err = check(dir.path(), Written::File).unwrap_err().to_string();
        assert!(err.contains("is a folder"), "{err}");
        // A file inside a folder the command writes into.
        let out = dir.path().join("out");
        let summary = out.join("part-p0-w0000.parquet");
        std::fs::create_dir(&out).unwrap();
        let err = check_outside("--summary s", &summary, "--sink parquet:out", &out).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--summary s: is inside --sink parquet:out"),
            "{err}"
        );
        assert!(check_outside("--summary s", &input, "--sink parquet:out", &out).is_ok());
        // Elsewhere, new or not: fine.
        assert!(check(&dir.path().join("s.json"), Written::File).is_ok());
        assert!(check(&dir.path().join("out"), Written::Folder).is_ok());
        assert!(check(&input.with_extension("json"), Written::File).is_ok());
    }
}
