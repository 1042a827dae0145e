"""Fixtures: the real `hydrant` binary, a generated dataset, and servers on free loopback
ports (port 0; the server prints the port it chose)."""

import json
import os
import pathlib
import signal
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("HYDRANT_BIN", ROOT / "target" / "release" / "hydrant"))
PIPELINE = ROOT / "examples" / "criteo.toml"
ROWS = 20_003


def hydrant(*args):
    out = subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    path = d / "criteo.parquet"
    hydrant("gen", "criteo", "--rows", ROWS, "--out", path)
    state = d / "state.json"
    hydrant("fit", "--pipeline", PIPELINE, "--input", path, "--out", state)
    return path, state


class Server:
    def __init__(self, *args, preexec_fn=None, listen="127.0.0.1:0"):
        self.proc = subprocess.Popen(
            [str(BIN), "serve", "--listen", listen, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=preexec_fn,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("hydrant serve did not start: " + self.proc.stderr.read())
        self.ready = json.loads(line)
        self.uri = "grpc://" + self.ready["listening"]

    def lines_logged(self, text):
        """Stops the server and returns the lines of its log (stderr) that hold `text`."""
        self.stop()
        return [line for line in self.proc.stderr.read().splitlines() if text in line]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


_next_port = [None]


def free_port():
    """A free loopback port below the kernel's ephemeral range: a port the kernel hands out
    (bound to 0 and let go) can become another connection's source port before hydrant
    listens on it, and the listen then fails with "Address already in use"."""
    import os
    import socket

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    base, span = 10000, max(low - 10000, 2000)
    if _next_port[0] is None:
        _next_port[0] = (os.getpid() * 7919) % span
    for _ in range(span):
        port = base + _next_port[0] % span
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port below {low}")


@pytest.fixture
def serve(data):
    servers = []

    def start(*extra):
        path, state = data
        s = Server("--pipeline", PIPELINE, "--input", path, "--state", state, *extra)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def need_torch():
    """torch, or a skip where it is not installed; `.ci/run` installs it and sets
    HYDRANT_REQUIRE_TORCH=1, so there a missing torch fails instead of skipping."""
    if os.environ.get("HYDRANT_REQUIRE_TORCH") == "1":
        import torch

        return torch
    return pytest.importorskip("torch")
