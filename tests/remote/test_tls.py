"""TLS between the edge client and the verifier server, with a self-signed
certificate made at test time by the openssl command-line tool: the client
verifies the certificate (trusting the file passed as tls_ca), refuses a
server it cannot verify at once (no retrying until the deadline), and the
command refuses half a TLS configuration."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from lever.cli import main
from lever.errors import LeverError
from lever.remote.client import RemoteVerifier, RemoteVerifierError
from lever.remote.protocol import Limits
from lever.remote.server import ServerThread, VerifierServer
from lever.remote.tls import client_context, server_context
from waiting import deadline

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def self_signed(directory, name: str = "server", host: str = "127.0.0.1"):
    """(certificate, key) PEM files of a fresh self-signed certificate for `host`, valid one day."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={host}",
                    "-addext", f"subjectAltName=IP:{host}"], check=True, capture_output=True, timeout=deadline(60))
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    return self_signed(directory), self_signed(directory, "other")


@pytest.fixture(scope="module")
def tls_server(tiny_pair, certs):
    (cert, key), _ = certs
    server = VerifierServer(tiny_pair[0], "tiny", Limits(max_tree_nodes=8), log=lambda line: None)
    with ServerThread(server, ssl_context=server_context(str(cert), str(key))) as running:
        yield running


def test_the_client_verifies_the_servers_certificate(tls_server, certs):
    (cert, _), _ = certs
    assert tls_server.url.startswith("https://")
    verifier = RemoteVerifier(tls_server.url, tls_ca=str(cert))
    verifier.start([1, 2, 3])
    from lever.tree import TokenTree
    verdict = verifier.verify(TokenTree(3))
    assert verdict.accepted == [] and 0 <= verdict.next_token < 20
    verifier.close()


@pytest.mark.parametrize("trust", ["system", "other"])
def test_an_untrusted_certificate_is_refused_at_once(tls_server, certs, trust):
    _, (other, _) = certs
    t0 = time.monotonic()
    with pytest.raises(RemoteVerifierError, match="does not trust.*--tls-ca"):
        RemoteVerifier(tls_server.url, tls_ca=None if trust == "system" else str(other), retry_deadline_s=600)
    assert time.monotonic() - t0 < deadline(5)          # not retried until the (600 s) deadline


def test_plain_http_to_a_tls_server_gets_no_session(tls_server):
    with pytest.raises(RemoteVerifierError):
        RemoteVerifier(tls_server.url.replace("https", "http"), retry_deadline_s=0.5)


def test_tls_option_errors(tmp_path, certs):
    (cert, key), _ = certs
    with pytest.raises(LeverError, match="not https"):
        RemoteVerifier("http://127.0.0.1:1", tls_ca=str(cert))
    with pytest.raises(LeverError, match="--tls-ca .*cannot be read"):
        client_context(str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(LeverError, match="--tls-ca"):
        client_context(str(tmp_path / "junk.pem"))
    with pytest.raises(LeverError, match="--tls-cert"):
        server_context(str(cert), str(tmp_path / "junk.pem"))


def test_the_command_wants_both_cert_and_key(tmp_path, certs, capsys):
    (cert, key), _ = certs
    assert main(["serve-verifier", "--model", str(tmp_path / "no-model"), "--tls-cert", str(cert)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tls-cert and --tls-key go together" in err[0]
