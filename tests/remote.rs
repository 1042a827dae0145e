//! The Rust Flight client and the remote source against a real `hydrant serve`: the same
//! `TrainingBatch`es as the in-process path, steps reassembled, resume, auth, and errors
//! that say what went wrong.

use std::collections::BTreeMap;
use std::path::Path;

use hydrant::loader::TrainingBatch;
use hydrant::{Pipeline, RunOptions};

mod common;
use common::*;

const ROWS: u64 = 10_007;

fn setup(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    folder_with_state(dir, &[ROWS], 11)
}

/// (step, row ids, dense values) of every batch of every rank, ranks read concurrently.
type Seen = BTreeMap<usize, Vec<(u64, Vec<u64>, Vec<f32>)>>;

/// Every rank's batches, the ranks read concurrently (they are consumed together).
fn read_ranks<'a>(loaders: impl IntoIterator<Item = &'a hydrant::Loader>) -> Seen {
    std::thread::scope(|s| {
        let handles: Vec<_> = loaders
            .into_iter()
            .map(|l| s.spawn(move || record(l.batches())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .enumerate()
            .collect()
    })
}

fn record(
    batches: impl Iterator<Item = hydrant::Result<TrainingBatch>>,
) -> Vec<(u64, Vec<u64>, Vec<f32>)> {
    batches
        .map(|b| {
            let b = b.unwrap();
            (
                b.meta.step,
                b.row_ids.to_vec(),
                b.dense.host().unwrap().to_vec(),
            )
        })
        .collect()
}

#[test]
fn remote_ranks_get_the_same_batches_as_in_process_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = setup(dir.path());
    let extra = [
        "--ranks",
        "2",
        "--batch-size",
        "1000",
        "--shuffle",
        "--seed",
        "5",
    ];
    let (_server, uri) = serve_criteo(&data, &state, &extra);

    let remote = Pipeline::connect(&uri, "criteo").unwrap();
    assert_eq!(remote.world_size(), 2);
    let ranks: Vec<_> = (0..2).map(|r| remote.rank(r).unwrap()).collect();
    let remote_seen = read_ranks(ranks.iter().map(|r| r.loader()));
    assert!(ranks.iter().all(|r| r.stall() > std::time::Duration::ZERO));

    let options = RunOptions {
        ranks: 2,
        batch_size: 1000,
        seed: 5,
        // The window `--shuffle` takes when none is given.
        shuffle: Some(hydrant::Placement::default_window(1000)),
        ..RunOptions::default()
    };
    let local = Pipeline::from_files(&criteo_toml(), &[data], Some(&state), options)
        .unwrap()
        .start()
        .unwrap();
    let local_seen = read_ranks(local.ranks());
    local.join().unwrap();

    let steps = ROWS.div_ceil(2000);
    for r in 0..2 {
        let got: Vec<u64> = remote_seen[&r].iter().map(|(s, _, _)| *s).collect();
        assert_eq!(got, (0..steps).collect::<Vec<_>>(), "rank {r}");
        assert!(remote_seen[&r].iter().all(|(_, ids, _)| ids.len() == 1000));
    }
    assert_eq!(
        remote_seen, local_seen,
        "remote and in-process batches differ"
    );
}

#[test]
fn a_step_over_one_message_is_one_batch_and_resume_starts_where_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = setup(dir.path());
    // 20,000 rows of Criteo are ~5 MB: over gRPC's 4 MiB, so the step goes as two messages.
    let (_server, uri) = serve_criteo(&data, &state, &["--ranks", "1", "--batch-size", "20000"]);
    let remote = Pipeline::connect(&uri, "criteo").unwrap();
    let all = record(remote.rank(0).unwrap().batches());
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].1.len(), 20_000);
    assert_eq!(all[0].2.len(), 20_000 * 13);
    let real: Vec<u64> = all[0]
        .1
        .iter()
        .copied()
        .filter(|&i| i != u64::MAX)
        .collect();
    assert_eq!(real, (0..ROWS).collect::<Vec<_>>());

    let (_server, uri) = serve_criteo(&data, &state, &["--ranks", "1", "--batch-size", "1000"]);
    let remote = Pipeline::connect(&uri, "criteo").unwrap();
    let rest = record(remote.open(0, 0, 7).unwrap().batches());
    let steps: Vec<u64> = rest.iter().map(|(s, _, _)| *s).collect();
    assert_eq!(steps, (7..ROWS.div_ceil(1000)).collect::<Vec<_>>());
    let past_the_end = record(remote.open(0, 0, 11).unwrap().batches());
    assert!(past_the_end.is_empty());
}

/// A trainer whose steps take longer than the keep-alive (a big model, a checkpoint)
/// keeps its rank's stream: each ping is answered, not taken for a dead server.
#[test]
fn a_trainer_slower_than_the_keepalive_keeps_its_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = setup(dir.path());
    let (_server, uri) = serve_criteo(&data, &state, &["--ranks", "1", "--batch-size", "1000"]);
    let keepalive = std::time::Duration::from_millis(300);
    let remote = Pipeline::connect(&uri, "criteo")
        .unwrap()
        .with_keepalive(Some(keepalive))
        .unwrap();
    let rank = remote.rank(0).unwrap();
    let mut ids = Vec::new();
    for batch in rank.batches() {
        ids.extend(batch.unwrap().row_ids.iter().copied());
        std::thread::sleep(keepalive * 2);
    }
    ids.retain(|&i| i != u64::MAX);
    assert_eq!(ids, (0..ROWS).collect::<Vec<_>>());

    let zero = Pipeline::connect(&uri, "criteo")
        .unwrap()
        .with_keepalive(Some(std::time::Duration::ZERO));
    assert!(zero.unwrap_err().to_string().contains("keep-alive of 0"));
}

#[test]
fn credentials_are_needed_and_used() {
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = setup(dir.path());
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "alice:s3cret\n").unwrap();
    let (_server, uri) = serve_criteo(
        &data,
        &state,
        &[
            "--ranks",
            "1",
            "--batch-size",
            "5000",
            "--token-file",
            tokens.to_str().unwrap(),
        ],
    );
    let err = Pipeline::connect(&uri, "criteo").unwrap_err().to_string();
    assert!(err.to_lowercase().contains("unauthenticated"), "{err}");
    // Found by a hostile run: PollFlightInfo told callers with no token it was not
    // implemented, where every other call refuses them.
    let refused = common::pushed::runtime().block_on(async {
        let mut client = common::pushed::flight_client(&uri).await;
        let descriptor = arrow_flight::FlightDescriptor::new_path(vec!["criteo".into()]);
        client.poll_flight_info(descriptor).await.unwrap_err()
    });
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    let remote = hydrant::Remote::connect_with_credentials(&uri, "criteo", "alice", "guess");
    assert!(remote.is_err());
    let remote =
        hydrant::Remote::connect_with_credentials(&uri, "criteo", "alice", "s3cret").unwrap();
    assert_eq!(record(remote.rank(0).unwrap().batches()).len(), 3);
}

#[test]
fn failures_name_what_went_wrong() {
    let port = free_port();
    let err = Pipeline::connect(&format!("grpc://127.0.0.1:{port}"), "criteo")
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot connect"), "{err}");

    // An epoch far larger than what a stream can hold in flight (the client's 16 MiB
    // HTTP/2 window, the loader's read-ahead, the server's queues): killed after two
    // steps, the server cannot have sent it all, however fast it ran.
    const BIG: u64 = 300_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[BIG], 11);
    let (mut server, uri) = serve_criteo(&data, &state, &["--ranks", "2", "--batch-size", "100"]);
    let err = Pipeline::connect(&uri, "nope").unwrap_err().to_string();
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
    let remote = Pipeline::connect(&uri, "criteo").unwrap();
    let err = remote.rank(2).err().unwrap().to_string();
    assert!(err.contains("rank 2 is not below the 2 ranks"), "{err}");

    // The server dies mid-epoch: the stream ends with an error, never a clean end.
    let rank = remote.rank(0).unwrap();
    let other = remote.rank(1).unwrap();
    let mut got = 0;
    let mut failed = None;
    for b in rank.batches() {
        match b {
            Ok(_) => got += 1,
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
        if got == 2 {
            let _ = server.0.kill();
        }
        let _ = other.loader().next_batch();
    }
    let failed = failed.expect("a cut stream must end with an error");
    assert!(failed.contains("remote rank 0"), "{failed}");
    assert!(got < BIG.div_ceil(200) as usize, "{got}");
}
