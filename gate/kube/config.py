"""Where the API server is and how to authenticate to it: a `Connection`.

Two sources:

* **In a pod** (`in_cluster`): the ServiceAccount's projected token, the cluster CA and
  `KUBERNETES_SERVICE_HOST`/`_PORT`, read here. The token file is read again once a minute, as
  client-go does: the kubelet rotates a bound token long before it expires, and a file read is cheap.
  NodeGate's image (webhook, operator, hook, agent) needs nothing else, so it does not carry the
  `kubernetes` package (about 125 MB of generated clients, of which NodeGate uses the loader alone).
* **A kubeconfig** (`from_kubeconfig`): everything kubeconfigs can say (client certificates, tokens,
  exec plugins and their refresh) is `kubernetes.aio`'s loader, imported only here, when a kubeconfig
  is asked for: the CLI on a laptop and the dev cluster's out-of-cluster processes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0

TokenSource = Callable[[], Awaitable[str | None]]


class ConfigError(RuntimeError):
    """No usable configuration; the message says what is missing."""


async def _no_token() -> str | None:
    return None


@dataclass(frozen=True)
class Connection:
    """The API server's URL, the trust and the credentials of one identity. `authorization` gives the
    value of the Authorization header for the next request (None: none), refreshed as its source
    needs."""

    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    authorization: TokenSource = field(default=_no_token, compare=False)

    def with_bearer(self, token: str) -> Connection:
        """The same server and trust, authenticated by `token` alone (e.g. from a TokenRequest)."""
        header = f"Bearer {token}"

        async def fixed() -> str | None:
            return header

        return Connection(self.host, ca_file=self.ca_file, authorization=fixed)


class _TokenFile:
    """A token file read again when older than `every` seconds (a rotated projected token)."""

    def __init__(self, path: Path, every: float = TOKEN_REREAD_SECONDS) -> None:
        self.path = path
        self.every = every
        self._value: str | None = None
        self._read_at = float("-inf")

    async def __call__(self) -> str | None:
        now = time.monotonic()
        if self._value is None or now - self._read_at >= self.every:
            try:
                token = self.path.read_text().strip()
            except OSError as exc:
                if self._value is None:
                    raise ConfigError(f"cannot read the ServiceAccount token {self.path}: {exc}") from exc
                token = self._value[len("Bearer "):]  # keep the last one; the kubelet is writing the file
            self._value, self._read_at = f"Bearer {token}", now
        return self._value


def in_cluster(environ: dict[str, str] | None = None, directory: Path = SERVICE_ACCOUNT_DIR) -> Connection:
    """The pod's ServiceAccount, as every in-cluster client finds it."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token, ca = directory / "token", directory / "ca.crt"
    for path in (token, ca):
        if not path.is_file():
            raise ConfigError(f"in a pod without a ServiceAccount token: {path} is missing "
                              "(automountServiceAccountToken: false?)")
    server = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return Connection(f"https://{server}:{port}", ca_file=str(ca), authorization=_TokenFile(token))


async def from_kubeconfig(path: str | None = None, context: str | None = None) -> Connection:
    """A kubeconfig's cluster and user (`path` None: $KUBECONFIG or ~/.kube/config), by `kubernetes.aio`."""
    try:
        from kubernetes.aio import config as kconfig
        from kubernetes.aio.client import Configuration
    except ImportError as exc:  # NodeGate's image: in a pod, the ServiceAccount is the way
        raise ConfigError("reading a kubeconfig needs the Python package `kubernetes`, which NodeGate's image "
                          "does not carry; in a pod NodeGate uses its ServiceAccount (no --kubeconfig)") from exc
    cfg = Configuration()
    await kconfig.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=path, context=context, client_configuration=cfg, persist_config=False)

    async def authorization() -> str | None:
        # kubernetes.aio keeps kubeconfig and exec-plugin tokens under "BearerToken", already prefixed,
        # and refreshes an exec plugin's token in this call when it expires.
        token = await cfg.get_api_key_with_prefix("BearerToken")
        return str(token) if token else None

    return Connection(cfg.host, ca_file=cfg.ssl_ca_cert, cert_file=cfg.cert_file, key_file=cfg.key_file,
                      verify=bool(cfg.verify_ssl), authorization=authorization)


__all__ = ["ConfigError", "Connection", "from_kubeconfig", "in_cluster"]
