"""One batch per step, the epoch's end, read-ahead and writable views, against the real
server."""

import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from hydrant_client import Client, HydrantError

from conftest import ROWS, Server


def raw_messages(uri, ticket):
    """Every message of a stream, as (rows or None, metadata dict)."""
    reader = flight.FlightClient(uri).do_get(ticket)
    out = []
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return out
        meta = json.loads(chunk.app_metadata.to_pybytes()) if chunk.app_metadata else {}
        out.append((chunk.data.num_rows if chunk.data is not None else None, meta))


def test_a_step_larger_than_one_message_arrives_as_one_batch(serve):
    """20,000 rows of Criteo are ~5 MB: over the 4 MiB gRPC default, so two messages."""
    s = serve("--ranks", "1", "--batch-size", "20000")
    client = Client(s.uri)
    messages = raw_messages(s.uri, client.ticket("criteo", 0, 1))
    assert [m["step"] for _, m in messages] == [0, 0, 1, 1]
    assert all(rows < 20000 for rows, _ in messages)
    # Each message of a step carries that step's metadata, `last` included: a client
    # gathers `rows` rows whichever of the step's messages it reads the metadata from.
    assert messages[0][1] == messages[1][1] and messages[2][1] == messages[3][1]
    assert [m["rows"] for _, m in messages] == [20000] * 4
    assert [bool(m.get("last")) for _, m in messages] == [False, False, True, True]
    got = list(client.batches("criteo", 0, 1))
    assert [b.step for b in got] == [0, 1]
    assert all(b.dense.shape == (20000, 13) and len(b.row_id) == 20000 for b in got)
    assert [b.last for b in got] == [False, True]
    ids = [i for b in got for i in b.row_id[~b.mask].tolist()]
    assert ids == list(range(ROWS))


def test_a_step_that_fits_is_one_message_and_the_last_says_so(serve):
    s = serve("--ranks", "2", "--batch-size", "4096")
    client = Client(s.uri)
    steps = -(-ROWS // 8192)
    got = {}
    import threading

    t = threading.Thread(target=lambda: got.setdefault(1, list(client.batches("criteo", 1, 2))))
    t.start()
    messages = raw_messages(s.uri, client.ticket("criteo", 0, 2))
    t.join()
    assert [m["step"] for _, m in messages] == list(range(steps))
    assert [bool(m.get("last")) for _, m in messages] == [False] * (steps - 1) + [True]
    assert [b.step for b in got[1]] == list(range(steps)) and got[1][-1].last


def test_resuming_after_the_last_step_is_a_clean_empty_epoch(serve):
    s = serve("--ranks", "1", "--batch-size", "5000")
    client = Client(s.uri)
    steps = -(-ROWS // 5000)
    messages = raw_messages(s.uri, client.ticket("criteo", 0, 1, start_step=steps))
    version = client.status()["pipelines"][0]["state_version"]
    assert len(messages) == 1 and len(messages[0][1].pop("job")) == 16
    assert messages == [(0, {"epoch": 0, "step": steps, "rank": 0, "rows": 0,
                             "padded_rows": 0, "state_version": version, "last": True})]
    ticket = client.ticket("criteo", 0, 1, start_step=steps)
    assert flight.FlightClient(s.uri).do_get(ticket).read_all().num_rows == 0
    assert list(client.batches("criteo", 0, 1, start_step=steps)) == []


def test_a_server_killed_mid_epoch_is_a_cut_not_an_end(data):
    path, state = data
    from conftest import PIPELINE

    s = Server("--pipeline", PIPELINE, "--input", path, "--state", state,
               "--ranks", "1", "--batch-size", "100")
    got = []
    reader = Client(s.uri).batches("criteo", 0, 1)
    with pytest.raises(HydrantError) as cut:
        for b in reader:
            got.append(b)
            if b.step == 3:
                s.proc.kill()
    s.proc.wait()
    assert 4 <= len(got) < -(-ROWS // 100)
    # A retry loop over the same reader is told again, not given the epoch's end (found
    # by a hostile run: the second loop ended cleanly after 4 of 25 steps).
    for _ in range(2):
        with pytest.raises(HydrantError, match=str(cut.value)[:40].replace("(", ".")):
            for b in reader:
                got.append(b)


def test_closing_a_reader_wakes_a_consumer_waiting_on_another_thread(data):
    """A watchdog that closes a reader whose server stopped answering: the consumer
    waiting in ``next()`` used to wait forever."""
    import signal
    import threading

    path, state = data
    from conftest import PIPELINE

    s = Server("--pipeline", PIPELINE, "--input", path, "--state", state,
               "--ranks", "1", "--batch-size", "100")
    reader = Client(s.uri).batches("criteo", 0, 1, read_ahead=1)
    try:
        next(reader)
        s.proc.send_signal(signal.SIGSTOP)
        time.sleep(0.5)  # the read-ahead queue is drained below, then next() waits
        outcome = []

        def consume():
            try:
                while True:
                    next(reader)
            except BaseException as e:
                outcome.append(e)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        time.sleep(0.5)
        reader.close()
        consumer.join(timeout=10)
        assert not consumer.is_alive(), "the consumer still waits after close()"
        assert isinstance(outcome[0], HydrantError), outcome
        assert "closed before the epoch's last step" in str(outcome[0])
    finally:
        s.proc.send_signal(signal.SIGCONT)
        s.stop()


def test_a_frozen_server_fails_the_read_instead_of_hanging_it(data):
    """A server that stops answering (SIGSTOP: a frozen process, or a network that drops
    everything) left the trainer waiting in ``next()`` forever, found by a hostile run:
    keep-alive pings now cut the stream, which names the step to resume from."""
    import signal
    import threading

    path, state = data
    from conftest import PIPELINE

    s = Server("--pipeline", PIPELINE, "--input", path, "--state", state,
               "--ranks", "1", "--batch-size", "100")
    reader = Client(s.uri, keepalive=1).batches("criteo", 0, 1, read_ahead=1)
    try:
        next(reader)
        s.proc.send_signal(signal.SIGSTOP)
        outcome = []

        def consume():
            try:
                for _ in reader:
                    pass
                outcome.append("the epoch ended")
            except BaseException as e:
                outcome.append(e)

        consumer = threading.Thread(target=consume, daemon=True)
        began = time.monotonic()
        consumer.start()
        consumer.join(timeout=30)
        assert not consumer.is_alive(), "the reader still waits on a frozen server"
        assert isinstance(outcome[0], HydrantError), outcome
        assert "resume with start_step" in str(outcome[0])
        assert time.monotonic() - began < 15
    finally:
        reader.close()
        s.proc.send_signal(signal.SIGCONT)
        s.stop()


def test_keepalive_is_seconds_or_none():
    for bad in (0, -1, True, "30"):
        with pytest.raises(ValueError, match="keepalive"):
            Client("grpc://127.0.0.1:1", keepalive=bad)


def test_views_are_writable_and_not_copies(serve):
    s = serve("--ranks", "1", "--batch-size", "1000")
    b = next(iter(Client(s.uri).batches("criteo", 0, 1)))
    for a in (b.dense, b.ids, b.label, b.row_id):
        assert a.flags["WRITEABLE"] and not a.flags["OWNDATA"]
    # The view is the Arrow buffer: a write shows through the record batch.
    b.dense[0, 0] = 1234.5
    values = b.record_batch.column("dense").flatten()
    assert values[0].as_py() == 1234.5
    ids = b.record_batch.column("row_id").to_numpy()
    assert np.array_equal(ids, b.row_id)


def test_read_ahead_is_bounded_and_overlaps_the_consumer(serve):
    s = serve("--ranks", "1", "--batch-size", "200")
    reader = Client(s.uri).batches("criteo", 0, 1, read_ahead=3)
    first = next(reader)
    time.sleep(1.0)  # the "training step": the reader thread fills its queue meanwhile
    assert reader._pump.queue.qsize() == 3  # bounded: never more than read_ahead
    before = reader.stall_seconds
    rest = [next(reader) for _ in range(3)]
    assert reader.stall_seconds - before < 0.1  # waiting steps were ready
    assert [b.step for b in [first] + rest] == [0, 1, 2, 3]
    reader.close()
    assert not reader._thread.is_alive()
    # Iterating a reader closed mid-epoch is an error saying where to go on, not what
    # the epoch's end looks like (found by a hostile run: `list(reader)` was `[]`).
    with pytest.raises(HydrantError, match="closed before the epoch's last step.*start_step=4"):
        list(reader)
    # Closing cancelled the stream; a new reader of the rank gets the rest.
    again = list(Client(s.uri).batches("criteo", 0, 1, start_step=4))
    assert [b.step for b in again] == list(range(4, -(-ROWS // 200)))


def test_an_abandoned_reader_stops_its_thread(serve):
    s = serve("--ranks", "1", "--batch-size", "200")
    reader = Client(s.uri).batches("criteo", 0, 1)
    next(reader)
    thread = reader._thread
    del reader
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_read_ahead_must_be_positive(serve):
    s = serve("--ranks", "1", "--batch-size", "200")
    with pytest.raises(ValueError, match="read_ahead"):
        Client(s.uri).batches("criteo", 0, 1, read_ahead=0)


def test_a_step_cut_short_is_an_error():
    from hydrant_client.batch import steps

    rb = pa.record_batch({"row_id": pa.array([0, 1], pa.uint64()),
                          "is_padding": pa.array([False, False])})
    meta = json.dumps({"epoch": 0, "step": 0, "rank": 0, "rows": 4}).encode()
    nxt = json.dumps({"epoch": 0, "step": 1, "rank": 0, "rows": 2}).encode()
    with pytest.raises(HydrantError, match="step 0 ended after 2 of 4 rows"):
        list(steps([(rb, meta), (rb, nxt)], 0, 0))
    with pytest.raises(HydrantError, match="expected step 0, the server sent 1"):
        list(steps([(rb, nxt)], 0, 0))
    with pytest.raises(HydrantError, match="inside step 0"):
        list(steps([(rb, meta)], 0, 0))


def test_padding_masks_are_unpacked_exactly_and_writable():
    from hydrant_client.batch import _bools

    rng = np.random.default_rng(7)
    for n in (0, 1, 7, 8, 9, 64, 65, 1000):
        column = pa.array(rng.random(n) < 0.3)
        for offset in range(min(n, 11)):
            for length in (0, 1, n - offset):
                part = column.slice(offset, length)
                mask = _bools(part)
                assert mask.dtype == np.bool_ and mask.flags.writeable
                assert mask.tolist() == part.to_pylist()


def test_the_first_step_imports_no_pandas(serve):
    """pyarrow's Boolean to_numpy imports pandas where it is installed (~0.4 s, all of it
    a trainer's wait for its first step); the client reads the padding mask itself."""
    import subprocess
    import sys

    s = serve("--ranks", "1", "--batch-size", "1000")
    code = (
        "import sys\n"
        "from hydrant_client import Client\n"
        f"next(iter(Client({s.uri!r}).batches('criteo', 0, 1)))\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
