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


def test_a_server_whose_stdout_fails_keeps_serving(data):
    """The ready line used to be printed with `println!`: a stdout that fails (a full
    disk, a pipe whose reader is gone) panicked the server before it served anyone."""
    import signal
    import socket
    import subprocess
    import time

    from conftest import BIN

    path, state = data
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open("/dev/full", "w") as full:
        proc = subprocess.Popen(
            [str(BIN), "serve", "--listen", f"127.0.0.1:{port}", "--pipeline", PIPELINE,
             "--input", path, "--state", state],
            stdout=full, stderr=subprocess.PIPE, text=True,
        )
    try:
        deadline = time.time() + 30
        while True:
            try:
                assert len(Client(f"grpc://127.0.0.1:{port}").endpoints("criteo")) == 1
                break
            except Exception:
                assert proc.poll() is None, proc.stderr.read()
                assert time.time() < deadline, "the server never served"
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    assert "cannot write the ready line" in proc.stderr.read()
