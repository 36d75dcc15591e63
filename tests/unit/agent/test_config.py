"""Config keys declared in package.yaml: the declarations themselves, and a gate's config held against them."""

from __future__ import annotations

import pytest

from gate.agent.config import config_problems, effective_config, lenient_config, parse_assignments, typed_config
from gate.agent.errors import PackageError
from gate.agent.loader import parse_manifest
from gate.agent.package import PackageManifest

HEAD = "apiVersion: nodegate.io/v1alpha1\nkind: Package\nname: demo-pkg\nversion: 1.0.0\n"
KEYS = """config:
  keys:
    intent: {type: enum, enum: [performance, inference], required: true, description: What the node is for.}
    accelerator: {type: enum, enum: [h100, any], default: any}
    workers: {type: int, default: 4, minimum: 1, maximum: 64}
    verbose: {type: bool, default: false}
    sysctl.conf: {type: string}
    name: {type: string, pattern: '[a-z]+'}
    "service_*.conf": {description: a systemd drop-in per unit}
"""


def manifest(config: str = KEYS) -> PackageManifest:
    return parse_manifest(HEAD + config)


def given(**values: str) -> dict[str, bytes]:
    return {k.replace("__", "."): v.encode() for k, v in values.items()}


def test_defaults_fill_in_and_typed_values_are_written_in_one_spelling() -> None:
    files = effective_config(manifest(), {"intent": b" inference\n", "verbose": b"TRUE", "workers": b"+8",
                                          "sysctl.conf": b"net.core.somaxconn = 4096\n",
                                          "service_kubelet.conf": b"[Service]\n"})
    assert files == {
        "accelerator": b"any",
        "intent": b"inference",
        "service_kubelet.conf": b"[Service]\n",
        "sysctl.conf": b"net.core.somaxconn = 4096\n",
        "verbose": b"true",
        "workers": b"8",
    }
    assert typed_config(manifest(), {"intent": b"performance"}) == {
        "accelerator": "any", "intent": "performance", "verbose": False, "workers": 4}


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({}, "config key 'intent' is required by package demo-pkg (What the node is for.)"),
        ({"intent": b"training"}, "config key 'intent': 'training' is not one of performance, inference"),
        ({"intent": b"inference", "workers": b"four"}, "config key 'workers': 'four' is not an integer"),
        ({"intent": b"inference", "workers": b"0"}, "config key 'workers': 0 is below the minimum 1"),
        ({"intent": b"inference", "workers": b"65"}, "config key 'workers': 65 is above the maximum 64"),
        ({"intent": b"inference", "verbose": b"yes"}, "config key 'verbose': 'yes' is not true or false"),
        ({"intent": b"inference", "name": b"Bad1"}, "config key 'name': does not match the pattern '[a-z]+'"),
        ({"intent": b"inference", "sysctl.conf": b"\xff"}, "config key 'sysctl.conf': not UTF-8 text"),
        ({"intent": b"inference", "service.conf": b"x"},
         "config key 'service.conf' is not declared by package demo-pkg (declared: intent, accelerator, workers, "
         "verbose, sysctl.conf, name, service_*.conf)"),
    ],
)
def test_a_bad_config_names_the_key_and_why(config: dict[str, bytes], problem: str) -> None:
    assert config_problems(manifest(), config) == [problem]
    with pytest.raises(PackageError, match="config key"):
        effective_config(manifest(), config)


def test_every_problem_is_reported_at_once() -> None:
    assert len(config_problems(manifest(), {"workers": b"x", "verbose": b"x", "nope": b""})) == 4


def test_a_package_without_a_config_section_accepts_no_config() -> None:
    undeclared = parse_manifest(HEAD)
    assert effective_config(undeclared, {}) == {}
    with pytest.raises(PackageError) as refused:
        effective_config(undeclared, {"sitecustomize.py": b"import os\n", "x.conf": b"1"})
    assert str(refused.value) == (
        "config key 'sitecustomize.py' is not accepted: package demo-pkg declares no config (package.yaml has no "
        "config section); config key 'x.conf' is not accepted: package demo-pkg declares no config (package.yaml "
        "has no config section)")


def test_uninstall_keeps_going_without_what_breaks_the_declarations_and_with_the_defaults() -> None:
    files, problems = lenient_config(manifest(), {"workers": b"lots", "stray": b"1", "name": b"ok"})
    assert files == {"accelerator": b"any", "name": b"ok", "verbose": b"false", "workers": b"4"}
    assert len(problems) == 3  # workers, stray, intent missing


@pytest.mark.parametrize(
    ("declaration", "problem"),
    [
        ("a: {type: enum}", "a key of type enum needs its values in enum"),
        ("a: {type: string, enum: [x]}", "enum lists the values of an enum key, and only of one"),
        ("a: {type: int, default: '3'}", "default '3' is not of type int"),
        ("a: {type: int, default: true}", "default True is not of type int"),
        ("a: {type: bool, default: 1}", "default 1 is not of type bool"),
        ("a: {type: string, default: 1}", "default 1 is not of type string (quote it)"),
        ("a: {type: enum, enum: [x, y], default: z}", "default: 'z' is not one of x, y"),
        ("a: {type: int, default: 0, minimum: 1}", "default: 0 is below the minimum 1"),
        ("a: {type: bool, minimum: 1}", "minimum and maximum are for int keys, not bool"),
        ("a: {type: int, pattern: x}", "pattern is for string keys, not int"),
        ("a: {pattern: '('}", "pattern is not a regular expression"),
        ("a: {required: true, default: x}", "a required key has no default"),
        ("'b_*': {default: x}", "keys.b_*: a glob key can be neither required nor have a default"),
        ("a: {type: float}", "config.keys.a.type: Input should be 'string', 'int', 'bool' or 'enum'"),
        ("a: {typ: int}", "config.keys.a.typ: unknown field"),
        ("'a b': {}", "config.keys.a b.[key]: String should match pattern"),
    ],
)
def test_a_bad_declaration_is_refused_naming_it(declaration: str, problem: str) -> None:
    with pytest.raises(PackageError) as info:
        manifest(f"config:\n  keys:\n    {declaration}\n")
    assert problem in str(info.value)


def test_assignments_from_the_command_line() -> None:
    assert parse_assignments("accelerator=h100, intent=inference,") == {"accelerator": b"h100",
                                                                         "intent": b"inference"}
    with pytest.raises(ValueError, match="'intent' is not key=value"):
        parse_assignments("accelerator=h100,intent")
