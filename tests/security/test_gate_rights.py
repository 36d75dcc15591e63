"""Package rights reach past a gate's spec (issue 33, items 4, 7 and 8), through the real API server.

* A gate deleter without `use` on each of the gate's packages cannot delete it: deleting a gate
  uninstalls its packages wherever it ran, as removing them by an update does.
* A policy editor without `use` on the packages of the gates that name a DeploymentPolicy cannot
  change it (its budget decides how disruptively those packages roll out); deleting it stays refused
  while a gate names it, as before.
* A `readinessTaint` gate selecting on a label a kubelet may set on its own Node is admitted with a
  warning naming the key and its `node-restriction.kubernetes.io/` form; that form draws none.

Each refused write is repeated once the right is granted, and passes: the refusal was the right.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import yaml

from tests.conftest import Kubectl, unique
from tests.integration.conftest import Webhook
from tests.security.test_package_use import BASE, EVIL, User, base_user, gate


@pytest.fixture
def person(kubectl: Kubectl, webhook: Webhook) -> Iterator[User]:
    """A user who may edit NodeGates and DeploymentPolicies and use package `base`, nothing more."""
    with base_user(kubectl, "eve") as user:
        yield user


@pytest.fixture
def policies(kubectl: Kubectl) -> Iterator[list[str]]:
    """Names of DeploymentPolicies to delete at the end (after the gates naming them: `person` goes first)."""
    names: list[str] = []
    yield names
    for name in names:
        kubectl.run("delete", "deploymentpolicies.nodegate.io", name, "--ignore-not-found", "--wait=false",
                    check=False)


def _until_allowed(user: User, *args: str) -> tuple[int, str]:
    """After a grant: RBAC informers, and the webhook's 10 s cache of the denial."""
    deadline = time.monotonic() + 60
    while True:
        code, out = user.run(*args)
        if code == 0 or "which needs verb" not in out or time.monotonic() > deadline:
            return code, out
        time.sleep(0.3)


def _exists(kubectl: Kubectl, kind: str, name: str) -> bool:
    return kubectl.run("get", kind, name, "--ignore-not-found", "-o", "name").stdout.strip() != ""


def test_a_gate_deleter_without_use_on_its_packages_cannot_delete_it(kubectl: Kubectl, person: User) -> None:
    name = unique("sec-del")
    body = gate(name, {"base": BASE, "evil": EVIL})
    body["metadata"]["labels"] = {"sec-del": name}  # type: ignore[index]
    kubectl.apply(yaml.safe_dump(body))
    person.gates.append(name)
    code, out = person.run("delete", "nodegates.nodegate.io", name, "--wait=false")
    assert code != 0 and f'may not delete NodeGate "{name}"' in out and 'package "evil"' in out, out
    assert 'package "base"' not in out  # the package it may use is not what refused it
    # a collection delete (deletecollection, granted here) is judged gate by gate the same way
    role = unique("sec-delcol")
    kubectl.run("create", "clusterrole", role, "--verb=deletecollection", "--resource=nodegates.nodegate.io")
    person.bindings.append(role)
    kubectl.run("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--user={person.name}")
    collection = f"/apis/nodegate.io/v1alpha1/nodegates?labelSelector=sec-del%3D{name}"
    deadline = time.monotonic() + 30
    while "forbidden" in (out := person.run("delete", "--raw", collection)[1]) and "may not delete" not in out:
        assert time.monotonic() < deadline, out  # RBAC informers take a moment to see the new binding
        time.sleep(0.3)
    assert f'may not delete NodeGate "{name}"' in out, out
    assert _exists(kubectl, "nodegates.nodegate.io", name)
    person.grant_use("evil")
    code, out = _until_allowed(person, "delete", "nodegates.nodegate.io", name, "--wait=false")
    assert code == 0, out


def test_a_policy_editor_without_use_cannot_change_a_policy_a_gate_names(
        kubectl: Kubectl, policies: list[str], person: User) -> None:
    policy, unnamed, name = unique("sec-pol"), unique("sec-pol-free"), unique("sec-pol-gate")
    policies += [policy, unnamed]
    body = {"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": policy},
            "spec": {"default": {"budget": {"count": 1}}}}
    kubectl.apply(yaml.safe_dump(body))
    named = gate(name, {"base": BASE, "evil": EVIL})
    named["spec"]["deploymentPolicy"] = policy  # type: ignore[index]
    kubectl.apply(yaml.safe_dump(named))
    person.gates.append(name)
    patch = ("patch", "deploymentpolicies.nodegate.io", policy, "--type=merge", "-p",
             '{"spec": {"default": {"budget": {"count": 5}}}}')
    wider = {**body, "spec": {"default": {"budget": {"count": 5}}}}
    writes: dict[str, tuple[tuple[str, ...], str | None]] = {
        "merge patch": (patch, None),
        "JSON patch": (("patch", "deploymentpolicies.nodegate.io", policy, "--type=json", "-p",
                        '[{"op": "replace", "path": "/spec/default/budget/count", "value": 5}]'), None),
        "update (PUT)": (("replace", "-f", "-"), yaml.safe_dump(wider)),
        "server-side apply": (("apply", "--server-side", "--force-conflicts", "-f", "-"), yaml.safe_dump(wider)),
        "client-side apply": (("apply", "-f", "-"), yaml.safe_dump(wider)),
    }
    for how, (args, stdin) in writes.items():
        code, out = person.run(*args, stdin=stdin)
        assert code != 0 and f'change DeploymentPolicy "{policy}"' in out and f"NodeGate(s) {name}" in out, (how, out)
        assert 'package "evil"' in out and 'package "base"' not in out, (how, out)
    code, out = person.run("delete", "deploymentpolicies.nodegate.io", policy)
    assert code != 0 and "still referenced" in out, out  # as before: a policy in use is never deleted
    assert '"count":1' in kubectl.run("get", "deploymentpolicies.nodegate.io", policy, "-o",
                                      "jsonpath={.spec.default.budget}").stdout.replace(" ", "")
    # a policy no gate names needs no package right
    free = {**body, "metadata": {"name": unnamed}}
    code, out = person.run("apply", "-f", "-", stdin=yaml.safe_dump(free))
    assert code == 0, out
    person.grant_use("evil")
    code, out = _until_allowed(person, *patch)
    assert code == 0, out


def test_a_readiness_taint_gate_on_a_kubelet_settable_label_is_warned(kubectl: Kubectl, webhook: Webhook) -> None:
    def warnings(selector: dict[str, str]) -> list[str]:
        body = gate(unique("sec-warn"), {"base": BASE})
        body["spec"].update(readinessTaint=True, nodeSelector={"matchLabels": selector})  # type: ignore[union-attr]
        proc = kubectl.run("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(body))
        return [line for line in proc.stderr.splitlines() if line.startswith("Warning:")]

    [warned] = warnings({"pool": "gpu"})
    assert '"pool"' in warned and '"node-restriction.kubernetes.io/pool"' in warned, warned
    [warned] = warnings({"kubernetes.io/hostname": "n1"})
    assert '"node-restriction.kubernetes.io/hostname"' in warned, warned
    assert warnings({"node-restriction.kubernetes.io/pool": "gpu"}) == []
