//! timely's cluster mode: two real `hydrant` processes on loopback produce exactly the
//! rows of a one-process run. And memory does not grow with the input, nor much with the
//! number of files it comes in.

mod common;

use common::*;

#[test]
fn two_processes_produce_the_rows_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let input = gen_criteo(dir.path(), 300_000, 5); // 5 row groups: both processes get some
    let toml = criteo_toml();
    let (toml, input_s) = (toml.to_str().unwrap(), input.to_str().unwrap());
    let state = dir.path().join("state.json");
    hydrant_ok(&[
        "fit",
        "--pipeline",
        toml,
        "--input",
        input_s,
        "--out",
        state.to_str().unwrap(),
    ]);

    let one = dir.path().join("one");
    hydrant_ok(&[
        "run",
        "--pipeline",
        toml,
        "--input",
        input_s,
        "--state",
        state.to_str().unwrap(),
        "--sink",
        &format!("parquet:{}", one.display()),
        "--workers",
        "1",
        "--ranks",
        "2",
    ]);

    let two = dir.path().join("two");
    let sink = format!("parquet:{}", two.display());
    let state_s = state.to_str().unwrap();
    let mut rows_seen = 0;
    for summary in run_cluster(
        dir.path(),
        2,
        1,
        &[
            "run",
            "--pipeline",
            toml,
            "--input",
            input_s,
            "--state",
            state_s,
            "--sink",
            &sink,
            "--ranks",
            "2",
        ],
    ) {
        rows_seen += summary["rows"].as_u64().unwrap();
        // Rank r's batches go to worker r: one rank per process.
        assert!(summary["rows"].as_u64().unwrap() > 0, "{summary}");
    }
    assert_eq!(rows_seen, 300_000);
    let (a, b) = (read_output(&one), read_output(&two));
    assert_eq!(a.len(), 300_000);
    assert!(
        a == b,
        "the two-process run differs from the one-process run"
    );
}

#[test]
fn fitting_across_processes_matches_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let input = gen_criteo(dir.path(), 140_000, 9);
    let toml = criteo_toml();
    let (toml, input_s) = (toml.to_str().unwrap(), input.to_str().unwrap());
    let one = dir.path().join("one.json");
    hydrant_ok(&[
        "fit",
        "--pipeline",
        toml,
        "--input",
        input_s,
        "--out",
        one.to_str().unwrap(),
        "--workers",
        "1",
    ]);
    let two = dir.path().join("two.json");
    run_cluster(
        dir.path(),
        2,
        1,
        &[
            "fit",
            "--pipeline",
            toml,
            "--input",
            input_s,
            "--out",
            two.to_str().unwrap(),
        ],
    );
    // Each process writes the state (nodes may not share a folder): here each its own.
    let apart = |p: usize| dir.path().join(format!("apart-{p}.json"));
    let children = spawn_cluster_with(dir.path(), 2, 1, |p| {
        let out = apart(p).to_str().unwrap().to_string();
        ["fit", "--pipeline", toml, "--input", input_s, "--out", &out]
            .map(String::from)
            .to_vec()
    });
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    assert_eq!(text(&apart(0)), text(&two));
    assert_eq!(text(&apart(1)), text(&two));
    let read = |p: &std::path::Path| {
        hydrant::operators::FittedState::from_json(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let (a, b) = (read(&one), read(&two));
    assert_eq!(a.params.len(), b.params.len());
    for (k, pa) in &a.params {
        match (pa, &b.params[k]) {
            (
                hydrant::operators::FittedParam::Standardize { mean: m1, std: s1 },
                hydrant::operators::FittedParam::Standardize { mean: m2, std: s2 },
            ) => assert!((m1 - m2).abs() < 1e-12 && (s1 - s2).abs() < 1e-12, "{k}"),
            (x, y) => assert_eq!(x, y, "{k}"),
        }
    }
}

/// `hydrant run` of `toml` over `input` (`rows` rows) with `extra` options: its peak
/// resident memory in MiB, from its summary.
fn peak_rss_mb(toml: &std::path::Path, input: &std::path::Path, rows: u64, extra: &[&str]) -> f64 {
    let s = hydrant_ok(&run_of(toml, input, extra));
    assert_eq!(s["rows"], rows);
    s["peak_rss_mb"].as_f64().expect("peak_rss_mb on Linux")
}

#[test]
fn peak_memory_does_not_grow_with_the_input() {
    let dir = tempfile::tempdir().unwrap();
    // Hashed ids: no fitted state grows with the data (a vocabulary's memory grows with its
    // distinct values, which is the state's size, not buffering), so what is measured is
    // the stream itself.
    let toml = criteo_toml().with_file_name("criteo_hash.toml");
    let mut peaks = Vec::new();
    // Row groups of 16,384 rows: what a reader may hold ahead grows with the biggest unit
    // times the readers, and the smaller input (24 row groups, 12 per worker) must reach
    // that steady state for the comparison to mean anything. With 65,536-row groups it
    // held six, and its peak ranged over 58–75 MiB from run to run against the larger
    // input's 78–87 MiB, so the comparison failed about one run in eight.
    for rows in [16_384u64 * 24, 16_384 * 96] {
        let input = gen_criteo_in_row_groups(dir.path(), rows, 1, 16_384);
        peaks.push(peak_rss_mb(&toml, &input, rows, &["--workers", "2"]));
    }
    // Four times the rows, the same memory give or take allocator noise.
    assert!(
        peaks[1] < peaks[0] * 1.15 + 8.0,
        "peak RSS grew from {} MiB to {} MiB",
        peaks[0],
        peaks[1]
    );
}

/// Each input file costs memory for as long as the run reads: where its row groups lie.
/// Its schema, as Parquet and as Arrow, is the same for files of one kind and is held
/// once; held per file it was ~45 KB, so 6,000 small files peaked at ~330 MiB against
/// ~95 MiB for their rows in one file, and 2,400 files here 115 MiB over 24 files. Kinds
/// interleaved (12 here, each file's key-value metadata its own) share as well.
#[test]
fn peak_memory_grows_little_with_the_number_of_input_files() {
    let dir = tempfile::tempdir().unwrap();
    let toml = criteo_toml().with_file_name("criteo_hash.toml");
    let one = gen_criteo(dir.path(), 20, 1);
    let kinds: Vec<_> = (0..12)
        .map(|k| {
            let path = dir.path().join(format!("kind-{k}.parquet"));
            let batches = read_parquet(&one);
            let props = parquet::file::properties::WriterProperties::builder()
                .set_key_value_metadata(Some(vec![parquet::file::metadata::KeyValue::new(
                    "kind".into(),
                    k.to_string(),
                )]))
                .build();
            let file = std::fs::File::create(&path).unwrap();
            let mut w =
                parquet::arrow::ArrowWriter::try_new(file, batches[0].schema(), Some(props))
                    .unwrap();
            batches.iter().for_each(|b| w.write(b).unwrap());
            w.close().unwrap();
            path
        })
        .collect();
    let mut peaks = Vec::new();
    for (files, of) in [(24, 1), (2_400, 1), (2_400, 12)] {
        let folder = dir.path().join(format!("in-{files}-{of}"));
        std::fs::create_dir(&folder).unwrap();
        for i in 0..files {
            let name = folder.join(format!("part-{i:05}.parquet"));
            std::fs::hard_link(&kinds[i as usize % of], name).unwrap();
        }
        peaks.push(peak_rss_mb(&toml, &folder, 20 * files, &["--workers", "2"]));
    }
    // ~8 KB a file (its row group's column chunks, path, units and projection): 19 MiB.
    for (peak, what) in [(peaks[1], "one kind"), (peaks[2], "12 kinds interleaved")] {
        assert!(
            peak < peaks[0] + 30.0,
            "peak RSS grew from {} MiB at 24 files to {peak} MiB at 2,400 of {what}",
            peaks[0],
        );
    }
}

/// Tiny shuffled batches hold a window of one-row steps open at once (65,536 of them by
/// default): what each costs beyond its rows must stay small. Each step once went to the
/// consumers in a container of its own (timely's 8 KiB default): at B = 1 a 262,144-row
/// input peaked at ~980 MiB against ~115 MiB at B = 4096; one container per round of
/// steps brought it to ~340 MiB.
#[test]
fn tiny_shuffled_batches_cost_little_beyond_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let toml = criteo_toml().with_file_name("criteo_hash.toml");
    let input = gen_criteo_in_row_groups(dir.path(), 262_144, 1, 65_536);
    let peak = |b: &str| {
        let shuffled = ["--ranks", "2", "--batch-size", b, "--shuffle"];
        peak_rss_mb(&toml, &input, 262_144, &shuffled)
    };
    let (tiny, usual) = (peak("1"), peak("4096"));
    assert!(
        tiny < usual * 5.0,
        "B = 1 peaked at {tiny} MiB against {usual} MiB at B = 4096"
    );
}
