"""The stage Job manifest: what the issue promises a package pod gets, read off the rendered object."""

from __future__ import annotations

from typing import Any

import pytest

from gate.api import keys
from gate.api.nodegate import Interrupt, NodeGate
from gate.api.versions import image_reference
from gate.controller.jobs import config_map_name, stage_job
from gate.controller.settings import OperatorSettings
from gate.lifecycle.machine import JobRequest

SETTINGS = OperatorSettings(namespace="ng-system", agent_image="example.com/nodegate:9.9.9")


def gate(**package: Any) -> NodeGate:
    pkg = {"version": "1.2.0", "image": "registry.example.com:5000/team/tuned", "timeout": "2m", "retries": 2,
           "config": {"a.conf": "x=1"}, **package}
    return NodeGate.model_validate({
        "metadata": {"name": "g", "generation": 3, "uid": "u-1"},
        "spec": {"packages": {"tuned": pkg},
                 "additionalTolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    })


def test_a_package_stage_job_is_pinned_privileged_and_bounded_in_time() -> None:
    job = stage_job(gate(), "node-7", JobRequest(name="ng-x", stage="apply", package="tuned", version="1.2.0"),
                    SETTINGS)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == "ng-system"
    assert pod["nodeName"] == "node-7" and pod["hostPID"] is True and pod["restartPolicy"] == "Never"
    # A net.* sysctl must change the node's network namespace, not the pod's copy of it.
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "Default"
    tolerated = {t["key"] for t in pod["tolerations"]}
    assert tolerated == {keys.READINESS_TAINT_KEY, "node.kubernetes.io/unschedulable", "gpu"}
    agent = pod["containers"][0]
    assert agent["securityContext"]["privileged"] is True and agent["image"] == SETTINGS.agent_image
    assert agent["args"][:4] == ["agent", "run", "--stage", "apply"]
    assert {"name": "host", "mountPath": "/host"} in agent["volumeMounts"]
    assert {"name": "host", "hostPath": {"path": "/", "type": "Directory"}} in pod["volumes"]
    config = next(v for v in pod["volumes"] if v["name"] == "config")
    assert config["configMap"]["name"] == config_map_name("g", "tuned", gate().spec.packages["tuned"])
    (init,) = pod["initContainers"]
    assert init["image"] == "registry.example.com:5000/team/tuned:1.2.0"
    assert pod["activeDeadlineSeconds"] == 120 and spec["backoffLimit"] == 2
    assert spec["activeDeadlineSeconds"] >= 3 * 120  # the Job's deadline covers every attempt


def test_an_upgrade_passes_previous_and_current_versions() -> None:
    job = stage_job(gate(), "n", JobRequest(name="j", stage="upgrade", package="tuned", version="1.2.0",
                                            previous_version="1.1.0"), SETTINGS)
    agent = job["spec"]["template"]["spec"]["containers"][0]
    args = agent["args"]
    assert args[args.index("--previous-version") + 1] == "1.1.0" and args[args.index("--version") + 1] == "1.2.0"
    assert {"name": "NODEGATE_PREVIOUS_VERSION", "value": "1.1.0"} in agent["env"]


def test_the_interrupt_job_names_the_services() -> None:
    request = JobRequest(name="j", stage="interrupt", package=None,
                         interrupt=Interrupt(type="service", services=["a", "b"]))
    pod = stage_job(gate(), "n", request, SETTINGS)["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[:4] == ["agent", "interrupt", "--type", "service"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--service"] == ["a", "b"]
    assert pod["initContainers"] == []


@pytest.mark.parametrize("stage", ["apply", "config", "upgrade", "uninstall", "post-interrupt"])
def test_graceful_shutdown_is_every_stage_pods_termination_grace_period(stage: str) -> None:
    request = JobRequest(name="j", stage=stage, package="tuned", version="1.2.0")  # type: ignore[arg-type]
    pod = stage_job(gate(gracefulShutdown="2m"), "n", request, SETTINGS)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120
    # Whole seconds, never less than asked for.
    pod = stage_job(gate(gracefulShutdown="1500ms"), "n", request, SETTINGS)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 2


def test_without_graceful_shutdown_stage_pods_keep_kubernetes_default_grace_period() -> None:
    request = JobRequest(name="j", stage="apply", package="tuned", version="1.2.0")
    assert "terminationGracePeriodSeconds" not in stage_job(gate(), "n", request, SETTINGS)["spec"]["template"]["spec"]
    # The interrupt Job is nobody's package: the setting of one does not apply to it.
    interrupt = JobRequest(name="i", stage="interrupt", package=None, interrupt=Interrupt(type="reboot"))
    pod = stage_job(gate(gracefulShutdown="2m"), "n", interrupt, SETTINGS)["spec"]["template"]["spec"]
    assert "terminationGracePeriodSeconds" not in pod


@pytest.mark.parametrize(("image", "version", "expected"), [
    ("ghcr.io/team/tool", "1.0.0", "ghcr.io/team/tool:1.0.0"),
    ("host:5000/team/tool", "1.0.0", "host:5000/team/tool:1.0.0"),
    ("host:5000/team/tool:1.0.0", "1.0.0", "host:5000/team/tool:1.0.0"),  # tagged as the version already
    ("ghcr.io/team/tool@sha256:" + "a" * 64, "1.0.0", "ghcr.io/team/tool@sha256:" + "a" * 64),
    ("ghcr.io/team/tool", "1.0.0+build.7", "ghcr.io/team/tool:1.0.0_build.7"),  # '+' is not allowed in a tag
])
def test_the_package_image_is_tagged_with_its_version_once(image: str, version: str, expected: str) -> None:
    assert image_reference(image, version) == expected


def _job(conditions: list[dict[str, str]] | None = None, active: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "j", "creationTimestamp": "2026-11-30T10:00:00Z",
                         "labels": {keys.STAGE_PACKAGE_LABEL: "tuned", keys.STAGE_KIND_LABEL: "apply"}},
            "status": {"active": active, "conditions": conditions or []}}


def _pod(phase: str, exit_code: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "agent", "state": {"terminated": {"exitCode": exit_code}}}]
    return {"metadata": {"name": "p", "creationTimestamp": "2026-11-30T10:00:01Z"}, "status": status}


def test_a_stage_succeeds_with_its_pod_before_the_job_controller_says_so() -> None:
    from gate.controller.jobs import job_view

    assert job_view(_job(), [_pod("Running")]).phase == "running"
    early = job_view(_job(), [_pod("Succeeded", 0)])
    assert early.phase == "succeeded" and not early.settled
    # A failed pod is not a failed stage: the Job may retry it; only the Job's condition ends it.
    assert job_view(_job(), [_pod("Failed", 1)]).phase == "running"
    failed = _job([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}], 0)
    assert job_view(failed, [_pod("Failed", 1)]).phase == "failed"


def test_a_stage_pod_carries_the_nodes_facts_as_an_annotation_projected_into_a_file_for_the_agent() -> None:
    import json

    from gate.api.facts import FACTS_ANNOTATION, OperatorFacts
    from gate.api.state import NodeGateState
    from gate.controller.jobs import facts_of

    node = {"metadata": {"name": "node-7", "labels": {"pool": "gpu", "zone": "b"},
                         "annotations": {"team": "ml", keys.state_annotation("g"): '{"status":"in-progress"}'}}}
    state = NodeGateState(status="in-progress", compartment="canary", batch=2, round=1)
    job = stage_job(gate(), "node-7", JobRequest(name="j", stage="apply", package="tuned", version="1.2.0"),
                    SETTINGS, facts_of("node-7", node, state))
    template = job["spec"]["template"]
    pod = template["spec"]
    facts = OperatorFacts.model_validate_json(template["metadata"]["annotations"][FACTS_ANNOTATION])
    assert facts.node == "node-7" and facts.labels == {"pool": "gpu", "zone": "b"}
    assert facts.annotations == {"team": "ml"}  # the gates' own state stays the operator's
    assert (facts.rollout.compartment, facts.rollout.batch, facts.rollout.round) == ("canary", 2, 1)
    assert FACTS_ANNOTATION not in job["metadata"]["annotations"]  # on the pod, where the Downward API reads it
    volume = next(v for v in pod["volumes"] if v["name"] == "facts")
    [item] = volume["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{FACTS_ANNOTATION}']"
    agent = pod["containers"][0]
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "facts")
    args = agent["args"]
    assert args[args.index("--node-facts") + 1] == f"{mount['mountPath']}/{item['path']}"
    assert {"name": "NODEGATE_NODE", "value": "node-7"} in agent["env"]
    assert json.loads(template["metadata"]["annotations"][FACTS_ANNOTATION])["v"] == 1


def test_without_facts_a_stage_pod_still_gets_the_nodes_name_and_an_interrupt_pod_gets_none() -> None:
    from gate.api.facts import FACTS_ANNOTATION, OperatorFacts

    job = stage_job(gate(), "n", JobRequest(name="j", stage="apply", package="tuned", version="1.2.0"), SETTINGS)
    raw = job["spec"]["template"]["metadata"]["annotations"][FACTS_ANNOTATION]
    assert OperatorFacts.model_validate_json(raw) == OperatorFacts(node="n")
    interrupt = stage_job(gate(), "n", JobRequest(name="i", stage="interrupt", package=None,
                                                  interrupt=Interrupt(type="reboot")), SETTINGS)
    assert FACTS_ANNOTATION not in interrupt["spec"]["template"]["metadata"]["annotations"]
