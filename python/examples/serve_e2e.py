"""End to end through `hydrant serve`: from starting the server on a raw Parquet file (fit
included) until two concurrent pyarrow clients have received both ranks. The peer of
bench/peers/polars_flight.py (same featurization with examples/criteo_hash.toml).

usage: python serve_e2e.py IN.parquet [HYDRANT_BIN] [PIPELINE]   (prints one JSON line)
"""
import json
import pathlib
import subprocess
import sys
import threading
import time

import pyarrow.flight as fl

root = pathlib.Path(__file__).resolve().parents[2]
data = sys.argv[1]
binary = sys.argv[2] if len(sys.argv) > 2 else str(root / "target/release/hydrant")
pipeline = sys.argv[3] if len(sys.argv) > 3 else str(root / "examples/criteo_hash.toml")

t0 = time.perf_counter()
server = subprocess.Popen(
    [binary, "serve", "--pipeline", pipeline, "--input", data, "--listen", "127.0.0.1:0",
     "--ranks", "2", "--batch-size", "4096"],
    stdout=subprocess.PIPE, text=True)
ready = json.loads(server.stdout.readline())
t_ready = time.perf_counter() - t0
uri = "grpc://" + ready["listening"]
got = {}


def pull(rank):
    client = fl.connect(uri)
    ticket = json.dumps({"pipeline": ready["pipeline"], "rank": rank, "world_size": 2})
    rows = nbytes = 0
    first = None
    for chunk in client.do_get(fl.Ticket(ticket.encode())):
        first = first or time.perf_counter() - t0
        rows += chunk.data.num_rows
        nbytes += chunk.data.nbytes
    got[rank] = (rows, nbytes, first)


threads = [threading.Thread(target=pull, args=(r,)) for r in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
total = time.perf_counter() - t0
server.terminate()
server.wait()
print(json.dumps({
    "system": "hydrant serve", "rows": sum(g[0] for g in got.values()),
    "bytes": sum(g[1] for g in got.values()), "ready_s": round(t_ready, 3),
    "first_batch_s": round(min(g[2] for g in got.values()), 3), "total_s": round(total, 3)}))
