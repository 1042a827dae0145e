//! The data-parallel logistic regression fed by loaders: the loss falls, and the ranks
//! always stop together (a rank leaving early would leave the others at the all-reduce).

use std::sync::mpsc;
use std::time::Duration;

use hydrant::Pipeline;
use hydrant::demo::{TrainConfig, TrainReport, train};

fn pipeline(data: &std::path::Path, ranks: usize, batch: usize) -> Pipeline {
    let numeric: Vec<String> = (0..13).map(|i| format!("i{i}")).collect();
    let categorical: Vec<String> = (0..26).map(|i| format!("c{i}")).collect();
    Pipeline::builder("t")
        .input(data)
        .label("label")
        .dense(
            "dense",
            &numeric,
            &["fill_null(0)", "log1p", "standardize", "clip(-3, 3)"],
        )
        .ids("ids", &categorical, &["hash_bucket(100000)"])
        .ranks(ranks)
        .batch_size(batch)
        .shuffle(1, 4096)
        .build()
        .unwrap()
}

/// Trains, failing the test (instead of hanging it) after a minute.
fn train_within_a_minute(p: Pipeline, config: TrainConfig) -> TrainReport {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let running = p.start().unwrap();
        let report = train(running.ranks(), config);
        running.join().unwrap();
        let _ = tx.send(report);
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("training hung")
        .unwrap()
}

#[test]
fn the_loss_falls() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.parquet");
    hydrant::demo::criteo(200_000, &data, 5).unwrap();
    let report = train_within_a_minute(pipeline(&data, 2, 1024), TrainConfig::default());
    assert_eq!(report.steps, 200_000u64.div_ceil(2048));
    assert_eq!(report.rows, 200_000);
    let first = report.losses[0];
    let tail = &report.losses[report.losses.len() - 20..];
    let late = tail.iter().sum::<f64>() / tail.len() as f64;
    assert!((first - std::f64::consts::LN_2).abs() < 1e-3, "{first}");
    assert!(late < first - 0.05, "loss went from {first} to {late}");
}

#[test]
fn ranks_stop_together_whatever_their_speed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.parquet");
    hydrant::demo::criteo(9_001, &data, 6).unwrap();
    for (ranks, step_ms) in [
        (2, 0),
        (3, 0),
        (2, 1),
        (5, 0),
        (3, 1),
        (2, 5),
        (2, 0),
        (4, 2),
    ] {
        let config = TrainConfig {
            step_time: Duration::from_millis(step_ms),
            id_buckets: 1 << 12,
            ..TrainConfig::default()
        };
        let report = train_within_a_minute(pipeline(&data, ranks, 97), config);
        assert_eq!(report.steps, 9_001u64.div_ceil(97 * ranks as u64));
        assert_eq!(report.rows, 9_001);
    }
}

/// One worker reading every rank's share (it merges them by step) while trainers wait
/// for each other at every step: no rank's loader may fill up holding the worker while
/// another rank still needs rows that worker has not read.
#[test]
fn one_worker_feeding_every_rank_never_stalls_the_all_reduce() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.parquet");
    // Row groups of 1,500 rows: shares start and end inside them.
    hydrant::demo::criteo_with_row_groups(20_011, &data, 7, 1_500).unwrap();
    for ranks in [2, 3, 5] {
        let config = TrainConfig {
            step_time: Duration::from_millis(1),
            id_buckets: 1 << 12,
            ..TrainConfig::default()
        };
        let p = Pipeline::builder("t")
            .input(&data)
            .label("label")
            .dense("dense", &["i0", "i1"], &["fill_null(0)", "standardize"])
            .ids("ids", &["c0", "c1"], &["hash_bucket(4096)"])
            .ranks(ranks)
            .batch_size(61)
            .shuffle(2, 61 * 4)
            .cluster(hydrant::Cluster::local(1))
            .build()
            .unwrap();
        let report = train_within_a_minute(p, config);
        assert_eq!(
            report.steps,
            20_011u64.div_ceil(61 * ranks as u64),
            "{ranks} ranks"
        );
        assert_eq!(report.rows, 20_011, "{ranks} ranks");
    }
}

/// `hydrant demo` (the README's main command) on a small input: both timings, the share
/// of time waited and the falling loss are on screen, and the hand-off's files are gone.
#[test]
fn the_demo_compares_the_file_hand_off_with_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hydrant"))
        .args(["demo", "--rows", "30000", "--step-ms", "2", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let number = |after: &str| -> f64 {
        let at = stderr
            .find(after)
            .unwrap_or_else(|| panic!("no {after:?} in {stderr}"));
        let rest = stderr[at + after.len()..].trim_start();
        rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number after {after:?} in {stderr}"))
    };
    let (handoff, overlapped) = (number("(file hand-off):"), number("overlapped (hydrant):"));
    assert!(handoff > 0.0 && overlapped > 0.0, "{stderr}");
    assert!(number("waited for data") <= 100.0, "{stderr}");
    assert!(
        stderr.contains("2 ms of simulated model per step"),
        "{stderr}"
    );
    let (first, last) = (number("logloss"), number("->"));
    assert!(last < first, "the loss did not fall: {stderr}");
    assert!(!dir.path().join("featurized").exists());
    assert!(dir.path().join("criteo-30000.parquet").exists());
}
