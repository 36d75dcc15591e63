"""RBAC-scoped package use: kubectl --as users with and without `use` on packages.nodegate.io."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Kubectl, unique
from tests.integration.conftest import Webhook

ROLES = REPO / "config" / "rbac" / "package-user.yaml"


def gate(name: str, packages: dict[str, str]) -> str:
    lines = [f"apiVersion: nodegate.io/v1alpha1\nkind: NodeGate\nmetadata: {{name: {name}}}\nspec:\n  packages:"]
    lines += [f"    {p}: {{version: {v}, image: ghcr.io/example/{p}}}" for p, v in packages.items()]
    return "\n".join(lines) + "\n" if packages else lines[0] + " {}\n"


def bind(kubectl: Kubectl, user: str, role: str) -> str:
    name = unique(f"{user}-{role}")[:63]
    kubectl.run("create", "clusterrolebinding", name, f"--clusterrole={role}", f"--user={user}")
    return name


@pytest.fixture
def user(kubectl: Kubectl, webhook: Webhook) -> Iterator[tuple[str, list[str]]]:
    """A user who may edit NodeGates but has no package rights yet; bindings are cleaned up."""
    kubectl.run("apply", "-f", str(ROLES))
    name = unique("alice")
    bindings = [bind(kubectl, name, "nodegate-editor")]
    yield name, bindings
    for b in bindings:
        kubectl.run("delete", "clusterrolebinding", b, "--ignore-not-found", check=False)


def test_user_without_use_on_a_package_is_refused_naming_package_and_user(
        kubectl: Kubectl, user: tuple[str, list[str]]) -> None:
    name, _ = user
    proc = kubectl.apply(gate(unique("rbac"), {"nvidia-tuned": "1.0.0"}), as_user=name, check=False)
    assert proc.returncode != 0
    assert f'user "{name}" may not use package "nvidia-tuned"' in proc.stderr, proc.stderr
    assert "spec.packages[nvidia-tuned]" in proc.stderr


def test_scoped_role_allows_only_its_resource_names(kubectl: Kubectl, user: tuple[str, list[str]]) -> None:
    name, bindings = user
    bindings.append(bind(kubectl, name, "nodegate-package-user-gpu"))
    gate_name = unique("rbac")
    try:
        kubectl.apply(gate(gate_name, {"nvidia-tuned": "1.0.0"}), as_user=name)
        # adding a package outside the role's resourceNames is refused, naming only that package
        proc = kubectl.apply(gate(gate_name, {"nvidia-tuned": "1.0.0", "lustre-client": "2.1.0"}),
                             as_user=name, check=False)
        assert proc.returncode != 0
        assert 'may not use package "lustre-client"' in proc.stderr, proc.stderr
        assert 'package "nvidia-tuned"' not in proc.stderr
        # changing a package the user may use is fine
        kubectl.apply(gate(gate_name, {"nvidia-tuned": "1.1.0"}), as_user=name)
    finally:
        kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false", check=False)


def test_unchanged_packages_need_no_use_right(kubectl: Kubectl, user: tuple[str, list[str]]) -> None:
    """An admin created the gate; a user without package rights may still change other fields."""
    name, _ = user
    gate_name = unique("rbac")
    kubectl.apply(gate(gate_name, {"lustre-client": "2.1.0"}))
    try:
        proc = kubectl.run("patch", "nodegates.nodegate.io", gate_name, "--type=merge", "-p",
            '{"spec":{"paused":true}}',
                           as_user=name, check=False)
        assert proc.returncode == 0, proc.stderr
    finally:
        kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false", check=False)


def test_package_user_role_allows_every_package(kubectl: Kubectl, user: tuple[str, list[str]]) -> None:
    name, bindings = user
    bindings.append(bind(kubectl, name, "nodegate-package-user"))
    gate_name = unique("rbac")
    try:
        kubectl.apply(gate(gate_name, {"lustre-client": "2.1.0", "nvidia-tuned": "1.0.0"}), as_user=name)
    finally:
        kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false", check=False)


def test_example_roles_are_valid_rbac(kubectl: Kubectl) -> None:
    assert Path(ROLES).exists()
    proc = kubectl.run("apply", "--dry-run=server", "-f", str(REPO / "config" / "rbac"))
    assert "nodegate-package-user" in proc.stdout
