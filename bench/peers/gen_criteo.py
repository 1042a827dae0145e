"""Write a Criteo-like click log as Parquet: python gen_criteo.py ROWS OUT.parquet [SEED].

The generator of ../shared/bench/gen_criteo.py (label int32; i0..i12 float64, lognormal,
10% nulls; c0..c25 utf8, Zipf ids with cardinalities 10..100k; 65,536-row row groups),
written one million rows at a time so that 10M rows fit in memory, in row groups of
65,536 rows as the shared generator's. Up to one million rows the file is identical to
the shared generator's for the same seed.
"""
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CHUNK = 1_000_000
GROUP = 65_536


def chunk(rng, rows):
    cols = {"label": pa.array(rng.integers(0, 2, rows, dtype=np.int32))}
    for i in range(13):
        values = rng.lognormal(1.0, 1.5, rows)
        cols[f"i{i}"] = pa.array(values, mask=rng.random(rows) < 0.1)
    for j in range(26):
        cardinality = [10, 100, 1000, 10000, 100000][j % 5]
        ids = rng.zipf(1.3, rows) % cardinality
        cols[f"c{j}"] = pa.array(np.char.add(f"{j:02d}", np.char.zfill(ids.astype(str), 8)).astype(object))
    return pa.table(cols)


rows, out = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(int(sys.argv[3]) if len(sys.argv) > 3 else 42)
writer, nbytes, done = None, 0, 0
# Rows of a chunk past its last whole row group wait for the next chunk: every row group
# but the file's last has GROUP rows, as the shared generator's one write_table gives.
# Cut at each chunk's end instead, a 10M-row file had a 16,960-row group every 1M rows.
held = None
while done < rows or writer is None:
    table = chunk(rng, min(CHUNK, rows - done))
    if writer is None:
        writer = pq.ParquetWriter(out, table.schema)
    nbytes += table.nbytes
    done += table.num_rows
    if held is not None:
        table = pa.concat_tables([held, table]).combine_chunks()
    whole = table.num_rows if done >= rows else table.num_rows // GROUP * GROUP
    writer.write_table(table.slice(0, whole), row_group_size=GROUP)
    held = table.slice(whole) if whole < table.num_rows else None
writer.close()
print(f'{{"rows": {rows}, "bytes_in_memory": {nbytes}, "out": "{out}"}}')
