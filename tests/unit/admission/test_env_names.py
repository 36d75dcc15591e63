"""A gate's env names that are code, not data (`gate.api.environment`): refused for every package and
every user, the message naming the field and the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.admission.rules import decide
from gate.admission.rules.facts import Facts
from gate.api.environment import NEVER_PASSED_NAMES, never_passed
from tests.unit.admission.helpers import gate, package, request

ATTACKS = ["PYTHONPATH", "PYTHONWARNINGS", "PYTHONSTARTUP", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV",
           "PATH", "NODE_OPTIONS", "PERL5OPT", "PERL5LIB", "RUBYOPT", "BROWSER", "GCONV_PATH", "OPENSSL_CONF",
           "GIT_SSH_COMMAND", "NODEGATE_STAGE"]


def test_every_loader_and_interpreter_variable_is_refused_naming_the_field_and_the_name() -> None:
    env = [{"name": "KERNEL_ARGS", "value": "quiet"}, *({"name": n, "value": "/nodegate-config"} for n in ATTACKS)]
    obj = gate({"sysctl-tuning": package(env=env)})
    verdict = decide.validate(request("NodeGate", "CREATE", obj), Facts())
    assert not verdict.allowed
    refused = {v.field: v.reason for v in verdict.violations}
    assert set(refused) == {f"spec.packages[sysctl-tuning].env[{i}].name" for i in range(1, len(ATTACKS) + 1)}
    for i, name in enumerate(ATTACKS, start=1):
        reason = refused[f"spec.packages[sysctl-tuning].env[{i}].name"]
        assert reason.startswith(f"env {name} is refused: "), reason
    assert all(v.forbidden for v in verdict.violations)


def test_data_names_pass() -> None:
    obj = gate({"grub-cmdline": package(env=[{"name": "KERNEL_ARGS", "value": "iommu=pt"},
                                              {"name": "MODULES", "value": "nouveau"}])})
    # only the RBAC question is left
    assert decide.validate(request("NodeGate", "CREATE", obj), Facts()).violations == ()


@pytest.mark.parametrize("name", sorted(NEVER_PASSED_NAMES))
def test_the_documented_list_is_the_one_enforced(name: str) -> None:
    doc = (Path(__file__).parents[3] / "docs" / "packages.md").read_text()
    assert never_passed(name) and f"`{name}`" in doc
