"""`hydrant serve` as a cluster of two real processes on loopback, read by four
concurrent pyarrow clients, each connected to the location its endpoint names, and by the
hydrant client connected to one process only."""

import json
import subprocess
import threading
import time

import pyarrow.flight as flight
import pytest

from hydrant_client import Client, HydrantError

from conftest import BIN, PIPELINE, ROWS, free_port
from test_client import real_ids

WORLD = 4
BATCH = 500




def start_cluster(data, tmp_path, batch, listen=("127.0.0.1:0", "127.0.0.1:0")):
    """Two `hydrant serve` processes of one cluster, serving WORLD ranks of `batch` rows
    (listening on `listen`, by process), and their ready lines, by process."""
    path, state = data
    hosts = tmp_path / "hosts"
    if not hosts.exists():
        hosts.write_text("".join(f"127.0.0.1:{free_port()}\n" for _ in range(2)))
    procs = [
        subprocess.Popen(
            [str(BIN), "serve", "--listen", listen[p], "--pipeline", str(PIPELINE),
             "--input", str(path), "--state", str(state), "--ranks", str(WORLD),
             "--batch-size", str(batch), "--workers", "1", "--processes", "2",
             "--process", str(p), "--hostfile", str(hosts)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(2)
    ]
    ready = []
    for p in procs:
        line = p.stdout.readline()
        if not line:
            for q in procs:
                q.kill()
            raise RuntimeError("hydrant serve did not start: " + p.stderr.read())
        ready.append(json.loads(line))
    return procs, ready


@pytest.fixture
def cluster(data, tmp_path):
    """Two `hydrant serve` processes of one cluster; their ready lines, by process."""
    procs, ready = start_cluster(data, tmp_path, BATCH)
    yield ready
    for p in procs:
        p.kill()
        p.wait()


def check_exactly_once(steps, ids):
    n = -(-ROWS // (WORLD * BATCH))
    assert steps == [list(range(n))] * WORLD
    assert sorted(ids) == list(range(ROWS))


def test_pyarrow_clients_read_each_rank_where_its_endpoint_says(cluster):
    uris = ["grpc://" + r["listening"] for r in cluster]
    assert [r["local_ranks"] for r in cluster] == [[0, 1], [2, 3]]
    info = flight.connect(uris[1]).get_flight_info(flight.FlightDescriptor.for_path("criteo"))
    endpoints = list(info.endpoints)
    locations = [ep.locations[0].uri.decode() for ep in endpoints]
    assert locations == [uris[0], uris[0], uris[1], uris[1]]
    got = {}

    def read(rank):
        reader = flight.connect(locations[rank]).do_get(endpoints[rank].ticket)
        steps, ids = [], []
        for chunk in reader:
            meta = json.loads(chunk.app_metadata.to_pybytes())
            batch = chunk.data
            assert batch.num_rows == BATCH
            steps.append(meta["step"])
            pad = batch.column("is_padding").to_pylist()
            ids += [i for i, p in zip(batch.column("row_id").to_pylist(), pad) if not p]
        got[rank] = (steps, ids)

    threads = [threading.Thread(target=read, args=(r,), daemon=True) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(got) == list(range(WORLD))
    check_exactly_once([got[r][0] for r in range(WORLD)], [i for r in got for i in got[r][1]])

    # A rank asked of a process that does not own it: told where it is served.
    with pytest.raises(Exception, match="served by process 1"):
        list(flight.connect(uris[0]).do_get(endpoints[3].ticket))


def test_the_hydrant_client_follows_each_rank_to_its_process(cluster):
    client = Client("grpc://" + cluster[0]["listening"])
    assert client.locations("criteo")[2] == "grpc://" + cluster[1]["listening"]
    got = {}

    def read(rank):
        got[rank] = list(client.batches("criteo", rank, WORLD))

    threads = [threading.Thread(target=read, args=(r,), daemon=True) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(got) == list(range(WORLD)), "every rank read to its end"
    steps = [[b.step for b in got[r]] for r in range(WORLD)]
    check_exactly_once(steps, [i for r in range(WORLD) for i in real_ids(got[r])])
    assert all(b.last for b in (got[r][-1] for r in range(WORLD)))
    with pytest.raises(HydrantError):
        Client("grpc://" + cluster[0]["listening"]).batches("nope", 0, WORLD)


def test_a_client_follows_a_rank_to_where_its_restarted_process_serves_it(data, tmp_path):
    """A cluster restarted with a process at another address (a pod rescheduled): the
    same Client resumes there. It used to keep the locations it first looked up, and
    failed with UNAVAILABLE on the old address for good (found by a hostile run)."""
    zero, one, moved = (f"127.0.0.1:{free_port()}" for _ in range(3))
    procs, _ = start_cluster(data, tmp_path, BATCH, (zero, one))
    try:
        client = Client("grpc://" + zero)
        reader = client.batches("criteo", 2, WORLD)
        got = [next(reader) for _ in range(3)]
        reader.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    procs, _ = start_cluster(data, tmp_path, BATCH, (zero, moved))
    try:
        client.wait_ready(timeout=60)
        got += list(client.batches("criteo", 2, WORLD, start_step=3))
        n = -(-ROWS // (WORLD * BATCH))
        assert [b.step for b in got] == list(range(n))
        fresh = list(Client("grpc://" + zero).batches("criteo", 2, WORLD))
        assert real_ids(got) == real_ids(fresh)
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize("pause", [0.0, 0.01])
def test_a_lost_process_ends_a_slow_trainer_s_stream_with_where_to_resume(data, tmp_path, pause):
    """SIGKILL one process of two while a trainer reads a rank of the other, at once or
    slowly: the trainer keeps every step sent before the loss, then gets a HydrantError
    that names the step to resume from (the lost process, where the status reached it
    before the survivor gave up on it), never a clean end; the survivor exits with a
    line naming the lost process."""
    # Tiny steps: hundreds a rank, so that the loss comes mid-epoch.
    procs, ready = start_cluster(data, tmp_path, 7)
    try:
        reader = Client("grpc://" + ready[0]["listening"]).batches("criteo", 0, WORLD)
        got = [next(reader) for _ in range(10)]
        procs[1].kill()
        killed = time.monotonic()
        with pytest.raises(HydrantError) as cut:
            for batch in reader:
                got.append(batch)
                time.sleep(pause)
        steps = [b.step for b in got]
        assert steps == list(range(len(got))), "every step before the loss, in order"
        assert len(got) < -(-ROWS // (WORLD * 7)), "the loss came mid-epoch"
        assert str(cut.value).endswith(f"resume with start_step {len(got)}"), cut.value
        if pause == 0.0:
            assert "lost process 1" in str(cut.value), cut.value
        procs[0].wait(timeout=max(1.0, 15 - (time.monotonic() - killed)))
        assert procs[0].returncode not in (0, None)
        # Its last line (before it, a note that rank 1, which no one read, was let go).
        log = procs[0].stderr.read()
        assert "lost process 1" in log.strip().splitlines()[-1], log
        assert "panicked" not in log, log
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_wait_ready_waits_for_a_cluster_to_join(data, tmp_path):
    # A process waiting for its cluster answers every call but the handshake UNAVAILABLE
    # ("the server is starting"), at once: it used to leave a trainer waiting 20 s for
    # gRPC's connect timeout. wait_ready() waits that out.
    path, state = data
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"127.0.0.1:{free_port()}\n" for _ in range(2)))
    listen = f"127.0.0.1:{free_port()}"

    def start(p, at):
        return subprocess.Popen(
            [str(BIN), "serve", "--listen", at, "--pipeline", str(PIPELINE), "--input",
             str(path), "--state", str(state), "--ranks", "2", "--workers", "1",
             "--processes", "2", "--process", str(p), "--hostfile", str(hosts)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = [start(0, listen)]
    try:
        client = Client("grpc://" + listen)
        began = time.monotonic()
        with pytest.raises(HydrantError, match="not ready after 1.0 s.*is starting"):
            client.wait_ready(timeout=1.0)
        assert time.monotonic() - began < 10
        with pytest.raises(HydrantError, match="is starting"):
            client.endpoints("criteo")
        procs.append(start(1, "127.0.0.1:0"))
        client.wait_ready(timeout=60)
        assert len(client.endpoints("criteo")) == 2
    finally:
        for p in procs:
            p.kill()
            p.wait()
