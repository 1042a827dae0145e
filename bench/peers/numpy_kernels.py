"""NumPy doing the math of hydrant's kernel benches in place, the peer of
`cargo bench -p hydrant-operators --bench kernels` and `--bench batch_size`.

usage: python numpy_kernels.py [--quick]   (prints one JSON line: values per second, median)

Every kernel works on preallocated buffers (`out=`), the fastest way NumPy offers:
- chain: fill_null(0) -> log1p -> (x - 2.5) * 0.7 -> clip(-3, 3) -> float32, 65,536 rows
- standardize_clip: (x - 2.5) * 0.7 -> clip(-3, 3) -> float32
- vocab_dict / hash_dict: a dictionary-encoded string column (65,536 rows, Zipf over a
  100k vocabulary): map the batch's dictionary once (a dict lookup, or xxhash64 mod 2^18,
  per distinct string), then gather by the keys; nulls get the out-of-vocabulary id
- assembly: 13 columns (10% nulls) through the chain into one [rows, 13] float32 array
- batch_chain: the chain on one column, batches of 1 to 100,000 rows (fresh output each)
"""
import json
import statistics
import sys
import time

import numpy as np
import pyarrow as pa
import xxhash

QUICK = "--quick" in sys.argv
ROWS = 65_536
rng = np.random.default_rng(1)


def rate(fn, elements, budget=0.05 if QUICK else 0.4, repeats=3 if QUICK else 7):
    """Median elements per second over `repeats` timings of as many calls as fit in `budget`."""
    fn()
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < budget / 4:
        fn()
        calls += 1
    per = max(1, int(calls * 4 / repeats))
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        rates.append(elements * per / (time.perf_counter() - t0))
    return statistics.median(rates)


def column(null_rate, rows=ROWS):
    values = np.exp(rng.random(rows) * 6.0)
    return values, rng.random(rows) < null_rate


def chain(values, nulls, buf, out, log=True):
    np.copyto(buf, values)
    if log:
        buf[nulls] = 0.0
        np.log1p(buf, out=buf)
    np.subtract(buf, 2.5, out=buf)
    np.multiply(buf, 0.7, out=buf)
    np.clip(buf, -3.0, 3.0, out=buf)
    out[...] = buf


results = {}
for null_rate in (0.0, 0.1, 0.5):
    values, nulls = column(null_rate)
    buf, out = np.empty(ROWS), np.empty(ROWS, dtype=np.float32)
    results[f"chain/{null_rate}"] = rate(lambda: chain(values, nulls, buf, out), ROWS)
    results[f"standardize_clip/{null_rate}"] = rate(lambda: chain(values, nulls, buf, out, log=False), ROWS)

words = [f"04{i:08d}" for i in range(100_000)]
vocab = {w: i for i, w in enumerate(words)}
oov = len(words)
for null_rate in (0.0, 0.1, 0.5):
    keys = np.minimum((rng.random(ROWS).clip(1e-12) ** (-1.0 / 0.3)).astype(np.int64), 100_000) - 1
    strings = pa.array([words[k] for k in keys], mask=rng.random(ROWS) < null_rate).dictionary_encode()
    indices = strings.indices.to_numpy(zero_copy_only=False)
    missing = strings.is_null().to_numpy(zero_copy_only=False)
    indices = np.where(missing, 0, indices).astype(np.int64)
    dictionary = strings.dictionary.to_pylist()
    out = np.empty(ROWS, dtype=np.int64)

    def lookup(mapping):
        def run():
            table = np.fromiter((mapping(s) for s in dictionary), dtype=np.int64, count=len(dictionary))
            np.take(table, indices, out=out)
            out[missing] = oov
        return run

    results[f"vocab_dict/{null_rate}"] = rate(lookup(lambda s: vocab.get(s, oov)), ROWS)
    results[f"hash_dict/{null_rate}"] = rate(lookup(lambda s: xxhash.xxh64_intdigest(s.encode()) % (1 << 18)), ROWS)

columns = [column(0.1) for _ in range(13)]
buf, col_out, tensor = np.empty(ROWS), np.empty(ROWS, dtype=np.float32), np.empty((ROWS, 13), dtype=np.float32)


def assemble():
    for j, (values, nulls) in enumerate(columns):
        chain(values, nulls, buf, col_out)
        tensor[:, j] = col_out


results["assembly/dense_13"] = rate(assemble, ROWS * 13)

values, nulls = column(0.1, 100_000)
for rows in (1, 10, 100, 1_000, 10_000, 100_000):
    v, n, b = values[:rows], nulls[:rows], np.empty(rows)
    results[f"batch_chain/{rows}"] = rate(lambda: chain(v, n, b, np.empty(rows, dtype=np.float32)), rows)

print(json.dumps({"peer": "numpy", "values_per_s": {k: round(v) for k, v in results.items()}}))
