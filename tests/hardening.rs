//! Hostile arguments and inputs: each gets one line and a non-zero exit within seconds —
//! no panic, abort, signal or hang.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use common::*;
use hydrant::operators::{FittedParam, FittedState, Vocabulary};

/// `hydrant_err`, also asserting it took under `limit`.
fn err_within(limit: Duration, args: &[&str]) -> String {
    let t = Instant::now();
    let err = hydrant_err(args);
    assert!(t.elapsed() < limit, "{args:?} took {:?}", t.elapsed());
    err
}

/// The one line of stderr of `hydrant ARGS`, which must exit non-zero within `limit`: one
/// still running then (a server that took what it should refuse) is killed and fails.
fn refused_within(limit: Duration, args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hydrant"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{args:?} still runs after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "{args:?} should fail");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    stderr
}

#[test]
fn arguments_are_checked_before_anything_runs() {
    let (_dir, input) = small_criteo();
    let toml = criteo_toml();
    let base = ["--pipeline", toml.to_str().unwrap(), "--input", &input];
    for (command, extra, needle) in [
        (
            "run",
            vec!["--batch-size", "18446744073709551615"],
            "--batch-size",
        ),
        ("run", vec!["--batch-size", "1000000000000"], "--batch-size"),
        ("run", vec!["--batch-size", "10000000"], "--max-batch-bytes"),
        (
            "run",
            vec!["--batch-size", "4096", "--max-batch-bytes", "1000000"],
            "more than --max-batch-bytes 1000000",
        ),
        (
            "serve",
            vec!["--batch-size", "10000000"],
            "--max-batch-bytes",
        ),
        (
            "run",
            vec!["--prefetch", "18446744073709551615"],
            "--prefetch",
        ),
        ("run", vec!["--prefetch", "0"], "--prefetch"),
        ("run", vec!["--step-ms", "NaN"], "--step-ms"),
        ("run", vec!["--step-ms", "inf"], "--step-ms"),
        ("run", vec!["--step-ms=-1"], "--step-ms"),
        ("run", vec!["--learning-rate", "NaN"], "--learning-rate"),
        // An epoch's rows are numbered in 64 bits: 2,000 rows give 9.2e15 epochs.
        (
            "run",
            vec![
                "--epochs",
                "18446744073709551615",
                "--start-epoch",
                "18446744073709551614",
            ],
            "at most 9223372036854775 epochs",
        ),
        (
            "serve",
            vec!["--epochs", "9223372036854776"],
            "at most 9223372036854775 epochs",
        ),
        ("run", vec!["--workers", "0"], "--workers"),
        ("run", vec!["--workers", "100000"], "--workers"),
        ("run", vec!["--ranks", "0"], "--ranks"),
        ("run", vec!["--shuffle-window", "0"], "--shuffle-window"),
        // A window without --shuffle would silently not shuffle.
        (
            "run",
            vec!["--shuffle-window", "100"],
            "not provided: --shuffle",
        ),
        (
            "serve",
            vec!["--max-message-bytes", "0"],
            "--max-message-bytes",
        ),
        ("serve", vec!["--absent-after", "0"], "--absent-after"),
        (
            "serve",
            vec!["--token-ttl", "18446744073709551615"],
            "--token-ttl",
        ),
        ("serve", vec!["--token-ttl", "366d"], "from 1 to 31536000"),
        (
            "serve",
            vec!["--advertise", "bad host:%%"],
            "expected HOST:PORT",
        ),
        ("serve", vec!["--absent-after", "1e9"], "--absent-after"),
    ] {
        let mut args = vec![command];
        args.extend(base);
        args.extend(extra.iter());
        let err = err_within(Duration::from_secs(10), &args);
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
}

#[test]
fn workers_beyond_the_work_are_not_started() {
    let (_dir, input) = small_criteo();
    let toml = criteo_toml();
    let t = Instant::now();
    let out = hydrant(&[
        "run",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        &input,
        "--workers",
        "1000",
        "--ranks",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(
        stderr.contains("warning: --workers 1000 is more than"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // One unit of input, two ranks: two workers have something to do.
    assert_eq!(summary["workers"], 2, "{summary}");
    assert_eq!(summary["rows"], 2_000);
}

/// More ranks than threads can be had: the null sink reads them from a bounded number of
/// threads (one a rank aborted the process at about 96,000 here), and the trainer demo,
/// which needs a thread a rank, refuses them up front.
#[test]
fn ranks_beyond_the_threads_to_be_had_are_read_all_the_same() {
    let (_dir, input) = small_criteo();
    let toml = criteo_toml();
    let args = run_of(&toml, Path::new(&input), &["--ranks", "100000"]);
    let summary = hydrant_ok(&[&args[..], &["--batch-size", "1"]].concat());
    assert_eq!(summary["rows"], 2_000, "{}", summary["rows"]);
    assert_eq!(summary["batches"], 100_000, "{}", summary["batches"]);
    let steps = summary["steps_per_rank"].as_array().unwrap();
    assert!(steps.len() == 100_000 && steps.iter().all(|s| s == 1));
    let err = err_within(
        Duration::from_secs(10),
        &[&args[..], &["--batch-size", "1", "--sink", "train:logreg"]].concat(),
    );
    assert!(err.contains("at most 1024 ranks"), "{err}");
}

/// Each rank a process serves costs memory before any row (its queue, slot and step
/// buffers): one process takes at most 131,072, and more are refused up front. A step of
/// all ranks far larger than the input is warned about: nearly everything delivered
/// would be padding.
#[test]
fn ranks_past_a_process_s_bound_are_refused_and_a_world_of_padding_is_warned() {
    let (_dir, input) = small_criteo();
    let toml = criteo_toml();
    let args = run_of(&toml, Path::new(&input), &["--ranks", "131073"]);
    let err = err_within(Duration::from_secs(10), &args);
    assert!(
        err.contains("gives a process 131073 ranks: at most 131072 a process"),
        "{err}"
    );
    let out = hydrant(&run_of(&toml, Path::new(&input), &["--ranks", "300"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "warning: 1226800 of the 1228800 rows each epoch delivers are padding: --ranks 300 \
             × --batch-size 4096 is 1228800 rows a step, over 2000 input rows"
        ),
        "{stderr}"
    );
    // Each rank's batches in flight fit --max-batch-bytes, but all of them together would
    // take petabytes: refused before anything runs, not ended by the OOM killer.
    let args = run_of(
        &toml,
        Path::new(&input),
        &["--ranks", "131072", "--batch-size", "1048576"],
    );
    let err = err_within(Duration::from_secs(10), &args);
    assert!(
        err.contains("(131072 in this process)") && err.contains("bytes of memory"),
        "{err}"
    );
    // A few rows over a few ranks, as tests and demos run them, is no cause for a warning.
    let out = hydrant(&run_of(&toml, Path::new(&input), &["--ranks", "3"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("padding"),
        "{stderr}"
    );
}

#[test]
fn a_panic_in_any_operator_ends_the_job_with_one_line() {
    let (_dir, input) = small_criteo();
    let toml = criteo_toml();
    for op in ["fit", "source", "featurize", "place", "own", "sink"] {
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_hydrant"))
            .args([
                "run",
                "--pipeline",
                toml.to_str().unwrap(),
                "--input",
                &input,
                "--ranks",
                "2",
                "--workers",
                "2",
            ])
            .env(hydrant::operators::running::FAIL_POINT_ENV, op)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert!(!out.status.success(), "{op}: {stderr}");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{op}: {:?}",
            t.elapsed()
        );
        assert_eq!(stderr.lines().count(), 1, "{op}: {stderr}");
        assert!(
            stderr.contains("panicked in operator `") && stderr.contains(&format!("`{op}`")),
            "{op}: {stderr}"
        );
        assert!(stderr.contains("work-"), "names the worker: {stderr}");
    }
}

/// Writes `batches` as an Arrow IPC stream (`stream`) or file.
fn write_ipc(path: &Path, batches: &[RecordBatch], stream: bool) {
    let file = std::fs::File::create(path).unwrap();
    let schema = batches[0].schema();
    if stream {
        let mut w = arrow::ipc::writer::StreamWriter::try_new(file, &schema).unwrap();
        batches.iter().for_each(|b| w.write(b).unwrap());
        w.finish().unwrap();
    } else {
        let mut w = arrow::ipc::writer::FileWriter::try_new(file, &schema).unwrap();
        batches.iter().for_each(|b| w.write(b).unwrap());
        w.finish().unwrap();
    }
}

#[test]
fn inputs_that_are_not_plain_files_or_change_while_read() {
    let (dir, input) = small_criteo();
    let toml = criteo_toml();
    let toml = toml.to_str().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();

    // A FIFO would block the open forever.
    let fifo = p("fifo.parquet");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let err = err_within(
        Duration::from_secs(10),
        &["run", "--pipeline", toml, "--input", &fifo],
    );
    assert!(
        err.contains("fifo.parquet") && err.contains("not a regular file"),
        "{err}"
    );
    let err = err_within(
        Duration::from_secs(10),
        &["run", "--pipeline", toml, "--input", "/dev/zero"],
    );
    assert!(err.contains("not a regular file"), "{err}");
    // A cluster's hostfile too.
    let err = err_within(
        Duration::from_secs(10),
        &[
            "run",
            "--pipeline",
            toml,
            "--input",
            &input,
            "--processes",
            "2",
            "--process",
            "1",
            "--hostfile",
            &fifo,
        ],
    );
    assert!(
        err.contains("hostfile") && err.contains("not a regular file"),
        "{err}"
    );

    // Hidden and `_` files in a folder are not data.
    std::fs::create_dir(p("folder")).unwrap();
    std::fs::copy(&input, p("folder/part-0.parquet")).unwrap();
    std::fs::write(p("folder/.part-0.parquet.crc"), "junk").unwrap();
    std::fs::write(p("folder/.hidden.parquet"), "junk").unwrap();
    std::fs::write(p("folder/_SUCCESS"), "").unwrap();
    std::fs::write(p("folder/_metadata.parquet"), "junk").unwrap();
    std::fs::create_dir(p("folder/_temporary")).unwrap();
    std::fs::copy(&input, p("folder/_temporary/part-1.parquet")).unwrap();
    let s = hydrant_ok(&["run", "--pipeline", toml, "--input", &p("folder")]);
    assert_eq!(s["rows"], 2_000);
    // A sub-folder of data (a partitioned layout) is not left out without a word.
    std::fs::create_dir(p("folder/date=1")).unwrap();
    std::fs::copy(&input, p("folder/date=1/part-0.parquet")).unwrap();
    let err = hydrant_err(&["run", "--pipeline", toml, "--input", &p("folder")]);
    assert!(
        err.contains("sub-folder") && err.contains("date=1") && err.lines().count() == 1,
        "{err}"
    );
    std::fs::remove_dir_all(p("folder/date=1")).unwrap();

    // Arrow IPC streams are read, as IPC files are, and give the same rows.
    let batches = read_parquet(Path::new(&input));
    write_ipc(Path::new(&p("rows.arrows")), &batches, true);
    write_ipc(Path::new(&p("rows.arrow")), &batches, false);
    let parquet = hydrant_ok(&["run", "--pipeline", toml, "--input", &input]);
    for f in ["rows.arrows", "rows.arrow"] {
        let s = hydrant_ok(&["run", "--pipeline", toml, "--input", &p(f)]);
        assert_eq!(s["rows"], parquet["rows"], "{f}");
        // A run of a few milliseconds: its stall fraction, rounded from stalls already
        // rounded to the millisecond, used to read above 1 now and then.
        let stalled = s["stall_fraction"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&stalled), "{s}");
    }

    // Truncated after its footer was read (as a run or a server would have): an error
    // naming the file, not SIGBUS.
    for (f, stream) in [
        ("cut.arrow", Some(false)),
        ("cut.arrows", Some(true)),
        ("cut.parquet", None),
    ] {
        match stream {
            Some(stream) => write_ipc(Path::new(&p(f)), &batches, stream),
            None => {
                std::fs::copy(&input, p(f)).unwrap();
            }
        }
        let inputs = hydrant::source::Inputs::open(&[p(f).into()], 500).unwrap();
        let len = std::fs::metadata(p(f)).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(p(f))
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let err = inputs
            .units()
            .iter()
            .flat_map(|u| match inputs.read(u) {
                Ok(batches) => batches.collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            })
            .find_map(|b| b.err())
            .unwrap_or_else(|| panic!("{f}: reading a truncated file succeeded"));
        let err = err.to_string();
        assert!(err.contains(f), "{err}");
    }
    // A file that lost whole batches ends with an error, never with rows missing.
    let mut fewer = batches.clone();
    fewer.truncate(batches.len() / 2);
    write_ipc(Path::new(&p("fewer.arrows")), &batches, true);
    let inputs = hydrant::source::Inputs::open(&[p("fewer.arrows").into()], 500).unwrap();
    write_ipc(Path::new(&p("fewer.arrows")), &fewer, true);
    // Its size changed, so reading it fails at once; a rewrite of the same size would fail
    // at its end, on the row count its footer gave.
    let err = inputs.read(&inputs.units()[0]).err().unwrap().to_string();
    assert!(
        err.contains("when it was opened: it was truncated or rewritten"),
        "{err}"
    );
    // The same size (the stream padded with zeros, which read as its end): its
    // modification time.
    write_ipc(Path::new(&p("fewer.arrows")), &batches, true);
    let inputs = hydrant::source::Inputs::open(&[p("fewer.arrows").into()], 500).unwrap();
    let len = std::fs::metadata(p("fewer.arrows")).unwrap().len();
    write_ipc(Path::new(&p("fewer.arrows")), &fewer, true);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(p("fewer.arrows"))
        .unwrap();
    f.set_len(len).unwrap();
    let err = inputs.read(&inputs.units()[0]).err().unwrap().to_string();
    assert!(err.contains("was modified after it was opened"), "{err}");
    // Rewritten in place at the same length while a unit is read (a followed file written
    // over by a careless producer): the batch decoded after the write is not handed on,
    // where the rows of two files used to be delivered as one, without an error.
    std::fs::copy(&input, p("rewritten.parquet")).unwrap();
    let inputs = hydrant::source::Inputs::open(&[p("rewritten.parquet").into()], 500).unwrap();
    let mut batches = inputs.read(&inputs.units()[0]).unwrap();
    batches.next().unwrap().unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(p("rewritten.parquet"))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"PAR1", 0).unwrap();
    let err = batches.next().unwrap().unwrap_err().to_string();
    assert!(err.contains("changed while it was read"), "{err}");
}

#[test]
fn group_names_that_collide_or_are_unsafe_are_refused_before_reading() {
    let (dir, input) = small_criteo();
    let text = std::fs::read_to_string(criteo_toml()).unwrap();
    assert!(text.contains("name = \"dense\""));
    for name in [
        "rank",
        "epoch",
        "step",
        "row_id",
        "is_padding",
        "label",
        "",
        "a/b",
        "ids",
    ] {
        let path = dir.path().join("p.toml");
        std::fs::write(
            &path,
            text.replace("name = \"dense\"", &format!("name = \"{name}\"")),
        )
        .unwrap();
        let err = err_within(
            Duration::from_secs(5),
            &[
                "run",
                "--pipeline",
                path.to_str().unwrap(),
                "--input",
                &input,
            ],
        );
        assert!(err.contains("p.toml"), "{name}: {err}");
        if !name.is_empty() {
            assert!(err.contains(&format!("group `{name}`")), "{name}: {err}");
        }
    }
}

#[test]
fn a_state_is_checked_against_its_version_and_invariants() {
    let (dir, input) = small_criteo();
    let toml = criteo_toml();
    let toml = toml.to_str().unwrap();
    let state = dir.path().join("state.json");
    let state_s = state.to_str().unwrap();
    hydrant_ok(&[
        "fit",
        "--pipeline",
        toml,
        "--input",
        &input,
        "--out",
        state_s,
    ]);
    let fitted = hydrant::read_state(&state).unwrap();
    let run = |path: &str| {
        err_within(
            Duration::from_secs(10),
            &[
                "run",
                "--pipeline",
                toml,
                "--input",
                &input,
                "--state",
                path,
            ],
        )
    };

    // Parameters edited, version kept.
    let mut edited = fitted.clone();
    let (key, _) = edited
        .params
        .iter()
        .find(|(_, p)| matches!(p, FittedParam::Standardize { .. }))
        .map(|(k, p)| (k.clone(), p.clone()))
        .unwrap();
    edited.params.insert(
        key.clone(),
        FittedParam::Standardize {
            mean: 123.0,
            std: 1.0,
        },
    );
    std::fs::write(&state, edited.to_json()).unwrap();
    let err = run(state_s);
    assert!(
        err.contains("state.json") && err.contains("changed after fitting"),
        "{err}"
    );

    // Versioned correctly, but impossible.
    let rebuilt = |key: &str, param: FittedParam| {
        let mut params: BTreeMap<String, FittedParam> = fitted.params.clone();
        params.insert(key.to_string(), param);
        FittedState::new(&fitted.pipeline, params).to_json()
    };
    std::fs::write(
        &state,
        rebuilt(
            &key,
            FittedParam::Standardize {
                mean: 0.0,
                std: -1.0,
            },
        ),
    )
    .unwrap();
    let err = run(state_s);
    assert!(err.contains(&key) && err.contains("std >= 0"), "{err}");

    let (vocab_key, _) = fitted
        .params
        .iter()
        .find(|(_, p)| matches!(p, FittedParam::Vocab { .. }))
        .unwrap();
    let values: Vocabulary = ["a", "b", "a"].into_iter().collect();
    std::fs::write(&state, rebuilt(vocab_key, FittedParam::Vocab { values })).unwrap();
    let err = run(state_s);
    assert!(err.contains("`a` appears twice"), "{err}");

    std::fs::write(
        &state,
        rebuilt(
            &key,
            FittedParam::Quantiles {
                boundaries: vec![2.0, 1.0],
            },
        ),
    )
    .unwrap();
    let err = run(state_s);
    assert!(err.contains("ascending"), "{err}");

    // Not a regular file.
    for path in ["/dev/null", dir.path().to_str().unwrap()] {
        let err = run(path);
        assert!(err.contains("not a regular file"), "{path}: {err}");
    }
}

/// A state fitted on another chain is refused at start for followed and pushed input, as
/// for files. It used to be taken: the server started, then skipped every followed file
/// (and refused every push) for it, and the stream went on empty.
#[test]
fn a_state_fitted_on_another_chain_is_refused_at_start_for_every_input() {
    let (dir, input) = small_criteo();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let fitted = std::fs::read_to_string(criteo_toml()).unwrap();
    std::fs::write(path("fitted.toml"), &fitted).unwrap();
    let state = path("state.json");
    hydrant_ok(&[
        "fit",
        "--pipeline",
        &path("fitted.toml"),
        "--input",
        &input,
        "--out",
        &state,
    ]);
    let changed = fitted.replace("fill_null(0)", "fill_null(1)");
    assert_ne!(changed, fitted);
    std::fs::write(path("changed.toml"), &changed).unwrap();
    std::fs::write(
        path("pushed.toml"),
        format!("input = \"flight\"\n{changed}"),
    )
    .unwrap();
    std::fs::create_dir(path("in")).unwrap();
    let (changed, pushed, folder) = (path("changed.toml"), path("pushed.toml"), path("in"));
    let cases: [&[&str]; 4] = [
        &[
            "serve",
            "--pipeline",
            &changed,
            "--follow",
            &folder,
            "--listen",
            "127.0.0.1:0",
        ],
        &["run", "--pipeline", &changed, "--follow", &folder],
        &["serve", "--pipeline", &pushed, "--listen", "127.0.0.1:0"],
        &["run", "--pipeline", &changed, "--input", &input],
    ];
    for args in cases {
        let args = [args, &["--state", &state]].concat();
        let err = refused_within(Duration::from_secs(10), &args);
        assert!(
            err.contains("fill_null(0)") && err.contains("refit it"),
            "{args:?}: {err}"
        );
    }
}

/// An output named like something the command reads (the input, the pipeline, the
/// state; a sink folder that is or holds an input) is refused before anything runs, and
/// what was read is left as it was: these used to be overwritten, exit 0. So is a
/// summary whose folder does not exist, which used to fail only after the whole job.
#[test]
fn outputs_that_would_overwrite_what_is_read_are_refused_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (input, state) = folder_with_state(dir.path(), &[1_000], 61);
    let pipeline = dir.path().join("p.toml");
    std::fs::copy(criteo_toml(), &pipeline).unwrap();
    let part = input.join("part-0.parquet");
    let bytes = |p: &Path| std::fs::read(p).unwrap();
    let before = [bytes(&part), bytes(&state), bytes(&pipeline)];
    let (p, i, s) = (
        pipeline.to_str().unwrap(),
        input.to_str().unwrap(),
        state.to_str().unwrap(),
    );
    let run = ["run", "--pipeline", p, "--input", i, "--state", s];
    let part_s = part.to_str().unwrap();
    let sink = format!("parquet:{i}");
    for (args, needle) in [
        (
            vec!["--summary", part_s],
            "is a data file of the --input folder",
        ),
        (vec!["--summary", s], "is the --state this command reads"),
        (vec!["--summary", p], "is the --pipeline this command reads"),
        (vec!["--sink", &sink], "is the --input"),
        (
            vec!["--summary", "no/such/folder/s.json"],
            "its folder does not exist",
        ),
    ] {
        let err = err_within(Duration::from_secs(10), &[&run[..], &args[..]].concat());
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let parent = format!("parquet:{}", dir.path().display());
    let err = err_within(
        Duration::from_secs(10),
        &[&run[..], &["--sink", &parent]].concat(),
    );
    assert!(err.contains("holds the --input"), "{err}");
    let fit = ["fit", "--pipeline", p, "--input", i, "--out", p];
    let err = err_within(Duration::from_secs(10), &fit);
    assert!(
        err.contains("--out") && err.contains("is the --pipeline"),
        "{err}"
    );
    assert_eq!(before, [bytes(&part), bytes(&state), bytes(&pipeline)]);
    assert_eq!(
        std::fs::read_dir(&input).unwrap().count(),
        1,
        "nothing written into it"
    );
}

/// A column whose values overflow f64 sums (±1e308) cannot be fitted: `fit` and a `run`
/// that fits first refuse it with one line naming the step, where `fit` used to write
/// `"std": null` (JSON has no infinity) that `run` then refused, and `min_max` made 999
/// of 1,000 values infinite. A constant column fits a std of exactly 0, and
/// standardizes to 0, where rounding noise used to make it about 1.
#[test]
fn statistics_that_overflow_are_refused_and_a_constant_column_standardizes_to_zero() {
    use arrow::array::{Float32Array, Float64Array};
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    let batch = |x: Vec<f64>| {
        let label = Float32Array::from(vec![0.0; x.len()]);
        RecordBatch::try_from_iter([
            (
                "label",
                std::sync::Arc::new(label) as arrow::array::ArrayRef,
            ),
            ("x", std::sync::Arc::new(Float64Array::from(x)) as _),
        ])
        .unwrap()
    };
    let mut huge: Vec<f64> = (0..1000).map(|i| i as f64 / 100.0).collect();
    (huge[3], huge[4]) = (1e308, -1e308);
    write_ipc(&p("huge.arrow"), &[batch(huge)], false);
    write_ipc(&p("const.arrow"), &[batch(vec![0.1; 10_000])], false);
    for step in ["standardize", "min_max"] {
        let toml = p(&format!("{step}.toml"));
        std::fs::write(
            &toml,
            format!(
                "name = \"x\"\nlabel = {{ column = \"label\", type = \"float32\" }}\n\
                 [[group]]\nname = \"g\"\nkind = \"dense\"\ncolumns = [\"x\"]\n\
                 steps = [\"{step}\"]\n"
            ),
        )
        .unwrap();
        let (toml, out) = (toml.to_str().unwrap(), p("s.json"));
        let huge = p("huge.arrow");
        let fit = ["fit", "--pipeline", toml, "--input", huge.to_str().unwrap()];
        let err = err_within(
            Duration::from_secs(10),
            &[&fit[..], &["--out", out.to_str().unwrap()]].concat(),
        );
        assert!(
            err.contains("`g/x/0`") && err.contains("too large to fit"),
            "{step}: {err}"
        );
        assert!(!out.exists(), "no state is written");
        let run = run_of(Path::new(toml), &huge, &[]);
        let err = err_within(Duration::from_secs(10), &run);
        assert!(err.contains("too large to fit"), "{step}: {err}");
    }
    let (toml, constant) = (p("standardize.toml"), p("const.arrow"));
    let sink = format!("parquet:{}", p("out").display());
    hydrant_ok(&run_of(&toml, &constant, &["--sink", &sink]));
    let mut values = Vec::new();
    for part in std::fs::read_dir(p("out")).unwrap() {
        let file = std::fs::File::open(part.unwrap().path()).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(file, 1024);
        for b in reader.unwrap() {
            let b = b.unwrap();
            let dense = b.column_by_name("g").unwrap();
            let list = dense
                .as_any()
                .downcast_ref::<arrow::array::FixedSizeListArray>()
                .unwrap();
            let f = list
                .values()
                .as_any()
                .downcast_ref::<Float32Array>()
                .unwrap();
            values.extend(f.values().iter().copied());
        }
    }
    assert!(values.len() >= 10_000 && values.iter().all(|&v| v == 0.0));
}

/// A pipeline that takes pushed input, given to `run` or `fit` without files, says where
/// its rows come from instead of only "no --input given".
#[test]
fn a_pushed_pipeline_without_files_says_it_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("pushed.toml");
    std::fs::write(
        &toml,
        "name = \"pushed\"\ninput = \"flight\"\n[[group]]\nname = \"d\"\nkind = \"dense\"\n\
         columns = [\"x\"]\nsteps = [\"standardize\"]\n",
    )
    .unwrap();
    let toml = toml.to_str().unwrap();
    for command in ["run", "fit"] {
        let mut args = vec![command, "--pipeline", toml];
        if command == "fit" {
            args.extend(["--out", "unused.json"]);
        }
        let err = err_within(Duration::from_secs(10), &args);
        assert!(
            err.contains("pipeline `pushed` takes pushed input") && err.contains("hydrant serve"),
            "{command}: {err}"
        );
    }
}

/// A pipeline whose `event_time` names a column the input lacks, or one that is not a
/// timestamp, is refused over files too, where it was taken without a word (a followed
/// folder of the same files is refused for it).
#[test]
fn an_event_time_column_that_is_missing_or_not_a_timestamp_is_refused() {
    let (dir, input) = small_criteo();
    let criteo = std::fs::read_to_string(criteo_toml()).unwrap();
    for (column, needle) in [
        (
            "nope",
            "event_time names column `nope`, which the input does not have",
        ),
        ("c0", "event_time column `c0` is"),
    ] {
        let toml = dir.path().join(format!("{column}.toml"));
        let named = format!("event_time = \"{column}\"\n");
        std::fs::write(&toml, criteo.replacen("\n", &format!("\n{named}"), 1)).unwrap();
        let err = err_within(
            Duration::from_secs(10),
            &run_of(&toml, Path::new(&input), &[]),
        );
        assert!(
            err.contains(needle) && err.contains("not a timestamp") == (column == "c0"),
            "{err}"
        );
    }
}

/// Input with no rows is delivered as empty epochs and fitted as nothing, as before, but
/// now with a warning: a zero-row export upstream otherwise goes unnoticed.
#[test]
fn an_input_with_no_rows_is_warned_about() {
    use arrow::array::{Float32Array, Float64Array};
    let dir = tempfile::tempdir().unwrap();
    let empty = RecordBatch::try_from_iter([
        (
            "label",
            std::sync::Arc::new(Float32Array::from(Vec::<f32>::new())) as arrow::array::ArrayRef,
        ),
        (
            "x",
            std::sync::Arc::new(Float64Array::from(Vec::<f64>::new())) as _,
        ),
    ])
    .unwrap();
    let input = dir.path().join("empty.arrow");
    write_ipc(&input, &[empty], false);
    let toml = dir.path().join("p.toml");
    std::fs::write(
        &toml,
        "name = \"x\"\nlabel = { column = \"label\", type = \"float32\" }\n[[group]]\n\
         name = \"g\"\nkind = \"dense\"\ncolumns = [\"x\"]\nsteps = [\"standardize\"]\n",
    )
    .unwrap();
    let out = hydrant(&run_of(&toml, &input, &[]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: the input holds no rows"),
        "{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_slice(
        out.stdout
            .split(|&b| b == b'\n')
            .rfind(|l| !l.is_empty())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(summary["rows"], 0, "{summary}");
}
