//! Bad input gets one clear line naming what was wrong, and a non-zero exit; no panics.

mod common;

use common::*;

#[test]
fn bad_files_are_named() {
    let (dir, input) = small_criteo();
    let toml = criteo_toml();
    let toml = toml.to_str().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();

    let err = hydrant_err(&["run", "--pipeline", toml, "--input", &p("missing.parquet")]);
    assert!(
        err.contains("missing.parquet") && err.contains("No such file"),
        "{err}"
    );

    std::fs::write(
        p("text.parquet"),
        "just some text, long enough to read a magic",
    )
    .unwrap();
    let err = hydrant_err(&["run", "--pipeline", toml, "--input", &p("text.parquet")]);
    assert!(
        err.contains("text.parquet") && err.contains("not a Parquet or Arrow IPC file"),
        "{err}"
    );

    let bytes = std::fs::read(&input).unwrap();
    std::fs::write(p("truncated.parquet"), &bytes[..bytes.len() / 2]).unwrap();
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        toml,
        "--input",
        &p("truncated.parquet"),
    ]);
    assert!(
        err.contains("truncated.parquet") && err.contains("not a readable Parquet file"),
        "{err}"
    );

    // A truncated middle: the footer is intact but a column chunk is garbage.
    let mut corrupt = bytes.clone();
    for b in &mut corrupt[4..bytes.len() / 2] {
        *b = 0x5a;
    }
    std::fs::write(p("corrupt.parquet"), &corrupt).unwrap();
    let err = hydrant_err(&["run", "--pipeline", toml, "--input", &p("corrupt.parquet")]);
    assert!(err.contains("corrupt.parquet"), "{err}");

    // Pages that fail to decode while the run reads them (the footer is sound, and a state
    // fitted before spares the fit's reading): the input is named once, with no prefix
    // saying which layers passed the error on ("dataflow: worker: input …").
    let state = p("state.json");
    fit_criteo(std::path::Path::new(&input), std::path::Path::new(&state));
    let mut pages = bytes.clone();
    for b in &mut pages[bytes.len() / 3..bytes.len() / 2] {
        *b = 0x5a;
    }
    std::fs::write(p("pages.parquet"), &pages).unwrap();
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        toml,
        "--input",
        &p("pages.parquet"),
        "--state",
        &state,
    ]);
    assert!(
        err.contains("input ") && err.contains("pages.parquet"),
        "{err}"
    );
    assert!(
        !err.contains("worker:")
            && !err.contains("source:")
            && err.matches("dataflow:").count() <= 1,
        "{err}"
    );

    std::fs::create_dir(p("empty")).unwrap();
    let err = hydrant_err(&["run", "--pipeline", toml, "--input", &p("empty")]);
    assert!(err.contains("holds no .parquet"), "{err}");
}

#[test]
fn a_schema_that_does_not_match_the_pipeline_is_named() {
    let (dir, input) = small_criteo();
    let toml = dir.path().join("p.toml");
    let text = std::fs::read_to_string(criteo_toml())
        .unwrap()
        .replace("\"i12\"", "\"i13\"");
    std::fs::write(&toml, text).unwrap();
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        &input,
    ]);
    assert!(
        err.contains("p.toml") && err.contains("group `dense`, column `i13`: no such column"),
        "{err}"
    );

    // A column of the wrong type: log1p of a string column.
    let text = std::fs::read_to_string(criteo_toml())
        .unwrap()
        .replace("\"i12\"]", "\"c0\"]");
    std::fs::write(&toml, text).unwrap();
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        &input,
    ]);
    assert!(
        err.contains("column `c0`") && err.contains("needs a number"),
        "{err}"
    );

    // A second input whose schema lacks a column names that file.
    let other = dir.path().join("other.arrow");
    let batch = arrow::array::RecordBatch::try_from_iter([(
        "label",
        std::sync::Arc::new(arrow::array::Int32Array::from(vec![1])) as arrow::array::ArrayRef,
    )])
    .unwrap();
    write_ipc_file(&other, &batch);
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        criteo_toml().to_str().unwrap(),
        "--input",
        &input,
        other.to_str().unwrap(),
    ]);
    assert!(
        err.contains("other.arrow") && err.contains("no such column"),
        "{err}"
    );
}

#[test]
fn bad_pipelines_name_file_group_and_problem() {
    let (dir, input) = small_criteo();
    let toml = dir.path().join("p.toml");
    let base = std::fs::read_to_string(criteo_toml()).unwrap();
    for (from, to, needles) in [
        (
            "\"log1p\"",
            "\"log2\"",
            vec!["p.toml", "group `dense`", "step `log2`", "unknown step"],
        ),
        (
            "clip(-3, 3)",
            "clip(3, -3)",
            vec!["group `dense`", "lo <= hi"],
        ),
        (
            "kind = \"ids\"",
            "kind = \"sparse\"",
            vec!["p.toml", "line", "sparse"],
        ),
        (
            "name = \"criteo\"",
            "name = \"criteo\"\nbogus = 1",
            vec!["unknown field `bogus`"],
        ),
        (
            "steps = [\"vocab\"]",
            "steps = [\"log1p\"]",
            vec!["group `ids`, column `c0`", "needs a number"],
        ),
    ] {
        std::fs::write(&toml, base.replace(from, to)).unwrap();
        let err = hydrant_err(&[
            "run",
            "--pipeline",
            toml.to_str().unwrap(),
            "--input",
            &input,
        ]);
        for n in needles {
            assert!(err.contains(n), "{n:?} not in {err}");
        }
    }
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        dir.path().join("nope.toml").to_str().unwrap(),
        "--input",
        &input,
    ]);
    assert!(err.contains("nope.toml"), "{err}");
}

#[test]
fn bad_state_and_sink_are_named() {
    let (dir, input) = small_criteo();
    let toml = criteo_toml();
    let toml = toml.to_str().unwrap();
    let state = dir.path().join("state.json");
    std::fs::write(&state, "{not json").unwrap();
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        toml,
        "--input",
        &input,
        "--state",
        state.to_str().unwrap(),
    ]);
    assert!(err.contains("state.json") && err.contains("JSON"), "{err}");

    std::fs::write(
        &state,
        format!(
            r#"{{"format":1,"pipeline":"criteo","version":{},"params":{{}}}}"#,
            hydrant::operators::FittedState::empty("criteo").version
        ),
    )
    .unwrap();
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        toml,
        "--input",
        &input,
        "--state",
        state.to_str().unwrap(),
    ]);
    assert!(
        err.contains("nothing fitted for step `standardize` of group `dense`, column `i0`"),
        "{err}"
    );

    std::fs::write(
        &state,
        format!(
            r#"{{"format":1,"pipeline":"other","version":{},"params":{{}}}}"#,
            hydrant::operators::FittedState::empty("other").version
        ),
    )
    .unwrap();
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        toml,
        "--input",
        &input,
        "--state",
        state.to_str().unwrap(),
    ]);
    assert!(err.contains("pipeline `other`"), "{err}");

    let err = hydrant_err(&[
        "run",
        "--pipeline",
        toml,
        "--input",
        &input,
        "--sink",
        "csv:x",
    ]);
    assert!(err.contains("unknown sink `csv:x`"), "{err}");
}

/// A label a trainer could not use (null, NaN, infinite) ends the job with one line naming
/// the column and the row, instead of reaching the trainers as a NaN loss.
#[test]
fn unusable_labels_are_named_by_row_id() {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float64Array, RecordBatch};

    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("p.toml");
    std::fs::write(
        &toml,
        "name = \"p\"\nlabel = { column = \"y\", type = \"float32\" }\n\
         [[group]]\nname = \"dense\"\nkind = \"dense\"\ncolumns = [\"x\"]\n",
    )
    .unwrap();
    for (k, bad, needle) in [
        (1234, None, "is null at row_id 1234"),
        (2999, Some(f64::NAN), "is NaN at row_id 2999"),
        (0, Some(f64::INFINITY), "is inf at row_id 0"),
    ] {
        let y: Float64Array = (0..3000)
            .map(|i| if i == k { bad } else { Some((i % 2) as f64) })
            .collect();
        let x = Float64Array::from_iter_values((0..3000).map(f64::from));
        let batch =
            RecordBatch::try_from_iter([("y", Arc::new(y) as ArrayRef), ("x", Arc::new(x))])
                .unwrap();
        let input = dir.path().join(format!("bad{k}.arrow"));
        write_ipc_file(&input, &batch);
        let err = hydrant_err(&[
            "run",
            "--pipeline",
            toml.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--ranks",
            "2",
            "--batch-size",
            "256",
        ]);
        assert!(err.contains(&format!("label column `y` {needle}")), "{err}");
    }
}

/// Writes `batch` to `path` as an Arrow IPC file.
fn write_ipc_file(path: &std::path::Path, batch: &arrow::array::RecordBatch) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = arrow::ipc::writer::FileWriter::try_new(file, &batch.schema()).unwrap();
    w.write(batch).unwrap();
    w.finish().unwrap();
}

/// Found by a hostile run: `gen` called the file it writes an input, and replaced a
/// pipeline file given as its `--out` with generated rows.
#[test]
fn gen_names_its_output_and_does_not_overwrite_other_files() {
    let dir = tempfile::tempdir().unwrap();
    let gen_err = |out: &std::path::Path| {
        hydrant_err(&[
            "gen",
            "criteo",
            "--rows",
            "10",
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let err = gen_err(&dir.path().join("no/such/folder/x.parquet"));
    assert!(err.contains("--out") && !err.contains("input"), "{err}");
    let toml = dir.path().join("p.toml");
    std::fs::copy(criteo_toml(), &toml).unwrap();
    let before = std::fs::read(&toml).unwrap();
    let err = gen_err(&toml);
    assert!(err.contains("not a Parquet file"), "{err}");
    assert_eq!(std::fs::read(&toml).unwrap(), before);
    // A Parquet file is replaced, as generating again does.
    let data = dir.path().join("d.parquet");
    for rows in ["10", "20"] {
        let out = hydrant(&[
            "gen",
            "criteo",
            "--rows",
            rows,
            "--out",
            data.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
