//! Fitting: one pass over the data per fitted step in a chain, accumulating mergeable
//! statistics ([`FitPartial`]) that workers combine before finishing them into a state.

use std::collections::BTreeMap;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::buffer::NullBuffer;
use arrow::datatypes::Int32Type;
use serde::{Deserialize, Serialize};

use crate::bind::{bind_numeric, column, numeric_values};
use crate::error::Result;
use crate::kernels::categorical::{for_each_str, keys_as_i64, same_array, strs};
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
    /// What earlier units gave a statistic whose floating-point result depends on the
    /// grouping (moments), by unit: merged in unit order, they finish the same on any
    /// number of workers and processes. 24 bytes per unit and column.
    units: Vec<(u64, Partial)>,
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
    /// Each statistic's partials, by the unit they are of (all units: 0).
    entries: BTreeMap<String, Vec<(u64, Partial)>>,
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
                    units: Vec::new(),
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

    /// Stops gathering the statistics of `keys` (a refreshed vocabulary that is full
    /// needs no more counts).
    pub fn drop_statistics(&mut self, keys: &[String]) {
        self.targets.retain(|t| !keys.contains(&t.key));
    }

    /// Keeps only the statistics whose parameters can fail to fit as values grow large
    /// (moments and extremes overflow; quantile boundaries are only ever finite ones):
    /// a few numbers each, cheap to gather twice and to copy.
    pub fn overflowing_only(mut self) -> Self {
        self.targets
            .retain(|t| matches!(t.partial, Partial::Moments(_) | Partial::MinMax(_)));
        self
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

    /// Ends unit `unit` (of the input's units, in their order): what a grouping-dependent
    /// statistic saw since the last call is kept as that unit's.
    pub fn end_unit(&mut self, unit: u64) {
        for t in &mut self.targets {
            if t.partial.depends_on_grouping() {
                let fresh = t.partial.emptied();
                t.units
                    .push((unit, std::mem::replace(&mut t.partial, fresh)));
            }
        }
    }

    /// The statistics gathered so far.
    pub fn into_partial(self) -> Result<FitPartial> {
        let mut entries = BTreeMap::new();
        for mut t in self.targets {
            flush(&mut t.pending, &mut t.partial)?;
            let mut parts = t.units;
            if parts.is_empty() || !t.partial.depends_on_grouping() {
                parts.push((0, t.partial));
            }
            entries.insert(t.key, parts);
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
    match keys.as_primitive_opt::<Int32Type>() {
        // What the Parquet reader is asked for: counted in place.
        Some(keys) => count_keys(keys.values(), nulls.as_ref(), counts),
        None => count_keys(keys_as_i64(keys)?.values(), nulls.as_ref(), counts),
    }
    Ok(())
}

/// Adds one to `counts[k]` for the key `k` of every valid slot. Keys under null slots may
/// hold anything, and a key out of range is skipped.
#[inline]
fn count_keys<K: Copy + TryInto<usize>>(
    keys: &[K],
    nulls: Option<&NullBuffer>,
    counts: &mut [u64],
) {
    let mut bump = |k: K| {
        if let Some(c) = k.try_into().ok().and_then(|k| counts.get_mut(k)) {
            *c += 1;
        }
    };
    match nulls.filter(|n| n.null_count() > 0) {
        None => keys.iter().for_each(|&k| bump(k)),
        Some(nulls) => nulls.valid_indices().for_each(|i| bump(keys[i])),
    }
}

/// Adds the pending dictionary's counts to the statistic.
fn flush(pending: &mut Option<(ArrayRef, Vec<u64>)>, partial: &mut Partial) -> Result<()> {
    let Some((values, counts)) = pending.take() else {
        return Ok(());
    };
    let seen = strs(values.as_ref())?.zip(counts);
    partial.add_strings(seen.filter_map(|(v, c)| v.filter(|_| c > 0).map(|v| (v, c))));
    Ok(())
}

impl FitPartial {
    /// Folds in another part's statistics (of the same pass).
    pub fn merge(&mut self, other: FitPartial) {
        for (k, p) in other.entries {
            self.entries.entry(k).or_default().extend(p);
        }
    }

    /// Deals the statistics into `parts` partials, statistic `k` (in key order) to part
    /// `k mod parts`: fits of the same pass deal the same keys the same way.
    pub fn split(self, parts: usize) -> Vec<FitPartial> {
        let parts = parts.max(1);
        let mut split = vec![FitPartial::default(); parts];
        for (k, (key, partial)) in self.entries.into_iter().enumerate() {
            split[k % parts].entries.insert(key, partial);
        }
        split
    }

    /// Merges each statistic's partials into one, in unit order (as
    /// [`FitPartial::finish`] does): statistics kept over a stream stay one partial each.
    pub fn collapse(&mut self) {
        for parts in self.entries.values_mut() {
            parts.sort_by_key(|(unit, _)| *unit);
            let mut drained = std::mem::take(parts).into_iter().map(|(_, p)| p);
            if let Some(mut whole) = drained.next() {
                drained.for_each(|p| whole.merge(p));
                parts.push((0, whole));
            }
        }
    }

    /// Weighs everything seen by `factor` (see [`Partial::decay`]).
    pub fn decay(&mut self, factor: f64) {
        for parts in self.entries.values_mut() {
            parts.iter_mut().for_each(|(_, p)| p.decay(factor));
        }
    }

    /// Forgets the statistics of `keys` (see [`Fitter::drop_statistics`]).
    pub fn drop_statistics(&mut self, keys: &[String]) {
        self.entries.retain(|k, _| !keys.contains(k));
    }

    /// Turns the statistics into the next version of `prev`'s parameters (see
    /// [`Partial::finish_after`]): vocabularies only grow, and a parameter with no
    /// statistics here (one no longer gathered) stays `prev`'s.
    pub fn finish_after(self, prev: &FittedState, params: &mut BTreeMap<String, FittedParam>) {
        let mut whole = self;
        whole.collapse();
        for (k, p) in &prev.params {
            if !whole.entries.contains_key(k) {
                params.insert(k.clone(), p.clone());
            }
        }
        for (k, parts) in whole.entries {
            if let Some((_, p)) = parts.into_iter().next() {
                let param = p.finish_after(prev.params.get(&k));
                params.insert(k, param);
            }
        }
    }

    /// Turns the statistics into parameters, added to `params`: each statistic's partials
    /// are merged in unit order (of the same unit, in the order they were merged in).
    pub fn finish(self, params: &mut BTreeMap<String, FittedParam>) {
        for (k, mut parts) in self.entries {
            parts.sort_by_key(|(unit, _)| *unit);
            let mut parts = parts.into_iter().map(|(_, p)| p);
            if let Some(mut whole) = parts.next() {
                parts.for_each(|p| whole.merge(p));
                params.insert(k, whole.finish());
            }
        }
    }
}
