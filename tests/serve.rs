//! `hydrant serve` refuses unsafe or broken set-ups with one line, before serving.
//! (The protocol itself is tested from Python, with pyarrow, in python/tests.)

mod common;

use common::*;

#[test]
fn serve_refuses_bad_setups() {
    let dir = tempfile::tempdir().unwrap();
    let input = gen_criteo(dir.path(), 1000, 1);
    let toml = criteo_toml();
    let base = [
        "serve",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ];
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "no-colon-here\n").unwrap();
    let missing = dir.path().join("missing");
    for (extra, needle) in [
        (vec!["--listen", "0.0.0.0:0"], "--token-file"),
        (vec!["--listen", "nonsense"], "--listen nonsense"),
        (
            vec!["--token-file", tokens.to_str().unwrap()],
            "user:password",
        ),
        (
            vec!["--token-file", missing.to_str().unwrap()],
            "token file",
        ),
        (vec!["--ranks", "0"], "--ranks"),
        // A device named by mistake is refused, not read until memory runs out.
        (vec!["--token-file", "/dev/zero"], "regular file"),
        (
            vec!["--tls-cert", "/dev/zero", "--tls-key", "/dev/zero"],
            "regular file",
        ),
    ] {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra.iter());
        let err = hydrant_err(&args);
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
}

#[test]
fn a_pipeline_that_is_not_a_small_regular_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = gen_criteo(dir.path(), 100, 1);
    let input = input.to_str().unwrap();
    for (pipeline, needle) in [("/dev/zero", "regular file"), ("/tmp", "regular file")] {
        let err = hydrant_err(&["serve", "--pipeline", pipeline, "--input", input]);
        assert!(err.contains(pipeline) && err.contains(needle), "{err}");
    }
}
