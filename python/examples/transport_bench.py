"""Transport: a pyarrow client pulling already-featurized batches through `hydrant serve`
(a pass-through pipeline over an Arrow IPC file of label/dense/ids), the peer of
../shared/bench/flight_pyarrow.py (pyarrow's C++ server serving the same batches from
memory). Counts the bytes of label, dense and ids, as the peer does.

usage: python transport_bench.py [ROWS] [HYDRANT_BIN]   (prints one JSON line)
"""
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

root = pathlib.Path(__file__).resolve().parents[2]
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
binary = sys.argv[2] if len(sys.argv) > 2 else str(root / "target/release/hydrant")
rng = np.random.default_rng(1)
table = pa.table({
    "label": pa.array(rng.integers(0, 2, rows).astype(np.float32)),
    "dense": pa.FixedSizeListArray.from_arrays(
        pa.array(rng.standard_normal(rows * 13).astype(np.float32)), 13),
    "ids": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 1 << 18, rows * 26)), 26),
})
tmp = pathlib.Path(tempfile.mkdtemp())
data = tmp / "featurized.arrow"
with pa.OSFile(str(data), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
    for b in table.to_batches(max_chunksize=65536):
        w.write_batch(b)
toml = tmp / "pass.toml"
toml.write_text("""name = "pass"
label = { column = "label", type = "float32" }
batch_rows = 65536
[[group]]
name = "dense"
kind = "dense"
columns = ["dense"]
[[group]]
name = "ids"
kind = "ids"
columns = ["ids"]
""")
server = subprocess.Popen(
    [binary, "serve", "--pipeline", str(toml), "--input", str(data), "--listen",
     "127.0.0.1:0", "--ranks", "1", "--batch-size", "65536"], stdout=subprocess.PIPE, text=True)
ready = json.loads(server.stdout.readline())
client = fl.connect("grpc://" + ready["listening"])
ticket = fl.Ticket(json.dumps({"pipeline": "pass", "rank": 0, "world_size": 1}).encode())
best = 0.0
for _ in range(5):
    t0 = time.perf_counter()
    n = nbytes = 0
    for chunk in client.do_get(ticket):
        b = chunk.data
        n += b.num_rows - json.loads(chunk.app_metadata.to_pybytes())["padded_rows"] * 0
        nbytes += sum(b.column(c).nbytes for c in ("label", "dense", "ids"))
    best = max(best, nbytes / (time.perf_counter() - t0))
server.terminate()
server.wait()
print(json.dumps({"system": "hydrant serve", "rows": n, "bytes": nbytes,
                  "best_gb_per_s": round(best / 1e9, 3)}))
