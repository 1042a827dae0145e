"""Durable DoPut: acknowledged MB/s of pushed Criteo rows into `hydrant serve` with
`--state-dir` (each batch spooled and synced before its acknowledgement) against the same
server without it, while two ranks drain the stream.

usage: python push_durable.py HYDRANT_BIN [ROWS] [BATCH_ROWS] [REPS]   (prints JSON lines)
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

import pyarrow.parquet as pq

import procs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
from hydrant_client import Client  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
binary = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
batch_rows = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
tmp = procs.scratch()
hydrant = functools.partial(procs.run, binary)


data, state = tmp / "criteo.parquet", tmp / "state.json"
hydrant("gen", "criteo", "--rows", rows, "--out", data)
pipeline = (ROOT / "examples" / "criteo_hash.toml").read_text()
(tmp / "files.toml").write_text(pipeline)
hydrant("fit", "--pipeline", tmp / "files.toml", "--input", data, "--out", state)
(tmp / "pushed.toml").write_text('input = "flight"\n' + pipeline)
table = pq.read_table(data)
batches = table.to_batches(max_chunksize=batch_rows)
nbytes = sum(b.nbytes for b in batches)


def run(durable):
    spool = tmp / f"spool-{time.monotonic_ns()}"
    args = ["--pipeline", tmp / "pushed.toml", "--state", state, "--ranks", 2,
            "--batch-size", 4096]
    if durable:
        args += ["--state-dir", spool]
    server, uri = procs.serve(binary, *args, stderr=subprocess.DEVNULL)
    try:
        client = Client(uri)
        readers = [threading.Thread(target=lambda r=r: sum(1 for _ in client.batches(
            "criteo_hash", r, 2)), daemon=True) for r in range(2)]
        for t in readers:
            t.start()
        t0 = time.perf_counter()
        acks = client.push("criteo_hash", batches, producer="bench")
        seconds = time.perf_counter() - t0
        assert sum(a["rows"] for a in acks) == rows
        client.end_ingest("criteo_hash")
        for t in readers:
            t.join()
        return nbytes / seconds / 1e6
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(spool, ignore_errors=True)


for durable in (False, True):
    rates = [run(durable) for _ in range(reps)]
    print(json.dumps({"durable": durable, "rows": rows, "batch_rows": batch_rows,
                      "median_mb_per_s": round(statistics.median(rates), 1),
                      "mb_per_s": [round(r, 1) for r in rates]}))
