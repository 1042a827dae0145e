"""The `hydrant` binary run from the peers' scripts: one-shot commands, servers on a free
loopback port, and a scratch folder removed whatever ends the run."""
import atexit
import json
import pathlib
import shutil
import subprocess
import tempfile


def scratch() -> pathlib.Path:
    """A temporary folder. The input files put there are hundreds of MB: it is removed at
    exit, whatever ends the run."""
    tmp = pathlib.Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    return tmp


def run(binary, *args) -> dict:
    """Runs `hydrant ARGS` to completion; returns the JSON of its last line."""
    out = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def serve(binary, *args, stderr=None):
    """Starts `hydrant serve --listen 127.0.0.1:0 ARGS`; returns it and its grpc:// URI."""
    server = subprocess.Popen([str(binary), "serve", "--listen", "127.0.0.1:0",
                               *map(str, args)], stdout=subprocess.PIPE, stderr=stderr,
                              text=True)
    return server, "grpc://" + json.loads(server.stdout.readline())["listening"]
