"""Package rights bind images: a package name bound to repositories (imagePolicy.packages) takes an
image only from under one of them, for every user, on each package a write adds or changes; unbound
names are allowed or refused as `unboundPackages` says. Composes with allowedRepositories and
requireDigest."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate.admission.rules import decide
from gate.admission.rules.facts import Facts
from gate.admission.rules.images import ImagePolicy, bindings, image_violations
from gate.admission.settings import add_arguments, from_args
from tests.unit.admission.helpers import gate, package, request

DIGEST = "sha256:" + "cd" * 32
SYSCTL = "ghcr.io/example/nodegate-sysctl-tuning"
BOUND = ImagePolicy(package_repositories=bindings({"sysctl-tuning": [SYSCTL],
                                                   "tuned": ["registry.internal:5000/mirror/tuned", "docker.io/acme"]}))


def verdict_of(policy: ImagePolicy, packages: dict[str, str], *, user: str = "alice",
               groups: list[str] | None = None) -> decide.Verdict:
    spec = {name: package(image=image) for name, image in packages.items()}
    return decide.validate(request("NodeGate", "CREATE", gate(spec), user=user, groups=groups), Facts(), policy)


def refusals(policy: ImagePolicy, packages: dict[str, str]) -> list[str]:
    return [v.message for v in verdict_of(policy, packages).violations]


@pytest.mark.parametrize(("name", "image", "admitted"), [
    ("sysctl-tuning", SYSCTL, True),
    ("sysctl-tuning", f"{SYSCTL}:1.0.0", True),
    ("sysctl-tuning", f"{SYSCTL}@{DIGEST}", True),
    ("sysctl-tuning", f"{SYSCTL}/sub", True),                        # below it, at a path component
    ("sysctl-tuning", f"{SYSCTL}-evil", False),                      # a sibling sharing its text
    ("sysctl-tuning", "ghcr.io/example/nodegate-tuning", False),     # another catalog package's image
    ("sysctl-tuning", "quay.io/attacker/sysctl-tuning", False),
    ("sysctl-tuning", "example/nodegate-sysctl-tuning", False),      # docker.io/example/...
    ("tuned", "registry.internal:5000/mirror/tuned@" + DIGEST, True),  # either of its repositories
    ("tuned", "acme/tuned", True),                                   # docker.io/acme/tuned
    ("tuned", "index.docker.io/acme/tuned", True),
    ("tuned", "registry.internal:5001/mirror/tuned", False),         # another port, another registry
    ("tuned", SYSCTL, False),
    ("my-own", "quay.io/anything/at/all", True),                     # unbound, and unbound names are allowed
])
def test_a_bound_package_takes_images_only_from_its_repositories(name: str, image: str, admitted: bool) -> None:
    assert (refusals(BOUND, {name: image}) == []) is admitted


def test_the_refusal_names_field_image_where_it_resolves_the_binding_and_the_value_to_change() -> None:
    [message] = refusals(BOUND, {"sysctl-tuning": "example/nodegate-sysctl-tuning"})
    assert message.startswith('spec.packages[sysctl-tuning].image: image "example/nodegate-sysctl-tuning" of '
                              'package "sysctl-tuning" is not from a repository bound to that package ')
    assert f"(imagePolicy.packages.sysctl-tuning: {SYSCTL}; " in message
    assert "it resolves to docker.io/example/nodegate-sysctl-tuning" in message
    assert 'the right to use package "sysctl-tuning" covers only those repositories' in message
    assert "chart value webhook.imagePolicy.packages.sysctl-tuning" in message
    [violation] = verdict_of(BOUND, {"tuned": SYSCTL}).violations
    assert violation.forbidden
    assert "imagePolicy.packages.tuned: registry.internal:5000/mirror/tuned, docker.io/acme" in violation.message


def test_the_binding_binds_every_user_and_is_judged_before_any_rbac_question() -> None:
    """A cluster policy: system:masters is refused too, and no SubjectAccessReview is asked for a write
    that the binding refuses."""
    for user, groups in (("mallory", ["system:authenticated"]), ("kubernetes-admin", ["system:masters"])):
        verdict = verdict_of(BOUND, {"sysctl-tuning": "quay.io/attacker/sysctl-tuning"}, user=user, groups=groups)
        assert [v.field for v in verdict.violations] == ["spec.packages[sysctl-tuning].image"]
        assert verdict.access == ()
    # the bound image leaves only RBAC to ask: `use` on the package
    verdict = verdict_of(BOUND, {"sysctl-tuning": SYSCTL})
    assert verdict.violations == () and [(c.verb, c.name) for c in verdict.access] == [("use", "sysctl-tuning")]


def test_unbound_packages_are_refused_when_the_cluster_says_so_naming_the_value_to_set() -> None:
    strict = ImagePolicy(package_repositories=BOUND.package_repositories, unbound_packages="refuse")
    assert refusals(strict, {"sysctl-tuning": SYSCTL}) == []
    [message] = refusals(strict, {"sysctl-tuning": SYSCTL, "my-own": "quay.io/acme/my-own"})
    assert message.startswith('spec.packages[my-own]: package "my-own" is bound to no image repository, and the '
                              "cluster refuses unbound packages (imagePolicy.unboundPackages: refuse)")
    assert "webhook.imagePolicy.packages.my-own" in message
    # refusing unbound names with nothing bound refuses every package
    assert len(refusals(ImagePolicy(unbound_packages="refuse"), {"aa": "quay.io/a", "bb": "quay.io/b"})) == 2


def test_the_binding_composes_with_allowed_repositories_and_required_digests() -> None:
    policy = ImagePolicy(("ghcr.io/example",), require_digest=True, package_repositories=BOUND.package_repositories)
    assert refusals(policy, {"sysctl-tuning": f"{SYSCTL}@{DIGEST}"}) == []
    # bound, but no digest
    [message] = refusals(policy, {"sysctl-tuning": SYSCTL})
    assert "has no digest" in message
    # bound to a repository the allowed list leaves out: the allowed list still rules
    [message] = refusals(policy, {"tuned": f"docker.io/acme/tuned@{DIGEST}"})
    assert "is outside the allowed repositories" in message
    # allowed, but not bound to this package, and no digest: every broken rule is said
    messages = refusals(policy, {"sysctl-tuning": "ghcr.io/example/nodegate-tuning"})
    assert len(messages) == 2
    assert "not from a repository bound" in messages[0] and "has no digest" in messages[1]


def test_only_packages_the_write_adds_or_changes_are_judged_against_their_binding() -> None:
    old = gate({"sysctl-tuning": package(image="quay.io/legacy/sysctl"), "other": package()})
    paused = {**old, "spec": {**old["spec"], "paused": True}}
    assert decide.validate(request("NodeGate", "UPDATE", paused, old), Facts(), BOUND).violations == ()
    # changing the legacy package (its image here, or its version) judges it
    for changed in (package(image="quay.io/legacy/sysctl-2"), package(version="1.1.0", image="quay.io/legacy/sysctl")):
        new = gate({"sysctl-tuning": changed, "other": package()})
        [violation] = decide.validate(request("NodeGate", "UPDATE", new, old), Facts(), BOUND).violations
        assert violation.field == "spec.packages[sysctl-tuning].image"
    # moving a bound package's image under another key is adding that key: judged by its binding
    moved = gate({"tuned": package(image=SYSCTL), "other": package()})
    assert [v.field for v in decide.validate(request("NodeGate", "UPDATE", moved, old), Facts(), BOUND).violations] \
        == ["spec.packages[tuned].image"]


@given(st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,3}", fullmatch=True),
       st.from_regex(r"[-_.]?[a-z0-9]{1,8}", fullmatch=True))
def test_a_bound_repository_never_admits_a_sibling_sharing_its_text(path: str, suffix: str) -> None:
    policy = ImagePolicy(package_repositories=bindings({"tool": [f"ghcr.io/{path}"]}))
    assert image_violations({"tool": {"image": f"ghcr.io/{path}/{suffix.lstrip('-_.')}"}}, ["tool"], policy) == []
    assert image_violations({"tool": {"image": f"ghcr.io/{path}{suffix}"}}, ["tool"], policy) != []


@pytest.mark.parametrize(("mapping", "problem"), [
    ({"sysctl-tuning": ["acme/sysctl"]}, "package \"sysctl-tuning\": bound repository 'acme/sysctl' must start with "
                                         "a registry host"),
    ({"sysctl-tuning": ["ghcr.io/acme:1.0"]}, "without a tag or digest"),
    ({"sysctl-tuning": []}, 'package "sysctl-tuning" is bound to no repository'),
    ({"sysctl-tuning": "ghcr.io/acme"}, 'package "sysctl-tuning" must be bound to a list of repositories'),
    ({"Sysctl": ["ghcr.io/acme"]}, "'Sysctl' is not a package name"),
])
def test_a_bad_binding_is_refused_naming_its_entry(mapping: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        bindings(mapping)  # type: ignore[arg-type]
    assert problem in str(caught.value)


def _parsed(argv: list[str], env: dict[str, str] | None = None) -> ImagePolicy:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(argv), env or {}).image_policy


def test_settings_read_the_bindings_as_json_from_flags_and_env_flags_winning() -> None:
    assert _parsed([]).package_repositories == () and _parsed([]).unbound_packages == "allow"
    env = {"NODEGATE_WEBHOOK_PACKAGE_REPOSITORIES": '{"tuned": ["ghcr.io/a/tuned"], "kdump": ["localhost:5000/k"]}',
           "NODEGATE_WEBHOOK_UNBOUND_PACKAGES": "refuse"}
    policy = _parsed([], env)
    assert policy.package_repositories == (("kdump", ("localhost:5000/k",)), ("tuned", ("ghcr.io/a/tuned",)))
    assert policy.unbound_packages == "refuse"
    flagged = _parsed(["--package-repositories", '{"lvm": ["quay.io/x/lvm"]}', "--unbound-packages", "allow"], env)
    assert flagged == ImagePolicy(package_repositories=(("lvm", ("quay.io/x/lvm",)),))
    assert _parsed(["--package-repositories", "{}"]).package_repositories == ()


@pytest.mark.parametrize(("raw", "problem"), [
    ("tuned=ghcr.io/a", "is not JSON"),
    ('["ghcr.io/a"]', "must be a JSON object of package name to a list of repositories, not list"),
    ('{"tuned": ["ghcr.io/a"], "kdump": ["kdump"]}', "package \"kdump\": bound repository 'kdump' must start"),
])
def test_settings_refuse_bad_bindings_at_start_naming_the_setting_and_entry(raw: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        _parsed(["--package-repositories", raw])
    assert str(caught.value).startswith("NODEGATE_WEBHOOK_PACKAGE_REPOSITORIES (--package-repositories)")
    assert problem in str(caught.value)
    with pytest.raises(ValueError, match="must be allow or refuse, not 'deny'"):
        _parsed([], {"NODEGATE_WEBHOOK_UNBOUND_PACKAGES": "deny"})


def test_a_package_bound_twice_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="package kdump is bound more than once"):
        ImagePolicy(package_repositories=(("kdump", ("ghcr.io/a",)), ("lvm", ("ghcr.io/b",)),
                                          ("kdump", ("ghcr.io/c",))))
