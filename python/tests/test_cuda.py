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


def test_staging_throughput_is_near_torchs_pinned_copies(serve):
    torch = cuda()
    s = serve("--ranks", "1", "--batch-size", "65536")
    batches = list(Client(s.uri).batches("criteo", 0, 1))
    nbytes = sum(b.dense.nbytes + b.ids.nbytes + b.label.nbytes for b in batches)
    staging = CudaStaging("cuda")
    for b in batches[:1]:  # warm the caching allocators
        staging.receive(staging.prepare(b))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in batches:
        staging.receive(staging.prepare(b))
    torch.cuda.synchronize()
    ours = nbytes / (time.perf_counter() - t0)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    theirs = nbytes / (time.perf_counter() - t0)
    print(f"staging {ours / 1e9:.2f} GB/s, torch pinned copy {theirs / 1e9:.2f} GB/s")
    assert ours >= 0.8 * theirs, f"staging {ours / 1e9:.2f} GB/s vs torch {theirs / 1e9:.2f} GB/s"


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
