//! Hostile inputs: files that are not plain files or change while read, a missing or
//! mistyped event-time column, no rows, and a pushed pipeline given no files — each told
//! in one line, never delivered mixed or short.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use arrow::array::RecordBatch;
use common::*;

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
    // Nor is a data file's name on a dangling link, a link loop or a pipe (found by a
    // hostile run: the folder's other rows were read, and these left out).
    for (name, reason) in [
        ("gone.parquet", "No such file"),
        ("loop.parquet", "symbolic links"),
        ("pipe.parquet", "not a regular file"),
    ] {
        let odd = p(&format!("folder/{name}"));
        match name {
            "gone.parquet" => std::os::unix::fs::symlink(p("nowhere.parquet"), &odd).unwrap(),
            "loop.parquet" => std::os::unix::fs::symlink(&odd, &odd).unwrap(),
            _ => assert!(Command::new("mkfifo").arg(&odd).status().unwrap().success()),
        }
        let err = hydrant_err(&["run", "--pipeline", toml, "--input", &p("folder")]);
        assert!(
            err.contains(name) && err.contains(reason) && err.lines().count() == 1,
            "{err}"
        );
        std::fs::remove_file(&odd).unwrap();
    }

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
    // Truncated while a unit is read: said as a truncation, whichever check sees it.
    std::fs::copy(&input, p("cut.parquet")).unwrap();
    let inputs = hydrant::source::Inputs::open(&[p("cut.parquet").into()], 500).unwrap();
    let mut batches = inputs.read(&inputs.units()[0]).unwrap();
    batches.next().unwrap().unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(p("cut.parquet"))
        .unwrap();
    f.set_len(f.metadata().unwrap().len() / 2).unwrap();
    let err = batches.next().unwrap().unwrap_err().to_string();
    assert!(
        err.contains("truncated or rewritten while it was read"),
        "{err}"
    );
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
