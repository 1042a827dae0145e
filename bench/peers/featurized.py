"""The featurized batches both Flight benchmarks serve, the pulls both clients make and
time, and the CPU each side spends."""
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa


def featurized_table(rows):
    """label float32, dense [13] float32, ids [26] int64: a Criteo pipeline's output."""
    rng = np.random.default_rng(1)
    return pa.table({
        "label": pa.array(rng.integers(0, 2, rows).astype(np.float32)),
        "dense": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.standard_normal(rows * 13).astype(np.float32)), 13),
        "ids": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 1 << 18, rows * 26)), 26),
    })


def pull(client, ticket):
    """One DoGet to the end: (rows, bytes of label, dense and ids)."""
    rows = nbytes = 0
    for chunk in client.do_get(ticket):
        b = chunk.data
        rows += b.num_rows
        nbytes += sum(b.column(c).nbytes for c in ("label", "dense", "ids"))
    return rows, nbytes


def pull_all(pairs):
    """Concurrent DoGets, one thread per (client, ticket) pair, each to its end: (rows,
    bytes) summed over them. pyarrow reads without the GIL, so the streams overlap."""
    if len(pairs) == 1:
        return pull(*pairs[0])
    with ThreadPoolExecutor(len(pairs)) as pool:
        done = list(pool.map(lambda p: pull(*p), pairs))
    return sum(r for r, _ in done), sum(b for _, b in done)


def cpu_seconds(pid):
    """User and system CPU seconds of process `pid` so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_pulls(pairs_of, pulls, server_pid=None):
    """A warm-up pull, then `pulls` timed ones, pull `i` made of `pull_all(pairs_of(i))`
    (`i` 0 is the warm-up): the fields both Flight benchmarks print. The warm-up is not
    counted (hydrant's reads its file; pyarrow's table is built before any pull), and its
    rate is given apart. With `server_pid`, the CPU seconds a timed pull costs the server
    and this process."""
    rates, n, nbytes = [], 0, 0
    for i in range(pulls + 1):
        if i == 1:
            server_cpu = cpu_seconds(server_pid) if server_pid is not None else 0.0
            client_cpu = time.process_time()
        t0 = time.perf_counter()
        n, nbytes = pull_all(pairs_of(i))
        rates.append(nbytes / (time.perf_counter() - t0))
    first, rates = rates[0], rates[1:]
    out = {"rows": n, "bytes": nbytes,
           "median_gb_per_s": round(statistics.median(rates) / 1e9, 3),
           "best_gb_per_s": round(max(rates) / 1e9, 3),
           "pulls_gb_per_s": [round(r / 1e9, 3) for r in rates],
           "first_pull_gb_per_s": round(first / 1e9, 3)}
    if server_pid is not None:
        out["server_cpu_s_per_pull"] = round((cpu_seconds(server_pid) - server_cpu) / pulls, 4)
        out["client_cpu_s_per_pull"] = round((time.process_time() - client_cpu) / pulls, 4)
    return out
