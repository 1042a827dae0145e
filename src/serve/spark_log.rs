//! Spark Structured Streaming's file sink log. Spark's file sink writes each micro-batch's
//! files at their final names, then commits the batch by writing `_spark_metadata/N` (the
//! batch id; every tenth a `N.compact` holding the batches before too): a file on disk is
//! not yet data — it may be half written, or belong to a batch that failed and will be
//! written again under other names. So a followed folder with a `_spark_metadata` log is
//! admitted by the log: the files of committed batches only, in batch order.
//!
//! A log file is `v1` then one JSON object per file:
//! `{"path":"file:///out/part-00000-….snappy.parquet","size":…,"action":"add",…}`.

use std::path::{Component, Path, PathBuf};

use percent_encoding::percent_decode_str;
use serde::Deserialize;

/// The log's folder inside the sink's folder.
pub(super) const LOG_DIR: &str = "_spark_metadata";

/// The log version this reads (Spark's `FileStreamSinkLog.VERSION`).
const VERSION: &str = "v1";

/// One file a log entry names.
#[derive(Deserialize)]
struct Entry {
    path: String,
    action: String,
}

/// The committed batches of a Spark file sink's log, read in order.
pub(super) struct SparkLog {
    folder: PathBuf,
    /// The next batch id to read.
    next: u64,
}

impl SparkLog {
    /// The log of the sink writing into `folder`, if there is one.
    pub fn find(folder: &Path) -> Option<SparkLog> {
        folder.join(LOG_DIR).is_dir().then(|| SparkLog {
            folder: folder
                .canonicalize()
                .unwrap_or_else(|_| folder.to_path_buf()),
            next: 0,
        })
    }

    /// The files of the batches committed since the last call, in batch order then as
    /// listed, as paths relative to the folder; an entry that cannot be admitted is an
    /// error naming it (and why). A log file not readable yet is read at the next call.
    pub fn new_files(&mut self) -> Vec<Result<String, String>> {
        let mut out = Vec::new();
        for (id, name) in self.batches() {
            let text = match std::fs::read_to_string(self.folder.join(LOG_DIR).join(&name)) {
                Ok(t) => t,
                Err(_) => break,
            };
            match parse(&text) {
                Ok(paths) => out.extend(paths.iter().map(|p| self.relative(p))),
                Err(e) => out.push(Err(format!("{LOG_DIR}/{name}: {e}"))),
            }
            self.next = id + 1;
        }
        out
    }

    /// The log's batch files from `next` on, by id (`N`, or `N.compact`).
    fn batches(&self) -> Vec<(u64, String)> {
        let Ok(entries) = std::fs::read_dir(self.folder.join(LOG_DIR)) else {
            return Vec::new();
        };
        let mut ids: Vec<(u64, String)> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| Some((n.strip_suffix(".compact").unwrap_or(&n).parse().ok()?, n)))
            .filter(|&(id, _)| id >= self.next)
            .collect();
        ids.sort();
        ids
    }

    /// `uri` as a path relative to the folder.
    fn relative(&self, uri: &str) -> Result<String, String> {
        let shown = format!("`{}`", hydrant_operators::quoted(uri));
        let path = local_path(uri).ok_or_else(|| format!("{shown} is not a local file"))?;
        let path = path.canonicalize().unwrap_or(path);
        let rel = path
            .strip_prefix(&self.folder)
            .map_err(|_| format!("{shown} is outside the followed folder"))?;
        let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
        match rel.to_str() {
            Some(r) if plain && !r.is_empty() => Ok(r.to_string()),
            _ => Err(format!("{shown} is not a file in the followed folder")),
        }
    }
}

/// The paths of the files a log file adds.
fn parse(text: &str) -> Result<Vec<String>, String> {
    let mut lines = text.lines();
    match lines.next() {
        Some(VERSION) => {}
        Some(v) => {
            let v = format!("`{}`", hydrant_operators::quoted(v));
            return Err(format!("log version {v}; this reads {VERSION}"));
        }
        None => return Err("empty log file".into()),
    }
    let mut paths = Vec::new();
    for (k, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let entry: Entry =
            serde_json::from_str(line).map_err(|e| format!("entry {}: {e}", k + 1))?;
        if entry.action == "add" {
            paths.push(entry.path);
        }
    }
    Ok(paths)
}

/// The local path a `file:` URI names (`file:///a/b`, `file:/a/b`), percent-decoded.
fn local_path(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file:")?;
    let rest = match rest.strip_prefix("//") {
        Some(r) if r.starts_with('/') => r,
        Some(_) => return None, // a host: not this machine's file
        None => rest,
    };
    let decoded = percent_decode_str(rest).decode_utf8().ok()?;
    Some(PathBuf::from(decoded.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As Spark 4.3's file sink wrote it (into a folder named `out dir`).
    const LOGGED: &str = r#"v1
{"path":"file:///tmp/sp/out%20dir/part-00000-1d10cc21-d994-40a3-bf45-07c641af1687-c000.snappy.parquet","size":17894,"isDir":false,"modificationTime":1795399346375,"blockReplication":1,"blockSize":33554432,"action":"add"}
{"path":"file:///tmp/sp/out%20dir/part-00001-0812d4f6-03ca-4e89-b781-f99792513809-c000.snappy.parquet","size":18275,"isDir":false,"modificationTime":1795399346371,"blockReplication":1,"blockSize":33554432,"action":"add"}
"#;

    #[test]
    fn parses_a_log_spark_wrote() {
        let paths = parse(LOGGED).unwrap();
        assert_eq!(paths.len(), 2);
        let path = local_path(&paths[0]).unwrap();
        let path = path.to_str().unwrap();
        assert!(
            path.starts_with("/tmp/sp/out dir/part-00000-1d10cc21"),
            "{path}"
        );
        assert_eq!(local_path("file:/a/b%25c").unwrap(), Path::new("/a/b%c"));
        assert_eq!(local_path("hdfs://nn/a"), None);
        assert_eq!(local_path("file://host/a"), None);
        let err = parse("v2\n{}").unwrap_err();
        assert!(err.contains("version `v2`"), "{err}");
        assert!(parse("v1\nnot json").unwrap_err().contains("entry 1"));
        let deleted = r#"v1
{"path":"file:/x/a.parquet","action":"delete"}"#;
        assert!(parse(deleted).unwrap().is_empty());
    }

    fn entry(path: &Path) -> String {
        let uri = format!("file://{}", path.display()).replace(' ', "%20");
        format!("{{\"path\":\"{uri}\",\"size\":1,\"action\":\"add\"}}")
    }

    #[test]
    fn committed_batches_are_read_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("out dir");
        let log = folder.join(LOG_DIR);
        std::fs::create_dir_all(&log).unwrap();
        assert!(SparkLog::find(dir.path()).is_none());
        let mut spark = SparkLog::find(&folder).unwrap();
        std::fs::create_dir_all(folder.join("sub")).unwrap();
        for f in ["a", "b", "sub/c", "d"] {
            std::fs::write(folder.join(format!("{f}.parquet")), b"").unwrap();
        }
        let write = |name: &str, files: &[&str]| {
            let lines: Vec<String> = files.iter().map(|f| entry(&folder.join(f))).collect();
            std::fs::write(log.join(name), format!("v1\n{}\n", lines.join("\n"))).unwrap();
        };
        write("1", &["b.parquet"]);
        write("0", &["a.parquet", "sub/c.parquet"]);
        // Spark's temporary log files are not batches.
        std::fs::write(log.join(".2.0c1d.tmp"), "v1\n").unwrap();
        let got: Vec<_> = spark.new_files().into_iter().map(Result::unwrap).collect();
        assert_eq!(got, ["a.parquet", "sub/c.parquet", "b.parquet"]);
        assert!(spark.new_files().is_empty());
        // A compact batch repeats what came before; a path elsewhere is an error.
        write("2.compact", &["a.parquet", "b.parquet", "d.parquet"]);
        let elsewhere = dir.path().join("x.parquet");
        std::fs::write(log.join("3"), format!("v1\n{}\n", entry(&elsewhere))).unwrap();
        let got = spark.new_files();
        assert_eq!(
            got[..3],
            [
                Ok("a.parquet".into()),
                Ok("b.parquet".into()),
                Ok("d.parquet".into())
            ]
        );
        let err = got[3].clone().unwrap_err();
        assert!(err.contains("outside the followed folder"), "{err}");
    }
}
