//! Decoding the files a follower admits, on a thread of their own: in admission order and
//! a few batches ahead, so that decoding overlaps featurizing and cutting (as file mode's
//! workers overlap), across files too — a file's first batch is ready when the one before
//! is admitted. Only the pipeline's columns are decoded, strings dictionary-encoded as in
//! file mode (plus the event-time column).

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::RecordBatch;
use crossbeam_channel::Sender;
use hydrant_operators::{FeaturePlan, ROW_ID};

use crate::source::Inputs;
use crate::spec::PipelineSpec;

/// What the reader sends for each file, in order: its batches, `Failed` if it went bad
/// (nothing more of it follows), then `Done`.
pub(in crate::serve) enum Read {
    Batch(RecordBatch),
    Failed(String),
    Done,
}

/// How a followed folder's files are read.
#[derive(Clone)]
pub(in crate::serve) struct Reader {
    pub dir: PathBuf,
    pub batch_rows: usize,
    pub plan: Arc<FeaturePlan>,
    pub spec: PipelineSpec,
}

impl Reader {
    /// Decodes `files` into `tx` in order, until done or until the receiver is gone.
    pub fn run(&self, files: &[String], tx: Sender<Read>) {
        for file in files {
            if self.file(file, &tx).is_err() || tx.send(Read::Done).is_err() {
                return;
            }
        }
    }

    /// Sends one file's batches (or why it cannot be read); `Err` once no one receives.
    fn file(&self, file: &str, tx: &Sender<Read>) -> Result<(), ()> {
        let failed = |e: String| tx.send(Read::Failed(e)).map_err(|_| ());
        let path = self.dir.join(file);
        // Opened as an input, a folder would be read as its files at the time, once: what
        // is written into it later would never be admitted.
        if path.is_dir() {
            return failed(format!(
                "{file} is a folder: a followed folder's own files are read, not its \
                 sub-folders' (move the part files in, or follow the sub-folder)"
            ));
        }
        let mut inputs = match Inputs::open(std::slice::from_ref(&path), self.batch_rows) {
            Ok(i) => i,
            Err(e) => return failed(e.to_string()),
        };
        let extra: Vec<String> = self.spec.event_time.iter().cloned().collect();
        if let Err(e) = inputs.prepare(&self.plan, |s| self.spec.plan(s), &extra) {
            return failed(e.to_string());
        }
        for unit in inputs.units() {
            let batches = match inputs.read(unit) {
                Ok(b) => b,
                Err(e) => return failed(e.to_string()),
            };
            for batch in batches {
                let mut data = match batch {
                    Ok(b) => b.data,
                    Err(e) => return failed(e.to_string()),
                };
                if let Ok(i) = data.schema().index_of(ROW_ID) {
                    data.remove_column(i);
                }
                tx.send(Read::Batch(data)).map_err(|_| ())?;
            }
        }
        Ok(())
    }
}
