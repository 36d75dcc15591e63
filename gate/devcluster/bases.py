"""Local stand-ins for the public base images NodeGate's Dockerfiles name, assembled from Debian.

No container registry is reachable here, but Debian's archive is. So the two public bases are
replaced by images committed from one cached Debian bookworm root (`rootfs.ensure_root`):

* `FROM python:3.11-slim-bookworm` -> `localhost/nodegate-base/python:3.11-bookworm`: Debian bookworm
  minbase plus python3 (3.11), python3-venv, python-is-python3 and ca-certificates;
* `FROM busybox:1.37` -> `localhost/nodegate-base/busybox:1.35-bookworm`: `/bin/busybox` of Debian's
  busybox-static (1.35) and a link per applet.

The busybox base is named for what it holds, 1.35, not for the 1.37 it replaces: package images only
need `cp -a` from it (the operator's init container copies the payload out), which both provide.

Unlike python:3.11-slim (Python built into /usr/local), the Python base runs Debian's own python3.11
from /usr/bin. It trusts this machine's CA bundle (copied into the root) and points pip at it
(`PIP_CERT` and /etc/pip.conf): HTTPS from a build step goes through the same proxy as this
machine's own, and pip would otherwise trust only its bundled certifi.

A base is rebuilt only when what it is made of changes: a label on it carries a digest of the root's
fingerprint and of the recipe (`RECIPE`), and a changed package list or recipe rebuilds it in place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gate.devcluster.build import BuildError
from gate.devcluster.buildah import Buildah, buildah_dir, locked, require_tools
from gate.devcluster.rootfs import RootSpec, ensure_root

Progress = Callable[[str], None]

# One debootstrapped root serves both bases (one debootstrap per machine instead of two).
ROOT = RootSpec("image-base", "bookworm", ("ca-certificates", "python3", "python3-venv", "python-is-python3",
                                            "busybox-static"))
# Bumped when the way a base is assembled from the root changes (what is trimmed, its config).
RECIPE = "1"
FINGERPRINT_LABEL = "io.nodegate.base.fingerprint"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Trimmed from the Python base: documentation and translations nothing in an image reads.
TRIMMED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
           "var/cache/debconf/templates.dat-old")


@dataclass(frozen=True)
class LocalBase:
    public: str  # what Dockerfiles name
    repository: str  # the local image, without its tag
    version: str  # the human part of the tag
    made_of: str  # one line for the docs and progress

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.version}"


PYTHON = LocalBase("python:3.11-slim-bookworm", "localhost/nodegate-base/python", "3.11-bookworm",
                   "Debian bookworm minbase + python3 3.11, python3-venv, python-is-python3")
BUSYBOX = LocalBase("busybox:1.37", "localhost/nodegate-base/busybox", "1.35-bookworm",
                    "Debian bookworm's busybox-static 1.35: /bin/busybox and a link per applet")
BASES = (PYTHON, BUSYBOX)


def from_map() -> dict[str, str]:
    """Public base reference -> the local image that stands in for it (for `dockerfile.base_overrides`)."""
    return {base.public: base.image for base in BASES}


def fingerprint(base: LocalBase) -> str:
    return hashlib.sha256(f"{ROOT.fingerprint}\0{RECIPE}\0{base.public}\0{base.image}".encode()).hexdigest()[:16]


def ensure_bases(progress: Progress = print) -> dict[str, str]:
    """Build whichever local base is missing or stale; return public reference -> local image id."""
    require_tools("building the local base images", ("chroot",))
    if os.geteuid() != 0:
        raise BuildError("building the local base images needs root (debootstrap, chroot, buildah with vfs)")
    log = buildah_dir() / "logs" / "bases.log"
    tool = Buildah(log)
    ids: dict[str, str] = {}
    with locked(progress):
        stale = [b for b in BASES if _label(tool, b) != fingerprint(b)]
        if stale:
            root = ensure_root(ROOT, progress)
            log.write_text("")
            for base in stale:
                started = time.monotonic()
                progress(f"Assembling the local base {base.image} ({base.made_of}; stands in for {base.public}) ...")
                _commit(tool, base, root)
                progress(f"  {base.image} in {time.monotonic() - started:.0f}s")
        for base in BASES:
            image_id = tool.image_id(base.image)
            if image_id is None:
                raise BuildError(f"the local base {base.image} is missing after it was built; see {log}")
            ids[base.public] = image_id
    return ids


def _label(tool: Buildah, base: LocalBase) -> str | None:
    found = tool.quiet("inspect", "--type", "image", "--format",
                       f'{{{{index .OCIv1.Config.Labels "{FINGERPRINT_LABEL}"}}}}', base.image)
    return found.stdout.strip() or None if found.returncode == 0 else None


def _commit(tool: Buildah, base: LocalBase, root: Path) -> None:
    container = tool.last_line(tool.run("from", "--pull=never", "scratch", what=f"buildah from scratch ({base.image})"))
    try:
        mount = Path(tool.last_line(tool.run("mount", container, what=f"buildah mount ({base.image})")))
        if base is PYTHON:
            _fill_python(root, mount)
            config = ["--env", f"PATH={PATH}", "--env", "LANG=C.UTF-8", "--env", f"PIP_CERT={CA_BUNDLE}",
                      "--cmd", "python3"]
        else:
            _fill_busybox(root, mount)
            config = ["--env", f"PATH={PATH}", "--cmd", "sh"]
        tool.run("config", *config, "--label", f"{FINGERPRINT_LABEL}={fingerprint(base)}",
                 "--label", f"io.nodegate.base.stands-in-for={base.public}", container,
                 what=f"buildah config ({base.image})")
        tool.run("umount", container, what=f"buildah umount ({base.image})")
        tool.run("commit", "--rm", container, base.image, what=f"buildah commit {base.image}")
    except BaseException:
        tool.quiet("rm", container)
        raise


def _fill_python(root: Path, mount: Path) -> None:
    # cp -a keeps owners, modes, hard links and special files, which a Python copy would not all keep.
    subprocess.run(["cp", "-a", f"{root}/.", f"{mount}/"], check=True, capture_output=True)
    (mount / ".nodegate-root").unlink(missing_ok=True)
    for rel in TRIMMED:
        target = mount / rel
        if target.is_dir():
            shutil.rmtree(target)
            target.mkdir()
        elif target.exists():
            target.unlink()
    (mount / "etc/pip.conf").write_text(f"[global]\ncert = {CA_BUNDLE}\n")


def _fill_busybox(root: Path, mount: Path) -> None:
    busybox = root / "bin/busybox"
    listed = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True)
    for rel in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "var", "tmp"):
        (mount / rel).mkdir(parents=True, exist_ok=True)
    (mount / "tmp").chmod(0o1777)
    shutil.copy2(busybox, mount / "bin/busybox")
    for applet in listed.stdout.split():
        link = mount / applet
        if applet == "bin/busybox" or link.exists():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
    (mount / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                      "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    (mount / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
