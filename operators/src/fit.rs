//! Fitting: one pass over the data per fitted step in a chain, accumulating mergeable
//! statistics ([`FitPartial`]) that workers combine before finishing them into a state.

use std::collections::BTreeMap;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use serde::{Deserialize, Serialize};

use crate::bind::{bind_numeric, column, numeric_values};
use crate::error::Result;
use crate::kernels::categorical::{for_each_str, keys_as_i64, same_array};
use crate::kernels::numeric::{NumOp, chain_visit};
use crate::plan::{FeaturePlan, Source};
use crate::state::{FittedParam, FittedState};
use crate::stats::{Moments, Partial};
use crate::step::Step;

/// What one fitted step sees.
#[derive(Debug, Clone)]
enum Input {
    /// The numeric chain before the step, with its earlier fitted steps bound.
    Numeric(Vec<NumOp>),
    /// The raw strings.
    Str,
}

#[derive(Debug, Clone)]
struct Target {
    key: String,
    group: String,
    column: String,
    input: Input,
    partial: Partial,
    /// Key counts for the last dictionary seen, folded into `partial` when the dictionary
    /// changes: a Parquet reader hands one dictionary to every batch of a row group, so
    /// each distinct value is hashed once per row group rather than once per batch.
    pending: Option<(ArrayRef, Vec<u64>)>,
}

/// Accumulates one pass's statistics over batches.
#[derive(Debug, Clone)]
pub struct Fitter {
    targets: Vec<Target>,
}

/// Statistics of one pass over part of the data; merge partials of all parts, then finish.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FitPartial {
    entries: BTreeMap<String, Partial>,
}

impl FeaturePlan {
    /// A fitter for pass `pass` (see [`FeaturePlan::fit_passes`]); `state` must hold what
    /// the earlier passes fitted.
    pub fn fitter(&self, pass: usize, state: &FittedState) -> Result<Fitter> {
        let mut targets = Vec::new();
        for g in &self.groups {
            let steps = &g.spec.steps;
            let Some(at) = steps
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_fitted())
                .nth(pass)
                .map(|(i, _)| i)
            else {
                continue;
            };
            for c in &g.columns {
                let input = match c.source {
                    Source::Str => Input::Str,
                    // Groups with tensor columns have no steps, so nothing to fit.
                    Source::Tensor { .. } => continue,
                    Source::Numeric { .. } => Input::Numeric(bind_numeric(
                        &g.spec.name,
                        &c.name,
                        &steps[..at],
                        at,
                        state,
                    )?),
                };
                let partial = match &steps[at] {
                    Step::Standardize => Partial::Moments(Moments::default()),
                    Step::MinMax => Partial::MinMax(None),
                    Step::QuantileBucketize(n) => Partial::Quantiles {
                        n: *n,
                        digest: tdigest::TDigest::new_with_size(200),
                        pending: Vec::new(),
                    },
                    Step::Vocab {
                        max_size,
                        min_count,
                    } => Partial::Counts {
                        max_size: *max_size,
                        min_count: *min_count,
                        counts: Default::default(),
                    },
                    other => unreachable!("{other} is not fitted"),
                };
                targets.push(Target {
                    key: FittedState::key(&g.spec.name, &c.name, at),
                    group: g.spec.name.clone(),
                    column: c.name.clone(),
                    input,
                    partial,
                    pending: None,
                });
            }
        }
        Ok(Fitter { targets })
    }
}

impl Fitter {
    /// Whether this pass fits anything (a pipeline without fitted steps has no passes).
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// The input columns this pass reads, each once: a reader need decode no others.
    pub fn columns(&self) -> Vec<String> {
        let mut columns: Vec<String> = Vec::new();
        for t in &self.targets {
            if !columns.contains(&t.column) {
                columns.push(t.column.clone());
            }
        }
        columns
    }

    /// Adds a batch's values to every statistic.
    pub fn update(&mut self, batch: &RecordBatch) -> Result<()> {
        for t in &mut self.targets {
            let array = column(batch, &t.group, &t.column)?;
            match &t.input {
                Input::Numeric(ops) => {
                    let values = numeric_values(array, &t.group, &t.column)?;
                    chain_visit(values.values(), values.nulls(), ops, |chunk| {
                        t.partial.add_numbers(chunk)
                    });
                }
                Input::Str => count_strings(array.as_ref(), &mut t.partial, &mut t.pending)?,
            }
        }
        Ok(())
    }

    /// The statistics gathered so far.
    pub fn into_partial(self) -> Result<FitPartial> {
        let mut entries = BTreeMap::new();
        for mut t in self.targets {
            flush(&mut t.pending, &mut t.partial)?;
            entries.insert(t.key, t.partial);
        }
        Ok(FitPartial { entries })
    }
}

/// Counts string occurrences; a dictionary column counts keys, and each distinct value is
/// added once when its dictionary is done with (see `Target::pending`).
fn count_strings(
    array: &dyn Array,
    partial: &mut Partial,
    pending: &mut Option<(ArrayRef, Vec<u64>)>,
) -> Result<()> {
    let Some(dict) = array.as_any_dictionary_opt() else {
        flush(pending, partial)?;
        return for_each_str(array, |v| {
            if let Some(v) = v {
                partial.add_string(v, 1);
            }
        });
    };
    let values = dict.values();
    if !matches!(pending, Some((v, _)) if same_array(v, values)) {
        flush(pending, partial)?;
        *pending = Some((values.clone(), vec![0u64; values.len()]));
    }
    let Some((_, counts)) = pending.as_mut() else {
        return Ok(());
    };
    let keys = dict.keys();
    let nulls = keys.logical_nulls();
    let keys = keys_as_i64(keys)?;
    for (i, &k) in keys.values().iter().enumerate() {
        if nulls.as_ref().is_none_or(|n| n.is_valid(i))
            && let Some(c) = usize::try_from(k).ok().and_then(|k| counts.get_mut(k))
        {
            *c += 1;
        }
    }
    Ok(())
}

/// Adds the pending dictionary's counts to the statistic.
fn flush(pending: &mut Option<(ArrayRef, Vec<u64>)>, partial: &mut Partial) -> Result<()> {
    let Some((values, counts)) = pending.take() else {
        return Ok(());
    };
    let mut i = 0;
    for_each_str(values.as_ref(), |v| {
        if let Some(v) = v
            && counts[i] > 0
        {
            partial.add_string(v, counts[i]);
        }
        i += 1;
    })
}

impl FitPartial {
    /// Folds in another part's statistics (of the same pass).
    pub fn merge(&mut self, other: FitPartial) {
        for (k, p) in other.entries {
            match self.entries.get_mut(&k) {
                Some(mine) => mine.merge(p),
                None => {
                    self.entries.insert(k, p);
                }
            }
        }
    }

    /// Turns the statistics into parameters, added to `params`.
    pub fn finish(self, params: &mut BTreeMap<String, FittedParam>) {
        for (k, p) in self.entries {
            params.insert(k, p.finish());
        }
    }
}
