"""``--web.config.file``: TLS and basic auth for the daemons' HTTP servers, in the
format of Prometheus' exporter-toolkit (node_exporter, dcgm-exporter)::

    tls_server_config:
      cert_file: /etc/rank-watchdog/tls/server.crt
      key_file: /etc/rank-watchdog/tls/server.key
      client_ca_file: /etc/rank-watchdog/tls/ca.crt   # optional: require client certificates
      min_version: TLS12                              # optional
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')

Basic auth guards ``/metrics`` only: health probes carry no credentials, and the
coordinator's report and status API keep their bearer token. Hashes are checked
with ``bcrypt`` (an optional dependency: ``pip install bcrypt``), each result
cached so a scrape costs one hash per new password, not per request. The file is
YAML (JSON works too, without PyYAML). Every mistake is a ``WebConfigError``
naming the file, raised at start.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import importlib
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from watchdog.flags import Flag

FLAG = "web.config.file"
VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


class WebConfigError(ValueError):
    pass


def flag() -> Flag:
    return Flag(
        FLAG,
        "",
        "exporter-toolkit web config (YAML): TLS certificate and key, basic auth users for /metrics",
        field="web_config",
    )


@dataclass(frozen=True)
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    _ok: dict[tuple[str, bytes], bool] = field(default_factory=dict, compare=False, repr=False)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    def allowed(self, authorization: str) -> bool:
        """Whether an ``Authorization`` header passes basic auth (always, without users)."""
        if not self.users:
            return True
        scheme, _, cred = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(cred.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if not sep or hashed is None:
            return False
        key = (user, hmac.digest(hashed, password.encode("utf-8"), "sha256"))  # never the password itself
        ok = self._ok.get(key)
        if ok is None:
            bcrypt = importlib.import_module("bcrypt")  # found by load(), or there are no users
            ok = self._ok[key] = bool(bcrypt.checkpw(password.encode("utf-8"), hashed))
            while len(self._ok) > 64:
                del self._ok[next(iter(self._ok))]
        return ok


def _parse(text: str, path: str) -> Any:
    try:
        import yaml
    except ImportError:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise WebConfigError(f"{path}: not JSON, and PyYAML is not installed to read YAML: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not valid YAML: {exc}") from None


def load(path: str) -> WebConfig:
    """The config in ``path``; "" = plain HTTP, no auth."""
    if not path:
        return WebConfig()
    try:
        with open(path, encoding="utf-8") as fh:
            doc = _parse(fh.read(), path) or {}
    except OSError as exc:
        raise WebConfigError(f"--{FLAG}={path}: {exc.strerror or exc}") from None
    if not isinstance(doc, dict):
        raise WebConfigError(f"{path}: expected a mapping at the top")
    unknown = set(doc) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise WebConfigError(f"{path}: unknown key(s) {sorted(unknown)}")
    return WebConfig(
        ssl_context=_tls(doc.get("tls_server_config"), path), users=_users(doc.get("basic_auth_users"), path)
    )


def _tls(tls: Any, path: str) -> ssl.SSLContext | None:
    if not tls:
        return None
    if not isinstance(tls, dict) or not tls.get("cert_file") or not tls.get("key_file"):
        raise WebConfigError(f"{path}: tls_server_config needs cert_file and key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.get("min_version"):
        if tls["min_version"] not in VERSIONS:
            raise WebConfigError(f"{path}: min_version {tls['min_version']!r}; one of {', '.join(VERSIONS)}")
        ctx.minimum_version = VERSIONS[tls["min_version"]]
    try:
        ctx.load_cert_chain(tls["cert_file"], tls["key_file"])
        if tls.get("client_ca_file"):
            ctx.load_verify_locations(tls["client_ca_file"])
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"{path}: cannot load the certificate, key or CA: {exc}") from None
    return ctx


def _users(users: Any, path: str) -> dict[str, bytes]:
    if not users:
        return {}
    if not isinstance(users, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in users.items()):
        raise WebConfigError(f"{path}: basic_auth_users must map user names to bcrypt hashes")
    try:
        importlib.import_module("bcrypt")
    except ImportError:
        raise WebConfigError(f"{path}: basic_auth_users needs bcrypt (pip install bcrypt)") from None
    for user, hashed in users.items():
        if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{path}: basic_auth_users.{user} is not a bcrypt hash")
    return {u: h.encode("ascii") for u, h in users.items()}


def client_context(ca_file: str) -> ssl.SSLContext | None:
    """For a client of an https daemon: the system's CAs, or ``ca_file``'s."""
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"CA file {ca_file}: {exc}") from None
