"""Writes the seed corpora (fuzz/corpus/<target>/) from real inputs: pipeline files,
states, tickets, step strings and DoPut messages made by pyarrow. Run from the repository
root with a Python that has pyarrow: `python fuzz/seeds.py`."""

import json
import pathlib
import struct

import pyarrow as pa
import pyarrow.compute as pc

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT / "fuzz" / "corpus"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def frame(batches, schema):
    """The IPC messages of a stream of `batches`, framed as the doput target reads them."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        for b in batches:
            w.write_batch(b)
    reader = pa.BufferReader(sink.getvalue())
    out = b""
    while True:
        try:
            m = pa.ipc.read_message(reader)
        except (EOFError, StopIteration, pa.ArrowInvalid):
            break
        header = m.metadata.to_pybytes()
        body = m.body.to_pybytes() if m.body is not None else b""
        out += struct.pack("<I", len(header)) + header + struct.pack("<I", len(body)) + body
    return out


def doput():
    a = pa.array([1.5, None, -2.0, 1e9])
    b = pa.array([0.0, 1.0, 2.0, 3.0])
    c = pa.array(["x", None, "zz", "unseen"])
    d = pa.array(["y", "y", None, "x"])
    y = pa.array([0.0, 1.0, 1.0, 0.0], pa.float32())
    t = pa.table({"a": a, "b": b, "c": c, "d": d, "y": y})
    put("doput", "plain", frame(t.to_batches(max_chunksize=2), t.schema))
    dic = t.set_column(2, "c", pc.dictionary_encode(t["c"]))
    put("doput", "dictionary", frame(dic.to_batches(), dic.schema))
    ints = t.set_column(0, "a", pa.array([1, 2, None, 4], pa.int32()))
    put("doput", "ints", frame(ints.to_batches(), ints.schema))
    large = t.set_column(3, "d", t["d"].cast(pa.large_string()))
    put("doput", "large_string", frame(large.to_batches(), large.schema))
    tensor = pa.table(
        {"a": pa.FixedSizeListArray.from_arrays(pa.array([1.0] * 8, pa.float32()), 2),
         "b": b, "c": c, "d": d, "y": y}
    )
    put("doput", "tensor", frame(tensor.to_batches(), tensor.schema))
    put("doput", "missing_column", frame(t.drop_columns(["b"]).to_batches(), t.drop_columns(["b"]).schema))


def ipc_files():
    """Arrow IPC files (the format with a footer) of a few layouts."""
    t = pa.table({"a": pa.array([1.5, None, -2.0, 1e9]), "c": pa.array(["x", None, "zz", "y"]),
                  "y": pa.array([0.0, 1.0, 1.0, 0.0], pa.float32())})
    tensor = pa.table({"t": pa.FixedSizeListArray.from_arrays(pa.array([1.0] * 8, pa.float32()), 2)})
    dic = t.set_column(1, "c", pc.dictionary_encode(t["c"]))
    cases = {"batches": (t, 2), "one": (t, None), "tensor": (tensor, 3), "dictionary": (dic, 2),
             "empty": (t.slice(0, 0), None)}
    for name, (table, chunk) in cases.items():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as w:
            empty = pa.record_batch([pa.array([], f.type) for f in table.schema], schema=table.schema)
            for b in table.to_batches(max_chunksize=chunk) or [empty]:
                w.write_batch(b)
        put("ipc_file", name, sink.getvalue().to_pybytes())


def parquet_files():
    """Small Parquet files of a few layouts: row groups, codecs, dictionaries, nulls."""
    import pyarrow.parquet as pq
    t = pa.table({"a": pa.array([1.5, None, -2.0, 1e9] * 4), "c": pa.array(["x", None, "zz", "y"] * 4),
                  "y": pa.array([0.0, 1.0, 1.0, 0.0] * 4, pa.float32())})
    cases = {"groups": dict(row_group_size=5), "one": {}, "zstd": dict(compression="zstd"), "gzip": dict(compression="gzip"),
             "plain": dict(use_dictionary=False, row_group_size=7), "v1": dict(data_page_version="1.0")}
    for name, options in cases.items():
        sink = pa.BufferOutputStream()
        pq.write_table(t, sink, **options)
        put("parquet_file", name, sink.getvalue().to_pybytes())


def texts():
    for p in (ROOT / "examples").glob("*.toml"):
        put("pipeline_toml", p.stem, p.read_text())
    put("pipeline_toml", "flight", 'input = "flight"\n' + (ROOT / "examples" / "criteo_hash.toml").read_text())
    steps = ["fill_null(0)", "log1p", "standardize", "min_max", "clip(-3, 3)",
             "bucketize([0, 1.5, 10])", "quantile_bucketize(10)", "vocab",
             "vocab(min_count=2, max_size=1000)", "hash_bucket(1000)", "one_hot(4)"]
    for i, s in enumerate(steps):
        put("step", f"s{i}", s)
    put("ticket", "full", json.dumps({"pipeline": "criteo", "epoch": 1, "rank": 0,
                                      "world_size": 2, "start_step": 5}))
    put("ticket", "short", json.dumps({"pipeline": "criteo", "rank": 1, "world_size": 2}))
    state = {"format": 1, "pipeline": "p", "version": 0, "params": {
        "dense/i0/2": {"standardize": {"mean": 1.5, "std": 0.25}},
        "dense/i1/1": {"min_max": {"min": -1.0, "max": 2.0}},
        "dense/i2/0": {"quantiles": {"boundaries": [0.0, 1.0, 2.5]}},
        "ids/c0/0": {"vocab": {"values": ["a", "b", "c"]}}}}
    put("state_json", "unversioned", json.dumps(state))


if __name__ == "__main__":
    doput()
    ipc_files()
    parquet_files()
    texts()
