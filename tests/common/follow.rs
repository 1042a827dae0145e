//! Helpers of the tests of `hydrant serve --follow`: a server following a folder with a
//! state directory, and its two ranks' steps, status and end.

use std::path::Path;

use super::{Server, real_row_ids, serve};

/// Ranks the followed pipeline is served to.
pub const RANKS: usize = 2;

/// How long a test waits for a stream to end.
pub const STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// A server of `examples/criteo.toml` following `folder` with `state`, recording in
/// `state_dir`: 2 ranks, steps of 500 rows, shuffled in windows of 1,500.
pub fn serve_following(folder: &Path, state: &Path, state_dir: &Path) -> (Server, String) {
    let toml = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/criteo.toml");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--pipeline".as_ref(),
        toml.as_os_str(),
        "--state".as_ref(),
        state.as_os_str(),
        "--follow".as_ref(),
        folder.as_os_str(),
        "--state-dir".as_ref(),
        state_dir.as_os_str(),
        "--ranks".as_ref(),
        "2".as_ref(),
        "--batch-size".as_ref(),
        "500".as_ref(),
        "--shuffle".as_ref(),
        "--shuffle-window".as_ref(),
        "1500".as_ref(),
    ];
    serve(&args)
}

/// Puts `src` into `folder` as `name` the way Spark's committers do: written under a
/// temporary name, then renamed into place.
pub fn publish(src: &Path, folder: &Path, name: &str) {
    let tmp = folder.join(format!("_temporary-{name}"));
    std::fs::copy(src, &tmp).unwrap();
    std::fs::rename(&tmp, folder.join(name)).unwrap();
}

/// The ticket of `rank`'s stream from `start`.
pub fn ticket(rank: usize, start: u64) -> hydrant_flight::Ticket {
    hydrant_flight::Ticket {
        pipeline: "criteo".into(),
        epoch: 0,
        rank: rank as u32,
        world_size: RANKS as u32,
        start_step: start,
        job: None,
    }
}

/// Each rank's steps from `start` (at most `steps`), as (step, batch).
pub async fn read(uri: &str, start: u64, steps: usize) -> Vec<Vec<hydrant_flight::StepBatch>> {
    let mut readers = Vec::new();
    for rank in 0..RANKS {
        let uri = uri.to_string();
        readers.push(tokio::spawn(async move {
            let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
            let stream = client.steps(&ticket(rank, start)).await.unwrap();
            super::pushed::take_steps(stream, steps).await
        }));
    }
    let mut out = Vec::new();
    for r in readers {
        out.push(r.await.unwrap());
    }
    out
}

/// The pipeline's `pushed` status, with its `runs`.
pub async fn status(uri: &str) -> serde_json::Value {
    let mut client = hydrant_flight::Client::connect(uri).await.unwrap();
    let status = client.status().await.unwrap();
    let mut pushed = status["pipelines"][0]["pushed"].clone();
    pushed["runs"] = status["pipelines"][0]["runs"].clone();
    pushed
}

/// Ends the followed input (`end_ingest`), which must succeed.
pub async fn end(uri: &str) {
    end_ingest(uri).await.unwrap();
}

/// The `end_ingest` action on pipeline `criteo`, as a raw Flight call.
pub async fn end_ingest(uri: &str) -> Result<(), tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(uri.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = arrow_flight::flight_service_client::FlightServiceClient::new(channel);
    client
        .do_action(arrow_flight::Action::new("end_ingest", "criteo"))
        .await
        .map(drop)
}

/// Every real row id the ranks' steps hold, sorted.
pub fn sorted_ids(ranks: &[Vec<hydrant_flight::StepBatch>]) -> Vec<u64> {
    let mut ids: Vec<u64> = (ranks.iter().flatten())
        .flat_map(|s| real_row_ids(&s.batch))
        .collect();
    ids.sort_unstable();
    ids
}

/// Waits until the server has admitted `files` files.
pub async fn admitted(uri: &str, files: u64) -> serde_json::Value {
    for _ in 0..400 {
        let s = status(uri).await;
        if s["follow"]["files"] == files {
            return s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("{files} files were not admitted: {}", status(uri).await);
}

/// The status once `follow.FIELD` is set (within 10 s; the last status otherwise).
pub async fn status_with(uri: &str, field: &str) -> serde_json::Value {
    let mut s = status(uri).await;
    for _ in 0..400 {
        if !s["follow"][field].is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        s = status(uri).await;
    }
    s
}
