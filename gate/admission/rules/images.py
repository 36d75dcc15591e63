"""Image policy: which registries and repositories package images may come from, whether they must
be pinned by digest, and which repositories each package name is bound to. A cluster setting (the
webhook's `--allowed-image-repositories`, `--require-image-digest`, `--package-repositories` and
`--unbound-packages`), not part of a spec; the webhook's default allows everything, the chart's
default binds every catalog package to its own repository.

Decisions:

* **RBAC `use` on package P covers the repositories bound to P, not any image under the key P.**
  A package name alone says nothing about what runs as root: without a binding, a user granted
  `use` on `sysctl-tuning` could put any image under that key. So the cluster binds names to
  repositories (`imagePolicy.packages`) and every write that adds or changes a bound package must
  name an image under one of them. The binding is cluster policy, judged before any RBAC question and
  for every user, cluster admins too: who may change it is whoever manages the webhook's settings.
* **Unbound names are allowed unless the cluster says otherwise** (`unboundPackages: refuse`), so
  that a cluster's own packages keep working when the chart's catalog bindings arrive; refusing
  them makes the binding the complete list of what may run.
* **An empty binding is refused when the settings are read**: an empty `allowedRepositories` means
  "any", so an empty binding would read as either "any" or "none". To stop binding a name, remove
  its entry; to keep a package out, withhold `use` on it.

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

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gate.admission.rules import syntax
from gate.admission.rules.review import Violation
from gate.api.nodegate import PACKAGE_NAME_PATTERN, PACKAGE_NAME_RULE
from gate.api.references import is_registry_host, qualified, registry_of_host

UnboundPackages = Literal["allow", "refuse"]
UNBOUND_CHOICES: tuple[UnboundPackages, ...] = ("allow", "refuse")
PackageBindings = tuple[tuple[str, tuple[str, ...]], ...]
"""(package name, bound repositories) pairs, sorted by name: a hashable, comparable mapping."""

def _qualified_prefix(prefix: str) -> str:
    """An entry (which starts with a host, see `prefix_problem`) with Docker Hub's aliases folded."""
    host, slash, rest = prefix.rstrip("/").partition("/")
    host = registry_of_host(host)
    return f"{host}/{rest}" if slash else host


def prefix_problem(prefix: str, what: str = "allowed repository") -> str | None:
    """Why `prefix` cannot be an allowed-repository (or, with `what`, a bound-repository) entry, or None."""
    entry = prefix.rstrip("/")
    if not entry:
        return f"an {what} must not be empty" if what[0] in "aeiou" else f"a {what} must not be empty"
    first = entry.partition("/")[0]
    if not is_registry_host(first):
        return (f"{what} {prefix!r} must start with a registry host, e.g. docker.io/{entry} or "
                f"ghcr.io/{entry}: a bare first component would mean Docker Hub's {entry!r}")
    # Parsed as the parent of a repository: "host:5000" alone would read as a name with a tag.
    ref = syntax.parse_image(entry + "/x")
    if isinstance(ref, str) or ref.tag is not None or ref.digest is not None:
        return (f"{what} {prefix!r} must be a registry host or a repository path without a tag "
                "or digest, e.g. registry.example.com:5000/team")
    return None


@dataclass(frozen=True)
class ImagePolicy:
    allowed_repositories: tuple[str, ...] = ()
    """Registry hosts or repository prefixes; empty: every repository is allowed."""
    require_digest: bool = False
    """Package images must carry an @sha256: digest."""
    package_repositories: PackageBindings = ()
    """Package names bound to the repositories their images must come from (the same prefix rules);
    build it with `bindings`. A name not listed is unbound."""
    unbound_packages: UnboundPackages = "allow"
    """allow: an unbound name may use any image the other rules allow; refuse: it is refused."""

    def __post_init__(self) -> None:
        for prefix in self.allowed_repositories:
            problem = prefix_problem(prefix)
            if problem:
                raise ValueError(problem)
        names = [name for name, _ in self.package_repositories]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"package {', '.join(twice)} is bound more than once: bind each package in one entry")
        for name, repositories in self.package_repositories:
            problem = binding_problem(name, repositories)
            if problem:
                raise ValueError(problem)
        if self.unbound_packages not in UNBOUND_CHOICES:
            raise ValueError(f"unbound packages must be allow or refuse, not {self.unbound_packages!r}")

    @property
    def enforced(self) -> bool:
        return (bool(self.allowed_repositories) or self.require_digest or bool(self.package_repositories)
                or self.unbound_packages == "refuse")

    def allows_repository(self, name: str) -> bool:
        return not self.allowed_repositories or _under(name, self.allowed_repositories)

    def bound_repositories(self, package: str) -> tuple[str, ...] | None:
        """The repositories `package` is bound to, or None when it is unbound."""
        return next((repos for name, repos in self.package_repositories if name == package), None)

    def describe(self) -> str:
        rules = []
        if self.allowed_repositories:
            rules.append("allowedRepositories: " + ", ".join(self.allowed_repositories))
        if self.require_digest:
            rules.append("requireDigest: true")
        if self.package_repositories:
            rules.append(f"packages: {len(self.package_repositories)} bound")
        if self.unbound_packages == "refuse":
            rules.append("unboundPackages: refuse")
        return "; ".join(rules) or "allow everything"


def _under(name: str, prefixes: Iterable[str]) -> bool:
    """`name`, fully qualified, is one of `prefixes` or below one of them at a path component."""
    full = qualified(name)
    return any(full == entry or full.startswith(entry + "/") for entry in map(_qualified_prefix, prefixes))


def binding_problem(package: str, repositories: object) -> str | None:
    """Why `repositories` cannot be the binding of `package`, or None; the message names the package."""
    if not re.fullmatch(PACKAGE_NAME_PATTERN, package):
        return (f"{package!r} is not a package name: it must match {PACKAGE_NAME_PATTERN} "
                f"{PACKAGE_NAME_RULE}")
    if not isinstance(repositories, Sequence) or isinstance(repositories, str) \
            or not all(isinstance(r, str) for r in repositories):
        return (f'package "{package}" must be bound to a list of repositories, '
                f"not {repositories!r}")
    if not repositories:
        return (f'package "{package}" is bound to no repository; an empty binding '
                "would read as either any image or none: to stop binding the package remove its entry, to keep "
                "it out of gates withhold verb \"use\" on it")
    for repository in repositories:
        problem = prefix_problem(repository, "bound repository")
        if problem:
            return f'package "{package}": {problem}'
    return None


def bindings(mapping: Mapping[str, Sequence[str]]) -> PackageBindings:
    """The bindings of a `{package: [repository, ...]}` mapping, checked (ValueError naming the entry)."""
    out = []
    for name, repositories in mapping.items():
        problem = binding_problem(name, repositories)
        if problem:
            raise ValueError(problem)
        out.append((name, tuple(repositories)))
    return tuple(sorted(out))


ALLOW_ALL = ImagePolicy()


def image_violations(packages: dict[str, object], names: Iterable[str], policy: ImagePolicy) -> list[Violation]:
    """One violation per package of `names` and rule its image breaks, naming the package key, the
    image and the rule. An image that does not parse is left to the syntax rules, which say why."""
    if not policy.enforced:
        return []
    out: list[Violation] = []
    for name in names:
        package = packages.get(name)
        bound = policy.bound_repositories(name)
        if bound is None and policy.unbound_packages == "refuse":
            out.append(Violation(f"spec.packages[{name}]", f'package "{name}" is bound to no image repository, and '
                                 "the cluster refuses unbound packages (imagePolicy.unboundPackages: refuse); ask "
                                 "the cluster's admins to bind it to the repository its image comes from (chart "
                                 f"value webhook.imagePolicy.packages.{name})", forbidden=True))
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
        if bound is not None and not _under(ref.name, bound):
            out.append(Violation(where, f'image "{image}" of package "{name}" is not from a repository bound to '
                                        f"that package (imagePolicy.packages.{name}: {', '.join(bound)}; it resolves "
                                        f"to {qualified(ref.name)}): the right to use package \"{name}\" covers only "
                                        "those repositories; use an image from one of them, or ask the cluster's "
                                        f"admins to bind another (chart value webhook.imagePolicy.packages.{name})",
                                 forbidden=True))
        if policy.require_digest and ref.digest is None:
            out.append(Violation(where, f'image "{image}" of package "{name}" has no digest, and the cluster '
                                        "requires one (imagePolicy.requireDigest: true); pin it as "
                                        f"{ref.name}@sha256:<digest of the {package_version(package)} image>",
                                 forbidden=True))
    return out


def package_version(package: object) -> str:
    version = package.get("version") if isinstance(package, dict) else None
    return str(version) if isinstance(version, str) else "package's"
