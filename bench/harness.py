"""Runs hydrant and its peers on the same data, alternately, and writes BENCHMARKS.md.

Started by `bench/run` (which sets up the virtual environment and builds hydrant); see
`bench/run --help`. Every figure is a median over repetitions that alternate between the
systems, so a noisy machine slows all of them alike and the ratios hold.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

import cluster
import report

ROOT = pathlib.Path(__file__).resolve().parents[1]
PEERS = ROOT / "bench" / "peers"
# The binary `bench/run` built, or the one HYDRANT_BIN names (CI passes the one its tests
# built, so that nothing is built twice).
HYDRANT = pathlib.Path(os.environ.get("HYDRANT_BIN", ROOT / "target" / "release" / "hydrant"))
PY = sys.executable
# A system whose single run takes longer than this at some size runs once there.
SLOW_S = 60.0


def measure(argv, env=None):
    """Runs argv to the end, sampling the RSS of its whole process tree every 5 ms.

    Returns the last stdout line as JSON plus `wall_s`, `peak_tree_mb` and `late_median_mb`
    (the median of the samples in the run's second half: where memory settles, which a
    peak — the largest of many samples of a fluctuating figure — overstates more the
    longer a run is); a failing command raises with its stderr.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    samples, done = [], threading.Event()

    def sample():
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [root] + root.children(recursive=True)
                samples.append(sum(p.memory_info().rss for p in tree))
            except psutil.Error:
                pass
            done.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{err[-3000:]}")
    # The summary is the last JSON line: a peer's runtime may print after it (Ray did,
    # once in CI, a line that was not JSON).
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{' '.join(map(str, argv))} printed no JSON summary:\n{out[-3000:]}")
    result = json.loads(lines[-1])
    result["wall_s"] = round(wall, 3)
    result["peak_tree_mb"] = round(max(samples, default=0) / 2**20, 1)
    late = samples[len(samples) // 2:]
    result["late_median_mb"] = round(statistics.median(late) / 2**20, 1) if late else None
    return result


def generate(work, rows):
    path = work / f"criteo-{rows}.parquet"
    if not path.exists():
        measure([PY, PEERS / "gen_criteo.py", str(rows), str(path)])
    return path


def e2e_systems(args, work):
    """Name -> function(input, rows) -> argv, for the end-to-end Criteo job to training batches."""
    spark_env = dict(os.environ, PYSPARK_PYTHON=PY, PYSPARK_DRIVER_PYTHON=PY)
    states = {}

    def hydrant(pipeline, state):
        def argv(path, rows):
            cmd = [HYDRANT, "run", "--pipeline", ROOT / "examples" / f"{pipeline}.toml",
                   "--input", path, "--ranks", "2", "--batch-size", "4096", "--sink", "null"]
            if state:
                key = (pipeline, rows)
                if key not in states:
                    states[key] = work / f"state-{pipeline}-{rows}.json"
                    measure([HYDRANT, "fit", "--pipeline", cmd[3], "--input", path,
                             "--out", states[key]])
                cmd += ["--state", states[key]]
            return [str(c) for c in cmd], None
        return argv

    def peer(script, *mode, env=None):
        return lambda path, rows: ([PY, str(PEERS / script), *mode, str(path)], env)

    systems = {
        "hydrant hash": hydrant("criteo_hash", False),
        "hydrant hash, fitted state": hydrant("criteo_hash", True),
        "hydrant vocab": hydrant("criteo", False),
        "hydrant vocab, fitted state": hydrant("criteo", True),
        "polars": peer("polars_criteo.py"),
        # How Ray Train feeds ranks: streaming_split(2, equal=True), iter_batches per rank.
        "ray": peer("ray_criteo.py"),
    }
    for mode in ("native", "pandas_udf", "udf"):
        if mode in args.spark:
            systems[f"spark {mode}"] = peer("spark_criteo.py", mode, env=spark_env)
    return systems


def run_e2e(args, work):
    """Every system at every size, alternating within each repetition."""
    systems = e2e_systems(args, work)
    results = {}
    for rows in args.sizes:
        path = generate(work, rows)
        print(f"e2e: {rows:,} rows", flush=True)
        slow = set()
        for rep in range(args.reps):
            for name, argv in systems.items():
                if name in slow or (name.startswith("spark ") and name != "spark native"
                                    and rows > args.spark_udf_max_rows) or (
                                        name == "ray" and rows > args.ray_max_rows):
                    continue
                cmd, env = argv(path, rows)
                r = measure(cmd, env)
                r["input_rows"] = rows
                # Ray's equal split drops rows (ray#63285): reported, not fatal.
                if r["rows"] != rows and name != "ray":
                    raise RuntimeError(f"{name} delivered {r['rows']} rows of {rows}")
                r["peak_mb"] = max(r["peak_tree_mb"], r.get("peak_rss_mb") or 0)
                r["total_s"] = r.get("total_s", r.get("seconds"))
                results.setdefault(f"{name}|{rows}", []).append(r)
                print(f"  {rep + 1}/{args.reps} {name:30} total {r['total_s']:8.3f} s  first "
                      f"{r['first_batch_s']:8.3f} s  wall {r['wall_s']:8.3f} s  peak "
                      f"{r['peak_mb']:8.1f} MB", flush=True)
                if r["wall_s"] > SLOW_S:
                    slow.add(name)
    return results


def run_flight(args):
    """One stream, then four concurrent ones (hydrant: four ranks), on each side; the peer
    with its server in the clients' process (as given), in a process of its own, and as
    given serving hydrant's row id and padding columns too."""
    rows, pulls = str(args.flight_rows), "3" if args.smoke else "5"
    runs = {}
    print("flight", flush=True)
    for _ in range(args.reps):
        for streams in ("1", "4"):
            x = "" if streams == "1" else f" x{streams}"
            # The peer as given runs its server in the clients' process; the second run of
            # it gives the server a process of its own, as hydrant's has.
            for name, cmd, extra in (
                (f"hydrant serve{x}", [PEERS / "hydrant_flight.py", HYDRANT], []),
                (f"pyarrow C++ server{x}", [PEERS / "flight_pyarrow.py"], []),
                (f"pyarrow C++ server, own process{x}", [PEERS / "flight_pyarrow.py"],
                 ["own-process"]),
                # The peer as given, its batches carrying hydrant's row ids and padding
                # flags too (counted by neither): the same messages on both sides.
                (f"pyarrow C++ server, same columns{x}", [PEERS / "flight_pyarrow.py"],
                 ["same-columns"]),
            ):
                r = measure([PY, *cmd, rows, pulls, streams, *extra])
                if r["rows"] != args.flight_rows:
                    raise RuntimeError(f"{name}: pulled {r['rows']} rows of {args.flight_rows}")
                runs.setdefault(name, []).append(r)
                print(f"  {name:36} {r['median_gb_per_s']} GB/s", flush=True)
    return runs


def run_kernels(args):
    """criterion for hydrant, NumPy before and after it (the better NumPy run counts)."""
    quick = ["--quick"] if args.smoke else []
    numpy = [measure([PY, PEERS / "numpy_kernels.py", *quick])["values_per_s"]]
    criterion_dir = ROOT / "target" / "criterion"
    groups = ("fill_null_log1p_standardize_clip", "standardize_clip", "strings", "assembly",
              "batch_transform", "batch_chain")
    for g in groups:
        shutil.rmtree(criterion_dir / g, ignore_errors=True)
    timing = (["--warm-up-time", "0.05", "--measurement-time", "0.1", "--sample-size", "10"]
              if args.smoke else ["--warm-up-time", "1", "--measurement-time", "2"])
    print("kernels: cargo bench", flush=True)
    bench = subprocess.run(["cargo", "bench", "--quiet", "-p", "hydrant-operators", "--bench",
                            "kernels", "--bench", "batch_size", "--", "--noplot", *timing],
                           cwd=ROOT, capture_output=True, text=True)
    if bench.returncode != 0:
        raise RuntimeError(f"cargo bench failed ({bench.returncode}):\n{bench.stderr[-3000:]}")
    numpy.append(measure([PY, PEERS / "numpy_kernels.py", *quick])["values_per_s"])
    hydrant = {}
    for bench in criterion_dir.glob("*/**/new/benchmark.json"):
        meta = json.loads(bench.read_text())
        if meta["group_id"] not in groups:
            continue
        median_ns = json.loads((bench.parent / "estimates.json").read_text())["median"]["point_estimate"]
        key = "/".join(p for p in (meta["group_id"], meta.get("function_id"), meta.get("value_str")) if p)
        hydrant[key] = meta["throughput"]["Elements"] / (median_ns * 1e-9)
    best_numpy = {k: max(run[k] for run in numpy) for k in numpy[0]}
    missing = [c for c, n, _, _ in report.KERNELS if c not in hydrant or n not in best_numpy]
    if missing:
        raise RuntimeError(f"no figure for kernels {missing}")
    return {"hydrant": hydrant, "numpy": best_numpy}


def main():
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny data, one repetition, quick criterion; writes to a temporary folder")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per system and size")
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000],
                    help="input rows of the end-to-end runs (the middle one is the headline)")
    ap.add_argument("--spark", nargs="*", default=["native", "pandas_udf", "udf"],
                    help="Spark modes to run")
    ap.add_argument("--spark-udf-max-rows", type=int, default=1_000_000,
                    help="largest input the slow Spark modes (pandas_udf, udf) run on")
    ap.add_argument("--ray-max-rows", type=int, default=1_000_000,
                    help="largest input the Ray Data peer runs on")
    ap.add_argument("--flight-rows", type=int, default=31 * 65536)
    ap.add_argument("--cluster-rows", type=int, default=10_000_000,
                    help="input rows of the scale-out runs")
    ap.add_argument("--only", nargs="*", default=["e2e", "flight", "kernels", "cluster"],
                    help="sections to run (none: rewrite BENCHMARKS.md from the last figures)")
    ap.add_argument("--out", type=pathlib.Path, help="where BENCHMARKS.md (and bench/charts, "
                    "bench/results.json) go: default the repository root; --smoke: a temporary folder")
    args = ap.parse_args()
    if args.smoke:
        args.reps, args.sizes, args.flight_rows = 1, [20_000, 40_000], 2 * 65536
        args.cluster_rows = 40_000
        # Ray takes its time to start: once, on the smallest input, so the script cannot rot.
        args.ray_max_rows = 20_000
    out = args.out or (pathlib.Path(tempfile.mkdtemp(prefix="hydrant-bench-")) if args.smoke else ROOT)
    work = pathlib.Path(tempfile.mkdtemp(prefix="hydrant-bench-data-"))
    started = time.time()
    # A run of some sections keeps the others' figures from the last run into the same place.
    previous = out / "bench" / "results.json"
    results = json.loads(previous.read_text()) if previous.exists() and not args.smoke else {}
    try:
        if "e2e" in args.only:
            results["e2e"] = run_e2e(args, work)
        if "flight" in args.only:
            results["flight"] = run_flight(args)
        if "kernels" in args.only:
            results["kernels"] = run_kernels(args)
        if "cluster" in args.only:
            results["cluster"] = cluster.run(HYDRANT, args, work, generate, measure)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.only:
        # The machine and the commit the figures were measured on (a run of no sections
        # only rewrites BENCHMARKS.md from the last figures).
        results["machine"] = report.machine()
        results["args"] = {k: str(v) for k, v in vars(args).items()}
        where = report.measured_where()
        results.setdefault("measured_at", {}).update({s: where for s in args.only})
        results["seconds"] = round(time.time() - started)
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / "results.json").write_text(json.dumps(results, indent=1, default=str))
    report.write(results, args, out)
    print(f"wrote {out / 'BENCHMARKS.md'} in {round(time.time() - started)} s")


if __name__ == "__main__":
    main()
