"""The featurized batches both Flight benchmarks serve, the pull both clients make, and the
CPU each side spends."""
import os
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
