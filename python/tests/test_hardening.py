"""A server whose input changes underneath it, or whose run panics, fails the affected
stream, not the process."""

import os
import resource
import socket
import time

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from hydrant_client import Client, HydrantError

from conftest import PIPELINE, ROWS, Server, hydrant


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
        # FAILED_PRECONDITION (the input must be mended first), which pyarrow raises as
        # ArrowInvalid: not INTERNAL, which would say the server is broken.
        cause = e.value.__cause__
        assert isinstance(cause, pa.ArrowInvalid), repr(cause)
        assert not isinstance(cause, flight.FlightInternalError), repr(cause)
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


def _read_all(client, rank, world_size, into, start_step=0):
    """Reads `rank`'s epoch 0 into `into[rank]`: ("done", steps) or ("error", message)."""
    try:
        steps = [b.step for b in client.batches("criteo", rank, world_size, start_step=start_step)]
        into[rank] = ("done", steps)
    except HydrantError as e:
        into[rank] = ("error", str(e))


def test_a_panic_in_one_worker_fails_every_stream_of_its_run_without_a_hang(data, monkeypatch):
    """One worker of two panics mid-run (worker 1, the second time it reads) while the other
    goes on: the survivor used to wait forever for the dead one, holding the run's queues
    open, so both ranks' streams hung with no error. Now the survivor stops too: a rank
    that has all its steps ends cleanly, the others with the panic's one line."""
    import threading

    path, state = data
    monkeypatch.setenv("HYDRANT_FAIL_POINT", "source:1:1")
    s = Server("--pipeline", PIPELINE, "--input", path, "--state", state, "--workers", "2",
               "--ranks", "2", "--batch-size", "100")
    try:
        client = Client(s.uri)
        got = {}
        readers = [threading.Thread(target=_read_all, args=(client, r, 2, got), daemon=True)
                   for r in range(2)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in readers), f"a stream hung: {got}"
        assert any(kind == "error" for kind, _ in got.values()), got
        for kind, what in got.values():
            if kind == "error":
                assert "panicked in operator `source`" in what and "\n" not in what, what
            else:
                assert what == list(range(len(what))) and len(what) == 101, what
        assert s.proc.poll() is None
        assert client.status()["pipelines"][0]
        # The server's log says why, in one line (it used to say nothing).
        failed = s.lines_logged("the run of epoch 0 failed")
        assert len(failed) == 1 and "panicked in operator `source`" in failed[0], failed
    finally:
        s.stop()


def test_a_rank_whose_trainer_dies_mid_epoch_is_let_go(tmp_path):
    """A trainer reads a few steps, then its process is killed. The other rank used to
    wait forever on the dead rank's full queue: the drain that lets an unread rank go was
    looked for once per wait, before the trainer died. It is looked for every
    `--absent-after` now; the killed rank, read again, catches up exactly."""
    import subprocess
    import sys
    import textwrap
    import threading
    import time

    # Enough rows that a rank's queue fills long before the epoch ends.
    rows = 200_000
    path = tmp_path / "rows.parquet"
    hydrant("gen", "criteo", "--rows", rows, "--out", path)
    s = Server("--pipeline", PIPELINE, "--input", path, "--ranks", "2", "--batch-size", "1000",
               "--absent-after", "1")
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import json, time, pyarrow.flight as fl
        ticket = json.dumps(dict(pipeline="criteo", epoch=0, rank=0, world_size=2))
        reader = fl.connect("{s.uri}").do_get(fl.Ticket(ticket.encode()))
        for _ in range(5):
            reader.read_chunk()
        print("read", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "read"
        client = Client(s.uri)
        got = {}
        other = threading.Thread(target=_read_all, args=(client, 1, 2, got), daemon=True)
        other.start()
        # Rank 1 waits on rank 0's full queue longer than --absent-after while rank 0's
        # trainer is still connected (so it is not let go then); then that trainer dies.
        time.sleep(3)
        child.kill()
        child.wait()
        other.join(timeout=60)
        assert not other.is_alive(), "rank 1 waited forever for the killed rank 0"
        steps = rows // 2000
        assert got[1] == ("done", list(range(steps))), got
        # Rank 0 resumes where its trainer stopped and gets exactly the rest.
        _read_all(client, 0, 2, got, start_step=5)
        assert got[0] == ("done", list(range(5, steps))), got
    finally:
        child.kill()
        s.stop()


def _cpu_seconds(pid):
    """User and system CPU time `pid` has used, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _open_files(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


FILES = 160
# The HTTP/2 client preface and an empty SETTINGS frame.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@pytest.mark.parametrize("port", ["flight", "metrics"])
def test_a_server_out_of_file_descriptors_waits_and_serves_again(data, port):
    """Connections that are opened and held until the server has no file descriptor
    left (an HTTP/2 preface and nothing else on the Flight port, nothing at all on the
    metrics port) used to make both accept loops retry the failing accept at once, at
    100-200% CPU: the server now pauses after a failed accept, closes metrics
    connections after 10 s, and serves the next trainer once descriptors are free (a
    run that found none to read its input with is UNAVAILABLE: the trainer retries)."""
    path, state = data

    def few_files():
        # Soft and hard both: the server raises its soft limit to the hard one at start.
        resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, FILES))

    s = Server(
        "--pipeline", PIPELINE, "--input", path, "--state", state,
        "--batch-size", "5000", "--metrics-listen", "127.0.0.1:0",
        preexec_fn=few_files,
    )
    held = []
    try:
        address = s.ready["listening" if port == "flight" else "metrics"]
        host, number = address.rsplit(":", 1)
        for _ in range(FILES + 20):
            sock = socket.create_connection((host, int(number)), timeout=10)
            if port == "flight":
                sock.sendall(PREFACE)
            held.append(sock)
        deadline = time.monotonic() + 10
        while _open_files(s.proc.pid) < FILES - 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _open_files(s.proc.pid) >= FILES - 2, "the connections did not use the files up"
        before = _cpu_seconds(s.proc.pid)
        time.sleep(2)
        spent = _cpu_seconds(s.proc.pid) - before
        assert spent < 0.5, f"{spent:.2f} CPU-seconds in 2 s with no descriptor left"
        if port == "metrics":
            # Held, never sending a request: closed by the server within its 10 s.
            held[0].settimeout(15)
            assert held[0].recv(1) == b""
        for sock in held:
            sock.close()
        held.clear()
        # Until the server has closed its side of them, a run may still find no
        # descriptor to read its input with: that is UNAVAILABLE (retry), never
        # FAILED_PRECONDITION (which says the input must be mended first).
        for _ in range(20):
            try:
                batches = Client(s.uri).batches("criteo", 0, 1)
                rows = sum(b.rows - b.padded_rows for b in batches)
                break
            except (HydrantError, flight.FlightError) as e:
                cause = e.__cause__ if isinstance(e, HydrantError) else e
                assert isinstance(cause, flight.FlightUnavailableError), repr(e)
                assert "retry" in str(e), str(e)
                time.sleep(0.5)
        else:
            raise AssertionError("no retry was served")
        assert rows == ROWS
        assert s.proc.poll() is None
    finally:
        for sock in held:
            sock.close()
        s.stop()
