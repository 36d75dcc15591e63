"""The image policy: allowed repositories (prefixes at path components, names fully qualified) and
required digests, judged on the packages a write adds or changes, with messages naming the package
key, the image and the rule."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate.admission.rules import decide
from gate.admission.rules.facts import Facts
from gate.admission.rules.images import ALLOW_ALL, ImagePolicy, image_violations, prefix_problem, qualified
from gate.admission.settings import add_arguments, from_args
from tests.unit.admission.helpers import gate, package, request

DIGEST = "sha256:" + "ab" * 32
POLICY = ImagePolicy(("ghcr.io/acme", "registry.internal:5000", "docker.io/nvidia"))
STRICT = ImagePolicy(("ghcr.io/acme",), require_digest=True)


def judged(policy: ImagePolicy, *images: str) -> list[str]:
    packages = {f"p{i}x": package(image=img) for i, img in enumerate(images)}
    verdict = decide.validate(request("NodeGate", "CREATE", gate(packages)), Facts(), policy)
    return [v.message for v in verdict.violations]


@pytest.mark.parametrize(("image", "allowed"), [
    ("ghcr.io/acme", True),
    ("ghcr.io/acme/tuned", True),
    ("ghcr.io/acme/team/tuned@" + DIGEST, True),
    ("ghcr.io/acme/tuned:1.0.0", True),
    ("registry.internal:5000/anything/at/all", True),
    ("nvidia/tuned", True),                      # Docker Hub shorthand: docker.io/nvidia/tuned
    ("index.docker.io/nvidia/tuned", True),      # an alias of docker.io
    ("ghcr.io/acme-evil/tuned", False),          # a string prefix, not a path component
    ("ghcr.io/acmetuned", False),
    ("ghcr.io/other/tuned", False),
    ("registry.internal:5001/x", False),         # another port is another registry
    ("registry.internal/x", False),
    ("ubuntu", False),                           # docker.io/library/ubuntu
    ("nvidia-evil/tuned", False),
    ("evil.io/ghcr.io/acme/tuned", False),
])
def test_allowed_repositories_match_whole_path_components_of_the_qualified_name(image: str, allowed: bool) -> None:
    assert (judged(POLICY, image) == []) is allowed


def test_a_refusal_names_the_package_key_the_image_the_rule_and_where_it_resolves() -> None:
    [message] = judged(POLICY, "nvidia-evil/tuned")
    assert message.startswith("spec.packages[p0x].image: ")
    assert 'image "nvidia-evil/tuned" of package "p0x" is outside the allowed repositories' in message
    assert "imagePolicy.allowedRepositories: ghcr.io/acme, registry.internal:5000, docker.io/nvidia" in message
    assert "resolves to docker.io/nvidia-evil/tuned" in message


def test_required_digest_refuses_tag_only_images_and_says_how_to_pin() -> None:
    assert judged(STRICT, "ghcr.io/acme/tuned@" + DIGEST) == []
    [message] = judged(STRICT, "ghcr.io/acme/tuned")
    assert 'spec.packages[p0x].image: image "ghcr.io/acme/tuned" of package "p0x" has no digest' in message
    assert "imagePolicy.requireDigest: true" in message
    assert "ghcr.io/acme/tuned@sha256:<digest of the 1.0.0 image>" in message
    # both rules broken: both said, for each package
    assert len(judged(STRICT, "quay.io/x/y", "ghcr.io/acme/z")) == 3


def test_digest_alone_allows_every_repository() -> None:
    assert judged(ImagePolicy(require_digest=True), "quay.io/any/thing@" + DIGEST) == []


def test_refusals_are_forbidden_not_invalid() -> None:
    verdict = decide.validate(request("NodeGate", "CREATE", gate({"tool": package(image="quay.io/x")})), Facts(),
                              POLICY)
    assert [v.forbidden for v in verdict.violations] == [True]


def test_the_default_allows_everything() -> None:
    assert not ALLOW_ALL.enforced
    assert judged(ALLOW_ALL, "quay.io/x", "ubuntu", "localhost:5000/y") == []
    verdict = decide.validate(request("NodeGate", "CREATE", gate({"tool": package(image="quay.io/x")})), Facts())
    assert verdict.violations == () and [c.verb for c in verdict.access] == ["use"]  # only RBAC left to ask


def test_only_packages_the_write_adds_or_changes_are_judged() -> None:
    old = gate({"legacy": package(image="quay.io/old/tool"), "tuned": package(image="ghcr.io/acme/tuned")})
    paused = {**old, "spec": {**old["spec"], "paused": True}}
    # pausing a gate admitted before the policy: its packages are unchanged, so not judged
    assert decide.validate(request("NodeGate", "UPDATE", paused, old), Facts(), POLICY).violations == ()
    # a new version of the legacy package is judged (a new version pulls a new image)
    bumped = gate({"legacy": package(version="1.1.0", image="quay.io/old/tool"),
                   "tuned": package(image="ghcr.io/acme/tuned")})
    [violation] = decide.validate(request("NodeGate", "UPDATE", bumped, old), Facts(), POLICY).violations
    assert violation.field == "spec.packages[legacy].image"


def test_images_that_do_not_parse_are_left_to_the_syntax_rule() -> None:
    messages = judged(POLICY, "Not An Image")
    assert len(messages) == 1 and "is not an image reference" in messages[0]


@pytest.mark.parametrize(("prefix", "problem"), [
    ("acme", "must start with a registry host, e.g. docker.io/acme"),
    ("library/ubuntu", "must start with a registry host"),
    ("ghcr.io/acme:1.0", "without a tag or digest"),
    ("", "must not be empty"),
])
def test_entries_that_are_not_a_host_or_repository_are_refused(prefix: str, problem: str) -> None:
    assert problem in (prefix_problem(prefix) or "")
    with pytest.raises(ValueError, match=r"allowed repository|must not be empty"):
        ImagePolicy((prefix,))


@pytest.mark.parametrize("prefix", ["ghcr.io", "ghcr.io/acme/", "localhost:5000", "[::1]:5000/x", "docker.io"])
def test_hosts_and_paths_are_entries(prefix: str) -> None:
    assert prefix_problem(prefix) is None


def test_docker_hub_names_are_qualified_as_containerd_resolves_them() -> None:
    assert qualified("ubuntu") == "docker.io/library/ubuntu"
    assert qualified("nvidia/tuned") == "docker.io/nvidia/tuned"
    assert qualified("registry-1.docker.io/nvidia/tuned") == "docker.io/nvidia/tuned"
    assert qualified("localhost/x") == "localhost/x"
    assert qualified("host:5000/x") == "host:5000/x"


@given(st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,3}", fullmatch=True),
       st.from_regex(r"[-_.]?[a-z0-9]{1,8}", fullmatch=True))
def test_an_allowed_prefix_never_admits_a_sibling_sharing_its_text(path: str, suffix: str) -> None:
    policy = ImagePolicy((f"ghcr.io/{path}",))
    assert image_violations({"tool": {"image": f"ghcr.io/{path}/{suffix.lstrip('-_.')}"}}, ["tool"], policy) == []
    assert image_violations({"tool": {"image": f"ghcr.io/{path}{suffix}"}}, ["tool"], policy) != []


def _parsed(argv: list[str], env: dict[str, str] | None = None) -> ImagePolicy:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(argv), env or {}).image_policy


def test_settings_read_the_policy_from_flags_and_env_flags_winning() -> None:
    assert _parsed([]) == ALLOW_ALL
    env = {"NODEGATE_WEBHOOK_ALLOWED_IMAGE_REPOSITORIES": "ghcr.io/acme, registry.internal:5000",
           "NODEGATE_WEBHOOK_REQUIRE_IMAGE_DIGEST": "true"}
    assert _parsed([], env) == ImagePolicy(("ghcr.io/acme", "registry.internal:5000"), require_digest=True)
    assert _parsed(["--require-image-digest"]) == ImagePolicy(require_digest=True)
    assert _parsed(["--allowed-image-repositories", "quay.io", "--require-image-digest", "false"], env) == \
        ImagePolicy(("quay.io",))


def test_settings_refuse_a_bad_entry_or_boolean_at_start_naming_it() -> None:
    with pytest.raises(ValueError, match="allowed repository 'acme' must start with a registry host"):
        _parsed(["--allowed-image-repositories", "ghcr.io/x,acme"])
    with pytest.raises(ValueError, match=r"_REQUIRE_IMAGE_DIGEST .* must be true or false, not 'maybe'"):
        _parsed([], {"NODEGATE_WEBHOOK_REQUIRE_IMAGE_DIGEST": "maybe"})
