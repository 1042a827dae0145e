"""A pyarrow client pulling featurized batches through `hydrant serve` (a pass-through
pipeline over an Arrow IPC file of the same label/dense/ids batches flight_pyarrow.py
serves from memory), counting the same bytes.

usage: python hydrant_flight.py HYDRANT_BIN [ROWS] [PULLS] [STREAMS]   (prints one JSON line)

With STREAMS > 1 the server serves that many ranks in 65,536 / STREAMS-row batches and one
client per rank pulls concurrently (a pull is all of them; bytes/s counts them together).

The server keeps the file's batches in memory after the first pull (`--cache-mib`), as
pyarrow's server holds its table: each later pull is served without reading the file again
(HYDRANT_CACHE_MIB=0 reads it every epoch). That first pull warms the server up, as
flight_pyarrow.py's builds its table before any pull: it is not one of the PULLS counted,
and the JSON line gives its rate apart (`first_pull_gb_per_s`).
"""
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.flight as fl

import procs
from featurized import featurized_table, timed_pulls

binary = sys.argv[1]
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 31 * 65536
pulls = int(sys.argv[3]) if len(sys.argv) > 3 else 5
streams = int(sys.argv[4]) if len(sys.argv) > 4 else 1
table = featurized_table(rows)
tmp = procs.scratch()
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
    [binary, "serve", "--pipeline", str(toml), "--input", str(data), "--listen", "127.0.0.1:0",
     "--epochs", str(pulls + 1), "--cache-mib", os.environ.get("HYDRANT_CACHE_MIB", "4096"),
     "--ranks", str(streams), "--batch-size", str(65536 // streams)], stdout=subprocess.PIPE,
    text=True)
try:
    ready = json.loads(server.stdout.readline())
    clients = [fl.connect("grpc://" + ready["listening"]) for _ in range(streams)]
    # Each pull is the next epoch, as a trainer reads them: all ranks of an epoch share one
    # run (a second read of an epoch would be served as catch-up runs, one per rank).
    # Epoch 0 is the warm-up pull, which reads the file.
    def pairs_of(epoch):
        return [(c, fl.Ticket(json.dumps({"pipeline": "pass", "epoch": epoch, "rank": r,
                                          "world_size": streams}).encode()))
                for r, c in enumerate(clients)]
    pulled = timed_pulls(pairs_of, pulls, server.pid)
finally:
    server.terminate()
    server.wait()
print(json.dumps({"peer": "hydrant_flight", "streams": streams, **pulled}))
