//! The delivery machinery on its own: placing featurized batches and assembling rank
//! batches from the pieces (in order and shuffled, as readers and owners do it), turning rank batches into `TrainingBatch`es, and the loader hand-off
//! across threads. Compare with featurization's own rate (~2.7 M rows/s end to end on two
//! cores). `cargo bench --bench delivery`.

use std::hint::black_box;
use std::sync::Arc;

use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hydrant::delivery::{Assembler, LastBatch, Placement, RankBatch, split};
use hydrant::loader::{self, LoaderConfig, TrainingBatch};
use hydrant::operators::ErrorSlot;

const BATCH_ROWS: usize = 8192;
const BATCHES: usize = 16;
const ROWS: usize = BATCH_ROWS * BATCHES;

fn schema() -> Arc<Schema> {
    let f = Arc::new(Field::new("item", DataType::Float32, false));
    let i = Arc::new(Field::new("item", DataType::Int64, false));
    Arc::new(Schema::new(vec![
        Field::new("row_id", DataType::UInt64, false),
        Field::new("label", DataType::Float32, true),
        Field::new("dense", DataType::FixedSizeList(f, 13), false),
        Field::new("ids", DataType::FixedSizeList(i, 26), false),
    ]))
}

/// Featurized Criteo-shaped batches: row_id, label, dense [13] f32, ids [26] i64.
fn featurized() -> Vec<RecordBatch> {
    let schema = schema();
    (0..BATCHES)
        .map(|b| {
            let first = (b * BATCH_ROWS) as u64;
            let n = BATCH_ROWS;
            let dense = FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, false)),
                13,
                Arc::new(Float32Array::from_iter_values(
                    (0..n * 13).map(|v| v as f32),
                )),
                None,
            )
            .unwrap();
            let ids = FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Int64, false)),
                26,
                Arc::new(Int64Array::from_iter_values((0..n * 26).map(|v| v as i64))),
                None,
            )
            .unwrap();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(UInt64Array::from_iter_values(first..first + n as u64)),
                    Arc::new(Float32Array::from(vec![1.0; n])),
                    Arc::new(dense),
                    Arc::new(ids),
                ],
            )
            .unwrap()
        })
        .collect()
}

/// One epoch through placement (every batch split by rank) and assembly (every rank's
/// steps), as the dataflow's readers and owners do it, on one thread.
fn deliver(batches: &[RecordBatch], window: Option<u64>) -> Vec<RankBatch> {
    let placement = Placement::new(2, 4096, LastBatch::Pad, 0, window).unwrap();
    let rows = ROWS as u64;
    let mut owners: Vec<Assembler> = (0..2)
        .map(|r| Assembler::new(placement, r, &schema(), 1, Some(rows), (0, 0)).unwrap())
        .collect();
    let (mut pieces, mut out) = (Vec::new(), Vec::new());
    for (b, batch) in batches.iter().enumerate() {
        let first = (b * BATCH_ROWS) as u64;
        split(&placement, 0, rows, first, 0..rows, batch, &mut pieces);
        for p in pieces.drain(..) {
            owners[p.rank].push(&p).unwrap();
        }
        for o in &mut owners {
            o.ready(&mut out).unwrap();
        }
    }
    out
}

fn benches(c: &mut Criterion) {
    let batches = featurized();
    let mut g = c.benchmark_group("delivery");
    g.throughput(Throughput::Elements(ROWS as u64));
    g.bench_function("place + assemble in order, 2 ranks x 4096", |b| {
        b.iter(|| black_box(deliver(&batches, None)))
    });
    g.bench_function("place + assemble shuffled, window 65536", |b| {
        b.iter(|| black_box(deliver(&batches, Some(65_536))))
    });
    let ranked = deliver(&batches, None);
    g.bench_function("to TrainingBatch (host)", |b| {
        b.iter(|| {
            for rb in &ranked {
                black_box(TrainingBatch::from_rank_batch(rb).unwrap());
            }
        })
    });
    g.bench_function("loader hand-off, 2 ranks", |b| {
        b.iter(|| {
            let mut feeds = Vec::new();
            let mut loaders = Vec::new();
            for rank in 0..2 {
                let (f, l, _) =
                    loader::spawn(rank, LoaderConfig::default(), ErrorSlot::default()).unwrap();
                feeds.push(f);
                loaders.push(l);
            }
            std::thread::scope(|s| {
                for l in &loaders {
                    s.spawn(move || {
                        for b in l.batches() {
                            black_box(b.unwrap());
                        }
                    });
                }
                for rb in &ranked {
                    feeds[rb.meta.rank].send(rb.clone()).unwrap();
                }
                feeds.clear();
            });
        })
    });
    g.finish();
}

criterion_group!(delivery, benches);
criterion_main!(delivery);
