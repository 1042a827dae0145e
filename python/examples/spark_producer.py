"""Spark prepares, hydrant featurizes and serves, trainers read: no file in between.
A PySpark job reads the raw rows and, in `mapInArrow`, pushes each partition's Arrow
batches into `hydrant serve` with DoPut; when the job is done it ends the input.

    hydrant fit --pipeline examples/criteo_hash.toml --input data/criteo-1000000.parquet \
        --out state.json
    printf 'input = "flight"\n' | cat - examples/criteo_hash.toml > /tmp/pushed.toml
    hydrant serve --pipeline /tmp/pushed.toml --state state.json --ranks 2 \
        --state-dir pushed-state/ &
    python python/examples/spark_producer.py grpc://127.0.0.1:50051 criteo_hash \
        data/criteo-1000000.parquet

Exactly once, with retries: each partition pushes as producer `JOB-pN` (N its partition
id) and numbers its batches 0, 1, 2, … With `--state-dir` the server keeps each producer's
highest admitted number across restarts, so whatever is pushed again — a task Spark
retries after a failure (here up to 4 attempts: `local[2,4]`), or the whole job run again
with the same `--job` — is acknowledged as a duplicate and not admitted twice, while the
batches the server never acknowledged are admitted. That holds as long as a partition
reads the same rows in the same order each time (a Parquet scan does). A push that fails
(the server restarting, say) fails the task, and Spark's retry pushes the partition again.

Needs `pip install pyspark` and Java 17; the trainers (e.g. torch_ddp.py) read the
ranks meanwhile — the server holds back producers when the ranks' queues are full.
"""
import argparse
import os
import sys

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession

from hydrant_client import Client

ap = argparse.ArgumentParser()
ap.add_argument("uri")
ap.add_argument("pipeline")
ap.add_argument("path")
ap.add_argument("--job", default="spark", help="names the producers: run it again, same name")
ap.add_argument("--no-end", action="store_true", help="leave the input open (more jobs follow)")
args = ap.parse_args()
uri, pipeline = args.uri, args.pipeline
# Spark's Python workers run `push`: the same interpreter (and packages) as this script.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
spark = (SparkSession.builder.master("local[2,4]").appName("hydrant-producer")
         .config("spark.ui.enabled", "false").getOrCreate())
df = spark.read.parquet(args.path)
# Any Spark preparation goes here (joins, filters, ...); hydrant does the featurizing.
df = df.filter(df.label.isNotNull())


def push(batches):
    producer = f"{args.job}-p{TaskContext.get().partitionId()}"
    acks = Client(uri).push(pipeline, batches, producer=producer, first_seq=0)
    new = [a for a in acks if not a.get("duplicate")]
    yield pa.RecordBatch.from_pydict({"rows": [sum(a["rows"] for a in new)],
                                      "duplicates": [len(acks) - len(new)]})


done = df.mapInArrow(push, "rows long, duplicates long").groupBy().sum().collect()[0]
if not args.no_end:
    Client(uri).end_ingest(pipeline)
print({"admitted_rows": done[0], "duplicate_batches": done[1]})
spark.stop()
