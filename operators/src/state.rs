//! `FittedState`: what fitting learned, saved as versioned JSON so the same parameters can
//! be used again (at serving time, or by `hydrant run --state`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{OpError, Result};
use crate::vocabulary::Vocabulary;

/// The layout of the JSON file; bumped when it changes incompatibly.
pub const STATE_FORMAT: u32 = 1;

/// Parameters learned for one fitted step of one column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FittedParam {
    /// Population mean and standard deviation.
    Standardize {
        /// Mean.
        mean: f64,
        /// Population standard deviation.
        std: f64,
    },
    /// Observed range.
    MinMax {
        /// Smallest value.
        min: f64,
        /// Largest value.
        max: f64,
    },
    /// Bucket boundaries, ascending.
    Quantiles {
        /// Boundaries.
        boundaries: Vec<f64>,
    },
    /// Vocabulary, index order.
    Vocab {
        /// Values; a value's position is its index.
        values: Vocabulary,
    },
}

/// Everything fitting learned for one pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FittedState {
    /// Layout version of this JSON ([`STATE_FORMAT`]).
    pub format: u32,
    /// The pipeline this state was fitted for.
    pub pipeline: String,
    /// Identifies these parameters: a hash of them, so equal states have equal versions.
    pub version: u64,
    /// Parameters by `group/column/step` (the step's position in the group's chain).
    pub params: BTreeMap<String, FittedParam>,
}

impl FittedState {
    /// A state holding `params`, versioned by their content.
    pub fn new(pipeline: &str, params: BTreeMap<String, FittedParam>) -> Self {
        let bytes = serde_json::to_vec(&params).unwrap_or_default();
        let version = xxhash_rust::xxh64::xxh64(&bytes, 0);
        FittedState {
            format: STATE_FORMAT,
            pipeline: pipeline.to_string(),
            version,
            params,
        }
    }

    /// An empty state, for pipelines (or fit stages) with nothing fitted yet.
    pub fn empty(pipeline: &str) -> Self {
        Self::new(pipeline, BTreeMap::new())
    }

    /// The key of a fitted step's parameters.
    pub fn key(group: &str, column: &str, step: usize) -> String {
        format!("{group}/{column}/{step}")
    }

    /// Reads a state from JSON, checking its format.
    pub fn from_json(text: &str) -> Result<Self> {
        let state: FittedState = serde_json::from_str(text)?;
        if state.format != STATE_FORMAT {
            return Err(OpError::State(format!(
                "format {} is not supported (expected {STATE_FORMAT})",
                state.format
            )));
        }
        Ok(state)
    }

    /// The state as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_keeps_version() {
        let mut params = BTreeMap::new();
        params.insert(
            FittedState::key("dense", "i0", 2),
            FittedParam::Standardize {
                mean: 1.5,
                std: 0.25,
            },
        );
        params.insert(
            FittedState::key("ids", "c0", 0),
            FittedParam::Vocab {
                values: ["a", "b"].into_iter().collect(),
            },
        );
        let state = FittedState::new("criteo", params);
        let back = FittedState::from_json(&state.to_json()).unwrap();
        assert_eq!(back, state);
        assert_ne!(state.version, FittedState::empty("criteo").version);
    }

    #[test]
    fn rejects_other_formats_and_unknown_fields() {
        let mut state = FittedState::empty("p");
        state.format = 9;
        let err = FittedState::from_json(&serde_json::to_string(&state).unwrap()).unwrap_err();
        assert!(err.to_string().contains("format 9"), "{err}");
        let err =
            FittedState::from_json(r#"{"format":1,"pipeline":"p","version":0,"params":{},"x":1}"#)
                .unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}
