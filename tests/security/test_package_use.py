"""A package gets into a gate only for a user allowed verb `use` on it, whatever the write looks like.

`kubectl --as` a user who may edit NodeGates (nodegate-editor) but may not use package `evil`, through
the real API server and the admission webhook: create, update (PUT), JSON patch, merge patch,
server-side apply (new and existing gates), client-side apply, and the status subresource. After each
attempt the gate in the cluster is read back: the refusal is not enough, the package must be absent.
Each refused write is then repeated by the same user once `use` on `evil` is granted, and goes
through: the refusal was about the package right, not about the verb.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import yaml

from tests.conftest import REPO, Kubectl, unique
from tests.integration.conftest import Webhook

ROLES = REPO / "config" / "rbac" / "package-user.yaml"
BASE = {"version": "1.0.0", "image": "ghcr.io/example/base"}
EVIL = {"version": "6.6.6", "image": "ghcr.io/attacker/evil"}


def gate(name: str, packages: dict[str, dict[str, str]]) -> dict[str, object]:
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {"nodegate.dev/none": name}}, "paused": True,
                     "packages": packages}}


@dataclass
class User:
    name: str
    kubectl: Kubectl
    bindings: list[str] = field(default_factory=list)
    gates: list[str] = field(default_factory=list)

    def run(self, *args: str, stdin: str | None = None) -> tuple[int, str]:
        proc = self.kubectl.run(*args, stdin=stdin, as_user=self.name, check=False)
        return proc.returncode, proc.stderr + proc.stdout

    def run_once_allowed(self, *args: str, stdin: str | None = None) -> tuple[int, str]:
        """After a grant: the API server's RBAC cache takes a moment to see a new binding, and the
        webhook answers from its cached denial for up to 10 s (a hang guard, not a measure)."""
        deadline = time.monotonic() + 60
        while True:
            code, out = self.run(*args, stdin=stdin)
            if code == 0 or "may not use package" not in out or time.monotonic() > deadline:
                return code, out
            time.sleep(0.2)

    def bind(self, cluster_role: str) -> None:
        binding = unique("sec-bind")
        self.kubectl.run("create", "clusterrolebinding", binding, f"--clusterrole={cluster_role}",
                         f"--user={self.name}")
        self.bindings.append(binding)

    def grant_use(self, package: str) -> None:
        """A ClusterRole allowing `use` on one package, bound to the user (both named alike, both cleaned up)."""
        role = unique(f"use-{package}")
        self.kubectl.apply(yaml.safe_dump({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
            "rules": [{"apiGroups": ["nodegate.io"], "resources": ["packages"], "resourceNames": [package],
                       "verbs": ["use"]}]}))
        self.bindings.append(role)
        self.kubectl.run("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--user={self.name}")

    def grant_evil(self) -> None:
        self.grant_use("evil")


@contextmanager
def base_user(kubectl: Kubectl, prefix: str) -> Iterator[User]:
    """A new user bound to `nodegate-editor` with `use` on package `base` only; their gates, bindings and
    roles are deleted afterwards."""
    kubectl.run("apply", "-f", str(ROLES))
    user = User(unique(prefix), kubectl)
    user.bind("nodegate-editor")
    user.grant_use("base")
    try:
        yield user
    finally:
        for name in user.gates:
            kubectl.run("delete", "nodegates.nodegate.io", name, "--ignore-not-found", "--wait=false", check=False)
        for name in user.bindings:
            kubectl.run("delete", "clusterrolebinding", name, "--ignore-not-found", check=False)
            kubectl.run("delete", "clusterrole", name, "--ignore-not-found", check=False)


@pytest.fixture
def editor(kubectl: Kubectl, webhook: Webhook) -> Iterator[User]:
    """A user who may edit NodeGates and use package `base`, but not `evil`; an admin-made gate using base."""
    with base_user(kubectl, "mallory") as user:
        yield user


def packages_in_cluster(kubectl: Kubectl, name: str) -> set[str] | None:
    proc = kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    return set(json.loads(proc.stdout)["spec"].get("packages") or {})


def existing_gate(kubectl: Kubectl, user: User) -> str:
    name = unique("sec-use")
    kubectl.apply(yaml.safe_dump(gate(name, {"base": BASE})))
    user.gates.append(name)
    return name


def _merge(name: str) -> tuple[str, ...]:
    return ("patch", "nodegates.nodegate.io", name, "--type=merge", "-p",
            json.dumps({"spec": {"packages": {"evil": EVIL}}}))


def _json_add(name: str) -> tuple[str, ...]:
    return ("patch", "nodegates.nodegate.io", name, "--type=json", "-p",
            json.dumps([{"op": "add", "path": "/spec/packages/evil", "value": EVIL}]))


def _json_swap(name: str) -> tuple[str, ...]:
    """Replace the allowed package's whole entry: same name, the attacker's image."""
    return ("patch", "nodegates.nodegate.io", name, "--type=json", "-p",
            json.dumps([{"op": "remove", "path": "/spec/packages/base"},
                        {"op": "add", "path": "/spec/packages/evil", "value": EVIL}]))


WRITES_TO_AN_EXISTING_GATE = {
    "merge patch": lambda name, body: (_merge(name), None),
    "JSON patch add": lambda name, body: (_json_add(name), None),
    "JSON patch swapping a granted package for another": lambda name, body: (_json_swap(name), None),
    "update (PUT)": lambda name, body: (("replace", "-f", "-"), body),
    "server-side apply": lambda name, body: (("apply", "--server-side", "--force-conflicts", "-f", "-"), body),
    "client-side apply": lambda name, body: (("apply", "-f", "-"), body),
}


@pytest.mark.parametrize("write", list(WRITES_TO_AN_EXISTING_GATE))
def test_a_package_cannot_be_added_to_an_existing_gate_without_use(kubectl: Kubectl, editor: User,
                                                                   write: str) -> None:
    name = existing_gate(kubectl, editor)
    live = json.loads(kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json").stdout)
    wanted = gate(name, {"base": BASE, "evil": EVIL})
    if write == "update (PUT)":
        wanted["metadata"] = {"name": name, "resourceVersion": live["metadata"]["resourceVersion"]}
    args, stdin = WRITES_TO_AN_EXISTING_GATE[write](name, yaml.safe_dump(wanted))
    code, out = editor.run(*args, stdin=stdin)
    assert code != 0, out
    assert f'user "{editor.name}" may not use package "evil"' in out, out
    assert 'package "base"' not in out  # only the package the user lacks is named
    assert packages_in_cluster(kubectl, name) == {"base"}
    editor.grant_evil()  # the same write, now allowed
    if write == "update (PUT)":
        live = json.loads(kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json").stdout)
        wanted["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        stdin = yaml.safe_dump(wanted)
    code, out = editor.run_once_allowed(*args, stdin=stdin)
    assert code == 0, out
    assert "evil" in (packages_in_cluster(kubectl, name) or set())


@pytest.mark.parametrize("write", ["create", "server-side apply", "client-side apply"])
def test_a_gate_using_a_package_cannot_be_created_without_use(kubectl: Kubectl, editor: User, write: str) -> None:
    name = unique("sec-new")
    editor.gates.append(name)
    args = {"create": ("create", "-f", "-"), "server-side apply": ("apply", "--server-side", "-f", "-"),
            "client-side apply": ("apply", "-f", "-")}[write]
    body = yaml.safe_dump(gate(name, {"base": BASE, "evil": EVIL}))
    code, out = editor.run(*args, stdin=body)
    assert code != 0 and f'user "{editor.name}" may not use package "evil"' in out, out
    assert packages_in_cluster(kubectl, name) is None
    editor.grant_evil()
    code, out = editor.run_once_allowed(*args, stdin=body)
    assert code == 0, out
    assert packages_in_cluster(kubectl, name) == {"base", "evil"}


def test_a_granted_package_cannot_be_pointed_at_another_image_without_use(kubectl: Kubectl, editor: User) -> None:
    """`use` on base does not cover an admin-added package: changing any field of it needs `use` on it."""
    name = unique("sec-img")
    kubectl.apply(yaml.safe_dump(gate(name, {"base": BASE, "evil": EVIL})))  # the admin added evil
    editor.gates.append(name)
    for patch in ([{"op": "replace", "path": "/spec/packages/evil/image", "value": "ghcr.io/attacker/worse"}],
                  [{"op": "add", "path": "/spec/packages/evil/env", "value": [{"name": "X", "value": "1"}]}]):
        code, out = editor.run("patch", "nodegates.nodegate.io", name, "--type=json", "-p", json.dumps(patch))
        assert code != 0 and 'may not use package "evil"' in out, out
    live = json.loads(kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json").stdout)
    assert live["spec"]["packages"]["evil"] == EVIL
    # ... while the package the user may use can change, and fields outside packages need no right
    code, out = editor.run("patch", "nodegates.nodegate.io", name, "--type=merge", "-p",
                           json.dumps({"spec": {"paused": False, "packages": {"base": {"version": "1.1.0"}}}}))
    assert code == 0, out


def test_the_status_subresource_cannot_carry_a_package_in(kubectl: Kubectl, editor: User) -> None:
    """A user who may write nodegates/status (the webhook skips it) still cannot change the spec there."""
    name = existing_gate(kubectl, editor)
    role = unique("status-writer")
    kubectl.run("create", "clusterrole", role, "--verb=get,patch,update",
                "--resource=nodegates.nodegate.io/status")
    editor.bindings.append(role)
    kubectl.run("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--user={editor.name}")
    code, out = editor.run("patch", "nodegates.nodegate.io", name, "--subresource=status", "--type=merge", "-p",
                           json.dumps({"spec": {"packages": {"evil": EVIL}}, "status": {"observedGeneration": 1}}))
    assert code == 0, out  # accepted: the status subresource ignores the spec
    assert packages_in_cluster(kubectl, name) == {"base"}


def test_a_package_cannot_be_handed_a_secret_its_author_may_not_read(kubectl: Kubectl, editor: User) -> None:
    """Stage pods run in the operator's namespace and receive the Secrets a package's env names: using
    a package does not let its author make NodeGate read the webhook's CA key for them."""
    name = existing_gate(kubectl, editor)
    steal = [{"op": "add", "path": "/spec/packages/base/env", "value": [
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "nodegate-webhook-tls", "key": "signer.key"}}}]}]
    code, out = editor.run("patch", "nodegates.nodegate.io", name, "--type=json", "-p", json.dumps(steal))
    assert code != 0, out
    assert f'user "{editor.name}" may not get Secret "nodegate-webhook-tls" in namespace nodegate-system' in out, out
    live = json.loads(kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json").stdout)
    assert "env" not in live["spec"]["packages"]["base"]
    # Allowed to read that Secret there, the same author may name it.
    role = unique("read-tls")
    kubectl.run("create", "role", role, "-n", "nodegate-system", "--verb=get", "--resource=secrets",
                "--resource-name=nodegate-webhook-tls")
    kubectl.run("create", "rolebinding", role, "-n", "nodegate-system", f"--role={role}", f"--user={editor.name}")
    try:
        deadline = time.monotonic() + 60  # RBAC's propagation and the webhook's 10 s cache of the denial
        while True:
            code, out = editor.run("patch", "nodegates.nodegate.io", name, "--type=json", "-p", json.dumps(steal))
            if code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert code == 0, out
    finally:
        kubectl.run("delete", "rolebinding,role", role, "-n", "nodegate-system", "--ignore-not-found", check=False)


def test_where_root_code_runs_cannot_be_widened_without_use_on_every_package(kubectl: Kubectl,
                                                                             editor: User) -> None:
    """`patch nodegates` and `use` on base, on a gate an admin gave evil too: widening the selector,
    adding tolerations, raising the budget would run evil on more nodes, so each needs `use` on evil."""
    name = unique("sec-where")
    kubectl.apply(yaml.safe_dump(gate(name, {"base": BASE, "evil": EVIL})))
    editor.gates.append(name)
    widen = [[{"op": "replace", "path": "/spec/nodeSelector", "value": {}}],  # every node
             [{"op": "add", "path": "/spec/additionalTolerations", "value": [{"operator": "Exists"}]}],
             [{"op": "add", "path": "/spec/interruptionBudget", "value": {"percent": 100}}]]
    for patch in widen:
        code, out = editor.run("patch", "nodegates.nodegate.io", name, "--type=json", "-p", json.dumps(patch))
        assert code != 0 and 'decides where package "evil" runs as root' in out, (patch, out)
        assert 'package "base"' not in out, out
    live = json.loads(kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json").stdout)
    assert live["spec"]["nodeSelector"] == {"matchLabels": {"nodegate.dev/none": name}}
    assert "additionalTolerations" not in live["spec"] or live["spec"]["additionalTolerations"] == []
    editor.grant_evil()
    deadline = time.monotonic() + 60  # RBAC and the webhook's 10 s cache of the denial (a hang guard)
    while True:
        code, out = editor.run("patch", "nodegates.nodegate.io", name, "--type=json", "-p", json.dumps(widen[0]))
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert code == 0, out
