//! `--cache-mib`: a real `hydrant serve` keeps the units it has read in memory, so a later
//! epoch is served without reading the input again (shown by truncating the input after
//! the first epoch), and serves the same rows.

use hydrant_flight::{Client, ClientError, Ticket};

mod common;
use common::*;

/// The row ids of each step of `rank`'s `epoch` from `start_step`, or the error that cut it.
async fn epoch_of(
    uri: &str,
    rank: u32,
    epoch: u64,
    start_step: u64,
) -> Result<Vec<Vec<u64>>, ClientError> {
    let mut client = Client::connect(uri).await?;
    let ticket = Ticket {
        pipeline: "criteo".into(),
        epoch,
        rank,
        world_size: 2,
        start_step,
        job: None,
    };
    let mut steps = client.steps(&ticket).await?;
    let mut out = Vec::new();
    while let Some(step) = steps.next_step().await {
        let step = step?;
        out.push(real_row_ids(&step.batch));
        if step.meta.last {
            break;
        }
    }
    Ok(out)
}

/// Serves 2 epochs of a 5-unit input with `cache_mib`, reads epoch 0, truncates the input,
/// then reads epoch 1 from step 1: each rank's steps of both epochs. (From step 1, so that
/// epoch 1's run is made after the cut: the run the server makes ahead for it, from step 0,
/// started once epoch 0 was featurized, and gives way.)
fn two_epochs_truncated_between(cache_mib: &str) -> Vec<Result<Vec<Vec<u64>>, String>> {
    let dir = tempfile::tempdir().unwrap();
    let data = gen_criteo_in_row_groups(dir.path(), 10_000, 4, 2_048);
    let state = dir.path().join("state.json");
    fit_criteo(&data, &state);
    let (_server, uri) = serve_criteo(
        &data,
        &state,
        &[
            "--ranks",
            "2",
            "--batch-size",
            "1000",
            "--epochs",
            "2",
            "--cache-mib",
            cache_mib,
        ],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut out = Vec::new();
    for epoch in 0..2 {
        if epoch == 1 {
            let status =
                rt.block_on(async { Client::connect(&uri).await.unwrap().status().await.unwrap() });
            let cached = status["pipelines"][0]["cached_input_bytes"]
                .as_u64()
                .unwrap();
            assert_eq!(cached > 0, cache_mib != "0", "cached bytes: {cached}");
            // Every unit was read whole by now; the file is cut to nothing.
            std::thread::sleep(std::time::Duration::from_millis(200));
            std::fs::File::options()
                .write(true)
                .open(&data)
                .unwrap()
                .set_len(0)
                .unwrap();
        }
        for rank in 0..2 {
            let got = rt.block_on(epoch_of(&uri, rank, epoch, epoch));
            out.push(got.map_err(|e| e.to_string()));
        }
    }
    out
}

#[test]
fn a_cached_input_serves_later_epochs_without_reading_it_again() {
    let got = two_epochs_truncated_between("64");
    let epochs: Vec<Vec<Vec<u64>>> = got
        .into_iter()
        .map(|r| r.expect("every epoch is served from the cache"))
        .collect();
    let (first, second) = epochs.split_at(2);
    for rank in 0..2 {
        assert_eq!(
            first[rank].len(),
            5,
            "rank {rank}: 10,000 rows in steps of 2 x 1,000"
        );
        assert_eq!(
            second[rank][..],
            first[rank][1..],
            "rank {rank}: the same rows, in order"
        );
    }
    let mut all: Vec<u64> = first.iter().flatten().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..10_000).collect::<Vec<_>>());
}

#[test]
fn without_the_cache_a_truncated_input_is_an_error() {
    let got = two_epochs_truncated_between("0");
    assert!(
        got[0].is_ok() && got[1].is_ok(),
        "epoch 0 is read before the cut"
    );
    for r in &got[2..] {
        let e = r.as_ref().expect_err("epoch 1 reads the cut file");
        assert!(e.contains("truncated") || e.contains("changed"), "{e}");
    }
}
