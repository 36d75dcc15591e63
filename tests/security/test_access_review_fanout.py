"""One write cannot fan out into a SubjectAccessReview per check, and the verdicts stay right.

A user who may edit NodeGates, use packages `fan-a`, `fan-b`, ... (N of them) and get Secrets `fan-s-0` ...
`fan-s-{M-1}` (not `fan-forbidden`) in the operator's namespace writes, through the real API server
and the real webhook process, gates of N packages each naming the same M Secrets: N x M + N checks.
The webhook's own metrics count the SubjectAccessReviews it sent: at most N + M, the distinct
questions, for the first write, none for the same questions again. A gate naming `fan-forbidden` is
refused naming that Secret, again when repeated (from the cached denial), and the gate is not
created. Once the user is granted the Secret, the same write goes through after the cache time.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml

from tests.conftest import REPO, Kubectl, unique
from tests.integration.conftest import Webhook

ROLES = REPO / "config" / "rbac" / "package-user.yaml"
CACHE_SECONDS = 10  # the webhook's default sar_cache_seconds, which the dev cluster keeps
NAMESPACE = "nodegate-system"  # the operator's namespace of the dev cluster: where package pods read Secrets
PACKAGES = 12
SECRETS = 20


def webhook_counts(webhook: Webhook) -> dict[str, float]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only reading the metrics; the API server verifies the webhook
    with urllib.request.urlopen(f"{webhook.url}/metrics", timeout=10, context=ctx) as resp:
        text = resp.read().decode()
    return {"sent": _one(text, "nodegate_admission_subject_access_reviews_sent_total"),
            "checks": _one(text, "nodegate_admission_access_checks_total"),
            "at": time.monotonic()}


def _one(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not among the webhook's metrics")


def package(p: int) -> str:
    return f"fan-{chr(97 + p)}"  # fan-a ... fan-l: a package name ends in a letter


def fanout_gate(name: str, secrets: list[str]) -> str:
    packages = {package(p): {
        "version": "1.0.0", "image": f"ghcr.io/example/fan-{p}",
        "env": [{"name": f"S{i}", "valueFrom": {"secretKeyRef": {"name": s, "key": "k"}}}
                for i, s in enumerate(secrets)],
    } for p in range(PACKAGES)}
    return yaml.safe_dump({"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
                           "spec": {"nodeSelector": {"matchLabels": {"nodegate.dev/none": name}}, "paused": True,
                                    "packages": packages}})


@dataclass
class Writer:
    name: str
    kubectl: Kubectl
    cleanup: list[tuple[str, ...]] = field(default_factory=list)

    def create(self, manifest: str) -> tuple[int, str]:
        proc = self.kubectl.run("create", "-f", "-", stdin=manifest, as_user=self.name, check=False)
        return proc.returncode, proc.stderr + proc.stdout


@pytest.fixture
def writer(kubectl: Kubectl, webhook: Webhook) -> Iterator[Writer]:
    kubectl.run("apply", "-f", str(ROLES))
    user = Writer(unique("fan"), kubectl)
    role = unique("fan-use")
    kubectl.apply(yaml.safe_dump_all([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
         "rules": [{"apiGroups": ["nodegate.io"], "resources": ["packages"], "verbs": ["use"],
                    "resourceNames": [package(p) for p in range(PACKAGES)]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": role, "namespace": NAMESPACE},
         "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                    "resourceNames": [f"fan-s-{s}" for s in range(SECRETS)]}]},
    ]))
    kubectl.run("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--user={user.name}")
    kubectl.run("create", "clusterrolebinding", role + "-edit", "--clusterrole=nodegate-editor", f"--user={user.name}")
    kubectl.run("create", "rolebinding", role, "-n", NAMESPACE, f"--role={role}", f"--user={user.name}")
    user.cleanup += [("clusterrolebinding", role), ("clusterrolebinding", role + "-edit"), ("clusterrole", role),
                     ("rolebinding", role, "-n", NAMESPACE), ("role", role, "-n", NAMESPACE)]
    try:
        yield user
    finally:
        for args in reversed(user.cleanup):
            kubectl.run("delete", *args, "--ignore-not-found", "--wait=false", check=False)


def create_when_rbac_sees_it(user: Writer, manifest: str) -> tuple[int, str]:
    """A binding made a moment ago takes the API server's RBAC cache a moment to see."""
    deadline = time.monotonic() + 30
    while True:
        code, out = user.create(manifest)
        if code == 0 or "may not" not in out or time.monotonic() > deadline:
            return code, out
        time.sleep(0.5)


def test_one_write_of_n_packages_by_m_secrets_sends_at_most_n_plus_m_reviews(
        kubectl: Kubectl, webhook: Webhook, writer: Writer) -> None:
    secrets = [f"fan-s-{s}" for s in range(SECRETS)]
    # A first write, to wait until RBAC sees the bindings (its reviews are not the ones counted).
    warm = unique("sec-fan")
    writer.cleanup.append(("nodegates.nodegate.io", warm))
    code, out = create_when_rbac_sees_it(writer, fanout_gate(warm, secrets[:1]))
    assert code == 0, out

    before = webhook_counts(webhook)
    name = unique("sec-fan")
    writer.cleanup.append(("nodegates.nodegate.io", name))
    first_asked = time.monotonic()
    code, out = writer.create(fanout_gate(name, secrets))
    assert code == 0, out
    after = webhook_counts(webhook)
    checks, sent = after["checks"] - before["checks"], after["sent"] - before["sent"]
    assert checks >= PACKAGES * SECRETS + PACKAGES, (checks, sent)
    # Distinct questions: N packages + M Secrets (the first package and the first Secret were asked
    # by the warm-up write, and may still be cached).
    assert sent <= PACKAGES + SECRETS, (checks, sent)

    # The same questions again, from another gate: answered from the cache.
    again = unique("sec-fan")
    writer.cleanup.append(("nodegates.nodegate.io", again))
    before = webhook_counts(webhook)
    code, out = writer.create(fanout_gate(again, secrets))
    assert code == 0, out
    after = webhook_counts(webhook)
    if after["at"] - first_asked < CACHE_SECONDS:  # on a machine too busy for that, the cache expired: fine
        assert after["sent"] - before["sent"] == 0, (before, after)


def test_a_denied_secret_stays_denied_under_dedupe_and_cache(kubectl: Kubectl, webhook: Webhook,
                                                            writer: Writer) -> None:
    secrets = [f"fan-s-{s}" for s in range(SECRETS)] + ["fan-forbidden"]
    warm = unique("sec-fan")
    writer.cleanup.append(("nodegates.nodegate.io", warm))
    code, out = create_when_rbac_sees_it(writer, fanout_gate(warm, secrets[:1]))
    assert code == 0, out  # RBAC sees the bindings: what follows is refused for the one Secret alone

    name = unique("sec-fan")
    writer.cleanup.append(("nodegates.nodegate.io", name))
    asked = time.monotonic()
    for attempt in range(2):  # the second answered from the cache: the denial too, refused all the same
        before = webhook_counts(webhook)
        code, out = writer.create(fanout_gate(name, secrets))
        after = webhook_counts(webhook)
        assert code != 0, out
        assert 'may not get Secret "fan-forbidden"' in out, out
        for p in (0, PACKAGES - 1):  # every package naming it, the first and the last
            assert f"spec.packages[{package(p)}].env[{SECRETS}].valueFrom.secretKeyRef" in out, out
        assert not kubectl.run("get", "nodegates.nodegate.io", name, "--ignore-not-found", "-o", "name").stdout.strip()
        assert after["sent"] - before["sent"] <= PACKAGES + SECRETS + 1, (before, after)
        if attempt == 1 and after["at"] - asked < CACHE_SECONDS:
            assert after["sent"] - before["sent"] == 0, (before, after)

    # Granted now: once the cached denial has expired, the same write goes through.
    grant = unique("fan-grant")
    kubectl.run("create", "role", grant, "-n", NAMESPACE, "--verb=get", "--resource=secrets",
                "--resource-name=fan-forbidden")
    kubectl.run("create", "rolebinding", grant, "-n", NAMESPACE, f"--role={grant}", f"--user={writer.name}")
    writer.cleanup += [("rolebinding", grant, "-n", NAMESPACE), ("role", grant, "-n", NAMESPACE)]
    deadline = time.monotonic() + 90  # a hang guard: the cache time plus RBAC's propagation
    while True:
        code, out = writer.create(fanout_gate(name, secrets))
        if code == 0 or time.monotonic() > deadline:
            break
        assert 'may not get Secret "fan-forbidden"' in out, out
        time.sleep(1)
    assert code == 0, out
    got = json.loads(kubectl.run("get", "nodegates.nodegate.io", name, "-o", "json").stdout)
    assert len(got["spec"]["packages"]) == PACKAGES
