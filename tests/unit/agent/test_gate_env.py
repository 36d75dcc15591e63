"""The agent's refusal of undeclared input: a gate's env names and config keys that the package does
not declare, names NodeGate never passes, values that break their declared rule (property tests)."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.agent.config import config_problems
from gate.agent.errors import PackageError
from gate.agent.gate_env import check_gate_env
from gate.agent.loader import parse_manifest
from gate.agent.package import ENV_NAME_PATTERN
from gate.api.environment import NEVER_PASSED_NAMES, NEVER_PASSED_PREFIXES, never_passed

HEAD = "apiVersion: nodegate.io/v1alpha1\nkind: Package\nname: demo-pkg\nversion: 1.0.0\n"
DECLARED = parse_manifest(HEAD + """
env: {KERNEL_ARGS: iommu=pt}
gateEnv:
  KERNEL_ARGS: {pattern: '[-A-Za-z0-9_.,:;=/+@ ]{0,4096}'}
  WORKERS: {type: int, minimum: 1, maximum: 64}
  MODE: {type: enum, enum: [fast, safe]}
  VERBOSE: {type: bool}
config:
  keys:
    sysctl.conf: {}
    "service_*.conf": {}
""")
BARE = parse_manifest(HEAD)
FAST = settings(max_examples=200, deadline=None)

env_names = st.from_regex(ENV_NAME_PATTERN.replace("$", r"\Z"), fullmatch=True).filter(lambda n: len(n) <= 64)
hostile = st.sampled_from(sorted(NEVER_PASSED_NAMES)) | st.builds(
    lambda prefix, tail: prefix + tail, st.sampled_from(NEVER_PASSED_PREFIXES),
    st.text(string.ascii_uppercase + "_", max_size=12))


@FAST
@given(names=st.lists(env_names, max_size=6), values=st.text(max_size=40))
def test_a_name_the_package_does_not_declare_never_passes(names: list[str], values: str) -> None:
    environ = {n: values for n in names}
    passed, problems = check_gate_env(DECLARED, names, environ)
    assert set(passed) <= set(DECLARED.gate_env)
    for name in dict.fromkeys(names):
        if name not in DECLARED.gate_env:
            assert any(p.startswith(f"env {name} ") for p in problems), (name, problems)
    # a problem for every undeclared or hostile name, and nothing passed for them
    assert not {n for n in names if n not in DECLARED.gate_env} & set(passed)


@FAST
@given(name=hostile, value=st.text(max_size=40))
def test_a_never_passed_name_is_refused_naming_it_whatever_its_value(name: str, value: str) -> None:
    passed, problems = check_gate_env(DECLARED, [name], {name: value})
    assert passed == {} and len(problems) == 1 and problems[0].startswith(f"env {name} is refused: ")
    assert never_passed(name)


@FAST
@given(value=st.text(max_size=60))
def test_a_declared_value_passes_only_when_it_follows_its_rule(value: str) -> None:
    passed, problems = check_gate_env(DECLARED, ["KERNEL_ARGS"], {"KERNEL_ARGS": value})
    follows = re.fullmatch(r"[-A-Za-z0-9_.,:;=/+@ ]{0,4096}", value, re.DOTALL) is not None
    assert (passed == {"KERNEL_ARGS": value}) == follows and (problems == []) == follows
    if not follows:
        assert problems[0].startswith("env KERNEL_ARGS=") and "does not match the pattern" in problems[0]


def test_typed_values_are_checked_and_written_in_one_spelling() -> None:
    environ = {"WORKERS": " 8", "MODE": "fast", "VERBOSE": "TRUE"}
    assert check_gate_env(DECLARED, list(environ), environ) == ({"WORKERS": "8", "MODE": "fast", "VERBOSE": "true"},
                                                                [])
    environ = {"WORKERS": "65", "MODE": "turbo"}
    assert check_gate_env(DECLARED, list(environ), environ)[1] == [
        "env WORKERS='65': 65 is above the maximum 64", "env MODE='turbo': 'turbo' is not one of fast, safe"]


def test_by_hand_the_declared_names_in_the_environment_are_the_gates() -> None:
    environ = {"KERNEL_ARGS": "quiet", "PYTHONPATH": "/x", "HOSTNAME": "n1", "LD_PRELOAD": "/x.so"}
    assert check_gate_env(DECLARED, None, environ) == ({"KERNEL_ARGS": "quiet"}, [])


config_keys = st.from_regex(r"[-._a-zA-Z0-9]{1,40}\Z", fullmatch=True).filter(lambda k: not k.startswith(".."))


@FAST
@given(keys=st.lists(config_keys, min_size=1, max_size=5, unique=True))
def test_a_package_without_a_config_section_refuses_every_key(keys: list[str]) -> None:
    problems = config_problems(BARE, {k: b"x" for k in keys})
    assert len(problems) == len(keys)
    assert all(f"config key {k!r} is not accepted" in p for k, p in zip(sorted(keys), problems, strict=True))


@FAST
@given(keys=st.lists(config_keys, min_size=1, max_size=5, unique=True))
def test_a_package_with_a_config_section_refuses_each_undeclared_key_by_name(keys: list[str]) -> None:
    problems = config_problems(DECLARED, {k: b"x" for k in keys})
    undeclared = [k for k in keys if DECLARED.config is not None and DECLARED.config.declaration(k) is None]
    assert len(problems) == len(undeclared)
    for key in undeclared:
        assert any(f"config key {key!r} is not declared by package demo-pkg" in p for p in problems)


@pytest.mark.parametrize("where", ["env: {NAME: x}", "gateEnv: {NAME: {type: bool}}",
                                   "stages: {apply: [{name: s, command: 'true', env: {NAME: x}}]}"])
@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "BASH_ENV", "PATH", "NODE_OPTIONS", "PERL5OPT"])
def test_a_manifest_that_declares_a_never_passed_name_is_refused(where: str, name: str) -> None:
    with pytest.raises(PackageError) as refused:
        parse_manifest(HEAD + where.replace("NAME", name) + "\n")
    assert f"{name}: " in str(refused.value) and "never passes" in str(refused.value)


def test_a_string_env_declaration_needs_a_pattern() -> None:
    with pytest.raises(PackageError) as refused:
        parse_manifest(HEAD + "gateEnv: {ARGS: {description: anything}}\n")
    assert "gateEnv.ARGS: an env value of type string needs a pattern" in str(refused.value)
