"""pyarrow's own Flight server and client over loopback, DoGet of featurized rows
(label float32, dense [13] float32, ids [26] int64) from memory in 65,536-row batches.

usage: python flight_pyarrow.py [ROWS] [PULLS] [STREAMS]   (ROWS: 2,031,616 = 31 batches; prints one
JSON line; bytes of the three columns per second, median and best of PULLS pulls after one
that warms up)

With STREAMS > 1, stream s serves the s-th of STREAMS equal slices of every batch (as
hydrant_flight.py's ranks do) and one client per stream pulls concurrently.

The server runs in the clients' process, as in ../shared/bench/flight_pyarrow.py (the
peer as given). With a fourth argument `own-process` it runs in a process of its own, as
`hydrant serve` does: then each side has its own gRPC threads, and the JSON line also says
each process's CPU seconds per pull. With `same-columns` (after the other arguments, with
or without `own-process`) the batches also carry the two columns every batch of `hydrant
serve` carries, `row_id` uint64 and `is_padding` bool, which neither side counts in its
bytes: the same messages on both sides, to tell the transport apart from the contract.
"""
import json
import multiprocessing as mp
import sys
import threading

import pyarrow as pa
import pyarrow.flight as fl

from featurized import featurized_table, timed_pulls

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 31 * 65536
pulls = int(sys.argv[2]) if len(sys.argv) > 2 else 5
streams = int(sys.argv[3]) if len(sys.argv) > 3 else 1
own_process = "own-process" in sys.argv[4:]
same_columns = "same-columns" in sys.argv[4:]


class Server(fl.FlightServerBase):
    def __init__(self, shares):
        super().__init__("grpc://127.0.0.1:0")
        self.shares = shares

    def do_get(self, context, ticket):
        return fl.RecordBatchStream(self.shares[int(ticket.ticket)])


def shares_of(rows, streams, same_columns):
    table = featurized_table(rows)
    if same_columns:
        table = table.append_column("row_id", pa.array(range(rows), pa.uint64()))
        table = table.append_column("is_padding", pa.array([False] * rows))
    batches = table.to_batches(max_chunksize=65536)
    part = 65536 // streams
    return [pa.Table.from_batches([b.slice(s * part, part) for b in batches])
            for s in range(streams)]


def serve_in_child(rows, streams, same_columns, ports):
    server = Server(shares_of(rows, streams, same_columns))
    ports.put(server.port)
    server.serve()


if __name__ == "__main__":
    if own_process:
        ports = mp.Queue()
        child = mp.Process(target=serve_in_child, args=(rows, streams, same_columns, ports),
                           daemon=True)
        child.start()
        port, server_pid = ports.get(), child.pid
    else:
        server = Server(shares_of(rows, streams, same_columns))
        threading.Thread(target=server.serve, daemon=True).start()
        # In one process the server's CPU is the clients' too: not reported.
        port, server_pid = server.port, None
    pairs = [(fl.connect(f"grpc://127.0.0.1:{port}"), fl.Ticket(str(s).encode()))
             for s in range(streams)]
    # Pull 0 warms up (connections, first allocations) and is not counted, as in
    # hydrant_flight.py, whose first pull reads its file.
    pulled = timed_pulls(lambda _: pairs, pulls, server_pid)
    out = {"peer": "pyarrow_flight" + ("_own_process" if own_process else "")
           + ("_same_columns" if same_columns else ""),
           "streams": streams, **pulled}
    if own_process:
        child.kill()
    else:
        server.shutdown()
    print(json.dumps(out))
