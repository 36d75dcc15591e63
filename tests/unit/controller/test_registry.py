"""The registry client's pure parts: references, challenges, pull credentials (gate.controller.registry)."""

from __future__ import annotations

import base64
import json

import pytest

from gate.controller.registry import (
    RegistryError,
    Target,
    body_digest,
    credentials_for,
    docker_config,
    loopback,
    parse_challenge,
    target_of,
)


@pytest.mark.parametrize(("reference", "target"), [
    ("ubuntu:24.04", Target("docker.io", "library/ubuntu", "24.04")),
    ("nvidia/tuned:1.0.0", Target("docker.io", "nvidia/tuned", "1.0.0")),
    ("index.docker.io/nvidia/tuned:1.0.0", Target("docker.io", "nvidia/tuned", "1.0.0")),
    ("ghcr.io/acme/tool:1.2.3-rc.1", Target("ghcr.io", "acme/tool", "1.2.3-rc.1")),
    ("localhost:5000/a/b/c:v1", Target("localhost:5000", "a/b/c", "v1")),
    ("127.0.0.1:41234/nodegate/pkg:1.0.0", Target("127.0.0.1:41234", "nodegate/pkg", "1.0.0")),
])
def test_references_are_qualified_as_containerd_qualifies_them(reference: str, target: Target) -> None:
    assert target_of(reference) == target


def test_docker_hub_is_asked_at_its_api_host_and_only_the_loopback_over_plain_http() -> None:
    hub = target_of("nvidia/tuned:1.0.0")
    assert isinstance(hub, Target)
    assert hub.manifest_url == "https://registry-1.docker.io/v2/nvidia/tuned/manifests/1.0.0"
    local = target_of("127.0.0.1:5000/a:1")
    assert isinstance(local, Target) and local.manifest_url == "http://127.0.0.1:5000/v2/a/manifests/1"
    assert [loopback(h) for h in ("localhost:5000", "127.0.0.1", "[::1]:5000", "10.0.0.1:5000", "registry.local")] \
        == [True, True, True, False, False]


@pytest.mark.parametrize("reference", ["host/a@sha256:" + "1" * 64, "host:5000/a", "host/UPPER:1"])
def test_a_reference_without_a_resolvable_tag_says_why(reference: str) -> None:
    assert isinstance(target_of(reference), str)


def test_bearer_and_basic_challenges_are_parsed() -> None:
    scheme, params = parse_challenge(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:library/ubuntu:pull"')
    assert scheme == "bearer"
    assert params == {"realm": "https://auth.docker.io/token", "service": "registry.docker.io",
                      "scope": "repository:library/ubuntu:pull"}
    assert parse_challenge('Basic realm="Registry Realm"') == ("basic", {"realm": "Registry Realm"})
    assert parse_challenge("bearer realm=https://h/t, service=h") == ("bearer",
                                                                       {"realm": "https://h/t", "service": "h"})


def _secret(config: dict[str, object], kind: str = "kubernetes.io/dockerconfigjson") -> dict[str, object]:
    key = ".dockerconfigjson" if kind.endswith("json") else ".dockercfg"
    return {"type": kind, "data": {key: base64.b64encode(json.dumps(config).encode()).decode()}}


def test_pull_credentials_are_matched_by_registry_host() -> None:
    auth = base64.b64encode(b"robot:s3cr:et").decode()
    config = docker_config(_secret({"auths": {
        "https://index.docker.io/v1/": {"auth": auth},
        "ghcr.io": {"username": "u", "password": "p"},
        "registry.example.com:5000/some/path": {"auth": base64.b64encode(b"x:y").decode()},
    }}))
    assert config is not None
    assert credentials_for("docker.io", config) == ("robot", "s3cr:et")  # a colon in the password stays
    assert credentials_for("ghcr.io", config) == ("u", "p")
    assert credentials_for("registry.example.com:5000", config) == ("x", "y")
    assert credentials_for("quay.io", config) is None
    legacy = docker_config(_secret({"quay.io": {"auth": base64.b64encode(b"q:w").decode()}}, "kubernetes.io/dockercfg"))
    assert legacy is not None and credentials_for("quay.io", legacy) == ("q", "w")
    assert docker_config({"type": "Opaque", "data": {"x": "eA=="}}) is None
    assert docker_config({"type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "!!"}}) is None


def test_an_error_names_the_image_the_registry_and_the_status() -> None:
    text = str(RegistryError("ghcr.io/acme/tool:1.0.0", "ghcr.io", "not there", 404))
    assert "ghcr.io/acme/tool:1.0.0" in text and "registry ghcr.io" in text and "HTTP 404" in text
    assert body_digest("sha256", b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
