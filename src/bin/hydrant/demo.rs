//! `hydrant demo`: the main job on a built-in default, and what a newcomer came to see —
//! the same job done featurize-then-train (the file hand-off) against overlapped, the
//! share of time the trainers waited for data, and the falling loss.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hydrant::{Error, Result};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;

use super::{Common, DeliveryArgs, RunArgs, run};

/// The simulated model time per step: python/examples/torch_ddp.py's model (an MLP beside
/// a 26 × 4096 × 16 embedding table, Adam) took 43 ms a step for 4096 rows on one CPU
/// core of the machine the demo was written on.
pub const STEP_MS: f64 = 40.0;

/// Runs the demo on `rows` generated rows kept in `dir`.
pub fn demo(rows: u64, dir: &Path, step_ms: f64) -> Result<()> {
    let data = generated(rows, dir)?;
    let pipeline = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/criteo.toml");
    eprintln!(
        "hydrant: fitting {} on {}, then streaming two shuffled epochs to 2 ranks that \
         train a logistic regression while the next batches are featurized; each step \
         also sleeps {step_ms} ms, a simulated model (python/examples/torch_ddp.py's takes \
         ~43 ms for 4096 rows on one CPU core)",
        pipeline.display(),
        data.display(),
    );
    let args = |sink: String| RunArgs {
        common: Common {
            pipeline: pipeline.clone(),
            input: vec![data.clone()],
            workers: None,
            processes: 1,
            process: 0,
            hostfile: None,
            cluster_secret_file: None,
        },
        state: None,
        sink,
        summary: None,
        follow: None,
        state_dir: None,
        delivery: DeliveryArgs {
            ranks: 2,
            batch_size: 4096,
            max_batch_bytes: hydrant::DEFAULT_MAX_BATCH_BYTES,
            cache_mib: 0,
            epochs: 2,
            seed: 0,
            shuffle: true,
            shuffle_window: None,
            last_batch: "pad".into(),
            start_epoch: 0,
            start_step: 0,
            prefetch: 2,
            loader: "host".into(),
            step_ms,
            learning_rate: 0.05,
            log_every: Some(10),
        },
    };
    let overlapped = run(&args("train:logreg".into()))?;

    eprintln!("hydrant: now the same job as a file hand-off: featurize to Parquet, read it back");
    let out = dir.join("featurized");
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| io(&out, e))?;
    }
    let written = run(&args(format!("parquet:{}", out.display())))?;
    let read_s = read_back(&out)?;
    std::fs::remove_dir_all(&out).map_err(|e| io(&out, e))?;

    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let stall: Vec<f64> = overlapped["stall_s_per_rank"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    let mean_stall = stall.iter().sum::<f64>() / stall.len().max(1) as f64;
    // Training alone: the trainers' time less what they spent waiting for data.
    let train_s = f(&overlapped, "consume_s") - mean_stall;
    let handoff = f(&written, "seconds") + read_s + train_s;
    let together = f(&overlapped, "seconds");
    println!("{overlapped}");
    eprintln!(
        "\nhydrant: {} rows x 2 epochs, 2 ranks, 4096 rows a step, {step_ms} ms of simulated \
         model per step\n  \
         featurize, then train (file hand-off): {:.2} s = fit + featurize + write Parquet \
         {:.2} s + read it back {read_s:.2} s + train {train_s:.2} s\n  \
         overlapped (hydrant):                  {together:.2} s ({:.2}x faster); trainers \
         waited for data {:.1}% of their time\n  \
         logloss {} -> {}",
        overlapped["input_rows"],
        handoff,
        f(&written, "seconds"),
        handoff / together.max(1e-9),
        f(&overlapped, "stall_fraction") * 100.0,
        overlapped["logloss_first"],
        overlapped["logloss_last"],
    );
    Ok(())
}

/// The generated input, made once (into a partial file renamed into place).
fn generated(rows: u64, dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let data = dir.join(format!("criteo-{rows}.parquet"));
    if !data.exists() {
        eprintln!(
            "hydrant: generating {rows} Criteo-like rows into {}",
            data.display()
        );
        let partial = data.with_extension("parquet.partial");
        hydrant::demo::criteo(rows, &partial, 42)?;
        std::fs::rename(&partial, &data).map_err(|e| io(&data, e))?;
    }
    Ok(data)
}

/// Seconds to read every featurized Parquet file under `dir` into memory, as a trainer
/// reading the hand-off would.
fn read_back(dir: &Path) -> Result<f64> {
    let t0 = Instant::now();
    let mut rows = 0usize;
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let path = entry.map_err(|e| io(dir, e))?.path();
        if path.extension().is_none_or(|e| e != "parquet") {
            continue;
        }
        let file = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| io(&path, e))?;
        for batch in reader {
            rows += batch.map_err(|e| io(&path, e))?.num_rows();
        }
    }
    if rows == 0 {
        return Err(Error::Usage(format!(
            "{}: nothing was written",
            dir.display()
        )));
    }
    Ok(t0.elapsed().as_secs_f64())
}

fn io(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Usage(format!("{}: {e}", path.display()))
}
