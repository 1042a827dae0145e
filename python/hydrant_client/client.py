"""The Flight client: tickets, per-batch metadata, zero-copy NumPy views."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight


class HydrantError(Exception):
    """A request the server refused, with its reason."""


@dataclass
class Batch:
    """One rank's batch of one step."""

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
    record_batch: pa.RecordBatch

    def to_torch(self, device=None):
        """The arrays as torch tensors (shared memory on the CPU), moved to ``device``."""
        import torch

        def t(a):
            if a is None:
                return None
            x = torch.from_numpy(a)
            return x.to(device, non_blocking=True) if device is not None else x

        return {
            "dense": t(self.dense),
            "ids": t(self.ids),
            "label": t(self.label),
            "mask": t(self.mask),
            "row_id": t(self.row_id.astype(np.int64)),
        }


def _matrix(column: pa.Array) -> np.ndarray:
    """A FixedSizeList column as a [rows, width] array viewing its child buffer."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    width = column.type.list_size
    values = column.values  # respects the list's offset and length
    flat = values.to_numpy(zero_copy_only=True)
    return flat.reshape(len(column), width)


def _batch(chunk: flight.FlightStreamChunk) -> Batch:
    rb = chunk.data
    meta = json.loads(chunk.app_metadata.to_pybytes()) if chunk.app_metadata else {}
    names = rb.schema.names
    dense = ids = None
    for name, field in zip(names, rb.schema):
        if pa.types.is_fixed_size_list(field.type):
            if pa.types.is_float32(field.type.value_type) and dense is None:
                dense = _matrix(rb.column(name))
            elif pa.types.is_int64(field.type.value_type) and ids is None:
                ids = _matrix(rb.column(name))
    label = rb.column("label").to_numpy(zero_copy_only=False) if "label" in names else None
    mask = rb.column("is_padding").to_numpy(zero_copy_only=False)
    return Batch(
        dense=dense,
        ids=ids,
        label=label,
        row_id=rb.column("row_id").to_numpy(),
        mask=mask,
        epoch=meta.get("epoch", 0),
        step=meta.get("step", 0),
        rank=meta.get("rank", 0),
        rows=meta.get("rows", rb.num_rows),
        padded_rows=meta.get("padded_rows", 0),
        state_version=meta.get("state_version", 0),
        record_batch=rb,
    )


class Client:
    """A connection to ``hydrant serve``.

    ``token`` is ``None``, or ``(user, password)`` for servers started with
    ``--token-file`` (Basic handshake, then a bearer token on every call).
    """

    def __init__(self, uri: str, token: Union[None, Tuple[str, str]] = None):
        self._client = flight.FlightClient(uri)
        self._options = flight.FlightCallOptions()
        if token is not None:
            user, password = token
            try:
                header = self._client.authenticate_basic_token(user, password)
            except flight.FlightError as e:
                raise HydrantError(str(e)) from e
            self._options = flight.FlightCallOptions(headers=[header])

    def endpoints(self, pipeline: str) -> list:
        """The tickets of every rank of ``pipeline`` (epoch 0), in rank order, as dicts."""
        try:
            info = self._client.get_flight_info(
                flight.FlightDescriptor.for_path(pipeline), self._options
            )
        except flight.FlightError as e:
            raise HydrantError(str(e)) from e
        return [json.loads(ep.ticket.ticket) for ep in info.endpoints]

    def schema(self, pipeline: str) -> pa.Schema:
        """The schema of the pipeline's batches."""
        return self._client.get_schema(
            flight.FlightDescriptor.for_path(pipeline), self._options
        ).schema

    def status(self) -> dict:
        """The server's ``status`` action."""
        results = self._client.do_action(flight.Action("status", b""), self._options)
        return json.loads(next(iter(results)).body.to_pybytes())

    def push(self, pipeline: str, data) -> list:
        """Pushes raw input rows (a Table or RecordBatches) into a pipeline declared with
        ``input = "flight"``; returns each batch's acknowledgement ``{"seq", "rows"}``."""
        return _push(self._client, self._options, pipeline, data)

    def end_ingest(self, pipeline: str) -> None:
        """Closes the pipeline's pushed input: the last step is padded, the epoch ends."""
        try:
            list(self._client.do_action(flight.Action("end_ingest", pipeline.encode()),
                                        self._options))
        except flight.FlightError as e:
            raise HydrantError(str(e)) from e

    def batches(
        self,
        pipeline: str,
        rank: int,
        world_size: int,
        epoch: int = 0,
        start_step: int = 0,
    ) -> Iterator[Batch]:
        """Rank ``rank``'s batches of ``epoch`` from ``start_step``, in step order.

        To resume after a crash, pass ``start_step`` = the last step you finished + 1.
        """
        ticket = json.dumps(
            {
                "pipeline": pipeline,
                "epoch": epoch,
                "rank": rank,
                "world_size": world_size,
                "start_step": start_step,
            }
        ).encode()
        try:
            reader = self._client.do_get(flight.Ticket(ticket), self._options)
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                if chunk.data is None:
                    continue
                yield _batch(chunk)
        except flight.FlightError as e:
            raise HydrantError(str(e)) from e
        except pa.ArrowException as e:
            raise HydrantError(str(e)) from e


def _push(client, options, pipeline, data):
    """DoPut of ``data`` (a Table or an iterable of RecordBatches) to ``pipeline``."""
    batches = data.to_batches() if isinstance(data, pa.Table) else list(data)
    if not batches:
        return []
    descriptor = flight.FlightDescriptor.for_path("ingest", pipeline)
    acks = []
    try:
        writer, reader = client.do_put(descriptor, batches[0].schema, options)
        for b in batches:
            writer.write_batch(b)
            ack = reader.read()
            acks.append(json.loads(ack.to_pybytes()) if ack is not None else None)
        writer.done_writing()
        writer.close()
    except (flight.FlightError, pa.ArrowException) as e:
        raise HydrantError(str(e)) from e
    return acks


def _torch_dataset_base():
    try:
        import torch.utils.data

        return torch.utils.data.IterableDataset
    except ImportError:  # torch is optional
        return object


class TorchDataset(_torch_dataset_base()):
    """An ``IterableDataset`` of one rank's batches, the rank and world size taken from
    the ``RANK`` and ``WORLD_SIZE`` environment variables that torchrun sets.

    Use with ``DataLoader(dataset, batch_size=None)``: each item is already a batch.
    """

    def __init__(self, uri: str, pipeline: str, epoch: int = 0, start_step: int = 0,
                 token=None, device=None):
        self.uri, self.pipeline, self.epoch = uri, pipeline, epoch
        self.start_step, self.token, self.device = start_step, token, device
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))

    def __iter__(self):
        client = Client(self.uri, self.token)
        for b in client.batches(self.pipeline, self.rank, self.world_size,
                                self.epoch, self.start_step):
            yield b.to_torch(self.device)
