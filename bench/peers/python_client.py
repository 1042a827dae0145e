"""The Python client's two figures (issue: trainers fed for real).

1. `stall`: two trainer threads, one per rank, read `hydrant serve` over the Criteo
   pipeline (featurized as they read) with a simulated model step of STEP_MS each, and
   report the share of their time spent waiting for data (the client's
   `stall_seconds` over the wall time of the loop).
2. `numpy`: one rank's batches of already-featurized label/dense/ids rows (the
   pass-through pipeline of hydrant_flight.py) through `Client.batches`, as NumPy views,
   in bytes/s; beside it the same pull with pyarrow's bare reader (no step assembly, no
   views) on the same server, so the client's own overhead is the ratio.

usage: python python_client.py HYDRANT_BIN [ROWS] [STEP_MS] [BATCH]   (one JSON line)
"""
import functools
import json
import pathlib
import sys
import threading
import time

import pyarrow as pa
import pyarrow.flight as fl

import procs
from featurized import featurized_table, pull

from hydrant_client import Client

ROOT = pathlib.Path(__file__).resolve().parents[2]
binary = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
step_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
batch = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
tmp = procs.scratch()
hydrant = functools.partial(procs.run, binary)
serve = functools.partial(procs.serve, binary)


def stall():
    data, state = tmp / "criteo.parquet", tmp / "state.json"
    pipeline = ROOT / "examples" / "criteo.toml"
    hydrant("gen", "criteo", "--rows", rows, "--out", data)
    hydrant("fit", "--pipeline", pipeline, "--input", data, "--out", state)
    server, uri = serve("--pipeline", pipeline, "--input", data, "--state", state,
                        "--ranks", 2, "--batch-size", batch)
    out = {}

    def train(rank):
        reader = Client(uri).batches("criteo", rank, 2)
        t0, steps = time.perf_counter(), 0
        for _ in reader:
            time.sleep(step_ms / 1000)  # the model's step (releases the GIL, as torch does)
            steps += 1
        wall = time.perf_counter() - t0
        out[rank] = {"steps": steps, "wall_s": wall, "stall_s": reader.stall_seconds}

    try:
        threads = [threading.Thread(target=train, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.terminate()
        server.wait()
    return {
        "step_ms": step_ms,
        "steps_per_rank": [out[r]["steps"] for r in range(2)],
        "stall_fraction_per_rank": [round(out[r]["stall_s"] / out[r]["wall_s"], 4)
                                    for r in range(2)],
    }


def numpy_rate(pulls=3):
    table = featurized_table(rows)
    data = tmp / "featurized.arrow"
    with pa.OSFile(str(data), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        for b in table.to_batches(max_chunksize=65536):
            w.write_batch(b)
    toml = tmp / "pass.toml"
    toml.write_text('name = "pass"\nlabel = { column = "label", type = "float32" }\n'
                    'batch_rows = 65536\n[[group]]\nname = "dense"\nkind = "dense"\n'
                    'columns = ["dense"]\n[[group]]\nname = "ids"\nkind = "ids"\n'
                    'columns = ["ids"]\n')
    server, uri = serve("--pipeline", toml, "--input", data, "--ranks", 1,
                        "--batch-size", batch)
    client = Client(uri)
    best = {"client": 0.0, "pyarrow": 0.0}
    try:
        for _ in range(pulls):
            t0 = time.perf_counter()
            nbytes = 0
            for b in client.batches("pass", 0, 1):
                nbytes += b.dense.nbytes + b.ids.nbytes + b.label.nbytes
            best["client"] = max(best["client"], nbytes / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            _, nbytes = pull(fl.connect(uri), client.ticket("pass", 0, 1))
            best["pyarrow"] = max(best["pyarrow"], nbytes / (time.perf_counter() - t0))
    finally:
        server.terminate()
        server.wait()
    return {"client_gb_s": round(best["client"] / 1e9, 3),
            "pyarrow_reader_gb_s": round(best["pyarrow"] / 1e9, 3),
            "ratio": round(best["client"] / best["pyarrow"], 3)}


print(json.dumps({"rows": rows, "batch_size": batch, "stall": stall(), "numpy": numpy_rate()}))
