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
    /// Vocabulary, index order; unseen and null values take the index after the last.
    Vocab {
        /// Values; a value's position is its index.
        values: Vocabulary,
    },
    /// Vocabulary whose unseen and null values take a fixed index: a refreshed
    /// vocabulary's `max_size`, which means the same in every version while values are
    /// added. (A variant of its own, not an optional field of `Vocab`: the states that
    /// cross processes are encoded with bincode, where a field left out is not allowed.)
    BoundedVocab {
        /// Values; a value's position is its index.
        values: Vocabulary,
        /// The index of values not in it: at least their number.
        unknown: u64,
    },
}

impl FittedParam {
    /// A vocabulary's values and fixed unknown index (`None`: after its last value).
    pub fn vocabulary(&self) -> Option<(&Vocabulary, Option<u64>)> {
        match self {
            FittedParam::Vocab { values } => Some((values, None)),
            FittedParam::BoundedVocab { values, unknown } => Some((values, Some(*unknown))),
            _ => None,
        }
    }
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
    /// What each parameter was fitted on, by the same keys: its chain up to and including
    /// the fitted step, as the pipeline writes it (`fill_null(0), log1p, standardize`). A
    /// pipeline whose chain differs there is refused: the statistics describe other
    /// values. States written before this was kept have none, and are not checked.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub chains: BTreeMap<String, String>,
}

impl FittedState {
    /// A state holding `params`, versioned by their content.
    pub fn new(pipeline: &str, params: BTreeMap<String, FittedParam>) -> Self {
        let version = Self::hash(&params);
        FittedState {
            format: STATE_FORMAT,
            pipeline: pipeline.to_string(),
            version,
            params,
            chains: BTreeMap::new(),
        }
    }

    /// This state, recording `chains` as what its parameters were fitted on (see
    /// [`FittedState::chains`]); its version, the hash of its parameters, is unchanged.
    pub fn with_chains(mut self, chains: BTreeMap<String, String>) -> Self {
        self.chains = chains;
        self
    }

    /// An empty state, for pipelines (or fit stages) with nothing fitted yet.
    pub fn empty(pipeline: &str) -> Self {
        Self::new(pipeline, BTreeMap::new())
    }

    /// The key of a fitted step's parameters.
    pub fn key(group: &str, column: &str, step: usize) -> String {
        format!("{group}/{column}/{step}")
    }

    /// The version of `params`: a hash of their JSON (floats print exactly, shortest
    /// first, so a state read back hashes as it was written). The JSON is hashed as it is
    /// written, never held: a state's vocabularies make it megabytes.
    fn hash(params: &BTreeMap<String, FittedParam>) -> u64 {
        /// Feeds what is written to the hash, through a buffer (serde_json writes a token
        /// at a time).
        struct Hashing(xxhash_rust::xxh64::Xxh64);
        impl std::io::Write for Hashing {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.update(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let hashing = Hashing(xxhash_rust::xxh64::Xxh64::new(0));
        let mut out = std::io::BufWriter::with_capacity(64 << 10, hashing);
        // Writing to memory cannot fail, and a map with string keys always serializes.
        let _ = serde_json::to_writer(&mut out, params);
        match out.into_inner() {
            Ok(hashing) => hashing.0.digest(),
            Err(_) => 0,
        }
    }

    /// Reads a state from JSON, checking its format, that its version is the hash of its
    /// parameters (so a version always identifies the statistics batches were made with)
    /// and every parameter's invariants.
    pub fn from_json(text: &str) -> Result<Self> {
        // serde's messages may quote the text (an unknown field, a bad string): bounded.
        let state: FittedState = serde_json::from_str(text).map_err(|e| {
            OpError::State(format!("JSON: {}", crate::error::quoted(&e.to_string())))
        })?;
        if state.format != STATE_FORMAT {
            return Err(OpError::State(format!(
                "format {} is not supported (expected {STATE_FORMAT})",
                state.format
            )));
        }
        let hash = Self::hash(&state.params);
        if state.version != hash {
            return Err(OpError::State(format!(
                "its parameters were changed after fitting: version {} is not their hash \
                 {hash} (refit, or set \"version\": {hash} to accept the edit)",
                state.version
            )));
        }
        state.check()?;
        Ok(state)
    }

    /// Checks every parameter: finite numbers, `std >= 0`, `min <= max` with a finite
    /// `max - min`, ascending boundaries, distinct vocabulary values.
    pub fn check(&self) -> Result<()> {
        for (key, param) in &self.params {
            Self::check_param(key, param)?;
        }
        Ok(())
    }

    /// Checks one parameter (see [`check`](Self::check)); `key` names it in the error.
    pub fn check_param(key: &str, param: &FittedParam) -> Result<()> {
        let bad = |reason: &str| {
            Err(OpError::State(format!(
                "`{}`: {reason}",
                crate::error::quoted(key)
            )))
        };
        match param {
            FittedParam::Standardize { mean, std } => {
                if !mean.is_finite() || !std.is_finite() || *std < 0.0 {
                    return bad("standardize needs a finite mean and a finite std >= 0");
                }
            }
            FittedParam::MinMax { min, max } => {
                // Their difference scales every value: an infinite one (min -1e308,
                // max 1e308) would make them all infinite or NaN.
                if !min.is_finite() || !max.is_finite() || min > max || !(max - min).is_finite() {
                    return bad("min_max needs finite min <= max, a finite distance apart");
                }
            }
            FittedParam::Quantiles { boundaries } => {
                if boundaries.iter().any(|b| !b.is_finite())
                    || boundaries.windows(2).any(|w| w[0] > w[1])
                {
                    return bad("quantile boundaries must be finite and ascending");
                }
            }
            FittedParam::Vocab { values } | FittedParam::BoundedVocab { values, .. } => {
                if let FittedParam::BoundedVocab { unknown, .. } = param
                    && *unknown < values.len() as u64
                {
                    return bad("a vocabulary's unknown index is one of its values'");
                }
                // foldhash, not std's SipHash: SipHash inserts were about a sixth of the
                // samples while a state with large vocabularies loaded (perf).
                let mut seen = foldhash::HashSet::with_capacity_and_hasher(
                    values.len(),
                    foldhash::fast::RandomState::default(),
                );
                if let Some(dup) = values.iter().find(|v| !seen.insert(*v)) {
                    let dup = crate::error::quoted(dup);
                    return bad(&format!("vocabulary value `{dup}` appears twice"));
                }
            }
        }
        Ok(())
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

    /// Every kind of parameter survives bincode, the encoding of the states that cross a
    /// cluster's processes (a field serde may leave out would desynchronize it).
    #[test]
    fn every_parameter_crosses_processes() {
        let values: Vocabulary = ["a", "b"].into_iter().collect();
        let params = [
            FittedParam::Standardize {
                mean: 1.5,
                std: 0.25,
            },
            FittedParam::MinMax {
                min: -1.0,
                max: 2.0,
            },
            FittedParam::Quantiles {
                boundaries: vec![0.5, 1.5],
            },
            FittedParam::Vocab {
                values: values.clone(),
            },
            FittedParam::BoundedVocab { values, unknown: 7 },
        ];
        for param in params {
            // Followed by another value, as in a map: a misread length shows there too.
            let pair = (param.clone(), 42u64);
            let bytes = bincode::serialize(&pair).unwrap();
            let back: (FittedParam, u64) = bincode::deserialize(&bytes).unwrap();
            assert_eq!(back, pair);
        }
    }

    /// The streamed hash is the hash of the whole JSON, as versions always were.
    #[test]
    fn the_version_is_the_hash_of_the_parameters_json() {
        let mut params = BTreeMap::new();
        let values: Vocabulary = (0..50_000).map(|i| format!("v\"{i}")).collect();
        params.insert(
            FittedState::key("ids", "c0", 0),
            FittedParam::Vocab { values },
        );
        let bytes = serde_json::to_vec(&params).unwrap();
        assert!(bytes.len() > 64 << 10, "more than the buffer");
        let state = FittedState::new("p", params);
        assert_eq!(state.version, xxhash_rust::xxh64::xxh64(&bytes, 0));
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
