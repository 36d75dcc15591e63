"""A real OCI registry on this machine: distribution's registry, the one the real nodes pull from.

No registry outside this machine is reachable here, and importing images into each node's containerd
by hand would skip the part that matters (containerd resolving a reference and pulling it). So the
dev cluster runs distribution's `registry` (built from the Go module proxy, pinned in versions.toml)
as one of its processes, so `nodegate dev down` stops it with the rest.

Decisions:

* Storage is the filesystem under the cache (`<cache>/registry/data`), not the state directory: a
  blob pushed once survives `dev down` and serves the next cluster, so a warm start pushes nothing
  new. Two registries on one machine may share it: blobs are content-addressed and written by rename.
* It listens on `0.0.0.0:<free port>` without TLS. The real nodes live in their own network
  namespaces behind the dev cluster's bridge and reach it at the gateway address
  (`network.gateway_ip`); their containerd is configured for plain HTTP to that one host.
  This machine reaches it on 127.0.0.1, which buildah and skopeo treat as insecure only when told so
  (`--tls-verify=false`).
* Tracing is off (`OTEL_TRACES_EXPORTER=none`): distribution v3 otherwise exports spans to an OTLP
  collector on localhost that does not exist, and logs every failure.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gate.devcluster import build
from gate.devcluster.processes import ClusterError, ProcessTable, free_port, tail

Progress = Callable[[str], None]

PROCESS = "registry"
# Accepted manifest media types: what buildah pushes (OCI by default) and what docker clients push.
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


def data_dir() -> Path:
    """Where pushed blobs live, across clusters (the registry's filesystem storage)."""
    return build.cache_root() / "registry" / "data"


def registry_config(port: int, storage: Path, secret: str) -> dict[str, Any]:
    """distribution's configuration (version 0.1) for a plain-HTTP registry on every address."""
    return {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": True}},  # info logs each request
        "storage": {
            "filesystem": {"rootdirectory": str(storage)},
            "delete": {"enabled": True},
            "cache": {"blobdescriptor": "inmemory"},
            # Upload purging walks the whole storage at start and every 24 h; a dev registry does not
            # live long enough for stale uploads to matter.
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {
            "addr": f"0.0.0.0:{port}",
            # Signs upload state between requests; random per start (a restart abandons open uploads).
            "secret": secret,
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
        "health": {"storagedriver": {"enabled": False}},
    }


def registry_argv(binary: Path, config: Path) -> list[str]:
    return [str(binary), "serve", str(config)]


def _v2_ok(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:  # refused, reset, or an HTTP error status
        return False


def running_port(procs: ProcessTable) -> int | None:
    """The port of this cluster's registry when it runs and answers `GET /v2/`, else None."""
    return procs.running_port(PROCESS, _v2_ok)


def start_registry(procs: ProcessTable, progress: Progress = print, *, timeout: float = 30.0) -> int:
    """Start the cluster's registry (or reuse the running one) as a process of `procs` (a
    `DevCluster.procs`) and return its port.

    Builds the registry binary first when the cache lacks it. Returns once `GET /v2/` answers 200.
    """
    if (port := running_port(procs)) is not None:
        return port
    if PROCESS in procs.all():
        procs.stop(PROCESS)  # recorded but dead or not answering: start it afresh
    binary = build.ensure_built(("registry",), progress=progress)["registry"]
    storage = data_dir()
    storage.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = procs.dir / "registry.yml"
    config.write_text(yaml.safe_dump(registry_config(port, storage, secrets.token_hex(16)), sort_keys=False))
    progress(f"Starting the image registry on port {port} (storage {storage}) ...")
    proc = procs.register(PROCESS, registry_argv(binary, config), env={"OTEL_TRACES_EXPORTER": "none"})
    procs.set_port(PROCESS, port)
    deadline = time.monotonic() + timeout
    while not _v2_ok(port):
        if not proc.alive():
            raise ClusterError(f"the registry exited during start-up; last lines of {proc.log}:\n"
                               f"{tail(Path(proc.log))}")
        if time.monotonic() > deadline:
            raise ClusterError(f"the registry did not answer GET /v2/ within {timeout:.0f}s; see {proc.log}")
        time.sleep(0.1)
    return port


def manifest_digest(port: int, repository: str, reference: str) -> str:
    """The `Docker-Content-Digest` the registry serves for `repository:reference` (a HEAD request)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/{repository}/manifests/{reference}",
        method="HEAD", headers={"Accept": ", ".join(MANIFEST_TYPES)},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        digest = resp.headers.get("Docker-Content-Digest")
    if not digest:
        raise ClusterError(f"the registry served {repository}:{reference} without a Docker-Content-Digest")
    return str(digest)


def catalog(port: int) -> list[str]:
    """The repositories the registry holds."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/_catalog", timeout=10) as resp:
        return list(json.load(resp).get("repositories") or [])



def _call(port: int, path: str, method: str = "GET", body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}" if path.startswith("/") else path,
                                     data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status), dict(resp.headers), resp.read()


def put_blob(port: int, repository: str, data: bytes) -> str:
    """Upload `data` as a blob of `repository` (a monolithic upload: POST, then PUT with the digest);
    return its digest."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _, headers, _ = _call(port, f"/v2/{repository}/blobs/uploads/", "POST", b"")
    location = urllib.parse.urljoin(f"http://127.0.0.1:{port}", headers["Location"])
    separator = "&" if "?" in location else "?"
    _call(port, f"{location}{separator}digest={digest}", "PUT", data, {"Content-Type": "application/octet-stream"})
    return digest


def put_manifest(port: int, repository: str, reference: str, body: bytes,
                 media_type: str = MANIFEST_TYPES[0]) -> str:
    """Put a manifest under `reference` (a tag or its digest); return the digest the registry names."""
    _, headers, _ = _call(port, f"/v2/{repository}/manifests/{reference}", "PUT", body, {"Content-Type": media_type})
    return str(headers["Docker-Content-Digest"])


def get_manifest(port: int, repository: str, reference: str) -> bytes:
    """The body of the manifest under `reference` (a tag or a digest)."""
    return _call(port, f"/v2/{repository}/manifests/{reference}", headers={"Accept": ", ".join(MANIFEST_TYPES)})[2]


def get_blob(port: int, repository: str, digest: str) -> bytes:
    return _call(port, f"/v2/{repository}/blobs/{digest}")[2]


def push_small_image(port: int, repository: str, tag: str, content: str) -> str:
    """A tiny image (an OCI manifest over a config blob holding `content`, no layers) under `tag`; return
    its manifest digest. For tests that need images a registry serves, without building any."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {"content": content}},
                         "rootfs": {"type": "layers", "diff_ids": []}}, sort_keys=True).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_TYPES[0],
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": put_blob(port, repository, config), "size": len(config)},
                           "layers": []}).encode()
    return put_manifest(port, repository, tag, manifest)
