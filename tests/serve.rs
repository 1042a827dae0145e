//! `hydrant serve` refuses unsafe or broken set-ups with one line, before serving, and waits
//! for its trainers without spinning. (The protocol itself is tested from Python, with pyarrow,
//! in python/tests.)

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

/// Found by a hostile run: the server's HTTP/2 SETTINGS bounded no streams, so one
/// connection could open streams until memory ran out (400k held 3.2 GB). Its first frame,
/// read here off a raw socket, now bounds them.
#[test]
fn the_server_bounds_the_streams_of_a_connection() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let input = gen_criteo(dir.path(), 1000, 1);
    let toml = criteo_toml();
    let (_server, uri) = serve(&[
        "--pipeline".as_ref(),
        toml.as_os_str(),
        "--input".as_ref(),
        input.as_os_str(),
    ]);
    let mut s = std::net::TcpStream::connect(uri.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap(); // an empty SETTINGS frame
    let mut head = [0u8; 9];
    s.read_exact(&mut head).unwrap();
    assert_eq!(
        head[3], 4,
        "the server's first frame is its SETTINGS: {head:?}"
    );
    let mut body = vec![0u8; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
    s.read_exact(&mut body).unwrap();
    let settings: Vec<(u16, u32)> = body
        .chunks_exact(6)
        .map(|c| {
            let id = u16::from_be_bytes([c[0], c[1]]);
            (id, u32::from_be_bytes([c[2], c[3], c[4], c[5]]))
        })
        .collect();
    let most = hydrant_flight::MAX_STREAMS_PER_CONNECTION;
    assert!(settings.contains(&(3, most)), "{settings:?}");
}

/// CPU seconds process `pid` has used (user and system), from `/proc`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: `sysconf` reads a constant of the system; it touches no memory of ours.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Found by a hostile run: a server of one rank on two workers, waiting for its trainer,
/// kept a core 2.5% busy for as long as it waited (the worker with no rank to assemble
/// woke every millisecond to see whether the other had moved on). A server waiting for
/// its trainers uses next to no CPU.
#[test]
fn a_server_waiting_for_its_trainers_does_not_spin() {
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[200_000], 3);
    for ranks in ["1", "2"] {
        let extra = ["--ranks", ranks, "--batch-size", "1000", "--workers", "2"];
        let (server, _uri) = serve_criteo(&data, &state, &extra);
        // Its first epoch's run starts at once and fills what it may hold, then waits.
        std::thread::sleep(std::time::Duration::from_secs(2));
        let before = cpu_seconds(server.0.id());
        std::thread::sleep(std::time::Duration::from_secs(4));
        let used = cpu_seconds(server.0.id()) - before;
        assert!(
            used < 0.05,
            "--ranks {ranks}: {used:.2} CPU s in 4 s of waiting"
        );
    }
}
