"""Real images without Docker: built from their Dockerfiles, pushed to the dev registry, served by digest.

What a real node's containerd will do is pull `<gateway>:<port>/nodegate/<name>@sha256:...`; these
tests pull the same digests back from the registry with skopeo (over 127.0.0.1, the same server),
unpack them with umoci and look inside: the package's files, and NodeGate's image running
`nodegate version` in its own root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import gate

if TYPE_CHECKING:
    from gate.devcluster.cluster import DevCluster

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("buildah", "debootstrap", "chroot", "skopeo", "umoci")
PACKAGE = "sysctl-tuning"


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the real-image tier needs root (debootstrap, chroot, buildah with vfs storage)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"the real-image tier needs {', '.join(missing)} (hack/install-realnode-deps.sh installs them)"
    return None


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=_unavailable() or "")


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _manifest(port: int, repository: str, reference: str) -> tuple[bytes, str]:
    from gate.devcluster.registry import MANIFEST_TYPES

    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/{repository}/manifests/{reference}",
                                     headers={"Accept": ", ".join(MANIFEST_TYPES)})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.read(), resp.headers["Docker-Content-Digest"]


def _pull_and_unpack(port: int, repository: str, digest: str, work: Path) -> Path:
    """The image the registry serves for `digest`, unpacked: returns its root filesystem."""
    work.mkdir(parents=True)
    layout = work / "layout"
    for cmd in (["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                 f"docker://127.0.0.1:{port}/{repository}@{digest}", f"oci:{layout}:pulled"],
                ["umoci", "unpack", "--image", f"{layout}:pulled", str(work / "bundle")]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(cmd)}: {done.stderr}"
    return work / "bundle" / "rootfs"


def test_images_are_built_from_their_dockerfiles_pushed_and_served_by_digest(
        cluster: DevCluster, tmp_path: Path) -> None:
    from gate.devcluster.images import ensure_images, package_identity, parse_references
    from gate.devcluster.network import gateway_ip
    from gate.devcluster.registry import start_registry

    host = gateway_ip(cluster.dir)
    only = ("nodegate", PACKAGE)
    started = time.monotonic()
    refs = ensure_images(cluster, host=host, only=only, progress=_progress)
    first = time.monotonic() - started
    started = time.monotonic()
    again = ensure_images(cluster, host=host, only=only, progress=_progress)
    warm = time.monotonic() - started
    print(f"\nimages {', '.join(only)}: first ensure_images {first:.1f}s (cold when the cache was empty), "
          f"warm {warm:.1f}s", file=sys.stderr)
    assert again == refs, "an unchanged tree must build nothing new and hand out the same digests"

    port = cluster.ports()["registry"]
    assert start_registry(cluster, _progress) == port, "a running registry is reused"
    _, version = package_identity(REPO / "packages" / PACKAGE / "package.yaml")
    for name, tag in (("nodegate", gate.__version__), (PACKAGE, version)):
        prefix = f"{host}:{port}/nodegate/{name}@sha256:"
        assert refs[name].startswith(prefix), refs[name]
        digest = refs[name].split("@", 1)[1]
        body, served = _manifest(port, f"nodegate/{name}", tag)
        assert served == digest, f"{name}:{tag} is served as {served}, ensure_images said {digest}"
        assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
        assert json.loads(body)["mediaType"] in ("application/vnd.oci.image.manifest.v1+json",
                                                 "application/vnd.docker.distribution.manifest.v2+json")
        by_digest, _ = _manifest(port, f"nodegate/{name}", digest)
        assert by_digest == body

    package_root = _pull_and_unpack(port, f"nodegate/{PACKAGE}", refs[PACKAGE].split("@", 1)[1], tmp_path / "pkg")
    assert (package_root / "nodegate-package/package.yaml").read_bytes() == \
        (REPO / "packages" / PACKAGE / "package.yaml").read_bytes()
    assert (package_root / "nodegate-package/root/etc/sysctl.d").is_dir()
    # The operator's init container runs `cp -a /nodegate-package/. /nodegate-payload/` in this image.
    copied = subprocess.run(["chroot", str(package_root), "cp", "-a", "/nodegate-package/.", "/payload/"],
                            capture_output=True, text=True, timeout=60)
    assert copied.returncode == 0, copied.stderr
    assert (package_root / "payload/package.yaml").is_file()

    nodegate_root = _pull_and_unpack(port, "nodegate/nodegate", refs["nodegate"].split("@", 1)[1], tmp_path / "ng")
    chroot = shutil.which("chroot") or "chroot"
    ran = subprocess.run([chroot, str(nodegate_root), "/opt/nodegate/bin/nodegate", "version"],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/opt/nodegate/bin:/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"nodegate {gate.__version__}"

    # `nodegate dev images` prints NAME=REFERENCE for NodeGate and every package, nothing else on stdout.
    cli = subprocess.run([sys.executable, "-m", "gate.cli.main", "dev", "images", "--state-dir", str(cluster.dir)],
                         capture_output=True, text=True, timeout=1800, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert cli.returncode == 0, cli.stderr[-3000:]
    printed = parse_references(cli.stdout)
    packages = {p.parent.name for p in (REPO / "packages").glob("*/Dockerfile")}
    assert set(printed) == {"nodegate", *packages}
    assert cli.stdout.splitlines()[0].startswith("nodegate=")
    assert {name: printed[name] for name in only} == refs
