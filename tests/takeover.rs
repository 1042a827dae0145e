//! A real `hydrant serve` read by hostile and careless trainers over loopback: reconnects
//! to old steps and back, stale readers beside live ones, many epochs. Every row arrives
//! exactly once per epoch, a superseded stream ends ABORTED, and memory stays flat.

use std::collections::BTreeMap;

use arrow::array::AsArray;
use arrow::datatypes::UInt64Type;
use hydrant_flight::{Client, ClientError, StepBatch, Ticket};

mod common;
use common::*;

/// The real (not padding) row ids of a step.
fn real_ids(b: &StepBatch) -> Vec<u64> {
    let ids = b.batch.column_by_name("row_id").unwrap();
    let ids = ids.as_primitive::<UInt64Type>();
    let pad = b.batch.column_by_name("is_padding").unwrap();
    let pad = pad.as_boolean();
    (0..ids.len())
        .filter(|&i| !pad.value(i))
        .map(|i| ids.value(i))
        .collect()
}

fn ticket(world: u32, rank: u32, epoch: u64, start_step: u64) -> Ticket {
    Ticket {
        pipeline: "criteo".into(),
        epoch,
        rank,
        world_size: world,
        start_step,
        job: None,
    }
}

/// The longest a reader waits for a step before the test fails.
const STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// A trainer's record: the row ids of each step it finished, in the order it got them.
type Record = Vec<(u64, Vec<u64>)>;

/// Reads `rank` from `start_step` until the end or an error, at most `limit` steps.
async fn read(
    uri: &str,
    t: Ticket,
    limit: usize,
    record: &mut Record,
) -> Result<bool, ClientError> {
    read_paced(uri, t, limit, record, Pace::default()).await
}

/// How a trainer reads: a pause after each step, and a signal once it has read a few,
/// after which it waits for `resume`, if given, before it reads on.
#[derive(Default)]
struct Pace {
    step: std::time::Duration,
    started: Option<tokio::sync::oneshot::Sender<()>>,
    resume: Option<tokio::sync::oneshot::Receiver<()>>,
}

async fn read_paced(
    uri: &str,
    t: Ticket,
    limit: usize,
    record: &mut Record,
    mut pace: Pace,
) -> Result<bool, ClientError> {
    let mut client = match pace.resume {
        // A trainer that waits mid-epoch takes HTTP/2's default 64 KiB window: with the
        // 16 MiB of [`Client::connect`], the server could send it the rest of a small epoch
        // while it waits, and it would finish without the server.
        Some(_) => {
            let endpoint = uri.replacen("grpc://", "http://", 1);
            let endpoint = tonic::transport::Endpoint::from_shared(endpoint).unwrap();
            Client::from_channel(endpoint.connect().await.unwrap())
        }
        None => Client::connect(uri).await?,
    };
    let mut steps = client.steps(&t).await?;
    for _ in 0..limit {
        // A hang is a failure here, not a CI timeout.
        let next = tokio::time::timeout(STALL, steps.next_step())
            .await
            .unwrap_or_else(|_| panic!("rank {} got no step within {STALL:?}", t.rank));
        match next {
            Some(Ok(b)) => {
                let last = b.meta.last;
                record.push((b.meta.step, real_ids(&b)));
                if record.len() >= 3
                    && let Some(started) = pace.started.take()
                {
                    let _ = started.send(());
                    if let Some(resume) = pace.resume.take() {
                        let _ = resume.await;
                    }
                }
                tokio::time::sleep(pace.step).await;
                if last {
                    return Ok(true);
                }
            }
            Some(Err(e)) => return Err(e),
            None => return Ok(true),
        }
    }
    Ok(false)
}

/// Reads `rank` to the end of `epoch`, reconnecting at last + 1 after any error.
/// A zombie reader: a plain gRPC client (HTTP/2's default 64 KiB window, where
/// [`Client`] opens 16 MiB) that takes a message every 10 ms until its stream ends, and
/// says how many it took. With a window that holds a whole small epoch, its stream could
/// be sent to the end before the trainer it superseded came back (a race the test lost
/// now and then); with this one the server sends only as fast as it reads.
///
/// Once its DoGet is answered (the server has made it the rank's reader), it says so on
/// `attached` and takes nothing until `go` fires: so it is the rank's reader before the
/// trainer can finish, and it cannot finish before the trainer has come back. (With pacing
/// alone, a trainer in CI had the rest of its epoch in its 16 MiB window when its zombie
/// came, finished without the server, and the zombie, then the rank's only reader, was
/// served the whole epoch.)
async fn zombie(
    uri: &str,
    t: Ticket,
    attached: tokio::sync::oneshot::Sender<()>,
    go: impl std::future::Future<Output = ()>,
) -> (usize, Result<(), tonic::Status>) {
    use arrow_flight::flight_service_client::FlightServiceClient;
    use futures::StreamExt;

    let endpoint = uri.replacen("grpc://", "http://", 1);
    let channel = tonic::transport::Endpoint::from_shared(endpoint).unwrap();
    let mut client = FlightServiceClient::new(channel.connect().await.unwrap());
    let ticket = arrow_flight::Ticket::new(t.to_bytes());
    let mut stream = match client.do_get(ticket).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return (0, Err(status)),
    };
    let _ = attached.send(());
    go.await;
    let mut messages = 0;
    loop {
        let next = tokio::time::timeout(STALL, stream.next()).await;
        match next.unwrap_or_else(|_| panic!("a zombie got no message within {STALL:?}")) {
            Some(Ok(_)) => messages += 1,
            Some(Err(status)) => return (messages, Err(status)),
            None => return (messages, Ok(())),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

async fn trainer(uri: String, world: u32, rank: u32, epoch: u64) -> (Record, Vec<String>) {
    paced_trainer(uri, world, rank, epoch, Pace::default()).await
}

async fn paced_trainer(
    uri: String,
    world: u32,
    rank: u32,
    epoch: u64,
    mut pace: Pace,
) -> (Record, Vec<String>) {
    let (mut record, mut errors) = (Record::new(), Vec::new());
    loop {
        let next = record.last().map_or(0, |(s, _)| s + 1);
        let t = ticket(world, rank, epoch, next);
        let this = Pace {
            step: pace.step,
            started: pace.started.take(),
            resume: pace.resume.take(),
        };
        match read_paced(&uri, t, usize::MAX, &mut record, this).await {
            Ok(_) => return (record, errors),
            Err(e) => errors.push(e.to_string()),
        }
        assert!(errors.len() < 50, "rank {rank} keeps failing: {errors:?}");
    }
}

/// Checks that the ranks' records hold steps 0..n once each, in order, and every row of
/// `rows` once across ranks.
fn assert_exactly_once(records: &BTreeMap<u32, Record>, rows: u64) {
    let n = records.values().next().unwrap().len() as u64;
    let mut ids = Vec::new();
    for (rank, record) in records {
        let steps: Vec<u64> = record.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            steps,
            (0..n).collect::<Vec<_>>(),
            "rank {rank}'s steps, equal for every rank"
        );
        ids.extend(record.iter().flat_map(|(_, ids)| ids.iter().copied()));
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..rows).collect::<Vec<_>>(), "every row once");
}

/// Reads rank 0 from `start` to the end after the steps in `first`, waits for rank 1's
/// trainer `other`, and checks that the epoch of `rows` rows came once, in equal steps.
async fn finish_rank_0(
    uri: &str,
    mut first: Record,
    start: u64,
    other: tokio::task::JoinHandle<(Record, Vec<String>)>,
    rows: u64,
) {
    let mut rest = Record::new();
    assert!(
        read(uri, ticket(2, 0, 0, start), usize::MAX, &mut rest)
            .await
            .unwrap()
    );
    first.extend(rest);
    let (record, errors) = other.await.unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_exactly_once(&BTreeMap::from([(0, first), (1, record)]), rows);
}

/// The server's resident memory once the epoch's runs have been let go: the least of a
/// few samples over 200 ms (what it holds, not what is in flight).
async fn settled_rss_kib(pid: u32) -> u64 {
    let mut least = u64::MAX;
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        least = least.min(server_rss_kib(pid));
    }
    least
}

fn server_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Finding 2 of the serving issue: rank 0 read 0–39, reconnected at step 5 (older than the
/// replay buffer, so a run of its own serves it), then at 40 = last + 1. It used to get
/// 40–41 and a clean end; now it gets every step to the end, and rank 1 is not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn going_back_to_an_old_step_and_forward_again_loses_nothing() {
    const ROWS: u64 = 200_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 3);
    let (_server, uri) = serve_criteo(
        &data,
        &state,
        &["--ranks", "2", "--batch-size", "1024", "--replay-mib", "1"],
    );
    let other = tokio::spawn(trainer(uri.clone(), 2, 1, 0));
    let mut first = Record::new();
    assert!(
        !read(&uri, ticket(2, 0, 0, 0), 40, &mut first)
            .await
            .unwrap()
    );
    let mut again = Record::new();
    read(&uri, ticket(2, 0, 0, 5), 4, &mut again).await.unwrap();
    assert_eq!(
        again.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [5, 6, 7, 8]
    );
    assert_eq!(again[0], first[5], "step 5 again is step 5");
    finish_rank_0(&uri, first, 40, other, ROWS).await;
}

/// A rank sent back to an old step (the shared run then lets its batches go) and then
/// forward to a step the shared run had kept from before: served without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_an_old_step_then_to_one_kept_from_before_is_exact() {
    const ROWS: u64 = 200_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 6);
    let (_server, uri) = serve_criteo(
        &data,
        &state,
        &["--ranks", "2", "--batch-size", "1024", "--replay-mib", "1"],
    );
    let other = tokio::spawn(trainer(uri.clone(), 2, 1, 0));
    let mut first = Record::new();
    read(&uri, ticket(2, 0, 0, 0), 20, &mut first)
        .await
        .unwrap();
    let mut again = Record::new();
    read(&uri, ticket(2, 0, 0, 0), 3, &mut again).await.unwrap();
    assert_eq!(again[..], first[..3]);
    // Step 18 was in the shared run's replay before the rank went back.
    first.truncate(18);
    finish_rank_0(&uri, first, 18, other, ROWS).await;
}

/// After every rank finished the epoch (its run is freed), a trainer that lost its last
/// steps reconnects for them: it gets a run of its own, not a shared one that would wait on
/// ranks that are done. Past the last step, the stream just ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_after_everyone_finished_is_served_alone() {
    const ROWS: u64 = 50_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 7);
    let (_server, uri) = serve_criteo(&data, &state, &["--ranks", "2", "--batch-size", "500"]);
    let ranks: Vec<_> = (0..2)
        .map(|r| tokio::spawn(trainer(uri.clone(), 2, r, 0)))
        .collect();
    let mut records = BTreeMap::new();
    for (r, t) in ranks.into_iter().enumerate() {
        records.insert(r as u32, t.await.unwrap().0);
    }
    // It lost its last 30 steps (a shared run would fill rank 1's queue and wait).
    let steps = records[&0].len() as u64;
    let featurized = || async {
        let status = Client::connect(&uri).await.unwrap().status().await.unwrap();
        status["pipelines"][0]["rows_featurized"].as_u64().unwrap()
    };
    let before = featurized().await;
    assert_eq!(before, ROWS, "the shared run featurized each row once");
    let mut last = Record::new();
    assert!(
        read(&uri, ticket(2, 0, 0, steps - 30), usize::MAX, &mut last)
            .await
            .unwrap()
    );
    let lost = &records[&0][steps as usize - 30..];
    assert_eq!(last[..], lost[..]);
    // Its run featurized only rank 0's rows of those steps, not rank 1's beside them.
    let rows: usize = lost.iter().map(|(_, ids)| ids.len()).sum();
    assert_eq!(featurized().await - before, rows as u64);
    let mut none = Record::new();
    assert!(
        read(&uri, ticket(2, 1, 0, steps), usize::MAX, &mut none)
            .await
            .unwrap()
    );
    assert!(none.is_empty());
}

/// One rank read alone to its end, the other rank never read meanwhile (an evaluation
/// job, a trainer that has not come): the unread rank's queue filled and held the shared
/// run, so the reader hung forever. Now, after a wait, the unread rank is let go and the
/// reader finishes; the other rank, read later, catches up on a run of its own with
/// exactly its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_rank_read_alone_finishes_and_the_other_catches_up_later() {
    const ROWS: u64 = 40_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 11);
    let (_server, uri) = serve_criteo(&data, &state, &["--ranks", "2", "--batch-size", "500"]);
    let mut records = BTreeMap::new();
    for rank in 0..2 {
        let mut record = Record::new();
        assert!(
            read(&uri, ticket(2, rank, 0, 0), usize::MAX, &mut record)
                .await
                .unwrap()
        );
        records.insert(rank, record);
    }
    assert_eq!(records[&0].len(), 40, "40,000 rows in steps of 2 x 500");
    assert_exactly_once(&records, ROWS);
}

/// 8 live trainers and 8 stale readers (one per rank, from step 0, as a zombie pod would
/// start): every superseded stream ends ABORTED, the live trainers reconnect at last + 1
/// and finish the epoch exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_readers_are_aborted_and_live_trainers_finish_exactly_once() {
    const ROWS: u64 = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 4);
    let (_server, uri) = serve_criteo(
        &data,
        &state,
        &["--ranks", "8", "--batch-size", "256", "--replay-mib", "1"],
    );
    // Each stale reader starts once its rank's trainer has read 3 steps; the trainer then
    // waits until the stale reader is attached (which supersedes it), and the stale reader
    // reads only once its trainer has finished, having come back at last + 1.
    let (trainers, stale): (Vec<_>, Vec<_>) = (0..8)
        .map(|r| {
            let (started, ready) = tokio::sync::oneshot::channel();
            let (attached, resume) = tokio::sync::oneshot::channel();
            let (finished, done) = tokio::sync::oneshot::channel();
            let pace = Pace {
                step: std::time::Duration::from_millis(2),
                started: Some(started),
                resume: Some(resume),
            };
            let trainer = tokio::spawn({
                let uri = uri.clone();
                async move {
                    let ended = paced_trainer(uri, 8, r, 0, pace).await;
                    let _ = finished.send(());
                    ended
                }
            });
            let uri = uri.clone();
            let stale = tokio::spawn(async move {
                ready.await.unwrap();
                let go = async {
                    let _ = done.await;
                };
                zombie(&uri, ticket(8, r, 0, 0), attached, go).await
            });
            (trainer, stale)
        })
        .unzip();
    let mut records = BTreeMap::new();
    for (r, t) in trainers.into_iter().enumerate() {
        let (record, errors) = t.await.unwrap();
        assert!(
            !errors.is_empty()
                && errors
                    .iter()
                    .all(|e| e.contains("superseded by a newer reader")),
            "rank {r}'s trainer is superseded by its stale reader, and only that: {errors:?}"
        );
        records.insert(r as u32, record);
    }
    assert_exactly_once(&records, ROWS);
    let mut aborted = 0;
    for s in stale {
        match s.await.unwrap() {
            (_, Err(st)) if st.code() == tonic::Code::Aborted => {
                assert!(st.message().contains("superseded by a newer reader"));
                aborted += 1;
            }
            (messages, other) => panic!("a stale reader ended with {other:?} after {messages}"),
        }
    }
    assert_eq!(aborted, 8, "every stale reader was superseded");
}

/// An epoch's runs are freed once every rank has read it: RSS after 100 epochs is within
/// 10% of RSS after epoch 2, give or take 4 MiB. (The server holds ~20 MiB between epochs
/// here; its settled RSS moves by up to ±8 MiB from epoch to epoch with no trend, with
/// where the next epoch's run, made ahead, has got to, so each end is the median of 20
/// epochs: with 10, it failed once here beside the other tests, on noise alone. A run kept
/// per epoch, as before, held a whole epoch of ~6 MiB each, +600 MiB over 100.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_over_100_epochs() {
    const ROWS: u64 = 20_000;
    const EPOCHS: u64 = 100;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 5);
    let epochs = EPOCHS.to_string();
    let (server, uri) = serve_criteo(
        &data,
        &state,
        &[
            "--ranks",
            "2",
            "--batch-size",
            "1000",
            "--shuffle",
            "--epochs",
            &epochs,
        ],
    );
    let pid = server.0.id();
    // One settled figure swings by a few MiB with what the server happens to hold (the
    // other tests of this file running beside it): the median of ten at each end.
    let (mut early, mut late) = (Vec::new(), Vec::new());
    for epoch in 0..EPOCHS {
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                let uri = uri.clone();
                tokio::spawn(async move {
                    let mut record = Record::new();
                    read(&uri, ticket(2, r, epoch, 0), usize::MAX, &mut record)
                        .await
                        .unwrap();
                    record
                })
            })
            .collect();
        let mut records = BTreeMap::new();
        for (r, t) in ranks.into_iter().enumerate() {
            records.insert(r as u32, t.await.unwrap());
        }
        assert_exactly_once(&records, ROWS);
        if (1..=20).contains(&epoch) {
            early.push(settled_rss_kib(pid).await);
        } else if epoch >= EPOCHS - 20 {
            late.push(settled_rss_kib(pid).await);
        }
    }
    let median = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (after_two, after_all) = (median(&mut early), median(&mut late));
    eprintln!(
        "server RSS after epochs 2-21 {after_two} KiB (median), after {}-{EPOCHS}: \
         {after_all} KiB",
        EPOCHS - 19
    );
    assert!(
        after_all * 10 <= after_two * 11 + 4096 * 10,
        "RSS grew from {after_two} KiB to {after_all} KiB"
    );
}

/// A trainer that goes away mid-epoch, and never comes back, does not leave its run behind:
/// after `--idle-timeout` the server forgets it (its batches and threads let go), and a
/// trainer that does come back later is still served exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_run_is_forgotten_after_the_idle_timeout() {
    const ROWS: u64 = 50_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 8);
    let (_server, uri) = serve_criteo(
        &data,
        &state,
        &["--ranks", "2", "--batch-size", "500", "--idle-timeout", "1"],
    );
    let runs = || async {
        let status = Client::connect(&uri).await.unwrap().status().await.unwrap();
        status["pipelines"][0]["runs"].as_array().unwrap().len()
    };
    let mut first = Record::new();
    assert!(!read(&uri, ticket(2, 0, 0, 0), 3, &mut first).await.unwrap());
    assert_eq!(runs().await, 1);
    let deadline = std::time::Instant::now() + STALL;
    while runs().await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle run was kept"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let other = tokio::spawn(trainer(uri.clone(), 2, 1, 0));
    finish_rank_0(&uri, first, 3, other, ROWS).await;
}

/// The server killed (SIGKILL) mid-epoch and started again on the same files and state:
/// each trainer reconnects at its last step + 1 and gets exactly the rest. Placement is a
/// pure function of the seed, so the new server places every row as the old one did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trainers_resume_exactly_on_a_restarted_server() {
    const ROWS: u64 = 50_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 9);
    let args = [
        "--ranks",
        "2",
        "--batch-size",
        "500",
        "--shuffle",
        "--seed",
        "3",
    ];
    let (server, uri) = serve_criteo(&data, &state, &args);
    let reads = (0..2u32).zip([6, 4]).map(|(rank, steps)| {
        let uri = uri.clone();
        tokio::spawn(async move {
            let mut record = Record::new();
            read(&uri, ticket(2, rank, 0, 0), steps, &mut record)
                .await
                .unwrap();
            record
        })
    });
    let mut records = Vec::new();
    for r in reads.collect::<Vec<_>>() {
        records.push(r.await.unwrap());
    }
    drop(server); // SIGKILL
    let (_server, uri) = serve_criteo(&data, &state, &args);
    let resumed = records.into_iter().enumerate().map(|(rank, mut record)| {
        let uri = uri.clone();
        tokio::spawn(async move {
            let next = record.last().map_or(0, |(s, _)| s + 1);
            let t = ticket(2, rank as u32, 0, next);
            assert!(read(&uri, t, usize::MAX, &mut record).await.unwrap());
            (rank as u32, record)
        })
    });
    let mut records = BTreeMap::new();
    for r in resumed.collect::<Vec<_>>() {
        let (rank, record) = r.await.unwrap();
        records.insert(rank, record);
    }
    assert_exactly_once(&records, ROWS);
}

/// The server featurizes the first epoch's first steps before any trainer asks (and keeps
/// them past the idle timeout while none has come); trainers that resume at a later step
/// on a restarted server get a run from that step, with exactly the batches a reader from
/// step 0 gets there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_steps_are_made_ahead_and_a_resume_still_gets_its_own_run() {
    // Far more per rank after the resume than a stream holds in flight (a 16 MiB window):
    // with less, the run sent its last step before `status` looked, and was let go.
    const ROWS: u64 = 300_000;
    const RESUME: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 10);
    let args = ["--ranks", "2", "--batch-size", "500", "--idle-timeout", "1"];
    let (_server, uri) = serve_criteo(&data, &state, &args);
    let pipeline = || async {
        let status = Client::connect(&uri).await.unwrap().status().await.unwrap();
        status["pipelines"][0].clone()
    };
    let deadline = std::time::Instant::now() + STALL;
    while pipeline().await["rows_featurized"].as_u64().unwrap() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing featurized ahead"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let runs = pipeline().await["runs"].clone();
    assert_eq!(
        runs.as_array().unwrap().len(),
        1,
        "kept while no trainer came: {runs}"
    );
    assert_eq!(runs[0]["first_step"], 0);

    // Both ranks read 3 steps from RESUME, then the rest.
    let read_from = |start: u64, limit: usize| {
        let tasks: Vec<_> = (0..2)
            .map(|r| {
                let uri = uri.clone();
                tokio::spawn(async move {
                    let mut record = Record::new();
                    read(&uri, ticket(2, r, 0, start), limit, &mut record)
                        .await
                        .unwrap();
                    record
                })
            })
            .collect();
        async move {
            let mut got = Vec::new();
            for t in tasks {
                got.push(t.await.unwrap());
            }
            got
        }
    };
    let mut got = read_from(RESUME, 3).await;
    let runs = pipeline().await["runs"].clone();
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
    assert_eq!(
        runs[0]["first_step"], RESUME,
        "the run made ahead gave way: {runs}"
    );
    for (r, rest) in read_from(RESUME + 3, usize::MAX)
        .await
        .into_iter()
        .enumerate()
    {
        got[r].extend(rest);
    }
    // The same steps from a reader of the whole epoch on another server.
    let (_other, other_uri) = serve_criteo(&data, &state, &args);
    let whole: Vec<_> = (0..2)
        .map(|r| tokio::spawn(trainer(other_uri.clone(), 2, r, 0)))
        .collect();
    for (r, t) in whole.into_iter().enumerate() {
        let (record, errors) = t.await.unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            got[r][..],
            record[RESUME as usize..],
            "rank {r} from step {RESUME}"
        );
    }
}

/// Every rank's records of `epoch`, read by one trainer per rank at once.
async fn read_epoch(uri: &str, epoch: u64) -> BTreeMap<u32, Record> {
    let tasks: Vec<_> = (0..2)
        .map(|r| tokio::spawn(trainer(uri.to_string(), 2, r, epoch)))
        .collect();
    let mut records = BTreeMap::new();
    for (r, t) in tasks.into_iter().enumerate() {
        let (record, errors) = t.await.unwrap();
        assert!(errors.is_empty(), "rank {r}: {errors:?}");
        records.insert(r as u32, record);
    }
    records
}

/// Once an epoch's run has featurized its last step, the next epoch's shared run starts
/// ahead of the trainers, who then read it exactly as from a run made on their first DoGet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_epoch_is_made_ahead_once_an_epoch_is_featurized() {
    const ROWS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 11);
    let args = [
        "--ranks",
        "2",
        "--batch-size",
        "500",
        "--epochs",
        "3",
        "--shuffle",
    ];
    let (_server, uri) = serve_criteo(&data, &state, &args);
    let pipeline = || async {
        let status = Client::connect(&uri).await.unwrap().status().await.unwrap();
        status["pipelines"][0].clone()
    };
    assert_exactly_once(&read_epoch(&uri, 0).await, ROWS);
    // No trainer has asked for epoch 1 yet.
    let deadline = std::time::Instant::now() + STALL;
    while pipeline().await["rows_featurized"].as_u64().unwrap() <= ROWS {
        assert!(
            std::time::Instant::now() < deadline,
            "epoch 1 was not made ahead: {}",
            pipeline().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let runs = pipeline().await["runs"].clone();
    assert!(
        runs.as_array()
            .unwrap()
            .iter()
            .any(|r| r["epoch"] == 1 && r["first_step"] == 0),
        "{runs}"
    );
    let second = read_epoch(&uri, 1).await;
    assert_exactly_once(&second, ROWS);
    // The same batches as from a server whose trainers start at epoch 1.
    let (_other, other_uri) = serve_criteo(&data, &state, &args);
    assert_eq!(second, read_epoch(&other_uri, 1).await);
}

/// Found by a hostile run: a stream of epoch 5 that held its connection but took nothing
/// (a stale trainer that answers pings and grants no flow-control window) held the
/// dataflow, and with it every trainer of epoch 6, back for as long as it stayed. It is now
/// ended after `--absent-after`, ABORTED with where to resume, and epoch 6 is read whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_of_an_epoch_does_not_hold_the_next_back() {
    use arrow_flight::flight_service_client::FlightServiceClient;
    use futures::StreamExt;

    const ROWS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 13);
    let args = ["--ranks", "2", "--batch-size", "500", "--epochs", "8"];
    let (_server, uri) = serve_criteo(
        &data,
        &state,
        &[&args[..], &["--absent-after", "1"]].concat(),
    );
    // The stale reader: a small window, and no message taken after its first.
    let endpoint = tonic::transport::Endpoint::from_shared(uri.replacen("grpc://", "http://", 1))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535);
    let mut client = FlightServiceClient::new(endpoint.connect().await.unwrap());
    let stale_ticket = arrow_flight::Ticket::new(ticket(2, 0, 5, 0).to_bytes());
    let mut stale = client.do_get(stale_ticket).await.unwrap().into_inner();
    assert!(matches!(stale.next().await, Some(Ok(_))));
    let epoch_6 = tokio::time::timeout(STALL, read_epoch(&uri, 6)).await;
    assert_exactly_once(
        &epoch_6.expect("epoch 6 read beside a stalled reader"),
        ROWS,
    );
    let status = loop {
        match tokio::time::timeout(STALL, stale.next()).await.unwrap() {
            Some(Ok(_)) => continue,
            Some(Err(status)) => break status,
            None => panic!("the stalled stream ended OK"),
        }
    };
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(status.message().contains("took no batch"), "{status:?}");
    // Its trainer resumes (here: reads the epoch again) on runs of their own.
    assert_exactly_once(&read_epoch(&uri, 5).await, ROWS);
}
