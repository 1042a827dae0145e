"""The Criteo job in Ray Data, fed to 2 ranks the way Ray Train feeds them:
python ray_criteo.py IN.parquet.

read_parquet -> fit (mean and std of log1p of each numeric column, one pass) ->
map_batches featurize (standardize, clip, hash ids) -> streaming_split(2, equal=True) ->
each rank's iter_batches(batch_size=4096) in a thread of its own. Prints what each rank
got: its steps (batches) and rows, so that equal steps and every row once can be checked
beside hydrant's.
"""
import json
import sys
import threading
import time

import numpy as np
import pandas as pd

t0 = time.perf_counter()
import ray  # noqa: E402  (its import is part of what a Ray job costs)

RANKS, BATCH, BUCKETS = 2, 4096, 1 << 18
NUM = [f"i{i}" for i in range(13)]
CAT = [f"c{j}" for j in range(26)]

ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
         configure_logging=False)
ray.data.DataContext.get_current().enable_progress_bars = False
ds = ray.data.read_parquet(sys.argv[1])


def moments(df: pd.DataFrame) -> pd.DataFrame:
    """Each batch's count, sum and sum of squares of log1p(x), one row per batch."""
    out = {"n": [len(df)]}
    for c in NUM:
        x = np.log1p(df[c].fillna(0).astype("float64").to_numpy())
        out[f"s_{c}"], out[f"q_{c}"] = [x.sum()], [np.square(x).sum()]
    return pd.DataFrame(out)


# One pass of partial moments, merged here (Ray's own Mean/Std aggregations shuffle
# through actors: ~1 minute for 100k rows on 2 cores).
parts = pd.DataFrame(ds.map_batches(moments, batch_format="pandas").take_all())
n = parts["n"].sum()
stats = {}
for c in NUM:
    mean = parts[f"s_{c}"].sum() / n
    stats[f"mean({c})"] = mean
    stats[f"std({c})"] = np.sqrt(max(parts[f"q_{c}"].sum() / n - mean * mean, 0.0))
t_fit = time.perf_counter() - t0


def featurize(df: pd.DataFrame) -> pd.DataFrame:
    out = {"label": df["label"].astype("float32")}
    for c in NUM:
        x = np.log1p(df[c].fillna(0).astype("float64"))
        z = (x - stats[f"mean({c})"]) / stats[f"std({c})"]
        out[c] = z.clip(-3.0, 3.0).astype("float32")
    for c in CAT:
        # Vectorized hashing, as a Ray user would write it (pandas' siphash of each value).
        h = pd.util.hash_array(df[c].fillna("").to_numpy(dtype=object))
        out[c] = (h % BUCKETS).astype("int64")
    return pd.DataFrame(out)


featurized = ds.map_batches(featurize, batch_format="pandas")
splits = featurized.streaming_split(RANKS, equal=True)
got = [None] * RANKS
first = [None] * RANKS


def rank(r):
    steps = rows = 0
    for b in splits[r].iter_batches(batch_size=BATCH, batch_format="numpy"):
        dense = np.stack([b[c] for c in NUM], axis=1)
        ids = np.stack([b[c] for c in CAT], axis=1)
        if first[r] is None:
            first[r] = time.perf_counter() - t0
        steps += 1
        rows += len(dense)
    got[r] = (steps, rows)


threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
total = time.perf_counter() - t0
print(json.dumps({
    "peer": "ray", "rows": sum(r for _, r in got), "batches": sum(s for s, _ in got),
    "steps_per_rank": [s for s, _ in got], "rows_per_rank": [r for _, r in got],
    "fit_s": round(t_fit, 3), "first_batch_s": round(min((f for f in first if f is not None), default=total), 3),
    "total_s": round(total, 3)}))
