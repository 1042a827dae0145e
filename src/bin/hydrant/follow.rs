//! `hydrant run --follow DIR`: the files that appear in a folder, featurized and delivered
//! to every rank's sink as they arrive, until SIGINT or SIGTERM ends the input (the last
//! step padded, every rank given the same number of steps).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use hydrant::delivery::{RankBatch, StepMeta};
use hydrant::operators::Batch;
use hydrant::sink::SinkSpec;
use hydrant::{Error, PipelineSpec, Result};
use hydrant_flight::Served;
use serde_json::json;

use super::serve::{shutdown_signal, streamed_pipeline};
use super::{RunArgs, round3};

/// What one rank's sink took.
#[derive(Default)]
struct Taken {
    steps: u64,
    rows: u64,
    padded: u64,
}

/// Runs `args`' pipeline over the files that appear in `folder`.
pub(crate) fn run_follow(args: &RunArgs, folder: &Path) -> Result<serde_json::Value> {
    let started = Instant::now();
    let sink: SinkSpec = args.sink.parse()?;
    if sink == SinkSpec::Train || args.common.processes > 1 {
        return Err(Error::Usage(
            "run --follow writes to `null` or `parquet:DIR`, on one process".into(),
        ));
    }
    let spec = PipelineSpec::from_file(&args.common.pipeline)?;
    let state = args.state.as_deref();
    let served = streamed_pipeline(spec.clone(), &args.common, state, &args.delivery, true)?
        .follow(folder, args.state_dir.as_deref())?;
    let served = Arc::new(served);
    sink.prepare(0)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| Error::Usage(format!("cannot start the runtime: {e}")))?;
    let ender = served.clone();
    rt.spawn(async move {
        shutdown_signal().await;
        // Ends the input: the followed files' rows so far are delivered, then the streams end.
        let ended = tokio::task::spawn_blocking(move || ender.end_input()).await;
        if let Ok(Err(e)) = ended {
            hydrant::operators::log_line!("hydrant: {e}");
        }
    });
    let world = served.world_size();
    let mut ranks = Vec::new();
    for rank in 0..world {
        let stream = {
            let _on_runtime = rt.enter();
            served
                .open(rank, 0, 0)
                .map_err(|e| Error::Dataflow(e.to_string()))?
        };
        let (handle, sink, schema) = (rt.handle().clone(), sink.clone(), served.schema());
        let take = move || {
            // Opened here: a sink stays on its thread.
            let out = sink.open(0, rank as usize, schema)?;
            take_rank(handle, stream, out, rank as usize, world as usize)
        };
        let thread = std::thread::Builder::new()
            .name(format!("hydrant-rank-{rank}"))
            .spawn(take)
            .map_err(|e| Error::Usage(format!("cannot start rank {rank}'s sink: {e}")))?;
        ranks.push(thread);
    }
    let mut taken = Vec::new();
    for t in ranks {
        let t = t
            .join()
            .map_err(|_| Error::Dataflow("a rank's sink panicked".into()))??;
        taken.push(t);
    }
    let seconds = started.elapsed().as_secs_f64();
    let rows: u64 = taken.iter().map(|t| t.rows).sum();
    let status = served.status();
    Ok(json!({
        "pipeline": spec.name,
        "follow": folder,
        "rows": rows,
        "ranks": world,
        "steps_per_rank": taken.first().map_or(0, |t| t.steps),
        "padded_rows": taken.iter().map(|t| t.padded).sum::<u64>(),
        "files": status["pushed"]["follow"]["files"],
        "skipped_files": status["pushed"]["follow"]["skipped"],
        "state_version": status["state_version"],
        "state_versions": status["state_versions"],
        "seconds": round3(seconds),
        "rows_per_s": (rows as f64 / seconds).round(),
        "sink": sink.to_string(),
    }))
}

/// Writes one rank's steps to its sink until its stream ends.
fn take_rank(
    rt: tokio::runtime::Handle,
    mut stream: hydrant_flight::RankStream,
    mut out: Box<dyn hydrant::sink::BatchSink>,
    rank: usize,
    world_size: usize,
) -> Result<Taken> {
    let mut taken = Taken::default();
    while let Some(item) = rt.block_on(stream.next()) {
        let (meta, data) = item.map_err(|e| Error::Dataflow(e.to_string()))?;
        let rb = RankBatch {
            meta: StepMeta {
                epoch: meta.epoch,
                step: meta.step,
                rank,
                world_size,
                padded_rows: meta.padded_rows as usize,
                state_version: meta.state_version,
                positions: meta.positions,
            },
            batch: Batch {
                seq: meta.step,
                data,
            },
        };
        out.write(&rb)?;
        taken.steps += 1;
        taken.rows += meta.rows - meta.padded_rows;
        taken.padded += meta.padded_rows;
    }
    out.finish()?;
    Ok(taken)
}
