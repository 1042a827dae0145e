//! `PipelineSpec`: a pipeline as written in TOML.
//!
//! ```toml
//! name = "criteo"
//! label = { column = "label", type = "float32" }
//!
//! [[group]]
//! name = "dense"
//! kind = "dense"
//! columns = ["i0", "i1"]
//! steps = ["fill_null(0)", "log1p", "standardize", "clip(-3, 3)"]
//! ```

use std::path::Path;

use arrow::datatypes::Schema;
use hydrant_operators::{FeatureGroup, FeaturePlan, GroupKind, LabelSpec, Step};
use serde::Deserialize;

use crate::error::{Error, Result, one_line};

/// Rows per batch read from the input, unless the pipeline says otherwise.
pub const DEFAULT_BATCH_ROWS: usize = 8192;

/// The most rows per batch read that a pipeline may ask for.
pub const MAX_BATCH_ROWS: usize = 1 << 24;

/// A pipeline: its inputs' features, label and batching.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineSpec {
    /// Name: what tickets, states and summaries call it.
    pub name: String,
    /// Where the file came from, for error messages.
    pub origin: String,
    /// The label, if the pipeline delivers one.
    pub label: Option<LabelSpec>,
    /// Feature groups, in output order.
    pub groups: Vec<FeatureGroup>,
    /// Rows per batch read from the input.
    pub batch_rows: usize,
    /// Where rows come from: files given on the command line, or pushed over Flight.
    pub input: InputKind,
    /// The timestamp column holding each row's event time (`event_time = "ts"`): a
    /// stream's freshness then reports how old delivered events are. Rows pushed or
    /// followed without it (or with another type) are refused.
    pub event_time: Option<String>,
    /// How a streamed pipeline's statistics change as rows arrive (`[stats]`).
    pub stats: StatsSpec,
}

/// How a streamed pipeline's statistics change as rows arrive:
///
/// ```toml
/// [stats]
/// mode = "refresh"   # or "frozen" (the default): the state never changes
/// warmup = 65536     # without --state, the first version is fitted on these rows
/// every = 1000000    # a new version from all rows so far, every this many rows
/// decay = 5000000    # optional: rows this much older count half (a half-life)
/// ```
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsSpec {
    /// Frozen or refreshed.
    #[serde(default)]
    pub mode: StatsMode,
    /// Rows the first version is fitted on (or, with a given state, before the first
    /// refresh).
    #[serde(default)]
    pub warmup: Option<u64>,
    /// Rows between refreshes.
    #[serde(default)]
    pub every: Option<u64>,
    /// The half-life, in rows, of decayed statistics; `None`: all rows weigh the same.
    #[serde(default)]
    pub decay: Option<f64>,
}

/// Whether a streamed pipeline's statistics change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatsMode {
    /// The state given (or fitted) at start serves the whole stream.
    #[default]
    Frozen,
    /// Fitted on the first rows, then refreshed as rows arrive, each version stamped on
    /// the batches it featurized.
    Refresh,
}

/// Rows the first version is fitted on, unless `[stats] warmup` says otherwise.
pub const DEFAULT_WARMUP: u64 = 65_536;

/// Rows between refreshes, unless `[stats] every` says otherwise.
pub const DEFAULT_EVERY: u64 = 1_000_000;

impl StatsSpec {
    /// Whether the state is refreshed.
    pub fn refreshes(&self) -> bool {
        self.mode == StatsMode::Refresh
    }

    /// Rows the first version is fitted on.
    pub fn warmup(&self) -> u64 {
        self.warmup.unwrap_or(DEFAULT_WARMUP)
    }

    /// Rows between refreshes.
    pub fn every(&self) -> u64 {
        self.every.unwrap_or(DEFAULT_EVERY)
    }

    fn check(&self) -> std::result::Result<(), String> {
        let set = self.warmup.is_some() || self.every.is_some() || self.decay.is_some();
        if !self.refreshes() && set {
            return Err(
                "[stats] warmup, every and decay apply with mode = \"refresh\" only".into(),
            );
        }
        if self.warmup == Some(0) || self.every == Some(0) {
            return Err("[stats] warmup and every must be at least 1 row".into());
        }
        if self.decay.is_some_and(|d| !(d.is_finite() && d > 0.0)) {
            return Err("[stats] decay must be a positive number of rows (a half-life)".into());
        }
        Ok(())
    }
}

/// Where a pipeline's rows come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    /// Parquet / Arrow IPC files (`--input`).
    #[default]
    Files,
    /// Batches pushed by producers with Flight DoPut (`hydrant serve` only).
    Flight,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: String,
    label: Option<LabelSpec>,
    #[serde(default)]
    batch_rows: Option<usize>,
    #[serde(default)]
    input: InputKind,
    #[serde(default)]
    event_time: Option<String>,
    #[serde(rename = "group", default)]
    groups: Vec<RawGroup>,
    #[serde(default)]
    stats: StatsSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: String,
    kind: GroupKind,
    columns: Vec<String>,
    #[serde(default)]
    steps: Vec<String>,
}

/// The largest pipeline file read (a pipeline is a few KiB of TOML).
const MAX_SPEC_BYTES: u64 = 16 << 20;

impl PipelineSpec {
    /// Reads and checks a pipeline file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let origin = path.display().to_string();
        let text =
            hydrant_operators::read_small_text(path, MAX_SPEC_BYTES).map_err(|e| Error::Spec {
                file: origin.clone(),
                reason: one_line(e),
            })?;
        Self::from_toml(&text, &origin)
    }

    /// Parses a pipeline from TOML text; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self> {
        let spec_err = |reason: String| Error::Spec {
            file: origin.to_string(),
            reason,
        };
        let raw: RawSpec = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            spec_err(match line {
                Some(l) => format!("line {l}: {}", one_line(e.message())),
                None => one_line(e.message()),
            })
        })?;
        let mut groups = Vec::with_capacity(raw.groups.len());
        for g in raw.groups {
            let steps = g
                .steps
                .iter()
                .map(|s| Step::parse(s).map_err(|e| spec_err(format!("group `{}`: {e}", g.name))))
                .collect::<Result<Vec<_>>>()?;
            groups.push(FeatureGroup {
                name: g.name,
                kind: g.kind,
                columns: g.columns,
                steps,
            });
        }
        let spec = PipelineSpec {
            name: raw.name,
            origin: origin.to_string(),
            label: raw.label,
            groups,
            batch_rows: raw.batch_rows.unwrap_or(DEFAULT_BATCH_ROWS),
            input: raw.input,
            event_time: raw.event_time,
            stats: raw.stats,
        };
        spec.check()?;
        Ok(spec)
    }

    /// A pipeline built in code; `origin` names it in errors.
    pub fn new(
        name: &str,
        origin: &str,
        label: Option<LabelSpec>,
        groups: Vec<FeatureGroup>,
        batch_rows: usize,
    ) -> Result<Self> {
        let spec = PipelineSpec {
            name: name.into(),
            origin: origin.into(),
            label,
            groups,
            batch_rows,
            input: InputKind::Files,
            event_time: None,
            stats: StatsSpec::default(),
        };
        spec.check()?;
        Ok(spec)
    }

    fn check(&self) -> Result<()> {
        let bad = |reason: &str| {
            Err(Error::Spec {
                file: self.origin.clone(),
                reason: reason.to_string(),
            })
        };
        if self.name.is_empty()
            || self.name.len() > hydrant_operators::MAX_GROUP_NAME
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return bad(&format!(
                "name must be 1 to {} letters, digits, `_` or `-`",
                hydrant_operators::MAX_GROUP_NAME
            ));
        }
        if self.groups.is_empty() {
            return bad("no [[group]] of features");
        }
        if self.event_time.as_ref().is_some_and(|c| c.is_empty()) {
            return bad("event_time names no column");
        }
        self.stats.check().or_else(|e| bad(&e))?;
        if !(1..=MAX_BATCH_ROWS).contains(&self.batch_rows) {
            return bad(&format!("batch_rows must be 1 to {MAX_BATCH_ROWS}"));
        }
        hydrant_operators::check_group_names(&self.groups).map_err(|e| Error::Spec {
            file: self.origin.clone(),
            reason: e.to_string(),
        })?;
        Ok(())
    }

    /// The input schema the pipeline implies when no file shows it (pushed input): string
    /// columns for `vocab`/`hash_bucket` chains, int64 for an `ids` group's columns with no
    /// steps (ids passed through), float64 for the rest, float32 label.
    /// Pushed batches are checked against the pipeline one by one, not against this.
    pub fn nominal_schema(&self) -> Schema {
        use arrow::datatypes::{DataType, Field};
        let mut fields: Vec<Field> = Vec::new();
        let mut add = |name: &str, t: DataType| {
            if !fields.iter().any(|f| f.name() == name) {
                fields.push(Field::new(name, t, true));
            }
        };
        if let Some(l) = &self.label {
            add(&l.column, DataType::Float32);
        }
        for g in &self.groups {
            let strings = g
                .steps
                .iter()
                .any(|s| matches!(s, Step::Vocab { .. } | Step::HashBucket(_)));
            let passed_ids = g.kind == GroupKind::Ids && g.steps.is_empty();
            for c in &g.columns {
                add(
                    c,
                    if strings {
                        DataType::Utf8
                    } else if passed_ids {
                        DataType::Int64
                    } else {
                        DataType::Float64
                    },
                );
            }
        }
        Schema::new(fields)
    }

    /// Checks the pipeline against an input schema, before any data is read.
    pub fn plan(&self, schema: &Schema) -> Result<FeaturePlan> {
        FeaturePlan::compile(&self.name, &self.groups, self.label.as_ref(), schema).map_err(|e| {
            Error::Spec {
                file: self.origin.clone(),
                reason: e.to_string(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field};

    const GOOD: &str = r#"
name = "t"
label = { column = "y" }
batch_rows = 100

[[group]]
name = "dense"
kind = "dense"
columns = ["a"]
steps = ["fill_null(0)", "log1p", "standardize", "clip(-3, 3)"]
"#;

    #[test]
    fn stats_are_frozen_unless_refreshed_and_checked() {
        let spec = PipelineSpec::from_toml(GOOD, "t.toml").unwrap();
        assert!(!spec.stats.refreshes());
        let with =
            |stats: &str| PipelineSpec::from_toml(&format!("{GOOD}\n[stats]\n{stats}"), "t.toml");
        let s = with("mode = \"refresh\"\nwarmup = 10\nevery = 20\ndecay = 1e6").unwrap();
        assert!(s.stats.refreshes());
        assert_eq!(
            (s.stats.warmup(), s.stats.every(), s.stats.decay),
            (10, 20, Some(1e6))
        );
        let d = with("mode = \"refresh\"").unwrap();
        assert_eq!(
            (d.stats.warmup(), d.stats.every()),
            (DEFAULT_WARMUP, DEFAULT_EVERY)
        );
        for (bad, says) in [
            ("every = 5", "mode = \"refresh\" only"),
            ("mode = \"refresh\"\nevery = 0", "at least 1 row"),
            ("mode = \"refresh\"\ndecay = -1.0", "half-life"),
            ("mode = \"sometimes\"", "line"),
            ("mode = \"refresh\"\nevry = 5", "evry"),
        ] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    /// Pushed and followed input compile the plan against the nominal schema: an `ids`
    /// column with no steps passes integers through, so it is nominally an integer.
    #[test]
    fn the_nominal_schema_compiles_for_every_kind_of_group() {
        let ids = "name = \"t\"\nlabel = { column = \"y\" }\n[[group]]\nname = \"ids\"\n\
                   kind = \"ids\"\ncolumns = [\"k\"]\nsteps = []\n[[group]]\nname = \"b\"\n\
                   kind = \"ids\"\ncolumns = [\"x\"]\nsteps = [\"bucketize(0, 1)\"]\n";
        for text in [GOOD, ids] {
            let spec = PipelineSpec::from_toml(text, "t.toml").unwrap();
            spec.plan(&spec.nominal_schema()).unwrap();
        }
    }

    #[test]
    fn parses_a_pipeline() {
        let spec = PipelineSpec::from_toml(GOOD, "t.toml").unwrap();
        assert_eq!(spec.name, "t");
        assert_eq!(spec.batch_rows, 100);
        assert_eq!(spec.groups[0].steps.len(), 4);
        assert_eq!(spec.event_time, None);
        let timed = GOOD.replace("batch_rows = 100", "event_time = \"ts\"");
        let timed = PipelineSpec::from_toml(&timed, "t.toml").unwrap();
        assert_eq!(timed.event_time.as_deref(), Some("ts"));
        let schema = Schema::new(vec![
            Field::new("a", DataType::Float64, true),
            Field::new("y", DataType::Int32, false),
        ]);
        assert!(spec.plan(&schema).is_ok());
    }

    #[test]
    fn errors_name_the_file_group_and_problem() {
        for (text, needles) in [
            (
                GOOD.replace("log1p", "lg"),
                vec!["t.toml", "group `dense`", "step `lg`", "unknown step"],
            ),
            (
                GOOD.replace("clip(-3, 3)", "clip(3, -3)"),
                vec!["group `dense`", "lo <= hi"],
            ),
            (
                GOOD.replace("kind = \"dense\"", "kind = \"sparse\""),
                vec!["t.toml", "line", "sparse"],
            ),
            (
                GOOD.replace("batch_rows = 100", "batch_rows = 100\ncolour = 1"),
                vec!["unknown field", "colour"],
            ),
            (
                GOOD.replace("batch_rows = 100", "batch_rows = 0"),
                vec!["batch_rows"],
            ),
            ("name = \"x\"".to_string(), vec!["no [[group]]"]),
            (
                GOOD.replace("name = \"dense\"", "name = \"is_padding\""),
                vec!["group `is_padding`", "reserved"],
            ),
            (
                GOOD.replace("name = \"dense\"", "name = \"a/b\""),
                vec!["group `a/b`", "letters, digits"],
            ),
            (
                GOOD.replace("name = \"dense\"", "name = \"\""),
                vec!["letters, digits"],
            ),
            (
                GOOD.replace("name = \"dense\"", "name = \"x\\ny\""),
                vec!["group `x\\ny`"],
            ),
            ("name = ".to_string(), vec!["t.toml", "line 1"]),
            (
                GOOD.replace("batch_rows = 100", "batch_rows = 100\nevent_time = \"\""),
                vec!["event_time names no column"],
            ),
        ] {
            let err = PipelineSpec::from_toml(&text, "t.toml")
                .unwrap_err()
                .to_string();
            assert!(!err.contains('\n'), "{err}");
            for n in needles {
                assert!(err.contains(n), "{n:?} not in {err}");
            }
        }
        let spec = PipelineSpec::from_toml(GOOD, "t.toml").unwrap();
        let schema = Schema::new(vec![Field::new("b", DataType::Float64, true)]);
        let err = spec.plan(&schema).unwrap_err().to_string();
        assert!(
            err.contains("t.toml") && err.contains("column `a`") && err.contains("no such column"),
            "{err}"
        );
    }
}
