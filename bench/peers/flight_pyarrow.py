"""pyarrow's own Flight server and client over loopback, DoGet of featurized rows
(label float32, dense [13] float32, ids [26] int64) from memory in 65,536-row batches.

usage: python flight_pyarrow.py [ROWS] [PULLS]   (ROWS: 2,031,616 = 31 batches; prints one JSON line; bytes of the three
columns per second, median and best of PULLS pulls)
"""
import json
import statistics
import sys
import threading
import time

import pyarrow as pa
import pyarrow.flight as fl

from featurized import featurized_table, pull

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 31 * 65536
pulls = int(sys.argv[2]) if len(sys.argv) > 2 else 5
batches = featurized_table(rows).to_batches(max_chunksize=65536)


class Server(fl.FlightServerBase):
    def do_get(self, context, ticket):
        return fl.RecordBatchStream(pa.Table.from_batches(batches))


server = Server("grpc://127.0.0.1:0")
threading.Thread(target=server.serve, daemon=True).start()
client = fl.connect(f"grpc://127.0.0.1:{server.port}")
rates, n, nbytes = [], 0, 0
for _ in range(pulls):
    t0 = time.perf_counter()
    n, nbytes = pull(client, fl.Ticket(b"all"))
    rates.append(nbytes / (time.perf_counter() - t0))
server.shutdown()
print(json.dumps({"peer": "pyarrow_flight", "rows": n, "bytes": nbytes,
                  "median_gb_per_s": round(statistics.median(rates) / 1e9, 3),
                  "best_gb_per_s": round(max(rates) / 1e9, 3)}))
