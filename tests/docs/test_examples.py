"""Every marked example in the docs and every file in examples/ is admitted (or refused, as the docs say)
by a real API server with NodeGate's CRDs and admission webhook."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import Kubectl
from tests.docs.conftest import REPO, examples
from tests.integration.conftest import Webhook

EXAMPLE_FILES = sorted((REPO / "examples").glob("*.yaml"))


def test_the_docs_have_examples_of_both_kinds() -> None:
    kinds = {doc.get("kind") for e in examples() for doc in yaml.safe_load_all(e.body) if doc}
    assert {"NodeGate", "DeploymentPolicy"} <= kinds
    assert any(e.refused for e in examples())


def _documents(texts: list[str]) -> list[dict]:  # type: ignore[type-arg]
    return [doc for text in texts for doc in yaml.safe_load_all(text) if doc]


def test_every_example_is_admitted_with_the_webhook_up(kubectl: Kubectl, webhook: Webhook) -> None:
    admitted = [e.body for e in examples() if e.refused is None] + [p.read_text() for p in EXAMPLE_FILES]
    docs = _documents(admitted)
    policies = [d for d in docs if d["kind"] == "DeploymentPolicy"]
    others = [d for d in docs if d["kind"] != "DeploymentPolicy"]
    # Policies are created for real (gates must name an existing one); nothing else is stored.
    kubectl.apply(yaml.safe_dump_all(policies))
    try:
        for doc in others:
            result = kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc), check=False)
            assert result.returncode == 0, f"{doc['kind']} {doc['metadata']['name']}: {result.stderr}"
    finally:
        for policy in policies:
            kubectl.run("delete", "deploymentpolicy", policy["metadata"]["name"], "--ignore-not-found", check=False)


@pytest.mark.parametrize("example", [e for e in examples() if e.refused], ids=lambda e: e.refused)
def test_refused_examples_are_refused_with_the_documented_reason(kubectl: Kubectl, webhook: Webhook,
                                                                 example: object) -> None:
    result = kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=example.body,  # type: ignore[attr-defined]
                         check=False)
    assert result.returncode != 0, "the API server admitted an example the docs say it refuses"
    assert example.refused in result.stderr  # type: ignore[attr-defined]


def test_the_examples_the_docs_name_are_there() -> None:
    assert {p.name for p in EXAMPLE_FILES} >= {"gpu-tuning.yaml", "gpu-fleet-policy.yaml", "tour.yaml"}
