"""End to end through `hydrant serve`: from starting the server on a raw Criteo-like Parquet
file (`examples/criteo.toml`, so the vocabularies are fitted at start) until two concurrent
pyarrow clients, one per rank, hold every batch of their rank. The peer is
`polars_flight.py` (Polars featurizes, pyarrow's C++ Flight server serves, a client pulls).

usage: python hydrant_serve_e2e.py HYDRANT_BIN IN.parquet [PIPELINE.toml]   (one JSON line;
total_s = start to both ranks held)
"""
import json
import pathlib
import sys
import time
import tomllib

import pyarrow.flight as fl

import procs
from featurized import pull_all

ROOT = pathlib.Path(__file__).resolve().parents[2]
binary, data = sys.argv[1], sys.argv[2]
pipeline = sys.argv[3] if len(sys.argv) > 3 else str(ROOT / "examples" / "criteo.toml")
name = tomllib.loads(pathlib.Path(pipeline).read_text())["name"]

t0 = time.perf_counter()
server, uri = procs.serve(binary, "--pipeline", pipeline, "--input", data, "--ranks", "2",
                          "--batch-size", "4096")
try:
    t_ready = time.perf_counter() - t0
    clients = [fl.connect(uri) for _ in range(2)]
    pairs = [(c, fl.Ticket(json.dumps({"pipeline": name, "epoch": 0, "rank": r,
                                       "world_size": 2}).encode()))
             for r, c in enumerate(clients)]
    rows, nbytes = pull_all(pairs)
    total = time.perf_counter() - t0
finally:
    server.terminate()
    server.wait()
print(json.dumps({"peer": "hydrant_serve", "rows": rows, "bytes": nbytes,
                  "ready_s": round(t_ready, 3), "total_s": round(total, 3)}))
