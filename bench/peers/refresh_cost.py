"""The cost of statistics that follow the stream: a followed folder of Criteo files
(vocabularies capped at 100,000 values) streamed to two ranks with the state frozen
(`--state`, fitted beforehand) and refreshed (`[stats] mode = "refresh"`: fitted on the
first 65,536 rows, a new version every 262,144 rows), both with `--state-dir`. Reports
rows/s from the server's start to the last step, and their ratio.

usage: python refresh_cost.py HYDRANT_BIN [FILES] [REPS]   (prints JSON lines)
"""
import functools
import json
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import procs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
from hydrant_client import Client  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
binary = sys.argv[1]
files = int(sys.argv[2]) if len(sys.argv) > 2 else 16
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
ROWS, BATCH, RANKS = 65_536, 4096, 2
tmp = procs.scratch()
hydrant = functools.partial(procs.run, binary)

base = (ROOT / "examples" / "criteo.toml").read_text().replace(
    'steps = ["vocab"]', 'steps = ["vocab(max_size=100000)"]')
frozen = tmp / "frozen.toml"
frozen.write_text(base)
refresh = tmp / "refresh.toml"
refresh.write_text(base + '\n[stats]\nmode = "refresh"\nwarmup = 65536\nevery = 262144\n')
data, state = tmp / "part.parquet", tmp / "state.json"
hydrant("gen", "criteo", "--rows", ROWS, "--out", data)
hydrant("fit", "--pipeline", frozen, "--input", data, "--out", state)


def stream(pipeline, *extra):
    folder, sd = tmp / "in", tmp / "sd"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(sd, ignore_errors=True)
    folder.mkdir()
    for k in range(files):
        shutil.copy(data, folder / f"part-{k:05}.parquet")
    t0 = time.perf_counter()
    server, uri = procs.serve(binary, "--pipeline", pipeline, "--follow", folder,
                              "--state-dir", sd, "--ranks", RANKS, "--batch-size", BATCH,
                              *extra, stderr=subprocess.DEVNULL)
    client = Client(uri)
    try:
        readers = [threading.Thread(target=lambda r=r: sum(1 for _ in client.batches(
            "criteo", r, RANKS)), daemon=True) for r in range(RANKS)]
        for t in readers:
            t.start()
        while client.status()["pipelines"][0]["pushed"]["rows_in"] < files * ROWS:
            time.sleep(0.002)
        client.end_ingest("criteo")
        for t in readers:
            t.join()
        return files * ROWS / (time.perf_counter() - t0)
    finally:
        server.terminate()
        server.wait()


runs = {"frozen": [], "refresh": []}
for _ in range(reps):
    runs["frozen"].append(stream(frozen, "--state", state))
    runs["refresh"].append(stream(refresh))
best = {k: max(v) for k, v in runs.items()}
print(json.dumps({"measure": "refresh_vs_frozen_rows_per_s", "rows": files * ROWS,
                  "frozen": round(best["frozen"]), "refresh": round(best["refresh"]),
                  "ratio": round(best["refresh"] / best["frozen"], 2),
                  "runs": {k: [round(x) for x in v] for k, v in runs.items()}}))
