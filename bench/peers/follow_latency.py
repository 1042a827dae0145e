"""Freshness of a followed folder: the time from a new file's rename into the folder of
`hydrant serve --follow` to its first rows reaching a trainer (p50, p99), one 65,536-row
Parquet file at a time, two ranks reading; then streaming throughput against file mode.

usage: python follow_latency.py HYDRANT_BIN [FILES]   (prints JSON lines)
"""
import functools
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import threading
import time

import procs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
from hydrant_client import Client  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
binary = sys.argv[1]
files = int(sys.argv[2]) if len(sys.argv) > 2 else 30
ROWS, BATCH, RANKS = 65_536, 4096, 2
tmp = procs.scratch()
hydrant = functools.partial(procs.run, binary)


def serve(*args):
    server, uri = procs.serve(binary, *args, stderr=subprocess.DEVNULL)
    return server, Client(uri)


pipeline = ROOT / "examples" / "criteo_hash.toml"
data, state = tmp / "part.parquet", tmp / "state.json"
hydrant("gen", "criteo", "--rows", ROWS, "--out", data)
hydrant("fit", "--pipeline", pipeline, "--input", data, "--out", state)
folder = tmp / "in"
folder.mkdir()
server, client = serve("--pipeline", pipeline, "--state", state, "--follow", folder,
                       "--ranks", RANKS, "--batch-size", BATCH)
arrived = {}  # step -> when rank 0 got it


def read(rank):
    try:
        for b in client.batches("criteo_hash", rank, RANKS):
            if rank == 0:
                arrived.setdefault(b.step, time.perf_counter())
    except Exception:
        pass  # the server is stopped at the end


readers = [threading.Thread(target=read, args=(r,), daemon=True) for r in range(RANKS)]
for t in readers:
    t.start()
latencies = []
steps_per_file = ROWS // (BATCH * RANKS)
try:
    for k in range(files):
        shutil.copy(data, folder / f"_part-{k:05}.parquet")
        renamed = time.perf_counter()
        (folder / f"_part-{k:05}.parquet").rename(folder / f"part-{k:05}.parquet")
        first = k * steps_per_file
        while first not in arrived:
            time.sleep(0.0005)
        latencies.append(arrived[first] - renamed)
        while first + steps_per_file - 1 not in arrived:
            time.sleep(0.001)
    # Written under hidden names first (the follower ignores them), so that the timing is
    # hydrant's, not this script's copying on the same cores: as in file mode below, the
    # files are at rest when the clock starts, and a rename is what admits a file.
    for k in range(files, 2 * files):
        shutil.copy(data, folder / f"_part-{k:05}.parquet")
    t0 = time.perf_counter()
    for k in range(files, 2 * files):
        (folder / f"_part-{k:05}.parquet").rename(folder / f"part-{k:05}.parquet")
    while (2 * files) * steps_per_file - 1 not in arrived:
        time.sleep(0.001)
    streaming = files * ROWS / (time.perf_counter() - t0)
finally:
    server.terminate()
    server.wait()
latencies.sort()
print(json.dumps({"measure": "follow_first_rows_ms", "files": files,
                  "p50": round(1e3 * statistics.median(latencies), 1),
                  "p99": round(1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
                  "max": round(1e3 * latencies[-1], 1)}))
# File mode on the same rows: the same files given at start, one epoch.
for k in range(files):
    shutil.copy(data, tmp / f"f-{k:05}.parquet")
inputs = [tmp / f"f-{k:05}.parquet" for k in range(files)]
args = ["--pipeline", pipeline, "--state", state, "--ranks", RANKS, "--batch-size", BATCH]
for i in inputs:
    args += ["--input", i]
server, client = serve(*args)
try:
    t0 = time.perf_counter()
    done = [threading.Thread(target=lambda r=r: sum(1 for _ in client.batches(
        "criteo_hash", r, RANKS)), daemon=True) for r in range(RANKS)]
    for t in done:
        t.start()
    for t in done:
        t.join()
    files_mode = files * ROWS / (time.perf_counter() - t0)
finally:
    server.terminate()
    server.wait()
print(json.dumps({"measure": "streaming_vs_files_rows_per_s", "streaming": round(streaming),
                  "files": round(files_mode), "ratio": round(streaming / files_mode, 2)}))
