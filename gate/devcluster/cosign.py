"""Signing images with the real cosign, for the dev cluster and the tests (issue 34).

The operator verifies signatures with `cryptography` (gate.controller.signatures); this module is the
signing side, dev tooling that shells out to cosign, built from the Go module proxy into the cache
like the control plane (versions.toml `[cosign]`).

Decisions:

* **Offline and key-based.** No Rekor, Fulcio or timestamp authority is reachable here, and a cluster's
  policy trusts keys, not identities. cosign 3 otherwise fetches a signing config from the public
  Sigstore TUF repository and uploads to Rekor, so every signing passes `--use-signing-config=false
  --tlog-upload=false` (`OFFLINE_FLAGS`), and `--allow-http-registry` for the dev registry on plain
  HTTP.
* **Both formats.** cosign 3 writes a Sigstore bundle attached as an OCI referrer by default
  (`bundle`); `--new-bundle-format=false` writes the older simple-signing manifest under the tag
  `sha256-<hex>.sig` (`simplesigning`). The tests sign in both.
* **One dev key pair per machine**, in the cache (`<cache>/cosign/dev/cosign.{key,pub}`), made by
  `cosign generate-key-pair` with an empty password (`COSIGN_PASSWORD=""`): every dev cluster on the
  machine trusts the same key, and the catalog's images, pushed once into the shared registry
  storage, stay signed across clusters. It signs nothing outside this machine.
* **The dev cluster's policy** (`dev_signature_policy`) trusts that key for the dev registry's
  `nodegate/**` repositories, at every address the registry is reached on.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import yaml

from gate.api.signatures import Verdict, load_policy
from gate.controller.signatures import SignatureVerifier
from gate.devcluster import build
from gate.devcluster.build import BuildError

Progress = Callable[[str], None]
SignFormat = Literal["bundle", "simplesigning"]
COMPONENT = "cosign"
OFFLINE_FLAGS = ("--use-signing-config=false", "--tlog-upload=false")
DEV_KEY_NAME = "nodegate-dev"
DEV_RULE_NAME = "nodegate-dev-catalog"


def binary(*, build_missing: bool = False, progress: Progress = print) -> Path | None:
    """The cached cosign binary; None when it is not built (and `build_missing` is off)."""
    component = build.load_components()[COMPONENT]
    if build.is_built(component):
        return build.bin_dir(component) / COMPONENT
    if not build_missing:
        return None
    return build.build(component, progress) / COMPONENT


def _run(cosign: Path, *args: str, cwd: Path | None = None, password: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COSIGN_PASSWORD=password, COSIGN_YES="true")
    proc = subprocess.run([str(cosign), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    if proc.returncode != 0:
        raise BuildError(f"cosign {' '.join(args[:1])} failed (exit {proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc


def generate_key_pair(cosign: Path, directory: Path, password: str = "") -> tuple[Path, Path]:
    """A new cosign key pair (ECDSA P-256) in `directory`: (cosign.key, cosign.pub)."""
    directory.mkdir(parents=True, exist_ok=True)
    _run(cosign, "generate-key-pair", cwd=directory, password=password)
    return directory / "cosign.key", directory / "cosign.pub"


def dev_key_dir() -> Path:
    return build.cache_root() / "cosign" / "dev"


def dev_key_pair(cosign: Path) -> tuple[Path, Path]:
    """The machine's dev signing key pair, generated on first use (under a lock: one per machine)."""
    directory = dev_key_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        key, pub = directory / "cosign.key", directory / "cosign.pub"
        if not (key.is_file() and pub.is_file()):
            generate_key_pair(cosign, directory)
        return key, pub


def dev_public_key(progress: Progress = print) -> str | None:
    """The machine's dev public key (PEM), generating the pair on first use; None (saying so) when
    cosign is not built. What `nodegate dev up --image-signatures` trusts for the catalog."""
    cosign = binary()
    if cosign is None:
        progress("cosign is not built, so there is no dev signing key: `python -m gate.devcluster.build` builds it")
        return None
    return dev_key_pair(cosign)[1].read_text()


def sign(cosign: Path, image: str, key: Path, *, fmt: SignFormat = "bundle", password: str = "") -> str:
    """Sign `image` (a reference by digest: cosign signs what a tag names at that moment otherwise)
    with `key`, offline, in `fmt`; return cosign's output."""
    if "@sha256:" not in image:
        raise ValueError(f"sign a reference by digest, not {image!r}: a tag may move between resolving and signing")
    flags = [*OFFLINE_FLAGS, "--allow-http-registry", "--key", str(key)]
    if fmt == "simplesigning":
        flags.append("--new-bundle-format=false")
    proc = _run(cosign, "sign", *flags, image, password=password)
    return proc.stdout + proc.stderr


def sign_images(references: Iterable[str], progress: Progress = print) -> Path | None:
    """Sign every image (references by digest, on a registry of this machine) with the dev key, in
    cosign 3's default format, unless the dev key's signature already verifies on it (a warm `dev
    images` signs nothing: the registry storage outlives clusters); return the public key, or None
    (saying so) when cosign is not built: the images stay unsigned."""
    cosign = binary()
    if cosign is None:
        progress("cosign is not built, so the images stay unsigned: `python -m gate.devcluster.build` builds it")
        return None
    key, pub = dev_key_pair(cosign)
    for reference in references:
        name, _, digest = reference.partition("@")
        policy = load_policy(dev_signature_policy([name.split("/", 1)[0]], pub.read_text()))
        verdict = _run_async(SignatureVerifier(policy).verify(reference, digest))
        if verdict.reason == "Verified":
            continue
        sign(cosign, reference, key)
        progress(f"Signed {name} ({digest[:19]}...) with the dev key {pub}")
    return pub


def _run_async(coro: Coroutine[Any, Any, Verdict]) -> Verdict:
    """`coro`'s result from sync code, also when the caller runs inside an event loop (a test fixture)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def dev_signature_policy(registries: Iterable[str], public_key: str, *, mode: str = "enforce",
                         unmatched: str = "allow", under: str = "nodegate/**") -> str:
    """The dev cluster's signature policy (YAML): the dev key (`public_key`, a PEM) for
    `<registry>/nodegate/**` (`under`) at each address the dev registry is reached on (`host:port`)."""
    text = yaml.safe_dump({
        "mode": mode,
        "unmatched": unmatched,
        "rules": [{"name": DEV_RULE_NAME, "repositories": [f"{r}/{under}" for r in registries],
                   "keys": [{"name": DEV_KEY_NAME, "pem": public_key}]}],
    }, sort_keys=False)
    load_policy(text, source="the dev signature policy")  # what it writes, it reads
    return text


__all__ = ["DEV_KEY_NAME", "DEV_RULE_NAME", "OFFLINE_FLAGS", "binary", "dev_key_pair", "dev_public_key",
           "dev_signature_policy", "generate_key_pair", "sign", "sign_images"]
