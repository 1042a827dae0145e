//! Statistics that follow a stream (`[stats] mode = "refresh"`), against the real server:
//! the first version fitted on the warmup rows, new versions every `every` rows, each
//! switched at the same step on every rank and stamped on the batches it featurized, ids
//! stable across versions, and the same versions at the same steps after a SIGKILL.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{AsArray, Float64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Float32Type, Int64Type, Schema};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor};
use futures::TryStreamExt;
use hydrant::operators::{FittedParam, FittedState};

mod common;
use common::pushed::{flight_client, runtime};
use common::{Server, serve};

const PIPELINE: &str = r#"
name = "fresh"
input = "flight"

[stats]
mode = "refresh"
warmup = 256
every = 320

[[group]]
name = "dense"
kind = "dense"
columns = ["x"]
steps = ["standardize"]

[[group]]
name = "ids"
kind = "ids"
columns = ["c"]
steps = ["vocab(max_size=10)"]
"#;

/// Rows pushed, in pushes of `PUSH` rows.
const ROWS: u64 = 2000;
const PUSH: u64 = 50;
/// Two ranks of 32 rows: steps of 64 rows.
const RANKS: u64 = 2;
const STEP_ROWS: u64 = 64;

/// The value of column `c` at stream row `r`: a window of 7 values that slides by one
/// every 400 rows, so new values keep arriving.
fn value(r: u64) -> String {
    format!("v{}", r % 7 + r / 400)
}

/// Column `x` at row `r`: its mean drifts.
fn x(r: u64) -> f64 {
    r as f64 / 100.0 + (r % 5) as f64
}

fn rows(first: u64, n: u64) -> RecordBatch {
    let schema = Schema::new(vec![
        Field::new("x", DataType::Float64, true),
        Field::new("c", DataType::Utf8, true),
    ]);
    let xs: Float64Array = (first..first + n).map(|r| Some(x(r))).collect();
    let cs: StringArray = (first..first + n).map(|r| Some(value(r))).collect();
    RecordBatch::try_new(Arc::new(schema), vec![Arc::new(xs), Arc::new(cs)]).unwrap()
}

fn start(dir: &Path, state_dir: &Path) -> (Server, String) {
    start_with(dir, state_dir, &[])
}

fn start_with(dir: &Path, state_dir: &Path, extra: &[&str]) -> (Server, String) {
    let toml = dir.join("fresh.toml");
    std::fs::write(&toml, PIPELINE).unwrap();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--pipeline".as_ref(),
        toml.as_os_str(),
        "--batch-size".as_ref(),
        "32".as_ref(),
        "--ranks".as_ref(),
        "2".as_ref(),
        "--state-dir".as_ref(),
        state_dir.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    serve(&args)
}

/// Pushes batches `seqs` as producer `p` (batch `k` holds rows `k * PUSH..`).
async fn push(uri: &str, seqs: std::ops::Range<u64>) {
    let mut client = flight_client(uri).await;
    for seq in seqs {
        let path = vec!["ingest".into(), "fresh".into(), "p".into()];
        let mut messages: Vec<FlightData> = FlightDataEncoderBuilder::new()
            .with_flight_descriptor(Some(FlightDescriptor::new_path(path)))
            .build(futures::stream::iter([Ok(rows(seq * PUSH, PUSH))]))
            .try_collect()
            .await
            .unwrap();
        messages.last_mut().unwrap().app_metadata = format!(r#"{{"seq":{seq}}}"#).into();
        let response = client.do_put(futures::stream::iter(messages)).await;
        let _: Vec<_> = response.unwrap().into_inner().try_collect().await.unwrap();
    }
}

async fn end_ingest(uri: &str) {
    let channel = tonic::transport::Channel::from_shared(uri.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let end = arrow_flight::Action::new("end_ingest", "fresh");
    let _: Vec<_> = FlightServiceClient::new(channel)
        .do_action(end)
        .await
        .unwrap()
        .into_inner()
        .try_collect()
        .await
        .unwrap();
}

/// Rank `rank`'s steps from `start` on, until its stream ends (or `until` steps).
async fn read(uri: String, rank: u64, start: u64, until: u64) -> Vec<hydrant_flight::StepBatch> {
    let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
    let ticket = hydrant_flight::Ticket {
        pipeline: "fresh".into(),
        epoch: 0,
        rank: rank as u32,
        world_size: RANKS as u32,
        start_step: start,
        job: None,
    };
    let mut steps = client.steps(&ticket).await.unwrap();
    let mut got = Vec::new();
    while (got.len() as u64) < until {
        match steps.next_step().await {
            Some(step) => got.push(step.unwrap()),
            None => break,
        }
    }
    got
}

/// Both ranks' steps from `start` (at most `until` each), read while `push` runs.
async fn read_ranks(
    uri: &str,
    start: u64,
    until: u64,
    push: impl std::future::Future<Output = ()>,
) -> Vec<Vec<hydrant_flight::StepBatch>> {
    let readers: Vec<_> = (0..RANKS)
        .map(|r| tokio::spawn(read(uri.to_string(), r, start, until)))
        .collect();
    push.await;
    let mut ranks = Vec::new();
    for r in readers {
        ranks.push(r.await.unwrap());
    }
    ranks
}

/// The versions' log: `(seq, version, at, from)` per line.
fn versions(state_dir: &Path) -> Vec<(u64, u64, u64, u64)> {
    let text = std::fs::read_to_string(state_dir.join("state.versions")).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let n = |k: &str| v[k].as_u64().unwrap();
            (n("seq"), n("version"), n("at"), n("from"))
        })
        .collect()
}

fn vocab(state: &FittedState) -> (Vec<String>, Option<u64>) {
    match &state.params["ids/c/0"] {
        FittedParam::BoundedVocab { values, unknown } => {
            (values.iter().map(String::from).collect(), Some(*unknown))
        }
        other => panic!("not a bounded vocabulary: {other:?}"),
    }
}

fn mean_std(state: &FittedState) -> (f64, f64) {
    match &state.params["dense/x/0"] {
        FittedParam::Standardize { mean, std } => (*mean, *std),
        other => panic!("not moments: {other:?}"),
    }
}

#[test]
fn versions_are_fitted_refreshed_and_switched_at_the_same_step_on_every_rank() {
    // Fitted at the warmup (in effect from row 0), then every 320 rows, each taking
    // effect at the next step boundary (steps of 64 rows, unshuffled).
    check_versions(&[], [0, 576, 896, 1216, 1536, 1856]);
}

#[test]
fn shuffled_versions_switch_where_no_window_crosses_a_step() {
    // Windows of 128 rows hold two steps: a version waits for the next window.
    check_versions(
        &["--shuffle", "--shuffle-window", "128"],
        [0, 640, 896, 1280, 1536, 1920],
    );
}

fn check_versions(extra: &[&str], from_rows: [u64; 6]) {
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let (_server, uri) = start_with(dir.path(), &state_dir, extra);
    let rt = runtime();
    let ranks = rt.block_on(read_ranks(&uri, 0, u64::MAX, async {
        push(&uri, 0..ROWS / PUSH).await;
        end_ingest(&uri).await;
    }));
    let log = versions(&state_dir);
    let at: Vec<u64> = log.iter().map(|l| l.2).collect();
    let from: Vec<u64> = log.iter().map(|l| l.3).collect();
    assert_eq!(at, [256, 576, 896, 1216, 1536, 1856]);
    assert_eq!(from, from_rows);
    assert_eq!(
        log.iter().map(|l| l.0).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5]
    );

    let steps = ROWS.div_ceil(STEP_ROWS);
    let mut states: BTreeMap<u64, FittedState> = BTreeMap::new();
    let mut client = rt.block_on(hydrant_flight::Client::connect(&uri)).unwrap();
    let mut seen_rows = Vec::new();
    for (rank, got) in ranks.iter().enumerate() {
        assert_eq!(got.len() as u64, steps, "rank {rank}");
        for s in got {
            let step = s.meta.step;
            // The version in effect at the step's first row, on every rank.
            let expected = log
                .iter()
                .rev()
                .find(|l| l.3 <= step * STEP_ROWS)
                .unwrap()
                .1;
            assert_eq!(s.meta.state_version, expected, "rank {rank} step {step}");
            let state = states.entry(expected).or_insert_with(|| {
                let json = rt.block_on(client.state("fresh", expected)).unwrap();
                FittedState::from_json(&json).unwrap()
            });
            // Each row featurized with that version, and no other.
            let (values, unknown) = vocab(state);
            let (mean, std) = mean_std(state);
            let ids = common::real_row_ids(&s.batch);
            let dense = s
                .batch
                .column_by_name("dense")
                .unwrap()
                .as_fixed_size_list();
            let dense = dense.values().as_primitive::<Float32Type>();
            let id = s.batch.column_by_name("ids").unwrap().as_fixed_size_list();
            let id = id.values().as_primitive::<Int64Type>();
            for (i, &r) in ids.iter().enumerate() {
                let want = values
                    .iter()
                    .position(|v| *v == value(r))
                    .map_or(unknown.unwrap() as i64, |p| p as i64);
                assert_eq!(id.value(i), want, "row {r}");
                let z = ((x(r) - mean) / std) as f32;
                assert!((dense.value(i) - z).abs() < 1e-4, "row {r}");
            }
            seen_rows.extend(ids);
        }
    }
    seen_rows.sort_unstable();
    assert_eq!(seen_rows, (0..ROWS).collect::<Vec<_>>(), "every row once");

    // Vocabularies only grow: each version's values start with the last one's, the
    // unknown id is max_size in all of them, and values that came later were added.
    let by_seq: Vec<&FittedState> = log.iter().map(|l| &states[&l.1]).collect();
    for pair in by_seq.windows(2) {
        let (a, b) = (vocab(pair[0]).0, vocab(pair[1]).0);
        assert!(
            b.len() >= a.len() && b[..a.len()] == a[..],
            "{a:?} then {b:?}"
        );
    }
    let (first, last) = (vocab(by_seq[0]), vocab(by_seq[5]));
    assert_eq!((first.1, last.1), (Some(10), Some(10)));
    assert_eq!(first.0.len(), 7, "the warmup saw v0..v6: {first:?}");
    // v0..v9 by row 1216: full, and no longer counted (v10 is unknown from then on).
    assert_eq!(vocab(by_seq[3]).0.len(), 10, "{:?}", vocab(by_seq[3]));
    assert_eq!(last, vocab(by_seq[3]));
    let kept = std::fs::read_to_string(state_dir.join("stats-5.json")).unwrap();
    assert!(kept.contains("dense/x/0") && !kept.contains("ids/c/0"));
    assert!(
        !state_dir.join("stats-4.json").exists(),
        "only the last statistics kept"
    );
    // The moments follow the drifting mean: all rows so far, not the warmup's only.
    assert!(mean_std(by_seq[5]).0 > mean_std(by_seq[0]).0 + 5.0);
    let status = rt.block_on(client.status()).unwrap();
    let p = &status["pipelines"][0];
    assert_eq!(p["state_versions"], 6, "{p}");
    assert_eq!(p["state_version"], log[5].1, "{p}");
    let missing = rt.block_on(client.state("fresh", 12345));
    assert!(format!("{missing:?}").contains("no state version 12345"));
    let garbage = rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(uri.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let action = arrow_flight::Action::new("state", "{\"version\": \"x\"}");
        FlightServiceClient::new(channel)
            .do_action(action)
            .await
            .map(|_| ())
    });
    assert_eq!(garbage.unwrap_err().code(), tonic::Code::InvalidArgument);
}

/// A server killed after a commit and restarted replays the spool: it counts the rows
/// since its last refresh point again and makes the versions an uninterrupted server
/// made, at the same rows, so every step from the commit on is the same bit for bit.
#[test]
fn a_killed_server_makes_the_same_versions_at_the_same_steps() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let whole = dir.path().join("whole");
    let reference = {
        let (_server, uri) = start(dir.path(), &whole);
        rt.block_on(read_ranks(&uri, 0, u64::MAX, async {
            push(&uri, 0..ROWS / PUSH).await;
            end_ingest(&uri).await;
        }))
    };

    let killed = dir.path().join("killed");
    let (mut server, uri) = start(dir.path(), &killed);
    // 1,200 rows: versions made at 256, 576 and 896; 18 steps of each rank cut.
    let early = rt.block_on(read_ranks(&uri, 0, 17, push(&uri, 0..24)));
    assert!(early.iter().all(|r| r.len() == 17));
    let mut client = rt.block_on(hydrant_flight::Client::connect(&uri)).unwrap();
    // Step 16 starts at row 1,024: the rows from the last refresh point (896) are kept.
    rt.block_on(client.commit("fresh", 16)).unwrap();
    let commit: serde_json::Value =
        serde_json::from_slice(&std::fs::read(killed.join("commit.json")).unwrap()).unwrap();
    assert_eq!(
        (commit["row"].as_u64(), commit["keep"].as_u64()),
        (Some(1024), Some(896))
    );
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    drop(server);

    let (_server, uri) = start(dir.path(), &killed);
    // The producer retries everything: what was acknowledged is not admitted twice.
    let resumed = rt.block_on(read_ranks(&uri, 16, u64::MAX, async {
        push(&uri, 0..ROWS / PUSH).await;
        end_ingest(&uri).await;
    }));
    assert_eq!(versions(&killed), versions(&whole));
    for (rank, (got, want)) in resumed.iter().zip(&reference).enumerate() {
        assert_eq!(got.len(), want.len() - 16, "rank {rank}");
        for (g, w) in got.iter().zip(&want[16..]) {
            assert_eq!(g.meta, w.meta, "rank {rank}");
            assert_eq!(g.batch, w.batch, "rank {rank} step {}", g.meta.step);
        }
    }
}

/// Pushes batch `seq` with `x` of row `huge` (if it holds it) set to 1e200, whose square
/// overflows: the push's status.
async fn push_with_huge(uri: &str, seq: u64, huge: u64) -> Result<(), tonic::Status> {
    let rows = seq * PUSH..(seq + 1) * PUSH;
    let plain = self::rows(rows.start, PUSH);
    let xs: Float64Array = rows
        .map(|r| Some(if r == huge { 1e200 } else { x(r) }))
        .collect();
    let batch = RecordBatch::try_new(plain.schema(), vec![Arc::new(xs), plain.column(1).clone()]);
    push_batch(uri, seq, batch.unwrap()).await
}

/// Pushes `batch` as batch `seq` of producer `p`: the push's status.
async fn push_batch(uri: &str, seq: u64, batch: RecordBatch) -> Result<(), tonic::Status> {
    let path = vec!["ingest".into(), "fresh".into(), "p".into()];
    let mut messages: Vec<FlightData> = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_path(path)))
        .build(futures::stream::iter([Ok(batch)]))
        .try_collect()
        .await
        .unwrap();
    messages.last_mut().unwrap().app_metadata = format!(r#"{{"seq":{seq}}}"#).into();
    let mut client = flight_client(uri).await;
    let response = client.do_put(futures::stream::iter(messages)).await?;
    let _: Vec<_> = response.into_inner().try_collect().await?;
    Ok(())
}

/// One value of 1e200 after the first version makes the moments of every later refresh
/// infinite (all rows so far count). `standardize` keeps the version before's mean and std
/// from then on, the vocabulary still refreshes, nothing infinite reaches a batch or the
/// state directory, and a restarted server replays the same batches from it: the versions
/// used to carry `std: inf`, written as `null`, and the server refused its own state
/// directory. Within the warmup a batch that would leave the first version unfit is refused.
#[test]
fn statistics_that_overflow_keep_the_version_before_and_the_state_dir_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let state_dir = dir.path().join("sd");
    let push_all = |uri: String| async move {
        for seq in 0..ROWS / PUSH {
            push_with_huge(&uri, seq, 300).await.unwrap();
        }
        end_ingest(&uri).await;
    };
    let first = {
        let (_server, uri) = start(dir.path(), &state_dir);
        rt.block_on(read_ranks(&uri, 0, u64::MAX, push_all(uri.clone())))
    };
    // Only the huge value itself is beyond float32 (this pipeline does not clip).
    let infinite: usize = first
        .iter()
        .flatten()
        .map(|step| {
            let dense = step
                .batch
                .column_by_name("dense")
                .unwrap()
                .as_fixed_size_list();
            let values = dense.values().as_primitive::<Float32Type>();
            values.values().iter().filter(|v| !v.is_finite()).count()
        })
        .sum();
    assert_eq!(infinite, 1);
    let states: Vec<FittedState> = versions(&state_dir)
        .iter()
        .map(|(_, v, _, _)| hydrant::read_state(&state_dir.join(format!("state-{v}.json"))))
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(states.len() > 2);
    for s in &states[1..] {
        assert_eq!(mean_std(s), mean_std(&states[0]));
    }
    assert_ne!(vocab(states.last().unwrap()), vocab(&states[0]));

    let (_server, uri) = start(dir.path(), &state_dir);
    let again = rt.block_on(read_ranks(&uri, 0, u64::MAX, async {}));
    assert_eq!(again.len(), first.len());
    for (got, want) in again.iter().zip(&first) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert_eq!((&g.meta, &g.batch), (&w.meta, &w.batch));
        }
    }

    // Within the warmup there is no version before to keep: the batch holding the huge
    // value is refused whole, and the stream goes on without it. It used to be taken, and
    // the push that completed the warmup then failed the stream: again at every restart,
    // as the replay met the same row.
    let early = dir.path().join("early");
    let (server, uri) = start(dir.path(), &early);
    rt.block_on(async {
        let e = push_with_huge(&uri, 0, 10).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        let says = [
            "stream rows 0..50 cannot be fitted",
            "dense/x/0",
            "too large",
            "nothing of this batch was taken",
        ];
        assert!(says.iter().all(|s| e.message().contains(s)), "{e}");
        // The same sequence number again, without the value: it was not taken. Rows
        // 0..250 are held for the first version (no trainer is needed yet).
        for seq in 0..5 {
            push_with_huge(&uri, seq, u64::MAX).await.unwrap();
        }
    });
    drop(server);
    let (_server, uri) = start(dir.path(), &early);
    let got = rt.block_on(read_ranks(&uri, 0, u64::MAX, async {
        for seq in 5..8 {
            push_with_huge(&uri, seq, u64::MAX).await.unwrap();
        }
        end_ingest(&uri).await;
    }));
    assert_eq!(versions(&early)[0].2, 256);
    every_row_of_400_once(&got);
}

/// Every row of the 400 taken, once (the last, short step padded or dropped).
fn every_row_of_400_once(ranks: &[Vec<hydrant_flight::StepBatch>]) {
    let mut ids: Vec<u64> = ranks
        .iter()
        .flatten()
        .flat_map(|s| common::real_row_ids(&s.batch))
        .collect();
    ids.sort_unstable();
    assert!(ids.len() == 400 || ids.len() == 384, "{} rows", ids.len());
    assert!(ids.iter().copied().eq(0..ids.len() as u64));
}

/// What cannot be refreshed is refused at start, in one line.
#[test]
fn refreshing_what_cannot_be_refreshed_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("p.toml");
    let serve_err = |pipeline: &str, extra: &[&str]| {
        std::fs::write(&toml, pipeline).unwrap();
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--pipeline"];
        args.push(toml.to_str().unwrap());
        args.extend_from_slice(extra);
        let out = common::hydrant(&args);
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let unbounded = PIPELINE.replace("vocab(max_size=10)", "vocab");
    let e = serve_err(&unbounded, &[]);
    assert!(e.contains("without max_size"), "{e}");
    let files = PIPELINE.replace("input = \"flight\"", "");
    let data = common::gen_criteo(dir.path(), 100, 1);
    let e = serve_err(&files, &["--input", data.to_str().unwrap()]);
    assert!(e.contains("push its input"), "{e}");
    let frozen = PIPELINE.replace("mode = \"refresh\"\n", "");
    let e = serve_err(&frozen, &[]);
    assert!(
        e.contains("mode = \\\"refresh\\\" only") || e.contains("refresh\" only"),
        "{e}"
    );
}

/// A push refused because the state directory's disk is full is not counted into the
/// statistics: the first version is fitted on the rows taken in its place (here, the
/// same sequence number sent again with other rows, as a producer that gives up on a
/// batch may). The refused batch used to stay counted, so its values, never admitted,
/// were in the version. Needs a tmpfs to fill, so root.
#[test]
fn a_push_refused_for_a_full_disk_is_not_counted() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    let Some(_mounted) = common::small_tmpfs(&disk) else {
        return;
    };
    let state_dir = disk.join("sd");
    let (_server, uri) = start(dir.path(), &state_dir);
    let never = "never-admitted-".repeat(3);
    let refused = {
        let n = 200;
        let xs: Float64Array = (0..n).map(|_| Some(1000.0)).collect();
        let cs: StringArray = (0..n).map(|_| Some(never.as_str())).collect();
        RecordBatch::try_new(rows(0, 0).schema(), vec![Arc::new(xs), Arc::new(cs)]).unwrap()
    };
    let rt = runtime();
    let got = rt.block_on(read_ranks(&uri, 0, u64::MAX, async {
        push(&uri, 0..1).await;
        // Fill the disk (the write stops short when it is full); the refused batch is
        // more than the spool's last page has left.
        let filler = disk.join("filler");
        let _ = std::fs::write(&filler, vec![0u8; 2 << 20]);
        let e = push_batch(&uri, 1, refused).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        std::fs::remove_file(&filler).unwrap();
        for seq in 1..8 {
            push_batch(&uri, seq, rows(seq * PUSH, PUSH)).await.unwrap();
        }
        end_ingest(&uri).await;
    }));
    let log = versions(&state_dir);
    assert_eq!(log[0].2, 256, "the first version at the warmup's end");
    let first = hydrant::read_state(&state_dir.join(format!("state-{}.json", log[0].1))).unwrap();
    let (values, _) = vocab(&first);
    assert!(!values.contains(&never), "{values:?}");
    assert_eq!(values.len(), 7, "v0..v6: {values:?}");
    let mean = (0..256).map(x).sum::<f64>() / 256.0;
    assert!(
        (mean_std(&first).0 - mean).abs() < 1e-9,
        "{:?}",
        mean_std(&first)
    );
    every_row_of_400_once(&got);
}
