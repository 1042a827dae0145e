//! `hydrant serve --follow DIR` restarted: a server SIGKILLed (after a commit, after
//! `end_ingest`, or at random while a writer adds files) and restarted on its state
//! directory delivers the same steps from there, and one that cannot replay what it
//! recorded ends its trainers with the reason.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;

mod common;
use common::folder_with_state;
use common::follow::{
    RANKS, STALL, admitted, end, end_ingest, publish, read, serve_following, sorted_ids, status,
    ticket,
};

/// The continuous-training issue's followed folder: three files of 3,000 rows published
/// while two trainers read (with a bad file, a temporary one and Spark's `_SUCCESS`
/// among them), the server SIGKILLed after the trainers committed step 4 and restarted on
/// the same state directory. The restarted server's steps from 4 on are bit for bit those
/// of a server that was never killed, and every good row arrives once.
#[test]
fn a_followed_folder_streams_new_files_and_resumes_from_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (source, state) = folder_with_state(dir.path(), &[3_000, 3_000, 3_000], 41);
    let parts: Vec<_> = (0..3)
        .map(|i| source.join(format!("part-{i}.parquet")))
        .collect();
    let rt = common::pushed::runtime();
    let folder = |name: &str| {
        let f = dir.path().join(name);
        std::fs::create_dir_all(&f).unwrap();
        f
    };
    // The reference: all three files (and the bad one between), never killed.
    let (a, a_state) = (folder("a"), dir.path().join("a-state"));
    let whole = rt.block_on(async {
        let (_server, uri) = serve_following(&a, &state, &a_state);
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read(&uri, 0, usize::MAX).await }
        });
        publish(&parts[0], &a, "p0.parquet");
        std::fs::write(a.join("p1-bad.parquet"), b"not parquet").unwrap();
        publish(&parts[1], &a, "p2.parquet");
        admitted(&uri, 3).await;
        publish(&parts[2], &a, "p3.parquet");
        let s = admitted(&uri, 4).await;
        assert_eq!(s["follow"]["skipped_files"], 1, "{s}");
        let skipped = s["follow"]["skipped"][0].to_string();
        assert!(
            skipped.contains("p1-bad.parquet") && !skipped.contains(dir.path().to_str().unwrap()),
            "the error names the file, not the server's path: {skipped}"
        );
        end(&uri).await;
        reader.await.unwrap()
    });
    // 9,000 rows in steps of 2 x 500: 9 steps per rank; every row once.
    assert_eq!(whole.iter().map(Vec::len).collect::<Vec<_>>(), [9, 9]);
    assert_eq!(sorted_ids(&whole), (0..9_000).collect::<Vec<_>>());
    // Each batch names the stream positions its rows came from (row ids are positions).
    for s in whole.iter().flatten() {
        let [first, end] = s
            .meta
            .positions
            .expect("a stream batch names its positions");
        let ids = common::real_row_ids(&s.batch);
        assert!(
            ids.iter().all(|id| (first..end).contains(id)),
            "{first}..{end}"
        );
    }

    let (b, b_state) = (folder("b"), dir.path().join("b-state"));
    let resumed = rt.block_on(async {
        let (mut server, uri) = serve_following(&b, &state, &b_state);
        // 6,000 rows: the trainers read the 6 steps there will be, and checkpoint after 4.
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read(&uri, 0, 6).await }
        });
        std::fs::write(b.join("_SUCCESS"), b"").unwrap();
        std::fs::write(b.join(".p0.parquet.crc"), b"").unwrap();
        publish(&parts[0], &b, "p0.parquet");
        std::fs::write(b.join("p1-bad.parquet"), b"not parquet").unwrap();
        publish(&parts[1], &b, "p2.parquet");
        assert!(reader.await.unwrap().iter().all(|r| r.len() == 6));
        admitted(&uri, 3).await;
        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
        assert_eq!(client.commit("criteo", 4).await.unwrap()["committed"], 4);
        let _ = server.0.kill();
        let _ = server.0.wait();

        let (_server, uri) = serve_following(&b, &state, &b_state);
        let s = status(&uri).await;
        assert_eq!(s["committed_step"], 4, "{s}");
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read(&uri, 4, usize::MAX).await }
        });
        publish(&parts[2], &b, "p3.parquet");
        // Files count across restarts: p0, the bad one and p2 before, p3 now.
        admitted(&uri, 4).await;
        end(&uri).await;
        reader.await.unwrap()
    });
    for (rank, (got, want)) in resumed.iter().zip(&whole).enumerate() {
        assert_eq!(got.len(), 5, "rank {rank}");
        for (g, w) in got.iter().zip(&want[4..]) {
            assert_eq!(
                (g.meta.step, g.meta.positions),
                (w.meta.step, w.meta.positions)
            );
            assert_eq!(g.batch, w.batch, "rank {rank} step {}", w.meta.step);
        }
    }
    // Files are the user's: all still there.
    assert!(parts.iter().all(|p| p.exists()) && b.join("p0.parquet").exists());
}

/// A file skipped before the commit's row is not read again after a restart, and is still
/// listed as skipped (found by a hostile run: `status` listed none after a restart past a
/// commit, though the manifest keeps them).
#[test]
fn files_skipped_before_a_commit_are_still_listed_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (source, state) = folder_with_state(dir.path(), &[3_000], 41);
    let folder = dir.path().join("followed");
    std::fs::create_dir_all(&folder).unwrap();
    let state_dir = dir.path().join("sd");
    let rt = common::pushed::runtime();
    rt.block_on(async {
        let (mut server, uri) = serve_following(&folder, &state, &state_dir);
        publish(&source.join("part-0.parquet"), &folder, "p0.parquet");
        std::fs::write(folder.join("p1-bad.parquet"), b"not parquet").unwrap();
        admitted(&uri, 2).await;
        // 3,000 rows in steps of 2 x 500: the commit after step 2 is past both files.
        assert!(read(&uri, 0, 3).await.iter().all(|r| r.len() == 3));
        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
        assert_eq!(client.commit("criteo", 3).await.unwrap()["committed"], 3);
        let _ = server.0.kill();
        let _ = server.0.wait();

        let (_server, uri) = serve_following(&folder, &state, &state_dir);
        let s = admitted(&uri, 2).await;
        assert_eq!(s["follow"]["skipped_files"], 1, "{s}");
        let skipped = s["follow"]["skipped"][0].to_string();
        assert!(
            skipped.contains("p1-bad.parquet") && skipped.contains("not a Parquet"),
            "{skipped}"
        );
    });
}

/// `end_ingest` on a followed folder is recorded in the manifest: a server SIGKILLed after
/// it and restarted on the same state directory ends the stream at the same row — the
/// same steps, then a clean end — and a file that appeared since is not admitted.
#[test]
fn an_ended_followed_input_stays_ended_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (source, state) = folder_with_state(dir.path(), &[3_000, 3_000], 43);
    let part = |i: usize| source.join(format!("part-{i}.parquet"));
    let (folder, state_dir) = (dir.path().join("followed"), dir.path().join("state-dir"));
    std::fs::create_dir_all(&folder).unwrap();
    let rt = common::pushed::runtime();
    let first = rt.block_on(async {
        let (mut server, uri) = serve_following(&folder, &state, &state_dir);
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read(&uri, 0, usize::MAX).await }
        });
        publish(&part(0), &folder, "p0.parquet");
        admitted(&uri, 1).await;
        end(&uri).await;
        let got = reader.await.unwrap();
        let _ = server.0.kill();
        let _ = server.0.wait();
        got
    });
    // 3,000 rows in steps of 2 x 500: 3 steps per rank.
    assert_eq!(first.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3]);
    publish(&part(1), &folder, "p1.parquet");
    let again = rt.block_on(async {
        let (mut server, uri) = serve_following(&folder, &state, &state_dir);
        let reading = read(&uri, 0, usize::MAX);
        let got = tokio::time::timeout(std::time::Duration::from_secs(60), reading)
            .await
            .expect("the restarted stream ends where the first one did");
        let s = status(&uri).await;
        assert_eq!(
            (&s["ended"], &s["rows_in"]),
            (&true.into(), &3_000.into()),
            "{s}"
        );
        // The log says why the file published meanwhile is not admitted.
        let _ = server.0.kill();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut server.0.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(
            stderr.contains("was ended after 3000 rows") && stderr.contains("no new file"),
            "{stderr}"
        );
        got
    });
    assert_eq!(again.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3]);
    for (g, w) in again.iter().flatten().zip(first.iter().flatten()) {
        assert_eq!((g.meta.step, &g.batch), (w.meta.step, &w.batch));
    }
}

/// A followed file deleted while the server was down (nothing committed), or one whose
/// admission the server was killed in and that was cut short meanwhile: the restarted
/// server cannot admit the recorded stream again (nor one rewritten at its old length,
/// which was replayed as if it were the same). Its trainers used to wait forever (or,
/// for the second, get the next file's rows at positions they had passed, and a clean
/// end), and `end_ingest` recorded an end at a row they had passed; now every rank's stream
/// ends with the reason once it has sent what was admitted, and `end_ingest` is refused.
#[test]
fn a_stream_that_cannot_be_replayed_ends_its_trainers_with_the_reason() {
    type Damage = fn(&Path, &Path);
    let deleted: Damage = |folder, _| std::fs::remove_file(folder.join("p0.parquet")).unwrap();
    // The manifest as a kill during p1's admission leaves it (no `end` line), and p1 cut.
    let cut: Damage = |folder, state_dir| {
        let manifest = state_dir.join("follow.manifest");
        let text = std::fs::read_to_string(&manifest).unwrap();
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains(r#""event":"end","file":"p1"#))
            .collect();
        std::fs::write(&manifest, kept.join("\n") + "\n").unwrap();
        let p1 = folder.join("p1.parquet");
        let bytes = std::fs::read(&p1).unwrap();
        std::fs::write(&p1, &bytes[..bytes.len() / 2]).unwrap();
    };
    // p0 rewritten at the same length with other bytes (another file of as many rows,
    // padded or cut to p0's length: not Parquet any more, which is other bytes all the same).
    let rewritten: Damage = |folder, _| {
        let p0 = folder.join("p0.parquet");
        let len = std::fs::metadata(&p0).unwrap().len() as usize;
        let mut other = std::fs::read(folder.join("p1.parquet")).unwrap();
        other.resize(len, 0);
        std::fs::write(&p0, other).unwrap();
    };
    // What each damage leaves to deliver before the reason: p0's 3,000 rows when p1 is
    // the file that cannot be admitted again.
    for (damage, needle, steps_first) in [
        (deleted, "p0.parquet is gone", 0),
        (cut, "p1.parquet is ", 3),
        (rewritten, "p0.parquet holds other bytes", 0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (source, state) = folder_with_state(dir.path(), &[3_000, 3_000], 53);
        let (folder, state_dir) = (dir.path().join("followed"), dir.path().join("state-dir"));
        std::fs::create_dir_all(&folder).unwrap();
        let rt = common::pushed::runtime();
        rt.block_on(async {
            let (mut server, uri) = serve_following(&folder, &state, &state_dir);
            // The trainers read all 6,000 rows: 6 steps of 2 x 500.
            let reader = tokio::spawn({
                let uri = uri.clone();
                async move { read(&uri, 0, 6).await }
            });
            publish(&source.join("part-0.parquet"), &folder, "p0.parquet");
            publish(&source.join("part-1.parquet"), &folder, "p1.parquet");
            admitted(&uri, 2).await;
            assert!(reader.await.unwrap().iter().all(|r| r.len() == 6));
            let _ = server.0.kill();
            let _ = server.0.wait();
        });
        damage(&folder, &state_dir);
        rt.block_on(async {
            let (_server, uri) = serve_following(&folder, &state, &state_dir);
            // Both ranks at once: a pushed stream's unread rank holds the other back.
            let ends: Vec<_> = (0..RANKS)
                .map(|rank| {
                    let uri = uri.clone();
                    tokio::spawn(async move {
                        let mut client = hydrant_flight::Client::connect(&uri).await.unwrap();
                        let mut steps = client.steps(&ticket(rank, 0)).await.unwrap();
                        let ended = tokio::time::timeout(STALL, async {
                            let mut read = 0;
                            loop {
                                match steps.next_step().await {
                                    Some(Ok(_)) => read += 1,
                                    other => return (read, other.map(|r| r.map(|_| ()))),
                                }
                            }
                        });
                        let (read, ended) =
                            ended.await.expect("the stream ends, not waits for rows");
                        (read, format!("{ended:?}"))
                    })
                })
                .collect();
            for (rank, ended) in ends.into_iter().enumerate() {
                let (read, ended) = ended.await.unwrap();
                // Every step the admitted rows complete, then the reason (the dataflow was
                // stopped at once, losing steps it held).
                assert_eq!(read, steps_first, "rank {rank}: {ended}");
                let server_path = state_dir.to_string_lossy();
                assert!(!ended.contains(&*server_path), "rank {rank}: {ended}");
                assert!(
                    ended.contains(needle) && ended.contains("cannot be admitted again"),
                    "rank {rank}: {ended}"
                );
                // Not the server's fault, nor mended by retrying as it is.
                assert!(ended.contains("FailedPrecondition"), "rank {rank}: {ended}");
            }
            let refused = end_ingest(&uri)
                .await
                .expect_err("an input that failed is not ended");
            assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");
            assert!(refused.message().contains("cannot be ended"), "{refused}");
        });
    }
}

/// A rank's trainer in the kill -9 test: reads `rank` from `start`, keeps each step in
/// `got` (a step got twice must be the same), rank 0 commits every 5 steps, until the
/// stream ends (`true`) or breaks.
async fn train(
    uri: String,
    rank: usize,
    start: u64,
    got: Arc<Mutex<BTreeMap<u64, RecordBatch>>>,
) -> bool {
    let Ok(mut client) = hydrant_flight::Client::connect(&uri).await else {
        return false;
    };
    let Ok(steps) = client.steps(&ticket(rank, start)).await else {
        return false;
    };
    let committer = match rank {
        0 => hydrant_flight::Client::connect(&uri).await.ok(),
        _ => None,
    };
    common::pushed::keep_steps(steps, &got, committer.map(|c| (c, "criteo", 5))).await
}

/// The continuous-training issue's crash test for followed folders: a writer publishes
/// 16 files, one every 150 ms, whether or not the server is up, while two trainers read;
/// the server is SIGKILLed 10 times at random moments (while it admits a file, mid-step,
/// while trainers wait for rows, around commits) and each time restarted on the same
/// state directory, the trainers resuming at their last step + 1. Every step each rank
/// got is bit for bit the step of a server that was never killed, and it got every one:
/// each published row delivered exactly once, checked by content.
#[test]
fn kill_9_while_a_writer_adds_files_loses_and_duplicates_nothing() {
    const FILES: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let (source, state) = folder_with_state(dir.path(), &[1_500; FILES], 60);
    let part = |i: usize| source.join(format!("part-{i}.parquet"));
    let name = |i: usize| format!("p{i:02}.parquet");
    let rt = common::pushed::runtime();

    let (reference_folder, reference_state) =
        (dir.path().join("ref"), dir.path().join("ref-state"));
    std::fs::create_dir_all(&reference_folder).unwrap();
    let reference = rt.block_on(async {
        let (_server, uri) = serve_following(&reference_folder, &state, &reference_state);
        let reader = tokio::spawn({
            let uri = uri.clone();
            async move { read(&uri, 0, usize::MAX).await }
        });
        for i in 0..FILES {
            publish(&part(i), &reference_folder, &name(i));
        }
        admitted(&uri, FILES as u64).await;
        end(&uri).await;
        reader.await.unwrap()
    });
    // 24,000 rows in steps of 2 x 500: 24 steps per rank, every row once.
    assert_eq!(reference.iter().map(Vec::len).collect::<Vec<_>>(), [24, 24]);
    assert_eq!(sorted_ids(&reference), (0..24_000).collect::<Vec<_>>());

    let (folder, state_dir) = (dir.path().join("followed"), dir.path().join("state-dir"));
    std::fs::create_dir_all(&folder).unwrap();
    let published = Arc::new(AtomicUsize::new(0));
    let writer = std::thread::spawn({
        let (folder, published) = (folder.clone(), published.clone());
        let parts: Vec<_> = (0..FILES).map(part).collect();
        move || {
            for (i, p) in parts.iter().enumerate() {
                std::thread::sleep(std::time::Duration::from_millis(150));
                publish(p, &folder, &format!("p{i:02}.parquet"));
                published.store(i + 1, Ordering::SeqCst);
            }
        }
    });
    let got: Vec<Arc<Mutex<BTreeMap<u64, RecordBatch>>>> =
        (0..RANKS).map(|_| Arc::default()).collect();
    let resume = |r: usize| got[r].lock().unwrap().keys().last().map_or(0, |s| s + 1);
    let mut while_writing = 0;
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..10 {
        let (mut server, uri) = serve_following(&folder, &state, &state_dir);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let after = std::time::Duration::from_millis(rng % 200);
        rt.block_on(async {
            let trainers: Vec<_> = (0..RANKS)
                .map(|r| tokio::spawn(train(uri.clone(), r, resume(r), got[r].clone())))
                .collect();
            tokio::time::sleep(after).await;
            let _ = server.0.kill();
            let _ = server.0.wait();
            for t in trainers {
                // Neither finished: the stream has no end until end_ingest.
                assert!(!t.await.unwrap());
            }
        });
        let n = published.load(Ordering::SeqCst);
        while_writing += usize::from(n > 0 && n < FILES);
    }
    assert!(
        while_writing >= 2,
        "only {while_writing} of the kills came while files were being published"
    );
    writer.join().unwrap();
    let (_server, uri) = serve_following(&folder, &state, &state_dir);
    rt.block_on(async {
        let trainers: Vec<_> = (0..RANKS)
            .map(|r| tokio::spawn(train(uri.clone(), r, resume(r), got[r].clone())))
            .collect();
        admitted(&uri, FILES as u64).await;
        end(&uri).await;
        for t in trainers {
            assert!(t.await.unwrap(), "the stream ends");
        }
    });
    for (rank, (got, want)) in got.iter().zip(&reference).enumerate() {
        let got = got.lock().unwrap();
        assert_eq!(got.len(), want.len(), "rank {rank}: every step");
        for w in want {
            assert_eq!(
                got[&w.meta.step], w.batch,
                "rank {rank} step {}",
                w.meta.step
            );
        }
    }
}
