//! The pushed pipeline's server and its producers and readers, shared by the DoPut
//! tests (`push.rs`, `durable.rs`), and the crash tests' trainer loop (`follow.rs` too).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arrow::array::{Float64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor};
use futures::TryStreamExt;

use super::{Server, serve};

/// A pipeline of pushed rows with no fitted step, so that its state is empty.
const PIPELINE: &str = r#"
name = "pushed"
[[group]]
name = "dense"
kind = "dense"
columns = ["a", "b"]
steps = ["fill_null(0)", "clip(-3, 3)"]
[[group]]
name = "ids"
kind = "ids"
columns = ["c"]
steps = ["hash_bucket(100)"]
"#;

/// The pushed pipeline served with `extra` arguments.
pub fn start_with(dir: &std::path::Path, extra: &[&std::ffi::OsStr]) -> (Server, String) {
    let toml = dir.join("pushed.toml");
    std::fs::write(&toml, format!("input = \"flight\"\n{PIPELINE}")).unwrap();
    let state = dir.join("state.json");
    std::fs::write(
        &state,
        hydrant::operators::FittedState::empty("pushed").to_json(),
    )
    .unwrap();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--batch-size".as_ref(),
        "64".as_ref(),
        "--pipeline".as_ref(),
        toml.as_os_str(),
        "--state".as_ref(),
        state.as_os_str(),
    ];
    args.extend_from_slice(extra);
    serve(&args)
}

pub fn batch(rows: usize) -> RecordBatch {
    let schema = Schema::new(vec![
        Field::new("a", DataType::Float64, true),
        Field::new("b", DataType::Float64, true),
        Field::new("c", DataType::Utf8, true),
    ]);
    let a: Float64Array = (0..rows).map(|i| Some(i as f64)).collect();
    let b: Float64Array = (0..rows)
        .map(|i| (i % 3 != 0).then_some(i as f64 / 7.0))
        .collect();
    let c: StringArray = (0..rows).map(|i| Some(format!("v{}", i % 11))).collect();
    RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(a), Arc::new(b), Arc::new(c)],
    )
    .unwrap()
}

/// A push of `batch` by a producer that names itself: `(producer, seq)`.
pub async fn produced(batch: RecordBatch, origin: Option<(&str, u64)>) -> Vec<FlightData> {
    let mut path = vec!["ingest".to_string(), "pushed".to_string()];
    let mut metadata = bytes::Bytes::new();
    if let Some((producer, seq)) = origin {
        path.push(producer.to_string());
        metadata = format!(r#"{{"seq":{seq}}}"#).into();
    }
    let mut messages: Vec<FlightData> = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_path(path)))
        .build(futures::stream::iter([Ok(batch)]))
        .try_collect()
        .await
        .unwrap();
    // The batch's own message carries its `seq` (the first one is the schema).
    if let Some(last) = messages.last_mut() {
        last.app_metadata = metadata;
    }
    messages
}

/// The ticket of the pushed pipeline's one rank from `start_step`.
pub fn ticket(start_step: u64) -> hydrant_flight::Ticket {
    hydrant_flight::Ticket {
        pipeline: "pushed".into(),
        epoch: 0,
        rank: 0,
        world_size: 1,
        start_step,
        job: None,
    }
}

/// A tokio runtime for a test's clients (the server is another process).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Steps `start..start + steps` (at most) of the one rank of the pushed pipeline.
pub async fn read_steps(uri: &str, start: u64, steps: usize) -> Vec<hydrant_flight::StepBatch> {
    let mut client = hydrant_flight::Client::connect(uri).await.unwrap();
    let stream = client.steps(&ticket(start)).await.unwrap();
    take_steps(stream, steps).await
}

/// The next `steps` steps of `stream` (fewer if it ends first); an error fails the test.
pub async fn take_steps(
    mut stream: hydrant_flight::Steps,
    steps: usize,
) -> Vec<hydrant_flight::StepBatch> {
    let mut got = Vec::new();
    while got.len() < steps {
        match stream.next_step().await {
            Some(step) => got.push(step.unwrap()),
            None => break,
        }
    }
    got
}

/// A crash test's trainer loop: keeps each step of `stream` in `got` (a step got twice
/// must be the same) and, given `commit = (client, pipeline, every)`, commits after each
/// `every`-th step, until the stream ends (`true`) or breaks (`false`: the server went).
pub async fn keep_steps(
    mut stream: hydrant_flight::Steps,
    got: &Mutex<BTreeMap<u64, RecordBatch>>,
    mut commit: Option<(hydrant_flight::Client, &str, u64)>,
) -> bool {
    loop {
        match stream.next_step().await {
            None => return true,
            Some(Err(_)) => return false,
            Some(Ok(step)) => {
                let s = step.meta.step;
                if let Some(before) = got.lock().unwrap().insert(s, step.batch.clone()) {
                    assert_eq!(before, step.batch, "step {s} differs when sent again");
                }
                if let Some((client, pipeline, every)) = &mut commit
                    && (s + 1) % *every == 0
                {
                    let _ = client.commit(pipeline, s + 1).await;
                }
            }
        }
    }
}

/// arrow-flight's generated client of the server at `uri`, for calls made by hand.
pub async fn flight_client(uri: &str) -> FlightServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(uri.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    FlightServiceClient::new(channel)
}

/// Pushes batches `seqs` of `producer` (each of `rows` rows); returns which were
/// acknowledged as duplicates.
pub async fn push_all(
    uri: &str,
    producer: &str,
    seqs: std::ops::Range<u64>,
    rows: usize,
) -> Vec<u64> {
    let mut client = flight_client(uri).await;
    let mut duplicates = Vec::new();
    for seq in seqs {
        let messages = produced(batch(rows), Some((producer, seq))).await;
        let response = client.do_put(futures::stream::iter(messages)).await;
        let acks: Vec<arrow_flight::PutResult> =
            response.unwrap().into_inner().try_collect().await.unwrap();
        let ack: serde_json::Value = serde_json::from_slice(&acks[0].app_metadata).unwrap();
        assert_eq!(ack["rows"], rows);
        if ack.get("duplicate").is_some() {
            duplicates.push(seq);
        }
    }
    duplicates
}

pub fn spool_segments(dir: &std::path::Path) -> usize {
    spool_first_rows(dir).len()
}

/// The first row of each spool segment in `dir`, ascending (from the file names).
pub fn spool_first_rows(dir: &std::path::Path) -> Vec<u64> {
    let mut rows: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_prefix("pushed-")?
                .strip_suffix(".spool")?
                .parse()
                .ok()
        })
        .collect();
    rows.sort_unstable();
    rows
}

pub async fn end_ingest(uri: &str) {
    let channel = tonic::transport::Channel::from_shared(uri.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let end = arrow_flight::Action::new("end_ingest", "pushed");
    let _: Vec<_> = FlightServiceClient::new(channel)
        .do_action(end)
        .await
        .unwrap()
        .into_inner()
        .try_collect()
        .await
        .unwrap();
}
