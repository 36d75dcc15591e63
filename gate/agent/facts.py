"""The node's facts as a step sees them: the operator's (`gate.api.facts`) and the host's own.

The operator knows the node's name, labels, annotations and place in the rollout; it hands them to
the pod as a file (`--node-facts`). The host knows which packages NodeGate's agent installed there:
every package's history (`gate.agent.history`) records its installed version, whichever gate it
belongs to, and it is the truth about the host even when a gate's state annotation was lost. The
agent joins both and writes them, before the first step, into the package's state directory:

    /var/lib/nodegate/<gate>/<package>/node/
        facts.json   everything, as JSON ($NODEGATE_NODE_FACTS)
        labels       one `key=value` line per label, sorted ($NODEGATE_NODE_LABELS)
        installed    one `<gate> <package> <version>` line per installed package ($NODEGATE_NODE_INSTALLED)

The two line files are there for steps on hosts with no JSON tool: label keys and values, gate and
package names and versions hold no spaces, `=` or newlines, so `grep` and `read` parse them safely.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, ValidationError

from gate.agent.errors import UsageError
from gate.agent.history import History
from gate.agent.host import STATE_BASE, resolve_in_root
from gate.api.facts import OperatorFacts

FACTS_FILE = "facts.json"
LABELS_FILE = "labels"
INSTALLED_FILE = "installed"


class NodeFacts(OperatorFacts):
    """What a step reads in $NODEGATE_NODE_FACTS."""

    installed: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="gate -> package -> version NodeGate's agent installed on this host.")


def load_operator_facts(path: Path | None, environ: Mapping[str, str]) -> OperatorFacts:
    """The operator's facts from `path`; without one, the node's name alone ($NODEGATE_NODE, else the
    hostname: `nodegate package test` and a run by hand have no operator)."""
    if path is None:
        return OperatorFacts(node=environ.get("NODEGATE_NODE") or os.uname().nodename)
    try:
        return OperatorFacts.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise UsageError(f"node facts file {path} does not exist") from None
    except (ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise UsageError(f"node facts file {path} is not valid ({first})") from None


def installed_on_host(root: Path) -> dict[str, dict[str, str]]:
    """gate -> package -> version, from every package history on the host. A history that does not
    parse is left out: another package's broken record must not fail this package's steps."""
    base = resolve_in_root(root, STATE_BASE)
    out: dict[str, dict[str, str]] = {}
    for path in sorted(base.glob("*/*/history.json")):
        try:
            history = History.model_validate_json(path.read_bytes())
        except (OSError, ValidationError, ValueError):
            continue
        if history.installed:
            out.setdefault(history.gate, {})[history.package] = history.installed
    return out


def node_facts(operator: OperatorFacts, root: Path) -> NodeFacts:
    return NodeFacts(**operator.model_dump(), installed=installed_on_host(root))


def write_facts(facts: NodeFacts, target: Path) -> None:
    target.mkdir(mode=0o755)
    data = json.dumps(facts.model_dump(by_alias=True, mode="json"), indent=2, sort_keys=True) + "\n"
    (target / FACTS_FILE).write_text(data)
    (target / LABELS_FILE).write_text("".join(f"{k}={v}\n" for k, v in sorted(facts.labels.items())))
    (target / INSTALLED_FILE).write_text("".join(
        f"{gate} {package} {version}\n"
        for gate, packages in sorted(facts.installed.items()) for package, version in sorted(packages.items())))


def step_variables(facts: OperatorFacts, facts_dir: str) -> dict[str, str]:
    """The node's variables of every step; `facts_dir` as the step sees it (host or agent path)."""
    return {
        "NODEGATE_NODE": facts.node,
        "NODEGATE_NODE_FACTS": f"{facts_dir}/{FACTS_FILE}",
        "NODEGATE_NODE_LABELS": f"{facts_dir}/{LABELS_FILE}",
        "NODEGATE_NODE_INSTALLED": f"{facts_dir}/{INSTALLED_FILE}",
        "NODEGATE_COMPARTMENT": facts.rollout.compartment or "",
        "NODEGATE_BATCH": str(facts.rollout.batch),
    }
