//! The manifest of a followed folder (`follow.manifest` in the state directory): each
//! file's admission recorded before its rows go anywhere, and the input's end, so that a
//! restarted server admits the same files again in the same order.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::super::spool::state_error;
use super::MANIFEST_FILE;
use crate::error::{Error, Result};

/// A line of the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub(in crate::serve) enum Line {
    /// A file's admission began; its rows start at stream row `row`, and it was `bytes`
    /// long with contents of checksum `sum` (each absent in manifests written before it
    /// was recorded).
    Begin {
        file: String,
        row: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sum: Option<u64>,
    },
    /// It ended with `rows` admitted; `error` says why the rest were skipped.
    End {
        file: String,
        rows: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The input was ended (`end_ingest`) after `rows` stream rows: nothing more comes.
    Ended { rows: u64 },
}

/// What a manifest records.
#[derive(Debug, Default, PartialEq)]
pub(in crate::serve) struct Recorded {
    /// The admissions, in order.
    pub admissions: Vec<Admission>,
    /// The stream row the input was ended at, if it was.
    pub ended: Option<u64>,
}

impl Recorded {
    /// The admissions to replay: when the input was ended, only the rows before its end
    /// (a file begun before the end is read only that far; one begun after, not at all).
    pub fn into_replay(mut self) -> Vec<Admission> {
        if let Some(end) = self.ended {
            self.admissions.retain(|a| a.row < end);
            for a in &mut self.admissions {
                let left = end - a.row;
                a.rows = Some(a.rows.map_or(left, |r| r.min(left)));
            }
        }
        self.admissions
    }
}

/// A file the manifest says was admitted (or begun: `rows` unknown).
#[derive(Debug, Clone, PartialEq)]
pub(in crate::serve) struct Admission {
    pub file: String,
    pub row: u64,
    pub rows: Option<u64>,
    /// The file's length when it was first admitted (recorded ones).
    pub bytes: Option<u64>,
    /// Its contents' checksum then.
    pub sum: Option<u64>,
    /// Why the rest of it was skipped, as its `end` line says.
    pub error: Option<String>,
}

/// The manifest, appended to.
pub(in crate::serve) struct Manifest {
    file: File,
    path: PathBuf,
}

impl Manifest {
    /// Opens the manifest in `dir` (creating it), cuts off a torn last line, and returns
    /// it with what it records.
    pub fn open(dir: &Path) -> Result<(Manifest, Recorded)> {
        std::fs::create_dir_all(dir).map_err(|e| state_error(dir, &e))?;
        let path = dir.join(MANIFEST_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| state_error(&path, &e))?;
        // A FIFO would block the start forever, `/dev/zero` fill the memory.
        hydrant_operators::check_regular(&file).map_err(|e| state_error(&path, &e))?;
        let (mut admissions, mut whole, mut ended) = (Vec::<Admission>::new(), 0u64, None);
        let mut reader = std::io::BufReader::new(&file);
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader
                .read_line(&mut line)
                .map_err(|e| state_error(&path, &e))?;
            if n == 0 || !line.ends_with('\n') {
                break; // the end, or a line torn by a crash: never counted
            }
            let parsed: Line = serde_json::from_str(&line).map_err(|e| {
                state_error(&path, &format!("the line at byte {whole} is damaged: {e}"))
            })?;
            match parsed {
                Line::Begin {
                    file,
                    row,
                    bytes,
                    sum,
                } => admissions.push(Admission {
                    file,
                    row,
                    rows: None,
                    bytes,
                    sum,
                    error: None,
                }),
                Line::End { file, rows, error } => match admissions.last_mut() {
                    Some(a) if a.file == file && a.rows.is_none() => {
                        a.rows = Some(rows);
                        a.error = error;
                    }
                    _ => {
                        let why = format!("`end` of {file} at byte {whole} has no `begin`");
                        return Err(state_error(&path, &why));
                    }
                },
                Line::Ended { rows } => ended = Some(rows),
            }
            whole += n as u64;
        }
        drop(reader);
        let len = file.metadata().map_err(|e| state_error(&path, &e))?.len();
        if whole < len {
            // Said, as the spool says its torn record: not cut off unseen.
            hydrant_operators::log_line!(
                "hydrant: {}: cut off a torn last line ({} of {len} bytes, from byte {whole}), \
                 as a crash mid-write leaves it",
                crate::error::one_line_path(&path),
                len - whole
            );
            file.set_len(whole).map_err(|e| state_error(&path, &e))?;
            file.sync_all().map_err(|e| state_error(&path, &e))?;
        }
        file.seek(SeekFrom::End(0))
            .map_err(|e| state_error(&path, &e))?;
        Ok((Manifest { file, path }, Recorded { admissions, ended }))
    }

    /// Records that the input was ended after `rows` stream rows.
    pub fn record_end(&mut self, rows: u64) -> Result<()> {
        self.append(&Line::Ended { rows })
    }

    /// Appends `line` and syncs it. A failed append is cut off again; a disk that was full
    /// is then [`Error::StateFull`] (the line can be appended again once there is room).
    pub(super) fn append(&mut self, line: &Line) -> Result<()> {
        let mut bytes = serde_json::to_vec(line).map_err(|e| state_error(&self.path, &e))?;
        bytes.push(b'\n');
        let before = self.file.stream_position();
        let written = self
            .file
            .write_all(&bytes)
            .and_then(|()| self.file.sync_data());
        let Err(e) = written else {
            return Ok(());
        };
        let what = match line {
            Line::Ended { .. } => "the input's end",
            Line::Begin { .. } | Line::End { .. } => "an admission",
        };
        let reason = format!("cannot record {what}: {e}");
        let undone = before.and_then(|len| {
            self.file.set_len(len)?;
            self.file.seek(SeekFrom::Start(len)).map(drop)
        });
        let path = self.path.clone();
        match undone.is_ok() && super::super::spool::is_full(&e) {
            true => Err(Error::StateFull { path, reason }),
            false => Err(Error::State { path, reason }),
        }
    }
}
