//! The one error type of the `hydrant` crate. Every variant prints as one line that names
//! what was wrong: the file, the group, the column.

use std::path::PathBuf;

/// Everything that can stop a hydrant command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pipeline file is malformed or does not fit the input.
    #[error("pipeline {file}: {reason}")]
    Spec {
        /// The pipeline file (or `<builder>` for pipelines built in code).
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// An input file cannot be read as what it claims to be.
    #[error("input {}: {reason}", one_line_path(path))]
    Input {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A fitted state file is unreadable or does not match the pipeline.
    #[error("state {}: {reason}", one_line_path(path))]
    State {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file system holding a state file is full (or over its quota): the same call
    /// can work once space is freed.
    #[error("state {}: {reason}", one_line_path(path))]
    StateFull {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A feature transform failed.
    #[error(transparent)]
    Op(#[from] Box<hydrant_operators::OpError>),
    /// Writing output failed.
    #[error("sink {sink}: {reason}")]
    Sink {
        /// The sink as given.
        sink: String,
        /// What went wrong.
        reason: String,
    },
    /// A command-line value is out of range or inconsistent.
    #[error("{0}")]
    Usage(String),
    /// The dataflow could not start or a worker failed.
    #[error("dataflow: {0}")]
    Dataflow(String),
}

impl Error {
    /// Records this error in a run's error slot as having come from `origin`, unless an
    /// earlier one is there. Whoever reports the slot says it was the dataflow's, so the
    /// text goes in without a `dataflow:` of its own or the name of the layer that caught
    /// it: "dataflow: input F: …", not "dataflow: worker: dataflow: input F: …".
    pub(crate) fn record_in(&self, errors: &hydrant_operators::ErrorSlot, origin: &str) {
        match self {
            Error::Dataflow(why) => errors.set_from(origin, why),
            other => errors.set_from(origin, &other.to_string()),
        }
    }

    /// Where this error comes from, as a run's error slot records it (see [`origin`]).
    pub(crate) fn origin(&self) -> &'static str {
        match self {
            Error::Input { .. } | Error::State { .. } | Error::StateFull { .. } => origin::INPUT,
            _ => origin::RUN,
        }
    }
}

/// Where a run's failure came from, as its error slot records it
/// ([`ErrorSlot::origin`](hydrant_operators::ErrorSlot::origin)): a server tells its
/// trainers which it was, since what they should do differs (fix the input, restart the
/// cluster, report a bug).
pub(crate) mod origin {
    /// Input that cannot be read: a file (at start or during a run), or pushed or
    /// followed input that cannot be admitted or replayed.
    pub const INPUT: &str = "input";
    /// An input file read during a run (the source operator).
    pub const SOURCE: &str = "source";
    /// A process of the cluster was lost.
    pub const CLUSTER: &str = "cluster";
    /// The run itself.
    pub const RUN: &str = "run";
}

impl From<hydrant_operators::OpError> for Error {
    fn from(e: hydrant_operators::OpError) -> Self {
        Error::Op(Box::new(e))
    }
}

impl From<arrow::error::ArrowError> for Error {
    fn from(e: arrow::error::ArrowError) -> Self {
        Error::Dataflow(one_line(e))
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its sources as one line.
pub fn error_line(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        line.push_str(": ");
        line.push_str(&s.to_string());
        source = s.source();
    }
    one_line(line)
}

/// Flattens an error's text to one line (parser errors often span several).
pub(crate) fn one_line(text: impl std::fmt::Display) -> String {
    text.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `path` as one line of text: control characters (a newline in a folder's name) escaped
/// as Rust writes them, everything else as it is.
pub(crate) fn one_line_path(path: &std::path::Path) -> String {
    let text = path.display().to_string();
    match text.chars().any(char::is_control) {
        true => text.chars().flat_map(char::escape_default).collect(),
        false => text,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_stays_small() {
        assert!(std::mem::size_of::<super::Error>() <= 64);
    }

    #[test]
    fn a_path_is_named_on_one_line() {
        let e = super::Error::State {
            path: "/tmp/a\nb/c".into(),
            reason: "gone".into(),
        };
        assert_eq!(e.to_string(), "state /tmp/a\\nb/c: gone");
        let plain = super::one_line_path(std::path::Path::new("/tmp/ä b"));
        assert_eq!(plain, "/tmp/ä b");
    }
}
