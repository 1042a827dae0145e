//! Unit tests of refreshed statistics: versions, held rows, batches refused whole.

use arrow::array::Float64Array;
use arrow::datatypes::{DataType, Field, Schema};

use super::*;
use crate::delivery::LastBatch;

const PIPELINE: &str = r#"
name = "t"
input = "flight"
[stats]
mode = "refresh"
warmup = 8
[[group]]
name = "dense"
kind = "dense"
columns = ["x"]
steps = ["standardize"]
"#;

fn refresh() -> Refresh {
    let spec = PipelineSpec::from_toml(PIPELINE, "t.toml").unwrap();
    let plan = Arc::new(spec.plan(&spec.nominal_schema()).unwrap());
    let placement = Placement::new(1, 4, LastBatch::Pad, 0, None).unwrap();
    Refresh::new(&spec, plan, None, &placement).unwrap()
}

fn xs(values: &[f64]) -> RecordBatch {
    let schema = Schema::new(vec![Field::new("x", DataType::Float64, true)]);
    let column = Float64Array::from(values.to_vec());
    RecordBatch::try_new(Arc::new(schema), vec![Arc::new(column)]).unwrap()
}

/// [`Refresh::check`] then [`Refresh::take`], as a push does.
fn take(
    r: &mut Refresh,
    batch: &RecordBatch,
    first: u64,
    deliver_from: u64,
) -> std::result::Result<Vec<Piece>, ServeError> {
    let checked = r.check(batch, first)?;
    r.take(batch, checked, deliver_from)
}

/// Rows of each piece, from its first row on.
fn rows(pieces: &[Piece]) -> Vec<(u64, usize)> {
    pieces
        .iter()
        .map(|p| (p.first, p.batch.num_rows()))
        .collect()
}

/// A batch taken again (a replay that starts before the rows counted) is held once; and within the warmup, a batch that would leave the first version
/// unfit is refused whole and changes nothing: the next one is taken in its place.
#[test]
fn a_batch_taken_again_is_held_once_and_one_too_large_to_fit_is_refused_whole() {
    let mut r = refresh();
    assert!(
        take(&mut r, &xs(&[1.0, 2.0, 3.0]), 0, 0)
            .unwrap()
            .is_empty()
    );
    assert!(take(&mut r, &xs(&[4.0, 5.0]), 3, 0).unwrap().is_empty());
    // Taken again at the same row, as a retried push is.
    assert!(take(&mut r, &xs(&[4.0, 5.0]), 3, 0).unwrap().is_empty());
    let Err(e) = take(&mut r, &xs(&[6.0, 1e200]), 5, 0) else {
        panic!("a value of 1e200 was taken within the warmup");
    };
    assert!(
        matches!(&e, ServeError::InvalidArgument(m) if m.contains("too large")),
        "{e}"
    );
    let pieces = take(&mut r, &xs(&[6.0, 7.0, 8.0, 9.0]), 5, 0).unwrap();
    assert_eq!(rows(&pieces), [(0, 3), (3, 2), (5, 3), (8, 1)]);
    let state = &pieces[0].state;
    match &state.params["dense/x/0"] {
        FittedParam::Standardize { mean, .. } => assert_eq!(*mean, 4.5),
        other => panic!("{other:?}"),
    }
}

#[test]
fn versions_take_effect_where_steps_and_windows_both_begin() {
    assert_eq!(lcm(8, 12), 24);
    assert_eq!(lcm(8, 1), 8);
    assert_eq!(lcm(4096, 65536), 65536);
}
