"""One rank's batch of one step, decoded from Flight messages into NumPy views."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight


class HydrantError(Exception):
    """A request the server refused, or a stream that broke its contract, with the reason."""


class PushError(HydrantError):
    """A push that failed part-way. ``acks`` holds the acknowledgements of the batches
    admitted before the failure (the first ``len(acks)`` of those given), so that a
    producer can go on from the first batch that was not."""

    def __init__(self, message: str, acks: list):
        super().__init__(message)
        self.acks = acks


@dataclass
class Batch:
    """One rank's batch of one step: exactly ``B`` rows, the padding rows last.

    ``dense``, ``ids``, ``label`` and ``row_id`` are writable NumPy views of the received
    Arrow buffers (no copy); the batch owns that memory, so writing to it changes nothing
    else. ``mask`` is True for padding rows, which a trainer leaves out of its loss.
    ``dense`` is the pipeline's first float32 group and ``ids`` its first int64 one;
    ``groups`` holds every group's ``[B, width]`` view by its name, so a pipeline of
    several dense or ids groups loses none.
    """

    dense: Optional[np.ndarray]
    ids: Optional[np.ndarray]
    label: Optional[np.ndarray]
    row_id: np.ndarray
    mask: np.ndarray
    epoch: int
    step: int
    rank: int
    rows: int
    padded_rows: int
    state_version: int
    last: bool
    #: For a stream (followed or pushed input): the stream positions ``(first, end)``
    #: the rows were drawn from; None for file epochs.
    positions: Optional[tuple]
    record_batch: pa.RecordBatch
    #: Every group's ``[B, width]`` view, by group name, in the pipeline's order.
    groups: dict
    #: The served job's fingerprint (16 hex digits), which a resuming ticket names so
    #: that a server restarted to serve another job refuses it; None from older servers.
    job: Optional[str] = None

    def arrays(self) -> dict:
        """The arrays under the keys a trainer uses: ``dense``, ``ids``, ``label``,
        ``mask`` and ``row_id`` (int64, a view), then every other group under its own
        name, or ``group.NAME`` where its name is one of those (all views, none twice)."""
        out = {
            "dense": self.dense,
            "ids": self.ids,
            "label": self.label,
            "mask": self.mask,
            "row_id": self.row_id.view(np.int64),
        }
        for name, array in self.groups.items():
            if array is self.dense or array is self.ids:
                continue
            # A group named as one of the keys above (a second dense group `ids`, say)
            # comes under `group.NAME`.
            out[f"group.{name}" if name in out else name] = array
        return out

    def to_torch(self, device=None) -> dict:
        """The arrays as torch tensors sharing this batch's memory, then moved to
        ``device`` if one is given (for overlapped copies to a GPU use
        ``TorchDataset`` or ``Client.batches(..., device=...)``, which stage them)."""
        import torch

        out = {}
        for key, a in self.arrays().items():
            if a is None:
                out[key] = None
                continue
            t = torch.from_numpy(a)
            out[key] = t.to(device) if device is not None else t
        return out


class _Writable:
    """Lends NumPy a writable view of an Arrow buffer and keeps the buffer alive.

    Arrow hands received buffers to NumPy read-only, and torch warns (and may copy) on
    read-only arrays; the memory is this batch's alone, so a writable view is safe.
    """

    __slots__ = ("buffer", "__array_interface__")

    def __init__(self, buffer: pa.Buffer, dtype: np.dtype, shape: tuple, byte_offset: int):
        self.buffer = buffer
        self.__array_interface__ = {
            "data": (buffer.address + byte_offset, False),
            "shape": shape,
            "typestr": dtype.str,
            "version": 3,
        }


_DTYPES = {pa.float32(): np.dtype(np.float32), pa.int64(): np.dtype(np.int64),
           pa.uint64(): np.dtype(np.uint64)}


def _view(array: pa.Array, shape: tuple) -> np.ndarray:
    """A writable NumPy view of a primitive array without nulls, reshaped to ``shape``."""
    dtype = _DTYPES.get(array.type) or np.dtype(array.type.to_pandas_dtype())
    if array.null_count or len(array) == 0:
        return array.to_numpy(zero_copy_only=False).astype(dtype, copy=True).reshape(shape)
    data = array.buffers()[1]
    return np.asarray(_Writable(data, dtype, shape, array.offset * dtype.itemsize))


def _matrix(column: pa.Array) -> np.ndarray:
    """A FixedSizeList column as a ``[rows, width]`` view of its values."""
    width = column.type.list_size
    # `values` ignores the list's own offset (`flatten()` would not, but goes through
    # pyarrow.compute at ~20 µs a call), so slice it here.
    values = column.values.slice(column.offset * width, len(column) * width)
    return _view(values, (len(column), width))


def _bools(column: pa.Array) -> np.ndarray:
    """A Boolean column as a writable NumPy bool array, unpacked from its bitmap.

    Not ``to_numpy``: for Booleans it converts through pyarrow's pandas path, which imports
    pandas where it is installed — ~0.4 s on a trainer's first step."""
    n, offset = len(column), column.offset
    data = column.buffers()[1]
    if column.null_count or data is None:
        return column.to_numpy(zero_copy_only=False)
    bits = np.frombuffer(data, dtype=np.uint8, count=(offset + n + 7) // 8)
    return np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].view(np.bool_)


def decode(rb: pa.RecordBatch, meta: dict) -> Batch:
    """A batch from one step's rows and its metadata."""
    dense = ids = None
    groups = {}
    for field in rb.schema:
        if pa.types.is_fixed_size_list(field.type):
            groups[field.name] = matrix = _matrix(rb.column(field.name))
            if pa.types.is_float32(field.type.value_type) and dense is None:
                dense = matrix
            elif pa.types.is_int64(field.type.value_type) and ids is None:
                ids = matrix
    names = rb.schema.names
    n = rb.num_rows
    label = _view(rb.column("label"), (n,)) if "label" in names else None
    return Batch(
        dense=dense,
        ids=ids,
        label=label,
        row_id=_view(rb.column("row_id"), (n,)),
        mask=_bools(rb.column("is_padding")),
        epoch=meta.get("epoch", 0),
        step=meta.get("step", 0),
        rank=meta.get("rank", 0),
        rows=meta.get("rows", n),
        padded_rows=meta.get("padded_rows", 0),
        state_version=meta.get("state_version", 0),
        last=bool(meta.get("last", False)),
        positions=tuple(meta["positions"]) if "positions" in meta else None,
        record_batch=rb,
        groups=groups,
        job=meta.get("job"),
    )


def _concat(parts: list) -> pa.RecordBatch:
    """One record batch of a step sent as several messages (one copy)."""
    combined = pa.Table.from_batches(parts).combine_chunks().to_batches()
    return combined[0]


# Errors that cut a stream wherever it was: a server gone, or a run that failed.
_CUTS = (
    flight.FlightUnavailableError,
    flight.FlightCancelledError,
    flight.FlightTimedOutError,
    flight.FlightInternalError,
)


def _cut_named(chunks: Iterable, rank: int, resume_at) -> Iterator:
    """``chunks``, with an error that cut the stream (a server gone, a newer reader of the
    rank, a failed run) raised as ``HydrantError`` naming the step to resume from,
    ``resume_at()``. pyarrow's error is its ``__cause__`` (its class says the gRPC
    status). A refusal before the first message (a bad ticket, a rank served elsewhere)
    is no cut: it is raised as it came."""
    chunks, started = iter(chunks), False
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            return
        except (flight.FlightError, pa.ArrowException) as e:
            if not started and not isinstance(e, _CUTS):
                raise
            raise HydrantError(f"rank {rank}: {e}; resume with start_step {resume_at()}") from e
        started = True
        yield chunk


def steps(chunks: Iterable, rank: int, start_step: int) -> Iterator[Batch]:
    """One ``Batch`` per step from a rank's Flight chunks (``(RecordBatch or None,
    metadata bytes or None)`` pairs), reassembling steps sent as several messages.

    Raises ``HydrantError`` on a stream that breaks the contract: a step cut short, steps
    out of order, or an end without the epoch's ``last`` message (a cut, not completion).
    """
    parts, meta, have = [], None, 0
    expected = start_step
    for data, raw in _cut_named(chunks, rank, lambda: expected):
        m = json.loads(bytes(raw)) if raw else {}
        if data is None or (data.num_rows == 0 and m.get("rows") == 0):
            # The end of an epoch whose last step was not known in advance: a batch of no
            # rows (or, from other servers, a message of metadata alone) saying `last`.
            if m.get("last") and not parts and m.get("step", expected) == expected:
                return
            if m.get("last"):
                raise HydrantError(
                    f"rank {rank}: the epoch ended at step {m.get('step')} but step "
                    f"{expected} was next; resume with start_step {expected}"
                )
            continue
        if parts and m.get("step") != meta.get("step"):
            raise HydrantError(
                f"rank {rank}: step {meta.get('step')} ended after {have} of "
                f"{meta.get('rows')} rows; resume with start_step {meta.get('step')}"
            )
        if not parts:
            meta = m
            if m.get("step") != expected:
                raise HydrantError(
                    f"rank {rank}: expected step {expected}, the server sent {m.get('step')}; "
                    f"resume with start_step {expected}"
                )
        parts.append(data)
        have += data.num_rows
        want = meta.get("rows", have)
        if have > want:
            raise HydrantError(f"rank {rank}: step {expected} has {have} rows, not {want}")
        if have < want:
            continue
        rb = parts[0] if len(parts) == 1 else _concat(parts)
        batch = decode(rb, meta)
        parts, have = [], 0
        expected += 1
        yield batch
        if batch.last:
            return
    if parts:
        raise HydrantError(
            f"rank {rank}: the stream ended inside step {expected}; resume with start_step "
            f"{expected}"
        )
    raise HydrantError(
        f"rank {rank}: the stream ended after step {expected - 1} without the epoch's last "
        f"message (a cut, not the end of the epoch); resume with start_step {expected}"
    )
