"""Trainers killed with SIGKILL at random points and restarted from their last finished
step + 1, as a job scheduler restarts a crashed pod: every step and every row arrives
exactly once, each time."""

import json
import os
import random
import subprocess
import sys
import threading

from conftest import ROWS

# A trainer process: prints each step it finishes, as one flushed line (its checkpoint).
TRAINER = r"""
import json, sys, time
from hydrant_client import Client
uri, rank, world, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for b in Client(uri).batches("criteo", rank, world, start_step=start):
    time.sleep(0.004)  # the training step
    print(json.dumps({"step": b.step, "ids": b.row_id[~b.mask].tolist()}), flush=True)
print(json.dumps({"done": True}), flush=True)
"""


def run_rank(uri, rank, world, kills, rng, out):
    """Runs rank `rank`'s trainer to the end of the epoch, SIGKILLing it `kills` times."""
    steps, ids, restarts, cut = [], [], 0, 0
    while True:
        start = steps[-1] + 1 if steps else 0
        proc = subprocess.Popen(
            [sys.executable, "-c", TRAINER, uri, str(rank), str(world), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Killed after a random number of finished steps: mid-stream, with batches in
        # flight in the client's read-ahead and in gRPC's buffers.
        kill_after = rng.randint(1, 8) if restarts < kills else None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if kill_after is not None and len(lines) >= kill_after:
                proc.kill()
                restarts += 1
                break
        lines.extend(proc.stdout.read().splitlines(keepends=True))
        proc.wait(timeout=120)
        done, before = False, len(steps)
        for line in lines:
            if not line.endswith("\n"):
                break  # cut by the kill: not finished
            rec = json.loads(line)
            if rec.get("done"):
                done = True
                break
            steps.append(rec["step"])
            ids.extend(rec["ids"])
        if done:
            out[rank] = (steps, ids, restarts, cut)
            return
        cut += len(steps) > before
        assert proc.returncode != 0 or lines, proc.stderr.read()


def test_twenty_sigkilled_trainers_resume_exactly_once(serve):
    s = serve("--ranks", "2", "--batch-size", "100", "--shuffle")
    rng = random.Random(int(os.environ.get("HYDRANT_TEST_SEED", "7")))
    out = {}
    threads = [
        threading.Thread(target=run_rank, args=(s.uri, r, 2, 10, random.Random(rng.random()), out))
        for r in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    n = -(-ROWS // 200)
    assert sorted(out) == [0, 1]
    for r in range(2):
        steps, _, restarts, cut = out[r]
        assert restarts == 10
        # Most kills land mid-stream, after some steps and before the end.
        assert cut >= 5, f"rank {r}: only {cut} of the kills cut a stream"
        assert steps == list(range(n)), f"rank {r}: {steps}"
    ids = sorted(out[0][1] + out[1][1])
    assert ids == list(range(ROWS))


def test_a_resume_at_a_server_restarted_for_another_job_is_refused(data):
    """Found by a hostile run: a server restarted with another --seed (or batch size, or
    without --shuffle) took a resuming trainer's ticket and served other rows at the
    steps it asked for: 50,068 of 200,000 rows were then read twice and as many never.
    Batches say which job they are of; a client names it in its later tickets (and a
    checkpoint can keep it), and a server of another job refuses them."""
    import socket

    import pytest
    from conftest import BIN, PIPELINE
    from hydrant_client import Client, HydrantError

    path, state = data
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def start(*options):
        proc = subprocess.Popen(
            [str(BIN), "serve", "--listen", f"127.0.0.1:{port}", "--pipeline", str(PIPELINE),
             "--input", str(path), "--state", str(state), "--ranks", "1",
             "--batch-size", "100", "--shuffle", *options],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert proc.stdout.readline(), proc.stderr.read()
        return proc

    server = start("--seed", "1")
    client = Client(f"grpc://127.0.0.1:{port}")
    try:
        reader = client.batches("criteo", 0, 1)
        first = [next(reader) for _ in range(3)]
        reader.close()
        job = first[0].job
        assert len(job) == 16 and all(b.job == job for b in first)
        assert client.job("criteo") == job
        server.kill()
        server.wait()
        # The same job again (more epochs is the same job): the resume is served.
        server = start("--seed", "1", "--epochs", "2")
        resumed = client.batches("criteo", 0, 1, start_step=3)
        assert next(resumed).step == 3
        resumed.close()
        server.kill()
        server.wait()
        server = start("--seed", "2")
        with pytest.raises(HydrantError, match="FAILED_PRECONDITION.*another job.*--seed"):
            next(iter(client.batches("criteo", 0, 1, start_step=3)))
        # A new client (a trainer restarted from a checkpoint) given the job: the same.
        other = Client(f"grpc://127.0.0.1:{port}")
        with pytest.raises(HydrantError, match="another job"):
            next(iter(other.batches("criteo", 0, 1, start_step=3, job=job)))
        # Without one, the epoch is read as this server places it; an epoch read from its
        # first step names no job, and a resume then names the job read last.
        assert next(iter(other.batches("criteo", 0, 1))).job != job
        fresh = client.batches("criteo", 0, 1)
        assert next(fresh).job != job and client.job("criteo") != job
        fresh.close()
        assert next(iter(client.batches("criteo", 0, 1, start_step=3))).step == 3
        with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*16 hex digits"):
            next(iter(other.batches("criteo", 0, 1, job="not-a-job")))
    finally:
        server.kill()
        server.wait()
