//! Durable pushed input against the real server: acknowledged batches survive SIGKILL,
//! producers' retries are known as duplicates, and trainers' commits trim the spool and
//! say where a restarted server resumes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow_flight::Ticket;
use arrow_flight::flight_service_client::FlightServiceClient;
use futures::{StreamExt, TryStreamExt};

mod common;
use common::pushed::{
    batch, end_ingest, flight_client, keep_steps, produced, push_all, read_steps, runtime,
    spool_first_rows, spool_segments, start_with, ticket,
};

/// The acknowledgement of a push of 50 rows by `origin` (`(producer, seq)`).
async fn ack(
    client: &mut FlightServiceClient<tonic::transport::Channel>,
    origin: (&str, u64),
) -> serde_json::Value {
    let messages = produced(batch(50), Some(origin)).await;
    let response = client
        .do_put(futures::stream::iter(messages))
        .await
        .unwrap();
    let acks: Vec<arrow_flight::PutResult> = response.into_inner().try_collect().await.unwrap();
    serde_json::from_slice(&acks[0].app_metadata).unwrap()
}

/// The continuous-training issue's finding: a server killed after acknowledging pushed rows
/// had lost some. With `--state-dir`, every acknowledged batch is delivered after a
/// SIGKILL and a restart, in the same steps: the trainer resumes at its last step + 1 and
/// sees every row once; a producer's retries of acknowledged batches are acknowledged as
/// duplicates, not admitted twice.
#[test]
fn acknowledged_pushes_survive_a_killed_server_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let args = ["--state-dir".as_ref(), spool.as_os_str()];
    let rt = runtime();
    let connect = |uri: String| async move {
        let channel = tonic::transport::Channel::from_shared(uri)
            .unwrap()
            .connect()
            .await
            .unwrap();
        FlightServiceClient::new(channel)
    };
    // (step, real row ids) of each step read from `start`, at most `steps` of them.
    let read = |uri: String, start: u64, steps: usize| async move {
        let ticket =
            format!(r#"{{"pipeline":"pushed","rank":0,"world_size":1,"start_step":{start}}}"#);
        let s = connect(uri)
            .await
            .do_get(Ticket::new(ticket))
            .await
            .unwrap();
        let data = s
            .into_inner()
            .map_err(arrow_flight::error::FlightError::from);
        let mut batches = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(data);
        let mut got = Vec::new();
        while got.len() < steps {
            let Some(b) = batches.next().await else { break };
            let b = b.unwrap();
            if b.num_rows() == 0 {
                continue; // the end marker
            }
            let ids = b.column_by_name("row_id").unwrap();
            let ids = ids
                .as_any()
                .downcast_ref::<arrow::array::UInt64Array>()
                .unwrap();
            let pad = b.column_by_name("is_padding").unwrap();
            let pad = pad
                .as_any()
                .downcast_ref::<arrow::array::BooleanArray>()
                .unwrap();
            got.push(
                (0..ids.len())
                    .filter(|&i| !pad.value(i))
                    .map(|i| ids.value(i))
                    .collect::<Vec<_>>(),
            );
        }
        got
    };
    let (mut server, uri) = start_with(dir.path(), &args);
    let first = rt.block_on(async {
        let reader = tokio::spawn(read(uri.clone(), 0, 3));
        let mut client = connect(uri.clone()).await;
        for seq in 0..6 {
            assert_eq!(ack(&mut client, ("p", seq)).await["rows"], 50);
        }
        reader.await.unwrap()
    });
    assert_eq!(first.len(), 3);
    let _ = server.0.kill(); // SIGKILL: 300 rows acknowledged, 192 delivered
    let _ = server.0.wait();
    let (_server, uri) = start_with(dir.path(), &args);
    let rest = rt.block_on(async {
        let mut client = connect(uri.clone()).await;
        let reader = tokio::spawn(read(uri.clone(), 3, usize::MAX));
        // The producer never saw the last two acknowledgements, say: it sends them again.
        for (seq, duplicate) in [(4, true), (5, true), (6, false), (7, false)] {
            let ack = ack(&mut client, ("p", seq)).await;
            assert_eq!(ack.get("duplicate").is_some(), duplicate, "seq {seq}");
        }
        end_ingest(&uri).await;
        let status = arrow_flight::Action::new("status", "");
        let status: Vec<_> = client
            .do_action(status)
            .await
            .unwrap()
            .into_inner()
            .try_collect()
            .await
            .unwrap();
        let status: serde_json::Value = serde_json::from_slice(&status[0].body).unwrap();
        let pushed = &status["pipelines"][0]["pushed"];
        assert_eq!(pushed["duplicates"], 2, "{pushed}");
        assert_eq!(pushed["replayed_records"], 6, "{pushed}");
        assert_eq!(pushed["durable"], true, "{pushed}");
        reader.await.unwrap()
    });
    let mut ids: Vec<u64> = first.into_iter().chain(rest).flatten().collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..400).collect::<Vec<_>>(),
        "every acknowledged row once"
    );
}

/// The pushed pipeline spooled to `spool` in 1 MiB segments, shuffled in windows of 1,000
/// rows, which do not line up with its 64-row steps.
fn serve_spooled(
    dir: &std::path::Path,
    spool: &std::path::Path,
    workers: usize,
) -> (common::Server, String) {
    let args: Vec<std::ffi::OsString> = vec![
        "--workers".into(),
        workers.to_string().into(),
        "--state-dir".into(),
        spool.into(),
        "--spool-segment-mib".into(),
        "1".into(),
        "--shuffle".into(),
        "--shuffle-window".into(),
        "1000".into(),
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    start_with(dir, &args)
}

/// A trainer commits its checkpoint's step: the spool's segments wholly before the rows
/// that step needs are deleted, and a server SIGKILLed and restarted delivers from the
/// committed step on — bit for bit the steps an uninterrupted server delivers — while a
/// producer's retries of batches in deleted segments are still known as duplicates. A
/// commit of a step the killed server had delivered, sent as the new one starts, waits
/// for the replay to reach it and is taken.
#[test]
fn a_commit_trims_the_spool_and_a_restarted_server_resumes_there_exactly() {
    const ROWS: usize = 20_000; // ~0.5 MiB spooled per batch, ~3 per 1 MiB segment
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let with = |spool: &std::path::Path| serve_spooled(dir.path(), spool, 1);
    let (whole, resumed) = rt.block_on(async {
        // The uninterrupted stream: 2 batches of producer q, 10 of p, then the end.
        let (_reference, uri) = with(&dir.path().join("reference"));
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read_steps(&uri, 0, usize::MAX).await }
        });
        assert!(push_all(&uri, "q", 0..2, ROWS).await.is_empty());
        assert!(push_all(&uri, "p", 0..10, ROWS).await.is_empty());
        end_ingest(&uri).await;
        let whole = reader.await.unwrap();

        // q's and 8 of p's batches (3,125 steps) to a server killed after a commit at
        // 1,500.
        let spool = dir.path().join("spool");
        let (mut server, uri) = with(&spool);
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read_steps(&uri, 0, 3125).await }
        });
        assert!(push_all(&uri, "q", 0..2, ROWS).await.is_empty());
        assert!(push_all(&uri, "p", 0..8, ROWS).await.is_empty());
        assert_eq!(reader.await.unwrap().len(), 3125);
        let before = spool_segments(&spool);
        assert!(before >= 3, "{before} segments");
        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
        let err = client.commit("pushed", 3126).await.unwrap_err().to_string();
        assert!(err.contains("not delivered yet"), "{err}");
        let reply = client.commit("pushed", 1500).await.unwrap();
        assert_eq!(reply["committed"], 1500, "{reply}");
        // Step 1500 starts at row 96,000, the start of its window: the segments that
        // end at or before it go, and the oldest one left holds it.
        let left = spool_first_rows(&spool);
        assert_eq!(reply["deleted_segments"], before - left.len(), "{reply}");
        assert!(
            left.len() < before && left[0] <= 96_000 && left[1] > 96_000,
            "{left:?}"
        );
        // An older step changes nothing.
        assert_eq!(
            client.commit("pushed", 10).await.unwrap()["committed"],
            1500
        );
        let _ = server.0.kill();
        let _ = server.0.wait();

        let (_server, uri) = with(&spool);
        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
        // A trainer that checkpointed at step 3000 (it had steps up to 3124) commits it at
        // once: the restarted server has given no rank a step yet, and the commit waits
        // for the steps from the spool rather than be refused.
        let late = tokio::spawn({
            let uri = uri.clone();
            async move {
                let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
                client
                    .commit("pushed", 3000)
                    .await
                    .map_err(|e| e.to_string())
            }
        });
        // Steps before the commit are gone; the trainer resumes at it.
        let err = match client.steps(&ticket(1499)).await {
            Err(e) => e.to_string(),
            Ok(mut s) => s.next_step().await.unwrap().unwrap_err().to_string(),
        };
        assert!(err.contains("no longer held"), "{err}");
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read_steps(&uri, 1500, usize::MAX).await }
        });
        let reply = late.await.unwrap().unwrap();
        assert_eq!(reply["committed"], 3000, "{reply}");
        // The producers retry everything from their first batch: those acknowledged are
        // duplicates, also q's, whose segments were all deleted.
        assert_eq!(push_all(&uri, "q", 0..2, ROWS).await, [0, 1]);
        assert_eq!(
            push_all(&uri, "p", 0..10, ROWS).await,
            (0..8).collect::<Vec<_>>()
        );
        let status = client.status().await.unwrap();
        let pushed = &status["pipelines"][0]["pushed"];
        assert_eq!(pushed["committed_step"], 3000, "{pushed}");
        end_ingest(&uri).await;
        (whole, reader.await.unwrap())
    });
    assert_eq!(whole.len(), 3750);
    let want = &whole[1500..];
    assert_eq!(resumed.len(), want.len());
    for (got, want) in resumed.iter().zip(want) {
        assert_eq!(got.meta.step, want.meta.step);
        assert_eq!(got.batch, want.batch, "step {}", want.meta.step);
    }
}

/// The trainer of the kill -9 test: reads from `start`, keeps each step it gets in `got`
/// (a step got twice must be the same), and commits every 100 steps, until the stream
/// ends (`true`) or breaks.
async fn train(uri: String, start: u64, got: Arc<Mutex<BTreeMap<u64, RecordBatch>>>) -> bool {
    let Ok(mut client) = hydrant_flight::Client::connect(&uri).await else {
        return false;
    };
    let Ok(steps) = client.steps(&ticket(start)).await else {
        return false;
    };
    let committer = hydrant_flight::Client::connect(&uri).await.ok();
    keep_steps(steps, &got, committer.map(|c| (c, "pushed", 100))).await
}

/// The producer of the kill -9 test: pushes batches `next..batches`, advancing `next` on
/// each acknowledgement, until done (`true`) or the server goes.
async fn produce(uri: String, next: Arc<AtomicU64>, batches: u64, rows: usize) -> bool {
    let Ok(channel) = tonic::transport::Channel::from_shared(uri)
        .unwrap()
        .connect()
        .await
    else {
        return false;
    };
    let mut client = FlightServiceClient::new(channel);
    while next.load(Ordering::SeqCst) < batches {
        let seq = next.load(Ordering::SeqCst);
        let messages = produced(batch(rows), Some(("p", seq))).await;
        let Ok(response) = client.do_put(futures::stream::iter(messages)).await else {
            return false;
        };
        match response.into_inner().try_collect::<Vec<_>>().await {
            Ok(acks) if acks.len() == 1 => next.store(seq + 1, Ordering::SeqCst),
            _ => return false,
        }
    }
    true
}

/// The continuous-training issue's crash test: a producer pushes while a trainer reads
/// and commits every 100 steps, and the server is SIGKILLed at 10 random moments (during
/// DoPut, mid-step, around commits and during the replay after a restart), each time
/// restarted on the same state directory; the producer retries from its first
/// unacknowledged batch and the trainer resumes at its last step + 1. Every step the
/// trainer got is bit for bit the step an uninterrupted server delivers, and it got every
/// one: each acknowledged row admitted once, each admitted row delivered once.
#[test]
fn kill_9_at_random_moments_loses_and_duplicates_nothing() {
    const ROWS: usize = 2_000;
    const BATCHES: u64 = 100; // 200,000 rows: 3,125 steps of 64
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    // The reference on one worker; the killed servers come back on 1 to 3 (the pushed
    // rows' dataflow places and assembles alike on any number).
    let with = |spool: &std::path::Path, workers| serve_spooled(dir.path(), spool, workers);
    let reference = rt.block_on(async {
        let (_server, uri) = with(&dir.path().join("reference"), 1);
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read_steps(&uri, 0, usize::MAX).await }
        });
        assert!(push_all(&uri, "p", 0..BATCHES, ROWS).await.is_empty());
        end_ingest(&uri).await;
        reader.await.unwrap()
    });
    assert_eq!(reference.len(), 3125);

    let spool = dir.path().join("spool");
    let got: Arc<Mutex<BTreeMap<u64, RecordBatch>>> = Arc::default();
    let next = Arc::new(AtomicU64::new(0));
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    for kill in 0..10 {
        let (mut server, uri) = with(&spool, 1 + kill % 3);
        let resume = got.lock().unwrap().keys().last().map_or(0, |s| s + 1);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // The kill comes 1 to 8 acknowledgements in, and up to 5 ms later: mid-DoPut,
        // mid-step, or during the replay of the spool.
        let target = next.load(Ordering::SeqCst) + 1 + rng % 8;
        let after = std::time::Duration::from_millis(rng % 5);
        rt.block_on(async {
            let trainer = tokio::spawn(train(uri.clone(), resume, got.clone()));
            let producer = tokio::spawn(produce(uri, next.clone(), BATCHES, ROWS));
            let waited = std::time::Instant::now();
            while next.load(Ordering::SeqCst) < target && waited.elapsed().as_secs() < 5 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            tokio::time::sleep(after).await;
            let _ = server.0.kill();
            let _ = server.0.wait();
            // Neither finished: the stream has no end until end_ingest.
            assert!(!trainer.await.unwrap());
            producer.await.unwrap();
        });
    }
    let (killed_at_step, killed_at_batch) =
        (got.lock().unwrap().len(), next.load(Ordering::SeqCst));
    assert!(
        killed_at_step > 0 && killed_at_batch < BATCHES,
        "the kills came while rows moved: {killed_at_step} steps, {killed_at_batch} batches"
    );
    let (_server, uri) = with(&spool, 2);
    rt.block_on(async {
        let resume = got.lock().unwrap().keys().last().map_or(0, |s| s + 1);
        // The restarted server starts from the trainer's last commit.
        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
        let status = client.status().await.unwrap();
        let committed = status["pipelines"][0]["pushed"]["committed_step"].as_u64();
        assert!(
            committed.is_some_and(|c| c >= 100 && c <= resume),
            "{status}"
        );
        let trainer = tokio::spawn(train(uri.clone(), resume, got.clone()));
        assert!(produce(uri.clone(), next.clone(), BATCHES, ROWS).await);
        end_ingest(&uri).await;
        assert!(trainer.await.unwrap(), "the stream ends");
    });
    let got = got.lock().unwrap();
    assert_eq!(got.len(), reference.len(), "every step");
    for want in &reference {
        assert_eq!(got[&want.meta.step], want.batch, "step {}", want.meta.step);
    }
}

/// `hydrant serve` of the pushed pipeline `start_with` wrote in `dir`, with batch size `b`
/// and state directory `spool`, expected to refuse to start: its one line of error.
fn refused(dir: &std::path::Path, b: &str, spool: &std::path::Path) -> String {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hydrant"))
        .args(["serve", "--listen", "127.0.0.1:0", "--batch-size", b])
        .arg("--pipeline")
        .arg(dir.join("pushed.toml"))
        .arg("--state")
        .arg(dir.join("state.json"))
        .arg("--state-dir")
        .arg(spool)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(10) {
            let _ = child.kill();
            panic!("a server on {} started", spool.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!child.wait().unwrap().success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    err
}

/// A state directory is one server's at a time (a second one, started twice or while the
/// first is still going away, would append to the same spool and cut the first one's
/// records as torn), and keeps the steps it was cut into: a server restarted with another
/// batch size redelivered rows a trainer resuming at its last step + 1 had read.
#[test]
fn a_state_directory_is_one_servers_and_keeps_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let (server, _uri) = start_with(dir.path(), &["--state-dir".as_ref(), spool.as_os_str()]);
    let err = refused(dir.path(), "64", &spool);
    let holder = format!("in use by another server (process {})", server.0.id());
    assert!(err.contains(&holder), "{err}");
    drop(server);
    let err = refused(dir.path(), "32", &spool);
    assert!(
        err.contains("stream.json") && err.contains("--batch-size was 64, is 32"),
        "{err}"
    );
    let (_server, _uri) = start_with(dir.path(), &["--state-dir".as_ref(), spool.as_os_str()]);
}

/// A spool segment lost while the restarted server admits the spool again (here, the
/// last one deleted while the replay waits for a trainer): the server delivers every step
/// the rows before it complete, then ends the trainer's stream with FAILED_PRECONDITION
/// naming the segment as `--state-dir/…`, not by the server's path. (The run used to be
/// stopped at once, dropping steps it held.)
#[test]
fn a_lost_spool_segment_fails_the_stream_after_what_came_before_it() {
    const ROWS: usize = 20_000; // ~0.5 MiB spooled per batch, ~3 per 1 MiB segment
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let rt = runtime();
    {
        let (_server, uri) = serve_spooled(dir.path(), &spool, 1);
        rt.block_on(async {
            // Pushes wait for a trainer's reads (the queues are bounded).
            let reader = tokio::spawn({
                let uri = uri.clone();
                async move { read_steps(&uri, 0, usize::MAX).await }
            });
            assert!(push_all(&uri, "p", 0..8, ROWS).await.is_empty());
            end_ingest(&uri).await;
            reader.await.unwrap();
        });
    }
    let first_rows = spool_first_rows(&spool);
    assert!(first_rows.len() >= 3, "{first_rows:?}");
    let lost = *first_rows.last().unwrap();

    // The replay admits the first batch and waits there for a trainer.
    let (_server, uri) = serve_spooled(dir.path(), &spool, 1);
    std::fs::remove_file(spool.join(format!("pushed-{lost:020}.spool"))).unwrap();
    rt.block_on(async {
        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
        let mut stream = client.steps(&ticket(0)).await.unwrap();
        let mut rows = 0;
        let ended = loop {
            let next = tokio::time::timeout(std::time::Duration::from_secs(60), stream.next_step());
            match next.await.expect("the stream ends, not waits") {
                Some(Ok(step)) => rows += step.batch.num_rows() as u64,
                other => break format!("{other:?}"),
            }
        };
        // Every step of the rows before the lost segment: shuffled in windows of 1,000
        // rows, the steps of its last whole window.
        assert_eq!(rows, lost - lost % 1_000, "{ended}");
        assert!(ended.contains("FailedPrecondition"), "{ended}");
        let named = format!("--state-dir/pushed-{lost:020}.spool");
        assert!(ended.contains(&named), "{ended}");
        assert!(!ended.contains(&*dir.path().to_string_lossy()), "{ended}");
    });
}

/// Found by a hostile run: the newest spool segment cut short at a record boundary (or
/// emptied) after a commit was taken without a word: its acknowledged rows were never
/// delivered, and producers' retries of them were acknowledged as duplicates, so they
/// could not be pushed again. The commit records the rows admitted when it was made;
/// a replay that ends before them fails the input, and the retry is refused saying so.
#[test]
fn a_newest_segment_cut_short_after_a_commit_is_refused_not_taken_as_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let rt = runtime();
    eight_batches_committed_at_10(&rt, dir.path(), &spool);
    empty_the_newest_segment(&spool);
    refused_after_the_cut(&rt, dir.path(), &spool, 10);
}

/// Found by a review: a commit made while a restarted server replayed its spool recorded
/// only the rows replayed so far as admitted, so a segment cut short after it went
/// unnoticed; and a commit after the input failed recorded the shorter spool as whole.
/// Now a commit records no fewer rows than the one before it, and a failed input takes no
/// commit.
#[test]
fn a_commit_during_the_replay_keeps_the_rows_admitted_before_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let rt = runtime();
    eight_batches_committed_at_10(&rt, dir.path(), &spool);
    {
        let (_server, uri) = serve_spooled(dir.path(), &spool, 1);
        rt.block_on(async {
            let steps = read_steps(&uri, 10, 15).await;
            assert_eq!(steps.len(), 15);
            let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
            let reply = client.commit("pushed", 20).await.unwrap();
            assert_eq!(reply["committed"], 20, "{reply}");
        });
    }
    let commit = commit_json(&spool);
    assert_eq!(commit["step"], 20, "{commit}");
    assert_eq!(commit["rows_in"], 160_000, "{commit}");
    empty_the_newest_segment(&spool);
    refused_after_the_cut(&rt, dir.path(), &spool, 20);
}

/// Rows per pushed batch of the cut-short tests: ~0.5 MiB spooled each, ~3 per 1 MiB
/// segment.
const CUT_ROWS: usize = 20_000;

/// Eight batches of `CUT_ROWS` pushed by producer `p` to a spooled server, whose trainer
/// commits step 10.
fn eight_batches_committed_at_10(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    spool: &std::path::Path,
) {
    let (_server, uri) = serve_spooled(dir, spool, 1);
    rt.block_on(async {
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read_steps(&uri, 0, usize::MAX).await }
        });
        assert!(push_all(&uri, "p", 0..8, CUT_ROWS).await.is_empty());
        commit_once_delivered(&uri, 10).await;
        reader.abort();
    });
}

/// Commits `step` once every rank has been given it (within 30 s); the reply.
async fn commit_once_delivered(uri: &str, step: u64) -> serde_json::Value {
    let mut client = hydrant_flight::Client::connect(uri).await.unwrap();
    let started = std::time::Instant::now();
    loop {
        match client.commit("pushed", step).await {
            Ok(reply) => return reply,
            Err(e) => assert!(started.elapsed().as_secs() < 30, "{e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The spool's `commit.json`.
fn commit_json(spool: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(spool.join("commit.json")).unwrap()).unwrap()
}

/// Empties the spool's newest segment, as a lost write or a careless copy might.
fn empty_the_newest_segment(spool: &std::path::Path) {
    let newest = *spool_first_rows(spool).last().unwrap();
    assert!(newest > 10_000, "{newest}");
    let path = spool.join(format!("pushed-{newest:020}.spool"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
}

/// A server restarted on the spool of `eight_batches_committed_at_10` with its newest
/// segment emptied, read from the last commit's step `committed`: the retry of the last
/// batch and a commit are both refused, naming the missing rows.
fn refused_after_the_cut(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    spool: &std::path::Path,
    committed: u64,
) {
    const ROWS: usize = CUT_ROWS;
    let (_server, uri) = serve_spooled(dir, spool, 1);
    rt.block_on(async {
        // The replay, which pushes wait for, waits for a trainer to read (whose stream
        // then ends with the input's failure).
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move {
                let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
                let mut stream = client.steps(&ticket(committed)).await.unwrap();
                while let Some(Ok(_)) = stream.next_step().await {}
            }
        });
        let mut client = flight_client(&uri).await;
        // The last batch again, as after a lost acknowledgement.
        let messages = produced(batch(ROWS), Some(("p", 7))).await;
        let retried = async {
            let response = client.do_put(futures::stream::iter(messages)).await?;
            response.into_inner().try_collect::<Vec<_>>().await
        };
        let err = retried.await.expect_err("a lost batch was acknowledged");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
        assert!(
            err.message().contains("acknowledged rows are missing")
                && err.message().contains("160000 had been admitted"),
            "{err}"
        );
        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
        let err = client.commit("pushed", committed + 1).await;
        let err = err.unwrap_err().to_string();
        assert!(err.contains("the input failed"), "{err}");
        reader.abort();
    });
}

/// A push that cannot be spooled because the state directory's disk is full is refused
/// with RESOURCE_EXHAUSTED, naming the spool within `--state-dir`, not by the server's
/// path; nothing of it is taken, and the same push (same sequence number) is taken once
/// there is room: every row once. Needs a tmpfs to fill, so root.
#[test]
fn a_push_refused_for_a_full_disk_is_taken_when_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    let Some(_mounted) = common::small_tmpfs(&disk) else {
        return;
    };
    let spool = disk.join("s");
    let args = ["--state-dir".as_ref(), spool.as_os_str()];
    let (_server, uri) = start_with(dir.path(), &args);
    let filler = disk.join("filler");
    let rt = runtime();
    let steps = rt.block_on(async {
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { common::pushed::read_steps(&uri, 0, usize::MAX).await }
        });
        let mut client = flight_client(&uri).await;
        assert_eq!(ack(&mut client, ("p", 0)).await["rows"], 50);
        // Fill the disk (the write stops short when it is full).
        let _ = std::fs::write(&filler, vec![0u8; 2 << 20]);
        // Larger than what the segment's last page has left.
        let messages = produced(batch(20_000), Some(("p", 1))).await;
        let refused = match client.do_put(futures::stream::iter(messages)).await {
            Ok(acks) => acks
                .into_inner()
                .try_collect::<Vec<_>>()
                .await
                .expect_err("a push onto a full disk was acknowledged"),
            Err(status) => status,
        };
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
        let said = refused.message();
        assert!(
            said.contains("--state-dir/pushed-") && !said.contains(dir.path().to_str().unwrap()),
            "{said}"
        );
        std::fs::remove_file(&filler).unwrap();
        let again = push_all(&uri, "p", 1..2, 20_000).await;
        assert_eq!(
            again,
            Vec::<u64>::new(),
            "the retry was taken for a duplicate"
        );
        end_ingest(&uri).await;
        reader.await.unwrap()
    });
    let mut ids: Vec<u64> = steps
        .iter()
        .flat_map(|s| common::real_row_ids(&s.batch))
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..20_050).collect::<Vec<_>>());
}

/// Found by a hostile run: the trainers' resume step after an ended input's padded last
/// step starts past every row admitted, and its commit recorded that row as admitted, so
/// every restart refused the state directory ("acknowledged rows are missing"). Now such a
/// commit records the rows admitted, and a restart serves the ended stream: a resume at
/// the committed step ends at once, and nothing more is taken.
#[test]
fn a_commit_of_the_step_after_a_padded_end_restarts_as_ended() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let rt = runtime();
    // In order: step 5 starts at row 320 (a shuffled step starts at its window's start).
    let serve = || start_with(dir.path(), &["--state-dir".as_ref(), spool.as_os_str()]);
    // 3 batches of 100 rows: 5 steps of 64, the last padded.
    {
        let (_server, uri) = serve();
        rt.block_on(async {
            let reader = tokio::spawn({
                let uri = uri.clone();
                async move { read_steps(&uri, 0, usize::MAX).await }
            });
            assert!(push_all(&uri, "p", 0..3, 100).await.is_empty());
            end_ingest(&uri).await;
            let steps = reader.await.unwrap();
            assert_eq!(steps.len(), 5);
            assert!(steps[4].meta.padded_rows > 0, "{:?}", steps[4].meta);
            let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
            let reply = client.commit("pushed", 5).await.unwrap();
            assert_eq!(reply["committed"], 5, "{reply}");
        });
    }
    let commit = commit_json(&spool);
    assert_eq!(commit["rows_in"], 300, "{commit}");
    let (_server, uri) = serve();
    rt.block_on(async {
        let rest = read_steps(&uri, 5, usize::MAX).await;
        assert!(rest.iter().all(|s| s.batch.num_rows() == 0), "{rest:?}");
        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
        let status = client.status().await.unwrap();
        let pushed = &status["pipelines"][0]["pushed"];
        assert!(pushed["replay_failed"].is_null(), "{pushed}");
        assert_eq!(pushed["ended"], true, "{pushed}");
        assert_eq!(pushed["committed_step"], 5, "{pushed}");
        // The producer's retries are duplicates; the input takes nothing new.
        assert_eq!(push_all(&uri, "p", 0..3, 100).await, [0, 1, 2]);
    });
}

/// Found by a hostile run: after a commit deleted spool segments and the server was
/// restarted, admission numbers (an ack's `seq`) began again from the oldest batch the
/// spool still held (18, 19, 20 after 39). They go on from the last commit's count now.
#[test]
fn admission_numbers_go_on_after_a_commit_deleted_segments_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let rt = runtime();
    {
        let (mut server, uri) = serve_spooled(dir.path(), &spool, 1);
        rt.block_on(async {
            let reader = tokio::spawn({
                let uri = uri.clone();
                async move { read_steps(&uri, 0, 2000).await }
            });
            // 160,000 rows in ~3 segments; step 2000 needs rows from ~128,000 on.
            assert!(push_all(&uri, "p", 0..8, CUT_ROWS).await.is_empty());
            assert_eq!(reader.await.unwrap().len(), 2000);
            let reply = commit_once_delivered(&uri, 2000).await;
            assert!(reply["deleted_segments"].as_u64().unwrap() > 0, "{reply}");
        });
        let _ = server.0.kill();
        let _ = server.0.wait();
    }
    let (_server, uri) = serve_spooled(dir.path(), &spool, 1);
    rt.block_on(async {
        // The replay, which pushes wait for, waits for a trainer to read.
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read_steps(&uri, 2000, usize::MAX).await }
        });
        let mut client = flight_client(&uri).await;
        let acked = ack(&mut client, ("q", 0)).await;
        assert_eq!(acked["seq"], 8, "{acked}");
        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
        let status = client.status().await.unwrap();
        assert_eq!(
            status["pipelines"][0]["pushed"]["batches_in"], 9,
            "{status}"
        );
        reader.abort();
    });
}
