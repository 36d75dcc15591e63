"""A bound catalog package's config keys and env at admission: refused by field when they break the
package's declarations (gate.admission.rules.inputs), left to the agent when admission cannot know."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gate.admission.rules import decide
from gate.admission.rules.catalog_inputs import CATALOG_INPUTS
from gate.admission.rules.facts import Facts
from gate.admission.rules.images import ImagePolicy, bindings
from gate.agent.catalog import render_inputs_module
from tests.unit.admission.helpers import gate, package, request

REPO = Path(__file__).resolve().parents[3]
CATALOG = ImagePolicy(package_repositories=bindings(
    {name: [f"ghcr.io/example/nodegate-{name}"] for name in CATALOG_INPUTS}))


def reasons(policy: ImagePolicy, name: str, **extra: Any) -> dict[str, str]:
    obj = gate({name: package(image=f"ghcr.io/example/nodegate-{name}", **extra)})
    return {v.field: v.reason for v in decide.validate(request("NodeGate", "CREATE", obj), Facts(), policy).violations}


def test_the_inputs_admission_knows_are_the_catalogs_own() -> None:
    generated = REPO / "gate/admission/rules/catalog_inputs.py"
    assert generated.read_text() == render_inputs_module(REPO / "packages"), (
        "stale: run `nodegate package catalog --output docs/catalog.md "
        "--inputs gate/admission/rules/catalog_inputs.py`")


def test_a_bound_catalog_package_refuses_undeclared_keys_and_names_and_values_against_their_rule() -> None:
    config = {"sitecustomize.py": "import os\n"}
    assert reasons(CATALOG, "sysctl-tuning", config=config) == {
        "spec.packages[sysctl-tuning].config[sitecustomize.py]":
            "config key 'sitecustomize.py' is not accepted: package sysctl-tuning 1.0.0 "
            "(docs/catalog.md#sysctl-tuning) declares no config"}
    got = reasons(CATALOG, "grub-cmdline", env=[{"name": "KERNEL_ARGS", "value": "quiet $(reboot)"},
                                                {"name": "FOO", "value": "1"},
                                                {"name": "KERNEL_ARGS", "valueFrom": {"secretKeyRef": {"name": "s",
                                                                                                      "key": "k"}}}])
    assert set(got) == {"spec.packages[grub-cmdline].env[0].value", "spec.packages[grub-cmdline].env[1].name"}
    assert got["spec.packages[grub-cmdline].env[0].value"].startswith(
        "env KERNEL_ARGS='quiet $(reboot)' of package grub-cmdline 1.0.0 (docs/catalog.md#grub-cmdline): "
        "does not match the pattern")
    assert got["spec.packages[grub-cmdline].env[1].name"] == (
        "env FOO is not declared by package grub-cmdline 1.0.0 (docs/catalog.md#grub-cmdline) "
        "(its gateEnv declares: KERNEL_ARGS)")
    got = reasons(CATALOG, "gpu-tuning", config={"intent": "training", "cloud": "eks", "extra": "1"})
    assert set(got) == {"spec.packages[gpu-tuning].config[intent]", "spec.packages[gpu-tuning].config[extra]"}
    assert reasons(CATALOG, "bind-mount", config={}) == {
        "spec.packages[bind-mount].config": "config key 'mounts' is required by package bind-mount 1.0.0 "
                                           "(docs/catalog.md#bind-mount)"}


def test_declared_input_passes_and_what_admission_cannot_know_is_left_to_the_agent() -> None:
    assert reasons(CATALOG, "grub-cmdline", env=[{"name": "KERNEL_ARGS", "value": "iommu=pt"}]) == {}
    assert reasons(CATALOG, "chrony-conf", config={"pool.conf": "pool a iburst\n"}) == {}
    hostile = {"config": {"sitecustomize.py": "x"}, "env": [{"name": "FOO", "value": "1"}]}
    assert reasons(ImagePolicy(), "sysctl-tuning", **hostile) == {}  # unbound: the name may be anyone's package
    assert reasons(CATALOG, "sysctl-tuning", version="2.0.0", **hostile) == {}  # not the catalog's version
