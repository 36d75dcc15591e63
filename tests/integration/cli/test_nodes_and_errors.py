"""`nodegate node ...` requests on real nodes, one-line errors from a real API server, the kubectl plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gate.api import keys
from gate.devcluster.cluster import DevCluster
from gate.kube.client import SERVICEACCOUNTS
from tests.conftest import kubectl_path
from tests.integration.cli.conftest import Cli
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/tool"}


async def test_ignore_unignore_and_reset_write_requests_the_operator_acts_on(
        scenario: Scenario, cli: Cli, step_log: StepLog) -> None:
    g = scenario.name
    one, two = await scenario.add_nodes(2)
    await scenario.apply_gate({"tool": PKG})
    await scenario.wait_ready()
    listing = (await cli.ok("node", "list", "--gate", g)).lines
    assert listing[0].split() == ["NODE", "COMPARTMENT", "STATUS", "PHASE", "BATCH", "INSTALLED", "NOTE"]
    assert sorted(line.split()[:3] for line in listing[1:]) == [[one, "__default__", "complete"],
                                                               [two, "__default__", "complete"]]

    await cli.ok("node", "ignore", one, "--dry-run")
    assert keys.IGNORE_LABEL not in (await scenario.node(one))["metadata"]["labels"]
    out = (await cli.ok("node", "ignore", one)).out
    assert out.startswith(f"node/{one}: labelled {keys.IGNORE_LABEL}=true.")
    assert (await cli.ok("node", "ignore", one)).out == f"node/{one} is already ignored; nothing changed.\n"

    async def left() -> bool:
        return keys.state_annotation(g) not in (await scenario.node(one))["metadata"].get("annotations", {})

    await wait_for(left, what="the operator releasing the ignored node")
    everything = (await cli.ok("node", "list")).lines
    assert everything[0].split() == ["NODE", "READY", "CORDONED", "IGNORED", "GATES"]
    assert [one, "yes", "no", "yes", "-"] in [line.split() for line in everything]
    assert (await cli.ok("node", "unignore", one)).out.startswith(f"node/{one}: removed the label")
    await scenario.wait_node(one, "complete")

    await cli.ok("node", "reset", two, "--dry-run")
    assert keys.reset_annotation(g) not in (await scenario.node(two))["metadata"].get("annotations", {})
    out = (await cli.ok("node", "reset", two)).out
    assert out.startswith(f"node/{two}: requested a reset for NodeGate {g}")

    async def ran_again() -> bool:
        return len([r for r in step_log.of(g, two) if r.stage == "apply"]) == 2 and await scenario.node_status(
            two) == "complete"

    await wait_for(ran_again, what="the reset node running the gate again from scratch")
    assert keys.reset_annotation(g) not in (await scenario.node(two))["metadata"].get("annotations", {})


async def test_unknown_objects_and_bad_requests_are_one_line_errors(scenario: Scenario, cli: Cli) -> None:
    g = scenario.name
    [node] = await scenario.add_nodes(1)
    missing = f"{g}-missing"
    for argv in (["status", missing], ["pause", missing], ["plan", missing], ["resume", missing],
                 ["rerun", missing, "--node", node, "--package", "tool"]):
        assert await cli.fails(*argv) == f"error: no NodeGate named {missing} (`kubectl get ng` lists them)"
    assert await cli.fails("node", "reset", missing) == f"error: no node named {missing}"
    assert await cli.fails("node", "reset", node) == f"error: no NodeGate has run on node {node}; nothing to reset"
    await scenario.apply_gate({"tool": PKG}, paused=True)
    await scenario.wait_condition("Paused")
    assert await cli.fails("rerun", g, "--node", node, "--package", "other") == (
        f"error: NodeGate {g} has no package other (it has: tool)")
    assert await cli.fails("rerun", g, "--node", node, "--package", "tool") == (
        f"error: NodeGate {g} has not run on node {node}; nothing to rerun")
    assert (await cli.fails("resume", g, "-c", "nowhere")).startswith(f"error: NodeGate {g} has no compartment nowhere")


async def test_a_user_without_permission_gets_one_line_naming_what_is_forbidden(
        cluster: DevCluster, cli: Cli, tmp_path: Path) -> None:
    from gate.devcluster.services import service_account_kubeconfig
    from tests.conftest import unique

    name = unique("nobody")
    async with await cluster.client() as kube:
        await kube.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                            "metadata": {"name": name, "namespace": "default"}})
    try:
        config = await service_account_kubeconfig(cluster, name, "default", tmp_path / "kubeconfig", hours=1)
        line = await cli.fails("status", kubeconfig=str(config))
        assert line.startswith("error: no permission: ")
        assert f'"system:serviceaccount:default:{name}" cannot list resource' in line
    finally:
        async with await cluster.client() as kube:
            await kube.delete(SERVICEACCOUNTS, name, "default")


def _env(cluster: DevCluster, **extra: str) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), **extra}


def test_the_real_process_prints_one_line_and_exits_2_without_a_traceback(cluster: DevCluster) -> None:
    proc = subprocess.run([sys.executable, "-m", "gate.cli.main", "pause", "no-such-gate-anywhere"],
                          capture_output=True, text=True, env=_env(cluster), timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "error: no NodeGate named no-such-gate-anywhere (`kubectl get ng` lists them)\n"


def test_kubectl_runs_nodegate_as_its_plugin(cluster: DevCluster, tmp_path: Path) -> None:
    # The kubectl-nodegate console script `pip install` put next to this interpreter, alone on PATH's
    # first entry so kubectl finds exactly it.
    installed = Path(sys.executable).parent / "kubectl-nodegate"
    assert installed.is_file(), "kubectl-nodegate is not installed with the package (pyproject [project.scripts])"
    plugin = tmp_path / "kubectl-nodegate"
    plugin.symlink_to(installed)
    env = _env(cluster, PATH=f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    listed = subprocess.run([kubectl_path(), "plugin", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert str(plugin) in listed.stdout
    status = subprocess.run([kubectl_path(), "nodegate", "status", "-o", "json"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith("{\n  \"items\": [")
