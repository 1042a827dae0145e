"""A server whose input changes underneath it, or whose run panics, fails the affected
stream, not the process."""

import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from hydrant_client import Client, HydrantError

from conftest import PIPELINE, Server


def test_an_input_truncated_while_served_fails_its_stream_only(data, tmp_path):
    path, state = data
    table = pq.read_table(path)
    arrow = tmp_path / "rows.arrow"
    with ipc.new_file(arrow, table.schema) as w:
        for b in table.to_batches(max_chunksize=2000):
            w.write_batch(b)
    s = Server("--pipeline", PIPELINE, "--input", arrow, "--state", state, "--batch-size", "500")
    try:
        size = arrow.stat().st_size
        with open(arrow, "r+b") as f:
            f.truncate(size // 2)
        client = Client(s.uri)
        with pytest.raises(HydrantError) as e:
            list(client.batches("criteo", 0, 1))
        assert "rows.arrow" in str(e.value) and "truncated" in str(e.value), str(e.value)
        # Named as the pipeline's input, not by the server's path.
        assert str(tmp_path) not in str(e.value), str(e.value)
        # The process is alive (no SIGBUS) and still answers.
        assert s.proc.poll() is None
        assert [ep["rank"] for ep in client.endpoints("criteo")] == [0]
    finally:
        s.stop()


def test_a_panic_in_a_served_run_fails_its_stream_only(data, monkeypatch):
    path, state = data
    monkeypatch.setenv("HYDRANT_FAIL_POINT", "featurize")
    s = Server("--pipeline", PIPELINE, "--input", path, "--state", state)
    try:
        client = Client(s.uri)
        with pytest.raises(HydrantError, match="panicked in operator `featurize`"):
            list(client.batches("criteo", 0, 1))
        assert s.proc.poll() is None
        assert client.status()["pipelines"][0]
    finally:
        s.stop()
