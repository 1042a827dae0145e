//! Hostile pipelines and states: group names that collide or are unsafe, states of
//! another version, chain or shape, and statistics that overflow — each refused in one
//! line before anything is read or served.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use arrow::array::RecordBatch;
use common::*;
use hydrant::operators::{FittedParam, FittedState, Vocabulary};

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
