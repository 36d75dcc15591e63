"""Real images without Docker: built from their Dockerfiles, pushed to the dev registry, served by digest.

What a real node's containerd will do is pull `<gateway>:<port>/nodegate/<name>@sha256:...`; these
tests pull the same digests back from the registry with skopeo (over 127.0.0.1, the same server),
unpack them with umoci and look inside: the package's files, and NodeGate's image running
`nodegate version --client` in its own root.
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import gate

if TYPE_CHECKING:
    from gate.devcluster.cluster import DevCluster

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("buildah", "debootstrap", "chroot", "skopeo", "umoci")
PACKAGE = "sysctl-tuning"
ONLY = ("nodegate", PACKAGE)
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the real-image tier needs root (debootstrap, chroot, buildah with vfs storage)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"the real-image tier needs {', '.join(missing)} (hack/install-realnode-deps.sh installs them)"
    return None


pytestmark = [
    pytest.mark.skipif(_unavailable() is not None, reason=_unavailable() or ""),
    # Whichever test comes first builds: from a cold cache that debootstraps a root and pip-installs
    # NodeGate, minutes on two busy cores.
    pytest.mark.timeout(1500),
]


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


@dataclass(frozen=True)
class Pushed:
    refs: dict[str, str]
    again: dict[str, str]
    port: int
    host: str


@pytest.fixture(scope="module")
def pushed(cluster: DevCluster) -> Pushed:
    """NodeGate's image and one package's, built and pushed twice: the first call cold when the cache
    is empty, the second with nothing changed."""
    from gate.devcluster.images import ensure_images
    from gate.devcluster.network import gateway_ip

    host = gateway_ip(cluster.dir)
    started = time.monotonic()
    refs = ensure_images(cluster, host=host, only=ONLY, progress=_progress)
    first = time.monotonic() - started
    started = time.monotonic()
    again = ensure_images(cluster, host=host, only=ONLY, progress=_progress)
    warm = time.monotonic() - started
    print(f"\nimages {', '.join(ONLY)}: first ensure_images {first:.1f}s (cold when the cache was empty), "
          f"again {warm:.1f}s", file=sys.stderr)
    return Pushed(refs, again, cluster.ports()["registry"], host)


def _digest(ref: str) -> str:
    return ref.split("@", 1)[1]


def test_an_unchanged_tree_builds_nothing_and_hands_out_the_same_digests(pushed: Pushed, cluster: DevCluster) -> None:
    from gate.devcluster.registry import start_registry

    assert pushed.again == pushed.refs
    assert start_registry(cluster.procs, _progress) == pushed.port, "a running registry is reused"


def test_references_name_the_gateway_and_the_digest_the_registry_serves_for_the_tag(pushed: Pushed) -> None:
    from gate.devcluster.images import package_identity

    _, version = package_identity(REPO / "packages" / PACKAGE / "package.yaml")
    for name, tag in (("nodegate", gate.__version__), (PACKAGE, version)):
        assert pushed.refs[name].startswith(f"{pushed.host}:{pushed.port}/nodegate/{name}@sha256:"), pushed.refs[name]
        digest = _digest(pushed.refs[name])
        body, served = _manifest(pushed.port, f"nodegate/{name}", tag)
        # (another checkout sharing this machine's cache may push the same tag; CI has one checkout)
        assert served == digest, f"{name}:{tag} is served as {served}, ensure_images said {digest}"
        assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
        assert json.loads(body)["mediaType"] in ("application/vnd.oci.image.manifest.v1+json",
                                                 "application/vnd.docker.distribution.manifest.v2+json")
        by_digest, _ = _manifest(pushed.port, f"nodegate/{name}", digest)
        assert by_digest == body


async def test_every_pushed_image_is_signed_by_the_dev_key_the_dev_policy_trusts(pushed: Pushed) -> None:
    """`ensure_images` (what `nodegate dev images` runs) signs what it pushes with the machine's dev key:
    the operator's verifier, under the dev cluster's policy, finds each digest Verified by that key."""
    from gate.api.signatures import load_policy
    from gate.controller.signatures import SignatureVerifier
    from gate.devcluster import cosign

    public_key = cosign.dev_public_key(_progress)
    assert public_key is not None, "cosign is not built: python -m gate.devcluster.build builds it"
    here = f"127.0.0.1:{pushed.port}"
    verifier = SignatureVerifier(load_policy(cosign.dev_signature_policy([here], public_key)))
    for name in ONLY:
        digest = _digest(pushed.refs[name])
        verdict = await verifier.verify(f"{here}/nodegate/{name}", digest)
        assert (verdict.reason, verdict.key) == ("Verified", cosign.DEV_KEY_NAME), (name, verdict)


def test_the_pushed_package_image_carries_the_package_and_a_cp_for_the_init_container(
        pushed: Pushed, tmp_path: Path) -> None:
    root = _pull_and_unpack(pushed.port, f"nodegate/{PACKAGE}", _digest(pushed.refs[PACKAGE]), tmp_path / "image")
    assert (root / "nodegate-package/package.yaml").read_bytes() == \
        (REPO / "packages" / PACKAGE / "package.yaml").read_bytes()
    assert (root / "nodegate-package/root/etc/sysctl.d").is_dir()
    # The operator's init container runs `cp -a /nodegate-package/. /nodegate-payload/` in this image.
    copied = subprocess.run([CHROOT, str(root), "cp", "-a", "/nodegate-package/.", "/payload/"],
                            capture_output=True, text=True, timeout=60)
    assert copied.returncode == 0, copied.stderr
    assert (root / "payload/package.yaml").is_file()


def test_nodegate_version_runs_inside_the_pushed_nodegate_image(pushed: Pushed, tmp_path: Path) -> None:
    root = _pull_and_unpack(pushed.port, "nodegate/nodegate", _digest(pushed.refs["nodegate"]), tmp_path / "image")
    ran = subprocess.run([CHROOT, str(root), "/opt/nodegate/bin/nodegate", "version", "--client"],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/opt/nodegate/bin:/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"nodegate {gate.__version__}"


def test_dev_images_prints_a_reference_for_nodegate_and_every_package(pushed: Pushed, cluster: DevCluster) -> None:
    from gate.devcluster.images import parse_references

    cli = subprocess.run([sys.executable, "-m", "gate.cli.main", "dev", "images", "--state-dir", str(cluster.dir)],
                         capture_output=True, text=True, timeout=900, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert cli.returncode == 0, cli.stderr[-3000:]
    printed = parse_references(cli.stdout)  # stdout holds nothing but NAME=REFERENCE lines
    packages = {p.parent.name for p in (REPO / "packages").glob("*/Dockerfile")}
    assert set(printed) == {"nodegate", *packages}
    assert cli.stdout.splitlines()[0].startswith("nodegate=")
    assert {name: printed[name] for name in ONLY} == pushed.refs


def test_package_build_push_hands_out_the_image_dev_images_pushed(
        pushed: Pushed, cluster: DevCluster, capsys: pytest.CaptureFixture[str]) -> None:
    from gate.cli.main import main

    assert main(["package", "build", str(REPO / "packages" / PACKAGE), "--push", "--state-dir", str(cluster.dir)]) == 0
    assert capsys.readouterr().out == f"{PACKAGE}={pushed.refs[PACKAGE]}\n"  # same inputs: the same image


def test_package_build_builds_and_pushes_a_package_from_any_directory(
        pushed: Pushed, cluster: DevCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gate.cli.main import main
    from gate.devcluster.images import parse_references

    directory = tmp_path / "my-package"
    shutil.copytree(REPO / "packages" / PACKAGE, directory)
    manifest = directory / "package.yaml"
    manifest.write_text(manifest.read_text().replace("name: sysctl-tuning", "name: built-by-hand")
                        .replace("version: 1.0.0", "version: 0.0.1"))
    assert main(["package", "build", str(directory)]) == 0
    assert capsys.readouterr().out.startswith("localhost/nodegate/built-by-hand:")
    assert main(["package", "build", str(directory), "--push", "--state-dir", str(cluster.dir)]) == 0
    ref = parse_references(capsys.readouterr().out)["built-by-hand"]
    assert ref.startswith(f"{pushed.host}:{pushed.port}/nodegate/built-by-hand@sha256:")
    _, served = _manifest(pushed.port, "nodegate/built-by-hand", "0.0.1")
    assert served == _digest(ref)
    root = _pull_and_unpack(pushed.port, "nodegate/built-by-hand", served, tmp_path / "image")
    assert (root / "nodegate-package/package.yaml").read_bytes() == manifest.read_bytes()
