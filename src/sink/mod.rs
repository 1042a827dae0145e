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
        std::fs::create_dir_all(dir).map_err(|e| err(one_line(e)))?;
        let prefix = format!("part-p{process}-");
        for entry in std::fs::read_dir(dir)
            .map_err(|e| err(one_line(e)))?
            .flatten()
        {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                return Err(err(format!(
                    "{} exists from an earlier run; use an empty folder",
                    entry.path().display()
                )));
            }
        }
        Ok(())
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
                let path = dir.join(format!("part-p{process}-w{worker:04}.parquet"));
                let err = |e: &dyn std::fmt::Display| Error::Sink {
                    sink: self.to_string(),
                    reason: one_line(e),
                };
                let file = File::create(&path).map_err(|e| err(&e))?;
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
}

impl BatchSink for ParquetSink {
    fn write(&mut self, rb: &RankBatch) -> Result<()> {
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
        match &mut self.writer {
            Some(w) => w.write(&batch).map_err(|e| err(&e)),
            None => Err(Error::Sink {
                sink: self.name.clone(),
                reason: "written after finish".into(),
            }),
        }
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(w) = self.writer.take() {
            w.close().map_err(|e| Error::Sink {
                sink: self.name.clone(),
                reason: one_line(e),
            })?;
        }
        Ok(())
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
    }
}
