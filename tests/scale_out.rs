//! Scale-out: the same rows reach the same (epoch, step, rank, slot), with the same
//! features, whatever the layout — 1 process of 1, 2 or 3 workers, 2 processes of 2,
//! 3 processes of 1 — because placement is a pure function of a row's position and each
//! rank is assembled by one owner. And a cluster that loses a process stops promptly
//! with one line, and restarting it at a step resumes exactly.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arrow::array::{AsArray, RecordBatch};
use common::*;

/// Three files (three units) of 1,003 rows in all, and a fitted state.
fn inputs(dir: &Path) -> (PathBuf, PathBuf) {
    folder_with_state(dir, &[400, 301, 302], 11)
}

/// The `run` arguments writing to `out` with `extra` options.
fn run_args<'a>(io: &'a (PathBuf, PathBuf), out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--pipeline",
        "",
        "--input",
        io.0.to_str().unwrap(),
        "--state",
        io.1.to_str().unwrap(),
        "--sink",
        out,
    ];
    args.extend_from_slice(extra);
    args
}

/// `run` arguments of the Criteo pipeline over `io` into the null sink (the loaders).
fn null_args<'a>(io: &'a (PathBuf, PathBuf), toml: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = run_args(io, "null", extra);
    args[2] = toml.to_str().unwrap();
    args
}

/// Process `p` of the 2-process cluster of `hosts` (one worker), running the Criteo
/// pipeline over `io` (or over `input` instead) into the null sink, its output piped.
fn cluster_process(
    io: &(PathBuf, PathBuf),
    hosts: &Path,
    p: usize,
    input: Option<&Path>,
) -> std::process::Child {
    cluster_process_with(io, hosts, p, input, &[])
}

/// The rows the cluster's processes delivered, each having ended well.
fn rows_of(processes: impl IntoIterator<Item = std::process::Child>) -> u64 {
    processes
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .map(|o| {
            let said = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{said}");
            let out = String::from_utf8_lossy(&o.stdout);
            let summary: serde_json::Value =
                serde_json::from_str(out.lines().last().unwrap()).unwrap();
            summary["rows"].as_u64().unwrap()
        })
        .sum()
}

/// A hostfile in `dir` of two free ports on loopback.
fn two_hosts(dir: &Path) -> PathBuf {
    let hosts = dir.join("hosts");
    let line = |port: u16| format!("127.0.0.1:{port}\n");
    std::fs::write(&hosts, line(free_port()) + &line(free_port())).unwrap();
    hosts
}

/// [`cluster_process`] with `extra` arguments at the end.
fn cluster_process_with(
    io: &(PathBuf, PathBuf),
    hosts: &Path,
    p: usize,
    input: Option<&Path>,
    extra: &[&str],
) -> std::process::Child {
    let toml = criteo_toml();
    let mut args = null_args(io, &toml, &["--ranks", "2", "--workers", "1"]);
    if let Some(input) = input {
        args[4] = input.to_str().unwrap();
    }
    let process = p.to_string();
    std::process::Command::new(env!("CARGO_BIN_EXE_hydrant"))
        .args(args)
        .args(["--processes", "2", "--process", &process, "--hostfile"])
        .arg(hosts)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A cluster of 2 processes of 1 worker running `args`, both still running after 1.5 s.
fn running_cluster(dir: &Path, args: &[&str]) -> Vec<std::process::Child> {
    let mut children = spawn_cluster(dir, 2, 1, args);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        children[0].try_wait().unwrap().is_none(),
        "process 0 ended early"
    );
    children
}

/// Waits for `survivor` to end after process 1 was `what` at `since` (at most `limit`,
/// killing it and `others` if not), and returns its one-line error, which names the lost
/// process 1, and when it ended.
fn lost_process_1(
    mut survivor: std::process::Child,
    others: &mut [std::process::Child],
    (what, since, limit): (&str, Instant, Duration),
) -> (String, Duration) {
    while survivor.try_wait().unwrap().is_none() {
        if since.elapsed() > limit {
            let _ = survivor.kill();
            others.iter_mut().for_each(|c| drop(c.kill()));
            panic!("process 0 still runs {limit:?} after process 1 was {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = since.elapsed();
    let out = survivor.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("lost process 1"), "{stderr}");
    (stderr, took)
}

/// Runs on `processes` × `workers` and returns the placed rows and the featurized rows.
fn run_on(
    dir: &Path,
    io: &(PathBuf, PathBuf),
    name: &str,
    (processes, workers): (usize, usize),
    extra: &[&str],
) -> (Vec<Placed>, std::collections::BTreeMap<u64, Row>) {
    let out = dir.join(name);
    let sink = format!("parquet:{}", out.display());
    let toml = criteo_toml();
    let mut args = run_args(io, &sink, extra);
    args[2] = toml.to_str().unwrap();
    if processes == 1 {
        let w = workers.to_string();
        args.extend(["--workers", &w]);
        hydrant_ok(&args);
    } else {
        run_cluster(dir, processes, workers, &args);
    }
    (read_placed(&out), read_output(&out))
}

#[test]
fn the_same_batches_on_any_layout() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let layouts = [(1, 2), (1, 3), (2, 2), (3, 1)];
    for w in [1usize, 2, 3, 4, 6] {
        for b in [1usize, 7, 1000] {
            for shuffle in [false, true] {
                let (ws, bs) = (w.to_string(), b.to_string());
                let mut extra = vec!["--ranks", &ws, "--batch-size", &bs, "--epochs", "2"];
                // Strided windows (a multiple of B) for B = 7, whole-window permutations
                // for B = 1000 (and for the short last window).
                let window = if b == 7 { "98" } else { "97" };
                if shuffle {
                    extra.extend(["--shuffle", "--shuffle-window", window, "--seed", "3"]);
                }
                let name = format!("w{w}-b{b}-{shuffle}");
                let (placed, rows) =
                    run_on(dir.path(), &io, &format!("{name}-1x1"), (1, 1), &extra);
                let steps = 1003u64.div_ceil((w * b) as u64);
                assert_eq!(placed.len() as u64, 2 * steps * (w * b) as u64, "{name}");
                for layout in layouts {
                    let tag = format!("{name}-{}x{}", layout.0, layout.1);
                    let (p, r) = run_on(dir.path(), &io, &tag, layout, &extra);
                    assert!(p == placed, "{tag}: rows placed differently from 1x1");
                    assert!(r == rows, "{tag}: features differ from 1x1");
                }
                // Resumed at a middle step of the second epoch, on a cluster: exactly the
                // uninterrupted run's tail.
                let mid = (steps / 2).to_string();
                let mut resumed = extra.clone();
                resumed.extend(["--start-epoch", "1", "--start-step", &mid]);
                let tag = format!("{name}-resumed");
                let (p, _) = run_on(dir.path(), &io, &tag, (2, 2), &resumed);
                let tail: Vec<Placed> = placed
                    .iter()
                    .filter(|x| (x.epoch, x.step) >= (1, steps / 2))
                    .copied()
                    .collect();
                assert!(p == tail, "{tag}: not the tail of the full run");
            }
        }
    }
}

#[test]
fn each_process_delivers_its_own_ranks_through_its_loaders() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let toml = criteo_toml();
    let args = null_args(
        &io,
        &toml,
        &["--ranks", "4", "--batch-size", "50", "--epochs", "2"],
    );
    let summaries = run_cluster(dir.path(), 2, 2, &args);
    let steps = 1003u64.div_ceil(200);
    let mut rows = 0;
    for (p, s) in summaries.iter().enumerate() {
        let per_rank: Vec<u64> = serde_json::from_value(s["steps_per_rank"].clone()).unwrap();
        // Process 0 owns ranks 0 and 1, process 1 ranks 2 and 3: equal steps, each its own.
        let mine = [2 * p, 2 * p + 1];
        for (r, n) in per_rank.iter().enumerate() {
            let want = if mine.contains(&r) { 2 * steps } else { 0 };
            assert_eq!(*n, want, "process {p}, rank {r}: {s}");
        }
        rows += s["rows"].as_u64().unwrap();
        // Each process reads only its ranks' shares: 5 full steps of 4 x 50 give each rank
        // 250 rows an epoch; the last step's 3 rows are read by process 0.
        let read = s["featurized_rows"].as_u64().unwrap();
        assert_eq!(
            read,
            2 * [503, 500][p],
            "process {p} featurized {read} rows: {s}"
        );
    }
    assert_eq!(rows, 2 * 1003);
    // A trainer of its own needs a process per node, but logreg's all-reduce is in memory.
    let mut train = args.clone();
    train[8] = "train:logreg";
    let children = spawn_cluster(dir.path(), 2, 1, &train);
    for c in children {
        let out = c.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("one process"), "{stderr}");
    }
}

#[test]
fn losing_a_process_stops_the_cluster_and_a_restart_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let toml = criteo_toml();
    let shared = [
        "--ranks",
        "2",
        "--batch-size",
        "10",
        "--shuffle",
        "--seed",
        "4",
    ];
    // Long enough to be killed in the middle: many epochs, consumed by the loaders.
    let mut long = shared.to_vec();
    long.extend(["--epochs", "100000"]);
    let args = null_args(&io, &toml, &long);
    let mut children = running_cluster(dir.path(), &args);
    children[1].kill().unwrap();
    let _ = children[1].wait();
    let killed = Instant::now();
    let survivor = children.remove(0);
    let limit = Duration::from_secs(10);
    let (stderr, _) = lost_process_1(survivor, &mut [], ("killed", killed, limit));
    assert!(!stderr.contains("panicked"), "{stderr}");

    // The trainers checkpointed step 40 of epoch 0: both processes restart from there and
    // deliver exactly the rest of an uninterrupted run.
    let mut full = shared.to_vec();
    full.extend(["--epochs", "2"]);
    let (reference, _) = run_on(dir.path(), &io, "reference", (1, 1), &full);
    let mut resumed = full.clone();
    resumed.extend(["--start-step", "40"]);
    let (after, _) = run_on(dir.path(), &io, "resumed", (2, 1), &resumed);
    let (before, tail): (Vec<Placed>, Vec<Placed>) =
        reference.iter().partition(|p| (p.epoch, p.step) < (0, 40));
    assert!(after == tail, "the restart is not the rest of the run");
    // Every real row exactly once per epoch across the checkpoint.
    for epoch in 0..2 {
        let mut ids: Vec<u64> = before
            .iter()
            .chain(&after)
            .filter(|p| p.epoch == epoch && !p.is_padding)
            .map(|p| p.row_id)
            .collect();
        ids.sort();
        assert_eq!(ids, (0..1003).collect::<Vec<_>>(), "epoch {epoch}");
    }
}

/// A peer that stops answering without closing anything (`SIGSTOP` here; a host that
/// lost power or a network partition look the same) is noticed by the heartbeats: the
/// other process ends with one line naming it, instead of waiting for it forever.
#[test]
fn a_stopped_process_stops_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let toml = criteo_toml();
    let args = null_args(
        &io,
        &toml,
        &["--ranks", "2", "--batch-size", "10", "--epochs", "100000"],
    );
    let mut children = running_cluster(dir.path(), &args);
    signal("-STOP", &[children[1].id()]);
    let stopped = Instant::now();
    let survivor = children.remove(0);
    let limit = Duration::from_secs(20);
    let (stderr, took) = lost_process_1(survivor, &mut children, ("stopped", stopped, limit));
    for frozen in &mut children {
        let _ = frozen.kill();
        let _ = frozen.wait();
    }
    assert!(stderr.contains("no word from it"), "{stderr}");
    // Not before the heartbeats' silence (8 s) has passed: a busy peer is not a lost one.
    // Its last beat came up to a beat (1 s) before the stop, later under a loaded
    // machine's scheduling (6.88 s was seen with every test running at once).
    assert!(
        took > Duration::from_secs(6),
        "ended {took:?} after the stop"
    );
}

/// A whole cluster suspended and resumed (a paused job, a host's VMs frozen together)
/// is not a loss: each process counts a peer's silence only while it looks itself.
#[test]
fn a_cluster_stopped_whole_and_resumed_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let toml = criteo_toml();
    let args = null_args(
        &io,
        &toml,
        &["--ranks", "2", "--batch-size", "10", "--epochs", "2000"],
    );
    let children = spawn_cluster(dir.path(), 2, 1, &args);
    std::thread::sleep(Duration::from_millis(1500));
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    signal("-STOP", &pids);
    // Longer than the heartbeats' silence (8 s).
    std::thread::sleep(Duration::from_secs(10));
    signal("-CONT", &pids);
    for (p, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "process {p}: {stderr}");
    }
}

/// Processes started with different options would place rows where the others do not
/// look for them (a different seed duplicated a third of the rows and lost as many):
/// every process checks that the others run its job, and says which option differs.
#[test]
fn processes_started_differently_refuse_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let toml = criteo_toml();
    for (option, a, b) in [
        ("--seed", "1", "2"),
        ("--epochs", "1", "3"),
        ("--start-step", "0", "10"),
        ("--last-batch", "pad", "drop"),
    ] {
        let base = run_args(
            &io,
            "null",
            &["--ranks", "2", "--batch-size", "10", "--shuffle"],
        );
        let children = spawn_cluster_with(dir.path(), 2, 1, |p| {
            let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
            args[2] = toml.to_str().unwrap().to_string();
            args.extend([option.to_string(), if p == 0 { a } else { b }.to_string()]);
            args
        });
        let outs: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let all: Vec<_> = outs
            .iter()
            .map(|o| String::from_utf8_lossy(&o.stderr))
            .collect();
        for (p, out) in outs.iter().enumerate() {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            assert!(
                !out.status.success(),
                "{option}, process {p} succeeded: {all:?}"
            );
            assert_eq!(stderr.lines().count(), 1, "{option}: {all:?}");
            assert!(stderr.contains("runs another job"), "{option}: {all:?}");
            assert!(stderr.contains(option), "{option}: {stderr}");
        }
    }
}

/// Found by a hostile run: a process given other data of the same shape (the same row
/// counts in the same row groups, another seed) ran, and each rank's rows came from
/// another dataset under one row-id space. The files' sizes are compared too.
#[test]
fn processes_given_other_data_of_the_same_shape_refuse_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let other_dir = dir.path().join("other");
    std::fs::create_dir(&other_dir).unwrap();
    let (other, _) = folder_with_state(&other_dir, &[400, 301, 302], 21);
    let toml = criteo_toml();
    let base = run_args(&io, "null", &["--ranks", "2", "--batch-size", "10"]);
    let children = spawn_cluster_with(dir.path(), 2, 1, |p| {
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        args[2] = toml.to_str().unwrap().to_string();
        if p == 1 {
            args[4] = other.to_str().unwrap().to_string();
        }
        args
    });
    every_process_refuses(children, "runs another job: its input is", "other data");
}

/// Found by a hostile run: processes whose pipelines differed only in their steps (a
/// `clip` with other bounds) ran as one job, and each rank's rows were featurized partly
/// one way and partly the other; the same files listed in another order (same sizes,
/// other contents) delivered some rows twice and others never. Both are refused at the
/// join, naming what differs.
#[test]
fn processes_with_other_pipelines_or_files_in_another_order_refuse_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let toml = criteo_toml();
    let clipped = dir.path().join("clipped.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    assert!(text.contains("clip(-3, 3)"));
    std::fs::write(&clipped, text.replace("clip(-3, 3)", "clip(-1, 1)")).unwrap();
    // Two Arrow IPC files of one size: the same rows, and in the other one every number
    // negated (other files of a fixed-width layout are of one size too).
    let batches = read_parquet(&io.0.join("part-1.parquet"));
    let flipped: Vec<RecordBatch> = batches
        .iter()
        .map(|b| {
            let columns =
                b.columns()
                    .iter()
                    .map(
                        |c| match c.as_primitive_opt::<arrow::datatypes::Float64Type>() {
                            Some(x) => std::sync::Arc::new(
                                x.unary::<_, arrow::datatypes::Float64Type>(|v| -v),
                            ) as _,
                            None => c.clone(),
                        },
                    )
                    .collect();
            RecordBatch::try_new(b.schema(), columns).unwrap()
        })
        .collect();
    let (a, b) = (dir.path().join("a.arrow"), dir.path().join("b.arrow"));
    write_ipc(&a, &batches, false);
    write_ipc(&b, &flipped, false);
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert_eq!(size(&a), size(&b));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let base = run_args(&io, "null", &["--ranks", "2", "--batch-size", "10"]);
    for (what, expected) in [
        ("pipeline", "pipeline (groups, steps and label)"),
        ("order", "input is"),
    ] {
        let children = spawn_cluster_with(dir.path(), 2, 1, |p| {
            let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
            args[2] = match (what, p) {
                ("pipeline", 1) => clipped.to_str().unwrap().to_string(),
                _ => toml.to_str().unwrap().to_string(),
            };
            if what == "order" {
                args[4] = if p == 0 { a } else { b }.to_string();
                args.insert(5, if p == 0 { b } else { a }.to_string());
            }
            args
        });
        let needle = format!("runs another job: its {expected}");
        every_process_refuses(children, &needle, what);
    }
}

/// Waits for `children`, a cluster's processes: each must fail with one line that holds
/// `needle` (`what` names the case in a failure).
fn every_process_refuses(children: Vec<std::process::Child>, needle: &str, what: &str) {
    for (p, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert!(
            !out.status.success(),
            "{what}: process {p} succeeded: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
        assert!(stderr.contains(needle), "{what}: {stderr}");
    }
}

/// A process that fails before it joins (here, process 1 is given an input that does not
/// exist) tells the others why: they stop at once with one line naming it and its reason,
/// not after the join's minute. Whether the others were waiting already or start a second
/// after it failed.
#[test]
fn a_process_that_fails_before_joining_stops_the_others_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let missing = dir.path().join("missing.parquet");
    let hosts = two_hosts(dir.path());
    let start = |p: usize| cluster_process(&io, &hosts, p, (p == 1).then_some(&*missing));
    for process_1_first in [false, true] {
        let started = Instant::now();
        let (mut process_0, mut process_1) = if process_1_first {
            // Process 0 starts once process 1 has failed (it prints its error first).
            let mut one = start(1);
            let mut stderr = std::io::BufReader::new(one.stderr.take().unwrap());
            let mut line = String::new();
            std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
            one.stderr = Some(stderr.into_inner());
            let zero = start(0);
            (zero, (one, line))
        } else {
            let zero = start(0);
            std::thread::sleep(Duration::from_millis(300));
            (zero, (start(1), String::new()))
        };
        let said = |child: &mut std::process::Child, mut text: String| {
            let mut rest = String::new();
            let stderr = child.stderr.as_mut().unwrap();
            std::io::Read::read_to_string(stderr, &mut rest).unwrap();
            text.push_str(&rest);
            (child.wait().unwrap(), text.trim().to_string())
        };
        let (exit_0, said_0) = said(&mut process_0, String::new());
        let (exit_1, said_1) = said(&mut process_1.0, std::mem::take(&mut process_1.1));
        let took = started.elapsed();
        assert!(!exit_0.success() && !exit_1.success());
        assert_eq!(said_1.lines().count(), 1, "{said_1}");
        assert!(said_1.contains("missing.parquet"), "{said_1}");
        assert_eq!(said_0.lines().count(), 1, "{said_0}");
        assert!(
            said_0.contains("process 1 (") && said_0.contains("stopped before joining"),
            "{said_0}"
        );
        assert!(said_0.contains("missing.parquet"), "{said_0}");
        assert!(
            took < Duration::from_secs(10),
            "process 1 first: {process_1_first}, {took:?}"
        );
    }
}

/// A process whose command line is refused (a mistyped option) tells the others too: they
/// stop at once naming it and the option, not after the join's minute.
#[test]
fn a_process_with_a_bad_command_line_stops_the_others_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let hosts = two_hosts(dir.path());
    let started = Instant::now();
    let zero = cluster_process(&io, &hosts, 0, None);
    std::thread::sleep(Duration::from_millis(300));
    let one = cluster_process_with(&io, &hosts, 1, None, &["--shufle"]);
    let one = one.wait_with_output().unwrap();
    assert_eq!(one.status.code(), Some(2));
    let zero = zero.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&zero.stderr).trim().to_string();
    assert!(!zero.status.success());
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains("process 1 (") && said.contains("stopped before joining"),
        "{said}"
    );
    assert!(said.contains("--shufle"), "{said}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// A hostfile may list more hosts than the job's processes (one file for every job of a
/// set of nodes): the processes use its first lines and wait for no one else.
#[test]
fn a_hostfile_may_list_more_hosts_than_processes() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let hosts = dir.path().join("hosts");
    let lines: String = (0..4)
        .map(|_| format!("127.0.0.1:{}\n", free_port()))
        .collect();
    std::fs::write(&hosts, lines).unwrap();
    let started = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|p| cluster_process(&io, &hosts, p, None))
        .collect();
    let rows = rows_of(children);
    assert_eq!(rows, 1_003);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// A process whose cluster port is taken cannot join: it tells the others, which stop at
/// once naming it, rather than waiting out the join's minute.
#[test]
fn a_process_whose_cluster_port_is_taken_stops_the_others_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hosts = dir.path().join("hosts");
    let taken_at = taken.local_addr().unwrap().to_string();
    std::fs::write(&hosts, format!("127.0.0.1:{}\n{taken_at}\n", free_port())).unwrap();
    let started = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|p| cluster_process(&io, &hosts, p, None))
        .collect();
    let said: Vec<String> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .map(|o| {
            assert!(!o.status.success());
            String::from_utf8_lossy(&o.stderr).trim().to_string()
        })
        .collect();
    assert!(said.iter().all(|s| s.lines().count() == 1), "{said:?}");
    let cannot = format!("cannot listen on {taken_at}");
    assert!(said[1].contains(&cannot), "{said:?}");
    // Which hostfile line it is, and what most often holds it (a second process 1).
    assert!(
        said[1].contains("process 1's address in the hostfile"),
        "{said:?}"
    );
    assert!(said[1].contains("is another process 1"), "{said:?}");
    assert!(
        said[0].contains("process 1 (") && said[0].contains(&cannot),
        "{said:?}"
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// A process started twice (found by a hostile run): the second cannot listen, sees that
/// process 1 of this cluster holds its port, and stops alone. It used to tell process 0
/// that process 1 stopped, which ended the job the first process 1 was waiting to join.
#[test]
fn a_process_started_twice_leaves_the_first_to_join() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let hosts = two_hosts(dir.path());
    let first = cluster_process(&io, &hosts, 1, None);
    // The first is listening once it says whom it waits for (after 5 s), or sooner:
    // the second tries its port until it is taken.
    std::thread::sleep(Duration::from_millis(500));
    let second = cluster_process(&io, &hosts, 1, None);
    // Process 0 starts while a second that gives up would still be telling its peers.
    std::thread::sleep(Duration::from_millis(500));
    let zero = cluster_process(&io, &hosts, 0, None);
    let second = second.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{said}");
    assert!(
        said.contains("process 1 of this cluster is running there already"),
        "{said}"
    );
    let rows = rows_of([first, zero]);
    assert_eq!(rows, 1_003);
}

/// A cluster's secret (`--cluster-secret-file`): processes that hold the same one run; a
/// process started with another (or with none) is told at the join, with one line and
/// without waiting out the join's minute; a secret too short is refused before anything.
#[test]
fn a_cluster_secret_admits_only_its_holders() {
    let dir = tempfile::tempdir().unwrap();
    let io = inputs(dir.path());
    let toml = criteo_toml();
    let secret = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let ours = secret("ours", "0123456789abcdef0123456789abcdef\n");
    let theirs = secret("theirs", "fedcba9876543210fedcba9876543210");
    let short = secret("short", "tiny\n");
    let base = null_args(&io, &toml, &["--ranks", "2", "--batch-size", "10"]);
    let with = |file: &str| {
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        if !file.is_empty() {
            args.extend(["--cluster-secret-file".to_string(), file.to_string()]);
        }
        args
    };

    for c in spawn_cluster_with(dir.path(), 2, 1, |_| with(&ours)) {
        let out = c.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
    }

    for other in [theirs.as_str(), ""] {
        let mut cluster = spawn_cluster_with(dir.path(), 2, 1, |p| {
            with(if p == 0 { &ours } else { other })
        });
        let started = Instant::now();
        let dialer = cluster.pop().unwrap();
        let out = dialer.wait_with_output().unwrap();
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let _ = cluster[0].kill();
        assert!(!out.status.success(), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains("process 0"), "{stderr}");
        assert!(
            stderr.contains("did not prove the cluster's secret"),
            "{stderr}"
        );
        assert!(took < Duration::from_secs(20), "told after {took:?}");
    }

    let mut args = base.clone();
    args.extend(["--processes", "2", "--cluster-secret-file", &short]);
    let err = hydrant_err(&args);
    assert!(err.contains("at least 16"), "{err}");
    assert!(!err.contains("tiny"), "the secret is not printed: {err}");
}

/// Fitting deals each statistic to one worker to merge and finish, and hands every worker
/// the finished parameters: the state written is the same, byte for byte, on any layout,
/// for every kind of fitted step, over two passes (a step fitted after another).
#[test]
fn the_same_fitted_state_on_any_layout() {
    let dir = tempfile::tempdir().unwrap();
    let (input, _) = inputs(dir.path());
    let toml = dir.path().join("fitted.toml");
    std::fs::write(
        &toml,
        r#"name = "fitted"
label = { column = "label", type = "float32" }
batch_rows = 97

[[group]]
name = "dense"
kind = "dense"
columns = ["i0", "i1", "i2"]
steps = ["fill_null(0)", "log1p", "standardize", "min_max"]

[[group]]
name = "buckets"
kind = "ids"
columns = ["i3", "i4"]
steps = ["fill_null(0)", "quantile_bucketize(8)"]

[[group]]
name = "ids"
kind = "ids"
columns = ["c0", "c3", "c4", "c9"]
steps = ["vocab(max_size=40, min_count=2)"]
"#,
    )
    .unwrap();
    let fit = |name: &str, (processes, workers): (usize, usize)| {
        let out = dir.path().join(format!("{name}.json"));
        let (toml, input, out_s) = (
            toml.to_str().unwrap(),
            input.to_str().unwrap(),
            out.to_str().unwrap(),
        );
        let args = ["fit", "--pipeline", toml, "--input", input, "--out", out_s];
        let versions: Vec<serde_json::Value> = if processes == 1 {
            let w = workers.to_string();
            let mut args = args.to_vec();
            args.extend(["--workers", &w]);
            vec![hydrant_ok(&args)["version"].clone()]
        } else {
            run_cluster(dir.path(), processes, workers, &args)
                .iter()
                .map(|r| r["version"].clone())
                .collect()
        };
        (std::fs::read(&out).unwrap(), versions)
    };
    let (want, versions) = fit("1x1", (1, 1));
    let version = &versions[0];
    let state: serde_json::Value = serde_json::from_slice(&want).unwrap();
    let vocab = &state["params"]["ids/c9/0"]["vocab"]["values"];
    assert_eq!(vocab.as_array().map(Vec::len), Some(40), "{vocab}");
    for layout in [(1, 2), (1, 3), (2, 2), (3, 1)] {
        let tag = format!("{}x{}", layout.0, layout.1);
        let (got, versions) = fit(&tag, layout);
        assert!(got == want, "{tag}: another state than 1x1");
        assert!(versions.iter().all(|v| v == version), "{tag}: {versions:?}");
    }
}
