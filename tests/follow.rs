//! `hydrant serve --follow DIR` against the real server: what a followed folder admits.
//! Files that appear in it stream to the trainers as one endless epoch; folders, files
//! written in place, files put in place of admitted ones and a folder that cannot be
//! listed are each told and handled; `run --follow` delivers what a run over the same
//! files does. (Restarts are in `follow_restart.rs`.)

use std::path::Path;

mod common;
use common::folder_with_state;
use common::follow::{
    admitted, end, publish, read, serve_following, sorted_ids, status, status_with,
};

/// A folder that appears in the followed one (Spark's `write.parquet(dir)` renamed in) is
/// skipped and named, and not recorded: read as an input it was read once, as its files
/// were then (a part written into it later never came), and a restart after it was moved
/// away (as the message advises) must not find the stream changed.
#[test]
fn a_folder_in_the_followed_folder_is_skipped_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let (source, state) = folder_with_state(dir.path(), &[1_000, 1_000], 43);
    let (followed, state_dir) = (dir.path().join("followed"), dir.path().join("s"));
    std::fs::create_dir_all(&followed).unwrap();
    let sub = dir.path().join("b.parquet");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::copy(
        source.join("part-0.parquet"),
        sub.join("part-00000.parquet"),
    )
    .unwrap();
    let rt = common::pushed::runtime();
    rt.block_on(async {
        let (mut server, uri) = serve_following(&followed, &state, &state_dir);
        publish(&source.join("part-0.parquet"), &followed, "a.parquet");
        std::fs::rename(&sub, followed.join("b.parquet")).unwrap();
        publish(&source.join("part-1.parquet"), &followed, "c.parquet");
        admitted(&uri, 2).await;
        let s = status(&uri).await;
        assert_eq!(s["follow"]["skipped_files"], 1, "{s}");
        let skipped = s["follow"]["skipped"][0].to_string();
        assert!(
            skipped.contains("b.parquet is a folder")
                && !skipped.contains(dir.path().to_str().unwrap()),
            "{skipped}"
        );
        let _ = server.0.kill();
        let _ = server.0.wait();
    });
    std::fs::remove_dir_all(followed.join("b.parquet")).unwrap();
    rt.block_on(async {
        let (_server, uri) = serve_following(&followed, &state, &state_dir);
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read(&uri, 0, usize::MAX).await }
        });
        publish(&source.join("part-0.parquet"), &followed, "d.parquet");
        admitted(&uri, 3).await;
        end(&uri).await;
        let ranks = reader.await.unwrap();
        assert_eq!(sorted_ids(&ranks), (0..3_000).collect::<Vec<_>>());
    });
}

/// A new file renamed in under the name of one already admitted is not read, and said so
/// (status, log, metric); it used to be ignored without a word. A restart that must
/// replay the first file then names the cause: it was replaced since it was admitted.
#[test]
fn a_file_put_in_place_of_an_admitted_one_is_told_and_blocks_its_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (source, state) = folder_with_state(dir.path(), &[1_000, 700], 47);
    let (followed, state_dir) = (dir.path().join("followed"), dir.path().join("s"));
    std::fs::create_dir_all(&followed).unwrap();
    let rt = common::pushed::runtime();
    rt.block_on(async {
        let (mut server, uri) = serve_following(&followed, &state, &state_dir);
        publish(&source.join("part-0.parquet"), &followed, "a.parquet");
        admitted(&uri, 1).await;
        publish(&source.join("part-1.parquet"), &followed, "a.parquet");
        let mut s = status(&uri).await;
        for _ in 0..400 {
            if s["follow"]["skipped_files"] == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            s = status(&uri).await;
        }
        let skipped = s["follow"]["skipped"][0].to_string();
        assert!(
            skipped.contains("a.parquet") && skipped.contains("put in its place"),
            "{s}"
        );
        assert_eq!(
            (s["follow"]["files"].as_u64(), s["rows_in"].as_u64()),
            (Some(1), Some(1_000))
        );
        let _ = server.0.kill();
        let _ = server.0.wait();
    });
    rt.block_on(async {
        let (_server, uri) = serve_following(&followed, &state, &state_dir);
        let mut failed = serde_json::Value::Null;
        for _ in 0..400 {
            failed = status(&uri).await["replay_failed"].clone();
            if !failed.is_null() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        let failed = failed.to_string();
        assert!(
            failed.contains("a.parquet is") && failed.contains("changed or replaced since"),
            "{failed}"
        );
    });
}

/// A followed folder renamed away while served admits nothing and says why in `status`
/// (with no server path in it); renamed back, it is followed again from where it was,
/// and every row of both files arrives once.
#[test]
fn a_followed_folder_that_cannot_be_listed_is_reported_until_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let (source, state) = folder_with_state(dir.path(), &[1_000, 1_000], 47);
    let (followed, state_dir) = (dir.path().join("followed"), dir.path().join("s"));
    let away = dir.path().join("away");
    std::fs::create_dir_all(&followed).unwrap();
    common::pushed::runtime().block_on(async {
        let (_server, uri) = serve_following(&followed, &state, &state_dir);
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read(&uri, 0, usize::MAX).await }
        });
        publish(&source.join("part-0.parquet"), &followed, "a.parquet");
        let s = admitted(&uri, 1).await;
        assert_eq!(s["follow"]["folder_error"], serde_json::Value::Null, "{s}");
        std::fs::rename(&followed, &away).unwrap();
        let s = status_with(&uri, "folder_error").await;
        let why = s["follow"]["folder_error"].as_str().unwrap_or_default();
        assert!(
            why.contains("the followed folder cannot be listed")
                && !why.contains(dir.path().to_str().unwrap()),
            "{s}"
        );
        publish(&source.join("part-1.parquet"), &away, "b.parquet");
        std::fs::rename(&away, &followed).unwrap();
        let s = admitted(&uri, 2).await;
        assert_eq!(s["follow"]["folder_error"], serde_json::Value::Null, "{s}");
        end(&uri).await;
        let ranks = reader.await.unwrap();
        assert_eq!(sorted_ids(&ranks), (0..2_000).collect::<Vec<_>>());
    });
}

/// Found by a hostile run: one full disk under the state directory stopped a followed
/// folder for good (the server stayed up, every trainer was refused). Now an admission
/// that cannot be recorded waits, said in `status` (naming no server path), and the
/// files are admitted once there is room: every row once. Needs a tmpfs to fill, so root.
#[test]
fn a_full_state_disk_holds_admissions_until_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let (source, state) = folder_with_state(dir.path(), &[1_000, 1_000], 53);
    let (followed, disk) = (dir.path().join("followed"), dir.path().join("disk"));
    std::fs::create_dir_all(&followed).unwrap();
    std::fs::create_dir_all(&disk).unwrap();
    let Some(_mounted) = common::small_tmpfs(&disk) else {
        return;
    };
    let filler = disk.join("filler");
    common::pushed::runtime().block_on(async {
        let (_server, uri) = serve_following(&followed, &state, &disk.join("s"));
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read(&uri, 0, usize::MAX).await }
        });
        // Fill the disk (the write stops short when it is full).
        let _ = std::fs::write(&filler, vec![0u8; 2 << 20]);
        publish(&source.join("part-0.parquet"), &followed, "a.parquet");
        let s = status_with(&uri, "record_error").await;
        let why = s["follow"]["record_error"].as_str().unwrap_or_default();
        assert!(
            why.contains("--state-dir/follow.manifest")
                && why.contains("No space left")
                && !why.contains(dir.path().to_str().unwrap()),
            "{s}"
        );
        assert_eq!(s["follow"]["files"], 0, "{s}");
        std::fs::remove_file(&filler).unwrap();
        publish(&source.join("part-1.parquet"), &followed, "b.parquet");
        let s = admitted(&uri, 2).await;
        assert_eq!(s["follow"]["record_error"], serde_json::Value::Null, "{s}");
        end(&uri).await;
        let ranks = reader.await.unwrap();
        assert_eq!(sorted_ids(&ranks), (0..2_000).collect::<Vec<_>>());
    });
}

/// A careless writer: files written in place, as pandas' `to_parquet` or `cp` do, seen by
/// the server while they grow. A half-written Parquet file (no footer yet) used to be
/// admitted at the next poll, found unreadable and skipped for good; now it is admitted
/// once it ends with its footer, whole.
#[test]
fn a_file_written_in_place_is_admitted_whole_once_written() {
    let dir = tempfile::tempdir().unwrap();
    let (source, state) = folder_with_state(dir.path(), &[3_000, 3_000], 47);
    let (folder, state_dir) = (dir.path().join("followed"), dir.path().join("state-dir"));
    std::fs::create_dir_all(&folder).unwrap();
    let rt = common::pushed::runtime();
    let got = rt.block_on(async {
        let (_server, uri) = serve_following(&folder, &state, &state_dir);
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read(&uri, 0, usize::MAX).await }
        });
        for i in 0..2 {
            let bytes = std::fs::read(source.join(format!("part-{i}.parquet"))).unwrap();
            let path = folder.join(format!("p{i}.parquet"));
            let mut file = std::fs::File::create(&path).unwrap();
            // Half, a pause of many polls (shorter than the settling time), the rest.
            std::io::Write::write_all(&mut file, &bytes[..bytes.len() / 2]).unwrap();
            file.sync_all().unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            std::io::Write::write_all(&mut file, &bytes[bytes.len() / 2..]).unwrap();
        }
        let s = admitted(&uri, 2).await;
        assert_eq!(s["follow"]["skipped_files"], 0, "{s}");
        // A name that is not UTF-8 is not admitted, and says so (it used to be ignored).
        use std::os::unix::ffi::OsStrExt;
        let odd = std::ffi::OsStr::from_bytes(b"odd-\xff.parquet");
        std::fs::copy(source.join("part-0.parquet"), folder.join(odd)).unwrap();
        let mut skipped = serde_json::Value::Null;
        for _ in 0..200 {
            skipped = status(&uri).await["follow"]["skipped"].clone();
            if skipped[0]["error"]
                .as_str()
                .is_some_and(|e| e.contains("not UTF-8"))
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(skipped.to_string().contains("not UTF-8"), "{skipped}");
        // An IPC stream that never gets its end-of-stream marker: after the settling time
        // its whole messages are admitted, and it is listed for what may be missing.
        let batches = common::read_parquet(&source.join("part-0.parquet"));
        let mut bytes = Vec::new();
        let mut w =
            arrow::ipc::writer::StreamWriter::try_new(&mut bytes, &batches[0].schema()).unwrap();
        batches.iter().for_each(|b| w.write(b).unwrap());
        w.finish().unwrap();
        drop(w);
        std::fs::write(folder.join("p2.arrow"), &bytes[..bytes.len() - 8]).unwrap();
        let s = admitted(&uri, 3).await;
        assert!(
            s["follow"]["skipped"]
                .to_string()
                .contains("p2.arrow was not whole"),
            "{s}"
        );
        end(&uri).await;
        reader.await.unwrap()
    });
    assert_eq!(sorted_ids(&got), (0..9_000).collect::<Vec<_>>());
}

/// `run --follow`: the files in the folder at start and one published while it runs are
/// featurized as a run over the same files is (the same rows under the same row ids,
/// each once), until SIGTERM ends the input and pads the last step.
#[test]
fn run_follow_delivers_what_a_run_over_the_same_files_does() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, state) = folder_with_state(dir.path(), &[3000, 2000], 1);
    let late = common::gen_criteo(dir.path(), 1500, 7);
    let (out, state_dir) = (dir.path().join("out"), dir.path().join("sd"));
    let toml = common::criteo_toml();
    // `run --follow` of the folder, recorded in `state_dir`, into the Parquet folder `to`.
    let follow = |to: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_hydrant"))
            .args(["run", "--pipeline", toml.to_str().unwrap(), "--follow"])
            .args([
                &folder,
                &"--state".into(),
                &state,
                &"--state-dir".into(),
                &state_dir,
            ])
            .args(["--ranks", "2", "--batch-size", "500", "--sink"])
            .arg(format!("parquet:{}", to.display()))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let child = follow(&out);
    publish(&late, &folder, "part-2.parquet");
    // SIGTERM ends the input once the late file's admission is recorded.
    let manifest = state_dir.join(hydrant::serve::MANIFEST_FILE);
    let admitted = || {
        std::fs::read_to_string(&manifest)
            .is_ok_and(|m| m.contains(r#"{"event":"end","file":"part-2.parquet","rows":1500}"#))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !admitted() {
        assert!(
            std::time::Instant::now() < deadline,
            "part-2 was never admitted"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let term = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["rows"], 6500, "{summary}");
    assert_eq!(summary["files"], 3, "{summary}");
    assert_eq!(summary["steps_per_rank"], 7, "{summary}");
    assert_eq!(summary["padded_rows"], 500, "{summary}");

    let reference = dir.path().join("ref");
    common::hydrant_ok(&[
        "run",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        folder.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--ranks",
        "2",
        "--batch-size",
        "500",
        "--sink",
        &format!("parquet:{}", reference.display()),
    ]);
    let (got, want) = (common::read_output(&out), common::read_output(&reference));
    assert_eq!(got.len(), 6500);
    assert!(got == want, "run --follow featurized other rows than run");

    // Restarted on the same state directory after that end, with a new file in the
    // folder: the recorded stream is replayed to its end and the run stops by itself,
    // saying why the new file was left (it used to exit 0 with nothing on stderr).
    publish(&late, &folder, "part-3.parquet");
    let again = dir.path().join("again");
    let mut child = follow(&again);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the restarted run did not stop at the recorded end");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("was ended after 6500 rows") && stderr.contains("no new file is admitted"),
        "{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        (&summary["rows"], &summary["files"]),
        (&6500.into(), &3.into())
    );
    assert!(
        common::read_output(&again) == want,
        "the replay featurized other rows"
    );
}

/// A followed folder is one endless stream: options about epochs of files are refused
/// with one line, not ignored (the ready line used to say `"epochs": 1` after
/// `--epochs 3`).
#[test]
fn epochs_and_start_steps_are_refused_for_a_followed_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (_, state) = folder_with_state(dir.path(), &[1_000], 43);
    let followed = dir.path().join("followed");
    std::fs::create_dir_all(&followed).unwrap();
    let toml = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/criteo.toml");
    for (option, value) in [
        ("--epochs", "3"),
        ("--start-epoch", "1"),
        ("--start-step", "5"),
    ] {
        let err = common::hydrant_err(&[
            "serve",
            "--pipeline",
            toml.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
            "--follow",
            followed.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            option,
            value,
        ]);
        assert!(
            err.contains("do not apply") && err.contains(option),
            "{err}"
        );
    }
}
