//! What featurizing refuses by value, whatever the state: integer ids passed through that
//! are not indices, and ready tensors with a null row. Featurizing checks them as it goes;
//! [`FeaturePlan::check_values`] checks them alone, for rows featurized only later (held
//! for a first state while statistics are refreshed from a stream).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Int64Array, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field};
use arrow::util::display::array_value_to_string;

use crate::bind::column;
use crate::error::{OpError, Result};
use crate::group::GroupKind;
use crate::plan::{FeaturePlan, ROW_ID, Source};
use crate::step::Step;

impl FeaturePlan {
    /// Fails where featurizing `batch` would on its values whatever the state (integer ids
    /// passed through that are not indices, ready tensors with nulls), naming the row by
    /// its `row_id`. Rows held for a first state (statistics refreshed from a stream) are
    /// checked so before they are taken, as their featurizing comes only later.
    pub fn check_values(&self, batch: &RecordBatch) -> Result<()> {
        for g in &self.groups {
            let steps = &g.spec.steps;
            let one_hot = matches!(steps.last(), Some(Step::OneHot(_)));
            let chain = &steps[..steps.len() - one_hot as usize];
            for c in &g.columns {
                match c.source {
                    Source::Tensor { .. } => {
                        tensor_column(batch, &g.spec.name, &c.name, g.spec.kind)?;
                    }
                    source if chain.is_empty() && passes_ints(source, one_hot, g.spec.kind) => {
                        checked_ints(batch, &g.spec.name, &c.name)?;
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// A ready tensor column, checked to be a non-null list of the group's item type.
pub(super) fn tensor_column(
    batch: &RecordBatch,
    group: &str,
    name: &str,
    kind: GroupKind,
) -> Result<ArrayRef> {
    let want = match kind {
        GroupKind::Dense => DataType::Float32,
        GroupKind::Ids => DataType::Int64,
    };
    let list = ready_list(batch, group, name, &want)?;
    // Re-labelled with the output's item field; the buffers are shared.
    let item = Arc::new(Field::new_list_field(want, false));
    Ok(Arc::new(FixedSizeListArray::try_new(
        item,
        list.value_length(),
        list.values().clone(),
        None,
    )?))
}

/// Ready tensor column `name` of `batch` (of group `group`): a fixed-size list of `want`
/// without a null row or item.
pub(super) fn ready_list<'a>(
    batch: &'a RecordBatch,
    group: &str,
    name: &str,
    want: &DataType,
) -> Result<&'a FixedSizeListArray> {
    let array = column(batch, group, name)?;
    let list = array
        .as_fixed_size_list_opt()
        .filter(|l| l.value_type() == *want && l.null_count() == 0 && l.values().null_count() == 0);
    list.ok_or_else(|| {
        OpError::Schema(format!(
            "group `{group}`: column `{name}` is {} (with nulls?), expected a non-null tensor of {want}",
            array.data_type()
        ))
    })
}

/// Whether a column of `source` with no steps before its (optional) one-hot is taken as
/// an index as it is: an integer column of an ids group, or one-hot encoded.
pub(super) fn passes_ints(source: Source, one_hot: bool, kind: GroupKind) -> bool {
    matches!(source, Source::Numeric { integer: true }) && (one_hot || kind == GroupKind::Ids)
}

/// Integer column `name` of `batch` (of group `group`) as int64 ids, failing on a value
/// that is not one (see [`unusable_id`]).
pub(super) fn checked_ints(batch: &RecordBatch, group: &str, name: &str) -> Result<ArrayRef> {
    let array = column(batch, group, name)?;
    let ints = cast(array, &DataType::Int64)?;
    if let Some(reason) = unusable_id(array, ints.as_primitive(), |k| at_row_id(batch, k)) {
        return Err(OpError::Plan {
            group: group.to_string(),
            column: name.to_string(),
            reason,
        });
    }
    Ok(ints)
}

/// What makes an integer id column passed through unusable, if anything: a value an
/// int64 cannot hold (the cast made 2^64 - 1 null, delivered as -1 like a real null), or a
/// negative one (an embedding index is 0 or more, and -1 is what a null becomes). `at(k)`
/// says where row `k` is.
fn unusable_id(
    input: &ArrayRef,
    ints: &Int64Array,
    at: impl Fn(usize) -> String,
) -> Option<String> {
    let shown = |k: usize| array_value_to_string(input, k).unwrap_or_default();
    if ints.null_count() > input.null_count()
        && let Some(k) = (0..input.len()).find(|&k| input.is_valid(k) && ints.is_null(k))
    {
        return Some(format!(
            "holds {}{}, which an int64 id cannot hold",
            shown(k),
            at(k)
        ));
    }
    // One quick pass; the slow search only where there is something to find.
    if ints.values().iter().any(|&v| v < 0) {
        let k = (0..ints.len()).find(|&k| ints.is_valid(k) && ints.value(k) < 0)?;
        return Some(format!(
            "holds {}{}: ids are indices, 0 or more (a null is delivered as -1)",
            shown(k),
            at(k)
        ));
    }
    None
}

/// " at row_id N" for row `k` of `batch`, or nothing where the batch has no `row_id` (a
/// bare batch given to [`Transformer::apply`](super::Transformer::apply) is refused
/// before this).
fn at_row_id(batch: &RecordBatch, k: usize) -> String {
    batch
        .column_by_name(ROW_ID)
        .and_then(|c| c.as_primitive_opt::<arrow::datatypes::UInt64Type>())
        .filter(|ids| k < ids.len())
        .map(|ids| format!(" at row_id {}", ids.value(k)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use arrow::array::{Float32Array, Float64Array, UInt64Array};
    use arrow::datatypes::{Float32Type, Int64Type, Schema};

    use super::*;
    use crate::state::FittedState;

    /// What featurizing refuses by value whatever the state, `check_values` refuses
    /// first: ids that are not indices, and ready tensors with a null row (in a group of
    /// several columns too, where the null row's buffer used to be copied as values).
    #[test]
    fn values_featurizing_refuses_are_refused_without_a_state() {
        use crate::group::{FeatureGroup, GroupKind};
        use arrow::buffer::NullBuffer;
        let batch = |ids: Vec<i64>, null_row: Option<usize>| {
            let item = Arc::new(Field::new_list_field(DataType::Float32, true));
            let values = Float32Array::from_iter_values((0..8).map(|i| i as f32));
            let nulls = null_row.map(|r| NullBuffer::from_iter((0..4).map(|k| k != r)));
            let t = FixedSizeListArray::try_new(item, 2, Arc::new(values), nulls).unwrap();
            RecordBatch::try_from_iter([
                (
                    ROW_ID,
                    Arc::new(UInt64Array::from_iter_values(40..44)) as ArrayRef,
                ),
                ("u", Arc::new(Int64Array::from(ids))),
                ("t", Arc::new(t)),
                ("x", Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0, 4.0]))),
            ])
            .unwrap()
        };
        let groups = [
            FeatureGroup::new("g", GroupKind::Ids, &["u"], vec![]),
            FeatureGroup::new("d", GroupKind::Dense, &["t", "x"], vec![]),
        ];
        let good = batch(vec![1, 2, 3, 4], None);
        let plan = FeaturePlan::compile("p", &groups, None, &good.schema()).unwrap();
        let mut t = plan.transformer(&FittedState::empty("p")).unwrap();
        plan.check_values(&good).unwrap();
        let d = t.apply(&good).unwrap();
        let d = d.column_by_name("d").unwrap().as_fixed_size_list();
        let d = d.values().as_primitive::<Float32Type>().values();
        assert_eq!(d[3..6], [2.0, 3.0, 2.0], "row 1: its tensor, then x");
        for (bad, says) in [
            (batch(vec![1, 2, -3, 4], None), "holds -3 at row_id 42"),
            (batch(vec![1, 2, 3, 4], Some(1)), "column `t` is"),
        ] {
            let err = plan.check_values(&bad).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
            let err = t.apply(&bad).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }

    /// Integer ids passed through (no steps) that an embedding could not take are
    /// refused with the value, where 2^64 - 1 used to become -1 (a null's marker) and
    /// negative ids went out as they were; a null is still -1.
    #[test]
    fn ids_passed_through_must_be_indices() {
        use crate::group::{FeatureGroup, GroupKind};
        let ids = |array: ArrayRef| {
            let n = array.len() as u64;
            let schema = Schema::new(vec![
                Field::new(ROW_ID, DataType::UInt64, false),
                Field::new("u", array.data_type().clone(), true),
            ]);
            let rows = Arc::new(UInt64Array::from_iter_values(0..n));
            let batch = RecordBatch::try_new(Arc::new(schema), vec![rows, array]).unwrap();
            let group = FeatureGroup {
                name: "g".into(),
                kind: GroupKind::Ids,
                columns: vec!["u".into()],
                steps: vec![],
            };
            let plan = FeaturePlan::compile("p", &[group], None, &batch.schema()).unwrap();
            plan.transformer(&FittedState::empty("p"))?.apply(&batch)
        };
        let err = ids(Arc::new(UInt64Array::from(vec![5, u64::MAX]))).unwrap_err();
        assert!(
            err.to_string().contains(
                "column `u`: holds 18446744073709551615 at row_id 1, which an int64 id cannot hold"
            ),
            "{err}"
        );
        let err = ids(Arc::new(Int64Array::from(vec![Some(3), None, Some(-5)]))).unwrap_err();
        assert!(
            err.to_string()
                .contains("holds -5 at row_id 2: ids are indices"),
            "{err}"
        );
        let ok = ids(Arc::new(Int64Array::from(vec![Some(3), None, Some(0)]))).unwrap();
        let g = ok.column_by_name("g").unwrap().as_fixed_size_list();
        assert_eq!(g.values().as_primitive::<Int64Type>().values(), &[3, -1, 0]);
    }
}
