"""Spark prepares, hydrant featurizes and serves, trainers read: no file in between.
A PySpark job reads the raw rows and, in `mapInArrow`, pushes each partition's Arrow
batches into `hydrant serve` with DoPut; when the job is done it ends the input.

    hydrant fit --pipeline examples/criteo_hash.toml --input data/criteo-1000000.parquet \
        --out state.json
    printf 'input = "flight"\n' | cat - examples/criteo_hash.toml > /tmp/pushed.toml
    hydrant serve --pipeline /tmp/pushed.toml --state state.json --ranks 2 &
    python python/examples/spark_producer.py grpc://127.0.0.1:50051 criteo_hash \
        data/criteo-1000000.parquet

Needs `pip install pyspark` and Java 17; the trainers (e.g. torch_ddp.py) read the
ranks meanwhile — the server holds back producers when the ranks' queues are full.
"""
import sys

import pyarrow as pa
from pyspark.sql import SparkSession

from hydrant_client import Client

uri, pipeline, path = sys.argv[1], sys.argv[2], sys.argv[3]
spark = SparkSession.builder.master("local[2]").appName("hydrant-producer").getOrCreate()
df = spark.read.parquet(path)
# Any Spark preparation goes here (joins, filters, ...); hydrant does the featurizing.
df = df.filter(df.label.isNotNull())


def push(batches):
    client = Client(uri)
    acks = client.push(pipeline, batches)
    yield pa.RecordBatch.from_pydict({"rows": [sum(a["rows"] for a in acks)]})


pushed = df.mapInArrow(push, "rows long").groupBy().sum("rows").collect()[0][0]
Client(uri).end_ingest(pipeline)
print({"pushed_rows": pushed})
spark.stop()
