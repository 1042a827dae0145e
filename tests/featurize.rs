//! End to end: `hydrant gen` → `hydrant fit` → `hydrant run --sink parquet:DIR`, checked
//! row by row against plain definitions of the Criteo featurization computed here.

// Columns are indexed in parallel (input column i, output slot i), which reads best as loops.
#![allow(clippy::needless_range_loop)]

mod common;

use std::collections::{BTreeMap, HashMap};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, Int32Type};
use common::*;
use hydrant::operators::{FittedParam, FittedState};

const ROWS: u64 = 30_000;

/// The input as plain columns: label, 13 numeric (None = null), 26 strings.
struct Plain {
    label: Vec<i32>,
    numeric: Vec<Vec<Option<f64>>>,
    strings: Vec<Vec<String>>,
}

fn read_plain(path: &std::path::Path) -> Plain {
    let mut p = Plain {
        label: vec![],
        numeric: vec![vec![]; 13],
        strings: vec![vec![]; 26],
    };
    for b in read_parquet(path) {
        p.label.extend(
            b.column_by_name("label")
                .unwrap()
                .as_primitive::<Int32Type>()
                .values(),
        );
        for i in 0..13 {
            let c = b
                .column_by_name(&format!("i{i}"))
                .unwrap()
                .as_primitive::<Float64Type>();
            p.numeric[i].extend((0..c.len()).map(|r| c.is_valid(r).then(|| c.value(r))));
        }
        for j in 0..26 {
            let c = b
                .column_by_name(&format!("c{j}"))
                .unwrap()
                .as_string::<i32>();
            p.strings[j].extend(c.iter().map(|s| s.unwrap().to_string()));
        }
    }
    p
}

/// fill_null(0) → log1p, the values standardize is fitted on.
fn logged(col: &[Option<f64>]) -> Vec<f64> {
    col.iter().map(|v| v.unwrap_or(0.0).ln_1p()).collect()
}

fn population_mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (
        mean,
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt(),
    )
}

/// Index 0 = most frequent; ties by ascending bytes.
fn vocab(col: &[String]) -> HashMap<&str, i64> {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for s in col {
        *counts.entry(s).or_default() += 1;
    }
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.as_bytes().cmp(b.0.as_bytes())));
    v.into_iter()
        .enumerate()
        .map(|(i, (s, _))| (s, i as i64))
        .collect()
}

#[test]
fn every_row_once_with_the_defined_values() {
    let dir = tempfile::tempdir().unwrap();
    let input = gen_criteo(dir.path(), ROWS, 7);
    let state_path = dir.path().join("state.json");
    let (input_s, state_s, toml) = (
        input.to_str().unwrap(),
        state_path.to_str().unwrap(),
        criteo_toml(),
    );
    hydrant_ok(&[
        "fit",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        input_s,
        "--out",
        state_s,
        "--workers",
        "2",
    ]);
    let out = dir.path().join("out");
    let summary = hydrant_ok(&[
        "run",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        input_s,
        "--state",
        state_s,
        "--sink",
        &format!("parquet:{}", out.display()),
        "--workers",
        "3",
    ]);
    assert_eq!(summary["rows"], ROWS);
    for key in ["batches", "fit_s", "seconds", "rows_per_s", "first_batch_s"] {
        assert!(summary[key].is_number(), "{key} in {summary}");
    }

    let plain = read_plain(&input);
    let state = FittedState::from_json(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    let rows = read_output(&out);
    assert_eq!(rows.len() as u64, ROWS, "every row exactly once");
    assert_eq!(*rows.keys().last().unwrap(), ROWS - 1);

    // Fitted statistics match the definitions.
    let mut mean_std = Vec::new();
    for i in 0..13 {
        let (mean, std) = population_mean_std(&logged(&plain.numeric[i]));
        let Some(FittedParam::Standardize { mean: m, std: s }) =
            state.params.get(&format!("dense/i{i}/2"))
        else {
            panic!("no standardize for i{i}")
        };
        assert!(
            (m - mean).abs() < 1e-9 && (s - std).abs() < 1e-9,
            "i{i}: {m} {s} vs {mean} {std}"
        );
        mean_std.push((mean, std));
    }
    let vocabs: Vec<_> = plain.strings.iter().map(|c| vocab(c)).collect();

    for (&id, row) in &rows {
        let r = id as usize;
        assert_eq!(row.label, Some(plain.label[r] as f32));
        for i in 0..13 {
            let (mean, std) = mean_std[i];
            let want =
                ((plain.numeric[i][r].unwrap_or(0.0).ln_1p() - mean) / std).clamp(-3.0, 3.0) as f32;
            assert!(
                (row.dense[i] - want).abs() <= 1e-6,
                "row {r} i{i}: {} vs {want}",
                row.dense[i]
            );
        }
        for j in 0..26 {
            assert_eq!(
                row.ids[j],
                vocabs[j][plain.strings[j][r].as_str()],
                "row {r} c{j}"
            );
        }
    }
}

#[test]
fn worker_counts_and_ipc_input_give_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let input = gen_criteo(dir.path(), 5_000, 3);
    let state = dir.path().join("state.json");
    let toml = criteo_toml();
    let (toml, input_s, state_s) = (
        toml.to_str().unwrap(),
        input.to_str().unwrap(),
        state.to_str().unwrap(),
    );
    hydrant_ok(&[
        "fit",
        "--pipeline",
        toml,
        "--input",
        input_s,
        "--out",
        state_s,
    ]);

    // The same data as an Arrow IPC file, in two record batches.
    let ipc = dir.path().join("criteo.arrow");
    {
        let batches = read_parquet(&input);
        let mut w = arrow::ipc::writer::FileWriter::try_new(
            std::fs::File::create(&ipc).unwrap(),
            &batches[0].schema(),
        )
        .unwrap();
        let all = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
        w.write(&all.slice(0, 1234)).unwrap();
        w.write(&all.slice(1234, all.num_rows() - 1234)).unwrap();
        w.finish().unwrap();
    }

    let mut outputs = Vec::new();
    for (workers, file) in [
        ("1", input_s),
        ("2", input_s),
        ("3", input_s),
        ("2", ipc.to_str().unwrap()),
    ] {
        let out = dir.path().join(format!("out-{workers}-{}", outputs.len()));
        let sink = format!("parquet:{}", out.display());
        let s = hydrant_ok(&[
            "run",
            "--pipeline",
            toml,
            "--input",
            file,
            "--state",
            state_s,
            "--workers",
            workers,
            "--sink",
            &sink,
        ]);
        assert_eq!(s["rows"], 5_000);
        outputs.push(read_output(&out));
    }
    for o in &outputs[1..] {
        assert!(o == &outputs[0], "outputs differ");
    }
}

#[test]
fn two_inputs_are_numbered_in_the_order_given() {
    let dir = tempfile::tempdir().unwrap();
    let a = gen_criteo(dir.path(), 1_000, 1);
    let b = gen_criteo(dir.path(), 700, 2);
    let toml = criteo_toml();
    let out = dir.path().join("out");
    let s = hydrant_ok(&[
        "run",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--sink",
        &format!("parquet:{}", out.display()),
    ]);
    assert_eq!(s["rows"], 1_700);
    let rows = read_output(&out);
    let labels_b = read_plain(&b).label;
    for (k, l) in labels_b.iter().enumerate() {
        assert_eq!(rows[&(1_000 + k as u64)].label, Some(*l as f32));
    }
}

/// Already-featurized input (tensor columns) passes through a pipeline with no steps
/// unchanged: the Flight transport benchmark serves such a file.
#[test]
fn tensor_columns_pass_through_unchanged() {
    use std::sync::Arc;

    use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};

    let dir = tempfile::tempdir().unwrap();
    let rows = 3000usize;
    let f = Arc::new(Field::new("item", DataType::Float32, false));
    let i = Arc::new(Field::new("item", DataType::Int64, false));
    let schema = Arc::new(Schema::new(vec![
        Field::new("label", DataType::Float32, false),
        Field::new("dense", DataType::FixedSizeList(f.clone(), 3), false),
        Field::new("ids", DataType::FixedSizeList(i.clone(), 2), false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Float32Array::from_iter_values(
                (0..rows).map(|r| (r % 2) as f32),
            )),
            Arc::new(
                FixedSizeListArray::try_new(
                    f,
                    3,
                    Arc::new(Float32Array::from_iter_values(
                        (0..rows * 3).map(|v| v as f32 / 7.0),
                    )),
                    None,
                )
                .unwrap(),
            ),
            Arc::new(
                FixedSizeListArray::try_new(
                    i,
                    2,
                    Arc::new(Int64Array::from_iter_values(
                        (0..rows as i64 * 2).map(|v| v * 11),
                    )),
                    None,
                )
                .unwrap(),
            ),
        ],
    )
    .unwrap();
    let input = dir.path().join("featurized.arrow");
    let mut w =
        arrow::ipc::writer::FileWriter::try_new(std::fs::File::create(&input).unwrap(), &schema)
            .unwrap();
    w.write(&batch.slice(0, 1000)).unwrap();
    w.write(&batch.slice(1000, 2000)).unwrap();
    w.finish().unwrap();
    let toml = dir.path().join("pass.toml");
    std::fs::write(
        &toml,
        "name = \"pass\"\nlabel = { column = \"label\" }\n\
         [[group]]\nname = \"dense\"\nkind = \"dense\"\ncolumns = [\"dense\"]\n\
         [[group]]\nname = \"ids\"\nkind = \"ids\"\ncolumns = [\"ids\"]\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let s = hydrant_ok(&[
        "run",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--sink",
        &format!("parquet:{}", out.display()),
    ]);
    assert_eq!(s["rows"], rows as u64);
    let got = read_output(&out);
    assert_eq!(got.len(), rows);
    for (id, row) in got {
        let r = id as usize;
        assert_eq!(row.label, Some((r % 2) as f32));
        let dense: Vec<f32> = (0..3).map(|k| (r * 3 + k) as f32 / 7.0).collect();
        assert_eq!(row.dense, dense);
        assert_eq!(row.ids, vec![(r as i64 * 2) * 11, (r as i64 * 2 + 1) * 11]);
    }
    // Steps on a tensor column are refused, naming it.
    std::fs::write(
        &toml,
        "name = \"pass\"\n[[group]]\nname = \"dense\"\nkind = \"dense\"\ncolumns = [\"dense\"]\n\
         steps = [\"clip(0, 1)\"]\n",
    )
    .unwrap();
    let err = hydrant_err(&[
        "run",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(
        err.contains("column `dense`") && err.contains("no steps"),
        "{err}"
    );
}
