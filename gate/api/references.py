"""Image names as containerd resolves them: which registry a name is on, and its repository there.

The one rule that the image policy (`gate.admission.rules.images`) and the operator's registry
client (`gate.controller.registry`) both follow, so that what admission allowed is what the
operator resolves and a node pulls:

* the first component is a registry host when it has a dot or a port, is `localhost`, or is an
  IPv6 literal (distribution/reference); otherwise the name is on Docker Hub;
* Docker Hub is `docker.io`, whatever alias names it (`index.docker.io`, `registry-1.docker.io`),
  and a one-component name is an official image: `ubuntu` is `docker.io/library/ubuntu`.
"""

from __future__ import annotations

DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = (DOCKER_HUB, "index.docker.io", "registry-1.docker.io")


def is_registry_host(component: str) -> bool:
    """Whether the first component of a name is a registry host rather than a Docker Hub namespace."""
    return "." in component or ":" in component or component == "localhost" or component.startswith("[")


def registry_of_host(host: str) -> str:
    """A registry host with Docker Hub's aliases folded into `docker.io`."""
    return DOCKER_HUB if host in DOCKER_HUB_ALIASES else host


def split_name(name: str) -> tuple[str, str]:
    """(registry, repository) of a repository name without tag or digest, qualified."""
    first, slash, rest = name.partition("/")
    if not slash or not is_registry_host(first):
        return DOCKER_HUB, (name if slash else f"library/{name}")
    return registry_of_host(first), rest


def qualified(name: str) -> str:
    """A repository name with its registry: `nvidia/x` is `docker.io/nvidia/x`."""
    return "/".join(split_name(name))


__all__ = ["DOCKER_HUB", "DOCKER_HUB_ALIASES", "is_registry_host", "qualified", "registry_of_host", "split_name"]
