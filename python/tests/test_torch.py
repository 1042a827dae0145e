"""TorchDataset and the DDP example (torchrun, two ranks) against the real server."""

import gc
import json
import os
import subprocess
import sys
import warnings

import pytest

from hydrant_client import HydrantError, TorchDataset

from conftest import PIPELINE, ROOT, ROWS, Server, hydrant, need_torch


def test_many_epochs_with_set_epoch_and_resume(serve):
    torch = need_torch()
    s = serve("--ranks", "1", "--batch-size", "1000", "--epochs", "3", "--shuffle")
    steps = -(-ROWS // 1000)
    data = TorchDataset(s.uri, "criteo", rank=0, world_size=1)
    seen = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable NumPy array" warning
        for epoch in range(2):
            data.set_epoch(epoch)
            for item in torch.utils.data.DataLoader(data, batch_size=None):
                assert set(item) >= {"dense", "ids", "label", "mask", "row_id", "epoch", "step"}
                assert item["dense"].shape == (1000, 13) and item["dense"].dtype == torch.float32
                assert item["epoch"] == epoch
                item["dense"] *= 2  # writable, in place
                seen.setdefault(epoch, []).extend(item["row_id"][~item["mask"]].tolist())
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(ROWS))
    assert seen[0] != seen[1]  # shuffled per epoch
    assert data.stall_seconds > 0

    # Resume at epoch 1 step 4: that epoch from step 4, the next from step 0.
    resumed = TorchDataset(s.uri, "criteo", start_epoch=1, start_step=4, rank=0, world_size=1)
    resumed.set_epoch(1)
    assert [i["step"] for i in resumed] == list(range(4, steps))
    resumed.set_epoch(2)
    assert [i["step"] for i in resumed] == list(range(steps))
    # Without set_epoch the next pass reads epoch 2 again, in the same order: as with
    # DistributedSampler, but said (a hostile run found it silent).
    with pytest.warns(UserWarning, match="reads epoch 2 again"):
        again = [i["step"] for i in resumed]
    assert again == list(range(steps))
    resumed.set_epoch(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        iter(resumed).reader.close()  # a new epoch: no warning


def test_an_epoch_that_failed_is_not_ended_cleanly_by_iterating_on(data):
    """Found by a hostile run: the epoch's iterator was a generator, so once a cut stream
    (or a Ctrl-C while it waited) had raised out of it, iterating on ended the epoch
    without a word (4 of 25 steps trained). Now it raises again. The dataset still
    pickles once iterated (it held its reader's lock), and a ``RANK`` that is not a
    number is named."""
    import pickle

    torch = need_torch()
    path, state = data
    s = Server("--pipeline", PIPELINE, "--input", path, "--state", state,
               "--ranks", "1", "--batch-size", "100")
    dataset = TorchDataset(s.uri, "criteo", rank=0, world_size=1)
    it = iter(torch.utils.data.DataLoader(dataset, batch_size=None))
    steps = [next(it)["step"] for _ in range(3)]
    s.proc.kill()
    s.proc.wait()
    with pytest.raises(HydrantError) as cut:
        while True:
            steps.append(next(it)["step"])
    for _ in range(2):
        with pytest.raises(HydrantError) as again:
            next(it)
        assert str(again.value) == str(cut.value)
    assert steps == list(range(len(steps))) and len(steps) < -(-ROWS // 100)
    copy = pickle.loads(pickle.dumps(dataset))
    assert (copy.uri, copy.rank, copy.epoch) == (dataset.uri, 0, 0)
    os.environ["RANK"] = ""
    try:
        with pytest.raises(HydrantError, match="RANK='' is not an integer"):
            TorchDataset(s.uri, "criteo", world_size=1)
    finally:
        del os.environ["RANK"]
    # The client's channel to the killed server would linger (gRPC reconnecting on its
    # threads) into a later test's fork of DataLoader workers, which could then hang.
    del it, dataset, copy, cut, again
    gc.collect()


def test_dataloader_workers_are_refused_with_a_clear_error(serve):
    torch = need_torch()
    gc.collect()  # no channel of an earlier test's client is alive across the fork
    s = serve("--ranks", "1", "--batch-size", "1000")
    data = TorchDataset(s.uri, "criteo", rank=0, world_size=1)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2)
    with pytest.raises(HydrantError, match=r"num_workers=0.*another reader of rank 0"):
        next(iter(loader))


def run_ddp(uri, tmp_path, *extra):
    # faulthandler: a rank that aborts prints every thread's Python stack.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    out = subprocess.run(
        [*torchrun, str(ROOT / "python" / "examples" / "torch_ddp.py"), uri, "criteo",
         "--epochs", "2", "--checkpoint", str(tmp_path / "ckpt.pt"), *map(str, extra)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    lines = out.stdout.strip().splitlines()
    return lines, json.loads(lines[-1])


def test_ddp_example_learns_sees_every_row_once_and_resumes(tmp_path_factory, tmp_path):
    """The issue's CI check: torchrun with two ranks against a real `hydrant serve` on
    200k rows, stopped after a checkpoint and resumed from it."""
    need_torch()
    rows = 200_000
    d = tmp_path_factory.mktemp("ddp")
    path, state = d / "criteo.parquet", d / "state.json"
    hydrant("gen", "criteo", "--rows", rows, "--out", path)
    hydrant("fit", "--pipeline", PIPELINE, "--input", path, "--out", state)
    s = Server("--pipeline", PIPELINE, "--input", path, "--state", state, "--ranks", "2",
               "--batch-size", "1024", "--epochs", "2", "--shuffle")
    try:
        _, first = run_ddp(s.uri, tmp_path, "--stop-after-step", 30,
                           "--record-rows", tmp_path / "a.json")
        lines, rest = run_ddp(s.uri, tmp_path, "--resume", "--record-rows", tmp_path / "b.json")
    finally:
        s.stop()
    assert first["stopped"] and first["steps_per_rank"] == [31, 31]
    assert "resuming at epoch 0 step 31" in lines
    steps = -(-rows // 2048)
    assert rest["steps_per_rank"] == [2 * steps - 31] * 2  # both ranks, the same steps
    assert first["batch_sizes"] == rest["batch_sizes"] == [1024]  # every batch exactly B
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    # Every row exactly once per epoch, across ranks and across the stop and resume.
    assert sorted(a["0"] + b["0"]) == list(range(rows))
    assert sorted(b["1"]) == list(range(rows))
    assert rest["loss_last"] < 0.62, lines


def test_a_trainer_that_stops_mid_epoch_without_closing_its_reader_exits_cleanly(serve):
    """A trainer that checkpoints and exits mid-epoch leaves its reader thread reading
    ahead. Killed inside pyarrow as the interpreter finalized, that thread once aborted a
    DDP rank with SIGABRT ("terminate called without an active exception"); readers
    still running are now cancelled and joined at exit."""
    need_torch()
    s = serve("--ranks", "2", "--batch-size", "100", "--epochs", "50")
    script = (
        "import sys\n"
        "from torch.utils.data import DataLoader\n"
        "from hydrant_client import TorchDataset\n"
        "data = TorchDataset(sys.argv[1], 'criteo', rank=int(sys.argv[2]), world_size=2)\n"
        "for i, _ in enumerate(DataLoader(data, batch_size=None)):\n"
        "    if i == 3:\n"
        "        break\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    for run in range(4):
        out = subprocess.run(
            [sys.executable, "-c", script, s.uri, str(run % 2)],
            capture_output=True, text=True, env=env, timeout=60,
        )
        assert out.returncode == 0, out.stderr[-2000:]


def test_closing_a_dataset_mid_epoch_ends_its_stream_and_thread(serve):
    """``TorchDataset.close()`` (and leaving its ``with`` block) ends the stream an
    iteration left open and joins its reader thread; the next iteration reads afresh."""
    import threading

    torch = need_torch()
    s = serve("--ranks", "1", "--batch-size", "100", "--epochs", "2")

    def readers():
        return [t for t in threading.enumerate() if t.name.startswith("hydrant-rank-")]

    with TorchDataset(s.uri, "criteo", rank=0, world_size=1) as data:
        for i, item in enumerate(torch.utils.data.DataLoader(data, batch_size=None)):
            if i == 2:
                break
        assert len(readers()) == 1  # reading ahead
        data.close()
        assert readers() == []
        data.close()  # twice is harmless
        assert [i["step"] for i in data][:3] == [0, 1, 2]
        data.set_epoch(1)
        next(iter(data))
    assert readers() == []
