"""The admission table: every manifest under tests/integration/manifests applied with `kubectl apply`
through the real kube-apiserver with the webhook registered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import Kubectl
from tests.integration.conftest import Webhook

MANIFESTS = Path(__file__).resolve().parent.parent / "manifests"
GOOD = sorted((MANIFESTS / "good").glob("*.yaml"))
BAD = sorted((MANIFESTS / "bad").glob("*.yaml"))


def expectations(path: Path) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^# expect: (.+)$", path.read_text(), re.MULTILINE)]


def test_the_table_is_not_empty() -> None:
    assert len(GOOD) >= 3 and len(BAD) >= 15
    assert all(expectations(p) for p in BAD), "every bad manifest names the message it must produce"


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_good_manifest_is_admitted(kubectl: Kubectl, webhook: Webhook, path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    try:
        proc = kubectl.run("apply", "-f", str(path), check=False)
        assert proc.returncode == 0, proc.stderr
    finally:
        # gates before policies: a policy still referenced cannot be deleted
        for doc in sorted(docs, key=lambda d: d["kind"] != "NodeGate"):
            plural = {"NodeGate": "nodegates", "DeploymentPolicy": "deploymentpolicies"}[doc["kind"]]
            deleted = kubectl.run("delete", f"{plural}.nodegate.io", doc["metadata"]["name"], "--ignore-not-found",
                                  "--wait=false", check=False)
            assert deleted.returncode == 0, deleted.stderr


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_manifest_is_refused_with_field_and_reason(kubectl: Kubectl, webhook: Webhook, path: Path) -> None:
    proc = kubectl.run("apply", "-f", str(path), check=False)
    if proc.returncode == 0:  # keep the cluster clean for the next run, then fail
        kubectl.run("delete", "-f", str(path), "--wait=false", check=False)
    assert proc.returncode != 0, f"{path.name} was admitted"
    # The webhook's wording differs from the CRD's CEL messages, so the fragments say who refused.
    for fragment in expectations(path):
        assert fragment in proc.stderr, proc.stderr
