"""The parsers of reset, node reset|ignore|unignore, package logs --tail and version, without a cluster."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

import pytest

from gate.api import keys
from gate.cli.logs import log_params
from gate.cli.main import main, parser
from gate.cli.version import describe_operator


def _parse(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


@pytest.mark.parametrize("action", ["reset", "ignore", "unignore"])
def test_node_requests_take_several_nodes_or_a_selector_and_a_dry_run(action: str) -> None:
    args = _parse(["node", action, "a", "b", "--dry-run"])
    assert (args.nodes, args.selector, args.dry_run) == (["a", "b"], None, True)
    args = _parse(["node", action, "-l", "pool=gpu"])
    assert (args.nodes, args.selector, args.dry_run) == ([], "pool=gpu", False)


def test_reset_takes_a_gate_a_dry_run_and_yes() -> None:
    args = _parse(["reset", "g", "--dry-run", "-y"])
    assert (args.gate, args.dry_run, args.yes) == ("g", True, True)
    assert _parse(["reset", "g"]).yes is False


def test_reset_without_a_terminal_or_yes_refuses_before_connecting(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")  # never read: it refuses first
    assert main(["reset", "g"]) == 2
    assert capsys.readouterr().err == ("error: nodegate reset changes every node of NodeGate g: confirm with --yes "
                                       "(or see what it does with --dry-run)\n")


def test_logs_tail_becomes_the_pod_log_requests_tail_lines() -> None:
    assert _parse(["package", "logs", "n", "p", "--tail", "20"]).tail == 20
    assert _parse(["package", "logs", "n", "p"]).tail is None
    assert log_params("apply-p", follow=False, tail=None) == {"container": "apply-p"}
    assert log_params("apply-p", follow=True, tail=20) == {"container": "apply-p", "follow": "true", "tailLines": "20"}


def test_version_client_needs_no_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    from gate import __version__

    assert main(["version", "--client"]) == 0
    assert capsys.readouterr().out == f"nodegate {__version__}\n"


def test_the_operators_line_says_what_its_lease_says() -> None:
    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    lease = {"metadata": {"annotations": {keys.OPERATOR_VERSION_ANNOTATION: "0.3.0"}},
             "spec": {"holderIdentity": "op-1", "renewTime": "2026-01-01T12:00:28.000000Z"}}
    assert describe_operator(lease, "ns/l", now) == "operator 0.3.0 (leader op-1, Lease ns/l, renewed 2s ago)"
    released = {"metadata": lease["metadata"], "spec": {"holderIdentity": ""}}
    assert describe_operator(released, "ns/l", now) == (
        "operator: none is leading (the Lease ns/l was released; the last one was 0.3.0)")
    old = {"metadata": {}, "spec": {"holderIdentity": "op-0"}}
    assert describe_operator(old, "ns/l", now).startswith("operator: unknown version (its leader op-0")
    assert describe_operator(None, "ns/l", now).startswith("operator: not found (no Lease ns/l;")


@pytest.mark.parametrize("command", ["disable", "enable"])
def test_disable_and_enable_take_a_gate_and_a_dry_run(command: str) -> None:
    args = _parse([command, "g", "--dry-run"])
    assert (args.gate, args.dry_run) == ("g", True)


def test_the_webhook_holds_joining_nodes_back_only_for_enabled_readiness_gates() -> None:
    from gate.admission.facts import readiness_gates

    def gate(name: str, **annotations: str) -> dict[str, object]:
        return {"metadata": {"name": name, "annotations": annotations},
                "spec": {"readinessTaint": True, "nodeSelector": {}}}

    found = readiness_gates([gate("on"), gate("off", **{keys.DISABLED_ANNOTATION: "true"}),
                             gate("other", **{keys.DISABLED_ANNOTATION: "false"})])
    assert [g.name for g in found] == ["on", "other"]


def test_a_gate_is_disabled_only_by_the_annotation_set_to_true() -> None:
    from gate.api.nodegate import NodeGate
    from gate.lifecycle.fleet import disabled

    def gate(annotations: dict[str, str]) -> NodeGate:
        return NodeGate.model_validate({"metadata": {"name": "g", "annotations": annotations}, "spec": {}})

    assert disabled(gate({keys.DISABLED_ANNOTATION: "true"}))
    assert not disabled(gate({})) and not disabled(gate({keys.DISABLED_ANNOTATION: "yes"}))
