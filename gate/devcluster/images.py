"""NodeGate's images, built from their own Dockerfiles without Docker and pushed to the dev registry.

What gets built: the NodeGate image from the project's `Dockerfile`, and each package of `packages/`
from its own Dockerfile. buildah builds them (`bud --pull=never`, see buildah.py) with every public
FROM mapped to a local base (bases.py, docs/images.md): the project Dockerfile through its
`PYTHON_IMAGE` build argument, the package Dockerfiles through `--from`.

Without `--layers`: on vfs storage every cached layer is a full copy of the tree, so the layer cache
cost more than it saved. Measured on two busy cores: NodeGate's image from scratch took 196 s with
`--layers` and 82 s without; after a change under gate/ (the dependency layer cached) it still took
about 120 s with `--layers`, more than the 82 s of a full build without.

When a build is skipped: a built image is tagged locally with the digest of its inputs
(`localhost/nodegate/<name>:<inputs digest>`): the Dockerfile, every file it copies from its context
(after .dockerignore), the build arguments and the local bases' ids (dockerfile.inputs_digest). An
image with that tag already in storage is the build, so an unchanged tree builds nothing.

What gets pushed: each image to `<registry>/nodegate/<name>:<tag>`, where a package's tag is the
version of its package.yaml (the operator pulls `image:version`) and NodeGate's is the project
version. The manifest digest buildah reports is the image's identity: references handed out name it
(`<host>:<port>/nodegate/<name>@sha256:...`), so a node pulls exactly what was built, whatever later
pushes do to the tag. A push is skipped when the registry already serves that digest under the tag
(its storage outlives clusters), which is what makes a warm `nodegate dev images` take seconds.

What gets signed: every pushed image, with the machine's dev cosign key (gate.devcluster.cosign), in
cosign 3's default format, unless that key's signature verifies on it already. The dev cluster's
signature policy (`cosign.dev_signature_policy`) trusts that key for the registry's `nodegate/**`.
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

import gate
from gate.devcluster import cosign, registry
from gate.devcluster.bases import ensure_bases, from_map
from gate.devcluster.build import BuildError
from gate.devcluster.buildah import Buildah, buildah_dir, locked
from gate.devcluster.cluster import DevCluster
from gate.devcluster.dockerfile import Dockerfile, DockerfileError, base_overrides, inputs_digest

Progress = Callable[[str], None]

SOURCE_ROOT = Path(gate.__file__).resolve().parent.parent
LOCAL_REPOSITORY = "localhost/nodegate"
REGISTRY_NAMESPACE = "nodegate"
NODEGATE = "nodegate"
KEPT_BUILDS = 2


@dataclass(frozen=True)
class ImageTarget:
    """One image to build: its name, build context, Dockerfile, and the tag it is pushed under."""

    name: str
    context: Path
    dockerfile: Path
    tag: str

    @property
    def repository(self) -> str:
        """The repository inside the registry."""
        return f"{REGISTRY_NAMESPACE}/{self.name}"


@dataclass(frozen=True)
class Built:
    target: ImageTarget
    local: str  # localhost/nodegate/<name>:<inputs digest>
    image_id: str


def targets(source: Path = SOURCE_ROOT) -> list[ImageTarget]:
    """NodeGate first, then every package of `packages/` that has a Dockerfile, by name."""
    if not (source / "Dockerfile").is_file():
        raise BuildError(f"no Dockerfile in {source}: building images needs NodeGate's source checkout")
    found = [ImageTarget(NODEGATE, source, source / "Dockerfile", gate.__version__)]
    for package_dir in sorted((source / "packages").iterdir()):
        if (package_dir / "Dockerfile").is_file() and (package_dir / "package.yaml").is_file():
            found.append(package_target(package_dir))
    return found


def package_target(directory: Path) -> ImageTarget:
    """A package directory as an image: built from its own Dockerfile, tagged with its version."""
    for needed in ("package.yaml", "Dockerfile"):
        if not (directory / needed).is_file():
            raise BuildError(f"{directory}: no {needed}, so there is no package image to build")
    name, version = package_identity(directory / "package.yaml")
    return ImageTarget(name, directory, directory / "Dockerfile", version)


def package_identity(path: Path) -> tuple[str, str]:
    """`name` and `version` of a package.yaml (the image's repository and tag)."""
    data = yaml.safe_load(path.read_text()) or {}
    name, version = data.get("name"), data.get("version")
    if not isinstance(name, str) or not isinstance(version, str) or not name or not version:
        raise BuildError(f"{path}: a package needs a string `name` and `version` to be built as an image")
    return name, version


def local_name(name: str, digest: str) -> str:
    return f"{LOCAL_REPOSITORY}/{name}:{digest[:20]}"


def reference(host: str, port: int, repository: str, digest: str) -> str:
    """How a node names a pushed image: by digest, at the address it reaches the registry on."""
    if not digest.startswith("sha256:") or len(digest) != 71:
        raise ValueError(f"not a sha256 manifest digest: {digest!r}")
    return f"{host}:{port}/{repository}@{digest}"


def format_references(refs: Mapping[str, str]) -> str:
    """`NAME=REFERENCE` lines, NodeGate first, then the packages by name (what `dev images` prints)."""
    order = sorted(refs, key=lambda n: (n != NODEGATE, n))
    return "".join(f"{name}={refs[name]}\n" for name in order)


def parse_references(text: str) -> dict[str, str]:
    """The inverse of `format_references` (for scripts and tests reading `nodegate dev images`)."""
    refs = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, ref = line.partition("=")
        if not sep or not name or "@sha256:" not in ref:
            raise ValueError(f"not a NAME=REFERENCE line: {line!r}")
        refs[name] = ref
    return refs


def build_images(progress: Progress = print, *, only: tuple[str, ...] | None = None,
                 source: Path = SOURCE_ROOT) -> dict[str, str]:
    """Build every image whose inputs changed; return name -> local image (`localhost/nodegate/...`).

    `only` limits the build to those names (the tests build one package and NodeGate).
    """
    chosen, base_ids = _prepare(progress, only, source)
    with locked(progress):
        return {t.name: _build_one(t, from_map(), base_ids, progress).local for t in chosen}


def build(target: ImageTarget, progress: Progress = print) -> Built:
    """Build one target (any Dockerfile and context) as `build_images` builds those of the tree."""
    base_ids = ensure_bases(progress)
    with locked(progress):
        return _build_one(target, from_map(), base_ids, progress)


def _prepare(progress: Progress, only: tuple[str, ...] | None,
             source: Path) -> tuple[list[ImageTarget], dict[str, str]]:
    everything = targets(source)
    chosen = [t for t in everything if only is None or t.name in only]
    if only is not None and (unknown := set(only) - {t.name for t in chosen}):
        known = ", ".join(t.name for t in everything)
        raise BuildError(f"no image named {', '.join(sorted(unknown))} (known: {known})")
    return chosen, ensure_bases(progress)


def _build_one(target: ImageTarget, mapping: Mapping[str, str], base_ids: Mapping[str, str],
               progress: Progress) -> Built:
    text = target.dockerfile.read_text()
    try:
        parsed = Dockerfile.parse(text)
        overrides = base_overrides(parsed, mapping)
    except DockerfileError as exc:
        raise BuildError(f"{target.dockerfile}: {exc}") from None
    used = {public: base_ids[public] for public, local in mapping.items()
            if local in overrides.build_args.values() or local == overrides.from_image}
    extra = {**{f"arg:{k}": v for k, v in overrides.build_args.items()},
             "from": overrides.from_image or "", **{f"base:{k}": v for k, v in used.items()}}
    try:
        digest = inputs_digest(target.context, text, extra)
    except DockerfileError as exc:
        raise BuildError(f"{target.dockerfile}: {exc}") from None
    local = local_name(target.name, digest)
    log = buildah_dir() / "logs" / f"{target.name}.log"
    tool = Buildah(log)
    if (image_id := tool.image_id(local)) is not None:
        progress(f"Image {target.name}: inputs unchanged, reusing {local}")
        return Built(target, local, image_id)
    log.write_text("")
    started = time.monotonic()
    progress(f"Building image {target.name} from {target.dockerfile} (log: {log}) ...")
    try:
        tool.run("bud", "--pull=never", "--isolation", "chroot", "--format", "oci",
                 *overrides.buildah_args(), "--label", f"io.nodegate.inputs={digest}",
                 "-f", str(target.dockerfile), "-t", local, str(target.context),
                 what=f"building {target.name}", progress=progress)
    except BuildError:
        # A failed build leaves its working container (a full vfs copy) behind. Under the lock no
        # other build of ours is running in this storage, so every container is a leftover.
        tool.quiet("rm", "--all")
        raise
    image_id = tool.image_id(local)
    if image_id is None:
        raise BuildError(f"building {target.name} reported success but {local} is not in storage; see {log}")
    _remove_older(tool, target.name, local)
    progress(f"Built image {target.name} in {time.monotonic() - started:.0f}s -> {local}")
    return Built(target, local, image_id)


def _remove_older(tool: Buildah, name: str, keep: str) -> None:
    """Keep the newest `KEPT_BUILDS` images of `name` (this one included), remove the rest.

    Another checkout on this machine builds into the same storage under its own inputs digest, so
    the newest other build is kept too: two checkouts taking turns without changes reuse their images.
    """
    listed = tool.quiet("images", "--json")
    if listed.returncode != 0:
        return
    prefix = f"{LOCAL_REPOSITORY}/{name}:"
    ours = [(str(image.get("createdatraw", "")), tag) for image in json.loads(listed.stdout or "[]")
            for tag in image.get("names") or [] if tag.startswith(prefix) and tag != keep]
    for _, tag in sorted(ours, reverse=True)[KEPT_BUILDS - 1:]:
        tool.quiet("rmi", tag)


def push(built: Built, port: int, progress: Progress) -> str:
    """Push one image to the registry on 127.0.0.1:`port` under its tag; return the manifest digest."""
    target = built.target
    stamp = buildah_dir() / "pushed" / f"{built.image_id}-{target.name}-{target.tag}.json"
    if stamp.is_file():
        digest = str(json.loads(stamp.read_text())["digest"])
        try:
            if registry.manifest_digest(port, target.repository, target.tag) == digest:
                return digest
        except urllib.error.HTTPError:
            pass  # not there (another registry storage, or deleted): push again
    log = buildah_dir() / "logs" / f"{target.name}.push.log"
    log.write_text("")
    digest_file = log.with_suffix(".digest")
    digest_file.unlink(missing_ok=True)
    started = time.monotonic()
    destination = f"docker://127.0.0.1:{port}/{target.repository}:{target.tag}"
    Buildah(log).run("push", "--tls-verify=false", "--digestfile", str(digest_file), built.local, destination,
                     what=f"pushing {target.name}")
    digest = digest_file.read_text().strip()
    progress(f"Pushed {target.name}:{target.tag} ({digest[:19]}...) in {time.monotonic() - started:.0f}s")
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"digest": digest, "local": built.local}))
    return digest


def ensure_images(cluster: DevCluster, *, host: str, progress: Progress = print,
                  only: tuple[str, ...] | None = None, source: Path = SOURCE_ROOT) -> dict[str, str]:
    """Build what changed, push it to the cluster's registry (started if needed) and return
    name -> `<host>:<port>/nodegate/<name>@sha256:...`, `host` being the address nodes reach this
    machine at (`network.gateway_ip(cluster.dir)`)."""
    port = registry.start_registry(cluster.procs, progress)
    chosen, base_ids = _prepare(progress, only, source)
    refs = {}
    here = []  # the same images as this machine reaches them, to sign
    # Build and push under one lock: another process must not remove an image between the two.
    with locked(progress):
        for target in chosen:
            built = _build_one(target, from_map(), base_ids, progress)
            digest = push(built, port, progress)
            refs[target.name] = reference(host, port, target.repository, digest)
            here.append(reference("127.0.0.1", port, target.repository, digest))
    # Signed with the machine's dev key, which the dev cluster's policy trusts (gate.devcluster.cosign).
    cosign.sign_images(here, progress)
    return refs


@dataclass(frozen=True)
class PackageImage:
    """What `nodegate package build` made: the local image, and the reference when it was pushed."""

    target: ImageTarget
    local: str
    reference: str | None = None


def build_package(directory: Path, progress: Progress = print, *, cluster: DevCluster | None = None,
                  host: str | None = None) -> PackageImage:
    """Build one package directory's image exactly as `ensure_images` builds those of packages/ (same
    bases, same inputs digest, so an unchanged package is not built again); with `cluster`, push it
    to that cluster's registry, sign it with the dev key as `ensure_images` does, and return its
    reference by digest as nodes reach it at `host`."""
    target = package_target(directory)
    if cluster is not None and host is None:
        raise ValueError("pushing needs the host the nodes reach the registry at")
    port = registry.start_registry(cluster.procs, progress) if cluster is not None else None
    base_ids = ensure_bases(progress)
    with locked(progress):
        built = _build_one(target, from_map(), base_ids, progress)
        if cluster is None or port is None or host is None:
            return PackageImage(target, built.local)
        digest = push(built, port, progress)
    cosign.sign_images([reference("127.0.0.1", port, target.repository, digest)], progress)
    return PackageImage(target, built.local, reference(host, port, target.repository, digest))
