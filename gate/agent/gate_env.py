"""A gate's env for a package, held against the names the package declares (`gateEnv` in package.yaml).

The operator puts a gate's `spec.packages[<name>].env` into the agent container's environment and
lists its names in `--gate-env` (the container's environment also holds the image's and the
kubelet's variables, which are nobody's input to the package). Here, before anything touches the
host, every listed name must be declared by the package and its value must follow the declared rule;
a name NodeGate never passes (`gate.api.environment`) is refused even when declared (the manifest
cannot declare one: `gate.agent.package`). The steps then get exactly the declared names the gate
gave (`gate.agent.plan.step_environment`), never the rest of the container's environment.

Run by hand (`nodegate agent run` without `--gate-env`, `nodegate package test`), the caller's own
environment stands for the gate: the declared names found in it are the gate's env, and they are
checked the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gate.agent.package import PackageManifest
from gate.agent.values import parse_config_value, render_config_value
from gate.api.environment import never_passed_reason


def _declared(manifest: PackageManifest) -> str:
    return ", ".join(manifest.gate_env) or "none"


def check_gate_env(manifest: PackageManifest, names: Sequence[str] | None,
                   environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The env the steps get from the gate, and every problem with it, each naming the variable and why.

    `names`: the gate's env names as the operator listed them; None: the declared names in `environ`."""
    if names is None:
        names = [name for name in manifest.gate_env if name in environ]
    values: dict[str, str] = {}
    problems: list[str] = []
    for name in dict.fromkeys(names):
        reason = never_passed_reason(name)
        if reason is not None:
            problems.append(f"env {name} is refused: {reason}")
            continue
        rule = manifest.gate_env.get(name)
        if rule is None:
            problems.append(f"env {name} is not declared by package {manifest.name} "
                            f"(gateEnv in package.yaml declares: {_declared(manifest)})")
            continue
        if name not in environ:
            continue  # an optional valueFrom (a Secret's key) that is not there: the package's default stays
        text = environ[name]
        try:
            value = parse_config_value(rule, text)
        except ValueError as exc:
            shown = text if len(text) <= 64 else text[:60] + "..."
            problems.append(f"env {name}={shown!r}: {exc}")
            continue
        values[name] = text if rule.type == "string" else render_config_value(value)
    return values, problems
