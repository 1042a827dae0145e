"""DoPut: producers push raw batches into a pipeline declared `input = "flight"`, ranks
read them as they arrive, `end_ingest` pads the last step."""

import threading
import time

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from conftest import ROOT, Server, free_port, hydrant
from hydrant_client import Client, HydrantError, PushError

PUSHED = (ROOT / "examples" / "criteo_hash.toml").read_text()


def pushed_server(tmp_path, data, *extra, listen="127.0.0.1:0"):
    """A server for the hash pipeline taking pushed input (state fitted on `data`)."""
    path, _ = data
    files = tmp_path / "files.toml"
    files.write_text(PUSHED)
    state = tmp_path / "state.json"
    hydrant("fit", "--pipeline", files, "--input", path, "--out", state)
    flight_toml = tmp_path / "pushed.toml"
    flight_toml.write_text('input = "flight"\n' + PUSHED)
    return Server("--pipeline", flight_toml, "--state", state, *extra, listen=listen)


@pytest.fixture(params=["1", "3"], ids=["1-worker", "3-workers"])
def pushed(tmp_path, data, request):
    """A server for the hash pipeline with pushed input, placing and assembling the rows
    on one worker or three, and the rows to push."""
    s = pushed_server(
        tmp_path, data, "--ranks", "2", "--batch-size", "1000", "--workers", request.param
    )
    yield s, pq.read_table(data[0])
    s.stop()


def start_readers(client):
    """Both ranks read to the end on threads: the dict they fill, and the threads."""
    got = {}

    def read(r):
        got[r] = list(client.batches("criteo_hash", r, 2))

    readers = [threading.Thread(target=read, args=(r,), daemon=True) for r in range(2)]
    for t in readers:
        t.start()
    return got, readers


def with_label(table, row, value):
    """`table` with its label as float64, row `row` (if any) set to `value`."""
    import pyarrow as pa

    labels = [float(v) for v in table["label"].to_pylist()]
    if row is not None:
        labels[row] = value
    at = table.schema.get_field_index("label")
    return table.set_column(at, "label", pa.array(labels, type=pa.float64()))


def ended_ids(client):
    """Ends the input and reads both ranks to their end: every real row id, sorted."""
    got, readers = start_readers(client)
    client.end_ingest("criteo_hash")
    for t in readers:
        t.join(timeout=60)
    return sorted(i for r in range(2) for b in got[r] for i in b.row_id[~b.mask].tolist())


def test_push_then_read_every_row_once(pushed):
    server, table = pushed
    client = Client(server.uri)
    got, readers = start_readers(client)
    # Two producers at once, each half of the rows.
    half = table.num_rows // 2
    parts = [table.slice(0, half), table.slice(half)]
    acks = {}

    def produce(i):
        acks[i] = Client(server.uri).push("criteo_hash", parts[i].to_batches(max_chunksize=3000))

    producers = [threading.Thread(target=produce, args=(i,)) for i in range(2)]
    for t in producers:
        t.start()
    for t in producers:
        t.join()
    assert sum(a["rows"] for i in range(2) for a in acks[i]) == table.num_rows
    seqs = sorted(a["seq"] for i in range(2) for a in acks[i])
    assert seqs == list(range(len(seqs)))
    client.end_ingest("criteo_hash")
    for t in readers:
        t.join(timeout=60)
    steps = [[b.step for b in got[r]] for r in range(2)]
    assert steps[0] == steps[1] == list(range(-(-table.num_rows // 2000)))
    ids = sorted(i for r in range(2) for b in got[r] for i in b.row_id[~b.mask].tolist())
    assert ids == list(range(table.num_rows))
    # Unshuffled, each batch names exactly its rows' stream positions (here their ids).
    for r in range(2):
        for b in got[r]:
            real = b.row_id[~b.mask].tolist()
            first, end = b.positions
            assert real == list(range(first, end))
    status = client.status()["pipelines"][0]["pushed"]
    assert status["rows_in"] == table.num_rows and status["ended"]


def test_a_batch_of_the_wrong_schema_is_rejected_whole(pushed):
    server, table = pushed
    client = Client(server.uri)
    with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*`c3`") as refused:
        client.push("criteo_hash", table.drop_columns(["c3"]).slice(0, 100))
    # The producer is told the pipeline's name, not where the server keeps its file.
    assert "pushed.toml" not in str(refused.value) and "`criteo_hash`" in str(refused.value)
    assert client.status()["pipelines"][0]["pushed"]["rows_in"] == 0
    # The server keeps taking good batches.
    assert client.push("criteo_hash", table.slice(0, 100))[0]["rows"] == 100


def test_a_batch_with_two_columns_of_one_name_is_refused_whole(pushed):
    """Two columns named `i0` used to be acknowledged, with either one featurized."""
    server, table = pushed
    client = Client(server.uri)
    bad = table.slice(0, 100)
    bad = bad.append_column("i0", pa.array([1e9] * 100))
    with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*two columns named `i0`"):
        client.push("criteo_hash", bad)
    assert client.status()["pipelines"][0]["pushed"]["rows_in"] == 0
    assert client.push("criteo_hash", table.slice(0, 100))[0]["rows"] == 100


def test_end_ingest_takes_the_name_or_json_as_the_other_actions_do(pushed):
    """A JSON body used to be taken for a pipeline's name: NOT_FOUND, hiding the mistake."""
    server, table = pushed
    client = Client(server.uri)
    raw = flight.connect(server.uri)
    with pytest.raises(pa.ArrowInvalid, match="end_ingest: body must be"):
        list(raw.do_action(flight.Action("end_ingest", b'{"pipe": "criteo_hash"}')))
    assert client.push("criteo_hash", table.slice(0, 10))[0]["rows"] == 10
    got, readers = start_readers(client)
    list(raw.do_action(flight.Action("end_ingest", b'{"pipeline": "criteo_hash"}')))
    for t in readers:
        t.join(timeout=60)
    assert client.status()["pipelines"][0]["pushed"]["ended"]


def test_a_batch_with_an_unusable_label_is_refused_whole(pushed):
    """A null (or NaN) label used to be acknowledged and reach the trainers; now the batch
    is refused before it is acknowledged, naming the row, and the next batch takes its
    place in the stream."""
    server, table = pushed
    client = Client(server.uri)
    assert client.push("criteo_hash", table.slice(0, 100))[0]["rows"] == 100
    bad = table.slice(100, 50)
    with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*label column `label` is null at row_id 107"):
        client.push("criteo_hash", with_label(bad, 7, None))
    with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*label column `label` is NaN at row_id 103"):
        client.push("criteo_hash", with_label(bad, 3, float("nan")))
    assert client.status()["pipelines"][0]["pushed"]["rows_in"] == 100
    assert client.push("criteo_hash", bad)[0]["rows"] == 50
    assert ended_ids(client) == list(range(150))


def test_a_push_that_fails_part_way_says_which_batches_were_admitted(pushed):
    """Found by a hostile run: the acknowledgements of the batches admitted before a
    refused one were dropped with the error, so a producer could not tell where to go on
    from (nor, when pyarrow refused a batch of another schema before sending it, that the
    server had not refused anything)."""
    server, table = pushed
    client = Client(server.uri)
    good, bad = with_label(table.slice(0, 210), None, None), with_label(table.slice(150, 50), 7, None)
    with pytest.raises(PushError, match="batch 2 of 4: .*INVALID_ARGUMENT.*row_id 157") as e:
        client.push("criteo_hash", [*good.slice(0, 150).to_batches(100), *bad.to_batches(),
                                    *good.slice(200, 10).to_batches()])
    assert [a["rows"] for a in e.value.acks] == [100, 50]
    assert client.status()["pipelines"][0]["pushed"]["rows_in"] == 150
    # A batch of another schema than the first never leaves the client.
    other = table.slice(150, 10).drop_columns(["c3"])
    with pytest.raises(PushError, match="batch 1 of 2: its schema differs from the first") as e:
        client.push("criteo_hash", [*table.slice(150, 10).to_batches(), *other.to_batches()])
    assert [a["rows"] for a in e.value.acks] == [10]
    assert client.status()["pipelines"][0]["pushed"]["rows_in"] == 160


def test_a_held_batch_with_an_unusable_label_is_refused_before_its_acknowledgement(tmp_path, data):
    """With statistics refreshed from the stream and no state yet, rows are held until the
    warm-up is reached. A NaN label in a held batch used to be acknowledged; when the held
    rows were featurized it failed the next good batch, and acknowledged rows were lost."""
    toml = tmp_path / "refresh.toml"
    toml.write_text('input = "flight"\n' + PUSHED + '\n[stats]\nmode = "refresh"\nwarmup = 3000\n')
    s = Server("--pipeline", toml, "--ranks", "2", "--batch-size", "1000")
    try:
        table = pq.read_table(data[0]).slice(0, 4000)
        table = with_label(table, None, None)
        client = Client(s.uri)
        assert client.push("criteo_hash", table.slice(0, 1000))[0]["rows"] == 1000
        bad = with_label(table.slice(1000, 1000), 300, float("nan"))
        with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*is NaN at row_id 1300"):
            client.push("criteo_hash", bad)
        for first in (1000, 2000, 3000):
            assert client.push("criteo_hash", table.slice(first, 1000))[0]["rows"] == 1000
        assert ended_ids(client) == list(range(4000))
    finally:
        s.stop()


def test_a_held_batch_with_an_id_that_is_no_index_is_refused_before_its_acknowledgement(tmp_path):
    """As the label above, for integer ids passed through: a negative id in a held batch was
    acknowledged; the batch that ended the warm-up then failed with INTERNAL, and the
    acknowledged rows held with it were never delivered."""
    toml = tmp_path / "ids.toml"
    toml.write_text(
        'input = "flight"\nname = "ids"\nlabel = { column = "y", type = "float32" }\n'
        '[[group]]\nname = "d"\nkind = "dense"\ncolumns = ["x"]\nsteps = ["standardize"]\n'
        '[[group]]\nname = "g"\nkind = "ids"\ncolumns = ["u"]\nsteps = []\n'
        '[stats]\nmode = "refresh"\nwarmup = 300\n'
    )
    s = Server("--pipeline", toml, "--ranks", "2", "--batch-size", "100")

    def rows(first, n, bad=None):
        u = list(range(first, first + n))
        if bad is not None:
            u[bad - first] = -5
        return pa.table({
            "x": pa.array([float(i) for i in range(first, first + n)]),
            "u": pa.array(u, pa.int64()),
            "y": pa.array([float(i % 2) for i in range(first, first + n)]),
        })

    try:
        client = Client(s.uri)
        with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*holds -5 at row_id 50"):
            client.push("ids", rows(0, 200, bad=50))
        for first in (0, 200, 400):
            assert client.push("ids", rows(first, 200))[0]["rows"] == 200
        got, readers = {}, []
        for r in range(2):
            t = threading.Thread(target=lambda r=r: got.update({r: list(client.batches("ids", r, 2))}))
            t.start()
            readers.append(t)
        client.end_ingest("ids")
        for t in readers:
            t.join(timeout=60)
        ids = sorted(i for r in range(2) for b in got[r] for i in b.row_id[~b.mask].tolist())
        assert ids == list(range(600))
        assert len(got[0]) == len(got[1]) == 3
    finally:
        s.stop()


def test_a_too_large_message_is_resource_exhausted(tmp_path, data):
    path, _ = data
    s = pushed_server(tmp_path, data, "--max-message-bytes", "200000")
    try:
        client = Client(s.uri)
        table = pq.read_table(path)
        with pytest.raises(HydrantError, match="resource exhausted.*DoPut message too large"):
            client.push("criteo_hash", table.slice(0, 10000))
        # Small batches still go through, on a new call.
        assert client.push("criteo_hash", table.slice(0, 50))[0]["rows"] == 50
    finally:
        s.stop()


def test_push_to_a_file_pipeline_is_refused(serve, data):
    s = serve("--ranks", "1")
    path, _ = data
    with pytest.raises(HydrantError, match="does not take pushed input"):
        Client(s.uri).push("criteo", pq.read_table(path).slice(0, 10))
    # Found by a hostile run: a DoPut that sent its schema and no batch ended OK.
    schema = pq.read_table(path).schema
    writer, _ = flight.FlightClient(s.uri).do_put(
        flight.FlightDescriptor.for_path("ingest", "criteo"), schema)
    with pytest.raises(pa.ArrowInvalid, match="invalid argument.*does not take pushed input"):
        writer.done_writing()
        writer.close()


def test_a_doput_without_the_ingest_path_is_invalid(pushed):
    server, table = pushed
    c = flight.FlightClient(server.uri)
    batch = table.slice(0, 10).to_batches()[0]
    with pytest.raises(Exception, match="INVALID_ARGUMENT.*descriptor path must be"):
        writer, reader = c.do_put(flight.FlightDescriptor.for_path("criteo_hash"), batch.schema)
        writer.write_batch(batch)
        writer.done_writing()
        reader.read()
        writer.close()


def test_a_batch_that_featurizes_to_another_width_is_refused_and_loses_nothing(tmp_path):
    """A pass-through tensor of width 3 where the server delivers width 1 used to be
    acknowledged, then broke the next good batch and lost every acknowledged row."""
    import numpy as np
    import pyarrow as pa

    toml = 'name = "emb"\n[[group]]\nname = "emb"\nkind = "dense"\ncolumns = ["e"]\n'
    files = tmp_path / "files.toml"
    files.write_text(toml)
    good = pa.table({"e": pa.array(np.arange(100, dtype=np.float64))})
    pq.write_table(good, tmp_path / "e.parquet")
    state = tmp_path / "state.json"
    hydrant("fit", "--pipeline", files, "--input", tmp_path / "e.parquet", "--out", state)
    pushed = tmp_path / "pushed.toml"
    pushed.write_text('input = "flight"\n' + toml)
    s = Server("--pipeline", pushed, "--state", state, "--batch-size", "10")
    try:
        client = Client(s.uri)
        got = []
        reader = threading.Thread(
            target=lambda: got.extend(client.batches("emb", 0, 1)), daemon=True
        )
        reader.start()
        assert client.push("emb", good.slice(0, 40))[0]["rows"] == 40
        wide = pa.table(
            {"e": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(30, np.float32)), 3)}
        )
        with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*`emb`.*delivers"):
            client.push("emb", wide)
        assert client.push("emb", good.slice(40, 60))[0]["rows"] == 60
        client.end_ingest("emb")
        reader.join(timeout=60)
        ids = sorted(i for b in got for i in b.row_id[~b.mask].tolist())
        assert ids == list(range(100))
    finally:
        s.stop()


@pytest.mark.parametrize("workers", ["1", "3"])
def test_status_and_other_calls_answer_while_a_producer_is_back_pressured(
    tmp_path, data, workers
):
    """A producer waiting for queue space (no trainer yet, the normal start-up order) used
    to hold the lock that `status` needed: every later call then hung."""
    s = pushed_server(tmp_path, data, "--ranks", "1", "--batch-size", "100", "--workers", workers)
    try:
        table = pq.read_table(data[0])
        client = Client(s.uri)
        acks = []
        producer = threading.Thread(
            target=lambda: acks.extend(client.push("criteo_hash", table.to_batches(1000))),
            daemon=True,
        )
        producer.start()
        producer.join(timeout=2)
        assert producer.is_alive(), "the producer should wait for a trainer"
        answers = {}

        def calls():
            answers["status"] = Client(s.uri).status()
            answers["endpoints"] = Client(s.uri).endpoints("criteo_hash")

        t = threading.Thread(target=calls, daemon=True)
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), "status/endpoints hung behind the producer"
        assert answers["status"]["pipelines"][0]["pushed"]["rows_in"] < table.num_rows
        got = []
        reader = threading.Thread(
            target=lambda: got.extend(client.batches("criteo_hash", 0, 1)), daemon=True
        )
        reader.start()
        producer.join(timeout=60)
        assert not producer.is_alive()
        client.end_ingest("criteo_hash")
        reader.join(timeout=60)
        ids = sorted(i for b in got for i in b.row_id[~b.mask].tolist())
        assert ids == list(range(table.num_rows))
    finally:
        s.stop()


def test_a_producer_that_retries_is_acknowledged_once_per_batch(pushed):
    server, table = pushed
    client = Client(server.uri)
    # Readers first: pushes wait for queue space.
    got, readers = start_readers(client)
    batches = table.slice(0, 6000).to_batches(max_chunksize=2000)
    acks = client.push("criteo_hash", batches, producer="spark-7")
    assert [a.get("duplicate") for a in acks] == [None] * 3
    # Its acknowledgements were lost, say: it sends the last two and one new batch again.
    more = table.slice(4000, 4000).to_batches(max_chunksize=2000)
    again = client.push("criteo_hash", more, producer="spark-7", first_seq=2)
    assert [a.get("duplicate") for a in again] == [True, None]
    client.end_ingest("criteo_hash")
    for t in readers:
        t.join(timeout=60)
    ids = sorted(i for r in got.values() for b in r for i in b.row_id[~b.mask].tolist())
    assert ids == list(range(8000))
    assert client.status()["pipelines"][0]["pushed"]["duplicates"] == 1


def test_a_producer_without_a_seq_is_invalid(pushed):
    server, table = pushed
    c = flight.FlightClient(server.uri)
    descriptor = flight.FlightDescriptor.for_path("ingest", "criteo_hash", "p")
    writer, reader = c.do_put(descriptor, table.schema)
    with pytest.raises(Exception, match="INVALID_ARGUMENT|app_metadata must be"):
        writer.write_table(table.slice(0, 100))
        writer.done_writing()
        reader.read()
        writer.close()


def test_a_seq_from_the_top_is_refused_and_leaves_the_producer_usable(pushed):
    # A seq of 2^64 - 1 (a -1 cast, say) used to be admitted, and every later batch of
    # that producer was then a "duplicate": the name could never push again.
    server, table = pushed
    client = Client(server.uri)
    got, readers = start_readers(client)
    batch = table.slice(0, 100).to_batches()
    with pytest.raises(PushError, match="INVALID_ARGUMENT.*seq 18446744073709551615 is past"):
        client.push("criteo_hash", batch, producer="p", first_seq=2**64 - 1)
    acks = client.push("criteo_hash", batch, producer="p", first_seq=0)
    assert [a.get("duplicate") for a in acks] == [None]
    client.end_ingest("criteo_hash")
    for t in readers:
        t.join(timeout=60)
    ids = sorted(i for r in got.values() for b in r for i in b.row_id[~b.mask].tolist())
    assert ids == list(range(100))


def test_commit_reports_what_it_kept_and_refuses_what_it_cannot(tmp_path, data, serve):
    state_dir = tmp_path / "state-dir"
    s = pushed_server(tmp_path, data, "--ranks", "2", "--batch-size", "1000",
                      "--state-dir", state_dir)
    try:
        client = Client(s.uri)
        got, readers = start_readers(client)
        table = pq.read_table(data[0]).slice(0, 6000)
        client.push("criteo_hash", table.to_batches(max_chunksize=2000), producer="p")
        # 6000 rows are three steps of 2 x 1000: the trainers checkpoint after two.
        with pytest.raises(HydrantError, match="not delivered yet"):
            client.commit("criteo_hash", 4)
        reply = client.commit("criteo_hash", 2)
        assert reply == {"committed": 2, "durable": True, "deleted_segments": 0}
        assert client.commit("criteo_hash", 1)["committed"] == 2
        assert client.status()["pipelines"][0]["pushed"]["committed_step"] == 2
        assert (state_dir / "commit.json").exists()
        raw = flight.FlightClient(s.uri)
        with pytest.raises(Exception, match="INVALID_ARGUMENT|invalid argument.*body must be JSON"):
            list(raw.do_action(flight.Action("commit", b"{garbage")))
        client.end_ingest("criteo_hash")
        for t in readers:
            t.join(timeout=60)
    finally:
        s.stop()
    files = serve("--ranks", "1")
    with pytest.raises(HydrantError, match="nothing to commit"):
        Client(files.uri).commit("criteo", 0)


@pytest.mark.parametrize("workers", ["1", "3"])
def test_sigterm_stops_a_server_whose_producer_waits_for_queue_space(tmp_path, data, workers):
    """A DoPut waiting for queue space (no trainer reads) used to keep the server from ever
    exiting after SIGTERM: dropping the runtime waited for that DoPut's thread."""
    import signal

    s = pushed_server(tmp_path, data, "--ranks", "1", "--batch-size", "8", "--workers", workers)
    # Far more steps than the queue, the dataflow and the channel into it hold together.
    rows = pq.read_table(data[0]).slice(0, 800)
    outcome = []

    def produce():
        try:
            outcome.append(Client(s.uri).push("criteo_hash", rows.to_batches(8)))
        except Exception as e:  # what the producer is told is checked below
            outcome.append(e)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        producer.join(timeout=2)
        assert producer.is_alive(), "the producer should wait for a trainer"
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=30) == 0
        assert time.time() - t0 < 15
    finally:
        # A failed check must not leave the server running.
        if s.proc.poll() is None:
            s.proc.kill()
    # The producer is not left waiting either: its push fails, naming the batches that
    # were acknowledged before the server went, so that it can go on from the next.
    producer.join(timeout=30)
    assert not producer.is_alive(), "the producer still waits on a server that exited"
    [error] = outcome
    assert isinstance(error, PushError), error
    assert len(error.acks) < 100, error


def test_a_stray_reader_of_a_later_step_takes_no_rows_from_the_trainer(pushed):
    """A reader that asked for a later step of a rank (a zombie, a wrong checkpoint) used to
    discard the steps before it: the trainer that then asked for step 0 was told they were
    no longer held, and acknowledged rows never reached anyone."""
    server, table = pushed
    steps = -(-table.num_rows // 2000)  # of 2 x 1000 rows
    client = Client(server.uri)
    got = {}
    rank1 = threading.Thread(
        target=lambda: got.setdefault(1, list(client.batches("criteo_hash", 1, 2))),
        daemon=True,
    )
    rank1.start()
    stray = client.batches("criteo_hash", 0, 2, start_step=6)
    acks = []
    producer = threading.Thread(
        target=lambda: acks.extend(client.push("criteo_hash", table.to_batches(3000))),
        daemon=True,
    )
    producer.start()
    assert next(stray).step == 6
    stray.close()
    got[0] = []
    rank0 = threading.Thread(
        target=lambda: got[0].extend(client.batches("criteo_hash", 0, 2)), daemon=True
    )
    rank0.start()
    producer.join(timeout=60)
    assert sum(a["rows"] for a in acks) == table.num_rows
    client.end_ingest("criteo_hash")
    for t in (rank0, rank1):
        t.join(timeout=60)
        assert not t.is_alive()
    assert [b.step for b in got[0]] == [b.step for b in got[1]] == list(range(steps))
    ids = sorted(i for r in (0, 1) for b in got[r] for i in b.row_id[~b.mask].tolist())
    assert ids == list(range(table.num_rows))


def test_the_end_of_a_stream_past_the_last_step_names_the_state_version(pushed):
    """A DoGet from past the end gets one empty message marked last; it used to say state
    version 0 whatever the state, where the batches before it carried the real one."""
    import json

    server, table = pushed
    client = Client(server.uri)
    got, readers = start_readers(client)
    client.push("criteo_hash", table.slice(0, 4000).to_batches(2000))
    client.end_ingest("criteo_hash")
    for t in readers:
        t.join(timeout=60)
    version = got[0][-1].state_version
    assert version == client.status()["pipelines"][0]["state_version"]
    ticket = client.ticket("criteo_hash", 0, 2, start_step=len(got[0]))
    reader = flight.connect(server.uri).do_get(ticket)
    meta = json.loads(reader.read_chunk().app_metadata.to_pybytes())
    assert meta["last"] and meta["rows"] == 0
    assert meta["state_version"] == version


def test_a_panic_delivering_pushed_rows_fails_the_streams_and_the_next_push(
    tmp_path, data, monkeypatch
):
    """Pushed rows are placed and assembled by a timely dataflow of their own. When it
    panics (the third time an owner runs), the ranks' streams end with the panic's one
    line instead of waiting forever, the producer is refused with it rather than told
    OK, and the server goes on answering."""
    monkeypatch.setenv("HYDRANT_FAIL_POINT", "own:0:3")
    s = pushed_server(tmp_path, data, "--ranks", "2", "--batch-size", "100")
    try:
        client = Client(s.uri)
        got = {}

        def read(r):
            try:
                got[r] = ("done", len(list(client.batches("criteo_hash", r, 2))))
            except HydrantError as e:
                got[r] = ("error", str(e))

        readers = [threading.Thread(target=read, args=(r,), daemon=True) for r in range(2)]
        for t in readers:
            t.start()
        table = pq.read_table(data[0]).slice(0, 20_000)
        with pytest.raises(HydrantError, match="panicked in operator `own`"):
            for batch in table.to_batches(max_chunksize=1000):
                client.push("criteo_hash", [batch])
        for t in readers:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in readers), f"a stream hung: {got}"
        assert [kind for kind, _ in got.values()] == ["error", "error"], got
        for _, what in got.values():
            assert "panicked in operator `own`" in what and "\n" not in what, what
        assert s.proc.poll() is None
        assert client.status()["pipelines"][0]["pushed"]
        failed = s.lines_logged("delivering pushed rows failed")
        assert len(failed) == 1 and "panicked in operator `own`" in failed[0], failed
    finally:
        s.stop()


@pytest.mark.parametrize("workers", ["1", "3"])
def test_a_pushed_rank_no_one_reads_holds_the_producer_until_it_is_read(tmp_path, data, workers):
    """A rank of file input that no one reads is let go after `--absent-after` (it catches
    up on a run of its own later); pushed rows cannot be read again, so a pushed rank no
    one reads holds the producer instead, and every row reaches it once it is read."""
    s = pushed_server(
        tmp_path, data, "--ranks", "2", "--batch-size", "100", "--absent-after", "1",
        "--workers", workers,
    )
    try:
        table = pq.read_table(data[0])
        client = Client(s.uri)
        acks, got = [], {0: [], 1: []}
        producer = threading.Thread(
            target=lambda: acks.extend(Client(s.uri).push("criteo_hash", table.to_batches(1000))),
            daemon=True,
        )
        producer.start()

        def read(r):
            for b in Client(s.uri).batches("criteo_hash", r, 2):
                got[r].append(b)

        rank0 = threading.Thread(target=read, args=(0,), daemon=True)
        rank0.start()
        time.sleep(4)  # past --absent-after, several times over
        assert producer.is_alive(), "the producer should wait for rank 1"
        held = len(got[0])
        assert 0 < held < table.num_rows // 200, held
        pushed = client.status()["pipelines"][0]["pushed"]
        assert pushed["rows_in"] < table.num_rows
        rank1 = threading.Thread(target=read, args=(1,), daemon=True)
        rank1.start()
        producer.join(timeout=60)
        assert not producer.is_alive()
        assert sum(a["rows"] for a in acks) == table.num_rows
        client.end_ingest("criteo_hash")
        for t in (rank0, rank1):
            t.join(timeout=60)
            assert not t.is_alive()
        steps = -(-table.num_rows // 200)
        assert [b.step for b in got[0]] == [b.step for b in got[1]] == list(range(steps))
        ids = sorted(i for r in (0, 1) for b in got[r] for i in b.row_id[~b.mask].tolist())
        assert ids == list(range(table.num_rows))
    finally:
        s.stop()


def test_pushed_rows_placed_on_several_workers_are_the_batches_of_one(tmp_path, data):
    """`--workers` places and assembles pushed rows on that many threads: shuffled, every
    rank's batches are the same rows in the same slots as with one worker."""
    table = pq.read_table(data[0])
    delivered = {}
    for workers in ("1", "3"):
        s = pushed_server(
            tmp_path, data, "--ranks", "2", "--batch-size", "500", "--shuffle",
            "--shuffle-window", "3000", "--workers", workers,
        )
        try:
            client = Client(s.uri)
            got, readers = start_readers(client)
            acks = client.push("criteo_hash", table.to_batches(max_chunksize=2500))
            assert sum(a["rows"] for a in acks) == table.num_rows
            client.end_ingest("criteo_hash")
            for t in readers:
                t.join(timeout=60)
                assert not t.is_alive()
            delivered[workers] = {
                r: [(b.step, b.row_id.tolist(), b.mask.tolist()) for b in got[r]] for r in (0, 1)
            }
        finally:
            s.stop()
    one, three = delivered["1"], delivered["3"]
    assert one == three
    ids = sorted(i for r in (0, 1) for _, rows, mask in one[r] for i, m in zip(rows, mask) if not m)
    assert ids == list(range(table.num_rows))
    assert any(rows != sorted(rows) for r in (0, 1) for _, rows, _ in one[r]), "shuffled"


def test_a_producer_whose_token_expired_logs_in_again_and_loses_nothing(tmp_path, data):
    """A push, the readers and ``end_ingest`` after ``--token-ttl``: each logs in again.
    Found by a review: a push of a generator retried after the new login sent nothing
    (the first try had used it up) and returned no acknowledgement, without an error."""
    tokens = tmp_path / "tokens"
    tokens.write_text("all:pw\n")
    listen = f"127.0.0.1:{free_port()}"
    args = ("--ranks", "2", "--batch-size", "1000", "--token-file", tokens, "--token-ttl", "1")
    s = pushed_server(tmp_path, data, *args, listen=listen)
    table = pq.read_table(data[0])
    try:
        # The trainers' and the producer's own clients, so that each call below is the
        # first after its client's token expired.
        client, producer = (Client(s.uri, token=("all", "pw")) for _ in range(2))
        time.sleep(1.5)
        got, readers = start_readers(client)
        acks = producer.push("criteo_hash", (b for b in table.to_batches(max_chunksize=5000)))
        assert sum(a["rows"] for a in acks) == table.num_rows
        time.sleep(1.5)
        producer.end_ingest("criteo_hash")
        for t in readers:
            t.join(timeout=60)
        ids = sorted(i for r in range(2) for b in got[r] for i in b.row_id[~b.mask].tolist())
        assert ids == list(range(table.num_rows))
    finally:
        s.stop()
    # A restarted server that does not know the user: a PushError with no acks.
    tokens.write_text("other:pw\n")
    s = pushed_server(tmp_path, data, *args, listen=listen)
    try:
        with pytest.raises(PushError, match="wrong user or password") as refused:
            producer.push("criteo_hash", table.to_batches(max_chunksize=5000))
        assert refused.value.acks == []
    finally:
        s.stop()


def test_producers_waiting_for_queue_space_hold_little_more_than_their_count(tmp_path):
    """Producers pushing while no rank is read all wait for queue space. A DoPut reads its
    next message only once it may be admitted (a few at a time), and the server's HTTP/2
    receive windows are 2 MiB a stream, so 16 producers of a 15 MiB batch hold little
    more than 4 do. Before, each waiting producer held its batch, decoded, and 16 MiB more
    in flight: going from 4 to 16 producers added 325 MB; now about 85 MB."""
    import numpy as np

    rows = 1_000_000  # 15.3 MiB a batch

    def batch(producer):
        u = np.arange(producer * 10**8, producer * 10**8 + rows, dtype=np.int64)
        return pa.record_batch({"u": u, "y": (u % 2).astype(np.float64)})

    pipeline = (
        'name = "p"\nlabel = { column = "y", type = "float32" }\n'
        '[[group]]\nname = "g"\nkind = "ids"\ncolumns = ["u"]\nsteps = []\n'
    )
    files, toml = tmp_path / "files.toml", tmp_path / "p.toml"
    files.write_text(pipeline)
    toml.write_text('input = "flight"\n' + pipeline)
    pq.write_table(pa.Table.from_batches([batch(0)]).slice(0, 100), tmp_path / "fit.parquet")
    hydrant("fit", "--pipeline", files, "--input", tmp_path / "fit.parquet",
            "--out", tmp_path / "state.json")

    def peak_rss(producers):
        s = Server("--pipeline", toml, "--state", tmp_path / "state.json", "--ranks", "2",
                   "--batch-size", "1000")
        try:
            def push(p):
                try:
                    Client(s.uri).push("p", [batch(p)], producer=f"x{p}")
                except HydrantError:
                    pass  # cut when the server stops

            for p in range(producers):
                threading.Thread(target=push, args=(p,), daemon=True).start()
            peak, until = 0, time.monotonic() + 5
            while time.monotonic() < until:
                with open(f"/proc/{s.proc.pid}/status") as f:
                    kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
                peak = max(peak, kb * 1024)
                time.sleep(0.1)
            assert Client(s.uri).status()["pipelines"], "the server stopped answering"
            return peak
        finally:
            s.stop()

    few, many = peak_rss(4), peak_rss(16)
    batch_bytes = rows * 16
    # Twelve more producers hold less than their twelve batches.
    assert many - few < 12 * batch_bytes, (few >> 20, many >> 20)
