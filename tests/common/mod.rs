//! Helpers shared by the integration tests: run the real `hydrant` binary, read what it
//! wrote.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type, UInt64Type};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

pub mod follow;
pub mod pushed;

/// The criteo pipeline shipped in examples/.
pub fn criteo_toml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/criteo.toml")
}

/// Runs `hydrant ARGS` to completion.
pub fn hydrant(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hydrant"))
        .args(args)
        .output()
        .expect("hydrant runs")
}

/// The arguments of `hydrant run` of `toml` over `input`, then `extra`.
pub fn run_of<'a>(toml: &'a Path, input: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--pipeline",
        toml.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args
}

/// Runs `hydrant ARGS`, asserts success, and returns the last stdout line as JSON.
pub fn hydrant_ok(args: &[&str]) -> serde_json::Value {
    let out = hydrant(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "hydrant {args:?} failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().expect("a summary line")).expect("summary is JSON")
}

/// Runs `hydrant ARGS`, asserts it fails with one clear line (no panic), and returns it.
pub fn hydrant_err(args: &[&str]) -> String {
    let out = hydrant(args);
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "hydrant {args:?} should fail");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    stderr
}

/// `hydrant_err`, also asserting it took under `limit`.
pub fn err_within(limit: Duration, args: &[&str]) -> String {
    let t = Instant::now();
    let err = hydrant_err(args);
    assert!(t.elapsed() < limit, "{args:?} took {:?}", t.elapsed());
    err
}

/// The one line of stderr of `hydrant ARGS`, which must exit non-zero within `limit`: one
/// still running then (a server that took what it should refuse) is killed and fails.
pub fn refused_within(limit: Duration, args: &[&str]) -> String {
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

/// Writes `batches` as an Arrow IPC stream (`stream`) or file.
pub fn write_ipc(path: &Path, batches: &[RecordBatch], stream: bool) {
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

/// Generates a Criteo-like file of `rows` rows.
pub fn gen_criteo(dir: &Path, rows: u64, seed: u64) -> PathBuf {
    gen_criteo_in_row_groups(dir, rows, seed, 65_536)
}

/// [`gen_criteo`] in row groups of `row_group_rows` rows.
pub fn gen_criteo_in_row_groups(dir: &Path, rows: u64, seed: u64, row_group_rows: u64) -> PathBuf {
    let path = dir.join(format!("criteo-{rows}-{seed}-{row_group_rows}.parquet"));
    let path_s = path.to_str().unwrap();
    hydrant_ok(&[
        "gen",
        "criteo",
        "--rows",
        &rows.to_string(),
        "--out",
        path_s,
        "--seed",
        &seed.to_string(),
        "--row-group-rows",
        &row_group_rows.to_string(),
    ]);
    path
}

/// A temporary folder holding a 2,000-row Criteo-like file, and that file's path.
pub fn small_criteo() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let input = gen_criteo(dir.path(), 2_000, 1);
    (dir, input.to_str().unwrap().to_string())
}

/// A folder `dir/in` of Criteo-like files (one unit each) of `rows[i]` rows with seed
/// `first_seed + i`, and a state fitted on it at `dir/state.json`.
pub fn folder_with_state(dir: &Path, rows: &[u64], first_seed: u64) -> (PathBuf, PathBuf) {
    let folder = dir.join("in");
    std::fs::create_dir_all(&folder).unwrap();
    for (i, &n) in rows.iter().enumerate() {
        let f = gen_criteo(dir, n, first_seed + i as u64);
        std::fs::rename(f, folder.join(format!("part-{i}.parquet"))).unwrap();
    }
    let state = dir.join("state.json");
    fit_criteo(&folder, &state);
    (folder, state)
}

/// `hydrant fit` of the criteo pipeline over `input`, written to `state`.
pub fn fit_criteo(input: &Path, state: &Path) {
    hydrant_ok(&[
        "fit",
        "--pipeline",
        criteo_toml().to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--out",
        state.to_str().unwrap(),
    ]);
}

/// Reads all batches of a Parquet file.
pub fn read_parquet(path: &Path) -> Vec<RecordBatch> {
    let file = std::fs::File::open(path).unwrap();
    ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// One featurized output row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub label: Option<f32>,
    pub dense: Vec<f32>,
    pub ids: Vec<i64>,
}

/// Reads every `part-*.parquet` under `dir` into rows keyed by `row_id`, asserting that no
/// row id appears twice in an epoch and that a row is the same in every epoch; padding
/// rows are checked for their marks and left out.
pub fn read_output(dir: &Path) -> BTreeMap<u64, Row> {
    let mut rows = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in files {
        for b in read_parquet(&f) {
            let ids = b
                .column_by_name("row_id")
                .unwrap()
                .as_primitive::<UInt64Type>();
            let label = b
                .column_by_name("label")
                .unwrap()
                .as_primitive::<Float32Type>();
            let dense = b.column_by_name("dense").unwrap().as_fixed_size_list();
            let cats = b.column_by_name("ids").unwrap().as_fixed_size_list();
            let (dw, cw) = (dense.value_length() as usize, cats.value_length() as usize);
            let dv = dense.values().as_primitive::<Float32Type>();
            let cv = cats.values().as_primitive::<Int64Type>();
            let padding = b.column_by_name("is_padding").unwrap().as_boolean();
            let epochs = b.column_by_name("epoch").unwrap().clone();
            let epochs = epochs.as_primitive::<UInt64Type>();
            for r in 0..b.num_rows() {
                if padding.value(r) {
                    assert_eq!(ids.value(r), u64::MAX, "a padding row with a real row id");
                    continue;
                }
                let row = Row {
                    label: label.is_valid(r).then(|| label.value(r)),
                    dense: dv.values()[r * dw..(r + 1) * dw].to_vec(),
                    ids: cv.values()[r * cw..(r + 1) * cw].to_vec(),
                };
                let id = ids.value(r);
                assert!(
                    seen.insert((epochs.value(r), id)),
                    "row {id} delivered twice in an epoch"
                );
                if let Some(before) = rows.insert(id, row.clone()) {
                    assert_eq!(before, row, "row {id} differs between epochs");
                }
            }
        }
    }
    rows
}

/// One delivered row's place, as a parquet sink records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placed {
    pub epoch: u64,
    pub step: u64,
    pub rank: u32,
    /// Row within the rank's batch.
    pub slot: usize,
    pub row_id: u64,
    pub is_padding: bool,
}

/// Reads every row of every part file under `dir` with its (epoch, step, rank, slot), in
/// delivery order.
pub fn read_placed(dir: &Path) -> Vec<Placed> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut slots: BTreeMap<(u64, u64, u32), usize> = BTreeMap::new();
    for f in files {
        for b in read_parquet(&f) {
            let col = |n: &str| b.column_by_name(n).unwrap().clone();
            let (ids, ranks, epochs, steps, pad) = (
                col("row_id"),
                col("rank"),
                col("epoch"),
                col("step"),
                col("is_padding"),
            );
            let ids = ids.as_primitive::<UInt64Type>();
            let ranks = ranks.as_primitive::<arrow::datatypes::UInt32Type>();
            let epochs = epochs.as_primitive::<UInt64Type>();
            let steps = steps.as_primitive::<UInt64Type>();
            let pad = pad.as_boolean();
            for r in 0..b.num_rows() {
                let key = (epochs.value(r), steps.value(r), ranks.value(r));
                let slot = slots.entry(key).or_default();
                out.push(Placed {
                    epoch: key.0,
                    step: key.1,
                    rank: key.2,
                    slot: *slot,
                    row_id: ids.value(r),
                    is_padding: pad.value(r),
                });
                *slot += 1;
            }
        }
    }
    out.sort();
    out
}

/// Sends signal `sig` (`-STOP`, `-CONT`, `-TERM`, ...) to processes `pids`, with `kill`.
pub fn signal(sig: &str, pids: &[u32]) {
    let ok = Command::new("kill")
        .arg(sig)
        .args(pids.iter().map(u32::to_string))
        .status()
        .unwrap();
    assert!(ok.success(), "kill {sig} {pids:?}");
}

/// A free port on loopback for a process to listen on later, taken below the kernel's
/// ephemeral range: a port the kernel handed out (bound to 0 and let go) can become the
/// source port of another test's outgoing connection before the process listens on it, and
/// then its listen fails with "Address already in use" (seen in CI). Each test binary
/// starts at its own offset, and each port is checked by binding it.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&l| l > 12_000)
        .unwrap_or(32_768);
    let (base, span) = (10_000, low - 10_000);
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let port = (base + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on loopback below {low}")
}

/// Starts `hydrant ARGS` as every process of a cluster of `processes` on loopback, each
/// with `workers` threads (a fresh hostfile in `dir`).
pub fn spawn_cluster(dir: &Path, processes: usize, workers: usize, args: &[&str]) -> Vec<Child> {
    spawn_cluster_with(dir, processes, workers, |_| {
        args.iter().map(|a| a.to_string()).collect()
    })
}

/// [`spawn_cluster`] with each process's own arguments, `args(process)`.
pub fn spawn_cluster_with(
    dir: &Path,
    processes: usize,
    workers: usize,
    args: impl Fn(usize) -> Vec<String>,
) -> Vec<Child> {
    let hosts = dir.join(format!("hosts-{}.txt", free_port()));
    let lines: String = (0..processes)
        .map(|_| format!("127.0.0.1:{}\n", free_port()))
        .collect();
    std::fs::write(&hosts, lines).unwrap();
    (0..processes)
        .map(|p| {
            Command::new(env!("CARGO_BIN_EXE_hydrant"))
                .args(args(p))
                .args(["--workers", &workers.to_string()])
                .args(["--processes", &processes.to_string()])
                .args(["--process", &p.to_string()])
                .args(["--hostfile", hosts.to_str().unwrap()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Runs `hydrant ARGS` as every process of a cluster (see [`spawn_cluster`]), asserts all
/// succeed, and returns each one's summary JSON (its last stdout line), by process.
pub fn run_cluster(
    dir: &Path,
    processes: usize,
    workers: usize,
    args: &[&str],
) -> Vec<serde_json::Value> {
    spawn_cluster(dir, processes, workers, args)
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "hydrant {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap())
                .unwrap()
        })
        .collect()
}

/// A `hydrant serve` child, killed when dropped.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `hydrant serve --listen 127.0.0.1:0 ARGS`; returns it and its `http://` address
/// (from the ready line it prints).
pub fn serve(args: &[&std::ffi::OsStr]) -> (Server, String) {
    serve_on("127.0.0.1:0", args)
}

/// Starts `hydrant serve --listen LISTEN ARGS` (see [`serve`]).
pub fn serve_on(listen: &str, args: &[&std::ffi::OsStr]) -> (Server, String) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_hydrant"))
        .args(["serve", "--listen", listen])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).expect("a ready line");
    let addr = ready["listening"].as_str().unwrap().to_string();
    (Server(child), format!("http://{addr}"))
}

/// `hydrant serve` of `examples/criteo.toml` over `data` with the fitted `state`, plus
/// `extra` arguments.
pub fn serve_criteo(data: &Path, state: &Path, extra: &[&str]) -> (Server, String) {
    use std::ffi::OsStr;
    let toml = criteo_toml();
    let mut args: Vec<&OsStr> = vec![
        "--pipeline".as_ref(),
        toml.as_os_str(),
        "--input".as_ref(),
        data.as_os_str(),
        "--state".as_ref(),
        state.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    serve(&args)
}

/// The row ids of a served batch's real rows (not padding).
pub fn real_row_ids(batch: &RecordBatch) -> Vec<u64> {
    let ids = batch
        .column_by_name("row_id")
        .unwrap()
        .as_primitive::<UInt64Type>();
    let padding = batch.column_by_name("is_padding").unwrap().as_boolean();
    (0..batch.num_rows())
        .filter(|&r| !padding.value(r))
        .map(|r| ids.value(r))
        .collect()
}

/// A 1 MiB tmpfs mounted at `at` (made if need be), to fill in tests of a full disk;
/// unmounted when dropped. `None` where mounting is not allowed (not root: CI runs as
/// root, so the tests that need one are skipped only on a developer's machine).
pub fn small_tmpfs(at: &Path) -> Option<Tmpfs> {
    std::fs::create_dir_all(at).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(at)
        .status();
    if mounted.is_ok_and(|s| s.success()) {
        return Some(Tmpfs(at.to_path_buf()));
    }
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_ne!(euid, 0, "root could not mount a tmpfs");
    eprintln!("skipped: mounting a tmpfs needs root");
    None
}

/// A mounted tmpfs (see [`small_tmpfs`]).
pub struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
