"""PyTorch: a rank's steps as an ``IterableDataset`` over many epochs, staged into CUDA
memory on a stream of their own so that the copy of step n+1 overlaps the work on n."""

from __future__ import annotations

import os
import warnings
from typing import Optional

import numpy as np

from .batch import Batch, HydrantError
from .client import Client


def _torch():
    try:
        import torch
    except ImportError as e:  # torch is an optional dependency
        raise HydrantError("TorchDataset needs torch: pip install 'hydrant-client[torch]'") from e
    return torch


def _tensors(batch: Batch) -> dict:
    out = batch.to_torch()
    out["epoch"], out["step"] = batch.epoch, batch.step
    return out


class CudaStaging:
    """Copies each step to ``device`` the way DALI and TorchRec do: on the reader thread,
    into pinned host memory, then host→device on a dedicated CUDA stream with an event
    recorded after the copy; the consumer's stream waits on that event when it takes the
    step, so nothing blocks the host and the copy overlaps the previous step's work.

    A step's arrays are packed into one pinned block (torch's ``copy_``, which uses
    torch's CPU threads) and cross in one copy; the device tensors are views of it. The
    pack is the one host copy a Python client cannot avoid (pyarrow decodes into its own
    memory). On two H200 machines (`scripts/gpu-check`) the whole path staged 11–21 GB/s
    on 4.5 MB steps and 26–40 GB/s on 18 MB steps, 0.22–0.41× and 0.49–0.74× of torch's
    bare pinned copies (the machines' host memory differed): what is left is that copy and
    each step's fixed cost in Python, which weighs on small steps.
    Packing with padding and recording each device view on the stream one by one was
    slower (17.1 against 22.3 GB/s on 4.5 MB steps, one sitting); copying in chunks to
    overlap the pack was slower (launch costs); filling through NumPy (one thread) gave
    6.5 GB/s and copies straight from pageable memory 4–7 GB/s.

    Pinned blocks come from torch's caching host allocator, which keeps a block until the
    copy that reads it has finished; device tensors are recorded on the consumer's stream
    so that their memory is not reused while the consumer still reads them.
    """

    def __init__(self, device):
        torch = _torch()
        self.torch = torch
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise HydrantError(f"CudaStaging needs a CUDA device, not {self.device}")
        self.stream = torch.cuda.Stream(device=self.device)

    def pack(self, arrays: dict):
        """The host half of ``prepare``: a step's arrays (``Batch.arrays()``) packed into
        one pinned block, and where each lies in it (``(key, array, offset)``). Wider
        items go first, so every array starts aligned for its dtype with no padding."""
        layout, size = [], 0
        present = [(k, a) for k, a in arrays.items() if a is not None]
        for key, array in sorted(present, key=lambda ka: -ka[1].itemsize):
            layout.append((key, array, size))
            size += array.nbytes
        pinned = self.torch.empty(size, dtype=self.torch.uint8, pin_memory=True)
        for _, array, at in layout:
            pinned[at : at + array.nbytes].copy_(self.torch.from_numpy(_bytes(array)))
        return pinned, layout

    def prepare(self, batch: Batch):
        """On the reader thread: pack into pinned memory, copy asynchronously, record the
        copy's event."""
        torch = self.torch
        arrays = batch.arrays()
        out = dict.fromkeys(arrays)
        out["epoch"], out["step"] = batch.epoch, batch.step
        pinned, layout = self.pack(arrays)
        with torch.cuda.stream(self.stream):
            device = pinned.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        for key, array, at in layout:
            typed = device[at : at + array.nbytes].view(_dtype(torch, array.dtype))
            out[key] = typed.view(array.shape)
        return out, device, done

    def receive(self, item) -> dict:
        """On the consumer's thread: its current stream waits for the copy, and the
        block's memory is kept until that stream's work on it is done (the tensors are
        views of one block, so one ``record_stream`` covers them all)."""
        out, device, done = item
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(done)
        device.record_stream(current)
        return out


def _bytes(array):
    """A contiguous array's bytes as a flat uint8 view (no copy)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _dtype(torch, dtype):
    """The torch dtype of a NumPy dtype that a batch's arrays use."""
    names = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool}
    if dtype.name not in names:
        raise HydrantError(f"cannot stage a {dtype} array on a CUDA device")
    return names[dtype.name]


def _dataset_base():
    try:
        import torch.utils.data

        return torch.utils.data.IterableDataset
    except ImportError:  # torch is optional
        return object


class TorchDataset(_dataset_base()):
    """One rank's steps as an ``IterableDataset``: each item is a dict of tensors
    (``dense``, ``ids``, ``label``, ``mask``, ``row_id``, any further group by its name;
    plus ``epoch`` and ``step``),
    one per step, exactly ``B`` rows each. Use ``DataLoader(dataset, batch_size=None)``
    with the default ``num_workers=0``: hydrant reads ahead on its own thread, and a
    second DataLoader worker would be a second reader of the same rank.

    Rank and world size default to torchrun's ``RANK`` and ``WORLD_SIZE``. Call
    ``set_epoch(e)`` before each epoch (as with ``DistributedSampler``; reading an epoch
    again without it is warned of). ``keepalive`` is ``Client``'s. To resume from a
    checkpoint taken after step ``S`` of epoch ``E``, pass ``start_epoch=E,
    start_step=S + 1``: that epoch starts there, later ones from step 0 (keep
    ``dataset.job`` with the checkpoint and pass it as ``job=``: a server restarted to
    serve another job then refuses the resume, rather than give other rows). With a CUDA
    ``device`` the tensors arrive on it through ``CudaStaging``.
    """

    def __init__(
        self,
        uri: str,
        pipeline: str,
        start_epoch: int = 0,
        start_step: int = 0,
        token=None,
        device=None,
        read_ahead: int = 2,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        job: Optional[str] = None,
        keepalive: Optional[float] = 30.0,
    ):
        self.uri, self.pipeline, self.token, self.keepalive = uri, pipeline, token, keepalive
        # The job read last (or given, from a checkpoint): a resume mid-epoch names it.
        self.job = job
        self.epoch, self.start_epoch, self.start_step = start_epoch, start_epoch, start_step
        self.device, self.read_ahead = device, read_ahead
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        self.stall_seconds = 0.0
        self._reader = None
        # Epochs read to their end: reading one again without set_epoch is warned of.
        self._finished = set()

    def __getstate__(self):
        # A reader (its thread, its stream) belongs to the process that opened it.
        state = self.__dict__.copy()
        state["_reader"] = None
        return state

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads."""
        self.epoch = epoch

    def close(self) -> None:
        """Cancels the stream an iteration left open (a trainer that stops mid-epoch, as
        at a checkpoint-and-exit) and joins its reader thread. A later iteration opens a
        new one; leaving a ``with`` block closes too."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __iter__(self):
        torch = _torch()
        if torch.utils.data.get_worker_info() is not None:
            raise HydrantError(
                "TorchDataset must be read with DataLoader(num_workers=0): it reads ahead "
                "on a thread of its own, and each DataLoader worker would be another "
                f"reader of rank {self.rank}, which replaces the one before"
            )
        if self.epoch in self._finished:
            warnings.warn(
                f"TorchDataset reads epoch {self.epoch} again, in the same order: give "
                "each new epoch to set_epoch before it (as with DistributedSampler)",
                stacklevel=2,
            )
        start = self.start_step if self.epoch == self.start_epoch else 0
        staging = None
        if self.device is not None and torch.device(self.device).type == "cuda":
            staging = CudaStaging(self.device)
        client = Client(self.uri, self.token, keepalive=self.keepalive)
        reader = client.batches(
            self.pipeline,
            self.rank,
            self.world_size,
            self.epoch,
            start,
            read_ahead=self.read_ahead,
            prepare=staging.prepare if staging else _tensors,
            receive=staging.receive if staging else None,
            job=self.job if start else None,
        )
        if self._reader is not None:
            self._reader.close()  # an earlier iteration left early: its stream ends here
        self._reader = reader
        return _Epoch(self, reader)


class _Epoch:
    """One epoch's iteration of a ``TorchDataset``. Not a generator: a generator that
    raised (a cut stream, a Ctrl-C while it waited) is over, and iterating it on would end
    the epoch early without a word; this one raises the reader's error again."""

    def __init__(self, dataset: TorchDataset, reader):
        self.dataset, self.reader, self.epoch = dataset, reader, dataset.epoch
        self.stalled = dataset.stall_seconds

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.reader)
        except StopIteration:
            self.dataset._finished.add(self.epoch)
            raise
        finally:
            self.dataset.stall_seconds = self.stalled + self.reader.stall_seconds
            self.dataset.job = self.reader.job or self.dataset.job


def _env_int(name: str, default: int) -> int:
    """Environment variable ``name`` (torchrun's ``RANK``, ``WORLD_SIZE``) as an int."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise HydrantError(
            f"{name}={text!r} is not an integer (torchrun sets it; or pass "
            f"{name.lower()}= to TorchDataset)"
        ) from None
