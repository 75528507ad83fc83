"""TLS and basic auth on /metrics, with node_exporter's web-config format, on real sockets."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
import urllib.error

import bcrypt
import pytest
import yaml

from tests.conftest import BUNDLES, require_tool

ROOT = BUNDLES / "x86-256" / "samples" / "s0000"


@pytest.fixture
def certificate(tmp_path):
    openssl = require_tool("openssl")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(tmp_path / "server.key"), "-out", str(tmp_path / "server.crt"),
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return tmp_path / "server.crt"


def _web_config(tmp_path, content) -> str:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(content))
    return str(path)


def _basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_tls_and_basic_auth(exporter_factory, tmp_path, certificate):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = _web_config(tmp_path, {
        # Relative paths resolve against the web config's folder, as in exporter-toolkit.
        "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
        "basic_auth_users": {"prometheus": hashed.replace("$2b$", "$2y$")},  # htpasswd -B style
    })
    exporter = exporter_factory(ROOT, None, ["--web-config", web])
    assert exporter.url.startswith("https://127.0.0.1:")
    trusted = ssl.create_default_context(cafile=str(certificate))

    status, _, body = exporter.scrape(_basic("prometheus", "s3cret"), context=trusted)
    assert status == 200 and b"fleetscope_cpu_numa_node_seconds_total" in body

    for headers in ({}, _basic("prometheus", "wrong"), _basic("nobody", "s3cret"),
                    {"Authorization": "Basic !!!"}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            exporter.scrape(headers, context=trusted)
        assert refused.value.code == 401
        assert refused.value.headers["WWW-Authenticate"].startswith("Basic")

    with pytest.raises(urllib.error.URLError):  # the certificate is not trusted by default
        exporter.scrape(_basic("prometheus", "s3cret"), context=ssl.create_default_context())
    # A plain-HTTP client gets no metrics from the TLS port.
    plain = exporter.url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(plain, timeout=5).read()
    # The server survived the bad handshakes.
    assert exporter.scrape(_basic("prometheus", "s3cret"), context=trusted)[0] == 200


@pytest.mark.parametrize(
    "content, message",
    [
        ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}},
         "cannot load TLS certificate"),
        ({"tls_server_config": {"cert_file": "a"}}, "needs cert_file and key_file"),
        ({"basic_auth_users": {"alice": "plaintext"}}, "bcrypt hashes"),
        ({"tls_config": {}}, "unknown keys tls_config"),
    ],
)
def test_bad_web_config_is_one_line_and_exit_3(tmp_path, content, message):
    web = _web_config(tmp_path, content)
    result = subprocess.run(
        [sys.executable, "-m", "fleetscope", "exporter", "--listen", "127.0.0.1:0",
         "--root", str(ROOT), "--web-config", web],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 3
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
