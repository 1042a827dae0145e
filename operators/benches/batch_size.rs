//! The batch-size curve: rows per second through the whole transform of a Criteo-like
//! batch (13 float64 columns through fill_null→log1p→standardize→clip into one `[B, 13]`
//! tensor, 26 dictionary-encoded string columns hashed into one `[B, 26]` id tensor, the
//! label), and values per second through the fused numeric chain alone, for batches of
//! 1 to 100,000 rows: where per-batch overhead stops mattering.
//! `cargo bench -p hydrant-operators --bench batch_size`.

use std::hint::black_box;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, DictionaryArray, Float64Array, Int32Array, RecordBatch, UInt64Array,
};
use arrow::datatypes::Int32Type;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hydrant_operators::kernels::numeric::{NumOp, chain_to_f32};
use hydrant_operators::{
    FeatureGroup, FeaturePlan, FittedState, GroupKind, LabelSpec, LabelType, ROW_ID, Step,
};
use rand::{RngExt, SeedableRng};

const SIZES: [usize; 6] = [1, 10, 100, 1_000, 10_000, 100_000];
const ROWS: usize = 100_000;

/// A Criteo-like batch of `ROWS` rows with its `row_id` column, as the reader makes them.
fn criteo_batch() -> RecordBatch {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut columns: Vec<(String, ArrayRef)> = vec![
        (
            ROW_ID.into(),
            Arc::new(UInt64Array::from_iter_values(0..ROWS as u64)),
        ),
        (
            "label".into(),
            Arc::new(Int32Array::from_iter_values(
                (0..ROWS).map(|_| rng.random_range(0..2)),
            )),
        ),
    ];
    for i in 0..13 {
        let values = (0..ROWS).map(|_| {
            let v = (rng.random::<f64>() * 6.0).exp();
            (!rng.random_bool(0.1)).then_some(v)
        });
        columns.push((format!("i{i}"), Arc::new(Float64Array::from_iter(values))));
    }
    for j in 0..26 {
        let cardinality = [10, 100, 1_000, 10_000, 100_000][j % 5];
        let words: Vec<String> = (0..cardinality).map(|k| format!("{j:02}{k:08}")).collect();
        let rows = (0..ROWS).map(|_| {
            let u: f64 = rng.random::<f64>().max(1e-12);
            let k = ((u.powf(-1.0 / 0.3)) as usize).min(cardinality) - 1;
            Some(words[k].as_str())
        });
        let dict: DictionaryArray<Int32Type> = rows.collect();
        columns.push((format!("c{j}"), Arc::new(dict)));
    }
    RecordBatch::try_from_iter(columns).unwrap()
}

fn transform(c: &mut Criterion) {
    let batch = criteo_batch();
    let dense: Vec<String> = (0..13).map(|i| format!("i{i}")).collect();
    let ids: Vec<String> = (0..26).map(|j| format!("c{j}")).collect();
    let groups = [
        FeatureGroup::new(
            "dense",
            GroupKind::Dense,
            &dense.iter().map(String::as_str).collect::<Vec<_>>(),
            ["fill_null(0)", "log1p", "standardize", "clip(-3, 3)"]
                .map(|s| Step::parse(s).unwrap())
                .to_vec(),
        ),
        FeatureGroup::new(
            "ids",
            GroupKind::Ids,
            &ids.iter().map(String::as_str).collect::<Vec<_>>(),
            vec![Step::parse("hash_bucket(262144)").unwrap()],
        ),
    ];
    let label = LabelSpec {
        column: "label".into(),
        dtype: LabelType::Float32,
    };
    let input = batch
        .schema()
        .project(&(1..batch.num_columns()).collect::<Vec<_>>())
        .unwrap();
    let plan = FeaturePlan::compile("criteo_hash", &groups, Some(&label), &input).unwrap();
    let mut fitter = plan.fitter(0, &FittedState::empty("criteo_hash")).unwrap();
    fitter.update(&batch).unwrap();
    let mut params = Default::default();
    fitter.into_partial().unwrap().finish(&mut params);
    let mut transformer = plan
        .transformer(&FittedState::new("criteo_hash", params))
        .unwrap();

    let mut g = c.benchmark_group("batch_transform");
    for rows in SIZES {
        let slice = batch.slice(0, rows);
        g.throughput(Throughput::Elements(rows as u64));
        g.bench_with_input(BenchmarkId::new("rows", rows), &rows, |b, _| {
            b.iter(|| transformer.apply(black_box(&slice)).unwrap())
        });
    }
    g.finish();

    let values = batch
        .column(2)
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap()
        .clone();
    let ops = [
        NumOp::FillNull(0.0),
        NumOp::Log1p,
        NumOp::Affine { sub: 2.5, mul: 0.7 },
        NumOp::Clip { lo: -3.0, hi: 3.0 },
    ];
    let mut g = c.benchmark_group("batch_chain");
    for rows in SIZES {
        let column = values.slice(0, rows);
        g.throughput(Throughput::Elements(rows as u64));
        g.bench_with_input(BenchmarkId::new("rows", rows), &rows, |b, _| {
            b.iter(|| {
                // A fresh output per batch, as the transform allocates one per batch.
                let mut out = vec![0f32; rows];
                chain_to_f32(
                    black_box(column.values()),
                    column.nulls(),
                    &ops,
                    &mut out,
                    1,
                    0,
                );
                out
            })
        });
    }
    g.finish();
}

criterion_group!(benches, transform);
criterion_main!(benches);
