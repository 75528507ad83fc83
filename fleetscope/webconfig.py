"""Optional TLS and basic auth for /metrics, from a web-config YAML in node_exporter's format
(prometheus/exporter-toolkit `docs/web-configuration.md`):

    tls_server_config:
      cert_file: server.crt          # paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2b$12$hNf2lSsxfm0.i4a.1kVpSOVyBCfIB51VRjgBUyv6kdnyTlgWj81Ay   # bcrypt

Off unless `--web-config` is given. Unknown keys are errors, as in exporter-toolkit.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import ssl
import threading
from dataclasses import dataclass, field

import yaml

from fleetscope.core.config import MAX_CONFIG_BYTES, ConfigError
from fleetscope.core.named_file import read_named_file

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# exporter-toolkit's client_auth_type values that Python's ssl module can honour exactly.
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
}
# A well-formed bcrypt hash checked when the user is unknown, so unknown and known users take
# the same time (exporter-toolkit does the same).
_DUMMY_HASH = b"$2b$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
# Modular crypt format of bcrypt: $2a$/$2b$/$2y$, cost 04-31, 22 salt + 31 hash characters.
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
_HTTP_SERVER_KEYS = {"headers", "http2"}  # exporter-toolkit's http_server_config
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token


class BasicAuth:
    """Checks `Authorization: Basic ...` against bcrypt hashes, caching verdicts: a bcrypt
    check costs ~50-200 ms and Prometheus sends the same credentials every scrape."""

    _CACHE_SIZE = 1024

    def __init__(self, users: dict[str, bytes]):
        try:
            import bcrypt
        except ImportError:
            raise ConfigError(
                "basic_auth_users needs the bcrypt package: pip install 'fleetscope[auth]'"
            ) from None
        self._bcrypt = bcrypt
        self._users = users
        self._cache: dict[bytes, bool] = {}
        self._lock = threading.Lock()

    def check(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user_bytes, sep, password = decoded.partition(b":")
        if not sep:
            return False
        user = user_bytes.decode("utf-8", "replace")
        key = hashlib.sha256(user_bytes + b"\0" + password).digest()
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        hashed = self._users.get(user)
        try:
            ok = self._bcrypt.checkpw(password, hashed or _DUMMY_HASH) and hashed is not None
        except ValueError:
            ok = False
        with self._lock:
            if len(self._cache) >= self._CACHE_SIZE:
                self._cache.clear()
            self._cache[key] = ok
        return ok


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _tls_context(raw: dict, base_dir: str) -> ssl.SSLContext:
    unknown = set(raw) - _TLS_KEYS
    if unknown:
        raise ConfigError(f"tls_server_config: unknown keys {', '.join(sorted(unknown))}")
    if not raw.get("cert_file") or not raw.get("key_file"):
        raise ConfigError("tls_server_config needs cert_file and key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert = os.path.join(base_dir, str(raw["cert_file"]))
    key = os.path.join(base_dir, str(raw["key_file"]))
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"cannot load TLS certificate {cert} / key {key}: {err}") from None
    for name, attribute, default in (
        ("min_version", "minimum_version", "TLS12"),
        ("max_version", "maximum_version", None),
    ):
        value = raw.get(name, default)
        if value is None:
            continue
        if value not in _TLS_VERSIONS:
            raise ConfigError(f"tls_server_config.{name} must be one of {', '.join(_TLS_VERSIONS)}")
        setattr(context, attribute, _TLS_VERSIONS[value])
    auth_type = raw.get("client_auth_type", "NoClientCert")
    if auth_type not in _CLIENT_AUTH:
        raise ConfigError(
            f"tls_server_config.client_auth_type {auth_type!r} is not supported; "
            f"use one of {', '.join(_CLIENT_AUTH)}"
        )
    context.verify_mode = _CLIENT_AUTH[auth_type]
    if context.verify_mode != ssl.CERT_NONE:
        if not raw.get("client_ca_file"):
            raise ConfigError(f"client_auth_type {auth_type} needs client_ca_file")
        ca = os.path.join(base_dir, str(raw["client_ca_file"]))
        try:
            context.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"cannot load client CA {ca}: {err}") from None
    return context


def load_web_config(path: str) -> WebConfig:
    try:
        raw = yaml.safe_load(read_named_file(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read web config {path}: {err.strerror or err}") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise ConfigError(f"web config {path} is not valid YAML") from None
    except RecursionError:
        raise ConfigError(f"web config {path} is nested too deeply: refused") from None
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"web config {path} must be a YAML mapping")
    unknown = set(raw) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise ConfigError(f"web config: unknown keys {', '.join(sorted(map(str, unknown)))}")
    base_dir = os.path.dirname(os.path.abspath(path))
    web = WebConfig()
    if raw.get("tls_server_config"):
        if not isinstance(raw["tls_server_config"], dict):
            raise ConfigError("tls_server_config must be a mapping")
        web.tls = _tls_context(raw["tls_server_config"], base_dir)
    users = raw.get("basic_auth_users") or {}
    if not isinstance(users, dict) or not all(isinstance(u, str) for u in users):
        raise ConfigError("basic_auth_users must map user names to bcrypt hashes ($2b$...)")
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise ConfigError("basic_auth_users must map user names to bcrypt hashes: the "
                              f"hash of {user[:40]!r} is malformed ($2b$NN$ and 53 characters; "
                              "htpasswd -nBC 10 USER makes one)")
    if users:
        # bcrypt (pyca) verifies $2b$; $2a$ and $2y$ hashes (htpasswd -B) are the same scheme.
        web.auth = BasicAuth({u: b"$2b$" + h[4:].encode() for u, h in users.items()})
    server_config = raw.get("http_server_config") or {}
    if not isinstance(server_config, dict):
        raise ConfigError("http_server_config must be a mapping")
    unknown = set(server_config) - _HTTP_SERVER_KEYS
    if unknown:
        raise ConfigError("http_server_config: unknown keys "
                          f"{', '.join(sorted(map(str, unknown)))} (known: headers, http2)")
    headers = server_config.get("headers") or {}
    if not isinstance(headers, dict):
        raise ConfigError("http_server_config.headers must be a mapping")
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise ConfigError(f"http_server_config.headers: {str(name)[:40]!r} is not a "
                              "header name")
        if not isinstance(value, (str, int, float)) or any(
                c in str(value) for c in "\r\n\0"):
            raise ConfigError(f"http_server_config.headers.{name}: the value must be one line "
                              "of text (CR, LF and NUL would split the response)")
    web.headers = {str(k): str(v) for k, v in headers.items()}
    return web
