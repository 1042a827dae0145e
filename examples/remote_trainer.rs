//! A Rust trainer in its own process, fed by `hydrant serve` over Arrow Flight: every
//! rank of the served pipeline is read concurrently through the same loader actors as an
//! in-process run (host memory here; `LoaderConfig::backend` picks cuda), and each rank
//! reports its steps, real rows and the time it waited for data.
//!
//! ```text
//! hydrant serve --pipeline examples/criteo.toml --input data/criteo.parquet \
//!     --ranks 2 --batch-size 4096 --listen 127.0.0.1:50051 &
//! cargo run --release --example remote_trainer -- grpc://127.0.0.1:50051 criteo
//! ```

use hydrant::Pipeline;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let uri = args
        .next()
        .unwrap_or_else(|| "grpc://127.0.0.1:50051".into());
    let pipeline = args.next().unwrap_or_else(|| "criteo".into());
    let remote = Pipeline::connect(&uri, &pipeline)?;
    let ranks = (0..remote.world_size())
        .map(|r| remote.rank(r))
        .collect::<hydrant::Result<Vec<_>>>()?;
    let started = std::time::Instant::now();
    let reports = std::thread::scope(|s| {
        let threads: Vec<_> = ranks
            .iter()
            .map(|rank| {
                s.spawn(move || -> hydrant::Result<(u64, usize)> {
                    let (mut steps, mut rows) = (0, 0);
                    for batch in rank.batches() {
                        let batch = batch?;
                        // A trainer's step would go here: batch.dense, batch.ids,
                        // batch.labels, masking batch.is_padding out of the loss.
                        steps += 1;
                        rows += batch.real_rows();
                    }
                    Ok((steps, rows))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank's thread panicked"))
            .collect::<hydrant::Result<Vec<_>>>()
    })?;
    let seconds = started.elapsed().as_secs_f64();
    for (r, ((steps, rows), rank)) in reports.iter().zip(&ranks).enumerate() {
        println!(
            "rank {r}: {steps} steps, {rows} rows, waited {:.3} s of {seconds:.3} s",
            rank.stall().as_secs_f64()
        );
    }
    Ok(())
}
