"""docs/operations.md, run: every command of the runbook's ```sh blocks against the session's control plane.

The runbook's names stand for a throwaway world made here: GATE is a gate whose package fails on its
first node, so that node is failed (NODE, PACKAGE) and its compartment stopped (COMPARTMENT); NS, PDB
and APP are a namespace with a PodDisruptionBudget. The section "A failed node" gets a gate of its own
(its `node reset` leaves no failed node behind for "A stopped compartment", as it would not in life:
the sections are separate situations). The chart's names are real: the dev cluster's
webhook uses the Secret and the webhook configurations `nodegate` and `nodegate-webhook-tls`, and its
operator the Lease `nodegate-operator`, as the chart's do. The dev cluster runs both as local
processes, so the chart's two Deployments are created with 0 replicas (from the plain manifests
rendered from the chart) for the commands that name them.

How each command is checked:
* `nodegate ...`: run as written, against GATE (rerun, reset, ignore, resume, pause change only it;
  `delete` runs with `--dry-run` added);
  `status --watch` until its first screen, then interrupted (Ctrl-C, exit 130);
* `kubectl` reads (get, describe, events, rollout status): run as written;
* `kubectl` writes (delete, patch, scale, rollout restart, apply without a dry run): run with
  `--dry-run=server` added, so the API server admits and validates them and stores nothing;
* pipelines run whole in bash (`set -o pipefail`);
* PARSED_ONLY: what cannot run here is only parsed: the tool exists and knows every flag given.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any

import yaml

from gate.api import keys
from gate.cli.manifests import helm_path
from gate.devcluster.cluster import DevCluster, NodeSpec
from gate.devcluster.stages import failing_stage
from gate.kube.client import DEPLOYMENTS, KWOK_STAGES, NAMESPACES, NODEGATES, NODES, POLICIES, KubeClient
from gate.kube.errors import NotFound
from tests.conftest import kubectl_path, unique
from tests.docs.conftest import REPO, shell_commands
from tests.integration.conftest import Webhook
from tests.processes import HANG_GUARD, ctrl_c, group_process, read_until

RUNBOOK = REPO / "docs" / "operations.md"
NAMESPACE = "nodegate-system"
PACKAGE = "tuned"
COMPARTMENT = "__default__"
PLACEHOLDERS = re.compile(r"\b(GATE|NODE|PACKAGE|COMPARTMENT|NS|PDB|APP)\b")

# What is only parsed, and why. A command of the runbook that matches none of these runs.
PARSED_ONLY = {
    ("kubectl", "logs"): "container logs: the dev cluster's nodes are kwok's (no kubelet serves logs), and "
                         "its operator and webhook are local processes, not the chart's pods",
    ("helm",): "needs the Helm release `nodegate`: the dev cluster runs NodeGate without Helm "
               "(tests/chart/test_install.py installs the chart elsewhere)",
    ("kubectl", "exec"): "break glass into a stage pod: kwok's nodes serve no exec; admission's refusal and the "
                         "break-glass pass are proven in tests/security/test_stage_pod_exec.py",
    ("kubectl", "patch", "configmap", "argocd-cm"): "needs Argo CD installed; the snippet it applies is "
                                                    "tested with a Lua runtime (tests/unit/test_argocd_health.py)",
}
# The lines checked by parsing only, as the runbook writes them: a new one must be added on purpose.
EXPECTED_PARSED_ONLY = [
    "kubectl -n nodegate-system logs deploy/nodegate-operator --since 15m",
    "kubectl -n nodegate-system logs deploy/nodegate-webhook --since 15m",
    "helm -n nodegate-system upgrade nodegate charts/nodegate --reuse-values",
    "kubectl -n nodegate-system logs deploy/nodegate-webhook | grep -i certificate",
    "helm -n nodegate-system get values nodegate",
    "helm -n nodegate-system upgrade nodegate charts/nodegate --reuse-values",
    "kubectl -n nodegate-system exec -it POD -- sh",
    "helm pull oci://REGISTRY/charts/nodegate --version X --untar",
    "kubectl -n argocd patch configmap argocd-cm --type merge --patch-file nodegate/docs/argocd/argocd-cm.yaml",
]


def runbook_lines() -> list[tuple[str, str]]:
    """(section, command line) of every line of the runbook's ```sh blocks, comments dropped, quoted the
    way shlex quotes."""
    out = []
    for section in re.split(r"^## ", RUNBOOK.read_text(), flags=re.M)[1:]:
        title = section.splitlines()[0].strip()
        out += [(title, shlex.join(argv).replace(" '|' ", " | ")) for argv in shell_commands(section)]
    return out


def _stages(argv: list[str]) -> list[list[str]]:
    stages: list[list[str]] = [[]]
    for arg in argv:
        if arg == "|":
            stages.append([])
        else:
            stages[-1].append(arg)
    return stages


def _without_namespace(argv: list[str]) -> list[str]:
    """argv without `-n X` / `--namespace X`, so the subcommand comes right after the tool."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("-n", "--namespace"):
            skip = True
        else:
            out.append(a)
    return out


def _parsed_only_reason(stages: list[list[str]]) -> str | None:
    for argv in stages:
        bare = _without_namespace(argv)
        for key, reason in PARSED_ONLY.items():
            if tuple(bare[:len(key)]) == key:
                return reason
    return None


def _writes(argv: list[str]) -> bool:
    bare = _without_namespace(argv)
    if bare[0] != "kubectl" or any(a.startswith("--dry-run") for a in bare):
        return False
    return bare[1] in ("delete", "patch", "scale", "apply") or bare[1:3] == ["rollout", "restart"]


def _parse(argv: list[str]) -> None:
    """The tool exists and its subcommand knows every flag given (from the subcommand's --help)."""
    bare = _without_namespace(argv)
    tool = {"kubectl": kubectl_path(), "helm": helm_path()}.get(bare[0])
    if tool is None:
        assert shutil.which(bare[0]), f"{bare[0]} is not installed"
        return
    words = [a for a in bare[1:3] if not a.startswith("-") and "/" not in a]
    sub = words[:2] if bare[0] == "helm" and words[:1] == ["get"] else words[:1]
    helptext = subprocess.run([tool, *sub, "--help"], capture_output=True, text=True, timeout=HANG_GUARD).stdout
    for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
        assert re.search(rf"(^|[\s,]){re.escape(flag)}[=\s\[]", helptext, re.M), f"`{bare[0]} {' '.join(sub)}` " \
            f"has no flag {flag}"
    for path in (a for a in bare if a.startswith("charts/")):
        assert (REPO / path).exists(), f"{path} does not exist"


def _command(argv: list[str]) -> list[str]:
    if argv[0] == "nodegate":
        # `nodegate delete` would remove GATE, which later sections still need: a server dry run instead.
        dry = ["--dry-run"] if argv[1:2] == ["delete"] and "--dry-run" not in argv else []
        return [sys.executable, "-m", "gate.cli.main", *argv[1:], *dry]
    if argv[0] == "kubectl":
        return [kubectl_path(), *argv[1:], *(["--dry-run=server"] if _writes(argv) else [])]
    return argv


def _run(line: str, env: dict[str, str]) -> tuple[int, str]:
    stages = _stages(shlex.split(line))
    if len(stages) > 1:
        script = "set -o pipefail; " + " | ".join(shlex.join(_command(s)) for s in stages)
        proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=HANG_GUARD)
        return proc.returncode, proc.stdout + proc.stderr
    argv = stages[0]
    if argv[0] == "nodegate" and "--watch" in argv:
        return _interrupted_after_first_screen(_command(argv), env)
    proc = subprocess.run(_command(argv), cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_GUARD)
    return proc.returncode, proc.stdout + proc.stderr


def _interrupted_after_first_screen(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """`--watch` runs until Ctrl-C: wait for its first screen (however long a busy machine takes),
    interrupt it, and expect the exit code of an interrupt. Its process group goes in any case."""
    with group_process(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        try:
            first = "".join(read_until(proc, lambda line: True))
        except AssertionError as exc:  # it ended, or said nothing before the hang guard
            return 1, str(exc)
        ctrl_c(proc.pid)
        rest, _ = proc.communicate(timeout=HANG_GUARD)
    return (0 if proc.returncode == 130 else proc.returncode or 1), first + rest


# -- the throwaway world ----------------------------------------------------------------------------


async def _wait(check: Any, what: str, timeout: float = HANG_GUARD) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.25)


async def _failed_gate(cluster: DevCluster, kube: KubeClient, gate: str) -> str:
    """GATE with a failed node (returned) in a stopped compartment."""
    nodes = await cluster.add_nodes(NodeSpec(2, {"test": gate}, prefix=f"{gate}-"))
    await kube.apply(failing_stage(f"{gate}-fail", nodes=nodes, package=PACKAGE, stage="apply",
                                   message="tuned.conf: no such profile"), field_manager="test")
    await kube.apply({"apiVersion": keys.API_VERSION, "kind": "DeploymentPolicy", "metadata": {"name": gate},
                      "spec": {"default": {"budget": {"count": 1},
                                           "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}}}}},
                     field_manager="test")
    await kube.apply({"apiVersion": keys.API_VERSION, "kind": "NodeGate", "metadata": {"name": gate},
                      "spec": {"nodeSelector": {"matchLabels": {"test": gate}}, "deploymentPolicy": gate,
                               "packages": {PACKAGE: {"version": "1.0.0", "image": "registry.example.com/tuned",
                                                      "retries": 0, "config": {"tuned.conf": "profile=x"},
                                                      "interrupt": {"type": "service",
                                                                    "services": ["tuned.service"]}}}}},
                     field_manager="test")

    async def stopped() -> bool:
        comps = ((await kube.get(NODEGATES, gate)).get("status") or {}).get("compartments") or []
        return any(c.get("state") == "stopped" for c in comps)

    await _wait(stopped, f"compartment {COMPARTMENT} of {gate} stopped by its failed node")
    for node in nodes:
        labels = (await kube.get(NODES, node))["metadata"].get("labels") or {}
        if labels.get(keys.status_label(gate)) == "failed":
            return node
    raise AssertionError("the compartment stopped without a failed node")


async def _set_up(kube: KubeClient, ns: str) -> list[str]:
    """NS with the PodDisruptionBudget PDB; the chart's Deployments with 0 replicas, unless they exist
    (returns those it created)."""
    await kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, field_manager="test")
    await kube.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web",
                                                                                             "namespace": ns},
                      "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}, field_manager="test")
    created = []
    for path in ("operator/operator-deployment.yaml", "webhooks/webhook-deployment.yaml"):
        deployment = yaml.safe_load((REPO / path).read_text())
        name = deployment["metadata"]["name"]
        try:
            await kube.get(DEPLOYMENTS, name, NAMESPACE)
        except NotFound:
            deployment["spec"]["replicas"] = 0
            await kube.create(DEPLOYMENTS, deployment, NAMESPACE)
            created.append(name)
    return created


async def _tear_down(kube: KubeClient, gates: list[str], ns: str, deployments: list[str]) -> None:
    for name in deployments:
        await kube.delete(DEPLOYMENTS, name, NAMESPACE)
    await kube.delete(NAMESPACES, ns)
    for gate in gates:
        # The nodes first, so the gate's deletion has no node to wait for; the policy once it is gone.
        await kube.delete(KWOK_STAGES, f"{gate}-fail")
        nodes, _ = await kube.list(NODES, label_selector=f"test={gate}")
        for node in nodes:
            await kube.delete(NODES, node["metadata"]["name"])
        await kube.delete(NODEGATES, gate)
    for gate in gates:
        async def gone(gate: str = gate) -> bool:
            try:
                await kube.get(NODEGATES, gate)
            except NotFound:
                return True
            return False

        await _wait(gone, f"NodeGate {gate} deleted")
        await kube.delete(POLICIES, gate)


# -- the test -----------------------------------------------------------------------------------------


def test_the_runbook_commands_are_all_known_and_classified() -> None:
    """Without a cluster: the parsed-only lines are exactly the expected ones, and every line is run by a
    tool the test knows how to run."""
    lines = [line for _, line in runbook_lines()]
    assert [line for line in lines if _parsed_only_reason(_stages(shlex.split(line)))] == EXPECTED_PARSED_ONLY
    for line in lines:
        for argv in _stages(shlex.split(line)):
            assert argv[0] in ("nodegate", "kubectl", "helm", "base64", "openssl", "grep"), line


async def test_every_runbook_command_runs_or_is_parsed(cluster: DevCluster, webhook: Webhook, operator: int,
                                                       kube: KubeClient) -> None:
    gate, failed_gate, ns = unique("runbook"), unique("runbook-failed"), unique("runbook-ns")
    deployments: list[str] = []
    try:
        deployments = await _set_up(kube, ns)
        node, failed_node = await asyncio.gather(_failed_gate(cluster, kube, gate),
                                                 _failed_gate(cluster, kube, failed_gate))
        names = {"GATE": gate, "NODE": node, "PACKAGE": PACKAGE, "COMPARTMENT": COMPARTMENT, "NS": ns,
                 "PDB": "web", "APP": "web"}
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "NODEGATE_DEBUG": ""}
        failures, parsed, outputs = [], [], {}
        # One command after the other, as a person would type them (blocking: the operator and the
        # webhook are processes of their own).
        for section, line in runbook_lines():
            here = {**names, "GATE": failed_gate, "NODE": failed_node} if section == "A failed node" else names
            concrete = PLACEHOLDERS.sub(lambda m, here=here: here[m[1]], line)
            stages = _stages(shlex.split(concrete))
            reason = _parsed_only_reason(stages)
            if reason:
                for argv in stages:
                    _parse(argv)
                parsed.append((line, reason))
                continue
            code, out = _run(concrete, env)
            outputs.setdefault(line, out)
            if code != 0:
                failures.append(f"{concrete}\n  exited {code}: {out.strip()[-600:]}")
        assert not failures, "runbook commands that failed:\n" + "\n".join(failures)
        print("Only parsed:\n" + "\n".join(f"  {line}\n    ({why})" for line, why in parsed))
        assert [line for line, _ in parsed] == EXPECTED_PARSED_ONLY
        # A few outputs say the commands looked at the right things.
        assert node in outputs["nodegate status GATE"] and "failed" in outputs["nodegate status GATE"].lower()
        lease = "kubectl -n nodegate-system get lease nodegate-operator -o 'jsonpath={.spec.holderIdentity}'"
        assert outputs[lease].strip(), "the operator's lease has a holder"
        assert "subject=" in outputs[next(line for line in outputs if "openssl x509" in line)]
        from gate import __version__

        assert f"\noperator {__version__} (leader " in outputs["nodegate version"]
        assert outputs["nodegate reset GATE --dry-run"].startswith(f"NodeGate {gate}: reset ")
        assert "(server dry run: nothing was changed)" in outputs["nodegate reset GATE --dry-run"]
        assert f"NodeGate {gate}: requested the reset" in outputs["nodegate reset GATE --yes"]
        assert outputs["nodegate disable GATE"].startswith(f"NodeGate {gate}: annotated {keys.DISABLED_ANNOTATION}")
        assert outputs["nodegate enable GATE"].startswith(f"NodeGate {gate}: removed the annotation")
    finally:
        await _tear_down(kube, [gate, failed_gate], ns, deployments)
