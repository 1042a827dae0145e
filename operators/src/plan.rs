//! `FeaturePlan`: feature groups checked against an input schema once, before any data is
//! read, so that applying them to a batch re-checks nothing but the batch's own types.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::error::{OpError, Result};
use crate::group::{FeatureGroup, GroupKind, LabelSpec};
use crate::kernels::categorical::is_string_type;
use crate::step::Step;

/// The column every hydrant batch carries: the row's ordinal in the input.
pub const ROW_ID: &str = "row_id";

/// Column names that delivery adds beside the groups' tensors (the label, padding flags,
/// and the Parquet sink's placement columns): no group may be called by one of them.
pub const RESERVED_NAMES: [&str; 6] = [ROW_ID, "label", "is_padding", "rank", "epoch", "step"];

/// The longest group name accepted.
pub const MAX_GROUP_NAME: usize = 64;

/// Checks the names of `groups`: each is 1 to [`MAX_GROUP_NAME`] ASCII letters, digits,
/// `_` or `-`, starting with a letter or `_` (names become column names and keys of the
/// fitted state, `group/column/step`), is not one of [`RESERVED_NAMES`], and is unique.
pub fn check_group_names(groups: &[FeatureGroup]) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for group in groups {
        let name = group.name.as_str();
        let shown = crate::error::quoted(name);
        let bad = |reason: &str| Err(OpError::plan(&shown, "-", reason));
        let well_formed = (1..=MAX_GROUP_NAME).contains(&name.len())
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !well_formed {
            return bad(&format!(
                "a group name is 1 to {MAX_GROUP_NAME} letters, digits, `_` or `-`, \
                 starting with a letter or `_`"
            ));
        }
        if RESERVED_NAMES.contains(&name) {
            return bad(&format!(
                "`{name}` is a column that delivery adds (reserved: {})",
                RESERVED_NAMES.join(", ")
            ));
        }
        if !seen.insert(name) {
            return bad("two groups have this name");
        }
    }
    Ok(())
}

/// What kind of input a column is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Integers, floats, booleans: read as float64.
    Numeric {
        /// Integers may pass into an ids tensor unchanged.
        integer: bool,
    },
    /// Strings, plain or dictionary-encoded.
    Str,
    /// A ready tensor (`FixedSizeList<Float32|Int64, width>`), passed through unchanged:
    /// for inputs that are already featurized.
    Tensor {
        /// Values per row.
        width: usize,
        /// Int64 values (an ids tensor) rather than Float32.
        ids: bool,
    },
}

/// One column of one group, with its chain.
#[derive(Debug, Clone)]
pub(crate) struct ColumnPlan {
    pub name: String,
    pub source: Source,
    /// Where its values start in the group's tensor row.
    pub offset: usize,
}

/// One group, checked.
#[derive(Debug, Clone)]
pub(crate) struct GroupPlan {
    pub spec: FeatureGroup,
    pub columns: Vec<ColumnPlan>,
    pub width: usize,
}

/// Feature groups and label, checked against an input schema.
#[derive(Debug, Clone)]
pub struct FeaturePlan {
    pub(crate) pipeline: String,
    pub(crate) groups: Vec<GroupPlan>,
    pub(crate) label: Option<LabelSpec>,
    output: SchemaRef,
}

impl FeaturePlan {
    /// Checks `groups` and `label` against `input` (the schema of the data, without
    /// `row_id`): every column exists, its type suits the steps, and each chain makes the
    /// kind of tensor its group asks for.
    pub fn compile(
        pipeline: &str,
        groups: &[FeatureGroup],
        label: Option<&LabelSpec>,
        input: &Schema,
    ) -> Result<Self> {
        check_group_names(groups)?;
        let mut plans = Vec::with_capacity(groups.len());
        for group in groups {
            let name = &group.name;
            if group.columns.is_empty() {
                return Err(OpError::plan(name, "-", "group lists no columns"));
            }
            let mut columns = Vec::with_capacity(group.columns.len());
            let mut offset = 0;
            for (k, column) in group.columns.iter().enumerate() {
                if group.columns[..k].contains(column) {
                    return Err(OpError::plan(name, column, "listed twice in the group"));
                }
                let field = input.field_with_name(column).map_err(|_| {
                    OpError::plan(
                        name,
                        column,
                        format!(
                            "no such column in the input (it has: {})",
                            field_names(input)
                        ),
                    )
                })?;
                let source = source_of(field.data_type()).ok_or_else(|| {
                    OpError::plan(
                        name,
                        column,
                        format!(
                            "type {} is neither numeric, string nor a float32/int64 tensor",
                            field.data_type()
                        ),
                    )
                })?;
                let width = check_chain(group, column, source)?;
                columns.push(ColumnPlan {
                    name: column.clone(),
                    source,
                    offset,
                });
                offset += width;
            }
            plans.push(GroupPlan {
                spec: group.clone(),
                columns,
                width: offset,
            });
        }
        if let Some(label) = label {
            let bad = |reason: String| OpError::Label {
                column: label.column.clone(),
                reason,
            };
            let field = input.field_with_name(&label.column).map_err(|_| {
                bad(format!(
                    "no such column in the input (it has: {})",
                    field_names(input)
                ))
            })?;
            if !matches!(source_of(field.data_type()), Some(Source::Numeric { .. })) {
                return Err(bad(format!("type {} is not numeric", field.data_type())));
            }
        }
        let output = output_schema(&plans, label);
        Ok(FeaturePlan {
            pipeline: pipeline.to_string(),
            groups: plans,
            label: label.cloned(),
            output,
        })
    }

    /// The schema of every batch the plan produces: `row_id`, `label` (if any), then one
    /// tensor column per group.
    pub fn output_schema(&self) -> SchemaRef {
        self.output.clone()
    }

    /// A fingerprint of what the plan does: its name, each group's columns (and what each
    /// is read as), steps and width, and its label; the same in every process of a build.
    /// The output schema alone (names and widths) took a pipeline with other steps (a
    /// `clip` with other bounds, another vocabulary size) for the same one.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        // Debug forms: every part is a plain value (no map whose order could differ), and
        // `DefaultHasher::new()` hashes alike in every process.
        let described = format!("{:?}|{:?}|{:?}", self.pipeline, self.groups, self.label);
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        described.hash(&mut hash);
        hash.finish()
    }

    /// The pipeline's name.
    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// Each fitted step's chain up to and including it, by parameter key (see
    /// [`FittedState::chains`](crate::FittedState::chains)).
    pub fn fitted_chains(&self) -> std::collections::BTreeMap<String, String> {
        let mut chains = std::collections::BTreeMap::new();
        for g in &self.groups {
            let steps = &g.spec.steps;
            for (at, _) in steps.iter().enumerate().filter(|(_, s)| s.is_fitted()) {
                let chain: Vec<String> = steps[..=at].iter().map(|s| s.to_string()).collect();
                for c in &g.columns {
                    let key = crate::FittedState::key(&g.spec.name, &c.name, at);
                    chains.insert(key, chain.join(", "));
                }
            }
        }
        chains
    }

    /// A hash of what the plan makes of its input: every group's name, kind, columns and
    /// steps, and the label. A stream recorded with one hash is featurized otherwise
    /// under another.
    pub fn features_hash(&self) -> u64 {
        let groups: Vec<&FeatureGroup> = self.groups.iter().map(|g| &g.spec).collect();
        let json = serde_json::to_vec(&(&groups, &self.label)).unwrap_or_default();
        xxhash_rust::xxh64::xxh64(&json, 0)
    }

    /// Fails where `state` was fitted for another pipeline or on another chain (see
    /// [`check_chains`](Self::check_chains)); whether it holds every parameter is checked
    /// when it is bound.
    pub fn check_fitted_for(&self, state: &crate::FittedState) -> Result<()> {
        if state.pipeline != self.pipeline {
            return Err(OpError::State(format!(
                "it was fitted for pipeline `{}`, not `{}`",
                state.pipeline, self.pipeline
            )));
        }
        self.check_chains(state)
    }

    /// Fails where `state` was fitted on another chain than this plan's before a fitted
    /// step (a changed `fill_null`, a step added before `standardize`): its statistics
    /// describe other values. Keys the state has no chain for are not checked.
    pub fn check_chains(&self, state: &crate::FittedState) -> Result<()> {
        if state.chains.is_empty() {
            return Ok(());
        }
        for (key, now) in self.fitted_chains() {
            if let Some(then) = state.chains.get(&key)
                && then != &now
            {
                return Err(OpError::State(format!(
                    "`{key}` was fitted after `{then}`, and the pipeline now has `{now}`: \
                     refit it (hydrant fit)"
                )));
            }
        }
        Ok(())
    }

    /// The input columns the plan reads, label first.
    pub fn input_columns(&self) -> Vec<String> {
        let mut cols: Vec<String> = self.label.iter().map(|l| l.column.clone()).collect();
        for g in &self.groups {
            for c in &g.columns {
                if !cols.contains(&c.name) {
                    cols.push(c.name.clone());
                }
            }
        }
        cols
    }

    /// Input string columns, which are best read dictionary-encoded.
    pub fn string_columns(&self) -> Vec<String> {
        self.groups
            .iter()
            .flat_map(|g| g.columns.iter())
            .filter(|c| c.source == Source::Str)
            .map(|c| c.name.clone())
            .collect()
    }

    /// How many passes fitting needs: a fitted step's input depends on the fitted steps
    /// before it, so the k-th fitted step of a chain is fitted in pass k.
    pub fn fit_passes(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.spec.steps.iter().filter(|s| s.is_fitted()).count())
            .max()
            .unwrap_or(0)
    }
}

fn field_names(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn source_of(t: &DataType) -> Option<Source> {
    if let DataType::FixedSizeList(item, width) = t {
        return match item.data_type() {
            DataType::Float32 => Some(Source::Tensor {
                width: *width as usize,
                ids: false,
            }),
            DataType::Int64 => Some(Source::Tensor {
                width: *width as usize,
                ids: true,
            }),
            _ => None,
        };
    }
    if t.is_integer() {
        Some(Source::Numeric { integer: true })
    } else if t.is_floating() || t.is_numeric() || *t == DataType::Boolean {
        Some(Source::Numeric { integer: false })
    } else if is_string_type(t) {
        Some(Source::Str)
    } else {
        None
    }
}

/// Checks a group's chain for one column and returns how many tensor slots it fills.
///
/// Shapes allowed:
/// - numeric: float steps*, then optionally a bucket step, then optionally one_hot
///   (dense only); an ids group needs an index: a bucket step, or an integer column with
///   no steps;
/// - string: vocab or hash_bucket, then one_hot in a dense group.
fn check_chain(group: &FeatureGroup, column: &str, source: Source) -> Result<usize> {
    let bad = |reason: String| Err(OpError::plan(&group.name, column, reason));
    let steps = &group.steps;
    if let Source::Tensor { width, ids } = source {
        return match (steps.is_empty(), ids, group.kind) {
            (false, _, _) => {
                bad("a tensor column passes through unchanged: give its group no steps".into())
            }
            (true, false, GroupKind::Dense) | (true, true, GroupKind::Ids) => Ok(width),
            (true, _, _) => bad(format!(
                "a {} tensor cannot go into a {} group",
                if ids { "int64" } else { "float32" },
                if group.kind == GroupKind::Ids {
                    "ids"
                } else {
                    "dense"
                }
            )),
        };
    }
    let mut index = false; // the chain has produced an integer index
    let mut one_hot = None;
    for step in steps {
        let s = step.to_string();
        if one_hot.is_some() {
            return bad(format!("step `{s}` follows one_hot, which must come last"));
        }
        match (step, source) {
            (Step::Vocab { .. } | Step::HashBucket(_), Source::Str) if !index => index = true,
            (Step::Vocab { .. } | Step::HashBucket(_), Source::Str) => {
                return bad(format!("step `{s}` comes twice"));
            }
            (Step::Vocab { .. } | Step::HashBucket(_), Source::Numeric { .. }) => {
                return bad(format!("step `{s}` needs a string column"));
            }
            (Step::OneHot(n), _) => {
                if group.kind == GroupKind::Ids {
                    return bad(format!(
                        "step `{s}` makes floats; it belongs in a dense group"
                    ));
                }
                if !index && !matches!(source, Source::Numeric { integer: true }) {
                    return bad(format!(
                        "step `{s}` needs an index: put vocab, hash_bucket or bucketize before it"
                    ));
                }
                one_hot = Some(*n);
            }
            (_, Source::Str) if !index => {
                return bad(format!(
                    "step `{s}` needs a number; a string column starts with vocab or hash_bucket"
                ));
            }
            (_, _) if index => return bad(format!("step `{s}` cannot follow an index step")),
            (Step::Bucketize(_) | Step::QuantileBucketize(_), _) => index = true,
            _ => {}
        }
    }
    let integer = matches!(source, Source::Numeric { integer: true });
    match group.kind {
        GroupKind::Ids if !(index || integer && steps.is_empty()) => bad(
            "an ids group needs an integer id: end the chain with vocab, hash_bucket, bucketize or \
             quantile_bucketize (or give an integer column no steps)"
                .into(),
        ),
        GroupKind::Dense if source == Source::Str && one_hot.is_none() => {
            bad("a string column in a dense group needs one_hot(n) after its index step".into())
        }
        _ => Ok(one_hot.unwrap_or(1)),
    }
}

fn output_schema(groups: &[GroupPlan], label: Option<&LabelSpec>) -> SchemaRef {
    let mut fields = vec![Field::new(ROW_ID, DataType::UInt64, false)];
    if let Some(label) = label {
        fields.push(Field::new("label", label.dtype.data_type(), true));
    }
    for g in groups {
        let item = match g.spec.kind {
            GroupKind::Dense => DataType::Float32,
            GroupKind::Ids => DataType::Int64,
        };
        let list =
            DataType::FixedSizeList(Arc::new(Field::new_list_field(item, false)), g.width as i32);
        fields.push(Field::new(&g.spec.name, list, false));
    }
    Arc::new(Schema::new(fields))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::LabelType;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("x", DataType::Float64, true),
            Field::new("n", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
            Field::new(
                "d",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
            Field::new("b", DataType::Binary, true),
        ])
    }

    fn group(kind: GroupKind, cols: &[&str], steps: &[&str]) -> FeatureGroup {
        FeatureGroup::new(
            "g",
            kind,
            cols,
            steps.iter().map(|s| Step::parse(s).unwrap()).collect(),
        )
    }

    /// A state fitted on one chain is refused by a plan whose chain before a fitted step
    /// differs, and taken by one that differs only after it; a state with no chains
    /// recorded (written before they were) is not checked.
    #[test]
    fn a_state_fitted_on_another_chain_is_refused() {
        let compile = |steps: &[&str]| {
            let g = group(GroupKind::Dense, &["x"], steps);
            FeaturePlan::compile("p", &[g], None, &schema()).unwrap()
        };
        let fitted = compile(&["fill_null(0)", "standardize"]);
        let params = [(
            crate::FittedState::key("g", "x", 1),
            crate::FittedParam::Standardize {
                mean: 1.0,
                std: 2.0,
            },
        )];
        let state = crate::FittedState::new("p", params.into_iter().collect());
        let recorded = state.clone().with_chains(fitted.fitted_chains());
        assert_eq!(
            recorded.chains["g/x/1"], "fill_null(0), standardize",
            "{recorded:?}"
        );
        assert!(fitted.transformer(&recorded).is_ok());
        let changed = compile(&["fill_null(1000)", "standardize"]);
        let err = changed.transformer(&recorded).err().unwrap().to_string();
        assert!(
            err.contains(
                "`g/x/1` was fitted after `fill_null(0), standardize`, and the pipeline \
                 now has `fill_null(1000), standardize`"
            ),
            "{err}"
        );
        assert!(
            changed.transformer(&state).is_ok(),
            "no chains: not checked"
        );
        let after = compile(&["fill_null(0)", "standardize", "clip(-3, 3)"]);
        assert!(
            after.transformer(&recorded).is_ok(),
            "a step after it changes nothing"
        );
    }

    #[test]
    fn accepts_the_shapes_it_documents() {
        use GroupKind::*;
        for (kind, cols, steps, width) in [
            (
                Dense,
                &["x", "n"][..],
                &["fill_null(0)", "log1p", "standardize", "clip(-3, 3)"][..],
                2,
            ),
            (Dense, &["x"], &["bucketize(0, 1)"], 1),
            (Dense, &["x"], &["quantile_bucketize(4)", "one_hot(6)"], 6),
            (
                Dense,
                &["s", "d"],
                &["vocab(max_size=9)", "one_hot(10)"],
                20,
            ),
            (Dense, &["n"], &["one_hot(3)"], 3),
            (Ids, &["s", "d"], &["hash_bucket(100)"], 2),
            (Ids, &["x"], &["min_max", "bucketize(0.5)"], 1),
            (Ids, &["n"], &[], 1),
        ] {
            let g = group(kind, cols, steps);
            let plan =
                FeaturePlan::compile("p", std::slice::from_ref(&g), None, &schema()).unwrap();
            assert_eq!(plan.groups[0].width, width, "{steps:?}");
        }
    }

    #[test]
    fn rejects_bad_chains_naming_group_and_column() {
        use GroupKind::*;
        for (kind, cols, steps, needle) in [
            (Dense, &["nope"][..], &[][..], "no such column"),
            (
                Dense,
                &["b"],
                &[],
                "neither numeric, string nor a float32/int64 tensor",
            ),
            (Dense, &["s"], &["log1p"], "needs a number"),
            (Dense, &["x"], &["vocab"], "needs a string"),
            (Dense, &["s"], &["vocab"], "needs one_hot"),
            (Ids, &["x"], &["log1p"], "ids group needs an integer id"),
            (
                Ids,
                &["s"],
                &["vocab", "one_hot(3)"],
                "belongs in a dense group",
            ),
            (Dense, &["x"], &["one_hot(3)"], "needs an index"),
            (
                Dense,
                &["x"],
                &["bucketize(1)", "log1p"],
                "cannot follow an index",
            ),
            (
                Dense,
                &["s"],
                &["vocab", "one_hot(3)", "one_hot(3)"],
                "must come last",
            ),
            (Ids, &["s"], &["vocab", "hash_bucket(3)"], "comes twice"),
            (Dense, &[], &[], "no columns"),
            (Dense, &["x", "n", "x"], &[], "listed twice"),
        ] {
            let g = group(kind, cols, steps);
            let err = FeaturePlan::compile("p", &[g], None, &schema())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(needle) && err.contains("group `g`"),
                "{steps:?}: {err}"
            );
        }
        let label = LabelSpec {
            column: "s".into(),
            dtype: LabelType::Float32,
        };
        let err = FeaturePlan::compile("p", &[], Some(&label), &schema())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not numeric"), "{err}");
    }

    #[test]
    fn output_schema_and_fit_passes() {
        let groups = [
            group(
                GroupKind::Dense,
                &["x"],
                &["standardize", "quantile_bucketize(3)"],
            ),
            FeatureGroup::new(
                "ids",
                GroupKind::Ids,
                &["s"],
                vec![Step::parse("vocab").unwrap()],
            ),
        ];
        let label = LabelSpec {
            column: "n".into(),
            dtype: LabelType::Float32,
        };
        let plan = FeaturePlan::compile("p", &groups, Some(&label), &schema()).unwrap();
        let names: Vec<_> = plan
            .output_schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["row_id", "label", "g", "ids"]);
        assert_eq!(plan.fit_passes(), 2);
        assert_eq!(plan.input_columns(), ["n", "x", "s"]);
        assert_eq!(plan.string_columns(), ["s"]);
        // A label column that is missing, or not a number, is named as the label's.
        for (column, needle) in [("zzz", "no such column"), ("s", "type Utf8 is not numeric")] {
            let label = LabelSpec {
                column: column.into(),
                dtype: LabelType::Float32,
            };
            let err = FeaturePlan::compile("p", &groups, Some(&label), &schema()).err();
            let err = err.unwrap().to_string();
            assert!(
                err.starts_with(&format!("label column `{column}`: {needle}")),
                "{err}"
            );
        }
    }
}
