"""A bound catalog package's config keys and env, held against what its package.yaml declares (pure).

The agent holds every package's input against its own package.yaml, on the node, before it touches
the host (`gate.agent.config`, `gate.agent.gate_env`). Admission can do the same only for a package
whose declarations it knows: a catalog package (`catalog_inputs`, generated from packages/*/package.yaml
by `nodegate package catalog`) at the catalog's version, under a name the cluster binds to an image
repository (`imagePolicy.packages`; the chart binds every catalog package by default), so that the name
means the catalog's package. There it refuses, naming the field, a config key the package does not
declare (or any key, when it declares no config), a required key left out, an env name the package
does not declare, and a value that breaks its declared rule. Anything else (another version, an
unbound name, a cluster's own package) is the agent's to judge.

The value rules are the agent's own (`gate.agent.package`): one source for both.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from gate.admission.rules.catalog_inputs import CATALOG_INPUTS
from gate.admission.rules.images import ImagePolicy
from gate.admission.rules.review import Violation
from gate.agent.values import ConfigSpec, EnvDeclaration, parse_config_value
from gate.api.environment import never_passed


@functools.cache
def _config_spec(name: str) -> ConfigSpec | None:
    keys = CATALOG_INPUTS[name]["config"]
    return None if keys is None else ConfigSpec.model_validate({"keys": keys})


@functools.cache
def _env_rules(name: str) -> dict[str, EnvDeclaration]:
    return {env: EnvDeclaration.model_validate(rule) for env, rule in CATALOG_INPUTS[name]["env"].items()}


def _shown(text: str) -> str:
    return text if len(text) <= 64 else text[:60] + "..."


def input_violations(packages: dict[str, Any], names: Iterable[str], policy: ImagePolicy) -> list[Violation]:
    """One violation per config key or env entry of the packages `names` (those a write adds or changes)
    that breaks a bound catalog package's declarations, naming the field, the key and the rule."""
    out: list[Violation] = []
    for name in names:
        package = packages.get(name)
        declared = CATALOG_INPUTS.get(name)
        if declared is None or not isinstance(package, dict) or policy.bound_repositories(name) is None:
            continue
        version = declared["version"]
        if package.get("version") != version:
            continue
        path, whose = f"spec.packages[{name}]", f"package {name} {version} (docs/catalog.md#{name})"
        out += _config_violations(name, package.get("config"), path, whose)
        out += _env_violations(name, package.get("env"), path, whose)
    return out


def _config_violations(name: str, config: object, path: str, whose: str) -> list[Violation]:
    if not isinstance(config, dict):
        return []  # not a map: the syntax rules say why
    spec = _config_spec(name)
    out = []
    for key, value in config.items():
        where = f"{path}.config[{_shown(str(key))}]"
        if spec is None:
            out.append(Violation(where, f"config key {_shown(str(key))!r} is not accepted: {whose} declares no config"))
            continue
        rule = spec.declaration(str(key))
        if rule is None:
            declared = ", ".join(spec.keys) or "none"
            out.append(Violation(where, f"config key {_shown(str(key))!r} is not declared by {whose} "
                                        f"(declared: {declared})"))
            continue
        if isinstance(value, str):
            try:
                parse_config_value(rule, value)
            except ValueError as exc:
                out.append(Violation(where, f"config key {_shown(str(key))!r} of {whose}: {exc}"))
    for key, rule in (spec.keys.items() if spec is not None else ()):
        if rule.required and key not in config:
            out.append(Violation(f"{path}.config", f"config key {key!r} is required by {whose}"))
    return out


def _env_violations(name: str, env: object, path: str, whose: str) -> list[Violation]:
    if not isinstance(env, list):
        return []
    rules = _env_rules(name)
    out = []
    for i, var in enumerate(env):
        variable = var.get("name") if isinstance(var, dict) else None
        if not isinstance(variable, str) or never_passed(variable):
            continue  # the syntax rules (`nodegate.env_violations`) refuse these for every package
        rule = rules.get(variable)
        if rule is None:
            declared = ", ".join(rules) or "none"
            out.append(Violation(f"{path}.env[{i}].name", f"env {_shown(variable)} is not declared by {whose} "
                                                          f"(its gateEnv declares: {declared})"))
            continue
        value = var.get("value") if isinstance(var, dict) else None
        if isinstance(value, str):  # a valueFrom is read on the node: the agent checks it there
            try:
                parse_config_value(rule, value)
            except ValueError as exc:
                out.append(Violation(f"{path}.env[{i}].value", f"env {variable}={_shown(value)!r} of {whose}: {exc}"))
    return out
