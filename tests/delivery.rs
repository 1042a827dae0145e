//! The epoch guarantee, end to end through the real binary and real Parquet output: equal
//! steps per rank, every real row once per epoch, padding marked and counted, the same
//! seed giving the same batches, and a resumed run matching the uninterrupted one.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::*;

/// Three input files (three units) whose 5,003 rows divide evenly by none of the sizes.
fn inputs(dir: &Path) -> (PathBuf, PathBuf) {
    folder_with_state(dir, &[2000, 1501, 1502], 1)
}

const ROWS: u64 = 5003;

/// Runs delivery into a fresh folder and returns the summary and the placed rows.
fn deliver(
    dir: &Path,
    (input, state): &(PathBuf, PathBuf),
    name: &str,
    extra: &[&str],
) -> (serde_json::Value, Vec<Placed>) {
    let out = dir.join(name);
    let sink = format!("parquet:{}", out.display());
    let toml = criteo_toml();
    let state = ["--state", state.to_str().unwrap(), "--sink", &sink];
    let mut args = run_of(&toml, input, &state);
    args.extend_from_slice(extra);
    let summary = hydrant_ok(&args);
    (summary, read_placed(&out))
}

/// Checks the epoch guarantee on what one run delivered.
fn check_epoch(placed: &[Placed], summary: &serde_json::Value, w: u64, b: u64, pad: bool) {
    let epochs = summary["epochs"].as_u64().unwrap();
    let step_rows = w * b;
    let steps = if pad {
        ROWS.div_ceil(step_rows)
    } else {
        ROWS / step_rows
    };
    let label = format!("W={w} B={b} pad={pad}");
    // Every rank: the same steps, each a batch of exactly B rows.
    let mut batches: BTreeMap<(u64, u32, u64), u64> = BTreeMap::new();
    for p in placed {
        *batches.entry((p.epoch, p.rank, p.step)).or_default() += 1;
    }
    assert!(
        batches.values().all(|&n| n == b),
        "{label}: a batch is not {b} rows"
    );
    let per_rank = summary["steps_per_rank"].as_array().unwrap();
    assert_eq!(per_rank.len() as u64, w, "{label}");
    for (r, n) in per_rank.iter().enumerate() {
        assert_eq!(n.as_u64().unwrap(), steps * epochs, "{label}: rank {r}");
        for e in 0..epochs {
            let got = batches
                .keys()
                .filter(|k| k.0 == e && k.1 == r as u32)
                .count();
            assert_eq!(got as u64, steps, "{label}: rank {r} epoch {e}");
        }
    }
    for e in 0..epochs {
        let real: Vec<u64> = placed
            .iter()
            .filter(|p| p.epoch == e && !p.is_padding)
            .map(|p| p.row_id)
            .collect();
        let distinct: BTreeSet<u64> = real.iter().copied().collect();
        assert_eq!(distinct.len(), real.len(), "{label}: a row delivered twice");
        let expect = if pad { ROWS } else { steps * step_rows };
        assert_eq!(real.len() as u64, expect, "{label}: epoch {e}");
        assert!(distinct.iter().all(|&r| r < ROWS), "{label}");
        // Padding only fills the end of the epoch's last step.
        for p in placed.iter().filter(|p| p.epoch == e && p.is_padding) {
            assert_eq!(p.row_id, u64::MAX, "{label}");
            let pos = p.step * step_rows + p.rank as u64 * b + p.slot as u64;
            assert!(
                pos >= ROWS && p.step == steps - 1,
                "{label}: padding at {pos}"
            );
        }
    }
    let padded = if pad { steps * step_rows - ROWS } else { 0 };
    assert_eq!(
        summary["padded_rows"].as_u64().unwrap(),
        padded * epochs,
        "{label}"
    );
    let dropped = if pad { 0 } else { ROWS - steps * step_rows };
    assert_eq!(
        summary["dropped_rows"].as_u64().unwrap(),
        dropped * epochs,
        "{label}"
    );
    assert_eq!(
        summary["rows"].as_u64().unwrap(),
        (ROWS - dropped) * epochs,
        "{label}"
    );
}

#[test]
fn every_rank_gets_equal_steps_and_every_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    // The features of each row, from a plain run, to check rows keep their own values.
    let (_, _) = deliver(dir.path(), &io, "plain", &["--ranks", "1"]);
    let reference = read_output(&dir.path().join("plain"));
    assert_eq!(reference.len() as u64, ROWS);
    for w in [1u64, 2, 3, 7] {
        for b in [1u64, 7, 1000] {
            for pad in [true, false] {
                let name = format!("w{w}-b{b}-{pad}");
                let (ws, bs) = (w.to_string(), b.to_string());
                let last = if pad { "pad" } else { "drop" };
                let mut args = vec!["--ranks", &ws, "--batch-size", &bs, "--last-batch", last];
                // Shuffled, over two epochs, on the cheaper sizes: strided windows (a
                // multiple of B) for B = 7, whole-window permutations for B = 1000.
                let window = if b == 7 { "294" } else { "300" };
                if b > 1 {
                    args.extend(["--shuffle", "--shuffle-window", window, "--epochs", "2"]);
                }
                let (summary, placed) = deliver(dir.path(), &io, &name, &args);
                check_epoch(&placed, &summary, w, b, pad);
                let rows = read_output(&dir.path().join(&name));
                for (id, row) in &rows {
                    assert_eq!(Some(row), reference.get(id), "{name}: row {id} changed");
                }
            }
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_batches_on_any_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let args = |seed: &'static str, workers: &'static str| {
        vec![
            "--ranks",
            "3",
            "--batch-size",
            "64",
            "--epochs",
            "2",
            "--shuffle",
            "--shuffle-window",
            "500",
            "--seed",
            seed,
            "--workers",
            workers,
        ]
    };
    let (_, a) = deliver(dir.path(), &io, "a", &args("5", "1"));
    let (_, b) = deliver(dir.path(), &io, "b", &args("5", "2"));
    let (_, c) = deliver(dir.path(), &io, "c", &args("6", "2"));
    assert!(a == b, "same seed, different batches");
    assert!(a != c, "a different seed gave the same batches");
    let order = |e: u64| -> Vec<u64> {
        a.iter()
            .filter(|p| p.epoch == e)
            .map(|p| p.row_id)
            .collect()
    };
    assert_ne!(order(0), order(1), "two epochs in the same order");
    // Bit for bit: the same rows' features, in the same places.
    assert!(read_output(&dir.path().join("a")) == read_output(&dir.path().join("b")));
}

#[test]
fn a_resumed_run_matches_the_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let base = [
        "--ranks",
        "2",
        "--batch-size",
        "100",
        "--epochs",
        "2",
        "--shuffle",
        "--shuffle-window",
        "400",
        "--seed",
        "9",
    ];
    let (_, full) = deliver(dir.path(), &io, "full", &base);
    // 5,003 rows in steps of 200: 26 steps per epoch. Resume in the middle of each epoch,
    // including past the first file (a unit skipped unread when not shuffled).
    for (epoch, step, shuffle) in [(0u64, 13u64, true), (1, 25, true), (0, 11, false)] {
        let name = format!("resume-{epoch}-{step}-{shuffle}");
        let (e, s) = (epoch.to_string(), step.to_string());
        let mut args: Vec<&str> = base.to_vec();
        if !shuffle {
            // In order: no shuffle, and so no window (a window alone is refused).
            let window = args.iter().position(|a| *a == "--shuffle-window").unwrap();
            args.drain(window..window + 2);
            args.retain(|a| *a != "--shuffle");
        }
        let reference = if shuffle {
            full.clone()
        } else {
            deliver(dir.path(), &io, &format!("{name}-full"), &args).1
        };
        args.extend(["--start-epoch", &e, "--start-step", &s]);
        let (summary, resumed) = deliver(dir.path(), &io, &name, &args);
        let expect: Vec<Placed> = reference
            .iter()
            .filter(|p| (p.epoch, p.step) >= (epoch, step))
            .copied()
            .collect();
        assert!(
            !resumed.is_empty() && resumed == expect,
            "{name} differs from the full run"
        );
        let all = read_output(&dir.path().join("full"));
        for (id, row) in read_output(&dir.path().join(&name)) {
            assert_eq!(Some(&row), all.get(&id), "{name}: row {id} changed");
        }
        let rows = summary["rows"].as_u64().unwrap();
        assert_eq!(rows, expect.iter().filter(|p| !p.is_padding).count() as u64);
    }
}

/// Shuffled, every row lands where the pure placement function says, whatever the
/// shuffle window's size against the batches rows are read in (each file one row group,
/// read whole: 2,000 or ~1,500 rows): windows far smaller (many windows a read batch), a
/// multiple of the batch size (strided), one that a read batch runs into (cut there),
/// and one larger than a rank's share.
#[test]
fn shuffled_rows_land_where_the_plan_places_them() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    // The three files are the units, in file order.
    let units = vec![2000u64, 1501, 1502];
    let first_row = [0u64, 2000, 3501];
    for (b, window) in [
        (7usize, 3u64),
        (7, 14),
        (100, 97),
        (100, 1400),
        (100, 2000),
        (64, 9000),
    ] {
        let name = format!("b{b}-k{window}");
        let (bs, ks) = (b.to_string(), window.to_string());
        let args = [
            "--ranks",
            "2",
            "--batch-size",
            &bs,
            "--epochs",
            "2",
            "--shuffle",
            "--shuffle-window",
            &ks,
            "--seed",
            "11",
        ];
        let (summary, placed) = deliver(dir.path(), &io, &name, &args);
        check_epoch(&placed, &summary, 2, b as u64, true);
        let plan = hydrant::EpochPlan::new(
            units.clone(),
            2,
            b,
            hydrant::LastBatch::Pad,
            11,
            Some(window),
        )
        .unwrap();
        for epoch in 0..2 {
            // Each row's position in the epoch, from the order its units are read in.
            let mut pos = BTreeMap::new();
            for s in plan.unit_positions(epoch) {
                for k in 0..s.rows {
                    pos.insert(first_row[s.unit] + s.skip + k, s.pos + k);
                }
            }
            for p in placed.iter().filter(|p| p.epoch == epoch && !p.is_padding) {
                let want = plan.place(epoch, pos[&p.row_id]).unwrap();
                let got = (p.step, p.rank as usize, p.slot);
                assert_eq!(
                    got,
                    (want.step, want.rank, want.slot),
                    "{name}: row {} of epoch {epoch}",
                    p.row_id
                );
            }
        }
    }
}

#[test]
fn bad_delivery_options_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (input, _) = inputs(dir.path());
    let toml = criteo_toml();
    let run = |extra: &[&str]| hydrant_err(&run_of(&toml, &input, extra));
    for (extra, needle) in [
        (&["--ranks", "0"][..], "--ranks"),
        (&["--batch-size", "0"][..], "--batch-size"),
        (&["--last-batch", "keep"][..], "pad"),
        (
            &["--shuffle", "--shuffle-buffer", "0"][..],
            "--shuffle-window",
        ),
        (&["--epochs", "0"][..], "--epochs 0"),
        (&["--start-epoch", "3"][..], "--start-epoch"),
        (&["--start-step", "99999"][..], "--start-step"),
        (&["--prefetch", "0"][..], "--prefetch"),
        (&["--loader", "tpu"][..], "loader backend"),
        (&["--sink", "train:svm"][..], "unknown sink"),
    ] {
        let err = run(extra);
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
}

#[test]
fn the_cuda_loader_falls_back_to_host_memory_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let out = hydrant(&[
        "run",
        "--pipeline",
        criteo_toml().to_str().unwrap(),
        "--input",
        io.0.to_str().unwrap(),
        "--state",
        io.1.to_str().unwrap(),
        "--ranks",
        "2",
        "--batch-size",
        "100",
        "--loader",
        "cuda",
        "--sink",
        "train:logreg",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("loaders use host memory"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
