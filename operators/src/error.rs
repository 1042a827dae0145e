//! The one error type of `hydrant-operators`.

use arrow::error::ArrowError;

/// Everything that can go wrong while compiling or applying feature transforms.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// A step string could not be parsed, or its arguments are out of range.
    #[error("step `{step}`: {reason}")]
    BadStep {
        /// The step as written.
        step: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A feature group does not fit the input schema or its own output kind.
    #[error("group `{group}`, column `{column}`: {reason}")]
    Plan {
        /// The group's name.
        group: String,
        /// The column the problem is about.
        column: String,
        /// What is wrong.
        reason: String,
    },
    /// The pipeline's label does not fit the input.
    #[error("label column `{column}`: {reason}")]
    Label {
        /// The label's input column.
        column: String,
        /// What is wrong.
        reason: String,
    },
    /// The fitted state lacks something a step needs, or does not match the pipeline.
    #[error("fitted state: {0}")]
    State(String),
    /// An input batch does not match the schema the plan was compiled for.
    #[error("batch does not match the pipeline: {0}")]
    Schema(String),
    /// A row's label cannot be trained on (null, NaN or infinite).
    #[error(
        "label column `{column}` {reason} at row_id {row_id}: rows without a usable label \
         cannot be trained on (filter or fill them before hydrant)"
    )]
    BadLabel {
        /// The label's input column.
        column: String,
        /// The first such row.
        row_id: u64,
        /// What is wrong with its label.
        reason: String,
    },
    /// An Arrow kernel failed.
    #[error("arrow: {0}")]
    Arrow(#[from] Box<ArrowError>),
    /// Fitted state could not be read or written as JSON.
    #[error("fitted state JSON: {0}")]
    Json(#[from] Box<serde_json::Error>),
}

impl From<ArrowError> for OpError {
    fn from(e: ArrowError) -> Self {
        OpError::Arrow(Box::new(e))
    }
}

impl From<serde_json::Error> for OpError {
    fn from(e: serde_json::Error) -> Self {
        OpError::Json(Box::new(e))
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = OpError> = std::result::Result<T, E>;

impl OpError {
    pub(crate) fn plan(group: &str, column: &str, reason: impl Into<String>) -> Self {
        OpError::Plan {
            group: group.to_string(),
            column: column.to_string(),
            reason: reason.into(),
        }
    }
}

/// The most characters of someone else's text (a step, a name, a client's bytes) that an
/// error repeats.
pub const QUOTED_CHARS: usize = 200;

/// `text` as one line of at most [`QUOTED_CHARS`] characters, for an error message: control
/// characters escaped, the rest cut with `…`.
pub fn quoted(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == QUOTED_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_is_one_short_line() {
        let q = super::quoted(&format!("a\nb{}", "x".repeat(1000)));
        assert!(q.starts_with("a\\nb") && !q.contains('\n'), "{q}");
        assert_eq!(q.chars().count(), super::QUOTED_CHARS + 2);
    }

    #[test]
    fn error_stays_small() {
        // Results of this crate travel through every kernel; keep them cheap to move.
        assert!(std::mem::size_of::<super::OpError>() <= 80);
    }
}
