"""The Flight client: tickets, pushes, status and each rank's stream of steps."""

from __future__ import annotations

import json
import operator
import time
from typing import Optional, Tuple, Union

import pyarrow as pa
import pyarrow.flight as flight

from .batch import HydrantError, PushError
from .reader import RankReader


class Client:
    """A connection to ``hydrant serve``.

    ``token`` is ``None``, or ``(user, password)`` for servers started with
    ``--token-file`` (Basic handshake, then a bearer token on every call).
    For a server started with ``--tls-cert``, use a ``grpc+tls://`` uri and give
    ``tls_root_certs``, the PEM bytes of the authority that signed its certificate
    (the system's roots when left out).

    A token expires (``--token-ttl``) and a restarted server knows none it gave
    before: a call it refuses as UNAUTHENTICATED logs in again once and is retried.
    ``keepalive`` is in seconds: after that long without a word from the server during
    a call, the client pings it, and a server that does not answer within as long again
    (a frozen process, a cut network) fails the call as UNAVAILABLE, so that a
    trainer is told rather than left waiting forever. ``None`` sends no pings.
    """

    def __init__(
        self,
        uri: str,
        token: Union[None, Tuple[str, str]] = None,
        tls_root_certs: Union[None, bytes] = None,
        keepalive: Optional[float] = 30.0,
    ):
        self._uri, self._token, self._tls_root_certs = uri, token, tls_root_certs
        self._keepalive = keepalive
        # A cluster's other processes, by location.
        self._peers = {}
        # The job each pipeline's latest stream said it was of: a ticket that resumes
        # mid-epoch names it, so that a server restarted to serve another job refuses it.
        self._jobs = {}
        kw = {} if tls_root_certs is None else {"tls_root_certs": tls_root_certs}
        self._client = flight.FlightClient(uri, generic_options=_keepalive(keepalive), **kw)
        self._options = flight.FlightCallOptions()
        self._headers = []
        if token is not None:
            self._login()

    def _login(self) -> None:
        """The Basic handshake: the bearer token it returns goes on every later call."""
        user, password = self._token
        try:
            header = self._client.authenticate_basic_token(user, password)
        # pyarrow raises some statuses (RESOURCE_EXHAUSTED) as ArrowInvalid, not
        # FlightError.
        except (flight.FlightError, pa.ArrowException) as e:
            why = self._why_unreachable(e)
            raise HydrantError(str(why)) from why
        if not header[0]:
            # A server without --token-file answers the handshake with no token: an
            # empty header would fail every later call as INTERNAL "Invalid metadata".
            raise HydrantError(
                f"{self._uri} takes no credentials (its server was started without "
                "--token-file): connect without token="
            )
        self._headers = [header]
        self._options = flight.FlightCallOptions(headers=self._headers)

    def _call(self, call):
        """``call(options)``, logged in again once when the server no longer knows this
        client's token (it expired after ``--token-ttl``, or the server restarted); its
        failure as ``HydrantError``. pyarrow raises ``get_schema``'s statuses as plain
        Arrow errors (``OSError``), not Flight's."""
        try:
            try:
                return call(self._options)
            except (flight.FlightError, OSError) as e:
                if self._token is None or not _unauthenticated(e):
                    raise
            self._login()
            return call(self._options)
        except (flight.FlightError, pa.ArrowException, OSError) as e:
            raise HydrantError(str(e)) from e

    def _action(self, name: str, body: bytes = b"") -> list:
        """The results of action ``name`` (see ``_call``)."""
        return self._call(lambda o: list(self._client.do_action(flight.Action(name, body), o)))

    def _info(self, pipeline: str):
        """``pipeline``'s FlightInfo (see ``_call``)."""
        return self._call(lambda o: self._client.get_flight_info(
            flight.FlightDescriptor.for_path(pipeline), o))

    def _why_unreachable(self, error: Exception) -> Exception:
        """What a failed handshake was: pyarrow reports a server that is not there (or
        is not Flight) as INTERNAL "Could not finish writing before closing", so such a
        failure is asked again by a plain call, which says UNAVAILABLE and why."""
        if not isinstance(error, flight.FlightInternalError):
            return error
        try:
            list(self._client.list_actions(flight.FlightCallOptions(timeout=5)))
        except flight.FlightUnavailableError as unavailable:
            return unavailable
        except (flight.FlightError, pa.ArrowException):
            pass
        return error

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Returns once the server serves. A server that is starting (fitting its state,
        or waiting for the other processes of its cluster to join) answers UNAVAILABLE,
        as does a port not listened on yet; after ``timeout`` seconds of that, raises
        HydrantError with the last reason. Any other error is raised at once."""
        deadline = time.monotonic() + timeout
        logged_in = False
        while True:
            left = max(deadline - time.monotonic(), 0.05)
            options = flight.FlightCallOptions(headers=self._headers, timeout=min(left, 5.0))
            try:
                list(self._client.list_flights(options=options))
                return
            except flight.FlightUnauthenticatedError as e:
                # A restarted server knows no token it gave before: one login more, not
                # one per refusal.
                if self._token is None or logged_in:
                    raise HydrantError(str(e)) from e
                self._login()
                logged_in = True
            except (flight.FlightUnavailableError, flight.FlightTimedOutError) as e:
                if time.monotonic() >= deadline:
                    raise HydrantError(f"{self._uri} not ready after {timeout} s: {e}") from e
                time.sleep(0.1)
            except (flight.FlightError, pa.ArrowException) as e:
                raise HydrantError(str(e)) from e

    def endpoints(self, pipeline: str) -> list:
        """The tickets of every rank of ``pipeline`` (epoch 0), in rank order, as dicts."""
        return [json.loads(ep.ticket.ticket) for ep in self._info(pipeline).endpoints]

    def locations(self, pipeline: str) -> list:
        """Where each rank of ``pipeline`` is served, in rank order: a ``grpc://`` uri
        when a cluster's process serves it (each process serves its own ranks), ``None``
        when this server does."""
        return [_uri(ep.locations[0]) if ep.locations else None
                for ep in self._info(pipeline).endpoints]

    def _serving(self, pipeline: str, rank: int) -> "Client":
        """The client of the server that serves ``rank`` of ``pipeline``: this one, or
        (for a cluster) a client of the process that owns it, made once a location.
        Looked up at each call: a cluster restarted with a process elsewhere (a pod
        rescheduled) serves the rank at its new location."""
        ranks = self.locations(pipeline)
        location = ranks[rank] if 0 <= rank < len(ranks) else None
        if location is None or location == self._uri:
            return self
        if location not in self._peers:
            self._peers[location] = Client(location, self._token, self._tls_root_certs,
                                           self._keepalive)
        return self._peers[location]

    def schema(self, pipeline: str) -> pa.Schema:
        """The schema of the pipeline's batches."""
        return self._call(lambda o: self._client.get_schema(
            flight.FlightDescriptor.for_path(pipeline), o)).schema

    def status(self) -> dict:
        """The server's ``status`` action."""
        return json.loads(self._action("status")[0].body.to_pybytes())

    def push(self, pipeline: str, data, producer: str = None, first_seq: int = 0) -> list:
        """Pushes raw input rows (a Table or RecordBatches) into a pipeline declared with
        ``input = "flight"``; returns each batch's acknowledgement ``{"seq", "rows"}``.

        A ``producer`` names itself and numbers its batches from ``first_seq``: a batch
        whose number the server admitted before (a retry after a lost acknowledgement) is
        acknowledged again with ``"duplicate": true`` and not admitted twice. A server
        with ``--state-dir`` keeps that across restarts.

        A push that fails part-way raises ``PushError``, whose ``acks`` are those of the
        batches admitted before the failure."""
        if producer is not None:
            _name("producer", producer)
        pipeline, first_seq = _name("pipeline", pipeline), _whole("first_seq", first_seq)
        # Read once: a generator given as ``data`` is empty by a second attempt.
        batches = _record_batches(data)
        try:
            return _push(self._client, self._options, pipeline, batches, producer, first_seq)
        except PushError as e:
            # A token refused admits nothing: log in again and push it all once more.
            expired = isinstance(e.__cause__, flight.FlightUnauthenticatedError)
            if self._token is None or e.acks or not expired:
                raise
        try:
            self._login()
        except HydrantError as e:
            raise PushError(f"batch 0 of {len(batches)}: {e} (none was acknowledged)",
                            []) from e
        return _push(self._client, self._options, pipeline, batches, producer, first_seq)

    def end_ingest(self, pipeline: str) -> None:
        """Closes the pipeline's pushed input: the last step is padded, the epoch ends."""
        self._action("end_ingest", _name("pipeline", pipeline).encode())

    def commit(self, pipeline: str, step: int) -> dict:
        """Tells the server the trainers' checkpoint holds every step before ``step``:
        a restarted server with ``--state-dir`` delivers pushed input from there (and
        deletes what lies wholly before it). Call it after saving the checkpoint; an older
        step than the last commit changes nothing. Returns ``{"committed", "durable",
        "deleted_segments"}``."""
        body = json.dumps({"pipeline": _name("pipeline", pipeline),
                           "step": _whole("step", step)}).encode()
        return json.loads(self._action("commit", body)[0].body.to_pybytes())

    def state(self, pipeline: str, version: int) -> dict:
        """The fitted state of ``pipeline`` whose version batches carry as
        ``state_version`` (a stream with ``[stats] mode = "refresh"`` makes new versions as
        rows arrive): its parameters by ``group/column/step``, to serve the model with."""
        body = json.dumps({"pipeline": _name("pipeline", pipeline),
                           "version": _whole("version", version)}).encode()
        return json.loads(b"".join(r.body.to_pybytes() for r in self._action("state", body)))

    def ticket(
        self,
        pipeline: str,
        rank: int,
        world_size: int,
        epoch: int = 0,
        start_step: int = 0,
        job: Optional[str] = None,
    ) -> flight.Ticket:
        """The ticket of ``rank``'s stream of ``epoch`` from ``start_step``; with ``job``
        (a batch's ``job``), only a server of that job serves it."""
        ticket = {
            "pipeline": _name("pipeline", pipeline),
            "epoch": _whole("epoch", epoch),
            "rank": _whole("rank", rank),
            "world_size": _whole("world_size", world_size),
            "start_step": _whole("start_step", start_step),
        }
        if job is not None:
            ticket["job"] = job
        return flight.Ticket(json.dumps(ticket).encode())

    def job(self, pipeline: str) -> Optional[str]:
        """The job this client's latest stream of ``pipeline`` said it was of (None
        before the first batch): keep it with a checkpoint and give it to
        ``batches(job=)`` or ``TorchDataset(job=)`` when resuming in a new process."""
        return self._jobs.get(pipeline)

    def batches(
        self,
        pipeline: str,
        rank: int,
        world_size: int,
        epoch: int = 0,
        start_step: int = 0,
        read_ahead: int = 2,
        prepare=None,
        receive=None,
        job: Optional[str] = None,
    ) -> RankReader:
        """Rank ``rank``'s steps of ``epoch`` from ``start_step``, one ``Batch`` of exactly
        ``B`` rows per step, read ``read_ahead`` steps ahead on a background thread.

        To resume after a crash, pass ``start_step`` = the last step you finished + 1.
        The iterator ends at the epoch's last step; a stream cut before it (a server that
        went away, a newer reader of the same rank) raises ``HydrantError`` saying where
        to resume. ``prepare`` and ``receive`` are hooks for staging (see ``RankReader``).
        A resume mid-epoch (``start_step`` > 0) names ``job`` in its ticket (by default,
        the job this client's latest stream of ``pipeline`` said it was of): a server
        restarted with another input, state, batch size, shuffle or seed then refuses it
        (FAILED_PRECONDITION) rather than hand the trainer other rows at the steps it asks
        for. An epoch read from its first step is read whole, from whichever job.
        A rank that a process of a cluster serves is read from that process (the
        location ``GetFlightInfo`` names), whichever process this client connected to.
        """
        if job is None and start_step != 0:
            job = self._jobs.get(pipeline)
        ticket = self.ticket(pipeline, rank, world_size, epoch, start_step, job)
        rank, start_step = _whole("rank", rank), _whole("start_step", start_step)
        serving = self._serving(pipeline, rank)
        return RankReader(
            # The options of the call are read when it is made: after a login, new ones.
            lambda: serving._client.do_get(ticket, serving._options),
            rank,
            start_step,
            read_ahead=read_ahead,
            prepare=prepare,
            receive=receive,
            on_job=lambda said: self._jobs.__setitem__(pipeline, said),
            relogin=serving._login if serving._token is not None else None,
        )


def _unauthenticated(error: Exception) -> bool:
    """Whether ``error`` is an UNAUTHENTICATED refusal: pyarrow raises it as
    ``FlightUnauthenticatedError`` from every call but ``get_schema``, which raises its
    statuses as plain ``OSError``s that say which they are."""
    if isinstance(error, flight.FlightUnauthenticatedError):
        return True
    return isinstance(error, OSError) and "returned unauthenticated error" in str(error)


def _keepalive(seconds: Optional[float]) -> list:
    """gRPC's options for pings after ``seconds`` of silence in a call, each answered
    within as long again; none for ``None``."""
    if seconds is None:
        return []
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"keepalive must be a positive number of seconds or None, not "
                         f"{seconds!r}")
    ms = max(int(seconds * 1000), 1)
    return [
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", ms),
        # What ends a call whose ping goes unanswered: without it (gRPC 1.7x, pyarrow
        # 26) a frozen server's unanswered ping was waited on for good.
        ("grpc.http2.ping_timeout_ms", ms),
        # Pings go on for as long as the server sends nothing: by default gRPC stops
        # after two until the client sends data, and a reader sends none.
        ("grpc.http2.max_pings_without_data", 0),
    ]


def _name(what: str, value) -> str:
    """``value``, which must be text (a pipeline's name)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return value


def _whole(what: str, value) -> int:
    """``value`` as an int: ints and NumPy integers, not floats, text or bools."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


def _uri(location) -> str:
    """A Flight location's uri as text."""
    uri = location.uri
    return uri.decode() if isinstance(uri, bytes) else str(uri)


def _record_batches(data) -> list:
    """``data`` (a Table, a RecordBatch, or an iterable of them) as RecordBatches."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        data = [data]
    try:
        items = list(data)
    except TypeError:
        items = [data]
    batches = []
    for item in items:
        if isinstance(item, pa.Table):
            batches.extend(item.to_batches())
        elif isinstance(item, pa.RecordBatch):
            batches.append(item)
        else:
            raise HydrantError(
                "push takes a pyarrow Table or RecordBatches (or an iterable of them), not "
                f"{type(item).__name__}"
            )
    return batches


def _push(client, options, pipeline, data, producer=None, first_seq=0):
    """DoPut of ``data`` (a Table or an iterable of RecordBatches) to ``pipeline``, as
    ``producer`` numbering its batches from ``first_seq`` when one is named."""
    batches = _record_batches(data)
    if not batches:
        return []
    path = ("ingest", pipeline) + ((producer,) if producer is not None else ())
    descriptor = flight.FlightDescriptor.for_path(*path)
    acks = []
    writing = False
    try:
        writer, reader = client.do_put(descriptor, batches[0].schema, options)
        for seq, b in enumerate(batches, start=first_seq):
            writing = not b.schema.equals(batches[0].schema)
            if producer is None:
                writer.write_batch(b)
            else:
                writer.write_with_metadata(b, pa.py_buffer(json.dumps({"seq": seq}).encode()))
            writing = False
            ack = reader.read()
            if ack is None:
                # The server ended the call without acknowledging this batch: closing
                # raises its status (a refusal), and a clean end is no acknowledgement.
                writer.done_writing()
                writer.close()
                raise PushError(
                    f"batch {len(acks)} of {len(batches)}: the server ended the push "
                    f"without acknowledging it (the {len(acks)} before it were "
                    "acknowledged: PushError.acks)",
                    acks,
                )
            acks.append(json.loads(ack.to_pybytes()))
        writer.done_writing()
        writer.close()
    except (flight.FlightError, pa.ArrowException) as e:
        n = len(acks)
        # pyarrow refuses a batch of another schema than the first before sending it.
        why = (
            "its schema differs from the first batch's (one push is one stream of one "
            f"schema: pyarrow refused it before sending it: {e})"
            if writing
            else str(e)
        )
        raise PushError(
            f"batch {n} of {len(batches)}: {why} (the {n} before it were acknowledged: "
            "PushError.acks)",
            acks,
        ) from e
    return acks
