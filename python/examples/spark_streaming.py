"""Continuous training from a Spark Structured Streaming job: Spark writes Parquet
micro-batches into a folder, `hydrant serve --follow` streams them to torch trainers, and
each part restarts from its own checkpoint — Spark from its checkpoint location, hydrant
from its state dir and the trainers' last commit, the trainers from their model
checkpoint.

    # the rows Spark will write, once, to fit the pipeline's statistics on
    python python/examples/spark_streaming.py sample data/clicks-sample.parquet
    printf 'event_time = "ts"\\n' | cat - examples/criteo_hash.toml > clicks.toml
    hydrant fit --pipeline clicks.toml --input data/clicks-sample.parquet --out state.json

    hydrant serve --pipeline clicks.toml --state state.json --follow incoming/ \\
        --state-dir hydrant-state/ --ranks 2 --batch-size 512 &
    python python/examples/spark_streaming.py write incoming/ --checkpoint spark-ck/ &
    torchrun --standalone --nproc-per-node 2 python/examples/torch_ddp.py \\
        grpc://127.0.0.1:50051 criteo_hash --checkpoint model.pt --commit --resume

Kill any of the three (kill -9 too) and start it again with the same command: Spark
commits a micro-batch by writing `incoming/_spark_metadata/N` after its files, and hydrant
admits only the files of committed batches (a batch Spark was killed in is written again
under other names; its orphaned files are never read). The trainers save a checkpoint every
`--checkpoint-every` steps and then `commit` the step after it, so a restarted server
delivers from there and a restarted trainer resumes there: no row is lost or seen twice
relative to the model's checkpoint. `status` shows the stream's freshness: the time from a
file's admission to its first delivered batch, and the event-time lag from `ts`.
`scripts/spark-streaming-check` runs all of this, with kills, and checks it.

The rows are synthetic Criteo-like clicks made from Spark's `rate-micro-batch` source:
`value` numbers them 0, 1, 2, … (written as column `n`), `ts` is when Spark processed
them, and the click depends on a few columns, so a model learns. Needs `pip install pyspark` and Java 17.
"""
import argparse

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

DENSE, CATEGORICAL = 13, 26


def clicks(df: DataFrame, value: Column) -> DataFrame:
    """Criteo-like columns from a row number: `label` (int), `i0`..`i12` (double, some
    null), `c0`..`c25` (string), `n` (the row number) and `df`'s `ts`."""
    key = F.pmod(F.xxhash64(value), F.lit(1 << 30))
    cols = [value.alias("n")]
    for j in range(DENSE):
        v = F.pmod(F.xxhash64(value, F.lit(j)), F.lit(1000)).cast("double")
        cols.append(F.when(v % 17 == 0, None).otherwise(v).alias(f"i{j}"))
    for j in range(CATEGORICAL):
        cols.append(F.concat(F.lit(f"c{j}-"),
                             (F.pmod(key + j * 7919, F.lit(50 + 40 * j))).cast("string")).alias(f"c{j}"))
    # Clicks on a few categories of c0 and c1 and high i0, with 10% noise.
    signal = ((F.pmod(key, F.lit(50)) < 15) | (F.pmod(key + 7919, F.lit(90)) < 9)
              | (F.pmod(F.xxhash64(value, F.lit(0)), F.lit(1000)) > 900))
    noise = F.pmod(F.xxhash64(value, F.lit(99)), F.lit(10)) == 0
    cols.append((signal != noise).cast("int").alias("label"))
    return df.select(*cols, "ts")


def session() -> SparkSession:
    return (SparkSession.builder.master("local[2]").appName("hydrant-clicks")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2").getOrCreate())


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="write rows like the stream's once, to fit on")
    s.add_argument("out")
    s.add_argument("--rows", type=int, default=100_000)
    w = sub.add_parser("write", help="stream rows into a folder, a micro-batch at a time")
    w.add_argument("folder")
    w.add_argument("--checkpoint", required=True, help="Spark's checkpoint location")
    w.add_argument("--rows-per-batch", type=int, default=20_000)
    w.add_argument("--trigger-seconds", type=float, default=1.0)
    w.add_argument("--until-rows", type=int,
                   help="stop once the batches written hold at least this many rows")
    args = ap.parse_args()

    spark = session()
    if args.cmd == "sample":
        df = spark.range(args.rows).withColumn("ts", F.current_timestamp())
        clicks(df, F.col("id")).drop("n").coalesce(1).write.mode("overwrite").parquet(args.out)
        spark.stop()
        return
    # `rate-micro-batch` numbers rows 0, 1, 2, … the same way after a restart (a batch
    # replayed from Spark's checkpoint holds the same rows); `ts` is when Spark made it.
    rate = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows_per_batch)
            .option("numPartitions", 2).load())
    rate = rate.withColumn("ts", F.current_timestamp())
    query = (clicks(rate, F.col("value"))
             .writeStream.format("parquet")
             .option("path", args.folder)
             .option("checkpointLocation", args.checkpoint)
             .trigger(processingTime=f"{args.trigger_seconds} seconds")
             .start())
    while query.isActive:
        query.awaitTermination(2)
        if args.until_rows is not None and _committed_rows(spark, args.folder) >= args.until_rows:
            break
    query.stop()
    spark.stop()


def _committed_rows(spark: SparkSession, folder: str) -> int:
    """Rows in the folder's committed batches (Spark reads a sink's folder by its log)."""
    try:
        return spark.read.parquet(folder).count()
    except Exception:  # no batch committed yet
        return 0


if __name__ == "__main__":
    main()
