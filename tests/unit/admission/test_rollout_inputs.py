"""Input that cannot roll out is refused at admission, naming the field and the key: a gate name too
long for the node keys, config keys the ConfigMap would refuse, config over its size, durations past
their maximum (or past any clock), service names that read as flags, env names and tolerations a pod
refuses. Each
would otherwise be admitted and fail only once a node was cordoned and drained."""

from __future__ import annotations

from typing import Any

import pytest

from gate.admission.rules import decide
from gate.admission.rules.facts import Facts
from gate.api import keys
from tests.unit.admission.helpers import gate, package, request

LONG = "x" * 1_100_000


def messages(obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> list[str]:
    return [v.message for v in decide.validate(request("NodeGate", operation, obj, old), Facts()).violations]


def svc(*services: str) -> dict[str, Any]:
    return {"type": "service", "services": list(services)}


REFUSED = [
    # the gate's name: `nodegate.io/state.<name>` must fit a key's 63-character name
    (gate(name="g" * 58), 'metadata.name: NodeGate name "' + "g" * 58 + '" has 58 characters; at most 57'),
    (gate(name="a." * 40 + "b"), "has 81 characters; at most 57: the node annotation nodegate.io/state.<name>"),
    # config keys: the ConfigMap's rules
    (gate({"tuned": package(config={"café.conf": "x"})}),
     "spec.packages[tuned].config[café.conf]: config key 'café.conf' is no ConfigMap key: letters, digits"),
    (gate({"tuned": package(config={"a b": "x"})}), "spec.packages[tuned].config[a b]: config key 'a b'"),
    (gate({"tuned": package(config={"dir/file": "x"})}), "spec.packages[tuned].config[dir/file]"),
    (gate({"tuned": package(config={".": "x"})}), "spec.packages[tuned].config[.]: config key '.' is no ConfigMap"),
    (gate({"tuned": package(config={"..": "x"})}), "spec.packages[tuned].config[..]"),
    (gate({"tuned": package(config={"..data": "x"})}), "spec.packages[tuned].config[..data]"),
    (gate({"tuned": package(config={"k" * 254: "x"})}), "spec.packages[tuned].config[" + "k" * 60 + "...]"),
    (gate({"tuned": package(config={"": "x"})}), "spec.packages[tuned].config[]: config key ''"),
    # config size: a ConfigMap's values together at most 1 MiB, counted in bytes
    (gate({"tuned": package(config={"big.conf": LONG})}),
     "spec.packages[tuned].config: the values add up to 1100000 bytes; a ConfigMap holds at most 1048576"),
    (gate({"tuned": package(config={"a": "é" * 300_000, "b": "é" * 300_000})}),
     "spec.packages[tuned].config: the values add up to 1200000 bytes"),
    # durations: a maximum per field, and no crash on one past any clock
    (gate({"tuned": package(timeout="99999999999999999h")}),
     "spec.packages[tuned].timeout: '99999999999999999h' is longer than the maximum of 24h"),
    (gate({"tuned": package(timeout="25h")}), "spec.packages[tuned].timeout: '25h' is longer than the maximum of 24h"),
    (gate({"tuned": package(timeout="86401s")}), "spec.packages[tuned].timeout: '86401s' is longer than"),
    (gate({"tuned": package(gracefulShutdown="61m")}),
     "spec.packages[tuned].gracefulShutdown: '61m' is longer than the maximum of 1h"),
    (gate(waitTimeout="721h"),
     "spec.waitTimeout: '721h' is longer than the maximum of 720h; leave it unset to wait for as long as they run"),
    (gate(waitTimeout="9" * 60 + "h"), "spec.waitTimeout: '99999999999999999999...' is longer than the maximum"),
    (gate(drain={"timeout": "169h"}), "spec.drain.timeout: '169h' is longer than the maximum of 168h"),
    (gate(drain={"timeout": "1" * 40 + "ms"}), "spec.drain.timeout: "),
    # service names: systemd unit names, never a flag
    (gate({"tuned": package(interrupt=svc("tuned", "--root=/"))}),
     "spec.packages[tuned].interrupt.services[1]: '--root=/' is not a systemd unit name: letters, digits and "
     "-_.:@\\, starting with a letter, digit or _, at most 255 characters (it would read as a flag)"),
    (gate({"tuned": package(interrupt=svc("-i"))}), "spec.packages[tuned].interrupt.services[0]: '-i' is not"),
    (gate({"tuned": package(interrupt=svc("a b"))}), "spec.packages[tuned].interrupt.services[0]: 'a b' is not"),
    (gate({"tuned": package(interrupt=svc("*"))}), "spec.packages[tuned].interrupt.services[0]: '*' is not"),
    (gate({"tuned": package(interrupt=svc("x" * 256))}), "spec.packages[tuned].interrupt.services[0]"),
    (gate({"tuned": package(config={"a.conf": "x"}, configInterrupts={"*.conf": svc("-f")})}),
     "spec.packages[tuned].configInterrupts[*.conf].services[0]: '-f' is not a systemd unit name"),
    (gate({"tuned": package(uninstall={"enabled": True, "interrupt": svc("--now")})}),
     "spec.packages[tuned].uninstall.interrupt.services[0]: '--now' is not a systemd unit name"),
    (gate({"tuned": package(uninstall={"enabled": True, "interrupt": {"type": "kexec"}})}),
     "spec.packages[tuned].uninstall.interrupt.type: unknown interrupt type 'kexec'"),
    # tolerations the API server refuses in the stage pod
    (gate(additionalTolerations=[{"key": "a/b/c", "operator": "Exists"}]),
     "spec.additionalTolerations[0].key: the prefix of label key 'a/b/c'"),
    (gate(additionalTolerations=[{"operator": "Equal", "value": "x"}]),
     "spec.additionalTolerations[0].operator: must be Exists when key is empty"),
    (gate(additionalTolerations=[{"key": "k", "operator": "Exists", "value": "x"}]),
     "spec.additionalTolerations[0].value: must be empty when operator is Exists, not 'x'"),
    (gate(additionalTolerations=[{"key": "k", "value": "not ok"}]),
     "spec.additionalTolerations[0].value: label value 'not ok'"),
    (gate(additionalTolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]),
     "spec.additionalTolerations[0].effect: must be NoExecute when tolerationSeconds is set"),
    # env names the API server refuses in the stage pod
    (gate({"tuned": package(env=[{"name": "A=B", "value": "x"}])}),
     "spec.packages[tuned].env[0].name: 'A=B' is no environment variable name"),
    (gate({"tuned": package(env=[{"name": "OK"}, {"name": "CAFÉ", "value": "x"}])}),
     "spec.packages[tuned].env[1].name: 'CAFÉ' is no environment variable name"),
]


@pytest.mark.parametrize(("obj", "fragment"), REFUSED, ids=[c[1][:60] for c in REFUSED])
def test_input_that_cannot_roll_out_is_refused_naming_field_and_key(obj: dict[str, Any], fragment: str) -> None:
    found = messages(obj)
    assert any(fragment in m for m in found), found


ADMITTED = [
    gate(name="g" * keys.GATE_NAME_MAX),
    gate(name="gpu-tuning.team-a.example"),
    gate({"tuned": package(config={"tuned.conf": "x", "a_b-c.d": "y", ".hidden": "z", "K" * 253: ""})}),
    gate({"tuned": package(config={"big.conf": "x" * (1024 * 1024)})}),
    gate({"tuned": package(timeout="24h", gracefulShutdown="1h")}, waitTimeout="720h", drain={"timeout": "168h"}),
    gate({"tuned": package(timeout="1h30m", gracefulShutdown="0s")}, waitTimeout="0.5h", drain={"timeout": "1500ms"}),
    gate({"tuned": package(interrupt=svc("tuned", "nvidia-persistenced.service", "getty@tty1.service",
                                         "systemd-cryptsetup@luks\\x2dabc.service", "_x", "a:b"))}),
    gate({"tuned": package(env=[{"name": "my.env-name"}, {"name": "HTTP_PROXY", "value": "x"},
                                {"name": "with space"}])}),
    gate(additionalTolerations=[{"operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists",
                                                         "effect": "NoSchedule"},
                                {"key": "k", "value": "v", "effect": "NoExecute", "tolerationSeconds": 30},
                                {"key": "k", "operator": "Equal"}]),
]


@pytest.mark.parametrize("obj", ADMITTED, ids=range(len(ADMITTED)))
def test_input_at_the_limits_is_admitted(obj: dict[str, Any]) -> None:
    assert messages(obj) == []


def test_the_name_is_checked_at_create_only() -> None:
    # A name never changes: a gate admitted before the limit existed may still be updated (and its
    # finalizer removed) rather than be stuck.
    old = gate({"tuned": package()}, name="g" * 60)
    new = gate({"tuned": package("1.1.0")}, name="g" * 60)
    assert messages(new, "UPDATE", old) == []


def test_the_longest_name_fits_every_node_key() -> None:
    name = "g" * keys.GATE_NAME_MAX
    for key in (keys.state_annotation(name), keys.reset_annotation(name), keys.rerun_annotation(name),
                keys.status_label(name)):
        assert len(key.split("/", 1)[1]) <= 63, key


def test_a_duration_past_any_clock_is_a_validation_error_not_a_crash() -> None:
    for text in ("99999999999999999h", "9" * 62 + "h", "9" * 30 + "." + "9" * 30 + "h"):
        found = messages(gate({"tuned": package(timeout=text)}, waitTimeout=text, drain={"timeout": text}))
        assert len(found) == 3 and all("is longer than the maximum" in m or "not a duration" in m for m in found), found


def test_a_gate_whose_state_record_could_outgrow_its_share_of_a_nodes_annotations_is_refused() -> None:
    from gate.admission.rules.nodegate import STATE_RECORD_MAX
    from gate.api.state import Installed, NodeGateState

    config = {f"k{j:02d}-" + "y" * 240: "x" for j in range(64)}
    packages = {f"pkg-{chr(97 + i)}": package(config=config) for i in range(8)}
    found = messages(gate(packages))
    assert len(found) == 1, found
    assert found[0].startswith("spec.packages: the gate's state record on a node could reach"), found
    # the bound is an upper bound: the record such a gate really writes, every key installed, is no larger
    record = NodeGateState(status="failed", installed={n: Installed(version="1.0.0", spec_hash="0" * 16,
                                                                    config={k: "0" * 16 for k in config})
                                                       for n in packages}).dump()
    claimed = int(found[0].split("could reach ")[1].split(" ")[0])
    assert len(record) <= claimed and claimed > STATE_RECORD_MAX
    # fewer packages with the same keys fit
    assert messages(gate({n: p for n, p in list(packages.items())[:3]})) == []
