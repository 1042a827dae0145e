"""CudaStaging on a real GPU (run by `scripts/gpu-check`). Without torch or a CUDA device
these tests are skipped, unless HYDRANT_REQUIRE_GPU=1 (what the script sets)."""

import os
import time

import numpy as np
import pytest

from hydrant_client import Client, CudaStaging, TorchDataset


def cuda():
    if os.environ.get("HYDRANT_REQUIRE_GPU") == "1":
        import torch

        assert torch.cuda.is_available(), "HYDRANT_REQUIRE_GPU=1 but torch sees no GPU"
        return torch
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def test_values_on_the_device_equal_the_hosts(serve):
    torch = cuda()
    s = serve("--ranks", "1", "--batch-size", "2000")
    host = list(Client(s.uri).batches("criteo", 0, 1))
    device = list(TorchDataset(s.uri, "criteo", rank=0, world_size=1, device="cuda"))
    assert len(host) == len(device)
    for h, d in zip(host, device):
        assert d["dense"].is_cuda and d["ids"].is_cuda
        assert np.array_equal(d["dense"].cpu().numpy(), h.dense)
        assert np.array_equal(d["ids"].cpu().numpy(), h.ids)
        assert np.array_equal(d["label"].cpu().numpy(), h.label)
        assert np.array_equal(d["mask"].cpu().numpy(), h.mask)
        assert d["step"] == h.step
    del device
    torch.cuda.synchronize()


def test_the_copy_of_the_next_step_overlaps_the_work_on_this_one(serve):
    """CUDA events: the staging stream's copy of step n+1 starts before the consumer's
    stream finishes its work on step n."""
    torch = cuda()
    s = serve("--ranks", "1", "--batch-size", "16384")
    staging = CudaStaging("cuda")
    copies = []

    def prepare(batch):
        start = torch.cuda.Event(enable_timing=True)
        start.record(staging.stream)
        out = staging.prepare(batch)
        end = torch.cuda.Event(enable_timing=True)
        end.record(staging.stream)
        copies.append((start, end))
        return out

    reader = Client(s.uri).batches("criteo", 0, 1, prepare=prepare, receive=staging.receive)
    work = []
    big = torch.randn(4096, 4096, device="cuda")
    for item in reader:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(8):  # the training step: enough GPU work to overlap with
            big = (big @ big).clamp_(-1, 1)
        end.record()
        work.append((start, end))
        time.sleep(0.01)
    torch.cuda.synchronize()
    overlapped = 0
    for n in range(len(work) - 1):
        copy_start = copies[n + 1][0]
        work_end = work[n][1]
        # elapsed_time(a, b) is b - a in ms: negative when the copy began before the work ended.
        if work_end.elapsed_time(copy_start) < 0:
            overlapped += 1
    assert overlapped >= (len(work) - 1) // 2, f"{overlapped} of {len(work) - 1} copies overlapped"


def test_staging_throughput_against_torchs_pinned_copies(serve):
    """Figures, not assertions (timings are not tests here): the whole staging path (the
    host pack into pinned memory, the one copy a Python client cannot avoid since pyarrow
    decodes into its own memory, then the copy) and the pack alone, against torch's own
    pinned copies of the same step sizes, for small and large steps (a step's fixed cost
    in Python weighs on small ones). The issue's target is 0.8×. What the test asserts is
    that the timed steps arrived intact."""
    torch = cuda()
    for rows in (16384, 65536):
        s = serve("--ranks", "1", "--batch-size", str(rows), "--epochs", "6")
        batches = [b for e in range(6) for b in Client(s.uri).batches("criteo", 0, 1, epoch=e)]
        staged = _staging_figures(torch, batches)
        for b, d in zip(batches, staged):
            assert np.array_equal(d["ids"].cpu().numpy(), b.ids)
            assert np.array_equal(d["dense"].cpu().numpy(), b.dense)
            assert np.array_equal(d["mask"].cpu().numpy(), b.mask)


def _staging_figures(torch, batches):
    """Prints the staging, pack and bare pinned-copy rates over `batches` (best of 5);
    returns the staged steps."""
    sizes = [sum(a.nbytes for a in b.arrays().values() if a is not None) for b in batches]
    nbytes = sum(sizes)

    def best_of_5(run):
        best, out = float("inf"), None
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = run()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return nbytes / best, out

    staging = CudaStaging("cuda")
    staging.receive(staging.prepare(batches[0]))  # the caching allocators
    whole, staged = best_of_5(lambda: [staging.receive(staging.prepare(b)) for b in batches])
    packing, _ = best_of_5(lambda: [staging.pack(b.arrays())[0] for b in batches])
    pinned = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in sizes]
    side = torch.cuda.Stream()

    def torch_copies():
        with torch.cuda.stream(side):
            return [p.to("cuda", non_blocking=True) for p in pinned]

    theirs, _ = best_of_5(torch_copies)
    print(
        f"\n{nbytes / 1e6:.0f} MB in {len(batches)} steps of {len(batches[0].mask)} rows: "
        f"staging {whole / 1e9:.2f} GB/s ({whole / theirs:.2f}x; target 0.8x), "
        f"its host pack alone {packing / 1e9:.2f} GB/s ({packing / theirs:.2f}x), "
        f"torch pinned copies {theirs / 1e9:.2f} GB/s"
    )
    return staged


def test_device_and_pinned_memory_are_released(serve):
    torch = cuda()
    s = serve("--ranks", "1", "--batch-size", "8192", "--epochs", "2")
    data = TorchDataset(s.uri, "criteo", rank=0, world_size=1, device="cuda")
    list(data)  # warm
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    data.set_epoch(1)
    held = list(data)
    assert torch.cuda.memory_allocated() > before
    del held
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before
