"""A rank's stream read ahead on a thread of its own, so that the network read and the
decoding overlap the training step."""

from __future__ import annotations

import atexit
import queue
import threading
import time
from typing import Any, Callable, Optional

import pyarrow as pa
import pyarrow.flight as flight

from .batch import HydrantError, steps

_END = object()
# Queued by ``close()`` for a consumer already waiting in ``next()`` on another thread.
_CLOSED = object()

# Reader threads still running, by pump. A daemon thread still inside pyarrow when the
# interpreter finalizes is killed where it stands, and unwinding its C++ frames can abort
# the process ("terminate called without an active exception"): a trainer that stops
# mid-epoch (a checkpoint-and-exit) and leaves its reader open would die with SIGABRT.
# So at exit every reader still running is cancelled and joined first.
_running: dict = {}
_running_lock = threading.Lock()


@atexit.register
def _stop_readers_at_exit() -> None:
    with _running_lock:
        running = list(_running.items())
    for pump, _ in running:
        pump.cancel()
    for _, thread in running:
        thread.join(timeout=5)


class _Failed:
    """An error raised on the reader thread, re-raised on the consumer's."""

    def __init__(self, error: BaseException):
        self.error = error


class _Pump:
    """The reader thread's side: reads, decodes and queues. It holds no reference to the
    ``RankReader``, so dropping an abandoned reader stops its thread."""

    def __init__(self, open_stream, rank, start_step, read_ahead, prepare, on_job=None,
                 relogin=None):
        self.queue: queue.Queue = queue.Queue(maxsize=read_ahead)
        self.stop = threading.Event()
        self.stream = None
        self.open, self.rank, self.start, self.prepare = open_stream, rank, start_step, prepare
        self.on_job, self.job, self.relogin = on_job, None, relogin

    def run(self) -> None:
        try:
            self.read()
        finally:
            with _running_lock:
                _running.pop(self, None)

    def read(self) -> None:
        try:
            try:
                self.pump()
            except flight.FlightUnauthenticatedError:
                # Refused before its first message (a cut later is a HydrantError): the
                # server no longer knows the token (it expired, or the server restarted).
                if self.relogin is None or self.stop.is_set():
                    raise
                self.relogin()
                self.pump()
        except (flight.FlightError, pa.ArrowException) as e:
            # Opening the stream failed, or the server refused it before its first
            # message (a cut after that comes as HydrantError, naming the resume step).
            if not self.stop.is_set():
                failed = HydrantError(str(e))
                # The Flight error says what kind of failure it was (its gRPC status).
                failed.__cause__ = e
                self.put(_Failed(failed))
        except BaseException as e:  # handed to the consumer, never lost on this thread
            if not self.stop.is_set():
                self.put(_Failed(e))

    def pump(self) -> None:
        """Opens the stream and queues its steps, then the end."""
        self.stream = self.open()
        if self.stop.is_set():
            self.cancel()
            return
        for batch in steps(_chunks(self.stream), self.rank, self.start):
            if self.job is None and batch.job is not None:
                self.job = batch.job
                if self.on_job is not None:
                    self.on_job(batch.job)
            item = self.prepare(batch) if self.prepare else batch
            if not self.put(item):
                return
        self.put(_END)

    def put(self, item) -> bool:
        """Waits for room (backpressure); False once the consumer has closed the reader."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def cancel(self) -> None:
        self.stop.set()
        stream = self.stream
        if stream is not None:
            try:
                stream.cancel()
            except Exception:  # already finished or failed: nothing to cancel
                pass


class RankReader:
    """An iterator over one rank's steps (one ``Batch``, or what ``prepare`` made of it,
    per step), read and decoded up to ``read_ahead`` steps ahead on a background thread.

    ``stall_seconds`` is the time the consumer has waited in ``next()`` for data, as the
    Rust loaders report it. ``close()`` (or leaving a ``with`` block, or dropping the
    reader) cancels the stream. ``prepare`` runs on the reader thread (staging copies),
    ``receive`` on the consumer's thread as it takes each item (making the consumer's
    CUDA stream wait for those copies). ``relogin`` is called once when the server
    refuses to open the stream as UNAUTHENTICATED, and the stream is opened again.
    """

    def __init__(
        self,
        open_stream: Callable[[], Any],
        rank: int,
        start_step: int,
        read_ahead: int = 2,
        prepare: Optional[Callable[[Any], Any]] = None,
        receive: Optional[Callable[[Any], Any]] = None,
        on_job: Optional[Callable[[str], Any]] = None,
        relogin: Optional[Callable[[], Any]] = None,
    ):
        if isinstance(read_ahead, bool) or not isinstance(read_ahead, int):
            raise TypeError(f"read_ahead must be an int, not {type(read_ahead).__name__}")
        if read_ahead < 1:
            raise ValueError(f"read_ahead must be at least 1, not {read_ahead}")
        self.rank = rank
        self.stall_seconds = 0.0
        self.steps_read = 0
        self._receive = receive
        self._start = start_step
        self._done = False
        # Closed before the stream ended: iterating on must not look like the epoch's end.
        self._closed = False
        # The error the stream failed with: raised again on every later ``next()``, so
        # that a retry loop over the same reader never takes the failure for the end.
        self._failed: Optional[BaseException] = None
        self._pump = _Pump(open_stream, rank, start_step, read_ahead, prepare, on_job, relogin)
        self._thread = threading.Thread(
            target=self._pump.run, name=f"hydrant-rank-{rank}", daemon=True
        )
        with _running_lock:
            _running[self._pump] = self._thread
        self._thread.start()

    def __iter__(self):
        return self

    def _closed_error(self) -> HydrantError:
        step = self._start + self.steps_read
        return HydrantError(
            f"rank {self.rank}'s reader was closed before the epoch's last step: read "
            f"on with a new one from start_step={step}"
        )

    def __next__(self):
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise self._closed_error()
        if self._done:
            raise StopIteration
        waited = time.perf_counter()
        item = self._pump.queue.get()
        self.stall_seconds += time.perf_counter() - waited
        if item is _CLOSED:
            if self._closed:
                raise self._closed_error()
            raise StopIteration
        if item is _END:
            self._done = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, _Failed):
            self._done = True
            self._failed = item.error
            raise item.error
        self.steps_read += 1
        return self._receive(item) if self._receive else item

    @property
    def job(self) -> Optional[str]:
        """The job the stream said it was of (see ``Batch.job``); None before its first
        step."""
        return self._pump.job

    def close(self) -> None:
        """Cancels the stream and stops the reader thread. Iterating a reader closed
        before its last step raises ``HydrantError`` (not the end of the epoch)."""
        self._closed = not self._done
        self._done = True
        self._pump.cancel()
        # A consumer waiting in ``next()`` on another thread is woken (the pump queues
        # nothing more once cancelled); a full queue has no one waiting on it.
        try:
            self._pump.queue.put_nowait(_CLOSED)
        except queue.Full:
            pass
        self._thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        pump = getattr(self, "_pump", None)
        if pump is not None:
            pump.cancel()


def _chunks(reader):
    """(record batch or None, app_metadata) for each message of a Flight stream."""
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return
        yield chunk.data, chunk.app_metadata
