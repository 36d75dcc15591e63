"""The faults real hosts have, mid-round on the real nodes, under the invariant checker
(gate/devcluster/faults.py injects them; docs/realnodes.md has the table of what NodeGate does).

Each ends with the gate converged, or with the node failed with a reason that names the fault; never an
invariant violation, never a node left cordoned. The package is shellscript, whose apply step is a
script of the test's: it writes "started" to a log on the node's disk (so the test sees the step run,
and counts its runs), sleeps a few seconds (the window for the fault), then does its idempotent work.

The operator runs here with a reboot timeout of REBOOT_TIMEOUT (a held reboot fails in reasonable time)
and an image pull grace long enough to outlive the registry's outage; the session's own settings are
put back at the end of the module.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from gate.api import keys
from gate.devcluster import faults, realfleet, realnode
from gate.kube.client import KubeClient
from gate.testing.watcher import InvariantWatcher, WatchReport
from tests.realnode.conftest import OPERATOR_ENV, POOL_LABEL, RealCluster

pytestmark = pytest.mark.timeout(1800)

REBOOT_TIMEOUT = 90
FAULT_OPERATOR_ENV = {**OPERATOR_ENV, "NODEGATE_REBOOT_TIMEOUT": str(REBOOT_TIMEOUT),
                      "NODEGATE_IMAGE_PULL_GRACE": "90"}
STEP_SECONDS = 8


def _restart_operator(real: RealCluster, env: dict[str, str]) -> None:
    from gate.devcluster import services

    real.dev.stop_process("operator")
    services.start_operator(real.dev, real.progress, env=env)


@pytest.fixture(scope="module")
def faulty(real: RealCluster) -> Iterator[RealCluster]:
    """The real nodes with an operator of this module's settings."""
    _restart_operator(real, FAULT_OPERATOR_ENV)
    try:
        yield real
    finally:
        for node in real.nodes:
            faults.release_boot(real.dev.dir, node)
        _restart_operator(real, OPERATOR_ENV)


def shell_gate(name: str, nodes: list[str], *, interrupt: str = "none", sleep: int = STEP_SECONDS) -> str:
    apply = (f"echo started >> /var/tmp/{name}.log\nsleep {sleep}\n"
             f"echo {name} > /etc/nodegate-fault-{name}\n")
    return yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: "real"},
                                  "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                        "values": nodes}]},
                 "interruptionBudget": {"count": len(nodes) if interrupt == "none" else 1},
                 "packages": {"shellscript": {
                     "version": "1.0.0", "image": "", "interrupt": {"type": interrupt},
                     "config": {"apply.sh": apply,
                                "apply-check.sh": f"grep -qx {name} /etc/nodegate-fault-{name}\n"}}}},
    })


def apply_gate(real: RealCluster, name: str, nodes: list[str], **kwargs: Any) -> None:
    gate = yaml.safe_load(shell_gate(name, nodes, **kwargs))
    gate["spec"]["packages"]["shellscript"]["image"] = real.images["shellscript"]
    real.kubectl.apply(yaml.safe_dump(gate))


def node_state(real: RealCluster, gate: str, node: str) -> dict[str, Any]:
    key = keys.state_annotation(gate).replace(".", "\\.")
    out = real.kubectl.run("get", "node", node, "-o", f"jsonpath={{.metadata.annotations.{key}}}").stdout
    return dict(json.loads(out or "{}"))


def step_runs(real: RealCluster, node: str, gate: str) -> int:
    return (real.node_file(node, f"/var/tmp/{gate}.log") or "").count("started")


def wait_step_started(real: RealCluster, node: str, gate: str) -> None:
    real.wait(f"the apply step of {gate} to start on {node}", lambda: step_runs(real, node, gate) >= 1,
              300.0, every=0.5)


def cordoned(real: RealCluster) -> list[str]:
    out = real.kubectl.run("get", "nodes", "-l", f"{POOL_LABEL}=real",
                           "-o", "jsonpath={range .items[*]}{.metadata.name}={.spec.unschedulable}{'\\n'}{end}").stdout
    return [line.split("=")[0] for line in out.splitlines() if line.endswith("=true")]


def node_ready(real: RealCluster, node: str) -> bool:
    out = real.kubectl.run("get", "node", node, "-o",
                           "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False).stdout
    return out.strip() == "True"


def node_down(real: RealCluster, node: str) -> bool:
    """Whether the node is down (its kubelet gone with its init: a reboot, a power cut)."""
    try:
        faults.node_processes(real.config(node), "kubelet")
        return False
    except Exception:  # hostside.RealNodeError: the node's init is gone
        return True


def finish(real: RealCluster, gate: str, nodes: list[str]) -> None:
    """Delete the gate and what its script left; every node Ready and uncordoned afterwards."""
    real.delete_gate(gate, 300.0)
    for node in nodes:
        real.wait(f"{node} Ready", functools.partial(node_ready, real, node), 300.0, every=2.0)
        real.node_sh(node, f"rm -f /etc/nodegate-fault-{gate} /var/tmp/{gate}.log", check=False)


def watched(real: RealCluster, scenario: Callable[[], None]) -> WatchReport:
    """Run `scenario` under the invariant watcher; the watcher's report once it is done.

    The watcher runs on an event loop of its own thread and the scenario in the test's, so that an
    interrupted test (Ctrl-C) stops at once and its fixtures tear down the cluster."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="invariant-watcher", daemon=True)
    thread.start()

    async def start() -> tuple[KubeClient, InvariantWatcher]:
        client = await real.dev.client()
        watcher = InvariantWatcher(client)
        await watcher.start()
        return client, watcher

    async def stop(client: KubeClient, watcher: InvariantWatcher) -> WatchReport:
        try:
            return await watcher.stop()
        finally:
            await client.close()

    try:
        client, watcher = asyncio.run_coroutine_threadsafe(start(), loop).result(120)
        try:
            scenario()
        finally:
            report = asyncio.run_coroutine_threadsafe(stop(client, watcher), loop).result(120)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    return report


def test_the_kubelet_and_containerd_killed_under_a_running_step_leave_the_step_running(
        faulty: RealCluster, gate_name: str) -> None:
    real = faulty
    kubelet_node, containerd_node = real.nodes
    killed: dict[str, list[int]] = {}

    def scenario() -> None:
        apply_gate(real, gate_name, real.nodes)
        try:
            for node in real.nodes:
                wait_step_started(real, node, gate_name)
            killed["kubelet"] = faults.kill_kubelet(real.dev.dir, kubelet_node)
            killed["containerd"] = faults.kill_containerd(real.dev.dir, containerd_node)
            status = real.wait_complete(gate_name, 300.0)
            assert status["nodes"]["complete"] == 2, status
            for node in real.nodes:
                assert real.node_file(node, f"/etc/nodegate-fault-{gate_name}") == f"{gate_name}\n"
                # The step's container outlived the restart: it ran once, not again from the start.
                assert step_runs(real, node, gate_name) == 1, f"{node}: the step ran again"
            config0, config1 = real.config(kubelet_node), real.config(containerd_node)
            # Both came back, as new processes.
            assert set(faults.node_processes(config0, "kubelet")).isdisjoint(killed["kubelet"])
            assert set(faults.node_processes(config1, "containerd")).isdisjoint(killed["containerd"])
            assert faults.node_processes(config1, "containerd")
        finally:
            finish(real, gate_name, real.nodes)

    report = watched(real, scenario)
    assert not report.violations, report.summary()
    assert not cordoned(real)


def test_a_power_cut_during_a_step_boots_the_node_again_and_the_round_runs_the_step_again(
        faulty: RealCluster, gate_name: str) -> None:
    real = faulty
    node = real.nodes[0]

    def scenario() -> None:
        before = real.boot_id(node)
        apply_gate(real, gate_name, [node])
        try:
            wait_step_started(real, node, gate_name)
            faults.power_cut(real.dev.dir, node)
            real.wait(f"{node} back with a new boot ID", lambda: real.boot_id(node) not in ("", before), 300.0, 2.0)
            real.wait_complete(gate_name, 420.0)
            # The step was cut off and ran again from its start: its idempotence made that safe.
            assert step_runs(real, node, gate_name) >= 2, real.node_file(node, f"/var/tmp/{gate_name}.log")
            assert real.node_file(node, f"/etc/nodegate-fault-{gate_name}") == f"{gate_name}\n"
        finally:
            finish(real, gate_name, [node])

    report = watched(real, scenario)
    assert not report.violations, report.summary()
    assert not cordoned(real)


def pull_errors(real: RealCluster, gate: str) -> set[str]:
    """The image pull reasons the gate's stage pods wait with (a step is an init container)."""
    out = real.kubectl.run("get", "pods", "-n", "nodegate-system", "-l", f"nodegate.io/gate={gate}",
                           "-o", "json").stdout
    reasons = set()
    for pod in json.loads(out or "{}").get("items") or []:
        status = pod.get("status") or {}
        for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                reasons.add(reason)
    return reasons


def test_a_registry_down_during_a_pull_and_back_lets_the_pull_finish(
        faulty: RealCluster, gate_name: str) -> None:
    real = faulty
    node = real.nodes[1]
    image = real.images["shellscript"]
    seen: set[str] = set()

    def scenario() -> None:
        # The pod's sandbox image is on every node that ran a pod: the node has it, as a real node
        # that ran its DaemonSets has (without it, the sandbox fails before any pull of the stage's).
        pause = f"{real.config(node).registry}/{realnode.PAUSE_IMAGE}"
        real.node_sh(node, f"ctr -n k8s.io images pull --plain-http {pause} >/dev/null")
        # The node must pull: it forgets the package's image (containerd's own client on the node).
        real.node_sh(node, f"ctr -n k8s.io images rm {image} >/dev/null 2>&1; "
                           f"! ctr -n k8s.io images ls -q | grep -qx '{image}'")

        def pull_failed() -> bool:
            seen.update(pull_errors(real, gate_name))
            return bool(seen)

        faults.registry_down(real.dev.dir)
        try:
            apply_gate(real, gate_name, [node], sleep=1)
            try:
                real.wait("the pull to fail", pull_failed, 180.0)
            finally:
                faults.registry_up(real.dev.dir)
            status = real.wait_complete(gate_name, 300.0)
            assert status["nodes"]["complete"] == 1, status
            assert real.node_file(node, f"/etc/nodegate-fault-{gate_name}") == f"{gate_name}\n"
        finally:
            faults.registry_up(real.dev.dir)
            finish(real, gate_name, [node])

    report = watched(real, scenario)
    assert seen, "the pull never failed while the registry was down"
    assert not report.violations, report.summary()
    assert not cordoned(real)


def test_the_operator_killed_during_a_reboot_resumes_it_and_a_reboot_that_never_returns_fails_the_node(
        faulty: RealCluster, gate_name: str) -> None:
    """One gate with a reboot over both nodes, one at a time: the operator is killed while the first node
    is down and comes back to finish its round; the second node's boot is held past the reboot timeout,
    and it fails with RebootTimeout (released afterwards, it boots and the gate's deletion uncordons it)."""
    real = faulty
    outcome: dict[str, Any] = {}

    def interrupting() -> str | None:
        for node in real.nodes:
            if node_state(real, gate_name, node).get("phase") == "interrupt":
                return node
        return None

    def scenario() -> None:
        boots = {node: real.boot_id(node) for node in real.nodes}
        apply_gate(real, gate_name, real.nodes, interrupt="reboot", sleep=1)
        try:
            real.wait("a node to reach its reboot", lambda: interrupting() is not None, 300.0, every=0.5)
            first = interrupting()
            assert first is not None
            second = next(node for node in real.nodes if node != first)
            outcome["first"], outcome["second"] = first, second
            faults.hold_boot(real.dev.dir, second, 3600)
            real.wait(f"{first} to go down for its reboot", lambda: node_down(real, first), 120.0, every=0.2)
            faults.kill_operator(real.dev.dir, down_seconds=3)
            real.wait(f"{first} complete and {second} failed", lambda: (
                node_state(real, gate_name, first).get("status") == "complete"
                and node_state(real, gate_name, second).get("status") == "failed"), 600.0, every=2.0)
            assert real.boot_id(first) != boots[first]
            failure = node_state(real, gate_name, second)["failure"]
            assert failure["reason"] == "RebootTimeout", failure
            assert "boot ID" in failure["message"], failure
        finally:
            for node in real.nodes:
                faults.release_boot(real.dev.dir, node)
            finish(real, gate_name, real.nodes)
        outcome["second_boot"] = real.boot_id(outcome.get("second", real.nodes[1]))
        outcome["boots"] = boots

    report = watched(real, scenario)
    assert outcome["second_boot"] != outcome["boots"][outcome["second"]]
    assert not report.violations, report.summary()
    assert not cordoned(real)



def boots(real: RealCluster, node: str) -> int:
    """How many times the node's supervisor booted it so far (its log has a line per boot)."""
    log = real.dev.dir / "logs" / f"{realfleet.supervisor(node)}.log"
    return log.read_text(errors="replace").count(f"{node}: booted (") if log.exists() else 0


def reboot_pod_ended(real: RealCluster, gate: str) -> bool:
    """Whether the gate's pod that holds the reboot is there and ended (Succeeded or Failed)."""
    out = real.kubectl.run("get", "pods", "-n", "nodegate-system", "-l",
                           f"nodegate.io/gate={gate},{keys.INTERRUPT_LABEL}=reboot", "-o", "json").stdout
    pods = json.loads(out or "{}").get("items") or []
    return bool(pods) and all((p.get("status") or {}).get("phase") in ("Succeeded", "Failed") for p in pods)


def test_the_operator_away_across_a_reboot_finds_the_node_rebooted_once_and_finishes_the_round(
        faulty: RealCluster, gate_name: str) -> None:
    """The operator is killed as the node goes down for its reboot, and stays away until the node is back
    and its kubelet has ended the reboot pod (a clean reboot: the pod's sandbox is gone, the runtime still
    lists its containers, so the kubelet does not run it again; docs/realnodes.md, "Out of service"). The
    operator that comes back reads the round from the node's state, judges the reboot by the new boot ID
    and finishes: the node booted once, the step ran once, nothing was left cordoned."""
    real = faulty
    node = real.nodes[0]
    outcome: dict[str, Any] = {}

    def scenario() -> None:
        before, boot = boots(real, node), real.boot_id(node)
        apply_gate(real, gate_name, [node], interrupt="reboot", sleep=1)
        try:
            real.wait("the node to reach its reboot",
                      lambda: node_state(real, gate_name, node).get("phase") == "interrupt", 300.0, every=0.5)
            real.wait(f"{node} to go down for its reboot", lambda: node_down(real, node), 120.0, every=0.2)
            faults.kill_operator(real.dev.dir, until=lambda: (
                real.boot_id(node) not in ("", boot) and node_ready(real, node)
                and reboot_pod_ended(real, gate_name)), timeout=300.0)
            real.wait_complete(gate_name, 420.0)
            outcome["boots"], outcome["runs"] = boots(real, node) - before, step_runs(real, node, gate_name)
            assert real.node_file(node, f"/etc/nodegate-fault-{gate_name}") == f"{gate_name}\n"
        finally:
            finish(real, gate_name, [node])

    report = watched(real, scenario)
    assert outcome == {"boots": 1, "runs": 1}, outcome
    assert not report.violations, report.summary()
    assert not cordoned(real)


def reboot_pod(real: RealCluster, name: str, node: str, uid: str) -> str:
    """The operator's own reboot pod (`gate.controller.pods.stage_pod`, one step: the reboot), made bare in
    `default`, with one change: its reboot step names the pod by `uid`, where the operator's names it by the
    pod's own UID from the kubelet. The same `uid` twice is the same pod run again."""
    from gate.api.nodegate import Interrupt, NodeGate
    from gate.controller.pods import stage_pod
    from gate.controller.settings import OperatorSettings
    from gate.lifecycle.node import PodRequest, Step

    gate = NodeGate.model_validate({"metadata": {"name": "reboot-once", "uid": "reboot-once"}, "spec": {
        "packages": {"shellscript": {"version": "1.0.0", "image": real.images["shellscript"]}}}})
    reboot = Interrupt(type="reboot")
    pod = stage_pod(gate, node, PodRequest(name, "interrupt", (Step(None, "interrupt", "reboot:"),), interrupt=reboot),
                    OperatorSettings(namespace="default", agent_image=real.images["nodegate"]))
    pod["metadata"].pop("ownerReferences", None)  # no NodeGate object owns it here
    (step,) = pod["spec"]["containers"]
    assert step["env"] == [{"name": "NODEGATE_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    step["env"] = [{"name": "NODEGATE_POD_UID", "value": uid}]
    account = pod["spec"]["serviceAccountName"]  # the chart's, in its namespace; here made in `default`
    return yaml.safe_dump_all([{"apiVersion": "v1", "kind": "ServiceAccount",
                                "metadata": {"name": account, "namespace": "default"},
                                "automountServiceAccountToken": False}, pod])


def pod_phase(real: RealCluster, name: str) -> str:
    return real.kubectl.run("get", "pod", name, "-n", "default", "-o", "jsonpath={.status.phase}",
                            check=False).stdout.strip()


def test_a_reboot_pod_run_again_on_a_later_boot_does_not_reboot_the_node_again(real: RealCluster) -> None:
    """The kubelet of a new boot runs a pod again from its first step when the runtime lists none of its
    containers (after a power cut, or a boot held back long: docs/realnodes.md). A reboot pod run again must
    not reboot the node once more: its reboot step keeps, on the node's disk, the boot it asked on under its
    pod's UID, and the same pod on a later boot ends at once with success. Played here by two bare pods with
    the same UID: the first reboots the node, the second, after the boot, does not."""
    node, uid = real.nodes[0], "6a0c2d9e-4b1f-4e8a-9c3d-7f5e1b2a8c40"
    before, boot = boots(real, node), real.boot_id(node)
    try:
        real.kubectl.apply(reboot_pod(real, "reboot-once-first", node, uid))
        real.wait(f"{node} down for the first pod's reboot", lambda: node_down(real, node), 180.0, every=0.2)
        real.wait(f"{node} back with a new boot ID", lambda: real.boot_id(node) not in ("", boot)
                  and node_ready(real, node), 300.0, every=1.0)
        assert real.node_file(node, f"/var/lib/nodegate/reboots/{uid}") == f"{boot}\n"
        real.kubectl.apply(reboot_pod(real, "reboot-once-again", node, uid))
        real.wait("the pod run again to end", lambda: pod_phase(real, "reboot-once-again") in ("Succeeded", "Failed"),
                  180.0, every=1.0)
        message = real.kubectl.run("get", "pod", "reboot-once-again", "-n", "default", "-o",
                                   "jsonpath={.status.containerStatuses[0].state.terminated.message}").stdout
        assert pod_phase(real, "reboot-once-again") == "Succeeded", message
        assert "is not rebooted again" in message and boot in message, message
        assert boots(real, node) - before == 1 and node_ready(real, node)
    finally:
        real.kubectl.run("delete", "pod", "reboot-once-first", "reboot-once-again", "-n", "default",
                         "--ignore-not-found", "--wait=false")
        real.node_sh(node, f"rm -f /var/lib/nodegate/reboots/{uid}", check=False)
