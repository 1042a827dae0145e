"""TLS and tokens on the real server: a self-signed certificate made with the openssl CLI,
the pyarrow client over grpc+tls:// trusting it, the set-ups that are refused, and a
client's login again when its token is no longer known."""

import subprocess
import time

import pytest

from hydrant_client import Client, HydrantError

from conftest import BIN, PIPELINE, ROWS


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    key, crt = d / "key.pem", d / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", key, "-out", crt, "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    return crt, key


def test_a_tls_round_trip_with_tokens(serve, cert, tmp_path):
    crt, key = cert
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:s3cret\n")
    s = serve("--ranks", "2", "--batch-size", "5000", "--tls-cert", crt, "--tls-key", key,
              "--token-file", tokens)
    uri = "grpc+tls://" + s.ready["listening"]
    c = Client(uri, token=("alice", "s3cret"), tls_root_certs=crt.read_bytes())
    import threading

    got = {}
    threads = [threading.Thread(target=lambda r=r: got.setdefault(r, list(c.batches("criteo", r, 2))))
               for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = sorted(i for r in range(2) for b in got[r] for i in b.row_id[~b.mask].tolist())
    assert ids == list(range(ROWS))
    # A plaintext client cannot talk to it, nor one that does not trust its certificate.
    with pytest.raises(HydrantError):
        Client("grpc://" + s.ready["listening"], token=("alice", "s3cret"))
    with pytest.raises(HydrantError):
        Client(uri, token=("alice", "s3cret"))


def refused(data, *extra):
    path, state = data
    out = subprocess.run(
        [str(BIN), "serve", "--pipeline", PIPELINE, "--input", path, "--state", state, *map(str, extra)],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0, out.stdout
    return out.stderr


def test_tokens_on_a_public_address_need_tls_and_bad_certificates_are_refused(data, cert, tmp_path):
    crt, key = cert
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:s3cret\n")
    err = refused(data, "--listen", "0.0.0.0:0", "--token-file", tokens)
    assert "--tls-cert" in err and "--insecure-plaintext" in err
    assert "--tls-key" in refused(data, "--listen", "127.0.0.1:0", "--tls-cert", crt)
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    assert "--tls-cert/--tls-key" in refused(data, "--listen", "127.0.0.1:0", "--tls-cert", bad, "--tls-key", key)
    assert "--tls-cert" in refused(data, "--listen", "127.0.0.1:0", "--tls-cert", tmp_path / "missing", "--tls-key", key)


def test_a_client_logs_in_again_when_its_token_expires_or_the_server_restarts(data, tmp_path):
    """A hostile run found a ``Client`` made with ``token=`` useless after its server
    restarted ("unknown bearer token") until a new one was made, and so after
    ``--token-ttl`` too: it now logs in again, once per refused call."""
    from conftest import Server, free_port

    path, state = data
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:s3cret\n")
    listen = f"127.0.0.1:{free_port()}"
    args = ["--pipeline", PIPELINE, "--input", path, "--state", state, "--ranks", "1",
            "--batch-size", "5000", "--token-file", tokens, "--token-ttl", "1"]

    def every_row(client):
        ids = sorted(i for b in client.batches("criteo", 0, 1) for i in b.row_id[~b.mask].tolist())
        assert ids == list(range(ROWS))

    s = Server(*args, listen=listen)
    try:
        c = Client("grpc://" + listen, token=("alice", "s3cret"))
        assert c.status()["pipelines"]
        time.sleep(1.5)  # the token has expired: a stream is opened after a new login
        every_row(c)
        time.sleep(1.5)
        assert c.schema("criteo").names
    finally:
        s.stop()
    s = Server(*args, listen=listen)
    try:
        every_row(c)  # a restarted server knows no token it gave before
        assert c.status()["pipelines"]
    finally:
        s.stop()
    # A user the restarted server does not know is told so, once.
    tokens.write_text("bob:other\n")
    s = Server(*args, listen=listen)
    try:
        time.sleep(1.5)
        with pytest.raises(HydrantError, match="wrong user or password"):
            c.status()
        with pytest.raises(HydrantError, match="wrong user or password"):
            list(c.batches("criteo", 0, 1))
    finally:
        s.stop()
