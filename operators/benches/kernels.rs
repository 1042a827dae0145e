//! Kernel throughput: the fused numeric chain, standardize→clip, vocab and hash_bucket on
//! dictionary-encoded strings, swept over null density, and assembly of 13 columns into one
//! `[rows, 13]` float32 tensor. `cargo bench -p hydrant-operators --bench kernels`; the
//! peer figures (NumPy doing the same math in place) come from `bench/peers/numpy_kernels.py`.

use std::hint::black_box;

use std::sync::Arc;

use arrow::array::{
    ArrayRef, DictionaryArray, Float64Array, RecordBatch, StringArray, UInt64Array,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::Int32Type;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hydrant_operators::kernels::categorical::{DictCache, Lookup, VocabIndex, strings_to_index};
use hydrant_operators::kernels::numeric::{NumOp, chain_to_f32};
use hydrant_operators::{FeatureGroup, FeaturePlan, FittedState, GroupKind, ROW_ID, Step};
use rand::{RngExt, SeedableRng};

const ROWS: usize = 65_536;

fn column(null_rate: f64) -> (Vec<f64>, Option<NullBuffer>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let values = (0..ROWS)
        .map(|_| (rng.random::<f64>() * 6.0).exp())
        .collect();
    let nulls = (null_rate > 0.0).then(|| {
        NullBuffer::from(
            (0..ROWS)
                .map(|_| !rng.random_bool(null_rate))
                .collect::<Vec<_>>(),
        )
    });
    (values, nulls)
}

fn numeric(c: &mut Criterion) {
    let chains: [(&str, Vec<NumOp>); 2] = [
        (
            "fill_null_log1p_standardize_clip",
            vec![
                NumOp::FillNull(0.0),
                NumOp::Log1p,
                NumOp::Affine { sub: 2.5, mul: 0.7 },
                NumOp::Clip { lo: -3.0, hi: 3.0 },
            ],
        ),
        (
            "standardize_clip",
            vec![
                NumOp::Affine { sub: 2.5, mul: 0.7 },
                NumOp::Clip { lo: -3.0, hi: 3.0 },
            ],
        ),
    ];
    for (name, ops) in chains {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(ROWS as u64));
        for null_rate in [0.0, 0.1, 0.5] {
            let (values, nulls) = column(null_rate);
            let mut out = vec![0f32; ROWS];
            g.bench_with_input(BenchmarkId::new("nulls", null_rate), &null_rate, |b, _| {
                b.iter(|| chain_to_f32(black_box(&values), nulls.as_ref(), &ops, &mut out, 1, 0))
            });
        }
        g.finish();
    }
}

fn strings(c: &mut Criterion) {
    // 65,536 rows drawn (Zipf) from a 100k-value vocabulary, dictionary-encoded.
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let words: Vec<String> = (0..100_000).map(|i| format!("04{i:08}")).collect();
    let zipf = |rng: &mut rand::rngs::StdRng| {
        let u: f64 = rng.random::<f64>().max(1e-12);
        ((u.powf(-1.0 / 0.3)) as usize).min(100_000) - 1
    };
    let mut g = c.benchmark_group("strings");
    g.throughput(Throughput::Elements(ROWS as u64));
    for null_rate in [0.0, 0.1, 0.5] {
        let rows: Vec<Option<&str>> = (0..ROWS)
            .map(|_| {
                let w = words[zipf(&mut rng)].as_str();
                (!rng.random_bool(null_rate)).then_some(w)
            })
            .collect();
        let dict: DictionaryArray<Int32Type> = rows.iter().copied().collect();
        let plain = StringArray::from(rows.clone());
        let vocab = Lookup::Vocab(VocabIndex::new(&words.iter().collect()), words.len() as i64);
        let hash = Lookup::Hash(1 << 18);
        let mut out = vec![0i64; ROWS];
        for (name, lookup) in [("vocab_dict", &vocab), ("hash_dict", &hash)] {
            g.bench_with_input(BenchmarkId::new(name, null_rate), &null_rate, |b, _| {
                // A fresh cache each time: the dictionary is mapped in every iteration.
                b.iter(|| {
                    strings_to_index(
                        black_box(&dict),
                        lookup,
                        &mut DictCache::default(),
                        &mut out,
                    )
                    .unwrap()
                })
            });
        }
        g.bench_with_input(
            BenchmarkId::new("vocab_plain", null_rate),
            &null_rate,
            |b, _| {
                b.iter(|| {
                    strings_to_index(
                        black_box(&plain),
                        &vocab,
                        &mut DictCache::default(),
                        &mut out,
                    )
                    .unwrap()
                })
            },
        );
    }
    g.finish();
}

/// Thirteen columns (10% nulls) through fill_null→log1p→standardize→clip into one row-major
/// `[rows, 13]` float32 tensor: a dense group's whole transform, allocation included.
fn assembly(c: &mut Criterion) {
    const COLUMNS: usize = 13;
    let names: Vec<String> = (0..COLUMNS).map(|i| format!("i{i}")).collect();
    let mut arrays: Vec<(String, ArrayRef)> = vec![(
        ROW_ID.into(),
        Arc::new(UInt64Array::from_iter_values(0..ROWS as u64)),
    )];
    for name in &names {
        let (values, nulls) = column(0.1);
        arrays.push((
            name.clone(),
            Arc::new(Float64Array::new(values.into(), nulls)),
        ));
    }
    let batch = RecordBatch::try_from_iter(arrays).unwrap();
    let steps = ["fill_null(0)", "log1p", "standardize", "clip(-3, 3)"];
    let group = FeatureGroup::new(
        "dense",
        GroupKind::Dense,
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
        steps.map(|s| Step::parse(s).unwrap()).to_vec(),
    );
    let input = batch
        .schema()
        .project(&(1..=COLUMNS).collect::<Vec<_>>())
        .unwrap();
    let plan = FeaturePlan::compile("assembly", &[group], None, &input).unwrap();
    let mut fitter = plan.fitter(0, &FittedState::empty("assembly")).unwrap();
    fitter.update(&batch).unwrap();
    let mut params = Default::default();
    fitter.into_partial().unwrap().finish(&mut params);
    let mut transformer = plan
        .transformer(&FittedState::new("assembly", params))
        .unwrap();
    let mut g = c.benchmark_group("assembly");
    g.throughput(Throughput::Elements((ROWS * COLUMNS) as u64));
    g.bench_function("dense_13", |b| {
        b.iter(|| transformer.apply(black_box(&batch)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, numeric, strings, assembly);
criterion_main!(benches);
