"""Image policy: which registries and repositories package images may come from, and whether they
must be pinned by digest. A cluster setting (the webhook's `--allowed-image-repositories` and
`--require-image-digest`), not part of a spec; the default allows everything.

Decisions:

* **Prefixes end at a path component.** `ghcr.io/acme` allows `ghcr.io/acme` and `ghcr.io/acme/...`,
  never `ghcr.io/acme-evil/...`: a plain string prefix would let anyone who can create a repository
  named like yours past the rule.
* **Names are compared fully qualified**, the way containerd resolves them: `nvidia/tuned` is
  `docker.io/nvidia/tuned`, `ubuntu` is `docker.io/library/ubuntu`, `index.docker.io` is
  `docker.io`. So an entry must start with a registry host (`docker.io/nvidia`, not `nvidia`): a
  bare first component is refused when the settings are read, since it would mean Docker Hub's
  namespace by that name and is almost always a typo for a host.
* **Only the packages a write adds or changes** are judged, as with the RBAC check on packages: a
  gate admitted before the policy was tightened can still be paused or have its budget changed,
  and is judged again when one of its packages changes (a new version pulls a new image).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gate.admission.rules import syntax
from gate.admission.rules.review import Violation

DOCKER_HUB = "docker.io"
_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io")


def _is_host(component: str) -> bool:
    # distribution/reference: the first component is a registry host when it has a dot or a port, or
    # is localhost; otherwise the name is on Docker Hub.
    return "." in component or ":" in component or component == "localhost" or component.startswith("[")


def qualified(name: str) -> str:
    """A repository name with its registry, as containerd resolves it."""
    first, slash, rest = name.partition("/")
    if not slash or not _is_host(first):
        path = name if slash else f"library/{name}"
        return f"{DOCKER_HUB}/{path}"
    if first in _HUB_ALIASES:
        return f"{DOCKER_HUB}/{rest}"
    return name


def _qualified_prefix(prefix: str) -> str:
    """An entry (which starts with a host, see `prefix_problem`) with Docker Hub's aliases folded."""
    host, slash, rest = prefix.rstrip("/").partition("/")
    host = DOCKER_HUB if host in _HUB_ALIASES else host
    return f"{host}/{rest}" if slash else host


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot be an allowed-repository entry, or None."""
    entry = prefix.rstrip("/")
    if not entry:
        return "an allowed repository must not be empty"
    first = entry.partition("/")[0]
    if not _is_host(first):
        return (f"allowed repository {prefix!r} must start with a registry host, e.g. docker.io/{entry} or "
                f"ghcr.io/{entry}: a bare first component would mean Docker Hub's {entry!r}")
    # Parsed as the parent of a repository: "host:5000" alone would read as a name with a tag.
    ref = syntax.parse_image(entry + "/x")
    if isinstance(ref, str) or ref.tag is not None or ref.digest is not None:
        return (f"allowed repository {prefix!r} must be a registry host or a repository path without a tag "
                "or digest, e.g. registry.example.com:5000/team")
    return None


@dataclass(frozen=True)
class ImagePolicy:
    allowed_repositories: tuple[str, ...] = ()
    """Registry hosts or repository prefixes; empty: every repository is allowed."""
    require_digest: bool = False
    """Package images must carry an @sha256: digest."""

    def __post_init__(self) -> None:
        for prefix in self.allowed_repositories:
            problem = prefix_problem(prefix)
            if problem:
                raise ValueError(problem)

    @property
    def enforced(self) -> bool:
        return bool(self.allowed_repositories) or self.require_digest

    def allows_repository(self, name: str) -> bool:
        if not self.allowed_repositories:
            return True
        full = qualified(name)
        return any(full == entry or full.startswith(entry + "/") for entry in map(_qualified_prefix,
                                                                                   self.allowed_repositories))

    def describe(self) -> str:
        rules = []
        if self.allowed_repositories:
            rules.append("allowedRepositories: " + ", ".join(self.allowed_repositories))
        if self.require_digest:
            rules.append("requireDigest: true")
        return "; ".join(rules) or "allow everything"


ALLOW_ALL = ImagePolicy()


def image_violations(packages: dict[str, object], names: Iterable[str], policy: ImagePolicy) -> list[Violation]:
    """One violation per package of `names` whose image the policy refuses, naming the package key, the
    image and the rule. An image that does not parse is left to the syntax rules, which say why."""
    if not policy.enforced:
        return []
    out: list[Violation] = []
    for name in names:
        package = packages.get(name)
        image = package.get("image") if isinstance(package, dict) else None
        if not isinstance(image, str):
            continue
        ref = syntax.parse_image(image)
        if isinstance(ref, str):
            continue
        where = f"spec.packages[{name}].image"
        if not policy.allows_repository(ref.name):
            out.append(Violation(where, f'image "{image}" of package "{name}" is outside the allowed repositories '
                                        f"(imagePolicy.allowedRepositories: {', '.join(policy.allowed_repositories)}; "
                                        f"it resolves to {qualified(ref.name)}); use an image from one of them, or "
                                        "ask the cluster's admins to allow its repository", forbidden=True))
        if policy.require_digest and ref.digest is None:
            out.append(Violation(where, f'image "{image}" of package "{name}" has no digest, and the cluster '
                                        "requires one (imagePolicy.requireDigest: true); pin it as "
                                        f"{ref.name}@sha256:<digest of the {package_version(package)} image>",
                                 forbidden=True))
    return out


def package_version(package: object) -> str:
    version = package.get("version") if isinstance(package, dict) else None
    return str(version) if isinstance(version, str) else "package's"
