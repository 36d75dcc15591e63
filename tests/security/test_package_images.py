"""Package rights bind images: `use` on sysctl-tuning does not let a user run another repository's
image under that key, with the chart's default values.

The attacker is a user who may edit NodeGates (nodegate-editor) and `use` package sysctl-tuning, and
nothing more, writing through kubectl, the real API server and admission. The webhook that judges is
a second `nodegate webhook serve` whose image-policy environment is exactly what the chart's default
values render into the webhook Deployment (webhook.imagePolicy: the catalog bound, unbound names
allowed), registered by a ValidatingWebhookConfiguration of its own whose objectSelector limits it
to this module's gates. The label is this test's scoping, not part of the defence: the chart's
configuration selects every NodeGate. The session's webhook binds nothing and keeps judging
everything, the RBAC check on `use` included.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml

from gate.admission.configuration import webhook_configurations
from gate.certs.rotation import TRUST_BUNDLE
from gate.cli.manifests import CHART, documents, render
from gate.devcluster.cluster import DevCluster, free_port
from gate.devcluster.services import python_env
from tests.chart.outofcluster import log_of, wait_https
from tests.conftest import REPO, Kubectl, unique
from tests.integration.conftest import Webhook

ROLES = REPO / "config" / "rbac" / "package-user.yaml"
LABEL = "nodegate.dev/package-images-test"
BOUND = "ghcr.io/example/nodegate-sysctl-tuning"  # packages/sysctl-tuning/nodegate.yaml
DIGEST = "sha256:" + "7a" * 32
POLICY_ENV = ("NODEGATE_WEBHOOK_ALLOWED_IMAGE_REPOSITORIES", "NODEGATE_WEBHOOK_REQUIRE_IMAGE_DIGEST",
              "NODEGATE_WEBHOOK_PACKAGE_REPOSITORIES", "NODEGATE_WEBHOOK_UNBOUND_PACKAGES")
# Other repositories' images under the key sysctl-tuning: an attacker's, another catalog package's,
# and one whose name merely starts with the bound repository's.
FOREIGN = ["quay.io/attacker/sysctl-tuning", "ghcr.io/example/nodegate-tuning", f"{BOUND}-evil",
           "example/nodegate-sysctl-tuning"]


def chart_default_image_policy_env() -> dict[str, str]:
    """The image-policy variables of the webhook container, as `helm template` renders the chart's defaults."""
    objs = [d.obj for d in documents(render(REPO / CHART, namespace="nodegate-system", values=None))]
    [deployment] = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "nodegate-webhook"]
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
           if "value" in e}
    assert "NODEGATE_WEBHOOK_PACKAGE_REPOSITORIES" in env, "the chart's defaults bind no package"
    return {name: env[name] for name in POLICY_ENV if name in env}


def gate(name: str, image: str, *, key: str = "sysctl-tuning", label: str) -> dict[str, object]:
    return {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate",
            "metadata": {"name": name, "labels": {LABEL: label}},
            "spec": {"nodeSelector": {"matchLabels": {"nodegate.dev/none": name}}, "paused": True,
                     "packages": {key: {"version": "1.0.0", "image": image, "interrupt": {"type": "none"}}}}}


@pytest.fixture(scope="module")
def chart_webhook(cluster: DevCluster, kubectl: Kubectl, webhook: Webhook) -> Iterator[str]:
    """The label value that routes a gate to a webhook configured as the chart's defaults configure it."""
    name = unique("ng-bound")
    port = free_port()
    argv = [sys.executable, "-m", "gate.cli.main", "webhook", "serve", "--kubeconfig", str(cluster.kubeconfig),
            "--listen", f"127.0.0.1:{port}", "--cert-mode", "self-managed", "--hosts", "127.0.0.1",
            "--secret-namespace", "nodegate-system", "--secret-name", f"{name}-tls", "--configuration-name", name]
    cluster.register(name, argv, {**python_env(), **chart_default_image_policy_env()})
    try:
        wait_https(f"https://127.0.0.1:{port}/readyz", cluster=cluster, process=name)
        secret = yaml.safe_load(kubectl.run("get", "secret", "-n", "nodegate-system", f"{name}-tls",
                                            "-o", "yaml").stdout)
        bundle = base64.b64decode(secret["data"][TRUST_BUNDLE])
        validating, _ = webhook_configurations(mode="url", url=f"https://127.0.0.1:{port}", ca_bundle=bundle, name=name)
        hooks = [h for h in validating["webhooks"] if any("nodegates" in r["resources"] for r in h["rules"])]
        assert len(hooks) == 1, [h["name"] for h in validating["webhooks"]]
        hooks[0]["objectSelector"] = {"matchLabels": {LABEL: name}}
        kubectl.apply(yaml.safe_dump({**validating, "webhooks": hooks}))
        probe = yaml.safe_dump(gate(unique("probe"), FOREIGN[0], label=name))
        deadline = time.monotonic() + 60
        while True:  # the API server picks up a new configuration within moments (a hang guard)
            proc = kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=probe, check=False)
            if proc.returncode != 0 and "not from a repository bound to that package" in proc.stderr:
                break
            assert time.monotonic() < deadline, f"the chart-configured webhook never judged: {proc.stderr}"
            time.sleep(0.3)
        yield name
    finally:
        kubectl.run("delete", "validatingwebhookconfiguration", name, "--ignore-not-found", check=False)
        kubectl.run("delete", "secret", "-n", "nodegate-system", f"{name}-tls", "--ignore-not-found", check=False)
        print(f"\nchart-configured webhook log tail:\n{log_of(cluster, name)[-1500:]}")
        cluster.stop_process(name)


@dataclass
class User:
    name: str
    kubectl: Kubectl
    cleanup: list[str] = field(default_factory=list)
    gates: list[str] = field(default_factory=list)

    def run(self, *args: str, stdin: str | None = None) -> tuple[int, str]:
        proc = self.kubectl.run(*args, stdin=stdin, as_user=self.name, check=False)
        return proc.returncode, proc.stderr + proc.stdout

    def run_allowed(self, *args: str, stdin: str | None = None) -> tuple[int, str]:
        """A write the user is allowed: retried while the API server's RBAC cache has not yet seen the
        user's new bindings (a hang guard, not a measure)."""
        deadline = time.monotonic() + 60
        while True:
            code, out = self.run(*args, stdin=stdin)
            if code == 0 or "may not use package" not in out or time.monotonic() > deadline:
                return code, out
            time.sleep(0.2)


@pytest.fixture
def sysctl_user(kubectl: Kubectl, chart_webhook: str) -> Iterator[User]:
    """May edit NodeGates and use package sysctl-tuning, and nothing else."""
    kubectl.run("apply", "-f", str(ROLES))
    user = User(unique("eve"), kubectl)
    editor = unique("sec-editor")
    kubectl.run("create", "clusterrolebinding", editor, "--clusterrole=nodegate-editor", f"--user={user.name}")
    user.cleanup.append(editor)
    role = unique("use-sysctl-tuning")
    kubectl.apply(yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
        "rules": [{"apiGroups": ["nodegate.io"], "resources": ["packages"], "resourceNames": ["sysctl-tuning"],
                   "verbs": ["use"]}]}))
    kubectl.run("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--user={user.name}")
    user.cleanup.append(role)
    try:
        yield user
    finally:
        for name in user.gates:
            kubectl.run("delete", "nodegates.nodegate.io", name, "--ignore-not-found", "--wait=false", check=False)
        for name in user.cleanup:
            kubectl.run("delete", "clusterrolebinding", name, "--ignore-not-found", check=False)
            kubectl.run("delete", "clusterrole", name, "--ignore-not-found", check=False)


def live_image(kubectl: Kubectl, name: str) -> str | None:
    proc = kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    return str(json.loads(proc.stdout)["spec"]["packages"]["sysctl-tuning"]["image"])


def refusal(image: str) -> str:
    return (f'spec.packages[sysctl-tuning].image: image "{image}" of package "sysctl-tuning" is not from a '
            f"repository bound to that package (imagePolicy.packages.sysctl-tuning: {BOUND}; ")


def test_a_user_with_use_on_sysctl_tuning_creates_a_gate_only_with_its_bound_image(
        kubectl: Kubectl, chart_webhook: str, sysctl_user: User) -> None:
    name = unique("sec-bound")
    sysctl_user.gates.append(name)
    # first the bound image, which the user may run (this also waits out RBAC's propagation)
    code, out = sysctl_user.run_allowed("create", "--dry-run=server", "-f", "-",
                                        stdin=yaml.safe_dump(gate(name, f"{BOUND}@{DIGEST}", label=chart_webhook)))
    assert code == 0, out
    for image in FOREIGN:
        code, out = sysctl_user.run("create", "-f", "-", stdin=yaml.safe_dump(gate(name, image, label=chart_webhook)))
        assert code != 0, out
        assert refusal(image) in out, out
        assert "webhook.imagePolicy.packages.sysctl-tuning" in out
        assert live_image(kubectl, name) is None
    code, out = sysctl_user.run("create", "-f", "-", stdin=yaml.safe_dump(gate(name, BOUND, label=chart_webhook)))
    assert code == 0, out
    assert live_image(kubectl, name) == BOUND


@pytest.mark.parametrize("write", ["JSON patch", "merge patch", "update (PUT)", "server-side apply"])
def test_a_user_with_use_on_sysctl_tuning_cannot_point_it_at_another_repository(
        kubectl: Kubectl, chart_webhook: str, sysctl_user: User, write: str) -> None:
    name = unique("sec-swap")
    sysctl_user.gates.append(name)
    code, out = sysctl_user.run_allowed("create", "-f", "-", stdin=yaml.safe_dump(gate(name, BOUND,
                                                                                       label=chart_webhook)))
    assert code == 0, out

    def attempt(image: str) -> tuple[int, str]:
        if write == "JSON patch":
            patch = [{"op": "replace", "path": "/spec/packages/sysctl-tuning/image", "value": image}]
            return sysctl_user.run("patch", "nodegates.nodegate.io", name, "--type=json", "-p", json.dumps(patch))
        if write == "merge patch":
            patch = {"spec": {"packages": {"sysctl-tuning": {"image": image}}}}
            return sysctl_user.run("patch", "nodegates.nodegate.io", name, "--type=merge", "-p", json.dumps(patch))
        wanted = gate(name, image, label=chart_webhook)
        if write == "update (PUT)":
            live = json.loads(kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json").stdout)
            wanted["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]  # type: ignore[index]
            return sysctl_user.run("replace", "-f", "-", stdin=yaml.safe_dump(wanted))
        return sysctl_user.run("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump(wanted))

    for image in FOREIGN:
        code, out = attempt(image)
        assert code != 0, (image, out)
        assert refusal(image) in out, out
        assert live_image(kubectl, name) == BOUND
    # the same write with an image of the bound repository goes through
    code, out = attempt(f"{BOUND}@{DIGEST}")
    assert code == 0, out
    assert live_image(kubectl, name) == f"{BOUND}@{DIGEST}"


def test_another_key_for_the_same_image_needs_use_on_that_key(kubectl: Kubectl, chart_webhook: str,
                                                               sysctl_user: User) -> None:
    """Unbound names are allowed by the chart's defaults, but only to users who may use them: moving
    the attacker's image to a key of its own meets the RBAC check on that key."""
    name = unique("sec-key")
    sysctl_user.gates.append(name)
    code, out = sysctl_user.run_allowed("create", "--dry-run=server", "-f", "-",
                                        stdin=yaml.safe_dump(gate(name, BOUND, label=chart_webhook)))
    assert code == 0, out
    body = yaml.safe_dump(gate(name, FOREIGN[0], key="my-sysctl", label=chart_webhook))
    code, out = sysctl_user.run("create", "-f", "-", stdin=body)
    assert code != 0 and f'user "{sysctl_user.name}" may not use package "my-sysctl"' in out, out
    assert kubectl.run("get", "nodegates.nodegate.io", name, check=False).returncode != 0


def test_the_binding_holds_for_cluster_admins_too(kubectl: Kubectl, chart_webhook: str) -> None:
    """A cluster policy, not a right: system:masters passes every RBAC check and is still refused."""
    name = unique("sec-admin")
    proc = kubectl.run("create", "-f", "-", stdin=yaml.safe_dump(gate(name, FOREIGN[0], label=chart_webhook)),
                       check=False)
    assert proc.returncode != 0
    assert refusal(FOREIGN[0]) in proc.stderr, proc.stderr
    assert live_image(kubectl, name) is None


ATTACK_ENV = [{"name": "PYTHONPATH", "value": "/nodegate-config"},
              {"name": "PYTHONWARNINGS", "value": "all:0:antigravity.x:0:0"},
              {"name": "BROWSER", "value": "/bin/sh -c 'touch /nodegate-pwned' #%s"},
              {"name": "LD_PRELOAD", "value": "/nodegate-config/x.so"},
              {"name": "BASH_ENV", "value": "/nodegate-config/x.sh"},
              {"name": "PATH", "value": "/nodegate-config:/usr/bin"}]


def test_a_user_with_use_on_sysctl_tuning_cannot_give_it_loader_or_interpreter_variables(
        kubectl: Kubectl, chart_webhook: str, sysctl_user: User) -> None:
    """Issue 33: the catalog's sysctl-tuning gate with its bound image, plus env that would make the
    agent's interpreter (or the package's scripts) run a config key as code. Each name is refused by
    admission, named by its field, on create and on a patch of the user's own gate; and so is input
    the bound catalog package does not declare."""
    name = unique("sec-env")
    sysctl_user.gates.append(name)
    attack = gate(name, BOUND, label=chart_webhook)
    attack["spec"]["packages"]["sysctl-tuning"].update(  # type: ignore[index]
        env=ATTACK_ENV, config={"sitecustomize.py": "open('/nodegate-pwned', 'w').close()\n"})
    code, out = sysctl_user.run_allowed("create", "-f", "-", stdin=yaml.safe_dump(attack))
    assert code != 0, out
    for i, var in enumerate(ATTACK_ENV):
        assert f"spec.packages[sysctl-tuning].env[{i}].name: env {var['name']} is refused: " in out, (var, out)
    assert live_image(kubectl, name) is None
    # The same gate without the env is the user's to create; the env cannot be patched in either.
    code, out = sysctl_user.run_allowed("create", "-f", "-", stdin=yaml.safe_dump(gate(name, BOUND,
                                                                                       label=chart_webhook)))
    assert code == 0, out
    patch = {"spec": {"packages": {"sysctl-tuning": {"env": [{"name": "PYTHONPATH", "value": "/nodegate-config"}]}}}}
    code, out = sysctl_user.run("patch", "nodegates.nodegate.io", name, "--type=merge", "-p", json.dumps(patch))
    assert code != 0 and "spec.packages[sysctl-tuning].env[0].name: env PYTHONPATH is refused: " in out, out
    # What the catalog's sysctl-tuning does not declare, though no loader variable: a config key (it
    # declares no config) and another env name. The chart-configured webhook knows the bound catalog
    # package's declarations (gate.admission.rules.inputs) and refuses both by field.
    patch = {"spec": {"packages": {"sysctl-tuning": {"config": {"sitecustomize.py": "import os\n"},
                                                     "env": [{"name": "TUNING", "value": "1"}]}}}}
    code, out = sysctl_user.run("patch", "nodegates.nodegate.io", name, "--type=merge", "-p", json.dumps(patch))
    assert code != 0, out
    assert ("spec.packages[sysctl-tuning].config[sitecustomize.py]: config key 'sitecustomize.py' is not accepted: "
            "package sysctl-tuning 1.0.0 (docs/catalog.md#sysctl-tuning) declares no config") in out, out
    assert "spec.packages[sysctl-tuning].env[0].name: env TUNING is not declared by package sysctl-tuning" in out
    live = json.loads(kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json").stdout)
    assert not live["spec"]["packages"]["sysctl-tuning"].get("env")
    assert not live["spec"]["packages"]["sysctl-tuning"].get("config")
