"""The Prometheus endpoints the operator may ask: the installer's, by name, from one file.

A DeploymentPolicy's health signal names an endpoint (`health.prometheus.endpoint: main`); the address,
its TLS and its credentials are the installer's, in the file the setting `prometheus_endpoints` names
(the chart renders it from `operator.health.prometheus.endpoints` into a ConfigMap and mounts the
Secrets it refers to beside it):

```yaml
main:
  url: https://prometheus.monitoring:9090     # http or https; the API is <url>/api/v1/query
  caFile: /etc/nodegate/prometheus/main/ca.crt   # optional: trust this CA (else the system's)
  insecureSkipVerify: false                   # optional: no certificate check at all
  bearerTokenFile: /etc/nodegate/prometheus/main/token   # optional: sent as Authorization: Bearer
```

Decisions:

* **A name the file does not hold is never asked.** There is no fallback to an address: the policy
  writer chooses a name, never where a query goes (docs/security.md).
* **Read again when it changes** (its modification time and size, looked at on each use): a ConfigMap
  mounted as a volume changes in place, and `nodegate dev up` writes the session's endpoints after the
  operator started. A file that no longer parses keeps the last good endpoints, and the log says why.
* **The token is read at each query**, so a rotated Secret takes effect without a restart.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

log = logging.getLogger("nodegate.operator")

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class PrometheusEndpoint:
    name: str
    url: str
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    bearer_token_file: str | None = None

    def ssl(self) -> ssl.SSLContext | bool:
        """What aiohttp's `ssl=` takes for this endpoint: the default checks, a CA of its own, or none."""
        if self.insecure_skip_verify:
            return False
        if self.ca_file:
            return ssl.create_default_context(cafile=self.ca_file)
        return True

    def headers(self) -> dict[str, str]:
        """The bearer token, read now (a rotated Secret's new token at the next query)."""
        if not self.bearer_token_file:
            return {}
        token = Path(self.bearer_token_file).read_text().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}


def parse_endpoints(data: Any) -> dict[str, PrometheusEndpoint]:
    """The endpoints a file's YAML holds; ValueError naming the entry and the key when one is wrong."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError("the Prometheus endpoints file must hold a mapping of name to endpoint")
    out: dict[str, PrometheusEndpoint] = {}
    for name, entry in data.items():
        if not isinstance(name, str) or not _NAME.match(name) or len(name) > 63:
            raise ValueError(f"endpoint name {name!r}: lowercase letters, digits and '-', at most 63")
        if not isinstance(entry, Mapping):
            raise ValueError(f"endpoint {name}: a mapping with url (and caFile, insecureSkipVerify, bearerTokenFile)")
        unknown = set(entry) - {"url", "caFile", "insecureSkipVerify", "bearerTokenFile"}
        if unknown:
            raise ValueError(f"endpoint {name}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        url = entry.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if not isinstance(url, str) or parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {name}: url must be an http(s) URL with a host, not {url!r}")
        skip = entry.get("insecureSkipVerify", False)
        if not isinstance(skip, bool):
            raise ValueError(f"endpoint {name}: insecureSkipVerify must be true or false")
        files = {key: entry.get(key) for key in ("caFile", "bearerTokenFile")}
        for key, value in files.items():
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"endpoint {name}: {key} must be a path")
        out[name] = PrometheusEndpoint(name=name, url=url.rstrip("/"), ca_file=files["caFile"],
                                       insecure_skip_verify=skip, bearer_token_file=files["bearerTokenFile"])
    return out


class EndpointBook:
    """The endpoints of the file `path` (none without one), as of its last readable version."""

    def __init__(self, path: str | None = None) -> None:
        self.path = Path(path) if path else None
        self._stamp: tuple[int, int] | None = None
        self._endpoints: dict[str, PrometheusEndpoint] = {}

    def _refresh(self) -> None:
        if self.path is None:
            return
        try:
            stat = os.stat(self.path)
        except OSError:
            stamp = None
        else:
            stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        if stamp is None:
            if self._endpoints:
                log.warning("Prometheus endpoints file is gone; path=%s endpoints=none", self.path)
            self._endpoints = {}
            return
        try:
            self._endpoints = parse_endpoints(yaml.safe_load(self.path.read_text()))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            log.error("Prometheus endpoints file not read, the last good one is kept; path=%s error=%s",
                      self.path, exc)
            return
        log.info("Read the Prometheus endpoints; path=%s endpoints=%s", self.path,
                 ",".join(sorted(self._endpoints)) or "none")

    def get(self, name: str) -> PrometheusEndpoint | None:
        self._refresh()
        return self._endpoints.get(name)

    def names(self) -> frozenset[str]:
        self._refresh()
        return frozenset(self._endpoints)


__all__ = ["EndpointBook", "PrometheusEndpoint", "parse_endpoints"]
