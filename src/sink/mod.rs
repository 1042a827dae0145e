//! Sinks: where featurized batches go at the end of a run. Each worker owns one sink
//! instance, so sinks need no locking.

use std::fs::File;
use std::path::PathBuf;
use std::str::FromStr;

use std::sync::Arc;

use arrow::array::{RecordBatch, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::delivery::RankBatch;
use crate::error::{Error, Result, one_line};

/// A sink as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkSpec {
    /// Consume and count.
    Null,
    /// Train a data-parallel logistic regression on the host (`train:logreg`).
    Train,
    /// Parquet files under a folder, one per worker (`part-p{process}-w{worker}.parquet`),
    /// with `rank`, `epoch` and `step` columns beside the delivered ones.
    Parquet(PathBuf),
}

impl FromStr for SinkSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.split_once(':') {
            None if s == "null" => Ok(SinkSpec::Null),
            Some(("train", "logreg")) => Ok(SinkSpec::Train),
            Some(("parquet", dir)) if !dir.is_empty() => Ok(SinkSpec::Parquet(PathBuf::from(dir))),
            _ => Err(Error::Usage(format!(
                "unknown sink `{s}` (expected `null`, `parquet:DIR` or `train:logreg`)"
            ))),
        }
    }
}

impl std::fmt::Display for SinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SinkSpec::Null => f.write_str("null"),
            SinkSpec::Train => f.write_str("train:logreg"),
            SinkSpec::Parquet(dir) => write!(f, "parquet:{}", dir.display()),
        }
    }
}

impl SinkSpec {
    /// Makes ready for process `process`: creates the folder and refuses to overwrite this
    /// process's part files from an earlier run (mixing two runs' rows would lose the
    /// exactly-once guarantee silently).
    pub fn prepare(&self, process: usize) -> Result<()> {
        let SinkSpec::Parquet(dir) = self else {
            return Ok(());
        };
        let err = |reason: String| Error::Sink {
            sink: self.to_string(),
            reason,
        };
        if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
            return Err(err(format!(
                "{} is not a folder: parquet:DIR names a folder, and each rank's part files \
                 are written in it",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| err(one_line(e)))?;
        let prefix = part_prefix(process);
        for entry in std::fs::read_dir(dir)
            .map_err(|e| err(one_line(e)))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) {
                return Err(err(format!(
                    "{} exists from an earlier run; use an empty folder",
                    entry.path().display()
                )));
            }
            if name
                .strip_prefix('.')
                .is_some_and(|n| n.starts_with(&prefix))
            {
                return Err(err(format!(
                    "{} is a part file of an earlier run that was stopped before it was \
                     written whole; use an empty folder",
                    entry.path().display()
                )));
            }
        }
        Ok(())
    }

    /// Removes the part files process `process` has not finished writing (hidden, named
    /// `.part-p{process}-w….parquet.tmp`), as a run stopped part-way must: the next run
    /// into the folder would refuse them. Returns how many; nothing for other sinks.
    pub fn remove_unfinished(&self, process: usize) -> usize {
        let SinkSpec::Parquet(dir) = self else {
            return 0;
        };
        let prefix = format!(".{}", part_prefix(process));
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        entries
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(&prefix) && name.ends_with(".tmp")
            })
            .filter(|e| std::fs::remove_file(e.path()).is_ok())
            .count()
    }

    /// Opens the sink of one worker, for rank batches of `schema`.
    pub fn open(
        &self,
        process: usize,
        worker: usize,
        schema: SchemaRef,
    ) -> Result<Box<dyn BatchSink>> {
        match self {
            SinkSpec::Null => Ok(Box::new(NullSink)),
            SinkSpec::Train => Err(Error::Sink {
                sink: self.to_string(),
                reason: "is fed by loaders, not written by workers".into(),
            }),
            SinkSpec::Parquet(dir) => {
                let name = format!("{}w{worker:04}.parquet", part_prefix(process));
                // Written under a hidden name and renamed once whole: a run that fails or is
                // stopped leaves no file that looks finished.
                let (path, writing) = (dir.join(&name), dir.join(format!(".{name}.tmp")));
                let err = |e: &dyn std::fmt::Display| Error::Sink {
                    sink: self.to_string(),
                    reason: one_line(e),
                };
                let file = File::create(&writing).map_err(|e| err(&e))?;
                let props = WriterProperties::builder()
                    .set_compression(Compression::SNAPPY)
                    .build();
                let mut fields: Vec<_> = schema.fields().iter().cloned().collect();
                fields.extend([
                    Arc::new(Field::new("rank", DataType::UInt32, false)),
                    Arc::new(Field::new("epoch", DataType::UInt64, false)),
                    Arc::new(Field::new("step", DataType::UInt64, false)),
                ]);
                let schema = Arc::new(Schema::new(fields));
                let writer =
                    ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|e| err(&e))?;
                Ok(Box::new(ParquetSink {
                    writer: Some(writer),
                    schema,
                    name: self.to_string(),
                    paths: (writing, path),
                    failed: None,
                }))
            }
        }
    }
}

/// Where one worker's rank batches go.
pub trait BatchSink {
    /// Takes one rank batch.
    fn write(&mut self, batch: &RankBatch) -> Result<()>;
    /// Flushes and closes; called once after the last batch.
    fn finish(&mut self) -> Result<()>;
}

/// How the names of process `process`'s part files begin (`part-pP-`, then `wW.parquet`);
/// one being written is hidden, `.NAME.tmp`, until whole.
fn part_prefix(process: usize) -> String {
    format!("part-p{process}-")
}

struct NullSink;

impl BatchSink for NullSink {
    fn write(&mut self, _: &RankBatch) -> Result<()> {
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

struct ParquetSink {
    writer: Option<ArrowWriter<File>>,
    schema: SchemaRef,
    name: String,
    /// The file being written (hidden), and the name it takes once whole.
    paths: (PathBuf, PathBuf),
    /// The first failure: said again by every later call (the writer's own error for
    /// them, "Previous row group writer was not closed", hid a full disk).
    failed: Option<String>,
}

impl ParquetSink {
    fn failure(&mut self, e: &dyn std::fmt::Display) -> Error {
        let reason = self.failed.get_or_insert_with(|| one_line(e)).clone();
        Error::Sink {
            sink: self.name.clone(),
            reason,
        }
    }
}

/// A part file never finished (the job failed) is removed, not left looking like output.
impl Drop for ParquetSink {
    fn drop(&mut self) {
        if self.writer.is_some() || self.failed.is_some() {
            let _ = std::fs::remove_file(&self.paths.0);
        }
    }
}

impl BatchSink for ParquetSink {
    fn write(&mut self, rb: &RankBatch) -> Result<()> {
        if let Some(why) = &self.failed {
            let why = why.clone();
            return Err(self.failure(&why));
        }
        let err = |e: &dyn std::fmt::Display| Error::Sink {
            sink: self.name.clone(),
            reason: one_line(e),
        };
        let n = rb.data().num_rows();
        let mut columns = rb.data().columns().to_vec();
        columns.push(Arc::new(UInt32Array::from(vec![rb.meta.rank as u32; n])));
        columns.push(Arc::new(UInt64Array::from(vec![rb.meta.epoch; n])));
        columns.push(Arc::new(UInt64Array::from(vec![rb.meta.step; n])));
        let batch = RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| err(&e))?;
        let written = match &mut self.writer {
            Some(w) => w.write(&batch),
            None => return Err(err(&"written after finish")),
        };
        written.map_err(|e| self.failure(&e))
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(why) = &self.failed {
            let why = why.clone();
            return Err(self.failure(&why));
        }
        let Some(mut w) = self.writer.take() else {
            return Ok(());
        };
        let (writing, path) = self.paths.clone();
        let closed = w.finish().map_err(|e| e.to_string()).and_then(|_| {
            (w.inner().sync_all())
                .and_then(|()| std::fs::rename(&writing, &path))
                .map_err(|e| e.to_string())
        });
        closed.map_err(|e| self.failure(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sinks() {
        assert_eq!("null".parse::<SinkSpec>().unwrap(), SinkSpec::Null);
        assert_eq!(
            "parquet:out".parse::<SinkSpec>().unwrap(),
            SinkSpec::Parquet("out".into())
        );
        for bad in ["", "parquet:", "csv:x", "nul"] {
            assert!(
                bad.parse::<SinkSpec>()
                    .unwrap_err()
                    .to_string()
                    .contains("unknown sink"),
                "{bad}"
            );
        }
    }

    #[test]
    fn refuses_to_mix_with_an_earlier_run() {
        let dir = tempfile::tempdir().unwrap();
        let sink = SinkSpec::Parquet(dir.path().join("out"));
        sink.prepare(0).unwrap();
        std::fs::write(dir.path().join("out/part-p0-w0000.parquet"), b"x").unwrap();
        assert!(
            sink.prepare(0)
                .unwrap_err()
                .to_string()
                .contains("earlier run")
        );
        sink.prepare(1).unwrap();
        // A part file an earlier run left unfinished (it was killed).
        std::fs::write(dir.path().join("out/.part-p1-w0000.parquet.tmp"), b"x").unwrap();
        let err = sink.prepare(1).unwrap_err().to_string();
        assert!(err.contains("stopped before it was written whole"), "{err}");
        // A file where the folder would be (`parquet:out.parquet`, read as one file).
        std::fs::write(dir.path().join("one.parquet"), b"x").unwrap();
        let sink = SinkSpec::Parquet(dir.path().join("one.parquet"));
        let err = sink.prepare(0).unwrap_err().to_string();
        assert!(
            err.contains("one.parquet is not a folder: parquet:DIR"),
            "{err}"
        );
    }

    /// A part file is written under a hidden name and appears whole at `finish`; one
    /// whose job failed first is removed, not left looking like output.
    #[test]
    fn a_part_file_appears_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let sink = SinkSpec::Parquet(out.clone());
        sink.prepare(0).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::UInt64, false)]));
        let names = || -> Vec<String> {
            let mut n: Vec<String> = std::fs::read_dir(&out)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        let mut finished = sink.open(0, 0, schema.clone()).unwrap();
        let failed = sink.open(0, 1, schema).unwrap();
        assert_eq!(
            names(),
            [".part-p0-w0000.parquet.tmp", ".part-p0-w0001.parquet.tmp"]
        );
        finished.finish().unwrap();
        drop(failed);
        drop(finished);
        assert_eq!(names(), ["part-p0-w0000.parquet"]);
        let file = File::open(out.join("part-p0-w0000.parquet")).unwrap();
        let reader = parquet::file::reader::SerializedFileReader::new(file).unwrap();
        let rows = parquet::file::reader::FileReader::metadata(&reader);
        assert_eq!(rows.file_metadata().num_rows(), 0);
    }
}
