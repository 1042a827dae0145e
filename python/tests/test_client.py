"""The Python client against the real `hydrant serve` on loopback."""

import threading

import numpy as np
import pytest

from hydrant_client import Client, HydrantError

from conftest import ROWS


def read_all(client, ranks, world, **kw):
    """Reads every rank concurrently (ranks are consumed together)."""
    out = {}

    def read(r):
        out[r] = list(client.batches("criteo", r, world, **kw))

    threads = [threading.Thread(target=read, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def real_ids(batches):
    return [i for b in batches for i in b.row_id[~b.mask].tolist()]


def test_every_row_once_and_equal_steps(serve):
    s = serve("--ranks", "3", "--batch-size", "1000")
    client = Client(s.uri)
    eps = client.endpoints("criteo")
    assert [e["rank"] for e in eps] == [0, 1, 2]
    got = read_all(client, range(3), 3)
    steps = [[b.step for b in got[r]] for r in range(3)]
    n = -(-ROWS // 3000)
    assert steps == [list(range(n))] * 3
    ids = [i for r in range(3) for i in real_ids(got[r])]
    assert sorted(ids) == list(range(ROWS))
    b = got[0][0]
    assert b.dense.shape == (1000, 13) and b.dense.dtype == np.float32
    assert b.ids.shape == (1000, 26) and b.ids.dtype == np.int64
    # Views of the received Arrow buffers, not copies.
    assert not b.dense.flags["OWNDATA"] and not b.ids.flags["OWNDATA"]
    padded = sum(b.padded_rows for r in range(3) for b in got[r])
    assert padded == n * 3000 - ROWS
    assert all(b.mask.sum() == b.padded_rows for r in range(3) for b in got[r])


def test_a_trainer_that_reconnects_loses_nothing(serve):
    s = serve("--ranks", "2", "--batch-size", "500")
    client = Client(s.uri)
    other = {}
    t = threading.Thread(
        target=lambda: other.setdefault(1, list(client.batches("criteo", 1, 2))), daemon=True
    )
    t.start()
    first = []
    for b in client.batches("criteo", 0, 2):
        first.append(b)
        if b.step == 4:
            break  # the trainer dies after finishing step 4
    rest = list(Client(s.uri).batches("criteo", 0, 2, start_step=5))
    t.join()
    assert [b.step for b in first + rest] == list(range(len(first) + len(rest)))
    ids = real_ids(first + rest) + real_ids(other[1])
    assert sorted(ids) == list(range(ROWS))


def test_resume_from_a_step_on_a_fresh_server(serve):
    s = serve("--ranks", "2", "--batch-size", "700", "--shuffle", "--seed", "3")
    full = read_all(Client(s.uri), range(2), 2)
    s2 = serve("--ranks", "2", "--batch-size", "700", "--shuffle", "--seed", "3")
    resumed = read_all(Client(s2.uri), range(2), 2, start_step=7)
    for r in range(2):
        tail = [b for b in full[r] if b.step >= 7]
        assert [b.step for b in resumed[r]] == [b.step for b in tail]
        for a, b in zip(resumed[r], tail):
            assert np.array_equal(a.row_id, b.row_id)
            assert np.array_equal(a.dense, b.dense)


def test_auth_accepted_and_rejected(serve, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:s3cret\n")
    s = serve("--token-file", tokens)
    ok = Client(s.uri, token=("alice", "s3cret"))
    assert len(ok.endpoints("criteo")) == 1
    with pytest.raises(HydrantError, match="unauthenticated error, with message: wrong user or password"):
        Client(s.uri, token=("alice", "guess"))
    with pytest.raises(HydrantError, match="(?i)unauthenticated.*missing bearer token"):
        Client(s.uri).endpoints("criteo")


def test_credentials_for_a_server_without_a_token_file_are_refused_plainly(serve):
    """Found by a hostile run: the client took them, and every call then failed with
    INTERNAL "Invalid metadata", which reads as a server bug."""
    s = serve()
    with pytest.raises(HydrantError, match="takes no credentials.*without --token-file"):
        Client(s.uri, token=("alice", "s3cret"))
    assert len(Client(s.uri).endpoints("criteo")) == 1


def test_a_login_to_no_server_says_it_is_unreachable(serve):
    # pyarrow reports a failed handshake with no server (or a port that is not Flight)
    # as INTERNAL "Could not finish writing before closing": the client says why.
    import socket

    import pyarrow.flight as flight

    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    s = serve("--metrics-listen", "127.0.0.1:0")
    for uri in (f"grpc://127.0.0.1:{port}", "grpc://" + s.ready["metrics"]):
        with pytest.raises(HydrantError, match="unavailable") as e:
            Client(uri, token=("alice", "s3cret"))
        assert isinstance(e.value.__cause__, flight.FlightUnavailableError), repr(e.value)


def test_arguments_of_the_wrong_type_are_named(serve):
    # Found by a hostile run: these gave "'<=' not supported between instances of 'int'
    # and 'str'", "list indices must be integers", "'NoneType' object has no attribute
    # 'encode'" and the like.
    import numpy as np

    s = serve()
    c = Client(s.uri)
    for call, message in [
        (lambda: c.batches("criteo", "0", 1), "rank must be an int, not str"),
        (lambda: c.batches("criteo", 0.0, 1), "rank must be an int, not float"),
        (lambda: c.batches("criteo", 0, None), "world_size must be an int, not NoneType"),
        (lambda: c.batches(b"criteo", 0, 1), "pipeline must be a str, not bytes"),
        (lambda: c.batches("criteo", 0, 1, start_step=True), "start_step must be an int, not bool"),
        (lambda: c.batches("criteo", 0, 1, read_ahead="2"), "read_ahead must be an int, not str"),
        (lambda: c.end_ingest(None), "pipeline must be a str, not NoneType"),
        (lambda: c.commit("criteo", "3"), "step must be an int, not str"),
    ]:
        with pytest.raises(TypeError, match=message):
            call()
    with pytest.raises(HydrantError, match="push takes a pyarrow Table or RecordBatches.*not str"):
        c.push("criteo", {"a": [1]})
    # NumPy integers are ints.
    assert len(list(c.batches("criteo", np.int64(0), np.int32(1)))) > 0


def test_roles_expiry_and_throttled_logins(serve, tmp_path):
    import time

    tokens = tmp_path / "tokens"
    # PERMISSION_DENIED is pyarrow's FlightUnauthorizedError ("unauthorized");
    # UNAUTHENTICATED its FlightUnauthenticatedError.
    tokens.write_text("# user:password [roles]\ntrainer:pw1 train\npusher:pw2 ingest\nops:pw3 admin\n")
    s = serve("--token-file", tokens, "--token-ttl", "2s")
    trainer = Client(s.uri, token=("trainer", "pw1"))
    assert len(trainer.endpoints("criteo")) == 1
    with pytest.raises(HydrantError, match="(?i)unauthorized.*user `trainer` lacks the `admin` role"):
        trainer.status()
    pusher = Client(s.uri, token=("pusher", "pw2"))
    with pytest.raises(HydrantError, match="(?i)unauthorized.*user `pusher` lacks the `train` role"):
        pusher.endpoints("criteo")
    ops = Client(s.uri, token=("ops", "pw3"))
    assert ops.status()["pipelines"][0]["name"] == "criteo"
    # Any user may list the actions, and an unknown one is UNIMPLEMENTED whatever the
    # caller's roles; without a token, both are still refused.
    import pyarrow as pa
    import pyarrow.flight as fl

    for c in (pusher, ops, trainer):
        assert "commit" in [a.type for a in c._client.list_actions(c._options)]
        # UNIMPLEMENTED is pyarrow's ArrowNotImplementedError.
        with pytest.raises(pa.ArrowNotImplementedError, match="unknown action `reboot`"):
            list(c._client.do_action(fl.Action("reboot", b""), c._options))
    with pytest.raises(fl.FlightUnauthenticatedError):
        list(fl.connect(s.uri).do_action(fl.Action("reboot", b"")))
    # Tokens expire: the call says to log in again, and the client does.
    time.sleep(2.2)
    with pytest.raises(fl.FlightUnauthenticatedError, match="(?i)expired"):
        trainer._client.get_flight_info(fl.FlightDescriptor.for_path("criteo"), trainer._options)
    assert len(trainer.endpoints("criteo")) == 1
    assert len(Client(s.uri, token=("trainer", "pw1")).endpoints("criteo")) == 1
    # Five wrong passwords from one address, and even the right one is refused a while;
    # a login of one's own between them clears nothing (a hostile run guessed without end
    # so).
    for k in range(5):
        with pytest.raises(HydrantError, match="wrong user or password"):
            Client(s.uri, token=("trainer", "guess"))
        if k == 2:
            Client(s.uri, token=("pusher", "pw2"))
    with pytest.raises(HydrantError, match="(?i)too many failed logins from 127.0.0.1"):
        Client(s.uri, token=("trainer", "pw1"))


def test_metrics_on_a_public_address_need_an_explicit_flag(data):
    path, state = data
    from conftest import BIN, PIPELINE
    import subprocess

    out = subprocess.run(
        [str(BIN), "serve", "--pipeline", PIPELINE, "--input", path, "--state", state,
         "--listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert "--metrics-listen 0.0.0.0:0 is not loopback" in out.stderr


@pytest.mark.parametrize(
    "ticket, message",
    [
        (b"not json", "INVALID_ARGUMENT:invalid ticket"),
        (b'{"pipeline":"criteo","rank":2,"world_size":2}', "INVALID_ARGUMENT:.*`rank` 2 is not below"),
        (b'{"pipeline":"criteo","rank":0,"world_size":3}', "INVALID_ARGUMENT:.*`world_size` 3 is not the served 2"),
        (b'{"pipeline":"criteo","rank":0,"world_size":2,"epoch":5}', "INVALID_ARGUMENT:.*`epoch` 5 is out of range"),
        (b'{"pipeline":"criteo","rank":0,"world_size":2,"start_step":999}', "INVALID_ARGUMENT:.*`start_step` 999"),
        (b'{"pipeline":"nope","rank":0,"world_size":2}', "NOT_FOUND:no pipeline `nope`"),
        (b'{"pipeline":"criteo","rank":0,"world_size":2,"colour":1}', "INVALID_ARGUMENT:.*unknown field `colour`"),
    ],
)
def test_bad_tickets_name_the_field(serve, ticket, message):
    import pyarrow.flight as flight

    s = serve("--ranks", "2")
    c = flight.FlightClient(s.uri)
    # pyarrow maps statuses to several exception types; the gRPC code is in the text.
    with pytest.raises(Exception, match=message):
        c.do_get(flight.Ticket(ticket)).read_all()
    # The server keeps serving everyone else.
    assert len(Client(s.uri).endpoints("criteo")) == 2


def test_a_descriptor_that_does_not_decode_is_invalid_argument(serve):
    import pyarrow as pa
    import pyarrow.flight as flight

    s = serve("--ranks", "2")
    c = flight.FlightClient(s.uri)
    # A path that is not UTF-8 does not decode as a FlightDescriptor: the client's error,
    # not INTERNAL (which says the server failed).
    with pytest.raises(pa.ArrowInvalid, match="invalid argument error.*failed to decode"):
        c.get_flight_info(flight.FlightDescriptor.for_path(b"\xff\xfe"))
    assert len(Client(s.uri).endpoints("criteo")) == 2


def test_status_reports_runs_and_forgets_a_finished_one(serve):
    s = serve("--ranks", "2", "--batch-size", "5000")
    client = Client(s.uri)
    reader = client.batches("criteo", 0, 2)
    first = next(reader)
    status = client.status()["pipelines"][0]
    assert status["name"] == "criteo" and status["world_size"] == 2
    (run,) = status["runs"]
    assert run["epoch"] == 0 and run["only_rank"] is None
    assert run["ranks"][0]["connected"] and run["ranks"][0]["next_step"] >= 1
    rest = list(reader)
    list(client.batches("criteo", 1, 2))
    assert 1 + len(rest) == status["steps_per_epoch"] and first.step == 0
    # Every rank took its last batch: the run and its replay buffers are gone.
    assert client.status()["pipelines"][0]["runs"] == []


def test_metrics_are_exported_for_prometheus(serve):
    import urllib.error
    import urllib.request

    # Port 0: the ready line says which port the system gave.
    s = serve("--ranks", "2", "--batch-size", "5000", "--metrics-listen", "127.0.0.1:0")
    metrics = s.ready["metrics"]
    assert metrics.startswith("127.0.0.1:") and not metrics.endswith(":0"), metrics
    # Before any rows: the unlabelled counters are there, at 0, described.
    first = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    assert "# HELP hydrant_admitted_rows_total " in first, first
    assert "\nhydrant_admitted_rows_total 0\n" in first, first
    read_all(Client(s.uri), range(2), 2)
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    with pytest.raises(urllib.error.HTTPError) as other_path:
        urllib.request.urlopen(f"http://{metrics}/nope", timeout=10)
    assert other_path.value.code == 404
    steps = -(-ROWS // 10000)
    assert f'hydrant_rank_batches_total{{rank="0"}} {steps}' in text
    # Named in full on failure: pytest cuts the exported text short (CI once failed here
    # without saying what the line said).
    rows_out = [line for line in text.splitlines() if line.startswith("hydrant_rows_out_total")]
    assert rows_out == [f'hydrant_rows_out_total{{stage="sink"}} {ROWS}'], rows_out
    # The stall time is a summary: its sum a float counter, its count the waits; no
    # `_total` on a series that is not a counter.
    assert "# TYPE hydrant_rank_stall_seconds summary" in text, text[-3000:]
    assert 'hydrant_rank_stall_seconds_sum{rank="0"} ' in text
    assert 'hydrant_rank_stall_seconds_count{rank="0"} ' in text
    assert "hydrant_rank_queue_depth" in text
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    assert [n for n, t in types.items() if n.endswith("_total") and t != "counter"] == []
    assert "# HELP hydrant_rows_out_total " in text and "# HELP hydrant_rank_bytes_total " in text


def test_sigterm_shuts_down_even_with_a_stalled_stream(serve):
    import signal
    import time

    s = serve("--ranks", "2", "--batch-size", "500")
    reader = Client(s.uri).batches("criteo", 0, 2)
    next(reader)  # rank 1 is never read, so rank 0's stream stalls once its queue fills
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=20) == 0
    assert time.time() - t0 < 10
    assert "shutting down" in s.proc.stderr.read()


def test_sigterm_shuts_down_when_no_one_reads_its_log(serve):
    """A server whose stderr is a pipe no one reads any more (its supervisor's log collector
    went away) used to ignore SIGTERM: printing "shutting down" panicked its signal task."""
    import signal
    import time

    s = serve("--ranks", "2", "--batch-size", "500")
    reader = Client(s.uri).batches("criteo", 0, 2)
    next(reader)  # a stalled stream: the shutdown also logs that it closes it
    s.proc.stderr.close()
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=20) == 0
    assert time.time() - t0 < 10


def test_a_second_reader_of_a_rank_supersedes_the_first_with_aborted(serve):
    """A stale reader (a zombie pod, a double start) used to end a live stream with a
    clean end of stream mid-epoch; now the replaced stream ends ABORTED, never OK.

    The first stream of rank 0 must still be live when the second comes, so its epoch must
    not fit in gRPC's buffers first. One worker owns both ranks and emits their steps in
    lockstep, and rank 1 is not read until the takeover is done: rank 0 then gets at most
    a step or two past rank 1's full queue (with two workers each rank had its own owner,
    rank 0's whole small epoch could reach the client's buffers on a busy machine, and one
    CI run saw the first stream end with all of it). The server lets an unread rank go
    only after `--absent-after`, here far longer than the takeover takes."""
    s = serve("--ranks", "2", "--batch-size", "100", "--workers", "1", "--absent-after", "120")
    client = Client(s.uri)
    first = client.batches("criteo", 0, 2)
    got = [next(first) for _ in range(2)]
    steps = -(-ROWS // 200)
    second = {}
    taker = threading.Thread(
        target=lambda: second.setdefault(0, list(client.batches("criteo", 0, 2, start_step=2)))
    )
    taker.start()
    with pytest.raises(HydrantError, match="(?i)aborted.*superseded by a newer reader for rank 0") as cut:
        for b in first:
            got.append(b)
    assert len(got) < steps
    # The error names where to resume: the step after the last one the trainer got.
    assert str(cut.value).endswith(f"resume with start_step {got[-1].step + 1}"), cut.value
    import pyarrow.flight as fl

    assert isinstance(cut.value.__cause__, fl.FlightError)
    # A refusal before any step (here an epoch past --epochs) is no cut: no resume step.
    with pytest.raises(HydrantError) as refused:
        next(client.batches("criteo", 0, 2, epoch=10**6))
    assert "resume with" not in str(refused.value), refused.value
    other = threading.Thread(target=lambda: second.setdefault(1, list(client.batches("criteo", 1, 2))))
    other.start()
    taker.join()
    other.join()
    assert [b.step for b in second[0]] == list(range(2, steps))
    assert [b.step for b in second[1]] == list(range(steps))




def test_every_group_reaches_the_trainer(data, tmp_path):
    """A pipeline of several dense and ids groups: `dense` and `ids` are the first of each
    kind, and the others come under their own names, in `groups`, `arrays()` and
    `to_torch()` alike (they used to be left out)."""
    from conftest import Server

    path, _ = data
    dense = ", ".join(f'"i{i}"' for i in range(13))
    toml = tmp_path / "groups.toml"
    toml.write_text(f"""name = "groups"
label = {{ column = "label", type = "float32" }}
[[group]]
name = "dense"
kind = "dense"
columns = [{dense}]
steps = ["fill_null(0)"]
[[group]]
name = "wide"
kind = "dense"
columns = ["i0", "i1"]
steps = ["fill_null(0)", "clip(0, 1)"]
[[group]]
name = "ids"
kind = "ids"
columns = ["c0", "c1", "c2"]
steps = ["hash_bucket(1000)"]
[[group]]
name = "few"
kind = "ids"
columns = ["c3"]
steps = ["hash_bucket(7)"]
[[group]]
name = "mask"
kind = "dense"
columns = ["i2"]
steps = ["fill_null(0)"]
""")
    s = Server("--pipeline", toml, "--input", path, "--batch-size", "100")
    try:
        b = next(iter(Client(s.uri).batches("groups", 0, 1)))
    finally:
        s.stop()
    assert list(b.groups) == ["dense", "wide", "ids", "few", "mask"]
    assert b.dense.shape == (100, 13) and b.ids.shape == (100, 3)
    assert b.groups["wide"].shape == (100, 2) and b.groups["few"].shape == (100, 1)
    rb = b.record_batch
    for name, array in b.groups.items():
        want = rb.column(name).values.to_numpy().reshape(array.shape)
        assert np.array_equal(array, want), name
    assert b.groups["few"].max() < 7 and b.groups["wide"].max() <= 1
    arrays = b.arrays()
    # A group named as a key of its own (`mask`) comes as `group.mask`.
    assert list(arrays) == ["dense", "ids", "label", "mask", "row_id", "wide", "few",
                            "group.mask"]
    assert arrays["group.mask"] is b.groups["mask"] and arrays["mask"] is b.mask
    assert arrays["wide"] is b.groups["wide"] and arrays["dense"] is b.dense
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    assert set(b.to_torch()) == set(arrays)
