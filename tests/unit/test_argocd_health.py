"""The Argo CD health scripts, as shipped in the argocd-cm snippet, on objects recorded from real
rollouts (testdata/*.yaml, listed with their expected health in health_test.yaml, Argo CD's own
format for its resource customizations). The live check of the same scripts is
tests/integration/operator/test_gitops_health.py, which also records these objects."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.gitops import argocd_health, argocd_scripts, script_dir

KINDS = ("NodeGate", "DeploymentPolicy")


def _cases(kind: str) -> list[tuple[str, dict[str, str]]]:
    tests = yaml.safe_load((script_dir(kind) / "health_test.yaml").read_text())["tests"]
    return [(t["inputPath"], t["healthStatus"]) for t in tests]


@pytest.mark.parametrize(("kind", "path", "expected"),
                         [pytest.param(k, p, e, id=f"{k}-{Path(p).stem}") for k in KINDS for p, e in _cases(k)])
def test_the_script_gives_the_recorded_health(kind: str, path: str, expected: dict[str, str]) -> None:
    obj = yaml.safe_load((script_dir(kind) / path).read_text())
    assert obj["kind"] == kind
    health = argocd_health(obj)
    assert {"status": health.status, "message": health.message} == expected


def test_the_recorded_objects_cover_every_health_an_argocd_user_meets() -> None:
    assert {e["status"] for _, e in _cases("NodeGate")} == {"Progressing", "Healthy", "Degraded", "Suspended"}
    assert {e["status"] for _, e in _cases("DeploymentPolicy")} >= {"Progressing", "Healthy"}


@pytest.mark.parametrize("kind", KINDS)
def test_every_recorded_object_is_listed_in_health_test(kind: str) -> None:
    listed = {p for p, _ in _cases(kind)}
    stored = {f"testdata/{f.name}" for f in sorted(Path(script_dir(kind), "testdata").glob("*.yaml"))}
    assert stored == listed


def test_the_snippet_has_a_script_for_both_kinds_and_each_returns_a_status() -> None:
    scripts = argocd_scripts()
    assert set(scripts) == set(KINDS)
    for kind, script in scripts.items():
        assert argocd_health({"kind": kind, "metadata": {"name": "x"}}, script).status == "Progressing"


def test_a_stalled_and_paused_gate_is_degraded_not_suspended() -> None:
    """Stalled wins: a paused gate whose compartment stopped still needs a person to look at it."""
    gate = yaml.safe_load((script_dir("NodeGate") / "testdata" / "compartment-stopped.yaml").read_text())
    gate["spec"]["paused"] = True
    gate["status"]["conditions"].append({"type": "Paused", "status": "True", "reason": "Paused"})
    assert argocd_health(gate).status == "Degraded"


def test_a_spec_the_operator_has_not_seen_is_progressing_whatever_the_conditions_say() -> None:
    gate = yaml.safe_load((script_dir("NodeGate") / "testdata" / "healthy.yaml").read_text())
    gate["metadata"]["generation"] += 1
    health = argocd_health(gate)
    assert health.status == "Progressing" and str(gate["metadata"]["generation"]) in health.message
