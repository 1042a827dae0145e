//! A slow rank slows the sources instead of filling memory: with one trainer sleeping
//! between steps, what the dataflow has delivered never runs more than the bounded queues
//! ahead of what the trainers consumed, peak memory stays flat, and no batch is lost.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hydrant::Pipeline;

/// This process's peak resident memory, in MiB (Linux `VmHWM`).
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    kb / 1024.0
}

const ROWS: u64 = 400_000;
const B: usize = 2048;

/// What one run saw: each rank's real row ids, the steps per rank, and how far delivery
/// ran ahead of consumption at most.
struct Seen {
    ids: Vec<Vec<u64>>,
    steps_per_rank: Vec<u64>,
    ahead: u64,
}

/// Runs two ranks over `data`; rank 0 sleeps `slow` after each batch.
fn run(data: &std::path::Path, slow: Duration) -> Seen {
    let numeric: Vec<String> = (0..13).map(|i| format!("i{i}")).collect();
    let categorical: Vec<String> = (0..26).map(|i| format!("c{i}")).collect();
    let running = Pipeline::builder("bp")
        .input(data)
        .label("label")
        .dense("dense", &numeric, &["fill_null(0)", "log1p", "clip(-3, 3)"])
        .ids("ids", &categorical, &["hash_bucket(1024)"])
        .ranks(2)
        .batch_size(B)
        .build()
        .unwrap()
        .start()
        .unwrap();
    let consumed = AtomicU64::new(0);
    let ahead = AtomicU64::new(0);
    let ids: Vec<Vec<u64>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|r| {
                let (loader, consumed, ahead, running) =
                    (running.rank(r).unwrap(), &consumed, &ahead, &running);
                s.spawn(move || {
                    let mut ids = Vec::new();
                    for batch in loader.batches() {
                        let batch = batch.unwrap();
                        ids.extend(batch.row_ids.iter().copied().filter(|&i| i != u64::MAX));
                        let done = consumed.fetch_add(B as u64, Ordering::SeqCst) + B as u64;
                        ahead.fetch_max(running.delivered().saturating_sub(done), Ordering::SeqCst);
                        if r == 0 {
                            std::thread::sleep(slow);
                        }
                    }
                    ids
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let report = running.join().unwrap();
    Seen {
        ids,
        steps_per_rank: report.steps_per_rank,
        ahead: ahead.into_inner(),
    }
}

#[test]
fn a_slow_rank_slows_the_sources_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("clicks.parquet");
    hydrant::demo::criteo(ROWS, &data, 3).unwrap();
    let steps = ROWS.div_ceil(2 * B as u64);

    let fast = run(&data, Duration::ZERO);
    let peak_fast = peak_rss_mb();
    // Rank 0 now takes ~0.8 s longer than featurizing everything does: without
    // backpressure the dataflow would run ahead and hold the whole featurized input.
    let slow = run(&data, Duration::from_millis(8));
    let grew = peak_rss_mb() - peak_fast;

    for seen in [&fast, &slow] {
        // Nothing lost, nothing twice, the same steps on both ranks.
        assert_eq!(seen.steps_per_rank, vec![steps, steps]);
        let all: BTreeSet<u64> = seen.ids.iter().flatten().copied().collect();
        assert_eq!(all.len() as u64, ROWS);
        assert_eq!(seen.ids.iter().map(Vec::len).sum::<usize>() as u64, ROWS);
    }
    // Per rank at most 2 prefetched, 1 being converted, 1 in the feed and 1 being handed
    // over, plus a step in the router's hands.
    let bound = 2 * 6 * B as u64;
    assert!(
        slow.ahead <= bound,
        "delivered ran {} rows ahead of the trainers (bound {bound})",
        slow.ahead
    );
    // The slow run needs no more memory than the fast one: the featurized input is
    // ~110 MB, which the high-water mark would show; allocator noise here is 5-20 MB.
    assert!(
        grew < 40.0,
        "the slow rank raised peak memory by {grew:.0} MiB"
    );
}
