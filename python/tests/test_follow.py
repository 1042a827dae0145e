"""A followed folder's freshness, from a real `hydrant serve --follow`: how long an
admitted file takes to reach the trainer, how old its events are then (the pipeline names
an `event_time` column), in `status` and on the Prometheus endpoint; a file without the
event-time column is skipped and reported."""

import socket
import threading
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from conftest import Server, hydrant
from hydrant_client import Client, HydrantError

PIPELINE = """
name = "clicks"
event_time = "ts"
label = { column = "y" }

[[group]]
name = "dense"
kind = "dense"
columns = ["x"]
steps = ["fill_null(0)", "standardize"]
"""


def table(rows, first, age_s):
    now_ms = int(time.time() * 1000)
    return pa.table(
        {
            "x": pa.array(np.arange(first, first + rows, dtype=np.float64)),
            "y": pa.array(np.zeros(rows, dtype=np.float32)),
            "ts": pa.array(np.full(rows, now_ms - age_s * 1000), type=pa.timestamp("ms", tz="UTC")),
        }
    )


def publish(t, folder, name):
    tmp = folder / f"_tmp-{name}"
    pq.write_table(t, tmp)
    tmp.rename(folder / name)


def wait_for(predicate, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def fitted(tmp_path, pipeline):
    """The pipeline file and a state fitted on rows like the test's."""
    toml = tmp_path / "clicks.toml"
    toml.write_text(pipeline)
    pq.write_table(table(400, 0, 0), tmp_path / "fit.parquet")
    state = tmp_path / "state.json"
    hydrant("fit", "--pipeline", toml, "--input", tmp_path / "fit.parquet", "--out", state)
    return toml, state


def read_in_background(client):
    """Rank 0's batches (of 1), gathered on a thread until the stream ends."""
    got = []
    reader = threading.Thread(target=lambda: got.extend(client.batches("clicks", 0, 1)),
                              daemon=True)
    reader.start()
    return got, reader


def test_freshness_of_a_followed_folder(tmp_path):
    toml, state = fitted(tmp_path, PIPELINE)
    folder = tmp_path / "in"
    folder.mkdir()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = Server("--pipeline", toml, "--state", state, "--follow", folder,
                    "--state-dir", tmp_path / "sd", "--ranks", "1", "--batch-size", "100",
                    "--metrics-listen", f"127.0.0.1:{port}")
    try:
        client = Client(server.uri)
        got, reader = read_in_background(client)

        def freshness():
            return client.status()["pipelines"][0]["pushed"]

        publish(table(400, 0, 60), folder, "a.parquet")
        wait_for(lambda: freshness()["freshness"]["admission_to_delivery_ms"]["timed"] == 1,
                 "a.parquet's rows to be delivered")
        publish(table(400, 0, 60).drop(["ts"]), folder, "b-no-ts.parquet")
        publish(table(400, 400, 30), folder, "c.parquet")
        s = wait_for(lambda: (lambda s: s["freshness"]["admission_to_delivery_ms"]["timed"] == 2
                              and s)(freshness()), "c.parquet's rows to be delivered")
        fresh = s["freshness"]
        assert fresh["event_time_column"] == "ts"
        # c.parquet's newest event was 30 s old when it was written.
        assert 29 <= fresh["event_time_lag_s"] < 90, fresh
        latency = fresh["admission_to_delivery_ms"]
        assert 0 < latency["p50"] <= latency["p99"] < 10_000, latency
        assert fresh["waiting_admissions"] == 0 and fresh["delivered_position"] == 800
        skipped = s["follow"]["skipped"]
        assert [k["file"] for k in skipped] == ["b-no-ts.parquet"], skipped
        assert "no event-time column `ts`" in skipped[0]["error"]

        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "hydrant_admitted_rows_total 800" in text
        assert 'hydrant_admission_to_delivery_seconds{quantile="0.5"}' in text
        assert "hydrant_admission_to_delivery_seconds_count 2" in text
        assert "hydrant_event_time_lag_seconds" in text

        client.end_ingest("clicks")
        reader.join(timeout=30)
        assert not reader.is_alive()
        real = [i for b in got for i in b.row_id[~b.mask].tolist()]
        assert real == list(range(800))
        assert [b.positions for b in got] == [(k * 100, k * 100 + 100) for k in range(8)]
    finally:
        server.stop()


def test_pushed_batches_need_the_event_time_column_and_are_timed(tmp_path):
    import pytest

    from hydrant_client import HydrantError

    pushed = PIPELINE.replace("event_time", 'input = "flight"\nevent_time')
    toml, state = fitted(tmp_path, pushed)
    server = Server("--pipeline", toml, "--state", state, "--ranks", "1",
                    "--batch-size", "100")
    try:
        client = Client(server.uri)
        got, reader = read_in_background(client)
        with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*no event-time column `ts`"):
            client.push("clicks", table(100, 0, 5).drop(["ts"]))
        with pytest.raises(HydrantError, match="INVALID_ARGUMENT.*`ts` is Utf8; a timestamp"):
            client.push("clicks", table(100, 0, 5).set_column(2, "ts", pa.array(["x"] * 100)))
        acks = client.push("clicks", table(300, 0, 5).to_batches(max_chunksize=100))
        assert [a["rows"] for a in acks] == [100, 100, 100]

        def timed():
            s = client.status()["pipelines"][0]["pushed"]["freshness"]
            return s if s["admission_to_delivery_ms"]["timed"] == 3 else None

        fresh = wait_for(timed, "three pushed batches to be delivered")
        assert 4 <= fresh["event_time_lag_s"] < 60, fresh
        client.end_ingest("clicks")
        reader.join(timeout=30)
        assert [i for b in got for i in b.row_id[~b.mask].tolist()] == list(range(300))
    finally:
        server.stop()


def test_a_followed_folder_refreshes_its_statistics_and_serves_each_version(tmp_path):
    """No --state: the first version is fitted on the warmup rows, the next ones every
    `every` rows; each batch names the version that featurized it, and the `state` action
    returns that version (the one to serve the model with)."""
    toml = tmp_path / "clicks.toml"
    toml.write_text(PIPELINE.replace('event_time = "ts"\n', "")
                    + '\n[stats]\nmode = "refresh"\nwarmup = 300\nevery = 400\n')
    folder = tmp_path / "in"
    folder.mkdir()
    server = Server("--pipeline", toml, "--follow", folder, "--state-dir", tmp_path / "sd",
                    "--ranks", "1", "--batch-size", "100")
    try:
        client = Client(server.uri)
        got, reader = read_in_background(client)
        for k in range(3):
            publish(table(400, 400 * k, 0), folder, f"{k}.parquet")
        wait_for(lambda: client.status()["pipelines"][0]["pushed"]["rows_in"] == 1200,
                 "the three files to be admitted")
        client.end_ingest("clicks")
        reader.join(timeout=30)
        assert not reader.is_alive()
        # Versions made at rows 300 (in effect from 0), 700 and 1100 (from the next step).
        versions = [b.state_version for b in got]
        first, second, third = versions[0], versions[7], versions[11]
        assert versions == [first] * 7 + [second] * 4 + [third], versions
        assert len({first, second, third}) == 3
        means = [client.state("clicks", v)["params"]["dense/x/1"]["standardize"]["mean"]
                 for v in (first, second, third)]
        # x counts up, so each version's mean (of all rows so far) is higher.
        assert means[0] < means[1] < means[2], means
        assert abs(means[0] - 149.5) < 1e-9, means
        status = client.status()["pipelines"][0]
        assert status["state_versions"] == 3 and status["state_version"] == third
        assert (tmp_path / "sd" / f"state-{second}.json").exists()
    finally:
        server.stop()


def test_a_followed_file_too_large_to_fit_within_the_warmup_is_skipped(tmp_path):
    """One value of 1e200 in the warmup's rows would leave no first version to fit (its
    square overflows) and no version before to keep: the file holding it is skipped and
    named, the next files make the first version, and a restart serves from there. The
    stream used to stop following without a word, and to stop again at every restart."""
    toml = tmp_path / "clicks.toml"
    toml.write_text(PIPELINE.replace('event_time = "ts"\n', "")
                    + '\n[stats]\nmode = "refresh"\nwarmup = 300\nevery = 400\n')
    folder = tmp_path / "in"
    folder.mkdir()
    args = ("--pipeline", toml, "--follow", folder, "--state-dir", tmp_path / "sd",
            "--ranks", "1", "--batch-size", "100")
    bad = table(200, 0, 0)
    bad = bad.set_column(0, "x", pa.array([1e200] + list(range(1, 200)), pa.float64()))
    server = Server(*args)
    try:
        client = Client(server.uri)
        got = []

        def read_until_stopped():
            try:
                got.extend(client.batches("clicks", 0, 1))
            except HydrantError:
                pass  # the server is stopped below

        threading.Thread(target=read_until_stopped, daemon=True).start()
        publish(bad, folder, "0-bad.parquet")
        for k in (1, 2):
            publish(table(200, 200 * k, 0), folder, f"{k}.parquet")
        pushed = lambda: client.status()["pipelines"][0]["pushed"]  # noqa: E731
        wait_for(lambda: pushed()["follow"]["files"] == 3, "the three files to be seen")
        s = pushed()
        assert s["rows_in"] == 400 and s["replay_failed"] is None, s
        skipped = s["follow"]["skipped"]
        assert [k["file"] for k in skipped] == ["0-bad.parquet"], skipped
        assert "too large to fit" in skipped[0]["error"], skipped
        wait_for(lambda: len(got) == 4, "the first four steps")
    finally:
        server.stop()
    server = Server(*args)
    try:
        client = Client(server.uri)
        got, reader = read_in_background(client)
        publish(table(100, 600, 0), folder, "3.parquet")
        wait_for(lambda: client.status()["pipelines"][0]["pushed"]["rows_in"] == 500,
                 "the new file to be admitted after the replay")
        client.end_ingest("clicks")
        reader.join(timeout=30)
        assert not reader.is_alive()
        real = [i for b in got for i in b.row_id[~b.mask].tolist()]
        assert real == list(range(500))
        xs = np.concatenate([b.dense for b in got])
        assert np.isfinite(xs).all()
    finally:
        server.stop()


def test_a_server_stopped_while_a_followed_file_waits_for_trainers_says_nothing_of_it(tmp_path):
    """SIGTERM while a followed folder's rows wait for queue space (no trainer reads):
    the server stops cleanly, and the follower does not log that following stopped (it
    used to: "following … stopped: … rank 0 stopped reading before its last batch",
    and failed the input as it went)."""
    toml, state = fitted(tmp_path, PIPELINE.replace('event_time = "ts"\n', ""))
    folder = tmp_path / "in"
    folder.mkdir()
    server = Server("--pipeline", toml, "--state", state, "--follow", folder,
                    "--state-dir", tmp_path / "sd", "--ranks", "1", "--batch-size", "100")
    try:
        client = Client(server.uri)
        for k in range(3):
            publish(table(50_000, 50_000 * k, 0).drop(["ts"]), folder, f"{k}.parquet")
        pushed = lambda: client.status()["pipelines"][0]["pushed"]  # noqa: E731
        wait_for(lambda: pushed()["rows_in"] > 0, "rows to be admitted")
        time.sleep(0.5)
        assert pushed()["rows_in"] < 150_000, "nothing was held back: the test needs a full queue"
    except BaseException:
        server.stop()
        raise
    assert server.lines_logged("hydrant:") == ["hydrant: shutting down"]
    assert server.proc.returncode == 0
