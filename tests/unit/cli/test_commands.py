"""The command line itself: every command's flags, the kubectl plugin name, one-line errors without a cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from gate.cli.main import main, parser, prog_name

CLUSTER_COMMANDS = {
    "status": [], "plan": ["g"], "pause": ["g"], "resume": ["g"], "rerun": ["g", "--node", "n", "--package", "p"],
    "node list": [], "node reset": ["n"], "node ignore": ["n"], "node unignore": ["n"], "package logs": ["n", "p"],
    "delete": ["g"],
}
CHANGING = {"pause", "resume", "rerun", "node reset", "node ignore", "node unignore", "delete"}


def _parse(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


@pytest.mark.parametrize("command", sorted(CLUSTER_COMMANDS))
def test_every_cluster_command_takes_a_kubeconfig_and_a_context(command: str) -> None:
    args = _parse([*command.split(), *CLUSTER_COMMANDS[command], "--kubeconfig", "/k", "--context", "c"])
    assert (args.kubeconfig, args.context, args.namespace) == ("/k", "c", "nodegate-system")


@pytest.mark.parametrize("command", sorted(CHANGING))
def test_every_command_that_changes_something_has_dry_run(command: str) -> None:
    assert _parse([*command.split(), *CLUSTER_COMMANDS[command], "--dry-run"]).dry_run is True
    assert _parse([*command.split(), *CLUSTER_COMMANDS[command]]).dry_run is False


def test_resume_takes_compartments_and_rerun_only_stages_it_can_rerun() -> None:
    assert _parse(["resume", "g", "-c", "a", "--compartment", "b,c"]).compartment == ["a", "b,c"]
    assert _parse(["rerun", "g", "--node", "n", "--package", "p"]).stage == "apply"
    with pytest.raises(SystemExit):
        _parse(["rerun", "g", "--node", "n", "--package", "p", "--stage", "interrupt"])


def test_package_logs_joins_the_authors_package_tools() -> None:
    choices = _parse(["package", "logs", "n", "p", "-f", "--stage", "config"])
    assert (choices.node, choices.package, choices.follow, choices.stage) == ("n", "p", True, "config")
    assert _parse(["package", "lint", "dir"]).directories == ["dir"]


def test_as_a_kubectl_plugin_the_usage_says_kubectl_nodegate() -> None:
    assert prog_name("/usr/local/bin/kubectl-nodegate") == "kubectl nodegate"
    assert prog_name(".venv/bin/nodegate") == "nodegate"


def test_help_lists_the_everyday_commands_first(capsys: pytest.CaptureFixture[str]) -> None:
    parser().print_help()
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("    ")
              and not line.startswith("     ")]
    assert listed[:8] == ["status", "plan", "pause", "resume", "rerun", "rollout", "node", "delete"]


def test_delete_forces_only_when_asked() -> None:
    assert _parse(["delete", "g"]).force is False and _parse(["delete", "g", "--force"]).force is True


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def test_no_kubeconfig_is_one_line_and_exit_code_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["status"]) == 2
    assert _error_line(capsys).startswith("error: no kubeconfig: set KUBECONFIG or pass --kubeconfig")
    assert main(["pause", "g", "--kubeconfig", str(tmp_path / "missing")]) == 2
    assert _error_line(capsys) == f"error: the kubeconfig {tmp_path / 'missing'} does not exist"


def test_an_unreachable_cluster_is_one_line_and_exit_code_2(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    from gate.devcluster.cluster import free_port

    server = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    for argv in (["status"], ["node", "ignore", "n"], ["plan", "g"]):
        assert main([*argv, "--kubeconfig", str(path)]) == 2
        line = _error_line(capsys)
        assert line.startswith(f"error: cannot reach the Kubernetes API server at {server}"), line
        assert line.endswith("is the cluster running and KUBECONFIG right?")


def test_a_bad_context_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [],
                                    "contexts": [], "current-context": ""}))
    assert main(["status", "--kubeconfig", str(path), "--context", "nope"]) == 2
    assert _error_line(capsys).startswith(f"error: cannot use the kubeconfig {path}:")


def test_watch_and_an_output_format_do_not_mix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--watch", "-o", "json"]) == 2
    assert _error_line(capsys) == "error: --watch shows the live status as text; leave out -o"


def test_api_failures_read_as_one_line_a_person_can_act_on() -> None:
    from gate.cli.kubectx import explain
    from gate.kube.errors import ConnectionFailed, api_error

    def status(code: int, message: str, **details: str) -> str:
        return explain(api_error(code, {"message": message, "details": details}))

    assert status(404, "404 page not found") == (
        "the NodeGate CRDs are not installed in this cluster (see docs/install.md)")
    assert status(404, 'nodegates.nodegate.io "x" not found', name="x", kind="nodegates") == (
        'nodegates.nodegate.io "x" not found')
    assert status(403, 'nodes "n" is forbidden: User "bob" cannot patch resource "nodes"') == (
        'no permission: nodes "n" is forbidden: User "bob" cannot patch resource "nodes"')
    assert status(401, "Unauthorized") == (
        "the API server refused the credentials of the kubeconfig (401 Unauthorized)")
    assert status(422, "spec.priority: Invalid value") == "the API server refused: spec.priority: Invalid value"
    unreachable = explain(ConnectionFailed("GET /api/v1/nodes: ClientConnectorError: Cannot connect"), "https://x")
    assert unreachable == ("cannot reach the Kubernetes API server at https://x (ClientConnectorError: Cannot "
                           "connect); is the cluster running and KUBECONFIG right?")


def test_any_other_failure_is_one_line_without_a_traceback(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODEGATE_DEBUG", raising=False)
    target = tmp_path / "missing-dir" / "schema.json"
    assert main(["package", "schema", "-o", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"error: No such file or directory: {target}"
    monkeypatch.setenv("NODEGATE_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["package", "schema", "-o", str(target)])


def test_an_unexpected_error_names_its_kind_and_how_to_see_more() -> None:
    from pydantic import BaseModel

    from gate.cli.main import describe_failure

    class Spec(BaseModel):
        count: int

    try:
        Spec.model_validate({"count": "many"})
    except Exception as exc:  # the failure under test
        assert describe_failure(exc).startswith("Spec is not valid at count:")
    line = describe_failure(RuntimeError("boom"))
    assert "RuntimeError: boom" in line and "NODEGATE_DEBUG=1" in line and "\n" not in line


def test_the_operator_refuses_an_unknown_event_loop_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "run", "--event-loop", "trio"]) == 2
    err = capsys.readouterr().err
    assert "--event-loop must be uvloop or asyncio, not 'trio'" in err
    assert _parse(["operator", "run"]).event_loop is None  # the default comes from the settings: uvloop


def test_dev_up_configures_prometheus_endpoints_as_the_chart_does(tmp_path: Path) -> None:
    """`nodegate dev up --prometheus-endpoint NAME=URL` writes the file the dev operator reads
    (`--prometheus-endpoints`), in the operator's own format."""
    from gate.controller.endpoints import parse_endpoints
    from gate.devcluster.cluster import DevCluster
    from gate.devcluster.services import operator_argv, prometheus_endpoints_file, set_prometheus_endpoints

    args = parser().parse_args(["dev", "up", "--prometheus-endpoint", "main=http://127.0.0.1:9090",
                                "--prometheus-endpoint", "gpu=https://prom.gpu:9090"])
    assert args.prometheus_endpoint == ["main=http://127.0.0.1:9090", "gpu=https://prom.gpu:9090"]
    cluster = DevCluster(tmp_path)
    path = set_prometheus_endpoints(cluster, {"main": "http://127.0.0.1:9090", "gpu": "https://prom.gpu:9090"})
    assert path == prometheus_endpoints_file(cluster)
    endpoints = parse_endpoints(yaml.safe_load(path.read_text()))
    assert {n: e.url for n, e in endpoints.items()} == {"main": "http://127.0.0.1:9090", "gpu": "https://prom.gpu:9090"}
    argv = operator_argv(tmp_path / "kc", 1, "op", endpoints=path)
    assert argv[argv.index("--prometheus-endpoints") + 1] == str(path)


def test_dev_up_takes_an_image_signature_policy_checked_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`nodegate dev up --image-signatures FILE`: a file the operator could not use is refused, naming the
    field, before any process starts; a good one is kept in the cluster's state, and the operator is
    started with it and with digest resolution on (`gate.devcluster.services.start_operator`)."""
    from gate.devcluster.cluster import DevCluster
    from gate.devcluster.services import image_signatures_file, set_image_signatures

    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: audit\n")
    assert main(["dev", "up", "--state-dir", str(tmp_path / "state"), "--image-signatures", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"--image-signatures {bad}" in err and "mode" in err
    assert not (tmp_path / "state").exists(), "nothing started, nothing written"
    cluster = DevCluster(tmp_path)
    with pytest.raises(ValueError, match="mode"):
        set_image_signatures(cluster, "mode: audit\n")
    assert not image_signatures_file(cluster).exists()
    path = set_image_signatures(cluster, "mode: warn\nunmatched: refuse\n")
    assert path == image_signatures_file(cluster) and "unmatched: refuse" in path.read_text()
    set_image_signatures(cluster, None)
    assert not path.exists()
