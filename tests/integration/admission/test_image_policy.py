"""Image policy against the real API server, applied with kubectl, two ways:

* the webhook's own (`--allowed-image-repositories`, `--require-image-digest`): a second webhook
  process configured like the chart's `webhook.imagePolicy` safe setting, registered by a
  ValidatingWebhookConfiguration of its own whose objectSelector limits it to this test's gates (the
  session's webhook keeps judging everything, allow-all, as before);
* the ValidatingAdmissionPolicy of examples/policy/image-policy-vap.yaml: the policy and its
  parameter ConfigMap as shipped, the binding as shipped plus an objectSelector for the same reason.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from gate.admission.configuration import webhook_configurations
from gate.api.common import Obj
from gate.certs.rotation import TRUST_BUNDLE
from gate.devcluster.cluster import DevCluster, free_port
from gate.devcluster.services import python_env
from tests.chart.outofcluster import log_of, wait_https
from tests.conftest import REPO, Kubectl, unique
from tests.integration.conftest import Webhook

DIGEST = "sha256:" + "5e" * 32
LABEL = "nodegate.dev/image-policy-test"
ALLOWED = ("registry.example.com/approved", "ghcr.io/acme")
VAP_EXAMPLE = REPO / "examples" / "policy" / "image-policy-vap.yaml"


def gate_yaml(name: str, packages: dict[str, str], *, label: str | None, version: str = "1.0.0",
              paused: bool = False) -> str:
    gate: Obj = {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate",
                 "metadata": {"name": name, "labels": {LABEL: label} if label else {}},
                 "spec": {"nodeSelector": {"matchLabels": {"nodegate.dev/selects": "nothing"}}, "paused": paused,
                          "packages": {k: {"version": version, "image": img} for k, img in packages.items()}}}
    return yaml.safe_dump(gate)


@dataclass(frozen=True)
class PolicyWebhook:
    name: str
    label: str  # the objectSelector value: gates carrying LABEL=label are judged by this webhook


def _wait_refused(kubectl: Kubectl, manifest: str, needle: str, *, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        proc = kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=manifest, check=False)
        if proc.returncode != 0 and needle in proc.stderr:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not refuse within {timeout:.0f}s: {proc.stdout}{proc.stderr}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def policy_webhook(cluster: DevCluster, kubectl: Kubectl, webhook: Webhook) -> Iterator[PolicyWebhook]:
    import sys

    name = unique("ng-images")
    port = free_port()
    argv = [sys.executable, "-m", "gate.cli.main", "webhook", "serve", "--kubeconfig", str(cluster.kubeconfig),
            "--listen", f"127.0.0.1:{port}", "--cert-mode", "self-managed", "--hosts", "127.0.0.1",
            "--secret-namespace", "nodegate-system", "--secret-name", f"{name}-tls", "--configuration-name", name,
            "--allowed-image-repositories", ",".join(ALLOWED), "--require-image-digest"]
    cluster.register(name, argv, python_env())
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
        _wait_refused(kubectl, gate_yaml(unique("probe"), {"probe": "quay.io/x/probe@" + DIGEST}, label=name),
                      "outside the allowed repositories", what="the image-policy webhook")
        yield PolicyWebhook(name, name)
    finally:
        kubectl.run("delete", "validatingwebhookconfiguration", name, "--ignore-not-found", check=False)
        kubectl.run("delete", "secret", "-n", "nodegate-system", f"{name}-tls", "--ignore-not-found", check=False)
        print(f"\nimage-policy webhook log tail:\n{log_of(cluster, name)[-1500:]}")
        cluster.stop_process(name)


ADMITTED = [
    {"tuned": f"registry.example.com/approved/tuned@{DIGEST}"},
    {"agent": f"ghcr.io/acme/team/agent@{DIGEST}", "tuned": f"ghcr.io/acme/tuned:1.0.0@{DIGEST}"},
]
REFUSED = [
    ({"tuned": f"quay.io/evil/tuned@{DIGEST}"}, "tuned", "is outside the allowed repositories"),
    ({"tuned": f"registry.example.com/approved-evil/tuned@{DIGEST}"}, "tuned", "is outside the allowed repositories"),
    ({"hub": f"acme/tuned@{DIGEST}"}, "hub", "it resolves to docker.io/acme/tuned"),
    ({"tuned": "ghcr.io/acme/tuned"}, "tuned", "has no digest, and the cluster requires one "
                                               "(imagePolicy.requireDigest: true)"),
]


@pytest.mark.parametrize("packages", ADMITTED, ids=lambda p: ",".join(p.values()))
def test_the_webhook_admits_gates_whose_images_are_allowed_and_pinned(
        kubectl: Kubectl, policy_webhook: PolicyWebhook, packages: dict[str, str]) -> None:
    name = unique("img-ok")
    proc = kubectl.apply(gate_yaml(name, packages, label=policy_webhook.label))
    assert f"nodegate.nodegate.io/{name} created" in proc.stdout
    kubectl.run("delete", "nodegates.nodegate.io", name, "--wait=false")


@pytest.mark.parametrize(("packages", "key", "rule"), REFUSED, ids=lambda v: ",".join(v.values())
                         if isinstance(v, dict) else str(v)[:24])
def test_the_webhook_refuses_an_image_outside_the_list_or_without_a_digest_naming_key_image_and_rule(
        kubectl: Kubectl, policy_webhook: PolicyWebhook, packages: dict[str, str], key: str, rule: str) -> None:
    proc = kubectl.apply(gate_yaml(unique("img-bad"), packages, label=policy_webhook.label), check=False)
    assert proc.returncode != 0
    image = packages[key]
    assert f'denied the request: spec.packages[{key}].image: image "{image}" of package "{key}"' in proc.stderr, \
        proc.stderr
    assert rule in proc.stderr
    if "outside" in rule:
        assert "imagePolicy.allowedRepositories: registry.example.com/approved, ghcr.io/acme" in proc.stderr


def test_a_gate_admitted_before_the_policy_can_be_paused_but_not_given_a_new_version_of_its_image(
        kubectl: Kubectl, policy_webhook: PolicyWebhook) -> None:
    name = unique("img-old")
    legacy = {"legacy": "quay.io/old/tool"}
    kubectl.apply(gate_yaml(name, legacy, label=None))  # not selected: admitted under "any image"
    try:
        paused = kubectl.apply(gate_yaml(name, legacy, label=policy_webhook.label, paused=True))
        assert "configured" in paused.stdout
        bumped = kubectl.apply(gate_yaml(name, legacy, label=policy_webhook.label, version="1.1.0"), check=False)
        assert bumped.returncode != 0
        assert 'spec.packages[legacy].image: image "quay.io/old/tool" of package "legacy"' in bumped.stderr
    finally:
        kubectl.run("delete", "nodegates.nodegate.io", name, "--wait=false")


def test_gates_outside_the_webhooks_object_selector_are_not_judged_by_it(kubectl: Kubectl,
                                                                         policy_webhook: PolicyWebhook) -> None:
    # the scope of this test's configuration, and the default of the session's webhook: any image
    proc = kubectl.run("apply", "--dry-run=server", "-f", "-", check=False,
                       stdin=gate_yaml(unique("img-any"), {"tuned": "quay.io/evil/tuned"}, label=None))
    assert proc.returncode == 0, proc.stderr


# -- the ValidatingAdmissionPolicy example -----------------------------------------------------------

@dataclass(frozen=True)
class Vap:
    label: str
    params: Obj
    binding: str


@pytest.fixture(scope="module")
def vap(kubectl: Kubectl, webhook: Webhook) -> Iterator[Vap]:
    docs = [d for d in yaml.safe_load_all(VAP_EXAMPLE.read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert set(by_kind) == {"ValidatingAdmissionPolicy", "ConfigMap", "ValidatingAdmissionPolicyBinding"}
    label = unique("vap")
    params = {**by_kind["ConfigMap"], "metadata": {**by_kind["ConfigMap"]["metadata"], "name": label}}
    binding = by_kind["ValidatingAdmissionPolicyBinding"]
    binding = {**binding, "metadata": {"name": label},
               "spec": {**binding["spec"], "paramRef": {**binding["spec"]["paramRef"], "name": label},
                        "matchResources": {"objectSelector": {"matchLabels": {LABEL: label}}}}}
    policy = by_kind["ValidatingAdmissionPolicy"]
    kubectl.apply(yaml.safe_dump(policy))
    kubectl.apply(yaml.safe_dump(params))
    kubectl.apply(yaml.safe_dump(binding))
    try:
        _wait_refused(kubectl, gate_yaml(unique("probe"), {"probe": "quay.io/x/probe@" + DIGEST}, label=label),
                      "outside the allowed repositories", what="the ValidatingAdmissionPolicy")
        yield Vap(label, params, label)
    finally:
        kubectl.run("delete", "validatingadmissionpolicybinding", label, "--ignore-not-found", check=False)
        kubectl.run("delete", "configmap", "-n", params["metadata"]["namespace"], label, "--ignore-not-found",
                    check=False)
        kubectl.run("delete", "validatingadmissionpolicy", policy["metadata"]["name"], "--ignore-not-found",
                    check=False)


def test_the_example_policy_type_checks_against_the_nodegate_crd(kubectl: Kubectl, vap: Vap) -> None:
    deadline = time.monotonic() + 30
    while True:
        policy = yaml.safe_load(kubectl.run("get", "validatingadmissionpolicy", "nodegate-image-policy",
                                            "-o", "yaml").stdout)
        checked = (policy.get("status") or {}).get("typeChecking")
        if checked is not None or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert checked is not None, policy.get("status")
    assert not checked.get("expressionWarnings"), checked


VAP_ADMITTED = [
    {"tuned": f"ghcr.io/acme/tuned@{DIGEST}"},
    {"agent": f"registry.internal:5000/nodegate/agent@{DIGEST}", "tuned": f"ghcr.io/acme/tuned:1.0.0@{DIGEST}"},
]
VAP_REFUSED = [
    ({"tuned": f"quay.io/evil/tuned@{DIGEST}"}, "outside the allowed repositories"),
    ({"tuned": f"ghcr.io/acme-evil/tuned@{DIGEST}"}, "outside the allowed repositories"),
    ({"tuned": f"registry.internal:5000/other/tuned@{DIGEST}"}, "outside the allowed repositories"),
    ({"tuned": f"registry.internal:5001/nodegate/tuned@{DIGEST}"}, "outside the allowed repositories"),
    ({"hub": f"acme/tuned@{DIGEST}"}, "outside the allowed repositories"),
    ({"tuned": "ghcr.io/acme/tuned"}, "without a digest, and requireDigest is true"),
    ({"tuned": "ghcr.io/acme/tuned:1.0.0"}, "without a digest, and requireDigest is true"),
]


@pytest.mark.parametrize("packages", VAP_ADMITTED, ids=lambda p: ",".join(p.values()))
def test_the_example_policy_admits_allowed_pinned_images(kubectl: Kubectl, vap: Vap,
                                                         packages: dict[str, str]) -> None:
    proc = kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=gate_yaml(unique("vap-ok"), packages,
                                                                                 label=vap.label))
    assert "(server dry run)" in proc.stdout


@pytest.mark.parametrize(("packages", "rule"), VAP_REFUSED, ids=lambda v: ",".join(v.values())
                         if isinstance(v, dict) else str(v)[:24])
def test_the_example_policy_refuses_with_its_message(kubectl: Kubectl, vap: Vap, packages: dict[str, str],
                                                     rule: str) -> None:
    name = unique("vap-bad")
    proc = kubectl.run("apply", "-f", "-", stdin=gate_yaml(name, packages, label=vap.label), check=False)
    assert proc.returncode != 0
    [(key, image)] = packages.items()
    ns = vap.params["metadata"]["namespace"]
    assert f"ValidatingAdmissionPolicy 'nodegate-image-policy' with binding '{vap.binding}' denied request" \
        in proc.stderr, proc.stderr
    assert f'NodeGate {name}: spec.packages[{key}].image "{image}" ' in proc.stderr, proc.stderr
    assert rule in proc.stderr
    assert f"ConfigMap {ns}/{vap.label}" in proc.stderr
