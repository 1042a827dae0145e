//! hydrant as a library inside your own training program: build the Criteo pipeline in
//! code, run it on two in-process ranks, and train a tiny linear model by hand, averaging
//! the two ranks' gradients each step.
//!
//! ```text
//! cargo run --release --example embedded [ROWS]
//! ```

use std::sync::{Barrier, Mutex};

use hydrant::Pipeline;
use hydrant::loader::TrainingBatch;

const RANKS: usize = 2;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rows: u64 = std::env::args()
        .nth(1)
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(200_000);
    let dir = std::env::temp_dir().join("hydrant-embedded");
    std::fs::create_dir_all(&dir)?;
    let data = dir.join(format!("criteo-{rows}.parquet"));
    if !data.exists() {
        hydrant::demo::criteo(rows, &data, 42)?;
    }

    let numeric: Vec<String> = (0..13).map(|i| format!("i{i}")).collect();
    let categorical: Vec<String> = (0..26).map(|i| format!("c{i}")).collect();
    let pipeline = Pipeline::builder("criteo")
        .input(&data)
        .label("label")
        .dense(
            "dense",
            &numeric,
            &["fill_null(0)", "log1p", "standardize", "clip(-3, 3)"],
        )
        .ids("ids", &categorical, &["vocab(max_size=100000)"])
        .ranks(RANKS)
        .batch_size(2048)
        .epochs(2)
        .shuffle(7, 65_536)
        .build()?;
    let plan = pipeline.epoch_plan();
    println!(
        "{} rows -> {} steps per rank per epoch, {} padding rows per epoch",
        plan.rows(),
        plan.steps(),
        plan.padded_rows()
    );

    // The model: one weight per dense feature, and a bias. The ids are left to a real model.
    let weights = Mutex::new(vec![0.0f32; 14]);
    let grads = Mutex::new((vec![0.0f32; 14], 0.0f64, 0usize));
    let barrier = Barrier::new(RANKS);
    let running = pipeline.start()?;
    std::thread::scope(|s| {
        for r in 0..RANKS {
            let (loader, weights, grads, barrier) =
                (&running.ranks()[r], &weights, &grads, &barrier);
            s.spawn(move || {
                for batch in loader.batches() {
                    let batch = batch.expect("the pipeline failed");
                    let w = weights.lock().unwrap().clone();
                    let (g, loss, n) = gradient(&w, &batch);
                    {
                        let mut acc = grads.lock().unwrap();
                        acc.0.iter_mut().zip(&g).for_each(|(a, b)| *a += b);
                        acc.1 += loss;
                        acc.2 += n;
                    }
                    // All-reduce: the last rank to arrive applies the averaged gradient.
                    if barrier.wait().is_leader() {
                        let mut acc = grads.lock().unwrap();
                        let n = acc.2.max(1) as f32;
                        let mut w = weights.lock().unwrap();
                        w.iter_mut()
                            .zip(&acc.0)
                            .for_each(|(w, g)| *w -= 0.5 * g / n);
                        let m = batch.meta;
                        if m.step % 20 == 0 {
                            println!(
                                "epoch {} step {:>4}: logloss {:.4}",
                                m.epoch,
                                m.step,
                                acc.1 / acc.2.max(1) as f64
                            );
                        }
                        *acc = (vec![0.0; 14], 0.0, 0);
                    }
                    barrier.wait();
                }
            });
        }
    });
    let stalls: Vec<f64> = running
        .ranks()
        .iter()
        .map(|l| l.stall().as_secs_f64())
        .collect();
    let report = running.join()?;
    println!(
        "delivered {} rows in {:?} steps per rank; stall {:?} s per rank",
        report.rows, report.steps_per_rank, stalls
    );
    Ok(())
}

/// Logistic-loss gradient of a linear model over the dense features, padding masked out.
fn gradient(w: &[f32], batch: &TrainingBatch) -> (Vec<f32>, f64, usize) {
    let dense = batch.dense.host().expect("host batches");
    let labels = batch
        .labels
        .as_ref()
        .and_then(|l| l.host())
        .expect("a label");
    let d = batch.dense.shape[1];
    let mut g = vec![0.0f32; d + 1];
    let (mut loss, mut n) = (0.0f64, 0);
    for r in 0..batch.rows() {
        if batch.is_padding.value(r) {
            continue;
        }
        let x = &dense[r * d..(r + 1) * d];
        let z: f32 = w[d] + x.iter().zip(w).map(|(a, b)| a * b).sum::<f32>();
        let p = 1.0 / (1.0 + (-z).exp());
        let y = labels[r];
        loss -= f64::from(y * (p + 1e-7).ln() + (1.0 - y) * (1.0 - p + 1e-7).ln());
        x.iter()
            .zip(&mut g)
            .for_each(|(xi, gi)| *gi += (p - y) * xi);
        g[d] += p - y;
        n += 1;
    }
    (g, loss, n)
}
