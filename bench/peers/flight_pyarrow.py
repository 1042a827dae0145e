"""pyarrow's own Flight server and client over loopback, DoGet of featurized rows
(label float32, dense [13] float32, ids [26] int64) from memory in 65,536-row batches.

usage: python flight_pyarrow.py [ROWS] [PULLS] [STREAMS]   (ROWS: 2,031,616 = 31 batches; prints one
JSON line; bytes of the three columns per second, median and best of PULLS pulls)

With STREAMS > 1, stream s serves the s-th of STREAMS equal slices of every batch (as
hydrant_flight.py's ranks do) and one client per stream pulls concurrently.
"""
import json
import statistics
import sys
import threading
import time

import pyarrow as pa
import pyarrow.flight as fl

from featurized import featurized_table, pull_all

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 31 * 65536
pulls = int(sys.argv[2]) if len(sys.argv) > 2 else 5
streams = int(sys.argv[3]) if len(sys.argv) > 3 else 1
batches = featurized_table(rows).to_batches(max_chunksize=65536)
part = 65536 // streams
shares = [pa.Table.from_batches([b.slice(s * part, part) for b in batches]) for s in range(streams)]


class Server(fl.FlightServerBase):
    def do_get(self, context, ticket):
        return fl.RecordBatchStream(shares[int(ticket.ticket)])


server = Server("grpc://127.0.0.1:0")
threading.Thread(target=server.serve, daemon=True).start()
pairs = [(fl.connect(f"grpc://127.0.0.1:{server.port}"), fl.Ticket(str(s).encode()))
         for s in range(streams)]
rates, n, nbytes = [], 0, 0
for _ in range(pulls):
    t0 = time.perf_counter()
    n, nbytes = pull_all(pairs)
    rates.append(nbytes / (time.perf_counter() - t0))
server.shutdown()
print(json.dumps({"peer": "pyarrow_flight", "streams": streams, "rows": n, "bytes": nbytes,
                  "median_gb_per_s": round(statistics.median(rates) / 1e9, 3),
                  "best_gb_per_s": round(max(rates) / 1e9, 3),
                  "pulls_gb_per_s": [round(r / 1e9, 3) for r in rates]}))
