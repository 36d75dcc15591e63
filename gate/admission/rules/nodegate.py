"""Validation of NodeGate specs: every denial names the field and says what to change.

Works on the raw object, not on the pydantic model: the webhook may see objects the CRD schema would
refuse (webhooks and schema validation run in no promised order relative to each other's checks), and
a model that refuses to parse could only say "invalid", where a person needs the field and the reason.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from typing import Any

import semver

from gate.admission.rules import syntax
from gate.admission.rules.review import Violation
from gate.admission.rules.syntax import type_name
from gate.api import keys
from gate.api.common import parse_duration
from gate.api.environment import never_passed_reason
from gate.api.nodegate import (
    CONFIG_KEY_MAX,
    CONFIG_KEY_PATTERN,
    CONFIG_KEY_RULE,
    CONFIG_SIZE_MAX,
    DRAIN_TIMEOUT_MAX,
    GRACEFUL_SHUTDOWN_MAX,
    PACKAGE_NAME_PATTERN,
    PACKAGE_NAME_RULE,
    SERVICE_NAME_PATTERN,
    SERVICE_NAME_RULE,
    STAGE_TIMEOUT_MAX,
    WAIT_TIMEOUT_MAX,
)
from gate.api.versions import image_tag

_PACKAGE_NAME = re.compile(PACKAGE_NAME_PATTERN)
_SERVICE_NAME = re.compile(SERVICE_NAME_PATTERN)
_CONFIG_KEY = re.compile(CONFIG_KEY_PATTERN)
INTERRUPT_TYPES = ("none", "drain", "service", "restartAllServices", "reboot")
_NODE_SAMPLE = 3


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def spec_of(obj: object) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    spec = obj.get("spec", {})
    return spec if isinstance(spec, dict) else None


def packages_of(spec: dict[str, Any]) -> dict[str, Any]:
    packages = spec.get("packages")
    return packages if isinstance(packages, dict) else {}


# -- the name --------------------------------------------------------------------------------------


def name_violations(name: str) -> list[Violation]:
    """A gate's name is part of the keys it writes on nodes (`gate.api.keys`): one too long for them
    would be admitted and then fail every node write. Checked at CREATE (a name never changes)."""
    if len(name) <= keys.GATE_NAME_MAX:
        return []
    return [Violation("metadata.name", f'NodeGate name "{name}" has {len(name)} characters; at most '
                      f"{keys.GATE_NAME_MAX}: the node annotation {keys.state_annotation('<name>')} must fit the 63 "
                      "characters of a key's name; choose a shorter name")]


# -- the whole spec --------------------------------------------------------------------------------


def validate_spec(spec: object, *, existing_policies: frozenset[str] | None) -> list[Violation]:
    """Everything wrong with a NodeGate spec on its own. `existing_policies` None skips the check that
    the referenced DeploymentPolicy exists (an UPDATE that keeps the reference)."""
    if not isinstance(spec, dict):
        return [Violation("spec", f"must be an object, not {type_name(spec)}")]
    out: list[Violation] = []
    out += budget_violations(spec.get("interruptionBudget"), "spec.interruptionBudget")
    policy = spec.get("deploymentPolicy")
    if policy is not None:
        if not isinstance(policy, str) or not policy:
            out.append(Violation("spec.deploymentPolicy", "must be the name of a DeploymentPolicy"))
        elif spec.get("interruptionBudget") is not None:
            out.append(Violation("spec", "set at most one of deploymentPolicy and interruptionBudget: the policy's "
                                         "compartments carry the budgets"))
        elif existing_policies is not None and policy not in existing_policies:
            out.append(Violation("spec.deploymentPolicy",
                                 f'DeploymentPolicy "{policy}" does not exist; create it first or fix the name'))
    out += syntax.selector_violations(spec.get("nodeSelector"), "spec.nodeSelector")
    out += syntax.selector_violations(spec.get("podNonInterruptLabels"), "spec.podNonInterruptLabels")
    if spec.get("cordonWhileProtected") is True and not spec.get("podNonInterruptLabels"):
        out.append(Violation("spec.cordonWhileProtected", "cordons nodes while their protected pods finish, and "
                             "no pod is protected: set spec.podNonInterruptLabels too, or drop this field"))
    if spec.get("leaveCordoned") is True and spec.get("readinessTaint") is not True:
        out.append(Violation("spec.leaveCordoned", "holds a node that joined with the readiness taint, and this "
                             "gate gives no node that taint: set spec.readinessTaint: true too, or drop this field"))
    out += toleration_violations(spec.get("additionalTolerations"), "spec.additionalTolerations")
    out += duration_violations(spec.get("waitTimeout"), "spec.waitTimeout", WAIT_TIMEOUT_MAX,
                               hint="leave it unset to wait for as long as they run")
    drain = spec.get("drain")
    if drain is not None:
        if not isinstance(drain, dict):
            out.append(Violation("spec.drain", f"must be an object, not {type_name(drain)}"))
        else:
            out += duration_violations(drain.get("timeout"), "spec.drain.timeout", DRAIN_TIMEOUT_MAX)
            grace = drain.get("gracePeriodSeconds")
            if grace is not None and not (is_int(grace) and grace >= 0):
                out.append(Violation("spec.drain.gracePeriodSeconds", "must be a whole number of seconds, 0 or more"))
    priority = spec.get("priority")
    if priority is not None and not (is_int(priority) and priority >= 1):
        out.append(Violation("spec.priority",
                             f"must be a whole number of at least 1 (lower runs first), not {priority!r}"))
    sequencing = spec.get("sequencing")
    if sequencing is not None and sequencing not in ("node", "all"):
        out.append(Violation("spec.sequencing", f"must be node or all, not {sequencing!r}"))
    raw_packages = spec.get("packages")
    if raw_packages is not None and not isinstance(raw_packages, dict):
        out.append(Violation("spec.packages",
                             f"must be a map of package name to package, not {type_name(raw_packages)}"))
    packages = packages_of(spec)
    for name, package in packages.items():
        out += package_violations(name, package, packages)
    out += cycle_violations(packages)
    if not out:
        out += state_size_violations(packages)
    return out


# The gate's state record on a node (`gate.api.state`) names every package, its version and each of its
# config keys, and the round's merged interrupt lists every service; a node's annotations share 256 KiB
# (the API server's limit), with the kubelet's, other tools' and every other gate's. A gate whose
# record could outgrow its share would have every node write refused mid-round.
STATE_RECORD_MAX = 64 * 1024
_STATE_FIXED = 2048  # the record's other fields, the failure's message (1,000 characters) included


def state_size_violations(packages: dict[str, Any]) -> list[Violation]:
    """Refuse a gate whose state record on a node could grow past `STATE_RECORD_MAX` (an upper bound
    worked out from the spec: every package installed with every config key, every service in the
    round's interrupt). Called on a spec with no other violation."""
    size = _STATE_FIXED
    services: set[str] = set()
    for name, package in packages.items():
        # "name":{"version":"...","specHash":"<16>","config":{...}}, in attempts as "name/stage":n (4
        # stages), in interrupted and postChecked
        size += 7 * len(name) + len(str(package.get("version", ""))) + 150
        for key in package.get("config") or {}:
            size += len(str(key)) + 22  # "key":"<16 hex>",
        for interrupt in _interrupts(package):
            services.update(s for s in interrupt.get("services") or [] if isinstance(s, str))
    size += sum(len(s) + 3 for s in services)
    if size <= STATE_RECORD_MAX:
        return []
    return [Violation("spec.packages", f"the gate's state record on a node could reach {size} bytes (its packages' "
                                       "names and versions, their config keys, the services of their interrupts); "
                                       f"at most {STATE_RECORD_MAX}, its share of the node's 256 KiB of "
                                       "annotations: use fewer or shorter config keys, or split the gate")]


def _interrupts(package: dict[str, Any]) -> list[dict[str, Any]]:
    found = [package.get("interrupt"), *(package.get("configInterrupts") or {}).values(),
             (package.get("uninstall") or {}).get("interrupt")]
    return [i for i in found if isinstance(i, dict)]


def toleration_violations(tolerations: object, path: str) -> list[Violation]:
    """What the API server refuses in a pod's tolerations (core validation's ValidateTolerations): the
    stage pods carry these, and are created only once the node is cordoned and drained. Entries of
    the wrong shape are the CRD schema's business."""
    if not isinstance(tolerations, list):
        return []
    out: list[Violation] = []
    for i, t in enumerate(tolerations):
        if not isinstance(t, dict):
            continue
        where = f"{path}[{i}]"
        key, operator, value = t.get("key") or "", t.get("operator") or "Equal", t.get("value") or ""
        if not isinstance(key, str) or not isinstance(value, str):
            continue
        if key:
            problem = syntax.label_key_problem(key)
            if problem:
                out.append(Violation(f"{where}.key", problem))
        elif operator != "Exists":
            out.append(Violation(f"{where}.operator", "must be Exists when key is empty (which tolerates every taint)"))
        if t.get("tolerationSeconds") is not None and t.get("effect") != "NoExecute":
            out.append(Violation(f"{where}.effect", "must be NoExecute when tolerationSeconds is set"))
        if operator == "Exists" and value:
            out.append(Violation(f"{where}.value", f"must be empty when operator is Exists, not {value!r}"))
        elif operator == "Equal":
            problem = syntax.label_value_problem(value)
            if problem:
                out.append(Violation(f"{where}.value", problem))
    return out


def budget_violations(budget: object, path: str) -> list[Violation]:
    if budget is None:
        return []
    if not isinstance(budget, dict):
        return [Violation(path, f"must be an object with percent or count, not {type_name(budget)}")]
    percent, count = budget.get("percent"), budget.get("count")
    out: list[Violation] = []
    if percent is not None and count is not None:
        out.append(Violation(path, "set exactly one of percent or count, not both"))
    elif percent is None and count is None:
        out.append(Violation(path, "set exactly one of percent or count"))
    if percent is not None and not (is_int(percent) and 0 <= percent <= 100):
        out.append(Violation(f"{path}.percent", f"must be a whole number from 0 to 100, not {percent!r}"))
    if count is not None and not (is_int(count) and count >= 0):
        out.append(Violation(f"{path}.count", f"must be a whole number of nodes, 0 or more, not {count!r}"))
    return out


def duration_violations(value: object, path: str, maximum: str, hint: str = "") -> list[Violation]:
    """Why `value` is no duration of at most `maximum` (one of the maximums of `gate.api.nodegate`)."""
    if value is None:
        return []
    if not isinstance(value, str):
        return [Violation(path, f"must be a duration string like 90s, 15m or 1h30m, not {type_name(value)}")]
    try:
        parsed = parse_duration(value)
    except ValueError as exc:
        if not str(exc).endswith("too long to be a duration"):
            return [Violation(path, str(exc))]
        parsed = None  # past any clock: longer than every maximum
    if parsed is None or parsed > parse_duration(maximum):
        shown = value if len(value) <= 24 else value[:20] + "..."
        return [Violation(path, f"{shown!r} is longer than the maximum of {maximum}" + (f"; {hint}" if hint else ""))]
    return []


# -- one package -----------------------------------------------------------------------------------


def package_violations(name: object, package: object, packages: dict[str, Any]) -> list[Violation]:
    path = f"spec.packages[{name}]"
    if not isinstance(name, str) or not _PACKAGE_NAME.match(name):
        return [Violation("spec.packages", f"package name {name!r} must match {PACKAGE_NAME_PATTERN} "
                                           f"{PACKAGE_NAME_RULE}")]
    if not isinstance(package, dict):
        return [Violation(path, f"must be an object with version and image, not {type_name(package)}")]
    out: list[Violation] = []
    version = syntax.parse_version(package.get("version")) if "version" in package else "version is required"
    if isinstance(version, str):
        out.append(Violation(f"{path}.version", version))
    image = package.get("image")
    if not isinstance(image, str):
        out.append(Violation(f"{path}.image", "is required: an image without a tag, e.g. ghcr.io/team/tool"))
    else:
        ref = syntax.parse_image(image)
        if isinstance(ref, str):
            out.append(Violation(f"{path}.image", ref))
        elif ref.tag is not None and ref.tag not in (package.get("version"), image_tag(str(package.get("version")))):
            version_text = package.get("version")
            out.append(Violation(f"{path}.image", f'tag "{ref.tag}" differs from version "{version_text}"; drop the '
                                                  "tag (the version is the tag) or pin a digest with @sha256:"))
    out += interrupt_violations(package.get("interrupt"), f"{path}.interrupt")
    out += config_violations(package, path)
    out += resources_violations(package.get("resources"), f"{path}.resources")
    out += env_violations(package.get("env"), f"{path}.env")
    out += duration_violations(package.get("timeout"), f"{path}.timeout", STAGE_TIMEOUT_MAX)
    out += duration_violations(package.get("gracefulShutdown"), f"{path}.gracefulShutdown", GRACEFUL_SHUTDOWN_MAX)
    retries = package.get("retries")
    if retries is not None and not (is_int(retries) and 0 <= retries <= 20):
        out.append(Violation(f"{path}.retries", f"must be a whole number from 0 to 20, not {retries!r}"))
    uninstall = package.get("uninstall")
    if uninstall is not None:
        if not isinstance(uninstall, dict):
            out.append(Violation(f"{path}.uninstall", f"must be an object, not {type_name(uninstall)}"))
        else:
            if uninstall.get("apply") is True and uninstall.get("enabled") is not True:
                out.append(Violation(f"{path}.uninstall.apply", "uninstall.apply needs uninstall.enabled: true "
                                                                 "(the package must be uninstallable)"))
            out += interrupt_violations(uninstall.get("interrupt"), f"{path}.uninstall.interrupt")
    out += depends_violations(name, package.get("dependsOn"), packages, path)
    return out


def interrupt_violations(interrupt: object, path: str) -> list[Violation]:
    if interrupt is None:
        return []
    if not isinstance(interrupt, dict):
        return [Violation(path, f"must be an object with a type, not {type_name(interrupt)}")]
    kind = interrupt.get("type", "none")
    if kind not in INTERRUPT_TYPES:
        return [Violation(f"{path}.type", f"unknown interrupt type {kind!r}; use none, drain, service, "
                                          "restartAllServices or reboot")]
    services = interrupt.get("services")
    if services is not None and not (isinstance(services, list)
                                     and all(isinstance(s, str) and s for s in services)):
        return [Violation(f"{path}.services", "must be a list of systemd unit names")]
    for i, service in enumerate(services or []):
        if not _SERVICE_NAME.match(service):
            shown = service if len(service) <= 64 else service[:60] + "..."
            hint = " (it would read as a flag)" if service.startswith("-") else ""
            return [Violation(f"{path}.services[{i}]", f"{shown!r} is not {SERVICE_NAME_RULE}{hint}")]
    if kind == "service" and not services:
        return [Violation(f"{path}.services", "an interrupt of type service needs at least one entry in services")]
    if kind == "drain" and services:
        # Listed units would silently stay as they are (a reboot or restartAllServices restarts them anyway).
        return [Violation(f"{path}.services", "an interrupt of type drain restarts nothing: drop services, or use "
                                              "type service")]
    return []


def config_violations(package: dict[str, Any], path: str) -> list[Violation]:
    """The config becomes a ConfigMap, created only once the node is cordoned and drained: what the API
    server would refuse in it is refused here, naming the key."""
    out: list[Violation] = []
    config = package.get("config")
    if config is not None and not (isinstance(config, dict) and all(isinstance(v, str) for v in config.values())):
        out.append(Violation(f"{path}.config", "must be a map of file name to file content (strings)"))
        config = {}
    size = 0
    for key, value in (config or {}).items():
        problem = config_key_problem(str(key))
        if problem:
            shown = key if len(key) <= 64 else key[:60] + "..."
            out.append(Violation(f"{path}.config[{shown}]", f"config key {shown!r} is no ConfigMap key: {problem}"))
        size += len(value.encode())
    if size > CONFIG_SIZE_MAX:
        out.append(Violation(f"{path}.config", f"the values add up to {size} bytes; a ConfigMap holds at most "
                                               f"{CONFIG_SIZE_MAX} (1 MiB)"))
    keys = list((config or {}).keys())
    interrupts = package.get("configInterrupts")
    if interrupts is None:
        return out
    if not isinstance(interrupts, dict):
        return [*out, Violation(f"{path}.configInterrupts", "must be a map of config key or glob to interrupt")]
    for pattern, interrupt in interrupts.items():
        where = f"{path}.configInterrupts[{pattern}]"
        if pattern not in keys and not any(fnmatch.fnmatchcase(k, str(pattern)) for k in keys):
            known = ", ".join(sorted(keys)) if keys else "none"
            out.append(Violation(where, f"{pattern!r} is neither a config key nor a glob matching one "
                                        f"(config keys: {known})"))
        out += interrupt_violations(interrupt, where)
    return out


def config_key_problem(key: str) -> str | None:
    """Why `key` is no ConfigMap key (k8s.io/apimachinery IsConfigMapKey), or None."""
    if len(key) > CONFIG_KEY_MAX or not _CONFIG_KEY.match(key) or key == "." or key.startswith(".."):
        return CONFIG_KEY_RULE
    return None


def env_violations(env: object, path: str) -> list[Violation]:
    """Names the API server refuses in a container's env (1.34's relaxed rule: printable ASCII but '=');
    the stage pod that carries them is created only once the node is cordoned and drained. And names
    NodeGate never passes to the agent or a package's steps (`gate.api.environment`), for every
    package: a loader or interpreter variable on the agent's container is code run as root, whatever
    the package declares. Refused for every user; the message names the variable."""
    if not isinstance(env, list):
        return []
    out: list[Violation] = []
    for i, var in enumerate(env):
        name = var.get("name") if isinstance(var, dict) else None
        if not isinstance(name, str):
            continue  # the CRD schema's business (a string is required)
        if not name or "=" in name or not all(" " <= c <= "~" for c in name):
            shown = name if len(name) <= 64 else name[:60] + "..."
            out.append(Violation(f"{path}[{i}].name", f"{shown!r} is no environment variable name: printable "
                                                      "ASCII characters but '='"))
            continue
        reason = never_passed_reason(name)
        if reason is not None:
            out.append(Violation(f"{path}[{i}].name", f"env {name} is refused: {reason}; a package takes its "
                                                      "input as the env names and config keys its package.yaml "
                                                      "declares", forbidden=True))
    return out


def resources_violations(resources: object, path: str) -> list[Violation]:
    if resources is None:
        return []
    if not isinstance(resources, dict):
        return [Violation(path, f"must be an object with requests and limits, not {type_name(resources)}")]
    key = _frozen(resources)
    findings = _resources_findings(resources) if key is None else _memo_resources(key)
    return [Violation(path + sub, message) for sub, message in findings]


def _frozen(resources: dict[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """A hashable copy of requests/limits maps of scalars (what every real spec has), else None."""
    out: list[tuple[str, Any]] = []
    for part, values in resources.items():
        if isinstance(values, dict):
            if not all(isinstance(v, (str, int, float)) for v in values.values()):
                return None
            out.append((part, ("map", tuple(values.items()))))
        elif values is None or isinstance(values, (str, int, float, bool)):
            out.append((part, ("scalar", values)))
        else:
            return None
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _memo_resources(key: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, str], ...]:
    # Gates share a handful of resource shapes ("100m", "128Mi"): their exact arithmetic runs once.
    return tuple(_resources_findings({part: dict(v) if kind == "map" else v for part, (kind, v) in key}))


def _resources_findings(resources: dict[str, Any]) -> list[tuple[str, str]]:
    """(sub-path, message) per problem: quantities that do not parse or are not positive, limits below
    their requests."""
    out: list[tuple[str, str]] = []
    parsed: dict[str, dict[str, Any]] = {}
    for part in ("requests", "limits"):
        values = resources.get(part)
        parsed[part] = {}
        if values is None:
            continue
        if not isinstance(values, dict):
            out.append((f".{part}", "must be a map of resource name to quantity"))
            continue
        for resource, raw in values.items():
            amount = syntax.parse_quantity(raw)
            if isinstance(amount, str):
                out.append((f".{part}[{resource}]", amount))
            elif amount <= 0:
                out.append((f".{part}[{resource}]", f"must be positive, not {raw!r}"))
            else:
                parsed[part][resource] = amount
    for resource, limit in parsed["limits"].items():
        request = parsed["requests"].get(resource)
        if request is not None and limit < request:
            out.append((f".limits[{resource}]", f"limit {resources['limits'][resource]!r} is below "
                                                f"the request {resources['requests'][resource]!r}"))
    return out


def depends_violations(name: str, depends: object, packages: dict[str, Any], path: str) -> list[Violation]:
    if depends is None:
        return []
    if not isinstance(depends, dict):
        return [Violation(f"{path}.dependsOn", "must be a map of package name to version constraint")]
    out: list[Violation] = []
    for other, constraint in depends.items():
        where = f"{path}.dependsOn[{other}]"
        if other == name:
            out.append(Violation(where, "a package cannot depend on itself"))
            continue
        if other not in packages:
            present = ", ".join(sorted(str(p) for p in packages if p != name)) or "none"
            out.append(Violation(where, f"package {other!r} is not in this gate (its packages: {present})"))
            continue
        preds = syntax.parse_constraint(constraint)
        if isinstance(preds, str):
            out.append(Violation(where, preds))
            continue
        target = packages[other]
        version = target.get("version") if isinstance(target, dict) else None
        if isinstance(version, str) and isinstance(constraint, str) and not _holds(version, constraint):
            out.append(Violation(where, f"{other} is at version {version}, which does not satisfy {constraint!r}"))
    return out


@functools.lru_cache(maxsize=4096)
def _holds(version: str, constraint: str) -> bool:
    """The version satisfies the constraint (True when either does not parse: that has its own message)."""
    parsed, preds = syntax.parse_version(version), syntax.parse_constraint(constraint)
    return not isinstance(parsed, semver.Version) or isinstance(preds, str) or syntax.satisfies(parsed, preds)


def cycle_violations(packages: dict[str, Any]) -> list[Violation]:
    """One violation per dependency cycle, naming it (a → b → a)."""
    graph: dict[str, list[str]] = {}
    for name, package in packages.items():
        deps = package.get("dependsOn") if isinstance(package, dict) else None
        graph[str(name)] = sorted(str(d) for d in deps if d in packages and d != name) if isinstance(deps, dict) else []
    out: list[Violation] = []
    seen_cycles: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    for root in sorted(graph):
        if state.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        trail: list[str] = [root]
        state[root] = 1
        while stack:
            node, i = stack[-1]
            if i < len(graph[node]):
                stack[-1] = (node, i + 1)
                nxt = graph[node][i]
                if state.get(nxt) == 1:
                    cycle = [*trail[trail.index(nxt):], nxt]
                    key = frozenset(cycle)
                    if key not in seen_cycles:
                        seen_cycles.add(key)
                        out.append(Violation(f"spec.packages[{nxt}].dependsOn",
                                             f"dependency cycle {' → '.join(cycle)}; remove one of these dependsOn"))
                elif not state.get(nxt):
                    state[nxt] = 1
                    stack.append((nxt, 0))
                    trail.append(nxt)
            else:
                state[node] = 2
                stack.pop()
                trail.pop()
    return out


# -- UPDATE ----------------------------------------------------------------------------------------


def removed_uninstallable(old: dict[str, Any], new: dict[str, Any]) -> frozenset[str]:
    """Packages the update removes whose uninstall is enabled: they must be gone from every node first."""
    before, after = packages_of(old), packages_of(new)
    return frozenset(
        name for name, pkg in before.items()
        if name not in after and isinstance(pkg, dict) and isinstance(pkg.get("uninstall"), dict)
        and pkg["uninstall"].get("enabled") is True
    )


def update_violations(old: dict[str, Any], new: dict[str, Any], installed_on: dict[str, tuple[str, ...]] | Any
                      ) -> list[Violation]:
    out: list[Violation] = []
    for name in sorted(removed_uninstallable(old, new)):
        nodes = tuple(installed_on.get(name, ()))
        if nodes:
            sample = ", ".join(nodes[:_NODE_SAMPLE]) + (f" and {len(nodes) - _NODE_SAMPLE} more"
                                                        if len(nodes) > _NODE_SAMPLE else "")
            out.append(Violation(f"spec.packages[{name}]", f"cannot be removed while still installed on "
                                 f"{len(nodes)} node(s) ({sample}): set uninstall.apply: true, wait until it is "
                                 "uninstalled everywhere, then remove it"))
    before, after = packages_of(old), packages_of(new)
    for name, pkg in after.items():
        prev = before.get(name)
        if not (isinstance(pkg, dict) and isinstance(prev, dict)):
            continue
        v_old, v_new = syntax.parse_version(prev.get("version")), syntax.parse_version(pkg.get("version"))
        if not (isinstance(v_old, semver.Version) and isinstance(v_new, semver.Version)) or v_new >= v_old:
            continue
        uninstallable = all(isinstance(p.get("uninstall"), dict) and p["uninstall"].get("enabled") is True
                            for p in (prev, pkg))
        if not uninstallable:
            out.append(Violation(f"spec.packages[{name}].version",
                                 f"downgrade from {v_old} to {v_new} needs the uninstall path: enable "
                                 "uninstall.enabled: true on the installed version first, so it is uninstalled "
                                 f"before {v_new} is applied"))
    return out


def referenced_objects(package: object) -> list[tuple[str, str, str]]:
    """(field, resource, name) of each Secret and ConfigMap of the operator's namespace a package's pods
    would receive: env valueFrom secretKeyRef / configMapKeyRef, and imagePullSecrets."""
    if not isinstance(package, dict):
        return []
    out: list[tuple[str, str, str]] = []
    env = package.get("env")
    for i, var in enumerate(env if isinstance(env, list) else []):
        source = var.get("valueFrom") if isinstance(var, dict) else None
        if not isinstance(source, dict):
            continue
        for key, resource in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            ref = source.get(key)
            name = ref.get("name") if isinstance(ref, dict) else None
            if isinstance(name, str) and name:
                out.append((f"env[{i}].valueFrom.{key}", resource, name))
    pulls = package.get("imagePullSecrets")
    for i, ref in enumerate(pulls if isinstance(pulls, list) else []):
        name = ref.get("name") if isinstance(ref, dict) else None
        if isinstance(name, str) and name:
            out.append((f"imagePullSecrets[{i}]", "secrets", name))
    return out


# Fields that decide where and how disruptively the packages run as root: whoever changes one decides
# that for every package of the gate, so it needs `use` on each of them, not only on packages it touched.
PLACEMENT_FIELDS = ("nodeSelector", "additionalTolerations", "interruptionBudget", "deploymentPolicy")


def placement_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """The placement fields an UPDATE changes (none for a CREATE: every package is new there anyway)."""
    if old is None:
        return []
    return [f for f in PLACEMENT_FIELDS if old.get(f) != new.get(f)]


def changed_packages(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Packages a CREATE or UPDATE adds or changes: the ones whose use needs authorizing."""
    before = packages_of(old) if old is not None else {}
    return sorted(str(name) for name, pkg in packages_of(new).items() if before.get(name) != pkg)
